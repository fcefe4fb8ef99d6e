//! The memory tools inside the reply, over real HTTP on loopback in front of a scripted
//! upstream: our calls are run by the proxy and never reach the client, the rounds splice into
//! one coherent stream (one message start and stop, gap-free indices, summed usage), results
//! hold only what the turn has not shown, harness tools pass through, the loop is bounded, and
//! a request with the tools off has no word of them.

mod common;

use hyper::StatusCode;
use serde_json::{Value, json};

use common::upstream::{Answer, Harness, body_of, fixture, gemini_jsonl_as_sse, header};
use perpetuity::capture::{Capturer, Message};
use perpetuity::memory_tools::{Call, TurnState};
use perpetuity::types::{Role, UserId};

const OPENAI: [(&str, &str); 2] = [
    ("authorization", "Bearer sk-tools"),
    ("content-type", "application/json"),
];
const ANTHROPIC: [(&str, &str); 3] = [
    ("x-api-key", "sk-ant-tools"),
    ("anthropic-version", "2023-06-01"),
    ("content-type", "application/json"),
];

/// The words of one filler note: distinct per note, nothing about keys or flowerpots.
fn filler(i: usize) -> String {
    const WORDS: [&str; 12] = [
        "river", "concert", "bicycle", "garden", "painting", "soccer", "recipe", "novel", "museum",
        "camping", "violin", "pottery",
    ];
    let w = |k: usize| WORDS[(i * k + k) % 12];
    format!(
        "Note {i}: today was about {} and {}, with a long talk on {} that went on for hours. \
         Later we planned a weekend of {} and {}, argued about {} over dinner, and agreed to \
         try {} next month. Somebody brought up {} again, then {} and {}, until it was late.",
        w(1),
        w(2),
        w(3),
        w(4),
        w(5),
        w(6),
        w(7),
        w(8),
        w(9),
        w(10)
    )
}

/// Notes stored after the old message: about 100,000 tokens, beyond the reach of a row's
/// birth heat, so the old message is cold and outside the frame unless retrieved.
const NOTES: usize = 1_000;

/// Store, as the user behind `credential`, an old message about the spare key and then enough
/// later notes that the frame cannot hold them all.
fn remember_a_long_past(h: &Harness, credential: &str) {
    let key = h.state.secret.user_key(credential, None);
    let mut messages = vec![Message {
        user_key: key.clone(),
        conversation: "long ago".into(),
        role: Role::User,
        name: Some("Dana".into()),
        timestamp_ms: Some(1_683_554_160_000),
        source_turn: None,
        text: "The spare key is hidden under the blue flowerpot by the back door.".into(),
    }];
    for i in 0..NOTES {
        messages.push(Message {
            user_key: key.clone(),
            conversation: format!("notes {}", i / 50),
            role: Role::User,
            name: Some("Dana".into()),
            timestamp_ms: Some(1_690_000_000_000 + i as i64 * 3_600_000),
            source_turn: None,
            text: filler(i),
        });
    }
    Capturer::new(&h.state.engine.generation().memory.dictionary)
        .capture(&h.state.engine.generation().memory.store, &messages)
        .unwrap();
}

/// `data:` payloads of an SSE body with their `event:` names, and its comments.
fn events(body: &[u8]) -> (Vec<(Option<String>, String)>, usize) {
    let text = String::from_utf8(body.to_vec())
        .unwrap()
        .replace("\r\n", "\n");
    let mut out = Vec::new();
    let mut comments = 0;
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut name = None;
        let mut data = String::new();
        for line in block.lines() {
            if line.starts_with(':') {
                comments += 1;
            } else if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_owned());
            } else if let Some(d) = line.strip_prefix("data: ") {
                data.push_str(d);
            }
        }
        if !data.is_empty() {
            out.push((name, data));
        }
    }
    (out, comments)
}

