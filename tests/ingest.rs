//! Bulk ingest of benchmark files, export, and the command-line contract of `ingest`,
//! `integrity` and `purge`, with real RocksDB in temp dirs.

mod common;

use std::path::Path;

use common::perpetuity;
use perpetuity::datasets::{self, DatasetError, Format};
use perpetuity::ingest::{export, ingest};
use perpetuity::integrity;
use perpetuity::store::{Cf, Store, StoreOptions, keys};
use perpetuity::types::{RowId, UserId};

const LONGMEMEVAL: &str = r#"[
  {"question_id": "q1", "question_type": "single-session-user", "question": "What is my cat called?",
   "answer": "Miso", "question_date": "2023/06/01 (Thu) 10:00",
   "haystack_session_ids": ["s1", "s2"], "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/21 (Sun) 09:00"],
   "haystack_sessions": [
     [{"role": "user", "content": "I got a cat. Her name is Miso.", "has_answer": true},
      {"role": "assistant", "content": "Lovely name!"}],
     [{"role": "user", "content": "What should I cook tonight?"}]
   ],
   "answer_session_ids": ["s1"]},
  {"question_id": "q2_abs", "question_type": "temporal-reasoning", "question": "When did I buy a car?",
   "answer": "unknown", "question_date": "2023/06/01 (Thu) 10:00",
   "haystack_session_ids": ["s9"], "haystack_dates": ["2023/05/22 (Mon) 12:00"],
   "haystack_sessions": [[{"role": "user", "content": "I like trains."}]],
   "answer_session_ids": []}
]"#;

fn store_in(dir: &Path) -> Store {
    let store = Store::open(dir, &StoreOptions::default()).unwrap();
    store
        .bind_dictionary(common::dictionary().version())
        .unwrap();
    store
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn longmemeval_ingests_with_turn_ids_and_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "lme.json", LONGMEMEVAL);
    let data = datasets::load(Format::Longmemeval, &file).unwrap();
    assert_eq!(data.messages.len(), 4);
    assert_eq!(data.questions[0].evidence_turns, ["s1:0"]);
    assert_eq!(data.questions[0].evidence_sessions, ["s1"]);
    assert!(data.questions[1].evidence_turns.is_empty());

    let store = store_in(&dir.path().join("data"));
    let summary = ingest(&store, common::dictionary(), &data.messages, |_, _| {}).unwrap();
    assert_eq!((summary.messages, summary.rows), (4, 4));
    let mut out = Vec::new();
    export(&store, Some("q1"), &mut out).unwrap();
    let rows: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4, "three rows, then their user");
    assert_eq!(rows[3]["kind"], "user");
    assert_eq!(rows[3]["user"], "q1");
    assert_eq!(rows[0]["source_turn"], "s1:0");
    assert_eq!(rows[0]["conversation"], "s1");
    assert_eq!(rows[0]["text"], "I got a cat. Her name is Miso.");
    assert_eq!(rows[0]["timestamp_ms"], 1_684_549_260_000i64);
    assert_eq!(rows[2]["conversation"], "s2");
    let report = integrity::check(&store, common::dictionary()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!((report.rows, report.users), (4, 2));
}

