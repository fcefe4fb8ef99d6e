//! Online backup and restore (`perpetuity backup`, `POST /admin/backup`, `perpetuity restore`):
//! a backup taken while clients keep capturing restores into a data directory whose integrity
//! is clean, holding every row stored before the backup began, byte for byte, and every
//! message it holds whole. Taken through the admin endpoint, through the command beside the
//! running server, and from a stopped one.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::server::Server;
use common::upstream::{Upstream, chat_reply};
use perpetuity::backup::{MANIFEST_FILE, Manifest};
use perpetuity::store::{Row, Store, StoreOptions};
use perpetuity::types::RowId;

const ADMIN: (&str, &str) = ("x-perpetuity-admin-token", "backup-test-admin");
const CLIENTS: usize = 4;

fn start(data: &Path, upstream: &str) -> Server {
    Server::start(|command| {
        command
            .args(["--data", data.to_str().unwrap()])
            .args(["--admin-token", ADMIN.1])
            .args(["--upstream", &format!("openai={upstream}")])
            .env("RUST_LOG", "warn");
    })
    .0
}

/// A server on a fresh data directory in front of an upstream that answers every request
/// "Noted.": the runtime the upstream runs on, the upstream, the folder, the data directory
/// and the server.
fn serving() -> (
    tokio::runtime::Runtime,
    Upstream,
    tempfile::TempDir,
    std::path::PathBuf,
    Server,
) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    upstream.respond_with(Arc::new(|_, _| chat_reply("Noted.")));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = start(&data, &upstream.url());
    (runtime, upstream, dir, data, server)
}