fn chat_chunk(delta: Value, finish: Option<&str>) -> String {
    let chunk = json!({"id": "chatcmpl-round", "object": "chat.completion.chunk", "created": 1,
        "model": "gpt-4o", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {chunk}\n\n")
}

/// A Chat Completions stream that calls `calls` (name, arguments), then its usage and `[DONE]`.
fn chat_calls(calls: &[(&str, &str)]) -> Vec<u8> {
    let mut out = chat_chunk(json!({"role": "assistant", "content": null}), None);
    for (i, (name, arguments)) in calls.iter().enumerate() {
        out += &chat_chunk(
            json!({"tool_calls": [{"index": i, "id": format!("call_{i}"), "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
            None,
        );
        out += &chat_chunk(
            json!({"tool_calls": [{"index": i, "function": {"arguments": arguments}}]}),
            None,
        );
    }
    out += &chat_chunk(json!({}), Some("tool_calls"));
    out += &format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-round", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
            "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}})
    );
    out += "data: [DONE]\n\n";
    out.into_bytes()
}

fn chat_request(question: &str, stream: bool) -> Vec<u8> {
    json!({"model": "gpt-4o", "stream": stream, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": question}]})
    .to_string()
    .into_bytes()
}

/// `request` sent to the Gemini route `path` (a model and method) with the key `g-tools`.
async fn ask_gemini(
    h: &Harness,
    path: &str,
    request: &Value,
) -> hyper::Response<hyper::body::Incoming> {
    h.send(
        "POST",
        path,
        &[("x-goog-api-key", "g-tools")],
        request.to_string().as_bytes(),
    )
    .await
}

/// `request` sent to OpenAI's Responses route with the key `sk-tools`.
async fn ask_responses(h: &Harness, request: &Value) -> hyper::Response<hyper::body::Incoming> {
    h.send(
        "POST",
        "/v1/responses",
        &OPENAI,
        request.to_string().as_bytes(),
    )
    .await
}

fn sse(bytes: Vec<u8>) -> Answer {
    Answer::Whole(200, "text/event-stream", bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_stream_runs_our_search_in_the_middle_and_the_client_sees_one_stream() {
    let Some(answer) = fixture("openai-chat/oai-py_text_usage.sse") else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    remember_a_long_past(&h, "sk-tools");
    let search = r#"{"query": "where is the spare key hidden"}"#;
    h.answer(sse(chat_calls(&[("memory_search", search)])));
    h.answer(sse(chat_calls(&[("memory_search", search)])));
    h.answer(sse(answer.clone()));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_request("What did we talk about at the concert?", true),
        )
        .await;
    assert_eq!(header(&response, "x-perpetuity-memory"), "ok");
    let body = body_of(response).await;
    assert!(body.ends_with(b"\n\n"), "the last event is terminated");
    assert!(
        !String::from_utf8_lossy(&body).contains("memory_search"),
        "our calls never reach the client"
    );
    let (got, comments) = events(&body);
    assert!(comments >= 2, "a keep-alive while each tool ran");
    assert_eq!(
        got.iter().filter(|(_, d)| d == "[DONE]").count(),
        1,
        "one end"
    );
    let chunks: Vec<Value> = got
        .iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert!(
        chunks.iter().all(|c| c["id"] == "chatcmpl-round"),
        "one message id"
    );
    let roles = chunks
        .iter()
        .filter(|c| !c["choices"][0]["delta"]["role"].is_null())
        .count();
    assert_eq!(roles, 1, "one message start");
    let finishes: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
        .collect();
    assert_eq!(finishes, ["stop"]);
    let (expected, _) = events(&answer);
    let expected_text: String = expected
        .iter()
        .filter(|(_, d)| d != "[DONE]")
        .filter_map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, expected_text);
    let final_usage: Value = serde_json::from_str(
        &expected
            .iter()
            .rev()
            .find(|(_, d)| d.contains("\"usage\":{"))
            .unwrap()
            .1,
    )
    .unwrap();
    let usage = &chunks.last().unwrap()["usage"];
    for field in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        let round = [100, 7, 107][["prompt_tokens", "completion_tokens", "total_tokens"]
            .iter()
            .position(|f| *f == field)
            .unwrap()];
        assert_eq!(
            usage[field].as_u64().unwrap(),
            final_usage["usage"][field].as_u64().unwrap() + 2 * round,
            "{field} summed over the three rounds"
        );
    }

    let sent = h.received();
    assert_eq!(sent.len(), 3, "three rounds upstream");
    let first = sent[0].json();
    let tools: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        [
            "memory_search",
            "memory_reopen",
            "memory_chain",
            "memory_count"
        ]
    );
    let second = sent[1].json();
    let messages = second["messages"].as_array().unwrap();
    let call = &messages[messages.len() - 2];
    assert_eq!(call["tool_calls"][0]["function"]["name"], "memory_search");
    let result = &messages[messages.len() - 1];
    assert_eq!(result["role"], "tool");
    assert_eq!(result["tool_call_id"], "call_0");
    let found = result["content"].as_str().unwrap();
    assert!(
        found.starts_with("memory_search: 10 items not shown before"),
        "{found}"
    );
    assert!(found.contains("] Note "), "{found}");
    for line in found.lines().skip(1) {
        let quoted = line.split("] ").nth(1).unwrap();
        assert!(
            !sent[0].text().contains(quoted),
            "a result never repeats the frame: {quoted}"
        );
    }
    let ids = |result: &str| -> Vec<String> {
        result
            .lines()
            .skip(1)
            .map(|l| l.split(' ').next().unwrap().to_owned())
            .collect()
    };
    let again = sent[2].json()["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let (first_ids, again_ids) = (ids(found), ids(&again));
    assert_eq!(first_ids.len(), 10, "the default limit");
    assert_eq!(again_ids.len(), 10, "{again}");
    assert!(
        again_ids.iter().all(|id| !first_ids.contains(id)),
        "the same search again returns only what the first did not show"
    );

    let user = UserId::from_key(&h.state.secret.user_key("sk-tools", None));
    let mut rows = h.rows_of("sk-tools", NOTES + 3);
    for _ in 0..500 {
        if rows.last().unwrap().role == Role::Assistant {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        rows = h.rows_of("sk-tools", NOTES + 3);
    }
    let tool_rows: Vec<_> = rows
        .iter()
        .filter(|r| r.role == Role::Tool && r.chunk == 0)
        .collect();
    assert!(
        tool_rows.is_empty(),
        "our own calls only quote stored rows and are never stored: {tool_rows:?}"
    );
    assert_eq!(rows.last().unwrap().role, Role::Assistant, "then the reply");
    let warm: Vec<u64> = h
        .state
        .engine
        .generation()
        .memory
        .store
        .warm_of(user)
        .unwrap()
        .keys()
        .map(|row| row.0)
        .collect();
    let returned: Vec<u64> = first_ids
        .iter()
        .chain(&again_ids)
        .map(|id| id[1..].parse().unwrap())
        .collect();
    assert!(
        returned.iter().all(|id| warm.contains(id)),
        "what the tools returned was reheated"
    );
}

/// An Anthropic stream: a text block, then `tool_use` blocks (name, id, input JSON).
fn anthropic_calls(text: &str, calls: &[(&str, &str, &str)]) -> Vec<u8> {
    let mut out = String::new();
    let mut event = |kind: &str, data: Value| out += &format!("event: {kind}\ndata: {data}\n\n");
    event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_round", "type": "message", "role": "assistant",
            "model": "claude-haiku-4-5", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 50, "output_tokens": 1}}}),
    );
    event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
    );
    event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    );
    for (i, (name, id, input)) in calls.iter().enumerate() {
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": i + 1,
                "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        );
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i + 1,
                "delta": {"type": "input_json_delta", "partial_json": input}}),
        );
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": i + 1}),
        );
    }
    event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
            "usage": {"output_tokens": 20}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    out.into_bytes()
}

