//! Moving a user (`perpetuity export --user`, `perpetuity import`): a LoCoMo conversation with
//! reheated and excluded rows, moved out of its store and back in, gets the same frames for
//! the same questions (same rows, scores, budget and rendered messages; only the row ids are
//! the new store's); moved into another store and purged from the old one, it leaves no byte
//! of its text behind there.

mod common;

use std::collections::HashMap;
use std::path::Path;

use perpetuity::store::{Store, StoreOptions};
use perpetuity::types::{RowId, UserId};

const USER: &str = "conv-26";
const NOW: &str = "2026-01-01T00:00:00Z";

/// `perpetuity COMMAND --data DATA --uncompressed REST...` (stored uncompressed, so a byte
/// search of the data directory finds stored text).
fn on(command: &str, data: &Path, rest: &[&str]) -> std::process::Output {
    let data = data.to_str().unwrap();
    let mut args = vec![command, "--data", data, "--uncompressed"];
    args.extend_from_slice(rest);
    common::perpetuity(&args)
}

/// [`on`], which must succeed; its standard output.
fn run(command: &str, data: &Path, rest: &[&str]) -> String {
    let out = on(command, data, rest);
    assert!(
        out.status.success(),
        "perpetuity {command} {rest:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The frame `question` gets, in probe mode, at a fixed time.
fn frame(data: &Path, question: &str) -> serde_json::Value {
    let out = run(
        "frame",
        data,
        &["--user", USER, "--now", NOW, "--json", question],
    );
    serde_json::from_str(&out).unwrap()
}

/// The frame with its row ids (the retrieved rows', the frame's, each frame message's) put
/// through `ids`. The scan's time (`scan_us`) is the one part that is not compared.
/// (the old store's to the new one's).
fn renumbered(frame: &serde_json::Value, ids: &HashMap<u64, u64>) -> serde_json::Value {
    let mut frame = frame.clone();
    let renumber = |row: &mut serde_json::Value| *row = ids[&row.as_u64().unwrap()].into();
    for entry in frame["retrieved"].as_array_mut().unwrap() {
        renumber(&mut entry["row"]);
    }
    for row in frame["frame"]["rows"].as_array_mut().unwrap() {
        renumber(row);
    }
    for message in frame["frame"]["messages"].as_array_mut().unwrap() {
        for row in message["rows"].as_array_mut().into_iter().flatten() {
            renumber(row);
        }
    }
    frame
}

/// The user's exported lines.
fn export(data: &Path, to: &Path) -> Vec<serde_json::Value> {
    let out = run("export", data, &["--user", USER]);
    std::fs::write(to, &out).unwrap();
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_locomo_user_moved_out_and_back_gets_the_same_frames() {
    let Some(file) = common::locomo_file("a_locomo_user_moved_out_and_back_gets_the_same_frames")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (old, other) = (dir.path().join("old"), dir.path().join("other"));
    for data in [&old, &other] {
        run(
            "ingest",
            data,
            &["--format", "locomo", file.to_str().unwrap()],
        );
    }
    run("purge", &other, &["--user", USER]);

    // State a fresh capture does not have: rows reheated (some listed warm) and excluded.
    let user = UserId::from_key(USER);
    {
        let options = StoreOptions {
            compression: false,
            ..StoreOptions::default()
        };
        let store = Store::open(&old, &options).unwrap();
        let rows: Vec<(RowId, u64)> = store
            .rows_of(user)
            .map(|r| r.map(|r| (r.id, r.birth_clock)).unwrap())
            .collect();
        let clock = store.clock(user).unwrap();
        let reheats: Vec<_> = rows
            .iter()
            .step_by(9)
            .enumerate()
            .map(|(i, &(row, birth))| {
                let at = birth.max(clock.saturating_sub(400 * i as u64));
                (user, row, at, 1.0 + 0.1 * i as f32)
            })
            .collect();
        store.patch_activation(&reheats).unwrap();
        let ids: Vec<RowId> = rows.iter().map(|&(id, _)| id).collect();
        store.forget_cold(user, &ids[..ids.len() / 3]).unwrap();
        store.set_excluded(user, &ids[10..14], true).unwrap();
    }
    let questions: Vec<String> = {
        let data: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        let sample = data
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["sample_id"] == USER)
            .unwrap();
        sample["qa"].as_array().unwrap()[..12]
            .iter()
            .map(|q| q["question"].as_str().unwrap().to_owned())
            .collect()
    };
    let before: Vec<_> = questions.iter().map(|q| frame(&old, q)).collect();
    let exported = export(&old, &dir.path().join("out.jsonl"));
    assert!(exported.iter().any(|l| l["warm"] == true));
    assert!(exported.iter().any(|l| l["excluded"] == true));
    assert!(exported.iter().any(|l| l["peak"].as_f64().unwrap() > 1.0));

    // Out and back in.
    run("purge", &old, &["--user", USER]);
    let gone = on("frame", &old, &["--user", USER, "Hi?"]);
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("no memory for user"),
        "the purge left the user's memory"
    );
    let out = dir.path().join("out.jsonl");
    run("import", &old, &[out.to_str().unwrap()]);
    let refused = on("import", &old, &[out.to_str().unwrap()]);
    assert!(
        !refused.status.success(),
        "a second import of the user is refused"
    );
    let back = export(&old, &dir.path().join("back.jsonl"));
    assert_eq!(back.len(), exported.len());
    let ids: HashMap<u64, u64> = exported
        .iter()
        .zip(&back)
        .filter(|(old, _)| old.get("row").is_some())
        .map(|(old, new)| (old["row"].as_u64().unwrap(), new["row"].as_u64().unwrap()))
        .collect();
    for (old_line, new_line) in exported.iter().zip(&back) {
        let strip = |line: &serde_json::Value| {
            let mut line = line.clone();
            if let Some(fields) = line.as_object_mut() {
                fields.remove("row");
                fields.remove("message");
            }
            line
        };
        assert_eq!(strip(old_line), strip(new_line), "the moved row changed");
    }
    for (question, before) in questions.iter().zip(&before) {
        assert!(!before["retrieved"].as_array().unwrap().is_empty());
        let (after, expected) = (frame(&old, question), renumbered(before, &ids));
        let changed: Vec<&String> = expected
            .as_object()
            .unwrap()
            .iter()
            .filter(|(key, value)| *key != "scan_us" && after.get(key.as_str()) != Some(value))
            .map(|(key, _)| key)
            .collect();
        assert!(
            changed.is_empty(),
            "the frame for {question:?} changed with the move in {changed:?}"
        );
    }
    let integrity = on("integrity", &old, &[]);
    assert!(
        integrity.status.success(),
        "{}",
        String::from_utf8_lossy(&integrity.stdout)
    );

    // Into another store, then purged from this one: no byte of its text stays here.
    run("import", &other, &[out.to_str().unwrap()]);
    let texts: Vec<String> = {
        let mut texts: Vec<String> = exported
            .iter()
            .filter_map(|l| l["text"].as_str().map(str::to_owned))
            .collect();
        texts.sort_by_key(|t| std::cmp::Reverse(t.len()));
        texts.truncate(5);
        texts
    };
    for text in &texts {
        assert!(!common::files_containing(&old, text.as_bytes()).is_empty());
    }
    run("purge", &old, &["--user", USER]);
    for text in &texts {
        let hits = common::files_containing(&old, text.as_bytes());
        assert!(hits.is_empty(), "{text:?} is still in {hits:?}");
        assert!(
            !common::files_containing(&other, text.as_bytes()).is_empty(),
            "the other store holds the moved user"
        );
    }
}
