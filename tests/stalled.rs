//! Clients that stop reading, over real HTTP on loopback: 256 clients with a 1 KiB receive
//! window ask for a 10 MB streamed reply and never read it. They hold every slot at first;
//! each connection is closed once its client has taken no byte for the stream idle timeout,
//! every slot comes back, and a client that reads is served again. Its own test binary: a
//! quarter of a gigabyte a second through loopback would disturb the timing of other tests.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde_json::json;

use common::upstream::{self, Harness, body_of};

const STALLED: usize = 256;
const IDLE: Duration = Duration::from_secs(4);
/// How long 256 streams may take on a slow 2-core machine to fill their buffers, reach the
/// idle timeout and store what each received (81 s on machine A); before the fix the slots
/// never came back.
const FILLING: Duration = Duration::from_secs(300);
const REPLY_BYTES: usize = 10 << 20;

/// An upstream that answers every request with a 10 MB chat stream of 16 KiB events.
fn streaming_upstream() -> String {
    let event = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "x".repeat(16 << 10)
    );
    upstream::endless_upstream(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
        Box::leak(event.into_bytes().into_boxed_slice()),
        REPLY_BYTES,
    )
}

fn chat(question: &str, stream: bool) -> Vec<u8> {
    json!({"model": "gpt-4o", "stream": stream,
        "messages": [{"role": "user", "content": question}]})
    .to_string()
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stop_reading_give_their_slots_back_after_the_idle_timeout() {
    let upstream = streaming_upstream();
    let h = Harness::start(|config| {
        config.openai = upstream;
        config.max_concurrent = STALLED;
        config.body_limit = 16 << 20;
        config.stream_idle_timeout = IDLE;
    })
    .await;
    let request = chat("Stream me ten megabytes.", true);
    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.set_recv_buffer_size(1024).unwrap();
        socket.connect(&h.proxy.into()).unwrap();
        let mut stream: TcpStream = socket.into();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nauthorization: Bearer sk-stalled\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            request.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(&request).unwrap();
        stalled.push(stream);
    }
    let started = Instant::now();
    while h.state.requests_in_flight() < STALLED {
        assert!(
            started.elapsed() < FILLING,
            "the stalled clients never held every slot: {} in flight",
            h.state.requests_in_flight()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let port = h.proxy.port();
    let refused = tokio::task::spawn_blocking(move || {
        common::server::request(
            port,
            "POST",
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-reader")],
            &chat("Me too?", false),
        )
    })
    .await
    .unwrap();
    // Refused before its body was read, the connection may be reset under the answer.
    if let Ok(refused) = refused {
        assert_eq!(refused.status, 503, "{}", refused.text());
    }
    let locked = Instant::now();
    let mut last = STALLED;
    while h.state.requests_in_flight() > 0 {
        last = h.state.requests_in_flight();
        assert!(
            locked.elapsed() < FILLING + IDLE,
            "{last} stalled clients still hold their slots after {:?}",
            locked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let freed_after = locked.elapsed();
    let served = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[
                ("authorization", "Bearer sk-reader"),
                ("x-perpetuity-tools", "off"),
            ],
            &chat("Are you there?", false),
        )
        .await;
    assert_eq!(served.status(), StatusCode::OK);
    let body = body_of(served).await;
    assert!(
        body.len() >= REPLY_BYTES,
        "served whole: {} bytes",
        body.len()
    );
    println!(
        "{STALLED} stalled clients held every slot; all back {freed_after:?} later (idle timeout {IDLE:?}; {last} were still held at the last look before)"
    );
    drop(stalled);
}
