//! Requests shaped as agent harnesses send them, through the proxy over real HTTP on loopback in
//! front of a scripted upstream: Claude Code's turn (reminder blocks in the user's message, a
//! trailing system message, its session in `metadata.user_id`) and Codex's (developer messages,
//! AGENTS.md and environment context as user messages, its `session_id` header) are captured
//! as the user's words only, with the harness's context forwarded where it stood; a tool loop
//! reuses its turn's frame byte for byte, shows the question once and stores what the agent
//! did; attachments, key order and cache markers arrive as sent; a reply whose closing event
//! was relayed is complete; side calls pass through unremembered.

mod common;

use http_body_util::BodyExt as _;
use hyper::StatusCode;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use common::upstream::{Answer, Harness, body_of, chat_reply, header};
use perpetuity::proxy::harness::{self, Kind};
use perpetuity::proxy::wire::{self, Format};
use perpetuity::store::Row;
use perpetuity::types::Role;

const CLAUDE_CODE: [(&str, &str); 4] = [
    ("x-api-key", "sk-ant-agent"),
    ("anthropic-version", "2023-06-01"),
    ("anthropic-beta", "per-turn-control-2026-07-01"),
    ("content-type", "application/json"),
];

const CODEX_KEY: (&str, &str) = ("authorization", "Bearer sk-codex");
const JSON: (&str, &str) = ("content-type", "application/json");

/// A Messages stream saying `text`, closed by `message_stop`.
fn messages_stream(text: &str) -> Vec<u8> {
    let start = json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
        "role": "assistant", "model": "claude-sonnet-4-5", "content": [], "stop_reason": null,
        "stop_sequence": null, "usage": {"input_tokens": 5, "output_tokens": 1}}});
    let delta = json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": text}});
    format!(
        "event: message_start\ndata: {start}\n\n\
         event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
         event: content_block_delta\ndata: {delta}\n\n\
         event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n\
         event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":3}}}}\n\n\
         event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
    )
    .into_bytes()
}

fn sse(stream: Vec<u8>) -> Answer {
    Answer::Whole(200, "text/event-stream", stream)
}

/// A whole Responses reply holding `output` items.
fn responses_reply(output: Value) -> Answer {
    let body = json!({"id": "resp_1", "object": "response", "status": "completed",
        "model": "gpt-5-codex", "output": output});
    Answer::Whole(200, "application/json", body.to_string().into_bytes())
}

/// Claude Code's main request as recorded (2.1): its system prompt cached, the user's message
/// with a reminder block before the words, then a trailing `system` message (beta
/// `per-turn-control`, its environment, cached, with a field of its own), its session in
/// `metadata.user_id`. The words carry a cache marker here, as a later turn's do.
fn claude_code(session: &str, history: &[Value], words: &str) -> Value {
    let mut messages = history.to_vec();
    messages.push(json!({"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\nCLAUDE.md: indent with tabs.\n</system-reminder>"},
        {"type": "text", "text": words, "cache_control": {"type": "ephemeral"}}
    ]}));
    messages.push(json!({"role": "system",
        "content": [{"type": "text", "text": "# Environment\nPrimary working directory: /work/app",
            "cache_control": {"type": "ephemeral"}}],
        "output_config": {"effort": "medium"}}));
    json!({
        "model": "claude-sonnet-4-5",
        "messages": messages,
        "system": [{"type": "text", "text": "You are an agent for software engineering.",
            "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "description": "Runs a command.", "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"},
                "description": {"type": "string"}},
            "required": ["command"]}}],
        "metadata": {"user_id": json!({"device_id": "5e1f", "account_uuid": "",
            "session_id": session}).to_string()},
        "max_tokens": 32000,
        "stream": true
    })
}

/// Codex's context before the words, as recorded (0.171): two developer messages, then one
/// user message holding AGENTS.md and the environment as two parts.
fn codex_context() -> Vec<Value> {
    let text = |text: &str| json!({"type": "input_text", "text": text});
    vec![
        json!({"type": "message", "id": "msg_1", "role": "developer",
            "content": [text("You are Codex, a coding agent.")]}),
        json!({"type": "message", "id": "msg_2", "role": "developer",
            "content": [text("<permissions instructions>\nSandbox: workspace-write.\n</permissions instructions>")]}),
        json!({"type": "message", "id": "msg_3", "role": "user", "content": [
            text("# AGENTS.md instructions for /work/app\n\n<INSTRUCTIONS>\nRun cargo fmt before committing.\n</INSTRUCTIONS>"),
            text("<environment_context>\n  <cwd>/work/app</cwd>\n  <shell>bash</shell>\n</environment_context>")
        ]}),
    ]
}