fn anthropic_request(question: &str) -> Vec<u8> {
    json!({"model": "claude-haiku-4-5", "max_tokens": 256, "stream": true,
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": question}]})
    .to_string()
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_stream_splices_its_rounds_with_gap_free_blocks_and_summed_usage() {
    let Some(answer) = fixture("anthropic-messages/ant-py_text_basic.sse") else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    remember_a_long_past(&h, "sk-ant-tools");
    h.answer(sse(anthropic_calls(
        "Let me look.",
        &[("memory_reopen", "toolu_1", "")],
    )));
    h.answer(sse(answer.clone()));
    let response = h
        .send(
            "POST",
            "/v1/messages",
            &ANTHROPIC,
            &anthropic_request("Which hobby came up most in my notes?"),
        )
        .await;
    let body = body_of(response).await;
    let (got, _) = events(&body);
    let kinds: Vec<&str> = got.iter().filter_map(|(k, _)| k.as_deref()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "message_start").count(), 1);
    assert_eq!(kinds.iter().filter(|k| **k == "message_stop").count(), 1);
    assert_eq!(kinds.iter().filter(|k| **k == "message_delta").count(), 1);
    assert!(!String::from_utf8_lossy(&body).contains("memory_reopen"));
    let starts: Vec<u64> = got
        .iter()
        .filter(|(k, _)| k.as_deref() == Some("content_block_start"))
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["index"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(starts, [0, 1], "block indices continue without a gap");
    for (kind, data) in &got {
        if matches!(
            kind.as_deref(),
            Some("content_block_delta" | "content_block_stop")
        ) {
            let index = serde_json::from_str::<Value>(data).unwrap()["index"]
                .as_u64()
                .unwrap();
            assert!(index <= 1, "{data}");
        }
    }
    let (expected, _) = events(&answer);
    let expected_delta: Value = serde_json::from_str(
        &expected
            .iter()
            .find(|(k, _)| k.as_deref() == Some("message_delta"))
            .unwrap()
            .1,
    )
    .unwrap();
    let expected_start: Value = serde_json::from_str(&expected[0].1).unwrap();
    let delta: Value = serde_json::from_str(
        &got.iter()
            .find(|(k, _)| k.as_deref() == Some("message_delta"))
            .unwrap()
            .1,
    )
    .unwrap();
    assert_eq!(
        delta["usage"]["output_tokens"].as_u64().unwrap(),
        20 + expected_delta["usage"]["output_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        delta["usage"]["input_tokens"].as_u64().unwrap(),
        50 + expected_start["message"]["usage"]["input_tokens"]
            .as_u64()
            .unwrap()
    );
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");

    let sent = h.received();
    assert_eq!(sent.len(), 2);
    let second = sent[1].json();
    let messages = second["messages"].as_array().unwrap();
    let asked = &messages[messages.len() - 2];
    assert_eq!(
        asked["content"][0],
        json!({"type": "text", "text": "Let me look."})
    );
    assert_eq!(asked["content"][1]["type"], "tool_use");
    assert_eq!(asked["content"][1]["input"], json!({}));
    let answered = &messages[messages.len() - 1]["content"][0];
    assert_eq!(answered["type"], "tool_result");
    assert_eq!(answered["tool_use_id"], "toolu_1");
    assert!(
        answered["content"]
            .as_str()
            .unwrap()
            .starts_with("memory_reopen: "),
        "{answered}"
    );
    let tools = second["tools"].as_array().unwrap();
    assert_eq!(
        tools[0]["name"], "get_weather",
        "the harness's tools stay first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_thinking_block_goes_back_with_its_signature_in_the_next_round() {
    let Some(answer) = fixture("anthropic-messages/ant-py_text_basic.sse") else {
        return;
    };
    let mut round = String::new();
    let mut event = |kind: &str, data: Value| round += &format!("event: {kind}\ndata: {data}\n\n");
    event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_think", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 60, "output_tokens": 1}}}),
    );
    event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
    );
    for piece in ["I should look ", "in the memory ÷ first."] {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "thinking_delta", "thinking": piece}}),
        );
    }
    event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "signature_delta", "signature": "sig-think-1"}}),
    );
    event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    );
    event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_t", "name": "memory_search", "input": {}}}),
    );
    event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "{\"query\": \"hobby\"}"}}),
    );
    event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 1}),
    );
    event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
            "usage": {"output_tokens": 30}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    let h = Harness::start(|_| {}).await;
    h.answer(sse(round.into_bytes()));
    h.answer(sse(answer));
    let response = h
        .send(
            "POST",
            "/v1/messages",
            &ANTHROPIC,
            &anthropic_request("Which hobby came up most in my notes?"),
        )
        .await;
    let body = body_of(response).await;
    assert!(!String::from_utf8_lossy(&body).contains("memory_search"));
    let sent = h.received();
    assert_eq!(sent.len(), 2);
    let messages = sent[1].json()["messages"].as_array().unwrap().clone();
    let asked = &messages[messages.len() - 2];
    assert_eq!(asked["role"], "assistant");
    assert_eq!(
        asked["content"][0],
        json!({"type": "thinking", "thinking": "I should look in the memory ÷ first.", "signature": "sig-think-1"}),
        "the thinking block goes back whole, first, with its signature"
    );
    assert_eq!(asked["content"][1]["type"], "tool_use");
    assert_eq!(asked["content"][1]["id"], "toolu_t");
    assert_eq!(asked["content"][1]["input"], json!({"query": "hobby"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_mixing_our_call_and_the_harness_call_returns_the_harness_call_as_usual() {
    let h = Harness::start(|_| {}).await;
    h.answer(sse(anthropic_calls(
        "Checking.",
        &[
            (
                "memory_count",
                "toolu_ours",
                r#"{"query": "weather", "by": "month"}"#,
            ),
            ("get_weather", "toolu_theirs", r#"{"city": "Paris"}"#),
        ],
    )));
    let response = h
        .send(
            "POST",
            "/v1/messages",
            &ANTHROPIC,
            &anthropic_request("Is it raining in Paris?"),
        )
        .await;
    let body = body_of(response).await;
    let (got, _) = events(&body);
    assert!(!String::from_utf8_lossy(&body).contains("memory_count"));
    let blocks: Vec<Value> = got
        .iter()
        .filter(|(k, _)| k.as_deref() == Some("content_block_start"))
        .map(|(_, d)| serde_json::from_str::<Value>(d).unwrap())
        .collect();
    assert_eq!(blocks.len(), 2);
    assert_eq!(
        blocks[1]["index"], 1,
        "the harness's call takes the gap ours left"
    );
    assert_eq!(blocks[1]["content_block"]["name"], "get_weather");
    let delta = got
        .iter()
        .find(|(k, _)| k.as_deref() == Some("message_delta"))
        .unwrap();
    assert!(delta.1.contains("\"stop_reason\":\"tool_use\""));
    assert_eq!(
        h.received().len(),
        1,
        "no second round: the harness runs its tool"
    );
    let rows = h.rows_of("sk-ant-tools", 1);
    assert!(
        !rows.iter().any(|r| r.role == Role::Tool),
        "ours ran and is not stored: it only quotes stored rows"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_round_withdraws_the_tools_and_the_model_must_answer() {
    let Some(answer) = fixture("openai-chat/oai-py_text_usage.sse") else {
        return;
    };
    let h = Harness::start(|config| config.tool_rounds = 3).await;
    for _ in 0..2 {
        h.answer(sse(chat_calls(&[("memory_chain", r#"{"item": 1}"#)])));
    }
    h.answer(sse(answer));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_request("Tell me more.", true),
        )
        .await;
    let body = body_of(response).await;
    assert_eq!(
        events(&body)
            .0
            .iter()
            .filter(|(_, d)| d == "[DONE]")
            .count(),
        1
    );
    let sent = h.received();
    assert_eq!(sent.len(), 3, "the bound: three upstream calls");
    assert!(sent[1].text().contains("memory_chain"));
    let last = sent[2].json();
    assert!(last.get("tools").is_none(), "the tools are withdrawn");
    let messages = last["messages"].as_array().unwrap();
    assert!(
        messages
            .iter()
            .all(|m| m.get("tool_calls").is_none() && m["role"] != "tool"),
        "earlier rounds stay as plain text"
    );
    assert!(
        messages[messages.len() - 2]["content"]
            .as_str()
            .unwrap()
            .contains("[called memory_chain {\"item\": 1}]")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_replies_loop_too_and_come_back_merged() {
    let Some(answer) = fixture("openai-chat/vercel_text.response.json") else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    let first = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_9", "type": "function",
                "function": {"name": "memory_count", "arguments": "{\"query\": \"weather\", \"by\": \"speaker\"}"}}]}}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34}});
    h.answer(Answer::Whole(
        200,
        "application/json",
        first.to_string().into_bytes(),
    ));
    h.answer(Answer::Whole(200, "application/json", answer.clone()));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_request("How often did we talk about the weather?", false),
        )
        .await;
    let got: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    let expected: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(
        got["choices"][0]["message"]["content"],
        expected["choices"][0]["message"]["content"]
    );
    assert!(got["choices"][0]["message"].get("tool_calls").is_none());
    assert_eq!(
        got["usage"]["prompt_tokens"].as_u64().unwrap(),
        30 + expected["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    let sent = h.received();
    assert_eq!(sent.len(), 2);
    let result = sent[1].json()["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(result["tool_call_id"], "call_9");
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .starts_with("memory_count: "),
        "{result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_anthropic_reply_loops_and_comes_back_as_one_message() {
    let Some(answer) = fixture("anthropic-messages/vercel_text.response.json") else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    let first = json!({"id": "msg_first", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
        "content": [{"type": "tool_use", "id": "toolu_7", "name": "memory_search", "input": {"query": "weather"}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 30, "output_tokens": 4}});
    h.answer(Answer::Whole(
        200,
        "application/json",
        first.to_string().into_bytes(),
    ));
    h.answer(Answer::Whole(200, "application/json", answer.clone()));
    let request = json!({"model": "claude-haiku-4-5", "max_tokens": 256,
        "messages": [{"role": "user", "content": "What did we say about the weather?"}]});
    let response = h
        .send(
            "POST",
            "/v1/messages",
            &ANTHROPIC,
            request.to_string().as_bytes(),
        )
        .await;
    let got: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    let expected: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(got["type"], "message");
    assert_eq!(
        got["content"], expected["content"],
        "only the answer's blocks"
    );
    assert_eq!(got["stop_reason"], expected["stop_reason"]);
    assert_eq!(
        got["usage"]["input_tokens"].as_u64().unwrap(),
        30 + expected["usage"]["input_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        got["usage"]["output_tokens"].as_u64().unwrap(),
        4 + expected["usage"]["output_tokens"].as_u64().unwrap()
    );
    let sent = h.received();
    assert_eq!(sent.len(), 2);
    let messages = sent[1].json()["messages"].as_array().unwrap().clone();
    let asked = &messages[messages.len() - 2];
    assert_eq!(asked["role"], "assistant");
    assert_eq!(asked["content"][0]["id"], "toolu_7");
    let answered = &messages[messages.len() - 1]["content"][0];
    assert_eq!(answered["type"], "tool_result");
    assert_eq!(answered["tool_use_id"], "toolu_7");
    assert!(
        answered["content"]
            .as_str()
            .unwrap()
            .starts_with("memory_search: "),
        "{answered}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_gemini_reply_loops_and_comes_back_as_one_answer() {
    let Some(answer) = fixture("gemini/vercel_text.response.json") else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    let first = json!({"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"name": "memory_count", "args": {"query": "strawberry", "by": "month"}}}
        ]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 40, "candidatesTokenCount": 5, "totalTokenCount": 45}});
    h.answer(Answer::Whole(
        200,
        "application/json",
        first.to_string().into_bytes(),
    ));
    h.answer(Answer::Whole(200, "application/json", answer.clone()));
    let request = json!({"contents": [{"role": "user", "parts": [{"text": "How many r's are in strawberry?"}]}]});
    let response = ask_gemini(
        &h,
        "/v1beta/models/gemini-3-pro-preview:generateContent",
        &request,
    )
    .await;
    let got: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    let expected: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(
        got["candidates"][0]["content"]["parts"], expected["candidates"][0]["content"]["parts"],
        "only the answer's parts"
    );
    assert_eq!(
        got["usageMetadata"]["promptTokenCount"].as_u64().unwrap(),
        40 + expected["usageMetadata"]["promptTokenCount"]
            .as_u64()
            .unwrap()
    );
    let sent = h.received();
    assert_eq!(sent.len(), 2);
    let contents = sent[1].json()["contents"].as_array().unwrap().clone();
    let answered = &contents[contents.len() - 1]["parts"][0]["functionResponse"];
    assert_eq!(answered["name"], "memory_count");
    assert!(
        answered["response"]["result"]
            .as_str()
            .unwrap()
            .starts_with("memory_count: "),
        "{answered}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_responses_reply_loops_and_comes_back_as_one_response() {
    let h = Harness::start(|_| {}).await;
    let first = json!({"id": "resp_1", "object": "response", "status": "completed", "model": "gpt-4o",
        "output": [{"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "memory_search",
            "arguments": "{\"query\": \"weather\"}", "status": "completed"}],
        "usage": {"input_tokens": 30, "output_tokens": 4, "total_tokens": 34}});
    let answer = json!({"id": "resp_2", "object": "response", "status": "completed", "model": "gpt-4o",
        "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "It rained all week.", "annotations": []}]}],
        "usage": {"input_tokens": 50, "output_tokens": 3, "total_tokens": 53}});
    h.answer(Answer::Whole(
        200,
        "application/json",
        first.to_string().into_bytes(),
    ));
    h.answer(Answer::Whole(
        200,
        "application/json",
        answer.to_string().into_bytes(),
    ));
    let request = json!({"model": "gpt-4o", "input": "What did we say about the weather?"});
    let response = ask_responses(&h, &request).await;
    let got: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert_eq!(got["output"], answer["output"], "only the answer's items");
    assert_eq!(got["usage"]["input_tokens"], 80);
    assert_eq!(got["usage"]["total_tokens"], 87);
    let sent = h.received();
    assert_eq!(sent.len(), 2);
    let input = sent[1].json()["input"].as_array().unwrap().clone();
    let answered = input.last().unwrap();
    assert_eq!(answered["type"], "function_call_output");
    assert_eq!(answered["call_id"], "call_1");
    assert!(
        answered["output"]
            .as_str()
            .unwrap()
            .starts_with("memory_search: "),
        "{answered}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_tools_off_the_request_has_no_word_of_them() {
    let Some(stream) = fixture("openai-chat/oai-py_text_usage.sse") else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    remember_a_long_past(&h, "sk-tools");
    h.answer(sse(stream.clone()));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[OPENAI[0], OPENAI[1], ("x-perpetuity-tools", "off")],
            &chat_request("What did we talk about at the concert?", true),
        )
        .await;
    assert_eq!(
        body_of(response).await,
        stream,
        "the stream passes unchanged"
    );
    let off = h.received().pop().unwrap();
    assert!(off.json().get("tools").is_none());
    assert!(!off.text().contains("memory_"), "no word of the tools");

    h.answer(sse(stream.clone()));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_request("What did we talk about at the concert?", true),
        )
        .await;
    assert_eq!(
        body_of(response).await,
        stream,
        "a reply that calls none of ours passes unchanged"
    );
    let on = h.received().pop().unwrap();
    assert!(
        on.text().contains("memory_reopen returns them"),
        "the omission line names the tool when the tools ride along"
    );

    let h = Harness::start(|config| config.tools = false).await;
    h.answer(sse(stream));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_request("Anything?", true),
        )
        .await;
    body_of(response).await;
    assert!(!h.received().pop().unwrap().text().contains("memory_"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdk_stream_helpers_see_one_valid_message_across_rounds() {
    let (Some(python), Some(shared)) = (common::sdk_python(), common::shared_dir()) else {
        return;
    };
    let (Some(chat_answer), Some(responses_answer), Some(anthropic_answer)) = (
        fixture("openai-chat/oai-py_text_usage.sse"),
        fixture("openai-responses/vercel_text_two_messages.jsonl"),
        fixture("anthropic-messages/ant-py_text_basic.sse"),
    ) else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    h.answer(sse(chat_calls(&[(
        "memory_search",
        r#"{"query": "trip"}"#,
    )])));
    h.answer(sse(chat_answer));
    h.answer(sse(chat_calls(&[
        ("memory_search", r#"{"query": "trip"}"#),
        ("get_stock_price", r#"{"ticker": "AAPL"}"#),
    ])));
    h.answer(sse(responses_call(
        "memory_search",
        r#"{"query": "names"}"#,
    )));
    h.answer(sse(common::upstream::jsonl_as_sse(&responses_answer)));
    h.answer(sse(anthropic_calls(
        "Let me look.",
        &[("memory_reopen", "toolu_1", "")],
    )));
    h.answer(sse(anthropic_answer));
    h.answer(sse(anthropic_calls(
        "Checking.",
        &[
            (
                "memory_count",
                "toolu_2",
                r#"{"query": "hobby", "by": "month"}"#,
            ),
            ("get_weather", "toolu_3", r#"{"city": "Paris"}"#),
        ],
    )));
    let proxy = format!("http://{}", h.proxy);
    let fixtures = shared.join("fixtures/providers");
    common::run_sdk_script(
        python,
        "tool_rounds.py",
        proxy,
        fixtures,
        &[],
        "all tool round checks passed",
    )
    .await;
    assert_eq!(
        h.received().len(),
        8,
        "two rounds for each loop, one for each mix"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_stream_runs_our_call_and_keeps_its_thought_signature_for_the_next_round() {
    let Some(lines) = fixture("gemini/vercel_text.jsonl") else {
        return;
    };
    let answer = gemini_jsonl_as_sse(&lines);
    let recorded: Vec<Value> = String::from_utf8(lines)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let call = json!({"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"name": "memory_search", "args": {"query": "strawberry"}}, "thoughtSignature": "sig-1"}
        ]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 40, "candidatesTokenCount": 5, "totalTokenCount": 45},
        "responseId": "resp-first"});
    let h = Harness::start(|_| {}).await;
    h.answer(sse(format!("data: {call}\r\n\r\n").into_bytes()));
    h.answer(sse(answer));
    let request = json!({"contents": [{"role": "user", "parts": [{"text": "How many r's are in strawberry?"}]}],
        "tools": [{"functionDeclarations": [{"name": "lookup", "parameters": {"type": "object"}}]}]});
    let response = ask_gemini(
        &h,
        "/v1beta/models/gemini-3-pro-preview:streamGenerateContent?alt=sse",
        &request,
    )
    .await;
    let body = body_of(response).await;
    assert!(!String::from_utf8_lossy(&body).contains("memory_search"));
    let chunks: Vec<Value> = events(&body)
        .0
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(
        chunks.len(),
        recorded.len(),
        "the answer's chunks, and only those"
    );
    assert!(chunks.iter().all(|c| c["responseId"] == "resp-first"));
    let text = |chunks: &[Value]| -> String {
        chunks
            .iter()
            .filter_map(|c| c["candidates"][0]["content"]["parts"][0]["text"].as_str())
            .collect()
    };
    assert_eq!(text(&chunks), text(&recorded));
    let last = &chunks.last().unwrap()["usageMetadata"];
    let recorded_last = &recorded.last().unwrap()["usageMetadata"];
    assert_eq!(
        last["promptTokenCount"].as_u64().unwrap(),
        40 + recorded_last["promptTokenCount"].as_u64().unwrap()
    );
    assert_eq!(
        last["totalTokenCount"].as_u64().unwrap(),
        45 + recorded_last["totalTokenCount"].as_u64().unwrap()
    );

    let sent = h.received();
    assert_eq!(sent.len(), 2);
    let first = sent[0].json();
    assert_eq!(
        first["tools"][0]["functionDeclarations"][0]["name"],
        "lookup"
    );
    assert_eq!(
        first["tools"][1]["functionDeclarations"][0]["name"],
        "memory_search"
    );
    let contents = sent[1].json()["contents"].as_array().unwrap().clone();
    let asked = &contents[contents.len() - 2];
    assert_eq!(asked["role"], "model");
    assert_eq!(asked["parts"][0]["thoughtSignature"], "sig-1");
    let answered = &contents[contents.len() - 1]["parts"][0]["functionResponse"];
    assert_eq!(answered["name"], "memory_search");
    assert!(
        answered["response"]["result"]
            .as_str()
            .unwrap()
            .starts_with("memory_search: "),
        "{answered}"
    );
}

/// A Gemini stream whose memory call comes in a chunk of its own, before the chunk that
/// finishes the round, as the API may split them: the proxy takes the call out and drops the
/// chunk it leaves without parts (Gemini's chat history refuses a turn holding one), usage
/// and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_chunk_emptied_of_our_call_never_reaches_the_client() {
    let Some(lines) = fixture("gemini/vercel_text.jsonl") else {
        return;
    };
    let usage = json!({"promptTokenCount": 40, "candidatesTokenCount": 5, "totalTokenCount": 45});
    let call = json!({"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"name": "memory_search", "args": {"query": "strawberry"}}}
        ]}, "index": 0}], "usageMetadata": usage, "responseId": "g-first"});
    let finish = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]},
        "finishReason": "STOP", "index": 0}], "usageMetadata": usage, "responseId": "g-first"});
    let h = Harness::start(|_| {}).await;
    h.answer(sse(
        format!("data: {call}\r\n\r\ndata: {finish}\r\n\r\n").into_bytes()
    ));
    h.answer(sse(gemini_jsonl_as_sse(&lines)));
    let request = json!({"contents": [{"role": "user", "parts": [{"text": "How many r's are in strawberry?"}]}]});
    let response = ask_gemini(
        &h,
        "/v1/models/gemini-3-pro-preview:streamGenerateContent?alt=sse",
        &request,
    )
    .await;
    let body = body_of(response).await;
    let chunks: Vec<Value> = events(&body)
        .0
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(h.received().len(), 2, "our call ran, then the answer came");
    assert!(!chunks.is_empty());
    for chunk in &chunks {
        let parts = chunk["candidates"][0]["content"]["parts"].as_array();
        assert!(
            parts.is_some_and(|parts| !parts.is_empty()),
            "a chunk without parts reached the client: {chunk}"
        );
    }
}

/// A later round the upstream refuses ends the reply with the upstream's own error, as the
/// client would have had it without the memory tools: streamed, as an error event in the
/// format's shape (Responses: `error`, then the response closed as `response.failed`,
/// numbered on); whole, with the upstream's status and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_later_round_ends_the_reply_with_the_upstreams_own_error() {
    let h = Harness::start(|_| {}).await;
    let limited = json!({"error": {"message": "slow down", "type": "requests", "param": null,
        "code": "rate_limit_exceeded"}});
    let overloaded =
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    let refuse = |status: u16, body: &Value| {
        Answer::Whole(status, "application/json", body.to_string().into_bytes())
    };
    let search = r#"{"query": "weather"}"#;
    let parsed = |body: &[u8]| -> Vec<(Option<String>, Value)> {
        events(body)
            .0
            .into_iter()
            .filter(|(_, data)| data != "[DONE]")
            .map(|(name, data)| (name, serde_json::from_str(&data).unwrap()))
            .collect()
    };

    // Chat, streamed: the upstream's error as the last chunk.
    h.answer(sse(chat_calls(&[("memory_search", search)])));
    h.answer(refuse(429, &limited));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_request("What about the weather?", true),
        )
        .await;
    let got = parsed(&body_of(response).await);
    assert_eq!(got.last().unwrap().1, limited);

    // Chat, whole: the upstream's status and body.
    let first = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_9", "type": "function",
                "function": {"name": "memory_search", "arguments": search}}]}}]});
    h.answer(refuse(200, &first));
    h.answer(refuse(429, &limited));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_request("What about the weather?", false),
        )
        .await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&response, "x-perpetuity-memory"), "ok");
    let got: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert_eq!(got, limited);

    // Messages, streamed: one message, closed by the upstream's own `error` event.
    h.answer(sse(anthropic_calls(
        "Let me look.",
        &[("memory_search", "toolu_1", search)],
    )));
    h.answer(refuse(529, &overloaded));
    let response = h
        .send(
            "POST",
            "/v1/messages",
            &ANTHROPIC,
            &anthropic_request("What about the weather?"),
        )
        .await;
    let got = parsed(&body_of(response).await);
    let (name, last) = got.last().unwrap();
    assert_eq!((name.as_deref(), last), (Some("error"), &overloaded));
    let starts = got
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("message_start"));
    assert_eq!(starts.count(), 1);

    // Responses, streamed: `error`, then `response.failed` for the first round's response.
    h.answer(sse(responses_call("memory_search", search)));
    h.answer(refuse(429, &limited));
    let request =
        json!({"model": "gpt-5.3-codex", "input": "What about the weather?", "stream": true});
    let response = ask_responses(&h, &request).await;
    let got = parsed(&body_of(response).await);
    let [.., (before, b), (error, e), (failed, f)] = got.as_slice() else {
        panic!("too few events: {got:?}");
    };
    assert_eq!(before.as_deref(), Some("response.in_progress"));
    assert_eq!(error.as_deref(), Some("error"));
    assert_eq!(failed.as_deref(), Some("response.failed"));
    let number = |event: &Value| event["sequence_number"].as_u64().unwrap();
    assert_eq!(
        (number(e), number(f)),
        (number(b) + 1, number(b) + 2),
        "numbered on from the last event the client got"
    );
    assert_eq!(e["error"], limited["error"]);
    assert_eq!(f["response"]["id"], "resp_first");
    assert_eq!(f["response"]["status"], "failed");
    assert_eq!(
        f["response"]["error"],
        json!({"code": "rate_limit_exceeded", "message": "slow down"})
    );
    assert_eq!(h.received().len(), 8, "two rounds a reply");
}

