//! Wire compatibility with the official clients: the `openai`, `anthropic` and `google-genai`
//! Python SDKs (pinned in `tools/install-deps.sh`, which makes their virtual environment, with
//! the older `anthropic` 1.17.0 beside it) call the proxy (Chat Completions, Responses,
//! Messages, Gemini), streaming and not, with tools, and get the providers' errors as their
//! own exception types. The client-side checks are in `tests/sdk/clients.py` (and, for the
//! retry, the back-to-back turns, a turn with recall off, the model's restatement and a tool
//! result followed by its chain, `retry.py`, `back_to_back.py`, `recall_off.py`,
//! `model_weight.py` and `tool_chain.py`).

mod common;

use std::ffi::OsStr;

use common::sdk_python;
use common::upstream::{Answer, Harness, body_of, fixture, gemini_jsonl_as_sse, jsonl_as_sse};
use perpetuity::recall::RecallConfig;

fn error(status: u16, body: serde_json::Value) -> Answer {
    Answer::Whole(status, "application/json", body.to_string().into_bytes())
}

fn sse(stream: Vec<u8>) -> Answer {
    Answer::Whole(200, "text/event-stream", stream)
}

fn recorded_sse(path: &str) -> Answer {
    sse(fixture(path).unwrap())
}

/// Each route's request count in the proxy's `/metrics`, checked against what the upstream
/// received: a chat route counts its format's calls (the router finds the format by the path
/// each one serves), `pass_through` the rest.
async fn assert_routes_counted(h: &Harness, expected: &[(&str, usize)]) {
    let metrics = String::from_utf8(body_of(h.send("GET", "/metrics", &[], b"").await).await)
        .expect("metrics are text");
    for (route, count) in expected {
        let line = format!("perpetuity_requests_total{{route=\"{route}\"}} {count}");
        assert!(metrics.contains(&line), "{line} not in\n{metrics}");
    }
}

fn anthropic_error(kind: &str) -> serde_json::Value {
    serde_json::json!({"type": "error", "error": {"type": kind, "message": "scripted"}})
}

