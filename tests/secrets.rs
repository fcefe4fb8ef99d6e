//! No secret is ever written down: an API-key canary sent through every route and error path of
//! `perpetuity serve` (a memory tool round the upstream refuses with an error echoing the
//! request among them, whose user words are logged nowhere either), logging at trace level,
//! appears in no log line, no file of the data directory (stored uncompressed, so stored text
//! is found by a byte search) and no metrics output. Its own test binary because it starts and
//! kills the server.

mod common;

use std::path::Path;

use common::server::Server;
use common::upstream::{Answer, Upstream};

/// The canary key, and the part of it that must never appear even cut short.
const KEY: &str = "sk-canary-live-5f3a9e1b7c2d4e60a8b9";
const KEY_CORE: &str = "5f3a9e1b7c2d4e60";
/// A word every question carries, to show the grep does find what is stored.
const STORED: &str = "Zanzibarquill";
const ADMIN_TOKEN: &str = "secrets-test-admin";
/// A word only the refused tool round's question carries, and the upstream's error echoes.
const ECHOED: &str = "Quellmorrow";

fn start(data: &Path, log: &Path, upstream: &str) -> Server {
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let (server, health) = Server::start(|command| {
        command
            .args(["--data", data.to_str().unwrap(), "--uncompressed"])
            .args(["--admin-token", ADMIN_TOKEN])
            .args(["--upstream", &format!("openai={upstream}")])
            .args(["--upstream", &format!("anthropic={upstream}")])
            .args(["--upstream", &format!("gemini={upstream}")])
            .env("RUST_LOG", "trace")
            .stderr(log);
    });
    assert_eq!(health.status, 200);
    server
}