/// Codex's request: its context, the words, then `round` (the tool loop so far).
fn codex(words: &str, round: &[Value]) -> Value {
    let mut input = codex_context();
    input.push(json!({"type": "message", "id": "msg_4", "role": "user",
        "content": [{"type": "input_text", "text": words}]}));
    input.extend(round.iter().cloned());
    json!({
        "model": "gpt-5-codex",
        "stream": false,
        "input": input,
        "tools": [{"type": "function", "name": "shell", "description": "Runs a command.",
            "strict": false, "parameters": {"type": "object",
                "properties": {"command": {"type": "array", "items": {"type": "string"}},
                    "workdir": {"type": "string"}}, "required": ["command"]}}],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "store": false,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199-codex-session"
    })
}

async fn post(h: &Harness, path: &str, headers: &[(&str, &str)], body: &Value) -> Vec<u8> {
    let response = h
        .send("POST", path, headers, body.to_string().as_bytes())
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    body_of(response).await
}

/// The rows of `credential`'s memory once `expected` are there, as (role, text).
fn said(h: &Harness, credential: &str, expected: usize) -> Vec<(Role, String)> {
    rows(h, credential, expected)
        .into_iter()
        .map(|r| (r.role, r.text))
        .collect()
}

fn rows(h: &Harness, credential: &str, expected: usize) -> Vec<Row> {
    let rows = h.rows_of(credential, expected);
    assert_eq!(rows.len(), expected, "{rows:#?}");
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_codes_turn_is_remembered_as_its_words_with_its_context_where_it_stood() {
    let h = Harness::start(|_| {}).await;
    h.answer(sse(messages_stream("Noted: 4172.")));
    let first = claude_code("aaa-1", &[], "My locker code is 4172.");
    post(&h, "/v1/messages?beta=true", &CLAUDE_CODE, &first).await;

    let stored = rows(&h, "sk-ant-agent", 2);
    assert_eq!(
        (stored[0].role, stored[0].text.as_str()),
        (Role::User, "My locker code is 4172."),
        "the words, without the reminder"
    );
    assert_eq!(stored[0].conversation, "session:aaa-1");
    assert_eq!(stored[1].text, "Noted: 4172.");

    let sent = h.received()[0].json();
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(
        messages.last().unwrap(),
        &first["messages"][1],
        "the trailing system message stays last"
    );
    let live = &messages[messages.len() - 2]["content"];
    assert_eq!(
        live[0], first["messages"][0]["content"][0],
        "the reminder block"
    );
    assert!(
        live[1]["text"]
            .as_str()
            .unwrap()
            .ends_with("My locker code is 4172.")
    );
    assert_eq!(live[1]["cache_control"], json!({"type": "ephemeral"}));

    // A later session of the same credential is told what the first one heard.
    h.answer(sse(messages_stream("4172.")));
    let later = claude_code("bbb-2", &[], "What is my locker code?");
    post(&h, "/v1/messages?beta=true", &CLAUDE_CODE, &later).await;
    let sent = h.received()[1].text();
    assert!(sent.contains("My locker code is 4172."), "{sent}");
    assert_eq!(
        sent.matches("CLAUDE.md: indent with tabs.").count(),
        1,
        "the reminder reaches the model once, and is not remembered as words"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codexs_tool_loop_keeps_its_context_reuses_its_frame_and_stores_what_the_agent_did() {
    let h = Harness::start(|config| config.tools = false).await;
    let headers = [CODEX_KEY, JSON, ("session-id", "0199-codex-session")];
    h.answer(responses_reply(
        json!([{"type": "function_call", "id": "fc_1",
        "call_id": "call_1", "name": "shell",
        "arguments": "{\"command\":[\"ls\",\"src\"]}", "status": "completed"}]),
    ));
    post(
        &h,
        "/v1/responses",
        &headers,
        &codex("Rename the parser module.", &[]),
    )
    .await;
    h.answer(responses_reply(
        json!([{"type": "message", "role": "assistant",
        "content": [{"type": "output_text", "text": "Renamed parser.rs to syntax.rs."}]}]),
    ));
    let round = [
        json!({"type": "function_call", "call_id": "call_1", "name": "shell",
            "arguments": "{\"command\":[\"ls\",\"src\"]}"}),
        json!({"type": "function_call_output", "call_id": "call_1",
            "output": "lib.rs\nparser.rs"}),
    ];
    post(
        &h,
        "/v1/responses",
        &headers,
        &codex("Rename the parser module.", &round),
    )
    .await;

    let sent: Vec<Value> = h.received().iter().map(|r| r.json()).collect();
    for request in &sent {
        assert_eq!(
            request["input"].as_array().unwrap()[..3],
            codex_context()[..],
            "developer messages, AGENTS.md and the environment reach every request"
        );
    }
    let (first, second) = (sent[0]["input"].to_string(), sent[1]["input"].to_string());
    assert!(
        second.starts_with(first.trim_end_matches(']')),
        "the continuation forwards the first request's prefix byte for byte\n{first}\n{second}"
    );
    assert_eq!(second.matches("Rename the parser module.").count(), 1);
    let tail: Vec<&Value> = sent[1]["input"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .take(2)
        .collect();
    assert_eq!(tail, [&round[1], &round[0]], "the round follows, verbatim");

    let stored = said(&h, "sk-codex", 4);
    assert_eq!(
        stored,
        [
            (Role::User, "Rename the parser module.".to_owned()),
            (
                Role::Tool,
                "called shell {\"command\":[\"ls\",\"src\"]}".to_owned()
            ),
            (Role::Tool, "shell returned: lib.rs\nparser.rs".to_owned()),
            (
                Role::Assistant,
                "Renamed parser.rs to syntax.rs.".to_owned()
            ),
        ]
    );
    assert!(
        rows(&h, "sk-codex", 4)
            .iter()
            .all(|r| r.conversation == "session:0199-codex-session")
    );

    // The next turn's frame shows what the agent did, on the tool rows.
    h.answer(responses_reply(json!([])));
    post(
        &h,
        "/v1/responses",
        &headers,
        &codex("Which files did you list in src?", &[]),
    )
    .await;
    let sent = h.received()[2].text();
    for line in [
        r#"called shell {\"command\":[\"ls\",\"src\"]}"#,
        r#"shell returned: lib.rs\nparser.rs"#,
    ] {
        assert!(sent.contains(line), "{line} not in {sent}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_resumed_under_a_new_id_continues_the_conversation_its_history_comes_from() {
    let h = Harness::start(|_| {}).await;
    h.answer(sse(messages_stream("Noted.")));
    let first = claude_code("resumed-a", &[], "My locker code is 4172.");
    post(&h, "/v1/messages", &CLAUDE_CODE, &first).await;
    let history = [
        first["messages"][0].clone(),
        json!({"role": "assistant", "content": [{"type": "text", "text": "Noted."}]}),
    ];
    h.answer(sse(messages_stream("It is 4172.")));
    let resumed = claude_code("resumed-b", &history, "What is the code?");
    post(&h, "/v1/messages", &CLAUDE_CODE, &resumed).await;
    let sent = h.received()[1].text();
    assert_eq!(
        sent.matches("My locker code is 4172.").count(),
        1,
        "the resent turn the memory holds is replaced, not sent twice: {sent}"
    );
    let stored = rows(&h, "sk-ant-agent", 4);
    assert_eq!(stored[2].text, "What is the code?");
    assert!(
        stored.iter().all(|r| r.conversation == "session:resumed-a"),
        "the resumed session goes on in the conversation it resumed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_is_keyed_by_its_first_words_not_by_the_context_before_them() {
    let h = Harness::start(|_| {}).await;
    for words in ["Add a --verbose flag.", "Why does the build fail?"] {
        h.answer(responses_reply(
            json!([{"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": "Done."}]}]),
        ));
        post(&h, "/v1/responses", &[CODEX_KEY, JSON], &codex(words, &[])).await;
    }
    let stored = rows(&h, "sk-codex", 4);
    assert_eq!(stored[0].conversation, stored[1].conversation);
    assert_ne!(
        stored[0].conversation, stored[2].conversation,
        "two sessions in one folder are two conversations"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_round_continued_after_the_turn_was_forgotten_shows_the_question_once() {
    let h = Harness::start(|config| config.tools = false).await;
    let question = "What is the weather in Lyon?";
    h.answer(chat_reply("It is sunny in Lyon."));
    let body = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": question},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "weather", "arguments": "{\"city\":\"Lyon\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    ]});
    // The question was stored by the turn's first request, before a restart.
    perpetuity::capture::Capturer::new(&h.state.engine.generation().memory.dictionary)
        .capture(
            &h.state.engine.generation().memory.store,
            &[perpetuity::capture::Message {
                user_key: h.state.secret.user_key("sk-codex", None),
                conversation: "weather".into(),
                role: Role::User,
                name: None,
                timestamp_ms: Some(1_767_000_000_000),
                source_turn: None,
                text: question.into(),
            }],
        )
        .unwrap();
    post(
        &h,
        "/v1/chat/completions",
        &[CODEX_KEY, JSON, ("x-perpetuity-conversation", "weather")],
        &body,
    )
    .await;
    let sent = h.received()[0].text();
    assert_eq!(sent.matches(question).count(), 1, "{sent}");
    let stored = said(&h, "sk-codex", 4);
    assert_eq!(stored[1].0, Role::Tool);
    assert_eq!(
        stored[2],
        (Role::Tool, "weather returned: sunny".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_reach_the_model_in_place_and_are_stored_as_placeholders() {
    let h = Harness::start(|_| {}).await;
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}});
    let document = json!({"type": "document", "source": {"type": "url", "url": "https://example.org/spec.pdf"}});
    h.answer(sse(messages_stream("A red dot.")));
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": [image, {"type": "text", "text": "What is in this picture?"}, document]}]});
    post(&h, "/v1/messages", &CLAUDE_CODE, &body).await;
    let live = h.received()[0].json()["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"]
        .clone();
    assert_eq!(live[0], image, "the image, where it was");
    let words = live[1]["text"].as_str().unwrap();
    // A credential's first request: its question is written once the provider answers, so
    // its frame shows the question as a probe does, unlabelled, last (`proxy.md`).
    assert!(
        words.starts_with("What is in this picture?\n[image attached: image/png, 72 bytes, "),
        "the frame's text takes the words' place, the question with its placeholders: {words}"
    );
    assert_eq!(
        words.matches("What is in this picture?").count(),
        1,
        "{words}"
    );
    assert_eq!(live[2], document);

    h.answer(chat_reply("A red dot."));
    let url = format!("data:image/png;base64,{png}");
    let chat = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "And this one?"},
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}}]}]});
    post(&h, "/v1/chat/completions", &[CODEX_KEY, JSON], &chat).await;
    let live = h.received()[1].json()["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"]
        .clone();
    assert_eq!(live[1], chat["messages"][0]["content"][1]);

    h.answer(responses_reply(json!([])));
    let responses = json!({"model": "gpt-5", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "And here?"},
        {"type": "input_image", "image_url": url}]}]});
    post(&h, "/v1/responses", &[CODEX_KEY, JSON], &responses).await;
    let live = h.received()[2].json()["input"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"]
        .clone();
    assert_eq!(live[1], responses["input"][0]["content"][1]);

    let stored = said(&h, "sk-ant-agent", 2);
    assert!(
        stored[0]
            .1
            .starts_with("What is in this picture?\n[image attached: image/png, "),
        "{}",
        stored[0].1
    );
    assert!(stored[0].1.contains("[document attached: "));
    let codex = said(&h, "sk-codex", 3);
    for (_, text) in codex.iter().filter(|(role, _)| *role == Role::User) {
        assert!(text.contains("[image attached: image/png, "), "{text}");
        assert!(!text.contains(png), "never the bytes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_json_keeps_the_clients_bytes_outside_the_conversation() {
    let h = Harness::start(|config| config.tools = false).await;
    let tools = r#"[{"type": "function", "function": {"name": "edit", "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}, "all": {"type": "boolean"}}, "required": ["path", "old", "new"]}}}]"#;
    let format = r#"{"type":"json_schema","json_schema":{"name":"plan","strict":true,"schema":{"type":"object","properties":{"title":{"type":"string"},"steps":{"type":"array","items":{"type":"string"}},"done":{"type":"boolean"}},"required":["title","steps","done"],"additionalProperties":false}}}"#;
    let body = format!(
        r#"{{"model":"gpt-4o","tools":{tools},"zz_vendor_field":{{"b":1,"a":0.30000000000000004, "c": 1e3}},"response_format":{format},"messages":[{{"role":"user","content":"Plan the rename."}}],"temperature":0.2}}"#
    );
    h.answer(chat_reply("{}"));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[CODEX_KEY, JSON],
            body.as_bytes(),
        )
        .await;
    assert_eq!(header(&response, "x-perpetuity-memory"), "ok");
    body_of(response).await;
    let sent = h.received()[0].text();
    for part in [
        format!(
            r#""model":"gpt-4o","tools":{tools},"zz_vendor_field":{{"b":1,"a":0.30000000000000004, "c": 1e3}},"response_format":{format},"messages":["#
        ),
        r#"],"temperature":0.2}"#.to_owned(),
    ] {
        assert!(sent.contains(&part), "{part}\nnot in\n{sent}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_frame_ends_with_a_cache_breakpoint_where_the_client_cached_its_history() {
    let h = Harness::start(|config| config.tools = false).await;
    // The earlier turn went through the proxy: the memory holds it, so the frame replaces it.
    h.answer(sse(messages_stream("Earlier answer.")));
    let earlier = claude_code("ccc-3", &[], "Earlier question.");
    post(&h, "/v1/messages", &CLAUDE_CODE, &earlier).await;
    let marker = json!({"type": "ephemeral", "ttl": "1h"});
    let history = [
        json!({"role": "user", "content": [{"type": "text", "text": "Earlier question.",
            "cache_control": marker}]}),
        json!({"role": "assistant", "content": "Earlier answer."}),
    ];
    let mut body = claude_code("ccc-3", &history, "Next question.");
    body["messages"][2]["content"][1]
        .as_object_mut()
        .unwrap()
        .remove("cache_control");
    h.answer(sse(messages_stream("Fine.")));
    post(&h, "/v1/messages", &CLAUDE_CODE, &body).await;
    let sent = h.received()[1].json();
    let live = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| {
            m["content"][1]["text"]
                .as_str()
                .is_some_and(|t| t.ends_with("Next question."))
        })
        .expect("the live turn, the frame's end in it");
    assert_eq!(live["content"][1]["cache_control"], marker, "{sent}");
    assert!(live["content"][0].get("cache_control").is_none());
    assert_eq!(sent["system"], body["system"], "the client's markers stay");
    assert_eq!(
        h.received()[1].text().matches("cache_control").count(),
        3,
        "the system prompt's, the trailing system message's, the frame's end"
    );

    // Four markers in what is kept already: none is added.
    for tool in body["tools"].as_array_mut().unwrap() {
        tool["cache_control"] = json!({"type": "ephemeral"});
    }
    body["system"] = json!([
        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}
    ]);
    h.answer(sse(messages_stream("Fine.")));
    post(&h, "/v1/messages", &CLAUDE_CODE, &body).await;
    assert_eq!(h.received()[2].text().matches("cache_control").count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_whose_closing_event_was_relayed_is_complete_when_the_client_then_leaves() {
    let h = Harness::start(|_| {}).await;
    let (_go, wait) = oneshot::channel::<()>();
    h.answer(Answer::Held(
        messages_stream("All of it."),
        b"event: ping\ndata: {\"type\":\"ping\"}\n\n".to_vec(),
        wait,
    ));
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "Say it all."}]});
    let response = h
        .send(
            "POST",
            "/v1/messages",
            &CLAUDE_CODE,
            body.to_string().as_bytes(),
        )
        .await;
    let mut stream = response.into_body();
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("message_stop") {
        let frame = stream.frame().await.unwrap().unwrap();
        got.extend_from_slice(&frame.into_data().unwrap());
    }
    drop(stream);
    let stored = said(&h, "sk-ant-agent", 2);
    assert_eq!(stored[1], (Role::Assistant, "All of it.".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_probe_passes_through_unremembered() {
    let h = Harness::start(|_| {}).await;
    let body = json!({"model": "claude-haiku-4-5", "max_tokens": 1,
        "messages": [{"role": "user", "content": "quota"}]});
    h.answer(sse(messages_stream(".")));
    let response = h
        .send(
            "POST",
            "/v1/messages",
            &CLAUDE_CODE,
            body.to_string().as_bytes(),
        )
        .await;
    assert_eq!(header(&response, "x-perpetuity-memory"), "off");
    body_of(response).await;
    assert_eq!(h.received()[0].json(), body, "forwarded as it came");
    assert!(h.rows_of("sk-ant-agent", 0).is_empty());
}

/// A request recorded from a real harness (`tests/harness/recorded/`), parsed as the proxy
/// parses it, with the session its headers and body name; it must not be a side call.
fn recorded(name: &str) -> (wire::Request, Option<String>) {
    let (request, headers, session) = recorded_with_headers(name);
    assert!(
        !harness::is_side_call(&request.body, &request.messages, &headers, false),
        "{name}"
    );
    (request, session)
}

/// Whether the recorded request `name` is a side call.
fn recorded_side_call(name: &str) -> bool {
    let (request, headers, _) = recorded_with_headers(name);
    harness::is_side_call(&request.body, &request.messages, &headers, false)
}

/// A recorded request, parsed, with its headers and the session they and its body name.
fn recorded_with_headers(name: &str) -> (wire::Request, hyper::HeaderMap, Option<String>) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/harness/recorded")
        .join(format!("{name}.json"));
    let file: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let format = if file["path"].as_str().unwrap().starts_with("/v1/responses") {
        Format::Responses
    } else {
        Format::Messages
    };
    let mut headers = hyper::HeaderMap::new();
    for (name, value) in file["headers"].as_object().unwrap() {
        headers.insert(
            hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.as_str().unwrap().parse().unwrap(),
        );
    }
    let request = wire::parse(format, file["body"].to_string().as_bytes(), None).unwrap();
    let session = harness::session(format, &request.body, &headers);
    (request, headers, session)
}

#[test]
fn recorded_harness_requests_read_as_the_users_words_in_their_session() {
    let (main, session) = recorded("claude-code-1");
    assert_eq!(
        main.question.as_deref(),
        Some("Run echo hello with Bash, then say done. My cat is called Zanzibar.")
    );
    assert!(
        main.question_is_new(),
        "the trailing system message is not a reply"
    );
    assert_eq!(main.kinds, [Kind::Turn, Kind::Instructions]);
    assert_eq!(
        session.as_deref(),
        Some("session:d40c3ac6-8771-4bd8-8d3e-9f0eaf2d36e6")
    );
    let (continued, again) = recorded("claude-code-2");
    assert!(!continued.question_is_new());
    assert_eq!(again, session);
    assert_eq!(
        wire::round_rows(&continued, 0).0,
        [
            r#"called Bash {"command":"echo stub-tool-ran","description":"Echo"}"#,
            "Bash returned: stub-tool-ran"
        ]
    );
    let (next, again) = recorded("claude-code-3");
    assert!(next.question_is_new());
    assert_eq!(again, session);
    // Interactive: the session's title and `/compact` are side calls; the prompt after the
    // compaction is the user's words alone, the summary and the command's record context.
    assert!(recorded_side_call("claude-code-5"), "the title request");
    assert!(recorded_side_call("claude-code-6"), "the compaction");
    let (compacted, session) = recorded("claude-code-7");
    assert_eq!(
        compacted.question.as_deref(),
        Some("What is my cat called?")
    );
    assert!(compacted.question_is_new());
    assert!(session.unwrap().starts_with("session:"));
    let (image, _) = recorded("claude-code-4");
    let stored = image.question.unwrap();
    assert!(
        stored.starts_with("Describe this image.\n\n[Image: source: ")
            && stored.contains("\n[image attached: image/png, "),
        "{stored}"
    );

    let (main, session) = recorded("codex-1");
    assert!(
        main.question
            .as_deref()
            .unwrap()
            .starts_with("Run echo hello in the shell")
    );
    assert_eq!(
        main.kinds,
        [
            Kind::Instructions,
            Kind::Instructions,
            Kind::Context,
            Kind::Turn
        ]
    );
    assert!(session.as_deref().unwrap().starts_with("session:01a23894-"));
    let (continued, again) = recorded("codex-2");
    assert!(!continued.question_is_new());
    assert_eq!(again, session);
    assert_eq!(wire::round_rows(&continued, 0).0.len(), 2);
    let (next, again) = recorded("codex-3");
    assert!(next.question_is_new());
    assert_eq!(again, session);
    let (image, _) = recorded("codex-4");
    let stored = image.question.unwrap();
    assert!(
        stored.starts_with("Describe the image.\n[image attached: image/png, "),
        "the markup around the image is not the user's words: {stored}"
    );
}
