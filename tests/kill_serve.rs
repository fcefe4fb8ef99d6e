//! Kill -9 during captures over HTTP: `perpetuity serve` in front of a scripted upstream, clients
//! that log every turn the server acknowledged, SIGKILL at random moments, restart, repeat.
//! After every kill: each acknowledged turn is stored exactly once and whole, nothing is stored
//! that was never sent, no message is stored in part, the store's integrity is clean; after
//! every restart the server found its arena undamaged and its arena equals the store
//! (`/admin/integrity`); at the end `perpetuity integrity` exits clean. Its own test binary
//! because it kills processes.
//!
//! 30 rounds; `PERPETUITY_LONG_TESTS=1` runs 500. `PERPETUITY_SEED=N` replays a run's kill
//! moments (the seed is printed).

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::server::{Server, request};
use common::upstream::{Answer, Upstream};
use perpetuity::integrity;
use perpetuity::proxy::identity::Secret;
use perpetuity::store::{Store, StoreOptions};
use perpetuity::types::{Role, UserId};

const CLIENTS: usize = 3;
const ADMIN_TOKEN: &str = "kill-test-admin";

/// Rounds of this run.
fn rounds() -> usize {
    if std::env::var_os("PERPETUITY_LONG_TESTS").is_some_and(|v| v == "1") {
        500
    } else {
        30
    }
}

/// A xorshift generator: the kill moments of a run, replayable from its seed.
struct Moments(u64);

impl Moments {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn credential(client: usize) -> String {
    format!("sk-kill-test-client-{client}")
}

/// What the clients sent and what the server acknowledged.
#[derive(Default)]
struct Ledger {
    /// Every question sent, per client.
    sent: Vec<HashSet<String>>,
    /// Questions and replies in a complete 200 answer, per client.
    acknowledged: Vec<Vec<(String, String)>>,
    /// Every reply the upstream was given to send.
    replies: HashSet<String>,
}

/// The question a client sends as its `n`th message: unique, and every seventh long enough to
/// be stored as several rows.
fn question(client: usize, n: u64) -> String {
    let filler = if n % 7 == 6 {
        "The garden needs water every morning before the heat. ".repeat(60)
    } else {
        String::new()
    };
    format!("Client {client} message {n}: remember canary kill-{client}-{n}. {filler}")
}

/// Send questions as `client` until `stop`, logging each before it is sent and each answer that
/// arrives whole. A failed request (the server was killed) ends the loop.
fn client_loop(
    client: usize,
    port: u16,
    upstream: &Upstream,
    ledger: &Mutex<Ledger>,
    counter: &AtomicU64,
    stop: &AtomicBool,
) {
    let auth = format!("Bearer {}", credential(client));
    while !stop.load(Ordering::Relaxed) {
        let n = counter.fetch_add(1, Ordering::Relaxed);
        let text = question(client, n);
        let reply = format!("Reply {n} to client {client}: noted.");
        {
            let mut ledger = ledger.lock().unwrap();
            ledger.sent[client].insert(text.clone());
            ledger.replies.insert(reply.clone());
        }
        upstream.answer(Answer::Whole(
            200,
            "application/json",
            serde_json::json!({
                "id": format!("chatcmpl-{n}"),
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                             "finish_reason": "stop"}],
            })
            .to_string()
            .into_bytes(),
        ));
        let body = serde_json::json!({
            "model": "gpt-test",
            "messages": [{"role": "user", "content": text}],
        })
        .to_string();
        let Ok(answer) = request(
            port,
            "POST",
            "/v1/chat/completions",
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
                ("x-perpetuity-conversation", "kill-test"),
            ],
            body.as_bytes(),
        ) else {
            return;
        };
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-perpetuity-memory"), Some("ok"));
        let got = answer.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        ledger.lock().unwrap().acknowledged[client].push((text, got));
    }
}

