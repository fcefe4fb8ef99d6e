//! `perpetuity serve` on embedded defaults answers over real HTTP on loopback.

mod common;

use common::server::Server;

#[test]
fn serve_answers_health_and_refuses_a_route_without_a_provider() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, health) = Server::start(|command| {
        command.current_dir(dir.path()).env("RUST_LOG", "warn");
    });
    assert_eq!(health.status, 200, "{}", health.text());
    let health = health.json();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["dictionary"], "v1");
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
