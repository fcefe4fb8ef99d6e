//! Torn arena under `perpetuity serve`: between runs the arena files are truncated, overwritten
//! or flipped at random offsets; the restarted server names the damage (a typed reason in its
//! log), never panics, rebuilds from the store, and answers exactly as before: the same frame for
//! the same question, integrity clean. Its own test binary because it kills the server.
//!
//! 16 rounds; `PERPETUITY_LONG_TESTS=1` runs 200. `PERPETUITY_SEED=N` replays a run.

mod common;

use std::path::{Path, PathBuf};

use common::server::Server;
use common::upstream::{Upstream, chat_reply, chat_request};
use perpetuity::arena::file::{
    Entry, PAGES_OFFSET, SKETCH_BYTES, SKETCHES_OFFSET, TERMS_HEADER_BYTES, read_header,
};
use perpetuity::arena::{ArenaFiles, Page, arena_dir};
use perpetuity::dictionary::DEFAULT_VERSION;

const ADMIN: (&str, &str) = ("x-perpetuity-admin-token", "torn-arena-admin");
const AUTH: (&str, &str) = ("authorization", "Bearer sk-torn-arena");

fn rounds() -> usize {
    if std::env::var_os("PERPETUITY_LONG_TESTS").is_some_and(|v| v == "1") {
        200
    } else {
        16
    }
}

fn start(data: &Path, upstream: &str, log: &Path) -> Server {
    let log = std::fs::File::create(log).unwrap();
    Server::start(|command| {
        command
            .args(["--data", data.to_str().unwrap()])
            .args(["--admin-token", ADMIN.1])
            .args(["--upstream", &format!("openai={upstream}")])
            .env("RUST_LOG", "info")
            .stderr(log);
    })
    .0
}

fn chat(server: &Server, upstream: &Upstream, text: &str, probe: bool) {
    upstream.answer(chat_reply("Noted."));
    let probe = ("x-perpetuity-probe", if probe { "on" } else { "off" });
    let answer = server
        .request(
            "POST",
            "/v1/chat/completions",
            &[AUTH, probe],
            &chat_request(text),
        )
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("x-perpetuity-memory"), Some("ok"));
}

/// The frame the upstream received last, its age labels ("just now", "3 minutes before now")
/// cut, since they move with the clock.
fn last_frame(upstream: &Upstream) -> String {
    let text = upstream.received().pop().unwrap().text();
    let (mut out, mut rest) = (String::new(), text.as_str());
    while let Some(end) = rest.find(" now]") {
        let head = &rest[..end];
        out.push_str(&head[..head.rfind(", ").unwrap_or(end)]);
        out.push(']');
        rest = &rest[end + " now]".len()..];
    }
    out.push_str(rest);
    out
}

/// Bytes of each file the pages header commits (the rest is room to grow, ignored when read).
fn committed(files: &[PathBuf; 3]) -> [u64; 3] {
    let pages = std::fs::read(&files[0]).unwrap();
    let header = read_header(&pages).unwrap();
    [
        (PAGES_OFFSET + header.pages as usize * std::mem::size_of::<Page>()) as u64,
        (SKETCHES_OFFSET + header.pages as usize * SKETCH_BYTES) as u64,
        (TERMS_HEADER_BYTES + header.terms as usize * std::mem::size_of::<Entry>()) as u64,
    ]
}

/// One random kind of damage to one of the arena files, three times in four inside the bytes
/// the header commits; returns what was done.
fn damage(files: &[PathBuf; 3], next: &mut impl FnMut(u64) -> u64) -> String {
    let which = next(3) as usize;
    let inside = committed(files)[which];
    let path = &files[which];
    let mut bytes = std::fs::read(path).unwrap();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let len = bytes.len() as u64;
    let range = if next(4) == 0 { len } else { inside.min(len) };
    let at = next(range) as usize;
    let what = match next(4) {
        0 => {
            bytes.truncate(at);
            format!("{name} truncated to {at} bytes")
        }
        1 => {
            bytes[at] ^= 1 << next(8);
            format!("{name}: a bit of byte {at} flipped")
        }
        2 => {
            let span = (1 + next(4096) as usize).min(bytes.len() - at);
            for (i, b) in bytes[at..at + span].iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(31).wrapping_add(7);
            }
            format!("{name}: {span} bytes at {at} overwritten")
        }
        _ => {
            // A torn header: the first bytes of the file zeroed (the first header slot's).
            let span = 1 + next(128) as usize;
            bytes[..span].fill(0);
            format!("{name}: the first {span} bytes zeroed")
        }
    };
    std::fs::write(path, bytes).unwrap();
    what
}

#[test]
fn a_torn_arena_is_named_rebuilt_and_never_answers_wrong() {
    let mut state = common::test_seed();
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n.max(1)
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");
    let question = "Which harbour did we pick for the boat, and when do we sail?";

    let server = start(&data, &upstream.url(), &log);
    for i in 0..150 {
        chat(
            &server,
            &upstream,
            &format!(
                "Note {i}: the boat {} sails from harbour {} on day {}.",
                i % 13,
                i % 7,
                i % 29
            ),
            false,
        );
    }
    chat(&server, &upstream, question, true);
    let expected = last_frame(&upstream);
    drop(server);
    let dir_files = arena_dir(&data, DEFAULT_VERSION).unwrap();
    let files = ArenaFiles::NAMES.map(|name| dir_files.join(name));

    let (mut detected, mut harmless) = (0, Vec::new());
    for round in 0..rounds() {
        let what = damage(&files, &mut next);
        let server = start(&data, &upstream.url(), &log);
        chat(&server, &upstream, question, true);
        assert_eq!(
            last_frame(&upstream),
            expected,
            "round {round} ({what}): another frame"
        );
        let report = server
            .request("GET", "/admin/integrity", &[ADMIN], b"")
            .unwrap();
        assert_eq!(report.status, 200, "round {round}: {}", report.text());
        drop(server);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(!text.contains("panicked"), "round {round} ({what}): {text}");
        if text.contains("rebuilding it from the store") {
            detected += 1;
        } else {
            assert!(
                text.contains("Mapped"),
                "round {round} ({what}): neither rebuilt nor mapped: {text}"
            );
            harmless.push(what);
        }
    }
    println!(
        "{} rounds: {detected} damaged arenas named and rebuilt, {} harmless (past the committed \
         bytes or in unused slots) mapped as they were; every answer the same",
        rounds(),
        harmless.len()
    );
    for what in harmless {
        println!("  harmless: {what}");
    }
}