/// Say `text` as the user behind `auth` to the server on `port`; its answer must be 200.
fn tell(port: u16, auth: &str, text: &str) -> common::server::Answer {
    let body = serde_json::json!({"model": "gpt-4o",
        "messages": [{"role": "user", "content": text}]});
    let answer = common::server::request(
        port,
        "POST",
        "/v1/chat/completions",
        &[("authorization", auth)],
        body.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer
}

/// The word only client `client`'s `turn`-th request holds.
fn canary(client: usize, turn: usize) -> String {
    format!("Bkq{client}t{turn:04}Heron")
}

/// What client `client` says in its `turn`-th request: its canary, padded every third turn to
/// a message long enough to be stored in several chunks.
fn said(client: usize, turn: usize) -> String {
    let canary = canary(client, turn);
    if turn.is_multiple_of(3) {
        format!(
            "{canary}: {}",
            "the tide tables for the north harbour, again. ".repeat(120)
        )
    } else {
        format!("Keep this safe: {canary}.")
    }
}

/// Every row of a stopped store, by id.
fn rows_of(data: &Path) -> HashMap<RowId, Row> {
    let store = Store::open(data, &StoreOptions::default()).unwrap();
    store
        .rows_since(RowId(0))
        .map(|row| row.map(|row| (row.id, row)))
        .collect::<Result<_, _>>()
        .unwrap()
}

fn perpetuity(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_perpetuity"));
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("PERPETUITY_ADMIN_TOKEN");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

/// Restore `backup` into `data` with the command, which checks its integrity; returns the
/// backup's manifest.
fn restore(backup: &Path, data: &Path) -> Manifest {
    let out = perpetuity(
        &[
            "restore",
            "--from",
            backup.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
        ],
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "restore: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("0 violations"), "{stdout}");
    serde_json::from_slice(&std::fs::read(backup.join(MANIFEST_FILE)).unwrap()).unwrap()
}

/// The restored rows against the live store's final rows: every row below the backup's
/// `rows_below` is there and equal, every message there is whole, and every user message a
/// client had an answer for before the backup was asked for (its canary) is there.
fn check_restored(
    name: &str,
    restored: &HashMap<RowId, Row>,
    live: &HashMap<RowId, Row>,
    manifest: &Manifest,
    acknowledged: &[String],
) {
    assert!(manifest.rows_below > 1, "{name}: the backup saw no row");
    for id in 1..manifest.rows_below {
        let id = RowId(id);
        assert_eq!(restored.get(&id), live.get(&id), "{name}: row {id:?}");
    }
    for row in restored.values() {
        assert_eq!(
            live.get(&row.id),
            Some(row),
            "{name}: row {:?} differs",
            row.id
        );
        for chunk in 0..row.chunks {
            let id = RowId(row.message.0 + u64::from(chunk));
            assert!(
                restored.contains_key(&id),
                "{name}: message {:?} is missing chunk {chunk} of {}",
                row.message,
                row.chunks
            );
        }
    }
    let texts: Vec<&str> = restored.values().map(|row| row.text.as_str()).collect();
    for canary in acknowledged {
        assert!(
            texts.iter().any(|t| t.contains(canary)),
            "{name}: {canary}, answered before the backup began, is not in it"
        );
    }
    let longer = restored.values().filter(|row| row.chunks > 1).count();
    assert!(
        longer > 0,
        "{name}: no message of several chunks was backed up"
    );
}

#[test]
fn a_backup_taken_under_capture_load_restores_whole() {
    let (_runtime, _upstream, dir, data, server) = serving();
    let port = server.port;

    // Clients capture until told to stop; each records the turns answered so far.
    let stop = Arc::new(AtomicBool::new(false));
    let answered: Vec<_> = (0..CLIENTS)
        .map(|_| Arc::new(std::sync::Mutex::new(Vec::new())))
        .collect();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (stop, answered) = (Arc::clone(&stop), Arc::clone(&answered[client]));
            std::thread::spawn(move || {
                let auth = format!("Bearer sk-backup-client-{client}");
                let mut turn = 0;
                while !stop.load(Ordering::Relaxed) {
                    tell(port, &auth, &said(client, turn));
                    answered.lock().unwrap().push(canary(client, turn));
                    turn += 1;
                }
                turn
            })
        })
        .collect();
    let snapshot = |answered: &[Arc<std::sync::Mutex<Vec<String>>>]| -> Vec<String> {
        answered
            .iter()
            .flat_map(|a| a.lock().unwrap().clone())
            .collect()
    };
    let wait_for = |turns: usize| {
        while snapshot(&answered).len() < turns {
            std::thread::sleep(Duration::from_millis(10));
        }
    };

    // Through the admin endpoint.
    wait_for(40);
    let before_endpoint = snapshot(&answered);
    let by_endpoint = dir.path().join("by-endpoint");
    let path = by_endpoint.to_str().unwrap();
    let answer = server
        .request("POST", &format!("/admin/backup?path={path}"), &[ADMIN], b"")
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.json()["rows_below"].as_u64().unwrap() > 1);
    let again = server
        .request("POST", &format!("/admin/backup?path={path}"), &[ADMIN], b"")
        .unwrap();
    assert_eq!(
        again.status,
        409,
        "a backup never writes into an old one: {}",
        again.text()
    );
    let relative = server
        .request("POST", "/admin/backup?path=relative/dest", &[ADMIN], b"")
        .unwrap();
    assert_eq!(relative.status, 400, "{}", relative.text());

    // Through the command, beside the running server: it asks the server.
    wait_for(before_endpoint.len() + 20);
    let without_token = perpetuity(
        &[
            "backup",
            "--data",
            data.to_str().unwrap(),
            "--to",
            dir.path().join("refused").to_str().unwrap(),
        ],
        &[],
    );
    assert!(!without_token.status.success());
    let stderr = String::from_utf8_lossy(&without_token.stderr);
    assert!(stderr.contains("admin token"), "{stderr}");
    let before_command = snapshot(&answered);
    let by_command = dir.path().join("by-command");
    let out = perpetuity(
        &[
            "backup",
            "--data",
            data.to_str().unwrap(),
            "--to",
            by_command.to_str().unwrap(),
        ],
        &[("PERPETUITY_ADMIN_TOKEN", ADMIN.1)],
    );
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains(ADMIN.1)
            && !String::from_utf8_lossy(&out.stdout).contains(ADMIN.1),
        "the admin token was printed"
    );

    wait_for(before_command.len() + 20);
    stop.store(true, Ordering::Relaxed);
    let turns: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    drop(server);
    let live = rows_of(&data);

    for (name, backup, acknowledged) in [
        ("endpoint", &by_endpoint, &before_endpoint),
        ("command", &by_command, &before_command),
    ] {
        let restored_dir = dir.path().join(format!("restored-{name}"));
        let manifest = restore(backup, &restored_dir);
        let restored = rows_of(&restored_dir);
        check_restored(name, &restored, &live, &manifest, acknowledged);
        assert!(
            restored.len() < live.len(),
            "{name}: the load went on after the backup, so it holds fewer rows than the end"
        );
        println!(
            "{name}: {} of {} rows, every row below {}, {} of {turns} turns answered before it",
            restored.len(),
            live.len(),
            manifest.rows_below,
            acknowledged.len()
        );
    }
    assert!(
        !dir.path().join("refused").exists() && !dir.path().join("refused.partial").exists(),
        "a refused backup left a folder"
    );
}