/// The answers to `clients.py`'s Messages calls, in order (7 upstream calls).
fn script_anthropic(h: &Harness) {
    h.answer(Answer::Whole(
        200,
        "application/json",
        fixture("anthropic-messages/vercel_text.response.json").unwrap(),
    ));
    h.answer(recorded_sse("anthropic-messages/ant-py_text_basic.sse"));
    h.answer(recorded_sse("anthropic-messages/ant-py_tool_use.sse"));
    h.answer(error(429, anthropic_error("rate_limit_error")));
    h.answer(error(401, anthropic_error("authentication_error")));
    h.answer(error(529, anthropic_error("overloaded_error")));
    let started = r#"{"type":"message_start","message":{"id":"msg_cut","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}"#;
    let error = anthropic_error("overloaded_error");
    h.answer(sse(format!(
        "event: message_start\ndata: {started}\n\n\
         event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
         event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"Half an\"}}}}\n\n\
         event: error\ndata: {error}\n\n"
    )
    .into_bytes()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_see_valid_answers_through_the_proxy() {
    let (Some(python), Some(fixtures)) = (sdk_python(), common::shared_dir()) else {
        return;
    };
    let fixtures = fixtures.join("fixtures/providers");
    let Some(openai_text) = fixture("openai-chat/vercel_text.response.json") else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    let openai_error = |kind: &str| serde_json::json!({"error": {"message": "scripted", "type": kind, "param": null, "code": null}});
    h.answer(Answer::Whole(200, "application/json", openai_text));
    h.answer(recorded_sse("openai-chat/oai-py_text_usage.sse"));
    h.answer(recorded_sse("openai-chat/oai-py_text_usage.sse"));
    h.answer(recorded_sse(
        "openai-chat/oai-py_tool_calls_parallel_usage.sse",
    ));
    h.answer(error(401, openai_error("invalid_request_error")));
    h.answer(error(429, openai_error("rate_limit_exceeded")));
    h.answer(error(500, openai_error("server_error")));
    let chunk = r#"{"id":"chatcmpl-cut","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":"Half an"},"finish_reason":null}]}"#;
    let cut = openai_error("server_error");
    h.answer(sse(format!("data: {chunk}\n\ndata: {cut}\n\n").into_bytes()));
    for path in [
        "openai-responses/vercel_text_two_messages.jsonl",
        "openai-responses/vercel_text_two_messages.jsonl",
        "openai-responses/vercel_stream_error_insufficient_quota.jsonl",
    ] {
        h.answer(sse(jsonl_as_sse(&fixture(path).unwrap())));
    }
    script_anthropic(&h);

    let proxy = format!("http://{}", h.proxy);
    common::run_sdk_script(
        python,
        "clients.py",
        proxy,
        fixtures,
        &[("SDKS", OsStr::new("openai,responses,anthropic"))],
        "all SDK checks passed",
    )
    .await;

    let received = h.received();
    assert_eq!(received.len(), 18, "one upstream call per SDK call");
    let on = |path: &str| received.iter().filter(|r| r.path == path).count();
    let (chat, responses, messages) = (
        on("/v1/chat/completions"),
        on("/v1/responses"),
        on("/v1/messages"),
    );
    assert_routes_counted(
        &h,
        &[
            ("openai_chat", chat),
            ("openai_responses", responses),
            ("anthropic_messages", messages),
            ("pass_through", received.len() - chat - responses - messages),
        ],
    )
    .await;
    for r in &received[..8] {
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(r.headers["authorization"], "Bearer sk-sdk");
    }
    for r in &received[8..11] {
        assert_eq!(r.path, "/v1/responses");
        assert_eq!(r.json()["instructions"], "Be brief.");
    }
    for r in &received[11..] {
        assert!(r.path.starts_with("/v1/messages"), "{}", r.path);
    }
    assert_eq!(
        received[17].headers["anthropic-beta"], "scripted-beta-1",
        "anthropic-beta reaches the upstream unchanged"
    );
    let tools = &received[3].json()["tools"];
    assert_eq!(
        tools[0]["function"]["name"], "get_stock_price",
        "the harness's tools are kept"
    );
    let system = &received[0].json()["messages"][0];
    assert_eq!(system["role"], "system");
    assert_eq!(system["content"], "Be brief.");
    let cut = h
        .rows_of("sk-sdk", 1)
        .into_iter()
        .find(|row| row.text.starts_with("Half an"))
        .expect("the reply cut short by an error is captured as far as it came");
    assert!(cut.text.contains("truncated"), "{}", cut.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gemini_sdk_sees_valid_answers_through_the_proxy() {
    let (Some(python), Some(shared)) = (sdk_python(), common::shared_dir()) else {
        return;
    };
    let (Some(whole), Some(text), Some(call), Some(quota)) = (
        fixture("gemini/vercel_text.response.json"),
        fixture("gemini/vercel_text.jsonl"),
        fixture("gemini/vercel_function_call.jsonl"),
        fixture("gemini/vercel_error_429.json"),
    ) else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    h.answer(Answer::Whole(200, "application/json", whole));
    h.answer(sse(gemini_jsonl_as_sse(&text)));
    h.answer(sse(gemini_jsonl_as_sse(&call)));
    h.answer(Answer::Whole(429, "application/json", quota));
    h.answer(error(
        500,
        serde_json::json!({"error": {"code": 500, "message": "scripted", "status": "INTERNAL"}}),
    ));

    common::run_sdk_script(
        python,
        "clients.py",
        format!("http://{}", h.proxy),
        shared.join("fixtures/providers"),
        &[("SDKS", OsStr::new("gemini"))],
        "all SDK checks passed",
    )
    .await;

    let received = h.received();
    assert_eq!(received.len(), 5, "one upstream call per SDK call");
    assert_routes_counted(&h, &[("gemini_generate", 5), ("pass_through", 0)]).await;
    // The SDK calls the stable version, `/v1/`, by default.
    let model = "/v1/models/gemini-3-pro-preview";
    assert_eq!(received[0].path, format!("{model}:generateContent"));
    for r in &received[1..3] {
        assert_eq!(r.path, format!("{model}:streamGenerateContent?alt=sse"));
    }
    for r in &received {
        assert_eq!(r.headers["x-goog-api-key"], "g-sdk", "the key is forwarded");
        assert_eq!(
            r.json()["systemInstruction"]["parts"][0]["text"],
            "Be brief.",
            "the system instruction is kept"
        );
    }
    assert_eq!(
        received[2].json()["tools"][0]["functionDeclarations"][0]["name"],
        "weather",
        "the harness's tools are kept"
    );
    assert!(
        received[1].text().contains("r's in strawberry?")
            && received[3].text().contains("San Francisco"),
        "later calls of the same key recall the earlier ones' turns: {}",
        received[3].text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_older_anthropic_sdk_sends_x_api_key_and_shares_the_newer_ones_memory() {
    let (Some(python), Some(shared)) = (sdk_python(), common::shared_dir()) else {
        return;
    };
    let Some(legacy) = common::legacy_anthropic(&python) else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    script_anthropic(&h);
    script_anthropic(&h);
    let proxy = format!("http://{}", h.proxy);
    let fixtures = shared.join("fixtures/providers");
    let only = ("SDKS", OsStr::new("anthropic"));
    common::run_sdk_script(
        python.clone(),
        "clients.py",
        proxy.clone(),
        fixtures.clone(),
        &[only, ("PYTHONPATH", legacy.as_os_str())],
        "all SDK checks passed",
    )
    .await;
    common::run_sdk_script(
        python,
        "clients.py",
        proxy,
        fixtures,
        &[only],
        "all SDK checks passed",
    )
    .await;

    let received = h.received();
    assert_eq!(received.len(), 14, "one upstream call per SDK call");
    let (older, newer) = received.split_at(7);
    for r in older {
        assert_eq!(r.headers["user-agent"], "Anthropic/Python 1.17.0");
        assert_eq!(r.headers["x-api-key"], "ak-sdk", "the key is forwarded");
        assert_eq!(r.headers["anthropic-version"], "2023-06-01");
        assert!(!r.headers.contains_key("authorization"));
    }
    for r in newer {
        assert_eq!(r.headers["user-agent"], "Anthropic/Python 2.14.0");
        assert_eq!(r.headers["authorization"], "Bearer ak-sdk");
        assert_eq!(r.headers["anthropic-version"], "2026-10-21");
        assert!(!r.headers.contains_key("x-api-key"));
    }
    assert!(
        newer[0].text().matches("How are you?").count() >= 2,
        "the key is one memory by either header: the newer SDK's first call recalls the older \
         one's question besides its own: {}",
        newer[0].text()
    );
}

/// The OpenAI SDK retries a 429 by itself: the retried question is stored once, its reply once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdks_own_retry_after_a_429_stores_the_question_once() {
    let Some(python) = sdk_python() else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    h.answer(error(
        429,
        serde_json::json!({"error": {"message": "scripted", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}),
    ));
    h.answer(common::upstream::chat_reply("Noted."));
    common::run_sdk_script(
        python,
        "retry.py",
        format!("http://{}", h.proxy),
        std::path::PathBuf::new(),
        &[],
        "retry checks passed",
    )
    .await;
    assert_eq!(h.received().len(), 2, "the SDK retried once");
    let rows = h.rows_of("sk-sdk-retry", 2);
    let said: Vec<&str> = rows.iter().map(|r| r.text.as_str()).collect();
    assert_eq!(said, ["My bike lock code is 3391, remember it.", "Noted."]);
}

/// The OpenAI SDK reads a long streamed reply to its end and sends the next turn at once: the
/// reply was stored before its stream ended, so the next turn's frame, which replaces the
/// history the SDK resends, holds the reply's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_read_to_its_end_is_in_the_next_turns_frame() {
    let Some(python) = sdk_python() else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    let mut stream = String::new();
    let chunk = |text: &str| {
        let delta = serde_json::json!({"id": "chatcmpl-long", "object": "chat.completion.chunk",
            "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]});
        format!("data: {delta}\n\n")
    };
    // About 8,000 tokens: some thirty rows to store, the end in the last.
    for item in 0..600 {
        stream.push_str(&chunk(&format!(
            "Item {item} on the packing list is a spare pouch numbered {item}. "
        )));
    }
    stream.push_str(&chunk("The lock code is 3391."));
    stream.push_str("data: [DONE]\n\n");
    h.answer(sse(stream.into_bytes()));
    h.answer(common::upstream::chat_reply("Noted."));
    common::run_sdk_script(
        python,
        "back_to_back.py",
        format!("http://{}", h.proxy),
        std::path::PathBuf::new(),
        &[],
        "back-to-back checks passed",
    )
    .await;
    let received = h.received();
    assert_eq!(received.len(), 2, "one upstream call per SDK call");
    let next = received[1].text();
    assert!(
        next.contains("The lock code is 3391."),
        "the next turn's frame holds the reply's end: {next}"
    );
}

/// The OpenAI SDK streams a turn with recall off: it is forwarded as the SDK sent it while its
/// question is captured, the answer's headers say so, and the next turn's frame holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_with_recall_off_is_forwarded_as_sent_and_its_question_remembered() {
    let (Some(python), Some(stream)) = (sdk_python(), fixture("openai-chat/oai-py_text_usage.sse"))
    else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    h.answer(sse(stream));
    h.answer(common::upstream::chat_reply("Noted."));
    common::run_sdk_script(
        python,
        "recall_off.py",
        format!("http://{}", h.proxy),
        std::path::PathBuf::new(),
        &[],
        "recall-off checks passed",
    )
    .await;
    let received = h.received();
    assert_eq!(received.len(), 2, "one upstream call per SDK call");
    assert_eq!(
        received[0].json()["messages"],
        serde_json::json!([{"role": "user", "content": "The boat's mooring is at buoy 47, note it."}]),
        "recall off forwards the SDK's messages as sent"
    );
    assert!(
        received[1].text().contains("buoy 47"),
        "the next turn's frame holds the question captured beside the forward: {}",
        received[1].text()
    );
}

/// The question's forwarded body after the OpenAI SDK told a fact in one conversation (the
/// upstream's reply restating it, stored under the model's id as every reply is) and asked
/// about it in another, with room in the frame for the question and one remembered turn.
async fn asked_after_a_restatement(python: &std::path::Path, model_weight: f32) -> String {
    let h = Harness::start(|config| {
        config.recall.model_weight = model_weight;
        config.recall.mandatory_hits = 1;
        config.recall.budget = perpetuity::budget::Budget {
            floor: 1,
            ceiling: 1,
        };
    })
    .await;
    h.answer(common::upstream::chat_reply(
        "So your sister's wedding is in Lisbon in May.",
    ));
    h.answer(common::upstream::chat_reply("Noted."));
    for step in ["tell", "ask"] {
        common::run_sdk_script(
            python.to_owned(),
            "model_weight.py",
            format!("http://{}", h.proxy),
            std::path::PathBuf::new(),
            &[("STEP", OsStr::new(step))],
            "model weight step passed",
        )
        .await;
        // The reply is stored before the next conversation asks.
        h.rows_of("sk-sdk-model", 2);
    }
    let received = h.received();
    assert_eq!(received.len(), 2, "one upstream call per SDK call");
    received[1].text()
}

/// Through the OpenAI SDK, the model's restatement of a fact matches the question a little
/// better than the user's own words, and the frame, with room for one of them, shows the
/// user's: in the frame's order the model's rows keep `model_weight` of their score. At weight
/// 1 it shows the model's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_frame_shows_what_the_user_said_before_the_models_restatement() {
    let Some(python) = sdk_python() else {
        return;
    };
    let (said, restated) = ("a car and a flight for two", "So your sister");
    let weighed = asked_after_a_restatement(&python, RecallConfig::default().model_weight).await;
    assert!(
        weighed.contains(said) && !weighed.contains(restated),
        "{weighed}"
    );
    let unweighed = asked_after_a_restatement(&python, 1.0).await;
    assert!(
        unweighed.contains(restated) && !unweighed.contains(said),
        "{unweighed}"
    );
}

/// One step of `tool_chain.py` against the proxy at `proxy`.
async fn chain_step(python: &std::path::Path, proxy: &str, step: &str) {
    common::run_sdk_script(
        python.to_owned(),
        "tool_chain.py",
        proxy.to_owned(),
        std::path::PathBuf::new(),
        &[("STEP", OsStr::new(step))],
        "tool chain step passed",
    )
    .await;
}

/// Through the OpenAI SDK, an agent's turn whose tool read a long log, then a question about it
/// in a new conversation: the frame shows the log's first 600 characters and says
/// `memory_chain #ID returns the whole`; the model calls it, and the round after receives the
/// whole log, as the note said (the rows the preview cut do not count as shown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_result_the_frame_cut_short_comes_back_whole_from_its_chain() {
    let Some(python) = sdk_python() else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    let proxy = format!("http://{}", h.proxy);
    h.answer(common::upstream::chat_reply("You watered the tomato beds."));
    chain_step(&python, &proxy, "read").await;
    let rows = h.rows_of("sk-sdk-chain", 5);
    let log = rows
        .iter()
        .find(|r| {
            r.role == perpetuity::types::Role::Tool && r.text.starts_with("read_file returned")
        })
        .unwrap_or_else(|| panic!("the tool's result is stored: {rows:?}"));
    assert!(log.chunks > 2, "the log is chunked");
    let item = log.message.0;
    let call = serde_json::json!({"id": "chatcmpl-chain", "object": "chat.completion", "created": 1,
        "model": "gpt-4o", "choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": null, "tool_calls": [{"id": "call_chain",
            "type": "function", "function": {"name": "memory_chain",
                "arguments": format!("{{\"item\": {item}}}")}}]}}]});
    h.answer(Answer::Whole(
        200,
        "application/json",
        call.to_string().into_bytes(),
    ));
    h.answer(common::upstream::chat_reply("Entry 299 was the last."));
    chain_step(&python, &proxy, "ask").await;
    let received = h.received();
    assert_eq!(received.len(), 3, "the read, and the question's two rounds");
    let framed = received[1].text();
    assert!(
        framed.contains(&format!(
            "[cut here; memory_chain #{item} returns the whole]"
        )),
        "{framed}"
    );
    assert!(!framed.contains("entry 299:"), "the preview is cut");
    let chained = received[2].json()["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(chained["tool_call_id"], "call_chain");
    let text = chained["content"].as_str().unwrap();
    assert!(text.starts_with("memory_chain: "), "{text}");
    assert!(
        text.contains("entry 299:"),
        "the whole log comes back: {text}"
    );
}