/// The checks after a kill, on the store the dead server left. Returns the stored messages.
fn check_after_kill(data: &Path, ledger: &Ledger, round: usize) -> usize {
    let store = Store::open(data, &StoreOptions::default()).unwrap();
    let secret = Secret::load_or_create(data).unwrap();
    let report = integrity::check(&store, common::dictionary()).unwrap();
    assert!(report.is_clean(), "round {round}: {:#?}", report.violations);
    let mut total = 0;
    for client in 0..CLIENTS {
        let user = UserId::from_key(&secret.user_key(&credential(client), None));
        let stored = common::stored_messages(&store, user);
        total += stored.len();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (role, text) in &stored {
            *seen.entry(text).or_default() += 1;
            let known = match role {
                Role::User => ledger.sent[client].contains(text),
                Role::Assistant => ledger.replies.contains(text),
                Role::System | Role::Tool => false,
            };
            assert!(
                known,
                "round {round}, client {client}: stored {role:?} text was never sent: {text:.80}"
            );
        }
        if let Some((text, count)) = seen.iter().find(|(_, count)| **count > 1) {
            panic!("round {round}, client {client}: stored {count} times: {text:.80}");
        }
        for (asked, replied) in &ledger.acknowledged[client] {
            for text in [asked, replied] {
                assert!(
                    seen.contains_key(text.as_str()),
                    "round {round}, client {client}: an acknowledged turn is lost: {text:.80}"
                );
            }
        }
    }
    total
}

#[test]
fn killed_serve_loses_no_acknowledged_turn_and_stores_none_in_part() {
    let seed = common::test_seed();
    let mut moments = Moments(seed);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log_path = dir.path().join("serve.log");
    let ledger = Mutex::new(Ledger {
        sent: vec![HashSet::new(); CLIENTS],
        acknowledged: vec![Vec::new(); CLIENTS],
        replies: HashSet::new(),
    });
    let counter = AtomicU64::new(0);
    let started = Instant::now();
    let (mut kills_while_starting, mut stored) = (0, 0);
    let spawn = |log: &Path| {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        Server::spawn(|command| {
            command
                .args(["--data", data.to_str().unwrap()])
                .args(["--admin-token", ADMIN_TOKEN])
                .args(["--upstream", &format!("openai={}", upstream.url())])
                .env("RUST_LOG", "info")
                .stderr(log);
        })
    };
    for round in 0..rounds() {
        let mut server = spawn(&log_path);
        if round % 5 == 4 {
            // Killed while it opens the store and the arena, before it serves.
            std::thread::sleep(Duration::from_millis(moments.below(400)));
            server.kill();
            kills_while_starting += 1;
        } else {
            server.wait_ready();
            if round > 0 {
                // The arena the last kill left was opened undamaged and equals the store.
                let check = server
                    .request(
                        "GET",
                        "/admin/integrity",
                        &[("x-perpetuity-admin-token", ADMIN_TOKEN)],
                        b"",
                    )
                    .unwrap();
                assert_eq!(check.status, 200, "round {round}: {}", check.text());
            }
            let stop = AtomicBool::new(false);
            std::thread::scope(|scope| {
                for client in 0..CLIENTS {
                    let (ledger, counter, stop, upstream) = (&ledger, &counter, &stop, &upstream);
                    let port = server.port;
                    scope.spawn(move || client_loop(client, port, upstream, ledger, counter, stop));
                }
                std::thread::sleep(Duration::from_millis(20 + moments.below(300)));
                server.kill();
                stop.store(true, Ordering::Relaxed);
            });
        }
        stored = check_after_kill(&data, &ledger.lock().unwrap(), round);
    }
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        !log.contains("arena damaged"),
        "a restart found its arena damaged:\n{}",
        log.lines()
            .filter(|l| l.contains("arena damaged"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_perpetuity"))
        .args(["integrity", "--data", data.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .status()
        .unwrap();
    assert!(status.success(), "perpetuity integrity: {status}");
    let ledger = ledger.lock().unwrap();
    let acknowledged: usize = ledger.acknowledged.iter().map(Vec::len).sum();
    let sent: usize = ledger.sent.iter().map(HashSet::len).sum();
    assert!(
        acknowledged >= rounds(),
        "too few turns were acknowledged ({acknowledged}) for the test to mean anything"
    );
    println!(
        "{} rounds ({kills_while_starting} killed while starting) in {:.1?}: {sent} questions sent, \
         {acknowledged} acknowledged (each with its reply), {stored} messages stored, lost 0, \
         partial 0, duplicated 0; integrity clean",
        rounds(),
        started.elapsed()
    );
}
