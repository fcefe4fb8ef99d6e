//! Stored turns are their owner's alone: `perpetuity serve` started under a permissive umask
//! (022) in a data directory that is world-readable (0755) leaves the directory 0700 and
//! every file and folder inside it without group or other bits, the store's and the arena's
//! included. Its own test binary because it sets the process's umask, which the server
//! inherits.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use common::server::Server;
use common::upstream::{Upstream, chat_reply, chat_request};

/// Every file and folder under `dir` with its permission bits.
fn modes(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        found.push((path.clone(), meta.permissions().mode() & 0o777));
        if meta.is_dir() {
            found.extend(modes(&path));
        }
    }
    found
}

#[test]
fn the_data_directory_and_every_file_in_it_are_the_owners_alone_under_umask_022() {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();

    let log = dir.path().join("serve.log");
    let mut server = Server::spawn_logged(&data, &upstream.url(), &log, |_| {});
    assert_eq!(server.wait_ready().status, 200);
    for question in [
        "Where did Oskar leave the lantern?",
        "Which ferry did Oskar take after that?",
    ] {
        upstream.answer(chat_reply("By the boathouse."));
        let answer = server
            .request(
                "POST",
                "/v1/chat/completions",
                &[
                    ("authorization", "Bearer sk-modes"),
                    ("content-type", "application/json"),
                ],
                &chat_request(question),
            )
            .unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    server.kill();

    let found = modes(&data);
    let names: Vec<String> = found
        .iter()
        .map(|(path, _)| path.strip_prefix(&data).unwrap().display().to_string())
        .collect();
    for expected in ["secret", "CURRENT"] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
    }
    for expected in ["pages.bin", "sketches.bin", "terms.bin"] {
        assert!(
            names.iter().any(|n| n.ends_with(expected)),
            "{expected}: {names:?}"
        );
    }
    assert!(
        names.iter().any(|n| n.ends_with(".log")),
        "a WAL: {names:?}"
    );
    let open: Vec<String> = found
        .iter()
        .filter(|(_, mode)| mode & 0o077 != 0)
        .map(|(path, mode)| format!("{} {mode:o}", path.display()))
        .collect();
    assert!(open.is_empty(), "readable by others: {open:#?}");
    let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the data directory is {mode:o}");
    println!(
        "{} files and folders in the data directory, none with group or other bits",
        found.len()
    );
}
