//! Hostile input over real HTTP on loopback: malformed JSON, wrong types, huge bodies, deep
//! nesting, invalid UTF-8, slowloris headers and bodies, idle connections, and an upstream that
//! hangs or drops mid-reply. Each gets its documented error or timeout, the process's memory
//! and open connections stay bounded, and nothing stored is lost.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde_json::{Value, json};

use common::upstream::{self, Answer, Harness, body_of};

const LIMIT: usize = 1 << 20;
const TIMEOUT: Duration = Duration::from_millis(800);
/// How much later than its timeout a closed connection may be noticed on a loaded machine.
const SLACK: Duration = Duration::from_secs(5);
const OPENAI: [(&str, &str); 1] = [("authorization", "Bearer sk-hostile")];

/// Held by the tests that measure the process's resident memory or move it by tens of MiB,
/// so that they run one at a time.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn harness(configure: impl FnOnce(&mut perpetuity::proxy::ProxyConfig)) -> Harness {
    Harness::start(|config| {
        config.body_limit = LIMIT;
        config.header_timeout = TIMEOUT;
        config.upstream_timeout = TIMEOUT;
        config.stream_idle_timeout = TIMEOUT;
        configure(config);
    })
    .await
}

fn chat(question: &str, stream: bool) -> Vec<u8> {
    json!({"model": "gpt-4o", "stream": stream,
        "messages": [{"role": "user", "content": question}]})
    .to_string()
    .into_bytes()
}

/// Resident memory of this process, from /proc.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// Wait until the server closes `stream` (EOF or reset); how long that took.
fn closed_after(stream: &mut TcpStream) -> Duration {
    let started = Instant::now();
    stream.set_read_timeout(Some(TIMEOUT + SLACK)).unwrap();
    let mut sink = Vec::new();
    let result = stream.read_to_end(&mut sink);
    assert!(
        !matches!(&result, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
            || e.kind() == std::io::ErrorKind::TimedOut),
        "the server kept the connection open past {:?}",
        TIMEOUT + SLACK
    );
    started.elapsed()
}

