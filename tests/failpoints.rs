//! Crash points inside our own code (the `failpoints` feature): `perpetuity serve` aborts
//! between a capture's commit and its acknowledgement (before the arena appends it), mid arena
//! append, mid arena commit, after a purge's batch and mid purge compaction. After each crash
//! the restarted server finds its arena undamaged, its arena equals the store, integrity is
//! clean, every acknowledged turn is stored once and whole, and a purge is whole or absent and
//! completes when asked again. A dictionary swap crashed mid re-derivation, just before and
//! just after its flip leaves the old version serving (the dark one resumed, reported as
//! progress) or the new one, integrity clean each time. Its own test binary because its server
//! aborts.
//!
//! `cargo test --release --features failpoints --test failpoints`.

#![cfg(feature = "failpoints")]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::server::Server;
use common::upstream::{Upstream, chat_reply, chat_request};
use perpetuity::dictionary::DEFAULT_VERSION;
use perpetuity::proxy::identity::Secret;
use perpetuity::store::{Store, StoreOptions};
use perpetuity::types::{Role, UserId};

const ADMIN: (&str, &str) = ("x-perpetuity-admin-token", "failpoints-admin");

fn spawn(data: &Path, upstream: &Upstream, log: &Path, failpoint: Option<&str>) -> Server {
    let mut server = Server::spawn_logged(data, &upstream.url(), log, |command| {
        command.args(["--uncompressed", "--admin-token", ADMIN.1]);
        if let Some(point) = failpoint {
            command.env("PERPETUITY_FAILPOINT", point);
        }
    });
    server.wait_ready();
    server
}

/// Ask `text` as `credential`; `Some(reply)` when the answer came back whole (the reply is
/// read from it: a request that died before the upstream leaves its scripted answer queued).
fn ask(server: &Server, upstream: &Upstream, credential: &str, text: &str) -> Option<String> {
    let reply = format!("Noted: {text}");
    upstream.answer(chat_reply(&reply));
    let answer = server
        .request(
            "POST",
            "/v1/chat/completions",
            &[("authorization", &format!("Bearer {credential}"))],
            &chat_request(text),
        )
        .ok()?;
    assert_eq!(answer.status, 200, "{}", answer.text());
    Some(
        answer.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned(),
    )
}

