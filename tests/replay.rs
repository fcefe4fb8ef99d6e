//! The replay evaluation end to end, through the real proxy over real RocksDB in temp dirs: a
//! hand-written Claude Code transcript (`tests/data/replay/claude-code/`: three prompts, tool
//! calls and results, a line cut short, records that are not conversation) and a Codex rollout
//! a day later (`tests/data/replay/codex/`: two prompts, shell calls, reasoning), replayed
//! under one credential; then the command line's JSON and plot.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use perpetuity::config::default_dictionaries_root;
use perpetuity::dictionary::{DEFAULT_VERSION, Dictionary};
use perpetuity::eval::replay::{self, Harness, ReplayReport, Setup, Summary};
use perpetuity::recall::RecallConfig;
use perpetuity::scan::kernels::{Ceiling, Kernels};

fn data(harness: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/replay")
        .join(harness)
}

/// Both sessions in time order (the Claude Code one is a day older).
fn sessions() -> (Vec<replay::Session>, replay::ReadCounts) {
    let (mut sessions, counts) = replay::read(Harness::ClaudeCode, &[data("claude-code")]).unwrap();
    let (codex, codex_counts) = replay::read(Harness::Codex, &[data("codex")]).unwrap();
    assert_eq!((codex_counts.files, codex_counts.not_json), (1, 0));
    sessions.extend(codex);
    (sessions, counts)
}

fn run(session_tokens: &[usize]) -> ReplayReport {
    let (sessions, counts) = sessions();
    let dictionary =
        Dictionary::load_version(&default_dictionaries_root(), DEFAULT_VERSION).unwrap();
    let setup = Setup {
        session_tokens: session_tokens.to_vec(),
        dictionary: Arc::new(dictionary),
        kernels: Kernels::detect(Ceiling::Native),
    };
    replay::run(&sessions, counts, &setup, |_| {}, |_, _| {}).unwrap()
}

/// Every share of a summary, each within [0, 1].
fn assert_shares_in_range(summary: &Summary) {
    let json = serde_json::to_value(summary).unwrap();
    for class in ["current_turn", "earlier_turns", "cross_session"] {
        for way in ["proxy", "truncation", "clearing"] {
            for kind in ["pooled", "mean_per_call"] {
                if let Some(share) = json[class][way][kind].as_f64() {
                    assert!(
                        (0.0..=1.0).contains(&share),
                        "{class} {way} {kind}: {share}"
                    );
                }
            }
        }
    }
}

#[test]
fn transcripts_are_read_into_their_model_calls() {
    let (sessions, counts) = sessions();
    assert_eq!(counts.files, 1);
    assert_eq!(counts.lines, 22);
    assert_eq!(
        counts.not_json, 1,
        "the line cut short is skipped and counted"
    );
    assert_eq!(counts.sidechain, 1);
    let claude = &sessions[0];
    assert_eq!(claude.harness, Harness::ClaudeCode);
    // Calls: read the config, read the log, explain; edit, confirm; answer.
    assert_eq!(claude.calls.len(), 6);
    assert_eq!(claude.tools, ["Read", "Bash", "Edit"]);
    assert!(
        claude.items.iter().all(|item| {
            item["content"]
                .as_array()
                .is_none_or(|blocks| blocks.iter().all(|b| b["type"] != "thinking"))
        }),
        "thinking blocks are dropped"
    );
    let codex = &sessions[1];
    assert_eq!(
        codex.calls.len(),
        4,
        "a call and its reasoning, a reply, a call, a reply"
    );
    assert!(codex.started_ms > claude.started_ms);
    assert!(codex.items.iter().all(|item| item["type"] != "reasoning"));
}

#[test]
fn replayed_sessions_are_measured_through_the_proxy() {
    let report = run(&[0, 24_000]);
    assert_eq!(report.harnesses, ["claude-code", "codex"]);
    assert_eq!((report.sessions, report.calls), (2, 10));
    assert_eq!(report.settings.len(), 2);
    let shipped = RecallConfig::default().session_tokens;
    for setting in &report.settings {
        assert_eq!(setting.shipped, setting.session_tokens == shipped);
    }
    for setting in &report.settings {
        assert_eq!(setting.failed_calls, 0, "{:?}", setting.first_failure);
        let overall = &setting.overall;
        assert_eq!((overall.calls, overall.turns), (10, 5));
        assert_shares_in_range(overall);
        let claude = &setting.by_harness["claude-code"];
        // The last answer names pool_size and migrate_orders_v2 from the first turn's tool
        // results, and the config's path: with the edit's, five earlier-turn terms.
        assert_eq!(claude.earlier_turns.terms, 5);
        assert_eq!(claude.earlier_turns.calls, 2);
        // Codex's first reply names the database address and settings.toml, which only the
        // Claude Code session of the day before held.
        let codex = &setting.by_harness["codex"];
        assert_eq!(codex.cross_session.terms, 2);
        assert_eq!(codex.cross_session.truncation.pooled, Some(0.0));
        assert_eq!(codex.cross_session.clearing.pooled, Some(0.0));
        for bucket in &overall.prompts_whole {
            assert_eq!(
                bucket.whole, bucket.calls,
                "{}: every live prompt arrives whole",
                bucket.bucket
            );
        }
        assert_eq!(overall.prompts_whole[0].calls, 10);
        assert!(overall.bytes.direct_total > 0 && overall.bytes.proxy_total > 0);
        let direct = overall.prefix.direct.tool_steps.unwrap();
        assert!(
            direct > 0.5,
            "a harness's tool step extends its request: {direct}"
        );
    }
    // With its warm tool results quoted whole, the frame shows the first turn's tool results
    // verbatim: the terms the last answer took from them are there.
    let wide = &report.settings[1].by_harness["claude-code"];
    assert_eq!(wide.earlier_turns.proxy.pooled, Some(1.0));
    assert_eq!(wide.current_turn.proxy.pooled, Some(1.0));
}

#[test]
fn the_command_line_prints_json_and_draws_the_plot() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("replay.svg");
    let calls = dir.path().join("calls.jsonl");
    let out = common::perpetuity(&[
        "eval",
        "--format",
        "claude-code",
        data("claude-code").to_str().unwrap(),
        "--session-tokens",
        "2000",
        "--json",
        "--plot",
        svg.to_str().unwrap(),
        "--per-question",
        calls.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["harnesses"], serde_json::json!(["claude-code"]));
    assert_eq!(report["calls"], 6);
    assert_eq!(report["read"]["not_json"], 1);
    assert_eq!(report["settings"][0]["session_tokens"], 2000);
    assert_eq!(report["settings"][0]["shipped"], false);
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(plot.matches("<circle").count(), 3);
    // One line per replayed call, in order, each naming its session's file.
    let lines: Vec<Value> = std::fs::read_to_string(&calls)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 6);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["session_tokens"], 2000);
        assert_eq!(line["call"]["call"], i);
        assert!(line["file"].as_str().unwrap().ends_with(".jsonl"), "{line}");
        let (turn, direct) = (&line["call"]["turn_bytes"], &line["call"]["direct_bytes"]);
        assert!(turn.as_u64().unwrap() <= direct.as_u64().unwrap(), "{line}");
    }
    assert_eq!(lines[0]["call"]["first"], true);
    let text = common::perpetuity(&[
        "eval",
        "--format",
        "codex",
        data("codex").to_str().unwrap(),
        "--session-tokens",
        "2000",
    ]);
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("eval replay (codex): 1 sessions, 4 calls"),
        "{text}"
    );
    let refused = common::perpetuity(&["eval", "--format", "codex", "--shards", "2", "x"]);
    assert!(!refused.status.success());
}
