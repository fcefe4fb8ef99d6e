//! The inspector's JSON endpoints and page over real HTTP (`perpetuity serve` in front of a
//! scripted upstream): the operator sees every user, a credential its own memory only; turns
//! come back verbatim (a stored `<script>` is text) in pages; the frame is asked in probe mode
//! (nothing captured); the log of requests holds what was forwarded, the tool rounds and why
//! each turn was or was not shown; the page and its files carry a policy that forbids inline
//! script, and a walk in headless Chromium over a LoCoMo memory finds no stored text run.

mod common;

use std::sync::Arc;

use common::server::Server;
use common::upstream::{Upstream, chat_reply};
use perpetuity::datasets::{self, Format};
use perpetuity::ingest;
use perpetuity::proxy::identity::Secret;

const ADMIN: (&str, &str) = ("x-perpetuity-admin-token", "inspector-test-admin");
const CANARY: &str = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">";
const LINK_CANARY: &str =
    "[a link](javascript:window.__pwned=3) and <svg onload=\"window.__pwned=4\">";

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
    let dir = tempfile::tempdir().unwrap();
    let (runtime, upstream, server) = serve(&dir.path().join("data"));
    tell(&server, "sk-ada", "My locker code is 4417.");
    tell(&server, "sk-ada", CANARY);
    tell(&server, "sk-ada", LINK_CANARY);
    tell(&server, "sk-bob", "My bike is a green Brompton.");
    (runtime, upstream, dir, server)
}

/// A server on `data` with the admin token, in front of an upstream that answers "Noted.".
/// The runtime and upstream must outlive the server.
fn serve(data: &std::path::Path) -> (tokio::runtime::Runtime, Upstream, Server) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    upstream.respond_with(Arc::new(|_, _| chat_reply("Noted.")));
    let server = Server::start(|command| {
        command
            .args(["--data", data.to_str().unwrap()])
            .args(["--admin-token", ADMIN.1])
            .args(["--upstream", &format!("openai={}", upstream.url())])
            .env("RUST_LOG", "warn");
    })
    .0;
    (runtime, upstream, server)
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
            &format!("/perpetuity/api/frame?user={bob_key}"),
            &[(ada.0, &ada.1)],
            br#"{"question": "bike?"}"#,
        )
        .unwrap();
    assert_eq!(other.status, 403);
    assert!(!other.text().contains("Brompton"));
}

