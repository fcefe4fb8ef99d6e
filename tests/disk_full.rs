//! Disk full and I/O errors while serving: `perpetuity serve` in front of a scripted upstream,
//! its storage made to fail and then to work again while it runs. While it fails the server
//! stops acknowledging (no answer lists a capture that did not commit), `/healthz` answers 503
//! with the reason, and requests still go through, untouched; once the storage works again it
//! is ready without a restart and stores again. At the end, after a SIGKILL and a restart,
//! every acknowledged message is stored exactly once and whole, `perpetuity integrity` is
//! clean, and the server's log holds no panic. Its own test binary because it kills servers
//! and mounts a filesystem.
//!
//! Two faults: a real full disk (a small tmpfs data directory filled with a ballast file; needs
//! root and `mount`, and says SKIP without them), and injected I/O errors in every store write
//! and in the arena's growth (the `failpoints` feature's error points, switched on and off by a
//! file; `cargo test --release --features failpoints --test disk_full`).

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::server::{Answer, Server};
use common::upstream::{Upstream, chat_reply, chat_request};
use perpetuity::proxy::identity::Secret;
use perpetuity::store::{Store, StoreOptions};
use perpetuity::types::UserId;

/// How long a server may take to become ready again once its storage works.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// Requests sent at most while waiting for the fault to stop a capture.
const MAX_ASKS_TO_FAIL: usize = 600;

fn spawn(data: &Path, upstream: &Upstream, log: &Path, errors: Option<&Path>) -> Server {
    let mut server = Server::spawn_logged(data, &upstream.url(), log, |command| {
        if let Some(folder) = errors {
            command.env("PERPETUITY_FAILPOINT_ERRORS", folder);
        }
    });
    let health = server.wait_ready();
    assert_eq!(health.status, 200, "{}", health.text());
    server
}

/// What the server acknowledged, and what was sent through it.
#[derive(Default)]
struct Ledger {
    /// Acknowledged messages: credential and text.
    acknowledged: Vec<(String, String)>,
    asks: usize,
}

impl Ledger {
    /// Ask a question (each from its own credential, so its user gets a page of its own and
    /// the arena grows); `filler` words make it several rows. Returns the answer, which is
    /// always 200: the request goes through whether or not the memory works.
    fn ask(&mut self, server: &Server, upstream: &Upstream, filler: usize) -> Answer {
        let n = self.asks;
        self.asks += 1;
        let credential = format!("sk-disk-full-{n}");
        let text = format!(
            "Question {n}: remember canary disk-{n}. {}",
            "The tide tables for the northern harbour change every spring. ".repeat(filler)
        );
        let reply = format!("Noted canary disk-{n}.");
        upstream.answer(chat_reply(&reply));
        let answer = server
            .request(
                "POST",
                "/v1/chat/completions",
                &[("authorization", &format!("Bearer {credential}"))],
                &chat_request(&text),
            )
            .unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
        let captured = captured(&answer);
        if captured.contains(&"question") {
            self.acknowledged.push((credential.clone(), text));
        }
        if captured.contains(&"reply") {
            self.acknowledged.push((credential, reply));
        }
        answer
    }
}

/// What an answer says it stored (`x-perpetuity-captured`).
fn captured(answer: &Answer) -> Vec<&str> {
    answer
        .header("x-perpetuity-captured")
        .map(|list| list.split(',').map(str::trim).collect())
        .unwrap_or_default()
}

fn metric(server: &Server, name: &str) -> f64 {
    let text = server.request("GET", "/metrics", &[], b"").unwrap().text();
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no metric {name}"))
        .parse()
        .unwrap()
}