/// A Responses stream that calls one of our tools (`name`, `arguments`), framed as the API does.
fn responses_call(name: &str, arguments: &str) -> Vec<u8> {
    let item = json!({"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_r1",
        "name": name, "arguments": arguments});
    let events = [
        json!({"type": "response.created", "response": {"id": "resp_first", "object": "response", "status": "in_progress", "output": [], "usage": null}, "sequence_number": 0}),
        json!({"type": "response.in_progress", "response": {"id": "resp_first", "object": "response", "status": "in_progress", "output": [], "usage": null}, "sequence_number": 1}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": {"id": "fc_1", "type": "function_call", "status": "in_progress", "call_id": "call_r1", "name": name, "arguments": ""}, "sequence_number": 2}),
        json!({"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc_1", "delta": arguments, "sequence_number": 3}),
        json!({"type": "response.function_call_arguments.done", "output_index": 0, "item_id": "fc_1", "arguments": arguments, "sequence_number": 4}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item, "sequence_number": 5}),
        json!({"type": "response.completed", "response": {"id": "resp_first", "object": "response", "status": "completed", "output": [item],
            "usage": {"input_tokens": 60, "output_tokens": 9, "total_tokens": 69}}, "sequence_number": 6}),
    ];
    let lines: String = events.iter().map(|e| format!("{e}\n")).collect();
    common::upstream::jsonl_as_sse(lines.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_stream_continues_one_response_with_increasing_sequence_numbers() {
    let Some(lines) = fixture("openai-responses/vercel_text_two_messages.jsonl") else {
        return;
    };
    let recorded: Vec<Value> = String::from_utf8(lines.clone())
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let h = Harness::start(|_| {}).await;
    h.answer(sse(responses_call(
        "memory_search",
        r#"{"query": "names"}"#,
    )));
    h.answer(sse(common::upstream::jsonl_as_sse(&lines)));
    let request = json!({"model": "gpt-5.3-codex", "instructions": "Be brief.", "input": "Suggest names.", "stream": true});
    let response = ask_responses(&h, &request).await;
    let body = body_of(response).await;
    assert!(!String::from_utf8_lossy(&body).contains("memory_search"));
    let got: Vec<Value> = events(&body)
        .0
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    let kinds: Vec<&str> = got.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "response.created").count(),
        1
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "response.completed").count(),
        1
    );
    let sequence: Vec<u64> = got
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(
        sequence[..3],
        [0, 1, 2],
        "the answer's numbers follow the client's last"
    );
    assert!(
        sequence.windows(2).all(|w| w[0] < w[1]),
        "sequence numbers keep increasing: {sequence:?}"
    );
    let added: Vec<u64> = got
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .map(|e| e["output_index"].as_u64().unwrap())
        .collect();
    let recorded_added: Vec<u64> = recorded
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .map(|e| e["output_index"].as_u64().unwrap())
        .collect();
    assert_eq!(
        added, recorded_added,
        "output indices continue from the client's last: ours left none behind"
    );
    let recorded_done = recorded.last().unwrap();
    let done = got.last().unwrap();
    assert_eq!(done["type"], "response.completed");
    assert_eq!(done["response"]["id"], "resp_first", "one response id");
    assert_eq!(
        done["response"]["usage"]["total_tokens"].as_u64().unwrap(),
        69 + recorded_done["response"]["usage"]["total_tokens"]
            .as_u64()
            .unwrap()
    );
    assert_eq!(
        done["response"]["output"], recorded_done["response"]["output"],
        "the visible output, without our call"
    );

    let sent = h.received();
    assert_eq!(sent.len(), 2);
    let first = sent[0].json();
    assert!(
        first["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["type"] == "function" && t["name"] == "memory_search")
    );
    let input = sent[1].json()["input"].as_array().unwrap().clone();
    let call = &input[input.len() - 2];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["call_id"], "call_r1");
    let output = &input[input.len() - 1];
    assert_eq!(output["type"], "function_call_output");
    assert!(
        output["output"]
            .as_str()
            .unwrap()
            .starts_with("memory_search: ")
    );
    assert_eq!(sent[1].json()["instructions"], "Be brief.");

    // The id the client got is the first round's, which ends in our call; continuing from it
    // reaches the last round's response, which holds the whole reply. Another credential's
    // request naming it goes as it came.
    let latest = recorded[0]["response"]["id"].as_str().unwrap();
    assert_ne!(latest, "resp_first");
    let follow_up = json!({"model": "gpt-5.3-codex", "input": "And more?", "previous_response_id": "resp_first", "stream": true});
    for (credential, expected) in [
        ("Bearer sk-tools", latest),
        ("Bearer sk-other", "resp_first"),
    ] {
        h.answer(sse(common::upstream::jsonl_as_sse(&lines)));
        let response = h
            .send(
                "POST",
                "/v1/responses",
                &[("authorization", credential), OPENAI[1]],
                follow_up.to_string().as_bytes(),
            )
            .await;
        body_of(response).await;
        let sent = h.received().pop().unwrap().json();
        assert_eq!(sent["previous_response_id"], expected, "{credential}");
        assert_eq!(sent["input"], "And more?");
    }
}