#[test]
fn bad_files_are_refused_with_file_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let truncated = write(dir.path(), "cut.json", &LONGMEMEVAL[..300]);
    match datasets::load(Format::Longmemeval, &truncated) {
        Err(DatasetError::Json { path, line, .. }) => {
            assert_eq!(path, truncated);
            assert!(line >= 1);
        }
        other => panic!("expected a JSON error, got {other:?}"),
    }
    let mismatched = LONGMEMEVAL.replace(r#"["s1", "s2"]"#, r#"["s1"]"#);
    let file = write(dir.path(), "mismatch.json", &mismatched);
    let err = datasets::load(Format::Longmemeval, &file).unwrap_err();
    assert!(
        matches!(err, DatasetError::Invalid { ref at, .. } if at == "q1"),
        "{err}"
    );
    let bad_date = LONGMEMEVAL.replace("2023/05/21 (Sun) 09:00", "yesterday");
    let file = write(dir.path(), "date.json", &bad_date);
    let err = datasets::load(Format::Longmemeval, &file).unwrap_err();
    assert!(err.to_string().contains("q1 session s2"), "{err}");
    let wrong_type = LONGMEMEVAL.replace(r#""has_answer": true"#, r#""has_answer": "yes""#);
    let file = write(dir.path(), "type.json", &wrong_type);
    assert!(matches!(
        datasets::load(Format::Longmemeval, &file),
        Err(DatasetError::Json { .. })
    ));
    let err = datasets::load(Format::Locomo, &dir.path().join("missing.json")).unwrap_err();
    assert!(matches!(err, DatasetError::Io { .. }), "{err}");
}

#[test]
fn command_line_ingest_integrity_purge_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let file = write(dir.path(), "lme.json", LONGMEMEVAL);
    let file = file.to_str().unwrap();

    let missing = perpetuity(&["integrity", "--data", data]);
    assert_eq!(missing.status.code(), Some(2), "no store: could not run");

    let cut = write(dir.path(), "cut.json", &LONGMEMEVAL[..300]);
    let bad = perpetuity(&[
        "ingest",
        "--data",
        data,
        "--format",
        "longmemeval",
        cut.to_str().unwrap(),
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("cut.json"));

    let ok = perpetuity(&["ingest", "--data", data, "--format", "longmemeval", file]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("4 rows"));
    let again = perpetuity(&["ingest", "--data", data, "--format", "longmemeval", file]);
    assert!(
        !again.status.success(),
        "a second ingest of the same users is refused"
    );

    let clean = perpetuity(&["integrity", "--data", data, "--json"]);
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&clean.stdout)
    );
    let report: serde_json::Value = serde_json::from_slice(&clean.stdout).unwrap();
    assert_eq!(report["rows"], 4);

    let key = keys::user_row(UserId::from_key("q1"), RowId(1));
    let saved = {
        let store = Store::open(Path::new(data), &StoreOptions::default()).unwrap();
        let saved = store.get(Cf::Retrieval, &key).unwrap().unwrap();
        store.raw_delete(Cf::Retrieval, &key).unwrap();
        saved
    };
    let broken = perpetuity(&["integrity", "--data", data]);
    assert_eq!(broken.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&broken.stdout).contains("row has a retrieval row"));
    Store::open(Path::new(data), &StoreOptions::default())
        .unwrap()
        .raw_put(Cf::Retrieval, &key, &saved)
        .unwrap();

    let purged = perpetuity(&["purge", "--data", data, "--user", "q1"]);
    assert!(
        purged.status.success(),
        "{}",
        String::from_utf8_lossy(&purged.stderr)
    );
    let after = perpetuity(&["integrity", "--data", data]);
    assert_eq!(
        after.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&after.stdout)
    );
    let exported = perpetuity(&["export", "--data", data]);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&exported.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "the one row left, then its user");
    assert_eq!(lines[0]["text"], "I like trains.");
    assert_eq!(lines[1]["kind"], "user");
    assert_ne!(lines[1]["user"], "q1");
}

#[test]
fn locomo_ingests_whole_and_checks_clean() {
    let Some(file) = common::locomo_file("locomo_ingests_whole_and_checks_clean") else {
        return;
    };
    let data = datasets::load(Format::Locomo, &file).unwrap();
    assert_eq!(data.messages.len(), 5882);
    assert_eq!(data.questions.len(), 1986);
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(dir.path());
    let summary = ingest(&store, common::dictionary(), &data.messages, |_, _| {}).unwrap();
    println!(
        "LoCoMo ingest: {} messages, {} rows in {:.2?} ({:.0} rows/s)",
        summary.messages,
        summary.rows,
        summary.elapsed,
        summary.rows_per_second()
    );
    assert!(summary.rows >= 5882);
    let started = std::time::Instant::now();
    let report = integrity::check(&store, common::dictionary()).unwrap();
    println!(
        "LoCoMo integrity: {} rows in {:.2?}",
        report.rows,
        started.elapsed()
    );
    assert!(
        report.is_clean(),
        "{:#?}",
        &report.violations[..report.violations.len().min(5)]
    );
    assert_eq!(report.users, 10);

    let mut out = Vec::new();
    export(&store, Some("conv-26"), &mut out).unwrap();
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8(out).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(first["source_turn"], "D1:1");
    assert_eq!(first["name"], "Caroline");
    assert_eq!(first["conversation"], "session_1");
    assert!(first["text"].as_str().unwrap().starts_with("Hey Mel!"));
}