/// Store a few turns, returning the user's rows as they stand.
async fn seed(h: &Harness) -> Vec<perpetuity::store::Row> {
    for i in 0..3 {
        h.answer(Answer::Whole(
            200,
            "application/json",
            br#"{"choices":[{"message":{"content":"Noted."}}]}"#.to_vec(),
        ));
        let response = h
            .send(
                "POST",
                "/v1/chat/completions",
                &OPENAI,
                &chat(&format!("Seed fact {i}: the key is under the mat."), false),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        body_of(response).await;
    }
    h.rows_of("sk-hostile", 6)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_get_a_400_in_the_callers_shape_and_nothing_is_stored() {
    let h = harness(|_| {}).await;
    let seeded = seed(&h).await;
    let forwarded = h.received().len();
    let deep = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        (
            "malformed JSON",
            b"{\"model\": \"gpt-4o\", \"messages\": [".to_vec(),
        ),
        ("not an object", b"[1, 2, 3]".to_vec()),
        ("null", b"null".to_vec()),
        ("empty", Vec::new()),
        (
            "model of the wrong type",
            br#"{"model": 5, "messages": []}"#.to_vec(),
        ),
        (
            "messages of the wrong type",
            br#"{"model": "m", "messages": {"a": 1}}"#.to_vec(),
        ),
        (
            "a message that is a number",
            br#"{"model": "m", "messages": [7]}"#.to_vec(),
        ),
        (
            "a role of the wrong type",
            br#"{"model": "m", "messages": [{"role": 7, "content": "x"}]}"#.to_vec(),
        ),
        (
            "nested 100,000 deep",
            format!(r#"{{"model": "m", "messages": {}}}"#, deep(100_000)).into_bytes(),
        ),
        (
            "content nested 100,000 deep",
            format!(
                r#"{{"model": "m", "messages": [{{"role": "user", "content": {}}}]}}"#,
                deep(100_000)
            )
            .into_bytes(),
        ),
        (
            "invalid UTF-8 in a string",
            [
                &br#"{"model": "m", "messages": [{"role": "user", "content": "caf"#[..],
                &[0xff, 0xfe],
                &br#""}]}"#[..],
            ]
            .concat(),
        ),
    ];
    let anthropic = [
        ("x-api-key", "sk-hostile"),
        ("anthropic-version", "2023-06-01"),
    ];
    let gemini = [("x-goog-api-key", "sk-hostile")];
    for (case, body) in &bodies {
        for (path, headers, error_of) in [
            ("/v1/chat/completions", &OPENAI[..], "/error/message"),
            ("/v1/responses", &OPENAI[..], "/error/message"),
            ("/v1/messages", &anthropic[..], "/error/message"),
            (
                "/v1beta/models/gemini-2.5-flash:generateContent",
                &gemini[..],
                "/error/message",
            ),
        ] {
            let response = h.send("POST", path, headers, body).await;
            assert_eq!(
                response.status(),
                StatusCode::BAD_REQUEST,
                "{case} on {path}"
            );
            let error: Value = serde_json::from_slice(&body_of(response).await).unwrap();
            assert!(
                error.pointer(error_of).is_some_and(Value::is_string),
                "{case} on {path}: {error}"
            );
        }
    }
    assert_eq!(
        h.received().len(),
        forwarded,
        "nothing malformed is forwarded"
    );
    assert_eq!(h.rows_of("sk-hostile", 0), seeded, "nor stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_bodies_are_refused_and_memory_stays_bounded() {
    let _heavy = HEAVY.lock().await;
    let h = harness(|_| {}).await;
    let seeded = seed(&h).await;
    let huge = chat(&"x".repeat(4 * LIMIT), false);
    let before = rss_bytes();
    let mut read_413 = 0;
    for _ in 0..40 {
        // The proxy answers 413 as soon as the limit is passed and closes the connection; a
        // client still writing may see the reset before it reads the answer.
        let mut stream = TcpStream::connect(h.proxy).unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\n\
             Content-Length: {}\r\n\r\n",
            OPENAI[0].1,
            huge.len()
        );
        let mut writer = stream.try_clone().unwrap();
        let body = huge.clone();
        let writing = std::thread::spawn(move || {
            let _ = writer.write_all(head.as_bytes());
            let _ = writer.write_all(&body);
        });
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        writing.join().unwrap();
        if answer.starts_with(b"HTTP/1.1 413") {
            read_413 += 1;
        }
    }
    let grown = rss_bytes().saturating_sub(before);
    // On a connection of its own: the client's pooled ones sat idle past the header timeout.
    let port = h.proxy.port();
    let metrics = tokio::task::spawn_blocking(move || {
        common::server::request(port, "GET", "/metrics", &[], b"")
    })
    .await
    .unwrap()
    .unwrap()
    .text();
    assert!(
        metrics.contains("perpetuity_refused_total 40"),
        "every huge body was refused: {metrics}"
    );
    assert!(
        grown < 64 << 20,
        "40 refused bodies of {} MiB grew the process by {} MiB",
        huge.len() >> 20,
        grown >> 20
    );
    assert_eq!(h.rows_of("sk-hostile", 0), seeded);
    println!(
        "40 bodies of {} MiB refused ({read_413} clients read the 413 before the reset); \
         resident memory grew {} MiB",
        huge.len() >> 20,
        grown >> 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_clients_are_cut_off_at_the_timeout() {
    let h = harness(|_| {}).await;
    let seeded = seed(&h).await;
    let connect = || TcpStream::connect(h.proxy).unwrap();

    // Idle connections: never a byte.
    let mut idle: Vec<TcpStream> = (0..200).map(|_| connect()).collect();
    // Slowloris: headers that never end.
    let mut slow_headers = connect();
    slow_headers
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        .unwrap();
    // A body that never arrives in full.
    let mut slow_body = connect();
    slow_body
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-hostile\r\n\
              Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":",
        )
        .unwrap();
    // Invalid UTF-8 in the user header.
    let mut bad_header = connect();
    bad_header
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-hostile\r\n\
              Connection: close\r\nX-Perpetuity-User: \xff\xfe\r\nContent-Length: 63\r\n\r\n\
              {\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
        )
        .unwrap();
    let mut answer = String::new();
    bad_header.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("not UTF-8"), "{answer}");

    for stream in [&mut slow_headers, &mut slow_body] {
        let took = closed_after(stream);
        assert!(took <= TIMEOUT + SLACK, "{took:?}");
    }
    // Every idle connection is closed by the server (its end released), none left open.
    for stream in &mut idle {
        closed_after(stream);
    }

    // The slots the slow clients held are free: a request goes through.
    h.answer(Answer::Whole(
        200,
        "application/json",
        br#"{"choices":[{"message":{"content":"Still here."}}]}"#.to_vec(),
    ));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat("Are you there?", false),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    body_of(response).await;
    let rows = h.rows_of("sk-hostile", seeded.len() + 2);
    assert_eq!(
        &rows[..seeded.len()],
        &seeded[..],
        "nothing stored was lost"
    );
}

/// A raw upstream that writes `reply`, then holds the connection open for `hold` (or closes
/// it at once).
fn holding_upstream(reply: &'static [u8], hold: Duration) -> String {
    upstream::raw_upstream(move |mut stream| {
        let _ = stream.write_all(reply);
        std::thread::sleep(hold);
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_hangs_or_drops_gets_a_timeout_and_the_partial_reply_is_kept() {
    let cases: [(&str, &'static [u8], Duration, bool, StatusCode); 4] = [
        ("sends nothing", b"", Duration::from_secs(30), false, StatusCode::GATEWAY_TIMEOUT),
        (
            "stalls inside a whole body",
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"choices\"",
            Duration::from_secs(30),
            false,
            StatusCode::GATEWAY_TIMEOUT,
        ),
        (
            "stalls mid-stream",
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
              3c\r\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Half\"}}]}\n\n\r\n",
            Duration::from_secs(30),
            true,
            StatusCode::OK,
        ),
        (
            "drops mid-stream",
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
              3c\r\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Half\"}}]}\n\n\r\n",
            Duration::ZERO,
            true,
            StatusCode::OK,
        ),
    ];
    for (case, reply, hold, stream, status) in cases {
        let upstream = holding_upstream(reply, hold);
        let h = harness(|config| config.openai = upstream).await;
        let seeded = seed_through_anthropic(&h).await;
        // The credential the provider accepted before: its question is captured before it is
        // forwarded (a credential it never accepted keeps nothing an upstream does not answer
        // with a success: tests/writes.rs).
        vouch(&h, "sk-hostile").await;
        let started = Instant::now();
        let response = h
            .send(
                "POST",
                "/v1/chat/completions",
                &OPENAI,
                &chat(&format!("Case {case}: answer at length."), stream),
            )
            .await;
        let got = response.status();
        let body = String::from_utf8(body_of(response).await).unwrap();
        assert_eq!(got, status, "{case}: {body} after {:?}", started.elapsed());
        assert!(
            started.elapsed() < TIMEOUT + SLACK,
            "{case}: took {:?}",
            started.elapsed()
        );
        let rows = h.rows_of("sk-hostile", 3);
        assert!(
            rows.iter().any(|r| r.text.starts_with("Case ")),
            "{case}: the question is kept"
        );
        if stream {
            assert!(body.contains("Half"), "{case}: {body}");
            let reply = h.rows_of("sk-hostile", 4);
            assert!(
                reply
                    .iter()
                    .any(|r| r.text.starts_with("Half\n[reply truncated")),
                "{case}: the partial reply is kept, marked: {reply:?}"
            );
        } else {
            let error: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(error["error"]["type"], "api_error", "{case}: {error}");
        }
        let anthropic_rows = h.rows_of("ak-hostile", seeded.len());
        assert_eq!(anthropic_rows, seeded, "{case}: nothing stored was lost");
    }
}

/// `credential` says `text` on the Messages route (whose upstream is the scripted one, answering
/// `reply`): a success.
async fn messages_turn(h: &Harness, credential: &str, text: &str, reply: &str) {
    h.answer(Answer::Whole(
        200,
        "application/json",
        json!({"content": [{"type": "text", "text": reply}]})
            .to_string()
            .into_bytes(),
    ));
    let body = json!({"model": "claude-haiku-4-5", "max_tokens": 10,
        "messages": [{"role": "user", "content": text}]});
    let response = h
        .send(
            "POST",
            "/v1/messages",
            &[
                ("x-api-key", credential),
                ("anthropic-version", "2023-06-01"),
            ],
            body.to_string().as_bytes(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    body_of(response).await;
}

/// A success for `credential`, so the provider has vouched for it.
async fn vouch(h: &Harness, credential: &str) {
    messages_turn(h, credential, "Hello.", "Hello.").await;
}

/// Store a turn through the Anthropic route.
async fn seed_through_anthropic(h: &Harness) -> Vec<perpetuity::store::Row> {
    messages_turn(h, "ak-hostile", "The spare key is under the mat.", "Noted.").await;
    h.rows_of("ak-hostile", 2)
}

/// A question longer than a stored message can be (65,535 chunks of 256 tokens: here 17M
/// one-token words) gets a 413 in the caller's shape, with recall on and off (where a shorter
/// question is captured beside the forward), and it leaves the memory as ready as before: the
/// next question is stored and recalled, `/healthz` and `/metrics` answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_too_long_to_store_is_refused_and_the_memory_stays_ready() {
    let _heavy = HEAVY.lock().await;
    let h = harness(|config| config.body_limit = 64 << 20).await;
    let seeded = seed(&h).await;
    let words = " a".repeat(17_000_000);
    let question = chat(&format!("Count these:{words}"), false);
    for recall in ["on", "off"] {
        let response = h
            .send(
                "POST",
                "/v1/chat/completions",
                &[OPENAI[0], ("x-perpetuity-recall", recall)],
                &question,
            )
            .await;
        let status = response.status();
        let error: Value = serde_json::from_slice(&body_of(response).await).unwrap();
        assert_eq!(
            status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "recall {recall}: {error}"
        );
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("too long to store"),
            "{error}"
        );
        assert_eq!(
            h.received().len(),
            seeded.len() / 2,
            "recall {recall}: the refused question was not forwarded"
        );
    }

    h.answer(Answer::Whole(
        200,
        "application/json",
        br#"{"choices":[{"message":{"content":"Under the mat."}}]}"#.to_vec(),
    ));
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &OPENAI,
            &chat("Where is the key?", false),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        common::upstream::header(&response, "x-perpetuity-memory"),
        "ok"
    );
    body_of(response).await;
    assert!(
        h.received()
            .last()
            .unwrap()
            .text()
            .contains("the key is under the mat"),
        "the next question is recalled for"
    );
    let rows = h.rows_of("sk-hostile", seeded.len() + 2);
    assert_eq!(rows.len(), seeded.len() + 2, "the next turn is stored");
    for path in ["/healthz", "/metrics"] {
        let response = h.send("GET", path, &[], b"").await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
}

/// An upstream that streams 64 MiB with no blank line: the event is refused at the limit (the
/// stream ends with an error event in the caller's shape), in bounded time and memory, with
/// and without the memory tools' splice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_event_without_end_is_refused_at_the_limit_in_bounded_time_and_memory() {
    let _heavy = HEAVY.lock().await;
    let chunk: &'static [u8] = Box::leak(vec![b'x'; 64 << 10].into_boxed_slice());
    let upstream = upstream::endless_upstream(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\ndata: ",
        chunk,
        64 << 20,
    );
    let h = harness(|config| config.openai = upstream).await;
    let before = rss_bytes();
    for tools in ["on", "off"] {
        let started = Instant::now();
        let response = h
            .send(
                "POST",
                "/v1/chat/completions",
                &[OPENAI[0], ("x-perpetuity-tools", tools)],
                &chat(&format!("Tools {tools}: stream forever."), true),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        let body = body_of(response).await;
        let tail = String::from_utf8_lossy(&body[body.len().saturating_sub(400)..]).into_owned();
        assert!(
            tail.contains("longer than 1048576 bytes") && tail.contains("\"api_error\""),
            "tools {tools}: the stream ends with an error event: {tail}"
        );
        assert!(
            body.len() <= 2 * LIMIT + 4096,
            "tools {tools}: relayed {} bytes",
            body.len()
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "tools {tools}: took {:?}",
            started.elapsed()
        );
    }
    let grown = rss_bytes().saturating_sub(before);
    assert!(grown < 48 << 20, "resident memory grew by {grown} bytes");
}
