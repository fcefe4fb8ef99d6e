//! Purge through `perpetuity serve`: afterwards the user's canaries are in no file of the data
//! directory (stored uncompressed, so a byte search finds stored text), every other user's
//! rows are unchanged and integrity is clean; also when the server is killed mid-purge: after
//! the restart the user's memory is whole or gone (never in part), and the purge, asked again
//! as an unanswered request must be, completes. Its own test binary because it kills the
//! server.

mod common;

use std::path::Path;
use std::time::Instant;

use common::server::Server;
use common::upstream::{Answer, Upstream, chat_reply};
use perpetuity::proxy::identity::Secret;
use perpetuity::store::{Row, Store, StoreOptions};
use perpetuity::types::{Role, UserId};

const USERS: usize = 5;
const MESSAGES: usize = 12;
const ADMIN: (&str, &str) = ("x-perpetuity-admin-token", "purge-test-admin");

fn credential(user: usize) -> String {
    format!("sk-purge-user-{user}")
}

fn canary(user: usize, message: usize) -> String {
    format!("Pqz{user}x{message:02}Kestrel")
}

fn start(data: &Path, upstream: &str) -> Server {
    start_with(data, upstream, &[])
}

/// [`start`] with `more` arguments.
fn start_with(data: &Path, upstream: &str, more: &[&str]) -> Server {
    Server::start(|command| {
        command
            .args(["--data", data.to_str().unwrap(), "--uncompressed"])
            .args(["--admin-token", ADMIN.1])
            .args(["--upstream", &format!("openai={upstream}")])
            .args(more)
            .env("RUST_LOG", "warn");
    })
    .0
}

/// Every user's rows, read from the store the stopped server left.
fn all_rows(data: &Path) -> Vec<Vec<Row>> {
    let store = Store::open(data, &StoreOptions::default()).unwrap();
    let secret = Secret::load_or_create(data).unwrap();
    (0..USERS)
        .map(|u| {
            let user = UserId::from_key(&secret.user_key(&credential(u), None));
            store.rows_of(user).map(Result::unwrap).collect()
        })
        .collect()
}

fn assert_integrity(server: &Server, when: &str) {
    let report = server
        .request("GET", "/admin/integrity", &[ADMIN], b"")
        .unwrap();
    assert_eq!(report.status, 200, "{when}: {}", report.text());
}

/// Purge `user` and wait for the answer.
fn purge(server: &Server, key: &str) -> u64 {
    let answer = server
        .request("POST", &format!("/admin/purge?user={key}"), &[ADMIN], b"")
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()["rows_removed"].as_u64().unwrap()
}

/// Whether any file of `data` holds one of `user`'s canaries.
fn canaries_on_disk(data: &Path, user: usize) -> Vec<String> {
    (0..MESSAGES)
        .flat_map(|m| common::files_containing(data, canary(user, m).as_bytes()))
        .collect()
}

