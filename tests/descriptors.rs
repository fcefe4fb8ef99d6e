//! `perpetuity serve` under a low descriptor limit (`prlimit --nofile=128`) and a crowd of
//! idle connections (the security review's M3): connections are capped below the limit with a
//! reserve for the store, so a purge's flush that runs while the crowd holds every connection
//! slot still gets its files, the server stays ready, and once the crowd goes `/healthz`
//! answers and a chat still recalls. Its own test binary because it limits the server's
//! process.

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::server::Server;
use common::upstream::{Answer, Upstream, chat_reply, chat_request};

const DESCRIPTORS: u64 = 128;
/// More connections than the process has descriptors for, and fewer than the listen queue
/// holds (beyond it a connect waits for the kernel's SYN retries).
const CROWD: usize = 120;
const AUTH: (&str, &str) = ("authorization", "Bearer sk-descriptors");
const SECOND: (&str, &str) = ("authorization", "Bearer sk-second");

#[test]
fn a_crowd_of_connections_leaves_the_store_its_descriptors() {
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
    upstream.answer(chat_reply("Noted."));
    let second = server
        .request(
            "POST",
            "/v1/chat/completions",
            &[SECOND],
            &chat_request("My second memory, to purge."),
        )
        .unwrap();
    assert_eq!(second.status, 200, "{}", second.text());
    let users = server
        .request("GET", "/perpetuity/api/users", &[SECOND], b"")
        .unwrap();
    let key = users.json()["users"][0]["user"]
        .as_str()
        .unwrap()
        .to_owned();

    // A purge (which flushes and compacts: new files) sent whole but for its last byte.
    let body = format!("{{\"confirm\": \"{key}\"}}");
    let head = format!(
        "POST /perpetuity/api/purge HTTP/1.1\r\nhost: 127.0.0.1\r\n{}: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        SECOND.0,
        SECOND.1,
        body.len()
    );
    let mut purge = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    purge
        .write_all(format!("{head}{}", &body[..body.len() - 1]).as_bytes())
        .unwrap();

    // More connections than the process has descriptors: the server serves as many as its cap
    // allows, the kernel queues the rest.
    let crowd: Vec<TcpStream> = (0..CROWD)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port)).unwrap())
        .collect();
    let started = Instant::now();
    let log_says = || std::fs::read_to_string(&log).unwrap_or_default();
    let full = |log: String| {
        log.contains("every connection slot is taken")
            || log.contains("accepting a connection failed")
    };
    while !full(log_says()) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the crowd never reached the connection cap: {}",
            log_says()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The purge's flush runs while the crowd holds every slot it can.
    purge.write_all(&body.as_bytes()[body.len() - 1..]).unwrap();
    let mut answer = String::new();
    purge
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    purge.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"rows_removed\":2"), "{answer}");
    assert!(server.running(), "serve stopped: {}", log_says());
    assert!(
        !log_says().contains("Too many open files"),
        "the store ran out of descriptors: {}",
        log_says()
    );
    drop(crowd);

    // Ready within 5 s of the descriptors' return, with no restart.
    let started = Instant::now();
    let health = loop {
        match server.request("GET", "/healthz", &[], b"") {
            Ok(answer) if answer.status == 200 => break answer,
            answered => {
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "not ready 5 s after the crowd left: {answered:?}"
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