#[test]
fn a_chain_follows_the_message_and_its_neighbours_and_never_another_users_rows() {
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    let say = |user: &str, conversation: &str, text: String| Message {
        user_key: user.into(),
        conversation: conversation.into(),
        role: Role::User,
        name: None,
        timestamp_ms: None,
        source_turn: None,
        text,
    };
    let mut messages: Vec<Message> = (0..10)
        .map(|i| say("u1", "c", format!("Turn {i} of the talk about gardens.")))
        .collect();
    messages[5].text = (0..120)
        .map(|i| format!("Sentence {i} of a long story."))
        .collect::<Vec<_>>()
        .join(" ");
    messages.insert(
        3,
        say("u1", "elsewhere", "Another conversation in between.".into()),
    );
    messages.push(say("u2", "c", "Someone else's turn.".into()));
    let ids = Capturer::new(&memory.dictionary)
        .capture(&memory.store, &messages)
        .unwrap();
    let mut arena = perpetuity::arena::Arena::new();
    arena.catch_up(&memory.store, &memory.dictionary).unwrap();
    let kernels =
        perpetuity::scan::kernels::Kernels::detect(perpetuity::scan::kernels::Ceiling::Native);
    // ids: [0..3) turns 0-2, [3] elsewhere, [4..] turns 3-9, then u2's.
    let turn = |i: usize| &ids[if i < 3 { i } else { i + 1 }];
    let long = turn(5).clone();
    assert!(long.len() > 1, "the long turn is chunked");
    let user = UserId::from_key("u1");
    let mut state = TurnState::new(user, &[user], None, Vec::new(), turn(4));
    let outcome = state
        .run(&memory, &arena, &kernels, &Call::Chain { item: long[1] })
        .unwrap();
    let mut expected: Vec<_> = [2, 3, 5, 6, 7, 8]
        .into_iter()
        .flat_map(|i| turn(i).clone())
        .collect();
    expected.sort();
    assert_eq!(outcome.rows, expected, "{}", outcome.text);
    assert!(!outcome.text.contains("Another conversation"));
    let again = state
        .run(&memory, &arena, &kernels, &Call::Chain { item: long[0] })
        .unwrap();
    assert!(again.rows.is_empty(), "{}", again.text);
    let foreign = ids.last().unwrap()[0];
    let refused = state
        .run(&memory, &arena, &kernels, &Call::Chain { item: foreign })
        .unwrap();
    assert!(refused.rows.is_empty());
    assert!(
        refused.text.contains("there is no item"),
        "{}",
        refused.text
    );

    // In a group scope with u2, the search reaches u2's rows, u2's item is followed in u2's own
    // conversation, and u1's item still in u1's.
    let u2 = UserId::from_key("u2");
    let mut group = TurnState::new(user, &[user, u2], None, Vec::new(), &[]);
    let searched = group
        .run(
            &memory,
            &arena,
            &kernels,
            &Call::Search {
                query: "Someone else's turn".into(),
                limit: 3,
            },
        )
        .unwrap();
    assert!(searched.rows.contains(&foreign), "{}", searched.text);
    let mut group = TurnState::new(user, &[user, u2], None, Vec::new(), &[]);
    let followed = group
        .run(&memory, &arena, &kernels, &Call::Chain { item: foreign })
        .unwrap();
    assert_eq!(followed.rows, vec![foreign], "{}", followed.text);
    assert!(followed.text.contains("Someone else's turn."));
    let mine = group
        .run(&memory, &arena, &kernels, &Call::Chain { item: turn(0)[0] })
        .unwrap();
    assert!(
        !mine.rows.is_empty() && !mine.rows.contains(&foreign),
        "{}",
        mine.text
    );
}