#[test]
fn a_purged_user_leaves_no_byte_on_disk_even_when_the_purge_is_killed() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = start(&data, &upstream.url());
    for user in 0..USERS {
        let auth = format!("Bearer {}", credential(user));
        for message in 0..MESSAGES {
            upstream.answer(Answer::Whole(
                200,
                "application/json",
                br#"{"choices":[{"message":{"content":"Noted."}}]}"#.to_vec(),
            ));
            let body = serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user",
                "content": format!("Keep this safe: {}.", canary(user, message))}]});
            let answer = server
                .request(
                    "POST",
                    "/v1/chat/completions",
                    &[("authorization", &auth)],
                    body.to_string().as_bytes(),
                )
                .unwrap();
            assert_eq!(answer.status, 200, "{}", answer.text());
        }
    }
    server.kill();
    let before = all_rows(&data);
    for (user, rows) in before.iter().enumerate() {
        assert_eq!(rows.len(), 2 * MESSAGES);
        assert!(
            !canaries_on_disk(&data, user).is_empty(),
            "the byte search finds stored text"
        );
    }
    let keys: Vec<String> = {
        let secret = Secret::load_or_create(&data).unwrap();
        (0..USERS)
            .map(|u| secret.user_key(&credential(u), None))
            .collect()
    };

    // A purge that runs to its end.
    let server = start(&data, &upstream.url());
    let started = Instant::now();
    assert_eq!(purge(&server, &keys[0]), 2 * MESSAGES as u64);
    let purge_time = started.elapsed();
    assert_integrity(&server, "after the purge");
    drop(server);
    let hits = canaries_on_disk(&data, 0);
    assert!(hits.is_empty(), "purged canaries in {hits:?}");
    let after = all_rows(&data);
    assert!(after[0].is_empty());
    for user in 1..USERS {
        assert_eq!(after[user], before[user], "user {user} changed");
    }

    // Purges killed at moments spread over the time one takes.
    let mut outcomes = Vec::new();
    for user in 1..USERS {
        let mut server = start(&data, &upstream.url());
        let delay = purge_time.mul_f64((user - 1) as f64 / (USERS - 2) as f64);
        let port = server.port;
        let key = keys[user].clone();
        let request = std::thread::spawn(move || {
            common::server::request(
                port,
                "POST",
                &format!("/admin/purge?user={key}"),
                &[ADMIN],
                b"",
            )
        });
        std::thread::sleep(delay);
        server.kill();
        let answered = request.join().unwrap().is_ok_and(|a| a.status == 200);
        let rows = all_rows(&data);
        let kept = rows[user].len();
        assert!(
            kept == 0 || rows[user] == before[user],
            "user {user}: {kept} of {} rows survived a killed purge",
            before[user].len()
        );
        assert!(!answered || kept == 0, "an answered purge was undone");
        for other in (1..USERS).filter(|o| *o > user) {
            assert_eq!(rows[other], before[other], "user {other} changed");
        }
        outcomes.push(format!(
            "killed after {delay:.1?}: {}",
            if kept == 0 { "purged" } else { "kept whole" }
        ));

        let server = start(&data, &upstream.url());
        assert_integrity(&server, "after the killed purge");
        // An unanswered purge is asked again; it completes whatever the kill left.
        purge(&server, &keys[user]);
        assert_integrity(&server, "after the repeated purge");
        drop(server);
        let hits = canaries_on_disk(&data, user);
        assert!(hits.is_empty(), "user {user}: purged canaries in {hits:?}");
    }
    let after = all_rows(&data);
    assert!(after.iter().all(Vec::is_empty));
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_perpetuity"))
        .args(["integrity", "--data", data.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .status()
        .unwrap();
    assert!(status.success());
    println!("one purge took {purge_time:.1?}; {}", outcomes.join("; "));
}

/// The team key whose `planner` and `coder` share the group scope `team`.
const TEAM: &str = "sk-purge-team";
/// What only the planner ever said.
const TEAMMATE_CANARY: &str = "Pqz7TeamKestrel";

/// A Chat Completions request of the `coder`: `messages`, the harness's `get_weather` tool
/// declared.
fn coder_request(messages: serde_json::Value) -> Vec<u8> {
    serde_json::json!({"model": "gpt-4o", "messages": messages, "tools": [{"type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}}}}]})
    .to_string()
    .into_bytes()
}

/// A whole Chat Completions reply that calls the tool `name` with `arguments`.
fn calls(name: &str, arguments: &str) -> Answer {
    Answer::Whole(
        200,
        "application/json",
        serde_json::json!({"id": "chatcmpl-call", "object": "chat.completion", "created": 1,
            "model": "gpt-4o", "choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": name, "arguments": arguments}}]}}]})
        .to_string()
        .into_bytes(),
    )
}

/// `question`, then the harness's `get_weather` round on it (the call and its result): the
/// continuation of the turn that asked `question`.
fn after_the_weather_round(question: &str) -> serde_json::Value {
    serde_json::json!([
        {"role": "user", "content": question},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 degrees."},
    ])
}

