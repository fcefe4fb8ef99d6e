//! The proxy over real HTTP on loopback, in front of a scripted upstream that replays recorded
//! provider streams: the frame replaces the history, streams pass through unchanged and
//! unbuffered, replies are captured, memories never cross credentials, and bad requests get
//! errors in the caller's own API shape.

mod common;

use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper::StatusCode;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use common::upstream::{
    Answer, Harness, body_of, chat_reply, chat_request, fixture, gemini_jsonl_as_sse, header,
    jsonl_as_sse,
};
use perpetuity::dictionary::DEFAULT_VERSION;
use perpetuity::types::{Role, RowId, UserId};

const OPENAI: [(&str, &str); 2] = [
    ("authorization", "Bearer sk-alice"),
    ("content-type", "application/json"),
];

fn chat_body(history: &[(&str, &str)], question: &str) -> Vec<u8> {
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    for (role, content) in history {
        messages.push(json!({"role": role, "content": content}));
    }
    messages.push(json!({"role": "user", "content": question}));
    json!({"model": "gpt-4o", "stream": true, "messages": messages})
        .to_string()
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_stream_passes_through_the_frame_replaces_history_and_the_reply_is_captured() {
    let Some(stream) = fixture("openai-chat/oai-py_text_usage.sse") else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    h.answer(Answer::Whole(200, "text/event-stream", stream.clone()));
    let body = chat_body(
        &[
            ("user", "an old question"),
            ("assistant", "OLD-HISTORY-MARKER resent by the harness"),
        ],
        "Remember that my locker code is 4172.",
    );
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[OPENAI[0], OPENAI[1], ("x-perpetuity-conversation", "first")],
            &body,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "x-perpetuity-memory"), "ok");
    assert_eq!(header(&response, "x-accel-buffering"), "no");
    assert_eq!(
        header(&response, "x-perpetuity-dictionary"),
        DEFAULT_VERSION
    );
    assert_eq!(
        body_of(response).await,
        stream,
        "the stream reaches the client unchanged"
    );

    let sent = h.received().pop().unwrap();
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(
        sent.headers["authorization"], "Bearer sk-alice",
        "the credential is forwarded"
    );
    assert_eq!(sent.headers["accept-encoding"], "identity");
    let upstream = sent.json();
    let messages = upstream["messages"].as_array().unwrap();
    assert_eq!(
        messages[0],
        json!({"role": "system", "content": "You are terse."})
    );
    assert_eq!(
        messages[1..3],
        [
            json!({"role": "user", "content": "an old question"}),
            json!({"role": "assistant", "content": "OLD-HISTORY-MARKER resent by the harness"})
        ],
        "history the memory never captured arrives as sent, where it stood"
    );
    assert_eq!(sent.text().matches("OLD-HISTORY-MARKER").count(), 1);
    assert_eq!(sent.text().matches("my locker code is 4172").count(), 1);
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "user");
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .ends_with("Remember that my locker code is 4172.")
    );

    let rows = h.rows_of("sk-alice", 2);
    let said: Vec<(Role, &str)> = rows.iter().map(|r| (r.role, r.text.as_str())).collect();
    assert_eq!(
        said[0],
        (Role::User, "Remember that my locker code is 4172.")
    );
    assert_eq!(
        said.len(),
        2,
        "the question and the reply, nothing of the resent history"
    );
    assert_eq!(rows[1].role, Role::Assistant);
    assert_eq!(rows[1].name.as_deref(), Some("gpt-4o"));
    assert!(rows[1].text.starts_with("I'm"), "{}", rows[1].text);
    assert!(!rows[1].text.contains("truncated"));

    // The next turn resends the first as history: the memory holds that turn, so the frame
    // stands in for it; what it never held still arrives as sent.
    h.answer(Answer::Whole(200, "text/event-stream", stream.clone()));
    let next = chat_body(
        &[
            ("user", "an old question"),
            ("assistant", "OLD-HISTORY-MARKER resent by the harness"),
            ("user", "Remember that my locker code is 4172."),
            ("assistant", &rows[1].text),
        ],
        "And what is the bike lock's?",
    );
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[OPENAI[0], OPENAI[1], ("x-perpetuity-conversation", "first")],
            &next,
        )
        .await;
    body_of(response).await;
    let sent = h.received().pop().unwrap();
    assert_eq!(sent.text().matches("OLD-HISTORY-MARKER").count(), 1);
    assert_eq!(
        sent.text().matches("my locker code is 4172").count(),
        1,
        "the held turn is replaced, not sent twice: {}",
        sent.text()
    );
    assert_eq!(
        sent.json()["messages"][1],
        json!({"role": "user", "content": "an old question"})
    );
    h.rows_of("sk-alice", 4);

    // A second conversation of the same credential sees the first; another credential never.
    h.answer(Answer::Whole(200, "text/event-stream", stream.clone()));
    let again = chat_body(&[], "What is my locker code?");
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[
                OPENAI[0],
                OPENAI[1],
                ("x-perpetuity-conversation", "second"),
            ],
            &again,
        )
        .await;
    body_of(response).await;
    assert!(
        h.received()
            .pop()
            .unwrap()
            .text()
            .contains("my locker code is 4172")
    );

    h.answer(Answer::Whole(200, "text/event-stream", stream));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[
                ("authorization", "Bearer sk-mallory"),
                OPENAI[1],
                ("x-perpetuity-conversation", "second"),
                ("x-perpetuity-user", "sk-alice"),
            ],
            &again,
        )
        .await;
    body_of(response).await;
    let leaked = h.received().pop().unwrap();
    assert!(
        !leaked.text().contains("4172"),
        "another credential sees nothing: {}",
        leaked.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_stream_is_terminated_and_its_text_captured() {
    let Some(stream) = fixture("anthropic-messages/ant-py_text_basic.sse") else {
        return;
    };
    assert!(
        !stream.ends_with(b"\n\n"),
        "the recording ends without its blank line"
    );
    let h = Harness::start(|_| {}).await;
    h.answer(Answer::Whole(200, "text/event-stream", stream.clone()));
    let body = json!({
        "model": "claude-haiku-4-5",
        "max_tokens": 64,
        "stream": true,
        "system": [{"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "Say hello."}]
    });
    let response = h
        .send(
            "POST",
            "/v1/messages?beta=true",
            &[
                ("x-api-key", "ak-bob"),
                ("anthropic-version", "2023-06-01"),
                ("content-type", "application/json"),
            ],
            body.to_string().as_bytes(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut expected = stream.clone();
    expected.extend_from_slice(b"\n\n");
    assert_eq!(body_of(response).await, expected);
    let sent = h.received().pop().unwrap();
    assert_eq!(sent.path, "/v1/messages?beta=true");
    assert_eq!(sent.headers["x-api-key"], "ak-bob");
    assert_eq!(sent.headers["anthropic-version"], "2023-06-01");
    assert_eq!(
        sent.json()["system"],
        body["system"],
        "the system blocks and their cache markers stay"
    );
    let rows = h.rows_of("ak-bob", 2);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].text, "Hello there!");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_client_before_the_upstream_finishes() {
    let h = Harness::start(|_| {}).await;
    let (go, wait) = oneshot::channel();
    let first =
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"early \"}}]}\n\n".to_vec();
    let rest = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"late\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n".to_vec();
    h.answer(Answer::Held(first.clone(), rest.clone(), wait));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_body(&[], "Tell me something."),
        )
        .await;
    let mut body = response.into_body();
    let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the first event arrives while the upstream still holds the rest")
        .unwrap()
        .unwrap();
    assert_eq!(frame.into_data().unwrap().to_vec(), first);
    go.send(()).unwrap();
    let rest_received = body.collect().await.unwrap().to_bytes().to_vec();
    assert_eq!(rest_received, rest);
    let rows = h.rows_of("sk-alice", 2);
    assert_eq!(rows[1].text, "early late");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switches_turn_recall_and_capture_off_and_probe_writes_nothing() {
    let Some(stream) = fixture("openai-chat/oai-py_text_usage.sse") else {
        return;
    };
    let h = Harness::start(|_| {}).await;
    let body = chat_body(&[("assistant", "resent")], "Untouched please.");

    h.answer(Answer::Whole(200, "text/event-stream", stream.clone()));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[OPENAI[0], OPENAI[1], ("x-perpetuity-recall", "off")],
            &body,
        )
        .await;
    assert_eq!(header(&response, "x-perpetuity-memory"), "off");
    assert_eq!(
        header(&response, "x-perpetuity-captured"),
        "question",
        "the question captured beside the forward is acknowledged"
    );
    body_of(response).await;
    assert_eq!(
        h.received().pop().unwrap().body,
        body,
        "recall off forwards the body byte for byte"
    );
    let rows = h.rows_of("sk-alice", 2);
    assert_eq!(rows.len(), 2, "recall off still captures");

    let before = h.state.engine.generation().memory.store.next_row();
    for switch in [
        ("x-perpetuity-probe", "on"),
        ("x-perpetuity-capture", "off"),
    ] {
        h.answer(Answer::Whole(200, "text/event-stream", stream.clone()));
        let response = h
            .send(
                "POST",
                "/v1/chat/completions",
                &[OPENAI[0], OPENAI[1], switch],
                &chat_body(&[], "A probe question?"),
            )
            .await;
        assert_eq!(header(&response, "x-perpetuity-memory"), "ok");
        body_of(response).await;
        let sent = h.received().pop().unwrap();
        let messages = sent.json()["messages"].as_array().unwrap().clone();
        assert!(
            messages.last().unwrap()["content"]
                .as_str()
                .unwrap()
                .ends_with("A probe question?")
        );
        assert!(
            sent.text().contains("Untouched please."),
            "the probe's frame holds the memory"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        h.state.engine.generation().memory.store.next_row(),
        before,
        "probe and capture-off store nothing"
    );
    let alice = UserId::from_key(&h.state.secret.user_key("sk-alice", None));
    assert!(
        h.state
            .engine
            .generation()
            .memory
            .store
            .row(alice, RowId(before.0))
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_errors_in_the_callers_shape_and_upstream_errors_pass_through() {
    let h = Harness::start(|config| config.body_limit = 4_096).await;

    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[OPENAI[1]],
            &chat_body(&[], "hi"),
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let error: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert_eq!(error["error"]["type"], "authentication_error");

    let anthropic = [("x-api-key", "ak-1"), ("anthropic-version", "2023-06-01")];
    let response = h
        .send("POST", "/v1/messages", &anthropic, b"{not json")
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );

    let response = h
        .send(
            "POST",
            "/v1/messages",
            &[("x-api-key", "ak-1")],
            br#"{"model":"claude-haiku-4-5","max_tokens":5,"messages":[]}"#,
        )
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(
        String::from_utf8(body_of(response).await)
            .unwrap()
            .contains("anthropic-version")
    );

    let huge = chat_body(&[], &"x".repeat(10_000));
    let response = h.send("POST", "/v1/chat/completions", &OPENAI, &huge).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);

    let Some(limited) = fixture("openai-chat/vercel_error_400_unsupported_parameter.json") else {
        return;
    };
    h.answer(Answer::Whole(429, "application/json", limited.clone()));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_body(&[], "hi"),
        )
        .await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        body_of(response).await,
        limited,
        "the upstream's error reaches the client unchanged"
    );
    assert!(
        h.received()
            .iter()
            .all(|r| r.path == "/v1/chat/completions")
    );
    assert_eq!(
        h.received().len(),
        1,
        "refused requests never reach the upstream"
    );

    h.answer(Answer::Whole(
        200,
        "application/json",
        br#"{"object":"list","data":[]}"#.to_vec(),
    ));
    let response = h.send("GET", "/v1/models", &[OPENAI[0]], b"").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body_of(response).await, br#"{"object":"list","data":[]}"#);
    assert_eq!(h.received().last().unwrap().path, "/v1/models");
    let response = h.send("GET", "/v1/models", &[], b"").await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_stops_the_relay_and_the_partial_reply_is_kept() {
    let h = Harness::start(|config| config.max_concurrent = 1).await;
    let (_go, wait) = oneshot::channel::<()>();
    let first =
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half an answer\"}}]}\n\n"
            .to_vec();
    h.answer(Answer::Held(first.clone(), b"never sent".to_vec(), wait));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_body(&[], "Start a long answer."),
        )
        .await;
    let mut body = response.into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap().to_vec(), first);

    // The stream holds the only slot: another chat request is refused in its own shape.
    let busy = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_body(&[], "Me too?"),
        )
        .await;
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
    let error: Value = serde_json::from_slice(&body_of(busy).await).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit of 1")
    );
    // So is a request passed through, which would otherwise buffer a body of its own.
    let busy = h.send("GET", "/v1/models", &[OPENAI[0]], b"").await;
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);

    drop(body);
    let rows = h.rows_of("sk-alice", 2);
    assert_eq!(rows.len(), 2, "the question and the partial reply");
    assert!(
        rows[1].text.starts_with("half an answer\n[reply truncated"),
        "{}",
        rows[1].text
    );

    // The slot is free again once the relay has stopped.
    let started = std::time::Instant::now();
    loop {
        h.answer(Answer::Whole(
            200,
            "application/json",
            br#"{"choices":[{"message":{"content":"ok"}}]}"#.to_vec(),
        ));
        let response = h
            .send(
                "POST",
                "/v1/chat/completions",
                &OPENAI,
                &chat_body(&[], "Free now?"),
            )
            .await;
        if response.status() == StatusCode::OK {
            break;
        }
        h.script_pop();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the slot was never released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics =
        String::from_utf8(body_of(h.send("GET", "/metrics", &[], b"").await).await).unwrap();
    for line in [
        "perpetuity_requests_total{route=\"openai_chat\"} 3",
        "perpetuity_refused_total 2",
        "perpetuity_replies_truncated_total 1",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    assert!(metrics.contains("perpetuity_memory_ms{quantile=\"0.99\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_need_the_token_and_purge_forgets_a_user() {
    let Some(stream) = fixture("openai-chat/oai-py_text_usage.sse") else {
        return;
    };
    let closed = Harness::start(|_| {}).await;
    let response = closed.send("GET", "/admin/stats", &[], b"").await;
    assert_eq!(
        response.status(),
        StatusCode::NOT_FOUND,
        "no token configured: disabled"
    );

    let h = Harness::start(|config| config.admin_token = Some("let-me-in".into())).await;
    for headers in [
        &[][..],
        &[("authorization", "Bearer wrong")][..],
        &[("authorization", "Bearer sk-alice")][..],
    ] {
        let response = h.send("GET", "/admin/stats", headers, b"").await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    h.answer(Answer::Whole(200, "text/event-stream", stream.clone()));
    let body = chat_body(&[], "My passport number is P-99871.");
    body_of(h.send("POST", "/v1/chat/completions", &OPENAI, &body).await).await;
    assert_eq!(h.rows_of("sk-alice", 2).len(), 2);

    let admin = [("x-perpetuity-admin-token", "let-me-in")];
    let stats: Value =
        serde_json::from_slice(&body_of(h.send("GET", "/admin/stats", &admin, b"").await).await)
            .unwrap();
    assert_eq!(
        stats["next_row"],
        h.state.engine.generation().memory.store.next_row().0
    );
    assert_eq!(stats["dictionary"], DEFAULT_VERSION);
    let response = h.send("GET", "/admin/integrity", &admin, b"").await;
    assert_eq!(response.status(), StatusCode::OK);
    let report: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert_eq!(report["violations"], json!([]), "{report}");

    let user = h.state.secret.user_key("sk-alice", None);
    let response = h
        .send("POST", &format!("/admin/purge?user={user}"), &admin, b"")
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let purged: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert_eq!(purged["rows_removed"], 2);
    assert!(h.rows_of("sk-alice", 0).is_empty());
    let response = h.send("GET", "/admin/integrity", &admin, b"").await;
    let status = response.status();
    let report = String::from_utf8_lossy(&body_of(response).await).into_owned();
    assert_eq!(status, StatusCode::OK, "clean after the purge: {report}");

    h.answer(Answer::Whole(200, "text/event-stream", stream));
    body_of(
        h.send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat_body(&[], "What is my passport number?"),
        )
        .await,
    )
    .await;
    assert!(
        !h.received().last().unwrap().text().contains("P-99871"),
        "the purged memory is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_stream_passes_through_and_a_chained_response_keeps_its_input() {
    let Some(lines) = fixture("openai-responses/vercel_text_two_messages.jsonl") else {
        return;
    };
    let stream = jsonl_as_sse(&lines);
    let h = Harness::start(|_| {}).await;
    h.answer(Answer::Whole(200, "text/event-stream", stream.clone()));
    let body = json!({
        "model": "gpt-5.3-codex",
        "stream": true,
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "RESENT-HISTORY"},
            {"role": "user", "content": [{"type": "input_text", "text": "Suggest names for an AI."}]}
        ]
    });
    let response = h
        .send(
            "POST",
            "/v1/responses",
            &OPENAI,
            body.to_string().as_bytes(),
        )
        .await;
    assert_eq!(header(&response, "x-perpetuity-memory"), "ok");
    assert_eq!(body_of(response).await, stream);
    let sent = h.received().pop().unwrap();
    assert_eq!(sent.path, "/v1/responses");
    let upstream = sent.json();
    assert_eq!(upstream["instructions"], "Be brief.");
    assert_eq!(
        upstream["input"][0],
        json!({"role": "user", "content": "RESENT-HISTORY"}),
        "history the memory never captured arrives as sent"
    );
    assert_eq!(sent.text().matches("RESENT-HISTORY").count(), 1);
    let last = upstream["input"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        last["content"].as_array().unwrap().len(),
        1,
        "the live turn keeps its shape: {last}"
    );
    assert_eq!(last["content"][0]["type"], "input_text");
    assert!(
        last["content"][0]["text"]
            .as_str()
            .unwrap()
            .ends_with("Suggest names for an AI.")
    );
    let rows = h.rows_of("sk-alice", 2);
    assert_eq!(rows[0].text, "Suggest names for an AI.");
    assert_eq!(rows[1].role, Role::Assistant);
    assert!(
        rows[1].text.starts_with("Got it\n\nHere are a few"),
        "{}",
        rows[1].text
    );

    // With previous_response_id the provider holds the history: forwarded as it came.
    h.answer(Answer::Whole(200, "text/event-stream", stream));
    let chained = json!({"model": "gpt-5.3-codex", "stream": true, "input": "More?", "previous_response_id": "resp_1"});
    let response = h
        .send(
            "POST",
            "/v1/responses",
            &OPENAI,
            chained.to_string().as_bytes(),
        )
        .await;
    assert_eq!(header(&response, "x-perpetuity-memory"), "off");
    body_of(response).await;
    assert_eq!(h.received().pop().unwrap().json(), chained);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_stream_passes_through_and_its_text_is_captured() {
    let Some(lines) = fixture("gemini/vercel_text.jsonl") else {
        return;
    };
    let stream = gemini_jsonl_as_sse(&lines);
    let text = String::from_utf8(lines).unwrap();
    let expected: String = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["candidates"][0]["content"]["parts"][0]
                ["text"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    let h = Harness::start(|_| {}).await;
    h.answer(Answer::Whole(200, "text/event-stream", stream.clone()));
    let body = json!({
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "RESENT-HISTORY"}]},
            {"role": "model", "parts": [{"text": "ok"}]},
            {"role": "user", "parts": [{"text": "How many r's are in strawberry?"}]}
        ]
    });
    let path = "/v1beta/models/gemini-3-pro-preview:streamGenerateContent?alt=sse";
    let response = h
        .send(
            "POST",
            path,
            &[("x-goog-api-key", "g-carol")],
            body.to_string().as_bytes(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "x-perpetuity-memory"), "ok");
    assert_eq!(
        body_of(response).await,
        stream,
        "CRLF events pass unchanged"
    );
    let sent = h.received().pop().unwrap();
    assert_eq!(sent.path, path);
    assert_eq!(sent.headers["x-goog-api-key"], "g-carol");
    let upstream = sent.json();
    assert_eq!(upstream["systemInstruction"], body["systemInstruction"]);
    assert_eq!(
        upstream["contents"].as_array().unwrap()[..2],
        body["contents"].as_array().unwrap()[..2],
        "history the memory never captured arrives as sent"
    );
    assert_eq!(sent.text().matches("RESENT-HISTORY").count(), 1);
    let last = upstream["contents"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    assert!(
        last["parts"][0]["text"]
            .as_str()
            .unwrap()
            .ends_with("How many r's are in strawberry?")
    );
    let rows = h.rows_of("g-carol", 2);
    assert_eq!(rows[1].text, expected);
    assert_eq!(rows[1].name.as_deref(), Some("gemini-3-pro-preview"));

    // The key may come in the query instead, and the stable version's path (`/v1/`, which
    // google-genai calls by default) is the same pipeline; without a key, the error is Gemini's.
    let response = h
        .send(
            "POST",
            "/v1beta/models/gemini-3-pro-preview:generateContent",
            &[],
            body.to_string().as_bytes(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let error: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert_eq!(error["error"]["status"], "UNAUTHENTICATED");
    let Some(whole) = fixture("gemini/vercel_text.response.json") else {
        return;
    };
    h.answer(Answer::Whole(200, "application/json", whole.clone()));
    let response = h
        .send(
            "POST",
            "/v1/models/gemini-3-pro-preview:generateContent?key=g-carol",
            &[],
            body.to_string().as_bytes(),
        )
        .await;
    assert_eq!(body_of(response).await, whole);
    // The same question at the same place of the conversation within two minutes is a retry:
    // stored once; its reply is stored beside the first.
    let rows = h.rows_of("g-carol", 3);
    assert_eq!(rows.len(), 3, "same credential, same memory: {rows:?}");
    assert_eq!(rows[2].role, Role::Assistant);
}

/// Exclusions: a row a user excluded stays stored but leaves its recall (frame and memory
/// tools), until it is included again; another credential cannot touch it; bad requests get
/// errors in the caller's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_excluded_row_stays_stored_and_leaves_recall_until_included_again() {
    /// Ask `ASK` as alice; the body the upstream received.
    async fn asked(h: &Harness) -> String {
        h.answer(chat_reply("Let me look."));
        body_of(
            h.send("POST", "/v1/chat/completions", &OPENAI, &chat_request(ASK))
                .await,
        )
        .await;
        h.received().pop().unwrap().text()
    }
    let h = Harness::start(|_| {}).await;
    const LOCKER: &str = "LOCKER5521";
    const BIKE: &str = "BIKE7730";
    const ASK: &str = "What are my locker code and my bike lock code?";
    for said in [
        format!("Remember: my locker code is {LOCKER}."),
        format!("Remember: my bike lock code is {BIKE}."),
    ] {
        h.answer(chat_reply("Noted."));
        body_of(
            h.send(
                "POST",
                "/v1/chat/completions",
                &OPENAI,
                &chat_request(&said),
            )
            .await,
        )
        .await;
    }
    let sent = asked(&h).await;
    assert!(sent.contains(LOCKER) && sent.contains(BIKE), "{sent}");

    let locker = h
        .rows_of("sk-alice", 4)
        .into_iter()
        .find(|r| r.text.contains(LOCKER))
        .unwrap()
        .id;
    let change = |body: Value, headers: &'static [(&'static str, &'static str)]| {
        let h = &h;
        async move {
            let response = h
                .send(
                    "POST",
                    "/perpetuity/exclusions",
                    headers,
                    body.to_string().as_bytes(),
                )
                .await;
            let status = response.status();
            let body: Value = serde_json::from_slice(&body_of(response).await).unwrap();
            (status, body)
        }
    };
    const BOB: [(&str, &str); 1] = [("authorization", "Bearer sk-bob")];
    let (status, body) = change(json!({"rows": [locker.0]}), &BOB).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "bob's credential has not been accepted by the provider yet: {body}"
    );
    h.answer(chat_reply("Hello, Bob."));
    body_of(
        h.send(
            "POST",
            "/v1/chat/completions",
            &BOB,
            &chat_request("Hello, I am Bob."),
        )
        .await,
    )
    .await;
    let (status, body) = change(json!({"rows": [locker.0]}), &BOB).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"changed": [], "excluded": []}),
        "not bob's row"
    );
    let (status, body) = change(json!({"rows": [locker.0]}), &OPENAI).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"changed": [locker.0], "excluded": [locker.0]}));

    let sent = asked(&h).await;
    assert!(
        !sent.contains(LOCKER),
        "the excluded row was recalled: {sent}"
    );
    assert!(sent.contains(BIKE), "{sent}");
    assert!(
        h.rows_of("sk-alice", 6).iter().any(|r| r.id == locker),
        "an excluded row stays stored"
    );
    {
        let generation = h.state.engine.generation();
        let memory = &generation.memory;
        let arena = generation.arena.read();
        let user = UserId::from_key(&h.state.secret.user_key("sk-alice", None));
        let outcome =
            perpetuity::memory_tools::TurnState::new(user, &[user], None, Vec::new(), &[])
                .run(
                    memory,
                    &arena,
                    &h.state.engine.kernels,
                    &perpetuity::memory_tools::Call::Search {
                        query: "locker code".into(),
                        limit: 10,
                    },
                )
                .unwrap();
        assert!(!outcome.rows.is_empty() && !outcome.rows.contains(&locker));
    }

    let (status, body) = change(json!({"rows": [locker.0], "excluded": false}), &OPENAI).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"changed": [locker.0], "excluded": []}));
    let sent = asked(&h).await;
    assert!(sent.contains(LOCKER), "included again: {sent}");

    let (status, body) = change(json!({"rows": "all"}), &OPENAI).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let (status, body) = change(json!({"rows": [1]}), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["type"], "authentication_error");
}
