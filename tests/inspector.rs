//! The inspector's JSON endpoints and page over real HTTP (`perpetuity serve` in front of a
//! scripted upstream): the operator sees every user, a credential its own memory only; turns
//! come back verbatim (a stored `<script>` is text) in pages; the frame is asked in probe mode
//! (nothing captured); the page and its files carry a policy that forbids inline script.

mod common;

use std::sync::Arc;

use common::server::Server;
use common::upstream::{Upstream, chat_reply};

const ADMIN: (&str, &str) = ("x-perpetuity-admin-token", "inspector-test-admin");
const CANARY: &str = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">";

fn tell(server: &Server, credential: &str, text: &str) {
    let body = serde_json::json!({"model": "gpt-4o",
        "messages": [{"role": "user", "content": text}]});
    let answer = server
        .request(
            "POST",
            "/v1/chat/completions",
            &[("authorization", &format!("Bearer {credential}"))],
            body.to_string().as_bytes(),
        )
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// A server in front of an upstream that answers "Noted.", holding two users' memories: ada's
/// fact and canaries (a script, an image's error handler, a `javascript:` link, an SVG's load
/// handler), bob's fact. The runtime and upstream must outlive the server.
fn served() -> (tokio::runtime::Runtime, Upstream, tempfile::TempDir, Server) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    upstream.respond_with(Arc::new(|_, _| chat_reply("Noted.")));
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(|command| {
        command
            .args(["--data", dir.path().join("data").to_str().unwrap()])
            .args(["--admin-token", ADMIN.1])
            .args(["--upstream", &format!("openai={}", upstream.url())])
            .env("RUST_LOG", "warn");
    })
    .0;
    tell(&server, "sk-ada", "My locker code is 4417.");
    tell(&server, "sk-ada", CANARY);
    tell(
        &server,
        "sk-ada",
        "[a link](javascript:window.__pwned=3) and <svg onload=\"window.__pwned=4\">",
    );
    tell(&server, "sk-bob", "My bike is a green Brompton.");
    (runtime, upstream, dir, server)
}

fn get(server: &Server, path: &str, headers: &[(&str, &str)]) -> common::server::Answer {
    server.request("GET", path, headers, b"").unwrap()
}

fn bearer(credential: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {credential}"))
}