/// Wait for the aborted server to be gone.
fn wait_dead(server: &mut Server, point: &str) {
    let started = Instant::now();
    while server.running() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{point}: the server never reached its crash point"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// After a crash: restart, check the arena and integrity through the server, stop it.
fn restart_and_check(data: &Path, upstream: &Upstream, log: &Path, point: &str) {
    let server = spawn(data, upstream, log, None);
    let report = server
        .request("GET", "/admin/integrity", &[ADMIN], b"")
        .unwrap();
    assert_eq!(report.status, 200, "{point}: {}", report.text());
    drop(server);
    let text = std::fs::read_to_string(log).unwrap();
    assert!(
        text.contains(&format!(
            "failpoint {}: aborting",
            point.split(':').next().unwrap()
        )),
        "{point}: the crash point was never reached"
    );
    assert!(!text.contains("arena damaged"), "{point}: {text}");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_perpetuity"))
        .args(["integrity", "--data", data.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .status()
        .unwrap();
    assert!(status.success(), "{point}: perpetuity integrity {status}");
}

fn user_of(data: &Path, credential: &str) -> UserId {
    UserId::from_key(
        &Secret::load_or_create(data)
            .unwrap()
            .user_key(credential, None),
    )
}

#[test]
fn a_crash_at_each_point_of_a_capture_recovers_clean() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    // `arena.mid_append:2`: the first append of the second request's catch-up (the first
    // reply), before the question after it and before the commit. Each request's catch-up
    // commits once: the first (1 row) computes the codebook, the second (3 rows) does not, the
    // third (5 rows, 4 × 1 reached) computes it again and re-encodes the page that the first two
    // sealed. `arena.mid_recode:2` stops inside that re-encoding, `arena.mid_seal:2` inside the
    // second commit's seal of the page, `arena.mid_seal:3` and `arena.mid_commit:3` inside the
    // third commit's, after the re-encoding (the second with the new codebook written).
    for point in [
        "store.after_commit:3",
        "arena.mid_append:2",
        "arena.mid_commit:2",
        "arena.mid_recode:2",
        "arena.mid_seal:2",
        "arena.mid_seal:3",
        "arena.mid_commit:3",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (data, log) = (dir.path().join("data"), dir.path().join("serve.log"));
        let mut server = spawn(&data, &upstream, &log, Some(point));
        let mut acknowledged = Vec::new();
        for i in 0.. {
            let text = format!("Turn {i} before the crash at {point}.");
            match ask(&server, &upstream, "sk-failpoints", &text) {
                Some(reply) => acknowledged.extend([text, reply]),
                None => break,
            }
            assert!(i < 50, "{point}: never reached");
        }
        wait_dead(&mut server, point);
        restart_and_check(&data, &upstream, &log, point);

        let store = Store::open(&data, &StoreOptions::default()).unwrap();
        let stored = common::stored_messages(&store, user_of(&data, "sk-failpoints"));
        for text in &acknowledged {
            let copies = stored.iter().filter(|(_, t)| t == text).count();
            assert_eq!(copies, 1, "{point}: {text:?} stored {copies} times");
        }
        assert!(
            stored
                .iter()
                .all(|(role, text)| matches!(role, Role::User | Role::Assistant)
                    && text.contains("before the crash at")),
            "{point}: {stored:?}"
        );
        println!(
            "{point}: crashed after {} acknowledged turns; {} messages stored, none lost, \
             integrity clean",
            acknowledged.len(),
            stored.len()
        );
    }
}

#[test]
fn a_crash_inside_a_purge_leaves_it_whole_or_absent_and_it_completes_when_asked_again() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    for point in ["purge.after_batch", "purge.mid_compaction"] {
        let dir = tempfile::tempdir().unwrap();
        let (data, log) = (dir.path().join("data"), dir.path().join("serve.log"));
        let server = spawn(&data, &upstream, &log, None);
        for (credential, canary) in [("sk-purged", "Vqz7Heron"), ("sk-kept", "Vqz8Osprey")] {
            for i in 0..5 {
                ask(
                    &server,
                    &upstream,
                    credential,
                    &format!("Keep {canary}{i} safe."),
                )
                .unwrap();
            }
        }
        drop(server);
        let (purged, kept) = (user_of(&data, "sk-purged"), user_of(&data, "sk-kept"));
        let kept_before =
            common::stored_messages(&Store::open(&data, &StoreOptions::default()).unwrap(), kept);
        let key = Secret::load_or_create(&data)
            .unwrap()
            .user_key("sk-purged", None);
        let purge = format!("/admin/purge?user={key}");

        let mut server = spawn(&data, &upstream, &log, Some(point));
        assert!(server.request("POST", &purge, &[ADMIN], b"").is_err());
        wait_dead(&mut server, point);
        restart_and_check(&data, &upstream, &log, point);
        {
            let store = Store::open(&data, &StoreOptions::default()).unwrap();
            let left = common::stored_messages(&store, purged).len();
            assert!(
                left == 0 || left == 10,
                "{point}: {left} of 10 messages left"
            );
            assert_eq!(common::stored_messages(&store, kept), kept_before);
            println!("{point}: after the crash the purged user holds {left} of 10 messages");
        }

        let server = spawn(&data, &upstream, &log, None);
        let answer = server.request("POST", &purge, &[ADMIN], b"").unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
        drop(server);
        for i in 0..5 {
            let hits = common::files_containing(&data, format!("Vqz7Heron{i}").as_bytes());
            assert!(hits.is_empty(), "{point}: purged text in {hits:?}");
        }
        assert!(!common::files_containing(&data, b"Vqz8Osprey0").is_empty());
    }
}

/// `perpetuity ARGS` on the data directory, with a crash point armed or not; its exit status
/// and stderr.
fn perpetuity(args: &[&str], failpoint: Option<&str>) -> (std::process::ExitStatus, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_perpetuity"));
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("PERPETUITY_FAILPOINT");
    if let Some(point) = failpoint {
        command.env("PERPETUITY_FAILPOINT", point);
    }
    let output = command.output().unwrap();
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_crash_mid_rederivation_and_around_the_flip_leaves_one_version_serving() {
    use perpetuity::capture::{Capturer, Message};
    use perpetuity::config::default_dictionaries_root;
    use perpetuity::integrity;

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap();
    // More rows than one re-derivation batch, so a crash can fall between two.
    let rows = perpetuity::swap::REDERIVE_BATCH_ROWS + 2_000;
    {
        let memory = common::memory(&data);
        let messages: Vec<Message> = (0..rows)
            .map(|i| Message {
                user_key: format!("user-{}", i % 7),
                conversation: format!("c{}", i / 50),
                role: Role::User,
                name: None,
                timestamp_ms: None,
                source_turn: None,
                text: format!("Entry {i}: the ferry left pier {} at dawn.", i % 31),
            })
            .collect();
        for chunk in messages.chunks(4_096) {
            Capturer::new(&memory.dictionary)
                .capture(&memory.store, chunk)
                .unwrap();
        }
    }
    let check = |serving: &str, dark: Option<(&str, bool)>| {
        let memory = perpetuity::memory::Memory::open(
            &data,
            &default_dictionaries_root(),
            None,
            &StoreOptions::default(),
        )
        .unwrap();
        assert_eq!(memory.dictionary.version(), serving);
        let found = memory.store.dark().unwrap();
        assert_eq!(
            found.as_ref().map(|d| (d.version.as_str(), d.is_derived())),
            dark,
            "{found:?}"
        );
        let report = integrity::check(&memory.store, &memory.dictionary).unwrap();
        assert!(report.is_clean(), "{:?}", report.violations);
        let mut report = integrity::Report::default();
        integrity::check_arena_files(&memory.store, &memory.dictionary, &mut report).unwrap();
        assert!(report.is_clean(), "{:?}", report.violations);
    };
    let v2 = default_dictionaries_root().join("v2");

    let (status, stderr) = perpetuity(
        &["dict", "install", "--data", data_arg, v2.to_str().unwrap()],
        Some("dict.mid_derive"),
    );
    assert!(
        !status.success() && stderr.contains("failpoint dict.mid_derive"),
        "{stderr}"
    );
    check(DEFAULT_VERSION, Some(("v2", false)));
    let (status, listed) = {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_perpetuity"))
            .args(["dict", "list", "--data", data_arg])
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        (
            output.status,
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    assert!(status.success());
    let batch = perpetuity::swap::REDERIVE_BATCH_ROWS;
    // Listed in version name order.
    assert_eq!(
        listed,
        format!("v2\tderiving {batch}/{rows}\n{DEFAULT_VERSION}\tserving\n")
    );

    // The flip resumes the derivation, builds the arena, and dies before its write.
    let (status, stderr) = perpetuity(
        &["dict", "flip", "--data", data_arg, "v2"],
        Some("dict.before_flip"),
    );
    assert!(
        !status.success() && stderr.contains("failpoint dict.before_flip"),
        "{stderr}"
    );
    check(DEFAULT_VERSION, Some(("v2", true)));

    // Written, then dead before the retired slot was cleared: the next open clears it.
    let (status, stderr) = perpetuity(
        &["dict", "flip", "--data", data_arg, "v2"],
        Some("dict.after_flip"),
    );
    assert!(
        !status.success() && stderr.contains("failpoint dict.after_flip"),
        "{stderr}"
    );
    check("v2", None);
    let (status, stderr) = perpetuity(&["integrity", "--data", data_arg], None);
    assert!(status.success(), "{stderr}");
}