/// A tool result the frame shows only the start of is not counted as shown: its chain returns
/// the whole of it, as the frame's note says.
#[test]
fn a_tool_result_the_frame_cut_short_is_returned_whole_by_its_chain() {
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    let log: String = (0..300)
        .map(|i| format!("entry {i}: watered the tomato beds in the garden\n"))
        .collect();
    let message = |role, text: String| Message {
        user_key: "u1".into(),
        conversation: "c".into(),
        role,
        name: None,
        timestamp_ms: None,
        source_turn: None,
        text,
    };
    let ids = Capturer::new(&memory.dictionary)
        .capture(
            &memory.store,
            &[
                message(Role::User, "Read the garden log.".into()),
                message(Role::Tool, format!("read_file returned: {log}")),
            ],
        )
        .unwrap();
    let result = ids[1].clone();
    assert!(result.len() > 2, "the result is chunked");
    let mut arena = perpetuity::arena::Arena::new();
    arena.catch_up(&memory.store, &memory.dictionary).unwrap();
    let kernels =
        perpetuity::scan::kernels::Kernels::detect(perpetuity::scan::kernels::Ceiling::Native);
    let user = [UserId::from_key("u1")];
    let recalled = perpetuity::recall::recall(
        &memory,
        &arena,
        &kernels,
        &perpetuity::recall::RecallConfig::default(),
        &perpetuity::recall::Ask::probe(&user, None, "What did I water in the garden?", 0),
    )
    .unwrap();
    let frame = &recalled.frame;
    let shown: Vec<_> = result.iter().filter(|r| frame.rows.contains(r)).collect();
    assert!(!shown.is_empty(), "the frame quotes the result");
    let text: String = frame.messages.iter().map(|m| m.content.as_str()).collect();
    assert!(text.contains("[cut here;"), "{text}");
    assert!(!text.contains("entry 299"), "the preview is cut");
    let whole = frame.whole_rows();
    assert!(
        result.iter().all(|r| !whole.contains(r)),
        "no row of the result is shown whole"
    );
    assert!(whole.contains(&ids[0][0]), "the question is shown whole");

    let mut turn = TurnState::new(user[0], &user, None, Vec::new(), &whole);
    let chained = turn
        .run(&memory, &arena, &kernels, &Call::Chain { item: result[0] })
        .unwrap();
    assert_eq!(chained.rows, result, "{}", chained.text);
    assert!(chained.text.contains("entry 299"), "{}", chained.text);
}

/// A round of many memory calls (a prompt can ask for any number) runs at most
/// [`MAX_CALLS_A_ROUND`](perpetuity::proxy::rounds::MAX_CALLS_A_ROUND) of them; every call still gets
/// its result, the ones past the bound saying they were not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_runs_at_most_sixteen_memory_calls() {
    let Some(answer) = fixture("openai-chat/oai-py_text_usage.sse") else {
        return;
    };
    let h = Harness::start(|config| config.tool_rounds = 2).await;
    let search = r#"{"query": "boat"}"#;
    let calls: Vec<(&str, &str)> = (0..20).map(|_| ("memory_search", search)).collect();
    h.answer(sse(chat_calls(&calls)));
    h.answer(sse(answer));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_request("Where is the boat?", true),
        )
        .await;
    body_of(response).await;
    let sent = h.received();
    assert_eq!(sent.len(), 2);
    let last = sent[1].text();
    let refused = last
        .matches("not run: at most 16 memory tool calls are run a round")
        .count();
    assert_eq!(refused, 4, "{last}");
}
