//! Who may write, over real HTTP on loopback: a credential the provider refuses (401, 403)
//! leaves nothing behind, nor does a made-up key whatever the upstream answers short of a
//! success (Gemini's 400 for an invalid key, a 429, a 5xx), on any route; a repeated identity
//! header is refused; a stranger's purge
//! and an oversized exclusion cost nothing; a client's retry of the same question after a 429
//! stores it once; a stream in flight across its user's purge does not bring the user back.

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

/// `credential` asks `question` over Chat Completions; the answer's status, its body read.
async fn ask(h: &Harness, credential: &str, question: &str, stream: bool) -> StatusCode {
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[("authorization", &format!("Bearer {credential}"))],
            &chat(question, stream),
        )
        .await;
    let status = response.status();
    body_of(response).await;
    status
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
async fn a_made_up_key_stores_nothing_whatever_the_upstream_answers_short_of_a_success() {
    let h = Harness::start(|_| {}).await;
    let key = "made-up-gemini-0";
    let user = UserId::from_key(&h.state.secret.user_key(key, None));
    let store = || h.state.engine.generation().memory.store.clone();
    // Google answers an invalid key with 400 API_KEY_INVALID, not 401.
    let invalid = br#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID"}]}}"#;
    h.answer(Answer::Whole(400, "application/json", invalid.to_vec()));
    let gemini =
        json!({"contents": [{"role": "user", "parts": [{"text": "GEMCANARY fill the disk"}]}]});
    let response = h
        .send(
            "POST",
            &format!("/v1beta/models/gemini-test:generateContent?key={key}"),
            &[],
            gemini.to_string().as_bytes(),
        )
        .await;
    assert_eq!(response.status().as_u16(), 400);
    body_of(response).await;
    assert!(rows(&h, key).is_empty(), "Gemini's 400 stored the question");
    assert_eq!(store().user_key(user).unwrap(), None);
    // The same key on another route, whatever the upstream answers short of a success.
    for (i, status) in [401, 400, 429, 500, 503].into_iter().enumerate() {
        h.answer(refused(status));
        let answered = ask(&h, key, &format!("CANARY {i}: fill the disk."), i % 2 == 0).await;
        assert_eq!(answered.as_u16(), status);
        assert!(rows(&h, key).is_empty(), "a {status} stored the question");
    }
    // A success makes the credential's requests its memory.
    h.answer(chat_reply("Noted."));
    assert_eq!(
        ask(&h, key, "My locker is number 1187.", false).await,
        StatusCode::OK
    );
    assert_eq!(h.rows_of(key, 2).len(), 2, "the question and the reply");
    // Refused later (a revoked key): from then on it waits for a success again.
    h.answer(refused(401));
    ask(&h, key, "Revoked now.", false).await;
    let after_refusal = rows(&h, key).len();
    h.answer(refused(500));
    ask(&h, key, "CANARY after the refusal.", false).await;
    assert_eq!(
        rows(&h, key).len(),
        after_refusal,
        "a refused credential's next request waits for a success"
    );
    assert_integrity(&h, "after the made-up key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_purge_and_an_oversized_exclusion_change_nothing() {
    let h = Harness::start(|_| {}).await;
    h.answer(chat_reply("Noted."));
    ask(&h, "sk-owner", "My locker is number 1187.", false).await;
    let owner = h.rows_of("sk-owner", 2);
    let store = h.state.engine.generation().memory.store.clone();
    let purges = store.purges().unwrap();
    let stranger = h.state.secret.user_key("stranger-0", None);
    let response = h
        .send(
            "POST",
            "/perpetuity/api/purge",
            &[("authorization", "Bearer stranger-0")],
            json!({"confirm": stranger}).to_string().as_bytes(),
        )
        .await;
    assert_eq!(
        response.status(),
        StatusCode::FORBIDDEN,
        "a credential the provider never accepted purges nothing"
    );
    assert_eq!(store.purges().unwrap(), purges);
    // A user with no memory: its purge is no purge.
    let none = h
        .state
        .engine
        .purge(
            perpetuity::types::UserId::from_key(&stranger),
            false,
            |_| {},
        )
        .unwrap();
    assert_eq!(none.rows, 0);
    assert_eq!(
        store.purges().unwrap(),
        purges,
        "a purge of a user the store does not know is no purge"
    );

    let too_many: Vec<u64> = (0..10_001).collect();
    let response = h
        .send(
            "POST",
            "/perpetuity/exclusions",
            &[("authorization", "Bearer sk-owner")],
            json!({"rows": too_many}).to_string().as_bytes(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let said = String::from_utf8(body_of(response).await).unwrap();
    assert!(said.contains("at most 10000"), "{said}");
    let row = owner[0].id.0;
    let response = h
        .send(
            "POST",
            "/perpetuity/exclusions",
            &[("authorization", "Bearer sk-owner")],
            json!({"rows": [row, row, row]}).to_string().as_bytes(),
        )
        .await;
    let done: serde_json::Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert_eq!(
        done["changed"],
        json!([row]),
        "a row named thrice changes once"
    );
    assert_eq!(
        rows(&h, "sk-owner"),
        owner,
        "the owner's rows are unchanged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_trickle_hold_no_slot_and_end_at_their_deadline() {
    use std::io::{Read as _, Write as _};
    let h = Harness::start(|config| {
        config.max_concurrent = 2;
        config.body_timeout = Duration::from_secs(3);
    })
    .await;
    let proxy = h.proxy;
    let trickling: Vec<_> = (0..2)
        .map(|i| {
            std::thread::spawn(move || {
                let mut client = std::net::TcpStream::connect(proxy).unwrap();
                let head = format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer sk-trickle-{i}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
                );
                client.write_all(head.as_bytes()).unwrap();
                let started = std::time::Instant::now();
                client
                    .set_read_timeout(Some(Duration::from_millis(500)))
                    .unwrap();
                let mut answer = Vec::new();
                while started.elapsed() < Duration::from_secs(20) {
                    if client.write_all(b" ").is_err() {
                        break;
                    }
                    let mut buf = [0u8; 4096];
                    match client.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => answer.extend_from_slice(&buf[..n]),
                        Err(_) => {}
                    }
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.len() > 100 {
                        break;
                    }
                }
                (started.elapsed(), String::from_utf8_lossy(&answer).into_owned())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.answer(chat_reply("Served."));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-patient")],
            &chat("Am I served while bodies trickle?", false),
        )
        .await;
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "a trickling body holds no slot"
    );
    body_of(response).await;
    for client in trickling {
        let (took, answer) = client.join().unwrap();
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("took longer than"), "{answer}");
        assert!(took < Duration::from_secs(10), "ended after {took:?}");
    }
    assert_eq!(h.received().len(), 1, "no trickled body was forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_identity_header_is_refused_before_anything_is_stored() {
    let h = Harness::start(|_| {}).await;
    for (case, headers) in [
        (
            "x-perpetuity-user twice",
            vec![
                ("authorization", "Bearer sk-two"),
                ("x-perpetuity-user", "alice"),
                ("x-perpetuity-user", "bob"),
            ],
        ),
        (
            "a Basic Authorization beside the Bearer",
            vec![
                ("authorization", "Bearer sk-two"),
                ("authorization", "Basic anVuaw=="),
            ],
        ),
    ] {
        let response = h
            .send(
                "POST",
                "/v1/chat/completions",
                &headers,
                &chat("Where am I stored?", false),
            )
            .await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{case}");
        body_of(response).await;
    }
    assert!(h.received().is_empty(), "nothing forwarded");
    assert!(rows(&h, "sk-two").is_empty(), "nothing stored");
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