#[test]
fn the_operator_sees_every_user_and_a_credential_its_own() {
    let (_runtime, _upstream, _dir, server) = served();

    // The page and its files: served, with a policy that forbids inline script.
    for (path, kind) in [
        ("/perpetuity/", "text/html"),
        ("/perpetuity/inspector.js", "text/javascript"),
        ("/perpetuity/inspector.css", "text/css"),
        ("/perpetuity/favicon.svg", "image/svg+xml"),
    ] {
        let answer = get(&server, path, &[]);
        assert_eq!(answer.status, 200, "{path}");
        assert!(answer.header("content-type").unwrap().starts_with(kind));
        let policy = answer.header("content-security-policy").unwrap();
        assert!(policy.contains("script-src 'self'") && !policy.contains("unsafe-inline"));
        assert_eq!(answer.header("x-content-type-options"), Some("nosniff"));
    }
    let page = get(&server, "/perpetuity/", &[]).text();
    assert!(!page.contains("<script>"), "no inline script");
    assert!(
        !page.split(" on").skip(1).any(|after| {
            let name: String = after
                .chars()
                .take_while(char::is_ascii_alphabetic)
                .collect();
            !name.is_empty() && after[name.len()..].starts_with('=')
        }),
        "no inline event handler"
    );

    // No one: refused.
    assert_eq!(get(&server, "/perpetuity/api/users", &[]).status, 401);

    // The operator: every user, any user's turns.
    let users = get(&server, "/perpetuity/api/users", &[ADMIN]).json();
    let keys: Vec<String> = users["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["user"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys.len(), 2, "{users}");
    assert!(
        users["users"]
            .as_array()
            .unwrap()
            .iter()
            .all(|u| u["clock"].as_u64().unwrap() > 0)
    );

    // A credential: itself only.
    let ada = bearer("sk-ada");
    let own = get(&server, "/perpetuity/api/users", &[(ada.0, &ada.1)]).json();
    assert_eq!(own["users"].as_array().unwrap().len(), 1);
    let ada_key = own["users"][0]["user"].as_str().unwrap().to_owned();
    let bob_key = keys.iter().find(|k| **k != ada_key).unwrap().clone();
    let turns = get(&server, "/perpetuity/api/turns", &[(ada.0, &ada.1)]).json();
    let texts: Vec<&str> = turns["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["text"].as_str().unwrap())
        .collect();
    assert!(texts.contains(&"My locker code is 4417."), "{texts:?}");
    assert!(
        texts.contains(&CANARY),
        "a stored script comes back as its text"
    );
    assert!(
        !texts.iter().any(|t| t.contains("Brompton")),
        "another user's turn"
    );
    let refused = get(
        &server,
        &format!("/perpetuity/api/turns?user={bob_key}"),
        &[(ada.0, &ada.1)],
    );
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert!(!refused.text().contains("Brompton"));
    let bob_turns = get(
        &server,
        &format!("/perpetuity/api/turns?user={bob_key}"),
        &[ADMIN],
    )
    .json();
    assert!(bob_turns.to_string().contains("Brompton"));
    assert!(!bob_turns.to_string().contains("4417"));
    assert_eq!(
        get(&server, "/perpetuity/api/turns", &[ADMIN]).status,
        400,
        "the operator names the user"
    );

    // Pages: one turn at a time, each page after the last.
    let first = get(&server, "/perpetuity/api/turns?limit=1", &[(ada.0, &ada.1)]).json();
    assert_eq!(first["turns"].as_array().unwrap().len(), 1);
    let after = first["next_after"].as_u64().unwrap();
    let second = get(
        &server,
        &format!("/perpetuity/api/turns?limit=1&after={after}"),
        &[(ada.0, &ada.1)],
    )
    .json();
    assert!(second["turns"][0]["row"].as_u64().unwrap() > after);
    assert_eq!(
        get(&server, "/perpetuity/api/turns?limit=0", &[(ada.0, &ada.1)]).status,
        400
    );

    // The frame, in probe mode: the fact recalled, nothing captured.
    let before = turns["turns"].as_array().unwrap().len();
    let asked = server
        .request(
            "POST",
            "/perpetuity/api/frame",
            &[(ada.0, &ada.1)],
            br#"{"question": "What is my locker code?"}"#,
        )
        .unwrap();
    assert_eq!(asked.status, 200, "{}", asked.text());
    let frame = asked.json();
    assert!(frame["frame"].to_string().contains("4417"), "{frame}");
    assert!(!frame["frame"].to_string().contains("Brompton"));
    let after_ask = get(&server, "/perpetuity/api/turns", &[(ada.0, &ada.1)]).json();
    assert_eq!(after_ask["turns"].as_array().unwrap().len(), before);
    let other = server
        .request(
            "POST",
            "/perpetuity/api/frame",
            &[(ada.0, &ada.1)],
            format!(r#"{{"question": "bike?", "user": "{bob_key}"}}"#).as_bytes(),
        )
        .unwrap();
    assert_eq!(other.status, 403);
    assert!(!other.text().contains("Brompton"));
}

/// The browser the page test drives and the npm prefix holding playwright-core, or why the
/// test cannot run here.
fn browser() -> Result<(std::path::PathBuf, std::path::PathBuf), String> {
    let chromium = std::path::PathBuf::from(
        std::env::var("PERPETUITY_CHROMIUM")
            .unwrap_or_else(|_| "/usr/lib/chromium/chromium".into()),
    );
    let npm = std::path::PathBuf::from(
        std::env::var("PERPETUITY_BROWSER_NPM")
            .unwrap_or_else(|_| "/var/tmp/perpetuity-browser-npm".into()),
    );
    if !chromium.is_file() {
        return Err(format!("no Chromium at {}", chromium.display()));
    }
    if !npm
        .join("node_modules/playwright-core/package.json")
        .is_file()
    {
        return Err(format!("no playwright-core under {}", npm.display()));
    }
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.is_ok_and(|out| out.status.success()) {
        return Err("no node".into());
    }
    Ok((chromium, npm))
}

#[test]
fn the_page_shows_a_stored_script_as_text_in_a_real_browser() {
    let (chromium, npm) = match browser() {
        Ok(found) => found,
        Err(why) => {
            eprintln!(
                "SKIP the_page_shows_a_stored_script_as_text_in_a_real_browser: {why} (tools/install-deps.sh installs them)"
            );
            return;
        }
    };
    let (_runtime, _upstream, dir, server) = served();

    // Screenshots go to the folder PERPETUITY_SCREENSHOTS names (docs/ to refresh README's).
    let shots = std::env::var("PERPETUITY_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| dir.path().to_path_buf());
    let out = std::process::Command::new("node")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/inspector/browser.mjs"
        ))
        .arg(format!("http://127.0.0.1:{}/perpetuity/", server.port))
        .arg("sk-ada")
        .arg("What is my locker code?")
        .arg(shots.join("inspector"))
        .env("PERPETUITY_BROWSER_NPM", &npm)
        .env("PERPETUITY_CHROMIUM", &chromium)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = stdout
        .lines()
        .find_map(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| {
            panic!(
                "the browser script printed no report: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(
        out.status.success(),
        "stored text ran as code, or the page failed: {report}"
    );
    let turns: Vec<&str> = report["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(
        turns.contains(&CANARY),
        "the stored script is shown as its text: {turns:?}"
    );
    assert!(turns.contains(&"My locker code is 4417."));
    assert!(
        !turns.iter().any(|t| t.contains("Brompton")),
        "another user's turn was shown"
    );
    assert!(
        report["frame"].to_string().contains("4417"),
        "the frame the question would get: {report}"
    );
    assert!(shots.join("inspector-turns.png").is_file());
    assert!(shots.join("inspector-frame.png").is_file());
}