#[test]
fn a_stopped_store_backs_up_and_restores_with_its_dictionary_and_secret() {
    let (_runtime, upstream, dir, data, server) = serving();
    let auth = "Bearer sk-backup-stopped";
    for turn in 0..6 {
        tell(server.port, auth, &said(0, turn));
    }
    drop(server);

    let backup = dir.path().join("backup");
    let args = |to: &Path| {
        [
            "backup".to_owned(),
            "--data".to_owned(),
            data.to_str().unwrap().to_owned(),
            "--to".to_owned(),
            to.to_str().unwrap().to_owned(),
        ]
    };
    let run = |to: &Path| {
        let args = args(to);
        perpetuity(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[])
    };
    let out = run(&backup);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refused = run(&backup);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("exists already"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(backup.join("dictionaries").read_dir().unwrap().count() == 1);
    assert!(
        !backup.join(".perpetuity-partial").exists(),
        "the work-in-progress mark goes"
    );

    // Something at `<DEST>.partial` that no backup left (a folder of someone's files, a link
    // to one) is refused and left as it was; a stopped backup's leftover is replaced.
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("keep"), b"mine").unwrap();
    let planted = dir.path().join("planted.partial");
    std::os::unix::fs::symlink(&theirs, &planted).unwrap();
    let copied = dir.path().join("copied.partial");
    std::fs::create_dir(&copied).unwrap();
    std::fs::write(copied.join("keep"), b"mine").unwrap();
    for target in ["planted", "copied"] {
        let refused = run(&dir.path().join(target));
        assert!(!refused.status.success(), "{target}");
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("exists already"),
            "{target}: {}",
            String::from_utf8_lossy(&refused.stderr)
        );
    }
    assert_eq!(std::fs::read(theirs.join("keep")).unwrap(), b"mine");
    assert_eq!(std::fs::read(copied.join("keep")).unwrap(), b"mine");
    let stopped = dir.path().join("stopped.partial");
    std::fs::create_dir(&stopped).unwrap();
    std::fs::write(stopped.join(".perpetuity-partial"), b"").unwrap();
    std::fs::write(stopped.join("half-copied"), b"x").unwrap();
    let out = run(&dir.path().join("stopped"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir.path().join("stopped/half-copied").exists());

    // Restored far from the dictionaries root it was made with: it serves on its own.
    let restored = dir.path().join("restored");
    let manifest = restore(&backup, &restored);
    assert_eq!(rows_of(&restored), rows_of(&data));
    assert_eq!(
        std::fs::read(restored.join("secret")).unwrap(),
        std::fs::read(data.join("secret")).unwrap(),
        "a restored server keys credentials as the old one did"
    );
    let server = Server::start(|command| {
        command
            .args(["--data", restored.to_str().unwrap()])
            .args([
                "--dictionaries",
                dir.path().join("nowhere").to_str().unwrap(),
            ])
            .args(["--upstream", &format!("openai={}", upstream.url())])
            .env_remove("PERPETUITY_DICTIONARIES")
            .env("RUST_LOG", "warn");
    })
    .0;
    let answer = tell(server.port, auth, "What did I ask you to keep safe?");
    assert_eq!(answer.header("x-perpetuity-memory"), Some("ok"));
    let forwarded = upstream.received().last().unwrap().body.clone();
    assert!(
        String::from_utf8_lossy(&forwarded).contains("Bkq0t0001Heron"),
        "the restored memory was recalled"
    );
    assert_eq!(manifest.serving, perpetuity::dictionary::DEFAULT_VERSION);

    // A folder that is not a backup is refused, and nothing is made.
    let bogus = perpetuity(
        &[
            "restore",
            "--from",
            data.to_str().unwrap(),
            "--data",
            dir.path().join("never").to_str().unwrap(),
        ],
        &[],
    );
    assert!(!bogus.status.success());
    assert!(
        String::from_utf8_lossy(&bogus.stderr).contains("not a backup"),
        "{}",
        String::from_utf8_lossy(&bogus.stderr)
    );
    assert!(!dir.path().join("never").exists());
}