/// One chat request of the team key's user `name`.
fn chat_as(server: &Server, name: &str, body: &[u8]) {
    let auth = format!("Bearer {TEAM}");
    let answer = server
        .request(
            "POST",
            "/v1/chat/completions",
            &[
                ("authorization", &auth),
                ("x-perpetuity-user", name),
                ("content-type", "application/json"),
            ],
            body,
        )
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// A teammate's purge leaves no copy of it in the group: a memory_search round that returned
/// the planner's words to the coder stored none of them in the coder's memory, and the coder's
/// turn whose frame showed them, continued after the purge, is recalled again instead of
/// forwarding the kept frame. Afterwards no file of the data directory holds the planner's
/// words, and the coder's memory is whole.
#[test]
fn a_purged_teammate_leaves_no_copy_in_the_group() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("perpetuity.toml");
    std::fs::write(&config, "[groups]\nteam = [\"planner\", \"coder\"]\n").unwrap();
    let server = start_with(
        &data,
        &upstream.url(),
        &["--config", config.to_str().unwrap()],
    );
    let weather = "What is the weather in Paris today?";
    let passphrase = "What is the deploy passphrase of the project?";

    // The coder's turn starts before the planner says anything, so its frame shows nothing
    // of the planner's and a search later in the turn returns the planner's words.
    upstream.answer(calls("get_weather", r#"{"city": "Paris"}"#));
    chat_as(
        &server,
        "coder",
        &coder_request(serde_json::json!([
        {"role": "user", "content": weather}])),
    );
    upstream.answer(chat_reply("Noted."));
    chat_as(
        &server,
        "planner",
        &common::upstream::chat_request(&format!(
            "Remember: the deploy passphrase of the project is {TEAMMATE_CANARY}."
        )),
    );
    upstream.answer(calls(
        "memory_search",
        r#"{"query": "deploy passphrase of the project"}"#,
    ));
    upstream.answer(chat_reply("It is sunny in Paris."));
    chat_as(
        &server,
        "coder",
        &coder_request(after_the_weather_round(weather)),
    );
    let received = upstream.received();
    let result = received.last().unwrap().json()["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        result.starts_with("memory_search: ") && result.contains(TEAMMATE_CANARY),
        "the search returned the planner's words (or the test proves nothing): {result}"
    );

    // A new turn of the coder whose frame shows the planner's words, left open by the
    // harness's tool call.
    upstream.answer(calls("get_weather", r#"{"city": "Paris"}"#));
    chat_as(
        &server,
        "coder",
        &coder_request(serde_json::json!([
        {"role": "user", "content": passphrase}])),
    );
    assert!(
        upstream
            .received()
            .last()
            .unwrap()
            .text()
            .contains(TEAMMATE_CANARY),
        "the coder's frame shows the planner's words (or the test proves nothing)"
    );

    let planner = {
        let secret = Secret::load_or_create(&data).unwrap();
        secret.user_key(TEAM, Some("planner"))
    };
    assert_eq!(
        purge(&server, &planner),
        2,
        "the planner's question and reply"
    );
    upstream.answer(chat_reply("The passphrase is not in my memory."));
    chat_as(
        &server,
        "coder",
        &coder_request(after_the_weather_round(passphrase)),
    );
    let sent = upstream.received().last().unwrap().text();
    assert!(
        !sent.contains(TEAMMATE_CANARY),
        "the turn continued after the purge forwarded the planner's words: {sent}"
    );
    assert_integrity(&server, "after the teammate's purge");
    drop(server);

    let hits = common::files_containing(&data, TEAMMATE_CANARY.as_bytes());
    assert!(hits.is_empty(), "the purged teammate's words in {hits:?}");
    let store = Store::open(&data, &StoreOptions::default()).unwrap();
    let secret = Secret::load_or_create(&data).unwrap();
    let coder = UserId::from_key(&secret.user_key(TEAM, Some("coder")));
    let said = common::stored_messages(&store, coder);
    let questions: Vec<&str> = said
        .iter()
        .filter(|(role, _)| *role == Role::User)
        .map(|(_, text)| text.as_str())
        .collect();
    assert_eq!(
        questions,
        [weather, passphrase],
        "the coder's memory is whole"
    );
    assert!(
        said.iter()
            .any(|(role, text)| *role == Role::Assistant && text == "It is sunny in Paris."),
        "{said:?}"
    );
}

/// The users of one credential: its own (no `x-perpetuity-user`) and two sub-users.
const FAMILY: [Option<&str>; 3] = [None, Some("ann"), Some("ben")];

/// What the user `member` of `credential` said, and only it.
fn family_canary(credential: &str, member: Option<&str>) -> String {
    format!("Pqz{credential}{}Kestrel", member.unwrap_or("own"))
}

/// Rows of each user of `credential` in the data directory the stopped server left, opened as
/// it was written (uncompressed).
fn family_rows(data: &Path, credential: &str) -> Vec<Vec<Row>> {
    let options = StoreOptions {
        compression: false,
        ..StoreOptions::default()
    };
    let store = Store::open(data, &options).unwrap();
    let secret = Secret::load_or_create(data).unwrap();
    FAMILY
        .iter()
        .map(|member| {
            let user = UserId::from_key(&secret.user_key(credential, *member));
            store.rows_of(user).map(Result::unwrap).collect()
        })
        .collect()
}

/// A purge of a credential with all its sub-users: the credential's own memory and both of its
/// `x-perpetuity-user` sub-users' are removed, by the admin endpoint
/// (`?credential_user=`) on a running server and by `perpetuity purge --all-subusers` on a
/// stopped one; no file holds any of their words, integrity is clean, and another credential's
/// users are untouched.
#[test]
fn a_credentials_purge_with_all_sub_users_leaves_none_of_them() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (by_admin, by_cli, other) = ("sk-purge-admin", "sk-purge-cli", "sk-purge-other");
    let credentials = [by_admin, by_cli, other];
    let server = start(&data, &upstream.url());
    for credential in credentials {
        let auth = format!("Bearer {credential}");
        for member in FAMILY {
            upstream.answer(chat_reply("Noted."));
            let mut headers = vec![
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
            ];
            if let Some(name) = member {
                headers.push(("x-perpetuity-user", name));
            }
            let answer = server
                .request(
                    "POST",
                    "/v1/chat/completions",
                    &headers,
                    &common::upstream::chat_request(&format!(
                        "Keep this safe: {}.",
                        family_canary(credential, member)
                    )),
                )
                .unwrap();
            assert_eq!(answer.status, 200, "{}", answer.text());
        }
    }
    drop(server);
    let before: Vec<Vec<Vec<Row>>> = credentials
        .iter()
        .map(|credential| family_rows(&data, credential))
        .collect();
    for rows in before.iter().flatten() {
        assert_eq!(rows.len(), 2, "each user's question and reply");
    }
    let own = |credential: &str| {
        Secret::load_or_create(&data)
            .unwrap()
            .user_key(credential, None)
    };
    let on_disk = |credential: &str| -> Vec<String> {
        FAMILY
            .iter()
            .flat_map(|member| {
                common::files_containing(&data, family_canary(credential, *member).as_bytes())
            })
            .collect()
    };

    let server = start(&data, &upstream.url());
    let both = format!(
        "/admin/purge?user={}&credential_user={}",
        own(by_admin),
        own(by_admin)
    );
    let refused = server.request("POST", &both, &[ADMIN], b"").unwrap();
    assert_eq!(refused.status, 400, "{}", refused.text());
    let answer = server
        .request(
            "POST",
            &format!("/admin/purge?credential_user={}", own(by_admin)),
            &[ADMIN],
            b"",
        )
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["rows_removed"], 6, "{}", answer.text());
    assert_eq!(answer.json()["sub_users_removed"], 2, "{}", answer.text());
    assert_integrity(&server, "after the credential's purge");
    drop(server);

    let purged = common::perpetuity(&[
        "purge",
        "--data",
        data.to_str().unwrap(),
        "--uncompressed",
        "--user",
        &own(by_cli),
        "--all-subusers",
    ]);
    let printed = String::from_utf8_lossy(&purged.stdout);
    assert!(purged.status.success(), "{printed}");
    assert!(
        printed.contains("and 2 sub-users: 6 rows removed"),
        "{printed}"
    );

    for credential in [by_admin, by_cli] {
        let hits = on_disk(credential);
        assert!(hits.is_empty(), "{credential}: purged words in {hits:?}");
        assert!(
            family_rows(&data, credential).iter().all(Vec::is_empty),
            "{credential}: rows left"
        );
    }
    assert_eq!(
        family_rows(&data, other),
        before[2],
        "another credential's users changed"
    );
    assert!(
        !on_disk(other).is_empty(),
        "the byte search finds the other credential's words"
    );
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_perpetuity"))
        .args(["integrity", "--data", data.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .status()
        .unwrap();
    assert!(status.success(), "integrity after the command's purge");
}