/// The review's hostile export files, each imported into a store holding two users: every one
/// is refused, and the store is as it was (the same export, integrity clean). A file that
/// fails while it is written (a message that does not chunk as it was stored, after another
/// user of the file was written) leaves nothing of itself behind; a well-formed file of a new
/// user imports.
#[test]
fn hostile_export_files_are_refused_with_the_store_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let file = write(dir.path(), "lme.json", LONGMEMEVAL);
    let ok = perpetuity(&[
        "ingest",
        "--data",
        data,
        "--format",
        "longmemeval",
        file.to_str().unwrap(),
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let export_all = || String::from_utf8(perpetuity(&["export", "--data", data]).stdout).unwrap();
    let before = export_all();
    let lines: Vec<serde_json::Value> = before
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let q1_rows: Vec<serde_json::Value> = lines
        .iter()
        .filter(|l| l["user"] == "q1" && l["kind"] != "user")
        .cloned()
        .collect();
    let q1_user = lines
        .iter()
        .find(|l| l["user"] == "q1" && l["kind"] == "user")
        .unwrap()
        .clone();
    // q1's memory under a new name: a file that imports.
    let renamed = |name: &str| -> Vec<serde_json::Value> {
        let mut out: Vec<serde_json::Value> = q1_rows.clone();
        out.push(q1_user.clone());
        for line in &mut out {
            line["user"] = name.into();
        }
        out
    };
    let with = |lines: &[serde_json::Value], edit: &dyn Fn(&mut serde_json::Value)| {
        let mut lines = lines.to_vec();
        edit(&mut lines[0]);
        lines
    };
    let victim_owner = UserId::from_key("q2_abs").0;
    let long_text = "The quick brown fox jumps over the lazy dog again. ".repeat(200);
    let hostile: Vec<(&str, Vec<serde_json::Value>, &str)> = vec![
        (
            "an existing user's clock and owner",
            vec![serde_json::json!({"kind": "user", "user": "q1",
                "clock": 1000, "owner": victim_owner})],
            "already has memory",
        ),
        (
            "a clock near the top",
            with(&renamed("mallory"), &|_| {})
                .into_iter()
                .map(|mut l| {
                    if l["kind"] == "user" {
                        l["clock"] = serde_json::json!(18446744073709551606u64);
                    }
                    l
                })
                .collect(),
            "is beyond",
        ),
        (
            "no chunks",
            with(&renamed("mallory"), &|l| l["chunks"] = 0.into()),
            "chunk 0 of 0",
        ),
        (
            "negative decay",
            with(&renamed("mallory"), &|l| l["decay"] = (-5.0).into()),
            "decay",
        ),
        (
            "an infinite peak",
            with(&renamed("mallory"), &|l| {
                l["peak"] = serde_json::json!(1e39)
            }),
            "peak",
        ),
        (
            "a clock behind its rows",
            renamed("mallory")
                .into_iter()
                .map(|mut l| {
                    if l["kind"] == "user" {
                        l["clock"] = 0.into();
                    }
                    l
                })
                .collect(),
            "is behind its rows",
        ),
        (
            "rows without their user line",
            renamed("mallory")[..q1_rows.len()].to_vec(),
            "no user line",
        ),
        (
            "an owner that is a sub-user",
            {
                let mut lines = renamed("mallory");
                lines.last_mut().unwrap()["owner"] = UserId::from_key("sub").0.into();
                let mut sub = renamed("sub");
                sub.last_mut().unwrap()["owner"] = victim_owner.into();
                sub.extend(lines);
                sub
            },
            "is itself a sub-user",
        ),
        (
            "a message that does not chunk as it was stored, after another user was written",
            {
                let mut lines = renamed("written-first");
                let mut late = renamed("late");
                late[0]["text"] = long_text.clone().into();
                lines.extend(late);
                lines
            },
            "nothing of the file was kept",
        ),
    ];
    for (what, lines, says) in hostile {
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let path = write(dir.path(), "hostile.jsonl", &text);
        let out = perpetuity(&["import", "--data", data, path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: imported");
        assert!(stderr.contains(says), "{what}: {stderr}");
        assert_eq!(export_all(), before, "{what}: the store changed");
        let check = perpetuity(&["integrity", "--data", data]);
        assert_eq!(
            check.status.code(),
            Some(0),
            "{what}: {}",
            String::from_utf8_lossy(&check.stdout)
        );
    }

    let text: String = renamed("newbie").iter().map(|l| format!("{l}\n")).collect();
    let path = write(dir.path(), "newbie.jsonl", &text);
    let out = perpetuity(&["import", "--data", data, path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(export_all(), before);
    let check = perpetuity(&["integrity", "--data", data]);
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
}