/// One outage: `inject` the fault, ask until a capture fails, check the server is not ready
/// and passes requests through untouched, `clear` the fault, wait until it is ready again,
/// check it stores again. Returns the requests that went through unacknowledged.
fn outage(
    server: &Server,
    upstream: &Upstream,
    ledger: &mut Ledger,
    filler: usize,
    inject: impl FnOnce(),
    clear: impl FnOnce(),
) -> usize {
    for _ in 0..3 {
        let answer = ledger.ask(server, upstream, filler);
        assert_eq!(captured(&answer), ["question", "reply"], "before the fault");
    }
    let failures_before = metric(server, "perpetuity_storage_failures_total");
    inject();
    let mut unacknowledged = 0;
    loop {
        let answer = ledger.ask(server, upstream, filler);
        if captured(&answer).is_empty() {
            assert_eq!(answer.header("x-perpetuity-memory"), Some("unavailable"));
            unacknowledged += 1;
            break;
        }
        assert!(
            ledger.asks < MAX_ASKS_TO_FAIL,
            "the fault never stopped a capture"
        );
    }
    let health = server.request("GET", "/healthz", &[], b"").unwrap();
    assert_eq!(health.status, 503, "{}", health.text());
    let reason = health.json()["reason"].as_str().unwrap().to_owned();
    assert!(!reason.is_empty());
    assert_eq!(metric(server, "perpetuity_ready"), 0.0);
    assert!(metric(server, "perpetuity_storage_failures_total") > failures_before);
    for _ in 0..3 {
        let answer = ledger.ask(server, upstream, filler);
        assert!(captured(&answer).is_empty(), "acknowledged while not ready");
        assert_eq!(answer.header("x-perpetuity-memory"), Some("unavailable"));
        let forwarded = upstream.received().pop().unwrap().json();
        let sent = forwarded["messages"].as_array().unwrap();
        assert_eq!(sent.len(), 1, "not the harness's own messages: {forwarded}");
        assert!(
            sent[0]["content"]
                .as_str()
                .unwrap()
                .starts_with(&format!("Question {}:", ledger.asks - 1))
        );
        unacknowledged += 1;
    }
    clear();
    let started = Instant::now();
    loop {
        let health = server.request("GET", "/healthz", &[], b"").unwrap();
        if health.status == 200 {
            break;
        }
        assert!(
            started.elapsed() < RECOVERY_TIMEOUT,
            "not ready {RECOVERY_TIMEOUT:?} after the fault cleared: {}",
            health.text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "  not ready: {reason}; ready again {} ms after the fault cleared",
        started.elapsed().as_millis()
    );
    for _ in 0..3 {
        let answer = ledger.ask(server, upstream, filler);
        assert_eq!(captured(&answer), ["question", "reply"], "after recovery");
    }
    assert_eq!(metric(server, "perpetuity_ready"), 1.0);
    unacknowledged
}

/// Restart after a SIGKILL; then every acknowledged message is stored exactly once and whole,
/// integrity is clean, and the log holds no panic.
fn check_after_restart(
    data: &Path,
    upstream: &Upstream,
    log: &Path,
    mut server: Server,
    ledger: &Ledger,
) {
    server.kill();
    drop(spawn(data, upstream, log, None));
    let secret = Secret::load_or_create(data).unwrap();
    let store = Store::open(data, &StoreOptions::default()).unwrap();
    for (credential, text) in &ledger.acknowledged {
        let user = UserId::from_key(&secret.user_key(credential, None));
        let stored = common::stored_messages(&store, user);
        let copies = stored.iter().filter(|(_, t)| t == text).count();
        assert_eq!(copies, 1, "{text:?} stored {copies} times");
    }
    drop(store);
    let status = Command::new(env!("CARGO_BIN_EXE_perpetuity"))
        .args(["integrity", "--data", data.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .status()
        .unwrap();
    assert!(status.success(), "perpetuity integrity {status}");
    let text = std::fs::read_to_string(log).unwrap();
    assert!(!text.contains("panicked"), "{text}");
}

/// Whether this process may mount a tmpfs at `at` (root, and `mount` allowed here).
fn mount_tmpfs(at: &Path, size_mb: u64) -> bool {
    std::fs::create_dir_all(at).unwrap();
    Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
        .arg(at)
        .status()
        .is_ok_and(|s| s.success())
}

/// Unmounts the tmpfs when dropped, whatever happened.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Write `path` in 1 MiB, then 4 KiB pieces until the filesystem is full; returns its bytes.
fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).unwrap();
    let mut written = 0u64;
    for piece in [1 << 20, 4 << 10] {
        let block = vec![0x5a_u8; piece];
        while file.write_all(&block).is_ok() {
            written += piece as u64;
        }
    }
    let _ = file.sync_all();
    written
}

/// A real full disk. The data directory is a 192 MiB tmpfs: RocksDB resumes writing on its own
/// once one write buffer (64 MiB) is free again, so the filesystem must be larger than that.
/// A ballast file fills it until ENOSPC and is then cut to leave 16 MiB, before the server
/// creates its store (its manifest preallocates 4 MiB, the arena's files 1 MiB each): RocksDB's
/// 70 MiB log preallocation fails then, as on any nearly full disk, so the writes meet the full
/// disk rather than preallocated room. The server stores until the disk is full; the ballast is
/// then deleted.
#[test]
fn a_full_disk_stops_acknowledging_and_recovers_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("tmpfs");
    if !mount_tmpfs(&mount, 192) {
        println!("SKIP a_full_disk: mounting a tmpfs needs root and mount (not possible here)");
        return;
    }
    let _mounted = Mounted(mount.clone());
    let (data, ballast) = (mount.join("data"), mount.join("ballast"));
    let log = dir.path().join("serve.log");
    let filled = fill(&ballast);
    std::fs::File::options()
        .write(true)
        .open(&ballast)
        .unwrap()
        .set_len(filled - (16 << 20))
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    let mut ledger = Ledger::default();
    let server = spawn(&data, &upstream, &log, None);
    let unacknowledged = outage(
        &server,
        &upstream,
        &mut ledger,
        400,
        || {},
        || std::fs::remove_file(&ballast).unwrap(),
    );
    check_after_restart(&data, &upstream, &log, server, &ledger);
    println!(
        "a full disk ({} MiB of ballast): {} requests, {} acknowledged messages, {} requests \
         passed through unacknowledged; lost 0, integrity clean",
        filled >> 20,
        ledger.asks,
        ledger.acknowledged.len(),
        unacknowledged
    );
}

/// Injected I/O errors: every store write, then the arena's growth, failing while a switch
/// file exists.
#[cfg(feature = "failpoints")]
#[test]
fn injected_io_errors_stop_acknowledging_and_recover_when_they_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (data, log, errors) = (
        dir.path().join("data"),
        dir.path().join("serve.log"),
        dir.path().join("errors"),
    );
    std::fs::create_dir_all(&errors).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    let mut ledger = Ledger::default();
    let server = spawn(&data, &upstream, &log, Some(errors.as_path()));
    let mut unacknowledged = 0;
    for point in ["store.write", "arena.grow"] {
        let switch = errors.join(point);
        println!("{point}:");
        unacknowledged += outage(
            &server,
            &upstream,
            &mut ledger,
            4,
            || std::fs::write(&switch, b"").unwrap(),
            || std::fs::remove_file(&switch).unwrap(),
        );
    }
    check_after_restart(&data, &upstream, &log, server, &ledger);
    println!(
        "injected I/O errors (store.write, arena.grow): {} requests, {} acknowledged messages, \
         {} requests passed through unacknowledged; lost 0, integrity clean",
        ledger.asks,
        ledger.acknowledged.len(),
        unacknowledged
    );
}
