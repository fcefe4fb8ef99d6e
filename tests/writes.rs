//! Who may write, over real HTTP on loopback: a credential the provider refuses (401, 403)
//! leaves nothing behind; a client's retry of the same question after a 429 stores it once;
//! a stream in flight across its user's purge does not bring the user back.

mod common;

use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper::StatusCode;
use serde_json::json;
use tokio::sync::oneshot;

use common::upstream::{Answer, Harness, body_of, chat_reply};
use perpetuity::types::UserId;

fn chat(question: &str, stream: bool) -> Vec<u8> {
    json!({"model": "gpt-4o", "stream": stream,
        "messages": [{"role": "user", "content": question}]})
    .to_string()
    .into_bytes()
}

fn refused(status: u16) -> Answer {
    Answer::Whole(
        status,
        "application/json",
        br#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#.to_vec(),
    )
}

/// Every row of the user behind `credential`, now.
fn rows(h: &Harness, credential: &str) -> Vec<perpetuity::store::Row> {
    let user = UserId::from_key(&h.state.secret.user_key(credential, None));
    let store = &h.state.engine.generation().memory.store;
    store.rows_of(user).collect::<Result<_, _>>().unwrap()
}

fn assert_integrity(h: &Harness, when: &str) {
    let report = h.state.engine.integrity().unwrap();
    assert!(report.is_clean(), "{when}: {:?}", report.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_the_provider_refuses_leaves_nothing_behind() {
    let h = Harness::start(|_| {}).await;
    h.answer(chat_reply("Noted."));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-real")],
            &chat("My locker is number 1187.", false),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    body_of(response).await;
    let before = h.rows_of("sk-real", 2);

    for (i, (status, stream, tools)) in [
        (401, false, "on"),
        (401, true, "on"),
        (403, false, "off"),
        (401, true, "off"),
    ]
    .into_iter()
    .enumerate()
    {
        let random = format!("sk-random-{i}-8d1f0c");
        h.answer(refused(status));
        let response = h
            .send(
                "POST",
                "/v1/chat/completions",
                &[
                    ("authorization", &format!("Bearer {random}")),
                    ("x-perpetuity-tools", tools),
                ],
                &chat(&format!("Fill the disk, attempt {i}."), stream),
            )
            .await;
        assert_eq!(response.status().as_u16(), status, "attempt {i}");
        let body = body_of(response).await;
        assert!(
            String::from_utf8_lossy(&body).contains("invalid_api_key"),
            "attempt {i}: the provider's own error reaches the client"
        );
        let user = UserId::from_key(&h.state.secret.user_key(&random, None));
        let store = &h.state.engine.generation().memory.store;
        assert!(rows(&h, &random).is_empty(), "attempt {i}: rows stored");
        assert_eq!(
            store.user_key(user).unwrap(),
            None,
            "attempt {i}: the refused credential became a tenant"
        );
        let forwarded = h.received().pop().unwrap().text();
        assert!(
            forwarded.contains(&format!("Fill the disk, attempt {i}.")),
            "attempt {i}: the question is still in its own request"
        );
    }
    assert_eq!(
        rows(&h, "sk-real"),
        before,
        "the real user's rows are unchanged"
    );
    assert_integrity(&h, "after the refused credentials");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_429_stores_the_question_once() {
    let h = Harness::start(|_| {}).await;
    // A new credential (its first request is also its first capture), then a known one.
    for credential in ["sk-new-retrier", "sk-new-retrier"] {
        let before = rows(&h, credential).len();
        let question = format!("Remind me: the gate code is 5521 ({before}).");
        h.answer(Answer::Whole(
            429,
            "application/json",
            br#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#.to_vec(),
        ));
        h.answer(chat_reply("Gate code noted."));
        let auth = format!("Bearer {credential}");
        let mut statuses = Vec::new();
        for _ in 0..2 {
            let response = h
                .send(
                    "POST",
                    "/v1/chat/completions",
                    &[("authorization", &auth)],
                    &chat(&question, false),
                )
                .await;
            statuses.push(response.status().as_u16());
            body_of(response).await;
        }
        assert_eq!(statuses, [429, 200]);
        let after = h.rows_of(credential, before + 2);
        let questions = after.iter().filter(|r| r.text == question).count();
        assert_eq!(
            questions, 1,
            "the retried question is stored once: {after:?}"
        );
        assert_eq!(
            after.len(),
            before + 2,
            "one question, one reply: {after:?}"
        );
    }
    assert_integrity(&h, "after the retries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_in_flight_across_its_users_purge_stores_nothing_after_it() {
    let h = Harness::start(|_| {}).await;
    let credential = "sk-purged-midstream";
    h.answer(chat_reply("Noted."));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-purged-midstream")],
            &chat("My canary is Zorblat-77.", false),
        )
        .await;
    body_of(response).await;
    assert_eq!(h.rows_of(credential, 2).len(), 2);

    let (go, wait) = oneshot::channel();
    let first = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Your canary \"}}]}\n\n"
        .to_vec();
    let rest = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"is Zorblat-77.\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n".to_vec();
    h.answer(Answer::Held(first, rest, wait));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-purged-midstream")],
            &chat("What is my canary?", true),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the first event arrives")
        .unwrap()
        .unwrap();

    let key = h.state.secret.user_key(credential, None);
    let state = std::sync::Arc::clone(&h.state);
    let removed =
        tokio::task::spawn_blocking(move || perpetuity::proxy::admin::purge(&state, &key, false))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(removed.rows, 3, "the two turns and the live question");
    go.send(()).unwrap();
    let rest = body.collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&rest).contains("Zorblat-77"));
    // The reply is captured after its last byte; give it the time a capture takes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        rows(&h, credential).is_empty(),
        "the stream brought the purged user back: {:?}",
        rows(&h, credential)
    );
    assert_integrity(&h, "after the purge mid-stream");
}
