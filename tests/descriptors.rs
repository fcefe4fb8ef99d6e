//! `perpetuity serve` run out of file descriptors (`prlimit --nofile=128`) by a crowd of idle
//! connections keeps serving: the failed accepts are logged and retried, and once the crowd
//! goes `/healthz` answers and a chat still recalls. Its own test binary because it limits the
//! server's process.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::server::Server;
use common::upstream::{Answer, Upstream, chat_reply, chat_request};

const DESCRIPTORS: u64 = 128;
const CROWD: usize = 200;
const AUTH: (&str, &str) = ("authorization", "Bearer sk-descriptors");

#[test]
fn serve_out_of_descriptors_keeps_serving_once_the_crowd_goes() {
    if std::process::Command::new("prlimit")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIP: prlimit (util-linux) is not installed");
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");
    let nofile = format!("--nofile={DESCRIPTORS}");
    let mut server = Server::spawn_under(&["prlimit", &nofile, "--"], |command| {
        let log = std::fs::File::create(&log).unwrap();
        command
            .args(["--data", data.to_str().unwrap()])
            .args(["--upstream", &format!("openai={}", upstream.url())])
            .env("RUST_LOG", "info")
            .stderr(log);
    });
    server.wait_ready();

    upstream.answer(chat_reply("Noted."));
    let stored = server
        .request(
            "POST",
            "/v1/chat/completions",
            &[AUTH],
            &chat_request("The boat is moored at pier Quillon nine."),
        )
        .unwrap();
    assert_eq!(stored.status, 200, "{}", stored.text());

    // More connections than the process has descriptors: the kernel queues them, the server
    // cannot take them all.
    let crowd: Vec<TcpStream> = (0..CROWD)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port)).unwrap())
        .collect();
    let started = Instant::now();
    let log_says = || std::fs::read_to_string(&log).unwrap_or_default();
    while !log_says().contains("accepting a connection failed") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the server never ran out of descriptors: {}",
            log_says()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(server.running(), "serve stopped: {}", log_says());
    drop(crowd);

    let started = Instant::now();
    let health = loop {
        match server.request("GET", "/healthz", &[], b"") {
            Ok(answer) => break answer,
            Err(err) => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "no answer once the crowd left: {err}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert_eq!(health.status, 200, "{}", health.text());
    assert!(server.running());

    upstream.answer(Answer::Whole(
        200,
        "application/json",
        br#"{"choices":[{"message":{"content":"Pier nine."}}]}"#.to_vec(),
    ));
    let recalled = server
        .request(
            "POST",
            "/v1/chat/completions",
            &[AUTH],
            &chat_request("Where is the boat moored?"),
        )
        .unwrap();
    assert_eq!(recalled.status, 200, "{}", recalled.text());
    assert_eq!(recalled.header("x-perpetuity-memory"), Some("ok"));
    let forwarded = upstream.received().pop().unwrap().text();
    assert!(
        forwarded.contains("pier Quillon nine"),
        "the stored turn is recalled: {forwarded}"
    );
}
