//! Wire compatibility with the official clients: the `openai` and `anthropic` Python SDKs
//! (pinned in `tools/install-deps.sh`, which makes their virtual environment) call the proxy
//! (Chat Completions, Responses, Messages), streaming and not, with tools, and get the
//! providers' errors as their own exception types. The client-side checks are in
//! `tests/sdk/clients.py`.

mod common;

use common::sdk_python;
use common::upstream::{Answer, Harness, fixture, jsonl_as_sse};

fn error(status: u16, body: serde_json::Value) -> Answer {
    Answer::Whole(status, "application/json", body.to_string().into_bytes())
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
    let sse = |path: &str| Answer::Whole(200, "text/event-stream", fixture(path).unwrap());
    let openai_error = |kind: &str| serde_json::json!({"error": {"message": "scripted", "type": kind, "param": null, "code": null}});
    let anthropic_error = |kind: &str| serde_json::json!({"type": "error", "error": {"type": kind, "message": "scripted"}});
    h.answer(Answer::Whole(200, "application/json", openai_text));
    h.answer(sse("openai-chat/oai-py_text_usage.sse"));
    h.answer(sse("openai-chat/oai-py_text_usage.sse"));
    h.answer(sse("openai-chat/oai-py_tool_calls_parallel_usage.sse"));
    h.answer(error(401, openai_error("invalid_request_error")));
    h.answer(error(429, openai_error("rate_limit_exceeded")));
    h.answer(error(500, openai_error("server_error")));
    for _ in 0..2 {
        let lines = fixture("openai-responses/vercel_text_two_messages.jsonl").unwrap();
        h.answer(Answer::Whole(
            200,
            "text/event-stream",
            jsonl_as_sse(&lines),
        ));
    }
    h.answer(Answer::Whole(
        200,
        "application/json",
        fixture("anthropic-messages/vercel_text.response.json").unwrap(),
    ));
    h.answer(sse("anthropic-messages/ant-py_text_basic.sse"));
    h.answer(sse("anthropic-messages/ant-py_tool_use.sse"));
    h.answer(error(429, anthropic_error("rate_limit_error")));
    h.answer(error(401, anthropic_error("authentication_error")));

    let proxy = format!("http://{}", h.proxy);
    common::run_sdk_script(
        python,
        "clients.py",
        proxy,
        fixtures,
        "all SDK checks passed",
    )
    .await;

    let received = h.received();
    assert_eq!(received.len(), 14, "one upstream call per SDK call");
    for r in &received[..7] {
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(r.headers["authorization"], "Bearer sk-sdk");
    }
    for r in &received[7..9] {
        assert_eq!(r.path, "/v1/responses");
        assert_eq!(r.json()["instructions"], "Be brief.");
    }
    for r in &received[9..] {
        assert!(r.path.starts_with("/v1/messages"), "{}", r.path);
    }
    let tools = &received[3].json()["tools"];
    assert_eq!(
        tools[0]["function"]["name"], "get_stock_price",
        "the harness's tools are kept"
    );
    let system = &received[0].json()["messages"][0];
    assert_eq!(system["role"], "system");
    assert_eq!(system["content"], "Be brief.");
}
