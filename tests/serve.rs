//! `perpetuity serve` on embedded defaults answers over real HTTP on loopback.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use common::server::{Server, free_port};

#[test]
fn serve_answers_health_and_refuses_a_route_without_a_provider() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, health) = Server::start(|command| {
        command.current_dir(dir.path()).env("RUST_LOG", "warn");
    });
    assert_eq!(health.status, 200, "{}", health.text());
    let health = health.json();
    assert_eq!(health["status"], "ok");
    assert_eq!(
        health["dictionary"],
        perpetuity::dictionary::DEFAULT_VERSION
    );
    assert!(
        dir.path().join("perpetuity-data/CURRENT").is_file(),
        "default data dir created"
    );

    assert!(
        server.running(),
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
    let answer = server.request("POST", "/v1/unknown", &[], b"").unwrap();
    assert_eq!(answer.status, 400, "{}", answer.text());
    let error = answer.json();
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot tell which provider"),
        "{error}"
    );
}

/// A one-request upstream on loopback: answers the first request with a fixed model list and
/// hands back the request line it saw.
fn one_shot_upstream() -> (u16, std::thread::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).unwrap();
            assert!(n > 0, "the proxy closed before sending its request");
            seen.extend_from_slice(&buf[..n]);
        }
        let body = r#"{"object":"list","data":[{"id":"from-the-file-upstream"}]}"#;
        write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        String::from_utf8_lossy(&seen)
            .lines()
            .next()
            .unwrap_or("")
            .to_owned()
    });
    (port, handle)
}

#[test]
fn a_config_file_sets_what_the_command_line_leaves_open() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, seen) = one_shot_upstream();
    let file_port = free_port();
    let config = dir.path().join("perpetuity.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{file_port}\"\ndata = \"from-file-data\"\n\n\
             [upstreams]\nopenai = \"http://127.0.0.1:{upstream}\"\n\n\
             [limits]\nbody_limit_bytes = 1000\n"
        ),
    )
    .unwrap();
    // The command line's --listen (the server helper gives one) wins over the file's; the data
    // dir, the upstream and the body limit come from the file.
    let (server, health) = Server::start(|command| {
        command
            .arg("--config")
            .arg(&config)
            .current_dir(dir.path())
            .env("RUST_LOG", "warn");
    });
    assert_eq!(health.status, 200, "{}", health.text());
    assert!(
        TcpStream::connect(("127.0.0.1", file_port)).is_err(),
        "the file's listen address was overridden"
    );
    assert!(dir.path().join("from-file-data/CURRENT").is_file());
    assert!(!dir.path().join("perpetuity-data").exists());

    let openai = [("authorization", "Bearer sk-test")];
    let answer = server.request("GET", "/v1/models", &openai, b"").unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.text().contains("from-the-file-upstream"));
    assert_eq!(seen.join().unwrap(), "GET /v1/models HTTP/1.1");

    let question = format!(
        r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(2_000)
    );
    let answer = server
        .request(
            "POST",
            "/v1/chat/completions",
            &[openai[0], ("content-type", "application/json")],
            question.as_bytes(),
        )
        .unwrap();
    assert_eq!(
        answer.status,
        413,
        "the file's body limit holds: {}",
        answer.text()
    );
}

#[test]
fn the_environment_wins_over_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("perpetuity.toml");
    std::fs::write(
        &config,
        "data = \"from-file-data\"\ndictionaries = \"no-such-dictionaries\"\n",
    )
    .unwrap();
    // The environment's data directory and dictionaries folder win over the file's; the file's
    // folder does not exist, so the server comes up only if the environment's is the one read.
    let (_server, health) = Server::start(|command| {
        command
            .arg("--config")
            .arg(&config)
            .current_dir(dir.path())
            .env("PERPETUITY_DATA", "from-env-data")
            .env(
                "PERPETUITY_DICTIONARIES",
                concat!(env!("CARGO_MANIFEST_DIR"), "/dictionaries"),
            )
            .env("RUST_LOG", "warn");
    });
    assert_eq!(health.status, 200, "{}", health.text());
    assert!(dir.path().join("from-env-data/CURRENT").is_file());
    assert!(!dir.path().join("from-file-data").exists());
}

#[test]
fn a_bad_config_file_stops_serve_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("perpetuity.toml");
    std::fs::write(&config, "[recall]\nwarm_flor = 0.2\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_perpetuity"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("warm_flor"), "{stderr}");
    assert!(stderr.contains("perpetuity.toml"), "{stderr}");
    assert!(
        !dir.path().join("perpetuity-data").exists(),
        "nothing is created before the file is read"
    );
}

/// The listening file (`perpetuity backup` finds a running server by it) is written as a new
/// file, never through a link left in its place, and goes when the server is stopped by
/// SIGTERM (`systemctl stop`, `docker stop`) as by Ctrl-C.
#[cfg(unix)]
#[test]
fn the_listening_file_is_written_new_and_goes_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let elsewhere = dir.path().join("elsewhere");
    std::os::unix::fs::symlink(&elsewhere, data.join("listening")).unwrap();
    for signal in ["TERM", "INT"] {
        let (mut server, health) = Server::start(|command| {
            command
                .args(["--data", data.to_str().unwrap()])
                .env("RUST_LOG", "warn");
        });
        assert_eq!(health.status, 200, "{}", health.text());
        let listening = data.join("listening");
        let kind = std::fs::symlink_metadata(&listening).unwrap().file_type();
        assert!(kind.is_file(), "a file of its own, not the link");
        assert!(!elsewhere.exists(), "the link was not followed");
        assert_eq!(
            std::fs::read_to_string(&listening).unwrap().trim(),
            format!("127.0.0.1:{}", server.port)
        );
        let status = server.signal(signal);
        assert!(status.success(), "SIG{signal}: {status}");
        assert!(!listening.exists(), "SIG{signal} left the listening file");
    }
}
