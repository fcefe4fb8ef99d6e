//! `perpetuity serve` on embedded defaults answers over real HTTP on loopback.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the server when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 request; returns (status line, body).
fn request(port: u16, method: &str, path: &str) -> std::io::Result<(String, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Ok((
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    ))
}

#[test]
fn serve_answers_health_and_unknown_routes() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = Server(
        Command::new(env!("CARGO_BIN_EXE_perpetuity"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .current_dir(dir.path())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    let (status, body) = loop {
        match request(port, "GET", "/healthz") {
            Ok(answer) => break answer,
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(err) => panic!("server did not come up: {err}"),
        }
    };
    assert!(status.contains("200"), "{status}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["dictionary"], "v1");
    assert!(
        dir.path().join("perpetuity-data/CURRENT").is_file(),
        "default data dir created"
    );

    let (status, body) = request(port, "POST", "/v1/unknown").unwrap();
    assert!(status.contains("404"), "{status}");
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["type"], "not_found_error");
}
