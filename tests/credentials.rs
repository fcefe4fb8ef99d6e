//! The credential that names a memory is the one the provider checks: a request that carries
//! two different credentials is refused in the caller's own error shape before anything is
//! stored or forwarded; the same credential in both places is served as usual.

mod common;

use serde_json::{Value, json};

use common::upstream::{Answer, Harness, body_of, header};

fn messages(question: &str) -> Vec<u8> {
    json!({"model": "claude-haiku-4-5", "max_tokens": 10,
        "messages": [{"role": "user", "content": question}]})
    .to_string()
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_request_with_two_different_keys_is_refused_unstored_and_unforwarded() {
    let proxy = Harness::start(|_| {}).await;
    let store_rows = || proxy.state.engine.generation().memory.store.next_row();
    let before = store_rows();

    let response = proxy
        .send(
            "POST",
            "/v1/messages",
            &[
                ("x-api-key", "ak-owner"),
                ("authorization", "Bearer ak-other"),
                ("anthropic-version", "2023-06-01"),
                ("content-type", "application/json"),
            ],
            &messages("Where did Lisbeth park the van?"),
        )
        .await;
    assert_eq!(response.status(), 400);
    assert_eq!(header(&response, "x-perpetuity-error"), "refused");
    let body: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert_eq!(body["type"], "error", "Anthropic's error shape: {body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("two different credentials"), "{message}");
    assert!(
        !message.contains("ak-"),
        "no credential in the answer: {message}"
    );
    assert!(proxy.received().is_empty(), "the upstream was called");
    assert_eq!(store_rows(), before, "a row was stored");
    for credential in ["ak-owner", "ak-other"] {
        assert!(proxy.rows_of(credential, 0).is_empty());
    }

    // The same key in both headers names one memory: served and captured as usual.
    proxy.answer(Answer::Whole(
        200,
        "application/json",
        json!({"content": [{"type": "text", "text": "Behind the mill."}]})
            .to_string()
            .into_bytes(),
    ));
    let response = proxy
        .send(
            "POST",
            "/v1/messages",
            &[
                ("x-api-key", "ak-owner"),
                ("authorization", "Bearer ak-owner"),
                ("anthropic-version", "2023-06-01"),
                ("content-type", "application/json"),
            ],
            &messages("Where did Lisbeth park the van?"),
        )
        .await;
    assert_eq!(response.status(), 200);
    body_of(response).await;
    assert_eq!(proxy.received().len(), 1);
    assert!(!proxy.rows_of("ak-owner", 1).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_request_whose_header_and_query_keys_differ_is_refused_in_geminis_shape() {
    let proxy = Harness::start(|_| {}).await;
    let before = proxy.state.engine.generation().memory.store.next_row();
    let response = proxy
        .send(
            "POST",
            "/v1beta/models/gemini-2.5-flash:generateContent?key=g-other",
            &[
                ("x-goog-api-key", "g-owner"),
                ("content-type", "application/json"),
            ],
            json!({"contents": [{"role": "user", "parts": [{"text": "Which river?"}]}]})
                .to_string()
                .as_bytes(),
        )
        .await;
    assert_eq!(response.status(), 400);
    let body: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert_eq!(body["error"]["status"], "INVALID_ARGUMENT", "{body}");
    assert_eq!(body["error"]["code"], 400, "{body}");
    assert!(proxy.received().is_empty(), "the upstream was called");
    assert_eq!(
        proxy.state.engine.generation().memory.store.next_row(),
        before
    );
}
