//! Crash test: kill `perpetuity ingest` at random moments; what is stored must always be whole
//! messages, a prefix of the input in order, and integrity must be clean. Its own test binary
//! because it kills processes.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use perpetuity::datasets::{self, Format};
use perpetuity::ingest::export;
use perpetuity::integrity;
use perpetuity::store::{Store, StoreOptions};

/// A LongMemEval-format file of `users` users with `turns` turns each, long enough that ingest
/// takes a while.
fn big_file(users: usize, turns: usize) -> String {
    let items: Vec<serde_json::Value> = (0..users)
        .map(|u| {
            let turns: Vec<serde_json::Value> = (0..turns)
                .map(|t| {
                    serde_json::json!({
                        "role": if t % 2 == 0 { "user" } else { "assistant" },
                        // Every 50th message is long enough to be stored as several rows.
                        "content": format!(
                            "User {u} turn {t}: we talked about the garden, the trip and the {t}th recipe. {}",
                            "More words follow here. ".repeat(if t % 50 == 49 { 150 } else { t % 7 })
                        ),
                    })
                })
                .collect();
            serde_json::json!({
                "question_id": format!("crash-{u}"),
                "question_type": "single-session-user",
                "question": "What did we talk about?",
                "answer": "the garden",
                "haystack_session_ids": ["s1"],
                "haystack_dates": ["2023/05/20 (Sat) 02:21"],
                "haystack_sessions": [turns],
                "answer_session_ids": ["s1"],
            })
        })
        .collect();
    serde_json::to_string(&items).unwrap()
}

#[test]
fn killed_ingest_leaves_whole_messages_and_a_clean_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.json");
    std::fs::write(&file, big_file(40, 2_000)).unwrap();
    let expected = datasets::load(Format::Longmemeval, &file).unwrap().messages;

    // Kill at several moments after the store is created: while the file is still being
    // parsed, early in the writes, and late in them.
    for (round, delay_ms) in [0u64, 250, 700, 1200].into_iter().enumerate() {
        let data = dir.path().join(format!("data-{round}"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_perpetuity"))
            .args([
                "ingest",
                "--data",
                data.to_str().unwrap(),
                "--format",
                "longmemeval",
            ])
            .arg(&file)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while !data.join("CURRENT").is_file() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the store never appeared"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL: no destructor, no flush
        child.wait().unwrap();

        let store = Store::open(&data, &StoreOptions::default()).unwrap();
        let report = integrity::check(&store, common::dictionary()).unwrap();
        assert!(report.is_clean(), "round {round}: {:#?}", report.violations);

        let mut out = Vec::new();
        export(&store, None, &mut out).unwrap();
        let rows: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|line| line.get("row").is_some())
            .collect();
        // Reassemble messages from their chunks: every stored message is whole, and the stored
        // messages are exactly the first n of the input, in order.
        let mut messages: Vec<String> = Vec::new();
        for row in &rows {
            let text = row["text"].as_str().unwrap();
            if row["chunk"] == 0 {
                messages.push(text.to_owned());
            } else {
                messages.last_mut().unwrap().push_str(text);
            }
        }
        if let Some(last) = rows.last() {
            assert_eq!(
                last["chunk"].as_u64().unwrap() + 1,
                last["chunks"].as_u64().unwrap(),
                "round {round}: the last stored message is cut"
            );
        }
        for (i, text) in messages.iter().enumerate() {
            assert_eq!(text, &expected[i].text, "round {round}: message {i}");
        }
        let multi = rows.iter().filter(|r| r["chunk"] == 1).count();
        assert!(
            rows.is_empty() || multi > 0,
            "round {round}: no multi-row message was stored"
        );
        println!(
            "round {round}: killed {delay_ms} ms after the store appeared, {} of {} messages stored, integrity clean",
            messages.len(),
            expected.len()
        );
    }
}
