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
fn serve_answers_health_and_refuses_a_route_without_a_provider() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = Server(
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

    assert!(
        server.0.try_wait().unwrap().is_none(),
        "the answer came from this test's server (another process may hold the port)"
    );
    let secret = dir.path().join("perpetuity-data/secret");
    assert_eq!(
        std::fs::read(&secret).unwrap().len(),
        32,
        "the server secret is made"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&secret).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "only the owner reads the secret");
    }

    // Another path is passed through to the provider its credential names; without one there
    // is nobody to pass it to.
    let (status, body) = request(port, "POST", "/v1/unknown").unwrap();
    assert!(status.contains("400"), "{status}");
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot tell which provider"),
        "{error}"
    );
}