/// One call: method, path, headers, body, and the answer the scripted upstream gives (`None`:
/// refused before it is forwarded, or the upstream is down).
type Call = (
    &'static str,
    String,
    Vec<(&'static str, String)>,
    String,
    Option<Answer>,
);

fn json_answer(status: u16, body: serde_json::Value) -> Option<Answer> {
    Some(Answer::Whole(
        status,
        "application/json",
        body.to_string().into_bytes(),
    ))
}

fn sse_answer(events: &str) -> Option<Answer> {
    Some(Answer::Whole(
        200,
        "text/event-stream",
        events.as_bytes().to_vec(),
    ))
}

/// Every route and error path, each carrying the key the way its provider takes it.
fn calls(upstream_up: bool) -> Vec<Call> {
    let bearer = || vec![("authorization", format!("Bearer {KEY}"))];
    let anthropic = || {
        vec![
            ("x-api-key", KEY.to_owned()),
            ("anthropic-version", "2023-06-01".to_owned()),
        ]
    };
    let google = || vec![("x-goog-api-key", KEY.to_owned())];
    let chat = |stream: bool| {
        serde_json::json!({"model": "gpt-4o", "stream": stream,
            "messages": [{"role": "user", "content": format!("{STORED} asks about the weather.")}]})
        .to_string()
    };
    let messages = serde_json::json!({"model": "claude-haiku-4-5", "max_tokens": 10,
        "messages": [{"role": "user", "content": format!("{STORED} asks about trains.")}]})
    .to_string();
    let gemini = serde_json::json!({"contents": [{"role": "user",
        "parts": [{"text": format!("{STORED} asks about rivers.")}]}]})
    .to_string();
    let responses =
        serde_json::json!({"model": "gpt-4o", "input": format!("{STORED} asks about maps.")})
            .to_string();
    let up = |answer: Option<Answer>| answer.filter(|_| upstream_up);
    let chat_reply = serde_json::json!({"choices": [{"message": {"content": "Sunny."}}]});
    let calls: Vec<Call> = vec![
        (
            "POST",
            "/v1/chat/completions".into(),
            bearer(),
            chat(false),
            up(json_answer(200, chat_reply.clone())),
        ),
        (
            "POST",
            "/v1/chat/completions".into(),
            bearer(),
            chat(true),
            up(sse_answer(
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Rain.\"}}]}\n\ndata: [DONE]\n\n",
            )),
        ),
        (
            "POST",
            "/v1/responses".into(),
            bearer(),
            responses,
            up(json_answer(
                200,
                serde_json::json!({"output": [{"type": "message",
                    "content": [{"type": "output_text", "text": "North."}]}]}),
            )),
        ),
        (
            "POST",
            "/v1/messages?beta=true".into(),
            anthropic(),
            messages.clone(),
            up(json_answer(
                200,
                serde_json::json!({"content": [{"type": "text", "text": "At nine."}]}),
            )),
        ),
        (
            "POST",
            "/v1/messages".into(),
            vec![
                ("authorization", format!("Bearer {KEY}")),
                ("anthropic-version", "2023-06-01".to_owned()),
            ],
            messages.clone(),
            up(json_answer(
                200,
                serde_json::json!({"content": [{"type": "text", "text": "At ten."}]}),
            )),
        ),
        (
            "POST",
            "/v1beta/models/gemini-2.5-flash:generateContent".into(),
            google(),
            gemini.clone(),
            up(json_answer(
                200,
                serde_json::json!({"candidates": [{"content": {"parts": [{"text": "Wide."}]}}]}),
            )),
        ),
        (
            "POST",
            format!("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse&key={KEY}"),
            vec![],
            gemini.clone(),
            up(sse_answer(
                "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Deep.\"}]}}]}\n\n",
            )),
        ),
        // Passed through.
        (
            "GET",
            "/v1/models".into(),
            bearer(),
            String::new(),
            up(json_answer(200, serde_json::json!({"data": []}))),
        ),
        (
            "GET",
            format!("/v1beta/models?key={KEY}"),
            vec![],
            String::new(),
            up(json_answer(200, serde_json::json!({"models": []}))),
        ),
        // The upstream refuses the key, naming part of it as OpenAI does.
        (
            "POST",
            "/v1/chat/completions".into(),
            bearer(),
            chat(false),
            up(json_answer(
                401,
                serde_json::json!({"error": {"message": "Incorrect API key provided: sk-canar***b9",
                    "type": "invalid_request_error"}}),
            )),
        ),
        // Refused by the proxy: bad JSON, wrong types, a missing header, admin calls.
        (
            "POST",
            "/v1/chat/completions".into(),
            bearer(),
            "{not json".into(),
            None,
        ),
        (
            "POST",
            "/v1/chat/completions".into(),
            bearer(),
            r#"{"model": 7, "messages": "no"}"#.into(),
            None,
        ),
        (
            "POST",
            "/v1/messages".into(),
            vec![("x-api-key", KEY.to_owned())],
            messages,
            None,
        ),
        ("GET", "/admin/stats".into(), bearer(), String::new(), None),
        (
            "POST",
            "/admin/purge?user=x".into(),
            vec![("x-perpetuity-admin-token", KEY.to_owned())],
            String::new(),
            None,
        ),
        ("GET", "/metrics".into(), bearer(), String::new(), None),
        ("GET", "/healthz".into(), google(), String::new(), None),
        (
            "POST",
            "/perpetuity/exclusions".into(),
            bearer(),
            r#"{"rows": [0, 1]}"#.into(),
            None,
        ),
        (
            "POST",
            "/perpetuity/exclusions".into(),
            google(),
            r#"{"rows": "all"}"#.into(),
            None,
        ),
    ];
    calls
}

/// A chat request, whole and then streamed, whose first reply calls the memory search and
/// whose next round the upstream refuses with an error that echoes the request: the key and
/// the user's words. Returns the statuses the client got.
fn refused_tool_rounds(server: &Server, upstream: &Upstream) -> Vec<u16> {
    let search = r#"{"query": "weather"}"#;
    let echo = serde_json::json!({"error": {"type": "invalid_request_error",
        "message": format!("rejected request with key {KEY}: {ECHOED} asks about the tides.")}});
    let called = serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion",
        "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
            "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "memory_search", "arguments": search}}]}}]});
    let called_streamed = format!(
        "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        serde_json::json!({"choices": [{"index": 0, "delta": {"role": "assistant",
            "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "memory_search", "arguments": search}}]}}]}),
        serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
    );
    [false, true]
        .into_iter()
        .map(|stream| {
            let first = if stream {
                sse_answer(&called_streamed)
            } else {
                json_answer(200, called.clone())
            };
            for answer in [first, json_answer(400, echo.clone())] {
                upstream.answer(answer.unwrap());
            }
            let body = serde_json::json!({"model": "gpt-4o", "stream": stream,
                "messages": [{"role": "user", "content": format!("{ECHOED} asks about the tides.")}]});
            server
                .request(
                    "POST",
                    "/v1/chat/completions",
                    &[("authorization", &format!("Bearer {KEY}"))],
                    body.to_string().as_bytes(),
                )
                .unwrap()
                .status
        })
        .collect()
}

fn send_all(server: &Server, upstream: &Upstream, calls: Vec<Call>) -> Vec<u16> {
    calls
        .into_iter()
        .map(|(method, path, headers, body, answer)| {
            if let Some(answer) = answer {
                upstream.answer(answer);
            }
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let answer = server
                .request(method, &path, &headers, body.as_bytes())
                .unwrap();
            answer.status
        })
        .collect()
}

#[test]
fn an_api_key_is_in_no_log_line_no_data_file_and_no_metric() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");

    let mut server = start(&data, &log, &upstream.url());
    let statuses = send_all(&server, &upstream, calls(true));
    assert!(statuses.contains(&200) && statuses.contains(&400) && statuses.contains(&401));
    assert_eq!(upstream.received().len(), 10, "the forwarded calls");
    assert_eq!(
        refused_tool_rounds(&server, &upstream),
        [400, 200],
        "the refused round's own status whole; streamed, an error event after the 200"
    );
    let rounds = &upstream.received()[10..];
    assert_eq!(
        rounds.len(),
        4,
        "each request's first round and its refused second"
    );
    assert!(rounds[1].text().contains("memory_search") && rounds[1].text().contains(ECHOED));
    let metrics = server.request("GET", "/metrics", &[], b"").unwrap().text();
    server.kill();

    // The same calls with the upstream gone: every forwarded one fails in the proxy.
    let dead = format!("http://127.0.0.1:{}", common::server::free_port());
    let mut server = start(&data, &log, &dead);
    let statuses = send_all(&server, &upstream, calls(false));
    assert!(statuses.contains(&502), "{statuses:?}");
    let metrics_after = server.request("GET", "/metrics", &[], b"").unwrap().text();
    server.kill();
    let integrity = std::process::Command::new(env!("CARGO_BIN_EXE_perpetuity"))
        .args(["integrity", "--data", data.to_str().unwrap()])
        .env("RUST_LOG", "trace")
        .output()
        .unwrap();
    assert!(integrity.status.success());

    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.lines().filter(|l| l.contains("TRACE")).count() > 10 && log_text.contains("DEBUG"),
        "the server logged at trace level"
    );
    assert!(
        !common::files_containing(&data, STORED.as_bytes()).is_empty(),
        "the data directory's bytes show what is stored"
    );
    assert!(
        log_text.contains("the upstream refused a memory tool round"),
        "the refused rounds were logged"
    );
    let echoed: Vec<&str> = log_text.lines().filter(|l| l.contains(ECHOED)).collect();
    assert!(echoed.is_empty(), "the user's words logged: {echoed:#?}");
    for needle in [KEY, KEY_CORE] {
        let in_log: Vec<&str> = log_text.lines().filter(|l| l.contains(needle)).collect();
        assert!(in_log.is_empty(), "{needle} logged: {in_log:#?}");
        let in_data = common::files_containing(&data, needle.as_bytes());
        assert!(in_data.is_empty(), "{needle} in {in_data:?}");
        for (output, text) in [
            ("metrics", &metrics),
            ("metrics", &metrics_after),
            (
                "integrity",
                &String::from_utf8_lossy(&integrity.stdout).into_owned(),
            ),
            (
                "integrity",
                &String::from_utf8_lossy(&integrity.stderr).into_owned(),
            ),
        ] {
            assert!(!text.contains(needle), "{needle} in the {output} output");
        }
    }
    println!(
        "{} log lines at trace level: the key in none, in no data file, in no metrics output",
        log_text.lines().count()
    );
}