/// A question the model answers after one memory_search round: the log holds the body as
/// first forwarded, the call with what it returned (as the upstream's second round received
/// it), the reply captured, and each turn's reason against the request; another credential
/// finds none of it.
#[test]
fn the_log_holds_a_request_its_tool_round_and_why() {
    let (_runtime, upstream, _dir, server) = served();
    upstream.respond_with(Arc::new(|_, received| {
        let body = received.json();
        let messages = body["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        if last["role"] == "tool" {
            return chat_reply("It is written on the door: 4417.");
        }
        if !last["content"].to_string().contains("written") {
            return chat_reply("Noted.");
        }
        let call = serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
            "model": "gpt-4o", "choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
            "type": "function", "function": {"name": "memory_search",
            "arguments": "{\"query\": \"locker code\"}"}}]}}]});
        common::upstream::Answer::Whole(200, "application/json", call.to_string().into_bytes())
    }));
    let before = upstream.received().len();
    tell(&server, "sk-ada", "Where is my locker code written?");
    let sent = upstream.received();
    assert_eq!(sent.len(), before + 2, "one memory round, then the answer");
    let round = sent.last().unwrap().json();
    let returned = round["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();

    let ada = bearer("sk-ada");
    let headers = [(ada.0, ada.1.as_str())];
    let logged = get(&server, "/perpetuity/api/requests", &headers).json();
    let requests = logged["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 4, "ada's four requests: {logged}");
    let newest = &requests[0];
    assert_eq!(newest["question"], "Where is my locker code written?");
    assert_eq!(newest["tool_calls"], 1);
    assert_eq!(newest["reply_stored"], true);
    assert_eq!(newest["status"], 200);
    let id = newest["id"].as_u64().unwrap();
    let request = get(
        &server,
        &format!("/perpetuity/api/request?id={id}"),
        &headers,
    )
    .json();
    assert_eq!(
        request["forwarded"].as_str().unwrap(),
        sent[before].text(),
        "the body as first forwarded"
    );
    let rounds = request["tool_rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 1);
    assert_eq!(rounds[0]["name"], "memory_search");
    assert_eq!(rounds[0]["arguments"], r#"{"query": "locker code"}"#);
    assert_eq!(rounds[0]["result"].as_str().unwrap(), returned);
    let recall = &request["recall"];
    assert!(recall["budget"].as_u64().unwrap() >= recall["frame"]["tokens"].as_u64().unwrap());
    assert!(
        recall["retrieved"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["why"]["fate"].is_string())
    );

    let turns = get(
        &server,
        &format!("/perpetuity/api/turns?request={id}"),
        &headers,
    )
    .json();
    let shown: Vec<&serde_json::Value> =
        recall["frame"]["rows"].as_array().unwrap().iter().collect();
    for turn in turns["turns"].as_array().unwrap() {
        let fate = turn["why"]["fate"].as_str().unwrap();
        assert_eq!(fate == "shown", shown.contains(&&turn["row"]), "{turn}");
        assert!(!turn["why"]["reason"].as_str().unwrap().is_empty());
    }
    assert!(
        turns.to_string().contains("stored after this request"),
        "the reply: {turns}"
    );

    // Another credential: none of ada's requests; an id of hers is 404 for it.
    let bob = bearer("sk-bob");
    let theirs = get(&server, "/perpetuity/api/requests", &[(bob.0, &bob.1)]).json();
    assert_eq!(theirs["requests"].as_array().unwrap().len(), 1);
    let refused = get(
        &server,
        &format!("/perpetuity/api/request?id={id}"),
        &[(bob.0, &bob.1)],
    );
    assert_eq!(refused.status, 404);
    assert!(!refused.text().contains("locker"));

    // A request the provider refuses the credential of is not logged.
    upstream.respond_with(Arc::new(|_, _| {
        common::upstream::Answer::Whole(
            401,
            "application/json",
            br#"{"error": {"message": "bad key", "type": "invalid_request_error"}}"#.to_vec(),
        )
    }));
    let eve = bearer("sk-eve");
    let body = serde_json::json!({"model": "gpt-4o",
        "messages": [{"role": "user", "content": "My pin is 1234."}]});
    let answer = server
        .request(
            "POST",
            "/v1/chat/completions",
            &[(eve.0, &eve.1)],
            body.to_string().as_bytes(),
        )
        .unwrap();
    assert_eq!(answer.status, 401);
    let logged = get(&server, "/perpetuity/api/requests", &[(eve.0, &eve.1)]);
    assert_eq!(logged.status, 403, "{}", logged.text());
    assert!(logged.text().contains("once the provider has accepted"));
    assert!(!logged.text().contains("1234"));
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

/// Run the browser script `script` (under tests/inspector/) with `args` and the browser's
/// environment; its one JSON report line, and whether it exited 0 (no sign of stored text run
/// as code, no failed step).
fn drive(
    (chromium, npm): &(std::path::PathBuf, std::path::PathBuf),
    script: &str,
    args: &[String],
) -> (serde_json::Value, bool) {
    let out = std::process::Command::new("node")
        .arg(format!(
            "{}/tests/inspector/{script}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .args(args)
        .env("PERPETUITY_BROWSER_NPM", npm)
        .env("PERPETUITY_CHROMIUM", chromium)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = stdout
        .lines()
        .find_map(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| {
            panic!(
                "the browser script printed no report: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    (report, out.status.success())
}

/// Where screenshots go: the folder PERPETUITY_SCREENSHOTS names (docs/ to refresh README's),
/// else `temp`.
fn screenshots(temp: &std::path::Path) -> std::path::PathBuf {
    std::env::var("PERPETUITY_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| temp.to_path_buf())
}

fn texts(list: &serde_json::Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect()
}

/// A served store holding one LoCoMo conversation (its 19 sessions, as a credential's memory),
/// one question asked through the proxy, and another credential holding the canaries. The
/// page, driven in Chromium: the user's conversations and turns; the request's frame equal to
/// what the upstream received, byte for byte; each turn's reason against that request (shown
/// or why not), agreeing with the request's recall; a row excluded and included again; the
/// frame and search views; the other credential sees none of the first's memory; a purge
/// asks first (cancelled, nothing changes), then leaves nothing.
#[test]
fn the_inspector_walks_a_locomo_memory_in_a_real_browser() {
    const TEST: &str = "the_inspector_walks_a_locomo_memory_in_a_real_browser";
    let found = match browser() {
        Ok(found) => found,
        Err(why) => {
            eprintln!("SKIP {TEST}: {why} (tools/install-deps.sh installs them)");
            return;
        }
    };
    let Some(file) = common::locomo_file(TEST) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let key = Secret::load_or_create(&data)
        .unwrap()
        .user_key("sk-locomo", None);
    let dataset = datasets::load(Format::Locomo, &file).unwrap();
    let sample = dataset.messages[0].user_key.clone();
    let messages: Vec<_> = dataset
        .messages
        .iter()
        .filter(|m| m.user_key == sample)
        .map(|m| perpetuity::capture::Message {
            user_key: key.clone(),
            ..m.clone()
        })
        .collect();
    let asked = dataset
        .questions
        .iter()
        .find(|q| q.user_key == sample && !q.evidence_turns.is_empty())
        .unwrap();
    let question = asked.question.clone();
    let evidence = messages
        .iter()
        .find(|m| m.source_turn.as_ref() == Some(&asked.evidence_turns[0]))
        .unwrap()
        .text
        .clone();
    {
        let memory = common::memory(&data);
        ingest::ingest(&memory.store, &memory.dictionary, &messages, |_, _| {}).unwrap();
    }

    let (_runtime, upstream, server) = serve(&data);
    tell(&server, "sk-bob", "My bike is a green Brompton.");
    tell(&server, "sk-bob", CANARY);
    tell(&server, "sk-bob", LINK_CANARY);
    tell(&server, "sk-locomo", &question);
    let forwarded = upstream.received().last().unwrap().text();
    assert!(forwarded.contains(&question));

    // The request as the API logs it: the conversation of its first shown row is the one the
    // page is asked to open, so its turns hold rows the frame showed and rows it did not.
    let locomo = bearer("sk-locomo");
    let headers = [(locomo.0, locomo.1.as_str())];
    let logged = get(&server, "/perpetuity/api/requests", &headers).json();
    let id = logged["requests"][0]["id"].as_u64().unwrap();
    let request = get(
        &server,
        &format!("/perpetuity/api/request?id={id}"),
        &headers,
    )
    .json();
    assert_eq!(request["forwarded"].as_str().unwrap(), forwarded);
    let shown: Vec<u64> = request["recall"]["frame"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_u64().unwrap())
        .collect();
    assert!(!shown.is_empty(), "{request}");
    let first_shown = messages_row(&server, &headers, shown[0]);
    let conversation = first_shown["conversation"].as_str().unwrap().to_owned();

    let shots = screenshots(dir.path());
    let (report, clean) = drive(
        &found,
        "walk.mjs",
        &[
            format!("http://127.0.0.1:{}/perpetuity/", server.port),
            "sk-locomo".into(),
            "sk-bob".into(),
            conversation.clone(),
            question.clone(),
            shots.join("inspector").display().to_string(),
        ],
    );
    assert!(clean, "a step failed, or stored text ran as code: {report}");

    // The frame as forwarded, shown byte for byte.
    assert_eq!(report["forwarded"].as_str().unwrap(), forwarded);
    // The conversation's turns, each with its reason against the request, agreeing with the
    // request's recall: shown exactly where the frame showed it, and a reason for the rest.
    let sessions = texts(&report["conversations"]);
    assert_eq!(
        sessions
            .iter()
            .filter(|c| c.starts_with("session_"))
            .count(),
        19,
        "{sessions:?}"
    );
    let whys = report["whys"].as_array().unwrap();
    let stored_turns = messages
        .iter()
        .filter(|m| m.conversation == conversation)
        .count();
    assert!(
        whys.len() >= stored_turns.min(100),
        "{} of {stored_turns}",
        whys.len()
    );
    let mut left_out = 0;
    for why in whys {
        let row = why["row"].as_u64().unwrap();
        let fate = why["fate"].as_str().unwrap();
        assert_eq!(fate == "shown", shown.contains(&row), "row {row}: {why}");
        if fate != "shown" {
            left_out += 1;
            assert!(
                ["not_retrieved", "too_cold", "trimmed", "not_offered"].contains(&fate)
                    && why["reason"].as_str().unwrap().len() > 20,
                "{why}"
            );
        }
    }
    assert!(whys.iter().any(|w| w["fate"] == "shown"));
    assert!(left_out > 0, "no left-out row to explain: {whys:?}");
    // Exclude then include, each confirmed in the page first.
    assert_eq!(
        report["excluded"],
        serde_json::json!([true, true, false]),
        "{report}"
    );
    // The frame and the search views.
    assert!(
        texts(&report["frame"])
            .iter()
            .any(|t| t.contains(&evidence)),
        "the frame holds the evidence {evidence:?}: {report}"
    );
    assert!(texts(&report["found"]).contains(&evidence.as_str()));
    // The other credential: its own turns (the canary as text), none of the first's.
    let bob = texts(&report["other"]);
    assert!(
        bob.contains(&CANARY) && bob.contains(&LINK_CANARY),
        "{bob:?}"
    );
    assert!(bob.iter().any(|t| t.contains("Brompton")));
    let theirs: Vec<&str> = messages.iter().map(|m| m.text.as_str()).collect();
    assert!(!bob.iter().any(|t| theirs.contains(t)), "{bob:?}");
    // The purge: cancelled once (nothing changed), then confirmed, and nothing is left.
    assert_eq!(
        report["purge_cancelled_turns"],
        report["turns_before_purge"]
    );
    assert_eq!(report["turns_after_purge"], 0, "{report}");
    for path in [
        "/perpetuity/api/turns",
        "/perpetuity/api/conversations",
        "/perpetuity/api/requests",
    ] {
        let left = get(&server, path, &headers).json();
        assert!(
            ["turns", "conversations", "requests"]
                .iter()
                .all(|k| left[k].as_array().is_none_or(Vec::is_empty)),
            "{path}: {left}"
        );
    }
    let users = get(&server, "/perpetuity/api/users", &[ADMIN]).json();
    assert!(!users.to_string().contains(&key), "{users}");
    for shot in ["memory", "request", "conversation", "frame"] {
        assert!(
            shots.join(format!("inspector-{shot}.png")).is_file(),
            "{shot}"
        );
    }
}

/// One row of the credential's memory, as the turns endpoint shows it.
fn messages_row(server: &Server, headers: &[(&str, &str)], row: u64) -> serde_json::Value {
    let page = get(
        server,
        &format!("/perpetuity/api/turns?after={}&limit=1", row - 1),
        headers,
    )
    .json();
    let turn = page["turns"][0].clone();
    assert_eq!(turn["row"], row, "{page}");
    turn
}

/// Inspector rights come from the provider's word, not from presenting a key: a credential
/// the provider never accepted, or refused since, sees and changes nothing (inspector,
/// exclusions, purge); bodies are capped well below a chat request's limit; and the operator
/// can keep the inspector to itself or turn it off.
#[test]
fn a_credential_inspects_its_memory_only_while_the_provider_vouches_for_it() {
    let (_runtime, upstream, dir, server) = served();
    let ada = bearer("sk-ada");
    let ada = [(ada.0, ada.1.as_str())];
    let turns = get(&server, "/perpetuity/api/turns", &ada);
    assert_eq!(turns.status, 200, "{}", turns.text());
    assert!(turns.text().contains("4417"));

    // Made up: never answered by the provider.
    let made_up = bearer("sk-made-up");
    let made_up = [(made_up.0, made_up.1.as_str())];
    for (method, path, body) in [
        ("GET", "/perpetuity/api/turns", String::new()),
        ("GET", "/perpetuity/api/requests", String::new()),
        (
            "POST",
            "/perpetuity/api/search",
            r#"{"query": "locker"}"#.into(),
        ),
        (
            "POST",
            "/perpetuity/api/purge",
            r#"{"confirm": "x"}"#.into(),
        ),
        ("GET", "/perpetuity/exclusions", String::new()),
        ("POST", "/perpetuity/exclusions", r#"{"rows": [1]}"#.into()),
    ] {
        let answer = server
            .request(method, path, &made_up, body.as_bytes())
            .unwrap();
        assert_eq!(answer.status, 403, "{method} {path}: {}", answer.text());
        assert!(
            answer.text().contains("once the provider has accepted"),
            "{method} {path}: {}",
            answer.text()
        );
    }
    let refused = server
        .request("GET", "/perpetuity/exclusions", &made_up, b"")
        .unwrap();
    assert_eq!(refused.json()["error"]["type"], "permission_error");

    // A body far over what a question needs is refused before it is read whole.
    let question = serde_json::json!({"query": "x".repeat(2 * 1024 * 1024)}).to_string();
    let big = server
        .request("POST", "/perpetuity/api/search", &ada, question.as_bytes())
        .unwrap();
    assert_eq!(big.status, 400, "{}", big.text());
    assert!(big.text().contains("1048576 bytes"), "{}", big.text());

    // Revoked: the provider refuses ada's key; from then on her memory is closed to it.
    upstream.respond_with(Arc::new(|_, _| {
        common::upstream::Answer::Whole(
            401,
            "application/json",
            br#"{"error": {"message": "revoked", "type": "invalid_request_error"}}"#.to_vec(),
        )
    }));
    let body = serde_json::json!({"model": "gpt-4o",
        "messages": [{"role": "user", "content": "Hello again."}]});
    let answer = server
        .request(
            "POST",
            "/v1/chat/completions",
            &ada,
            body.to_string().as_bytes(),
        )
        .unwrap();
    assert_eq!(answer.status, 401);
    for path in ["/perpetuity/api/turns", "/perpetuity/exclusions"] {
        let closed = get(&server, path, &ada);
        assert_eq!(closed.status, 403, "{path}: {}", closed.text());
        assert!(!closed.text().contains("4417"));
    }
    let purge = server
        .request(
            "POST",
            "/perpetuity/api/purge",
            &ada,
            br#"{"confirm": "x"}"#,
        )
        .unwrap();
    assert_eq!(purge.status, 403);
    drop(server);

    // The same memory with the inspector kept to the operator, then off.
    let data = dir.path().join("data");
    for (access, credential, operator, page) in
        [("operator", 403, 200, 200), ("off", 404, 404, 404)]
    {
        let config = dir.path().join(format!("{access}.toml"));
        std::fs::write(&config, format!("[inspector]\naccess = \"{access}\"\n")).unwrap();
        let upstream = _runtime.block_on(Upstream::start());
        upstream.respond_with(Arc::new(|_, _| chat_reply("Noted.")));
        let server = Server::start(|command| {
            command
                .args(["--data", data.to_str().unwrap()])
                .args(["--config", config.to_str().unwrap()])
                .args(["--admin-token", ADMIN.1])
                .args(["--upstream", &format!("openai={}", upstream.url())])
                .env("RUST_LOG", "warn");
        })
        .0;
        tell(&server, "sk-bob", "My bike has a bell.");
        let bob = bearer("sk-bob");
        let seen = get(&server, "/perpetuity/api/turns", &[(bob.0, &bob.1)]);
        assert_eq!(seen.status, credential, "{access}: {}", seen.text());
        assert!(!seen.text().contains("Brompton"));
        let users = get(&server, "/perpetuity/api/users", &[ADMIN]);
        assert_eq!(users.status, operator, "{access}: {}", users.text());
        assert_eq!(get(&server, "/perpetuity/", &[]).status, page, "{access}");
    }
}
