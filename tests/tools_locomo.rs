//! The memory tools on LoCoMo: all ten conversations pooled in one memory, every question with
//! turn evidence recalled as its user in probe mode (nothing written). For the questions whose
//! evidence the frame left out (some evidence turn not shown), the share that `memory_reopen`,
//! or one `memory_search` with the question's text, brings back: every evidence turn shown by
//! the frame or the tool's result. Figures are printed; `docs/benchmarks.md` records them.
//!
//! Run: `cargo test --release --test tools_locomo -- --nocapture`.

mod common;

use std::collections::{HashMap, HashSet};

use perpetuity::arena::Arena;
use perpetuity::datasets::{self, Format};
use perpetuity::ingest;
use perpetuity::memory_tools::{Call, SEARCH_LIMIT_DEFAULT, TurnState};
use perpetuity::recall::{Ask, RecallConfig, recall};
use perpetuity::scan::kernels::{Ceiling, Kernels};
use perpetuity::types::{RowId, UserId};

#[test]
fn reopen_or_one_search_recovers_evidence_the_frame_left_out() {
    let Some(path) = common::locomo_file("tools_locomo") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    let data = datasets::load(Format::Locomo, &path).unwrap();
    ingest::ingest(&memory.store, &memory.dictionary, &data.messages, |_, _| {}).unwrap();
    let mut arena = Arena::new();
    arena.catch_up(&memory.store, &memory.dictionary).unwrap();
    let kernels = Kernels::detect(Ceiling::Native);
    let config = RecallConfig {
        tools: true,
        ..RecallConfig::default()
    };

    let users: HashSet<UserId> = data
        .questions
        .iter()
        .map(|q| UserId::from_key(&q.user_key))
        .collect();
    let mut turn_of: HashMap<RowId, String> = HashMap::new();
    let mut latest: HashMap<UserId, i64> = HashMap::new();
    for &user in &users {
        for row in memory.store.rows_of(user) {
            let row = row.unwrap();
            if let Some(at) = row.timestamp_ms {
                let last = latest.entry(user).or_insert(at);
                *last = (*last).max(at);
            }
            if let Some(turn) = row.source_turn {
                turn_of.insert(row.id, turn);
            }
        }
    }

    let (mut asked, mut trimmed, mut by_reopen, mut by_search, mut by_either) = (0, 0, 0, 0, 0);
    // Evidence turns the frame left out, and those each tool brings back.
    let (mut missing, mut turns_reopened, mut turns_searched) = (0, 0, 0);
    for question in data
        .questions
        .iter()
        .filter(|q| !q.evidence_turns.is_empty())
    {
        asked += 1;
        let user = UserId::from_key(&question.user_key);
        let now_ms = latest.get(&user).copied();
        let ask = Ask {
            user,
            scope: &[user],
            conversation: None,
            question: &question.question,
            probe: true,
            hidden: &[],
            now_ms,
            pin: None,
            sent_tokens: None,
        };
        let recalled = recall(&memory, &arena, &kernels, &config, &ask).unwrap();
        let turns = |rows: &[RowId]| -> HashSet<String> {
            rows.iter()
                .filter_map(|row| turn_of.get(row).cloned())
                .collect()
        };
        let shown = turns(&recalled.frame.rows);
        let covered = |extra: &HashSet<String>| {
            question
                .evidence_turns
                .iter()
                .all(|t| shown.contains(t) || extra.contains(t))
        };
        if covered(&HashSet::new()) {
            continue;
        }
        trimmed += 1;
        let state = TurnState::new(
            user,
            &[user],
            now_ms,
            recalled.retrieved.iter().map(|r| RowId(r.row)).collect(),
            &recalled.frame.rows,
        );
        let tool = |call: &Call| {
            let outcome = state.clone().run(&memory, &arena, &kernels, call).unwrap();
            assert!(
                outcome
                    .rows
                    .iter()
                    .all(|r| !recalled.frame.rows.contains(r)),
                "a tool never repeats the frame"
            );
            turns(&outcome.rows)
        };
        let reopened = tool(&Call::Reopen);
        let searched = tool(&Call::Search {
            query: question.question.clone(),
            limit: SEARCH_LIMIT_DEFAULT,
        });
        for turn in question
            .evidence_turns
            .iter()
            .filter(|t| !shown.contains(*t))
        {
            missing += 1;
            turns_reopened += usize::from(reopened.contains(turn));
            turns_searched += usize::from(searched.contains(turn));
        }
        let (reopen, search) = (covered(&reopened), covered(&searched));
        by_reopen += usize::from(reopen);
        by_search += usize::from(search);
        by_either += usize::from(reopen || search);
    }
    let share = |n: usize| n as f64 / trimmed.max(1) as f64;
    println!(
        "LoCoMo, pooled: {asked} questions with turn evidence, {trimmed} with evidence left out of the frame; \
         recovered by memory_reopen {:.3} ({by_reopen}), by one memory_search with the question {:.3} ({by_search}), \
         by either {:.3} ({by_either})",
        share(by_reopen),
        share(by_search),
        share(by_either)
    );
    let of_missing = |n: usize| n as f64 / missing.max(1) as f64;
    println!(
        "evidence turns left out: {missing}; brought back by memory_reopen {:.3}, by the search {:.3}",
        of_missing(turns_reopened),
        of_missing(turns_searched)
    );
    assert!(trimmed > 0, "some evidence is left out of the frame");
    assert!(by_either >= by_reopen.max(by_search));
    // 0.569 when recorded in docs/benchmarks.md (0.195 when the retrieved set was the 100
    // reheated rows): a guard against losing it, not a target.
    assert!(
        share(by_either) > 0.15,
        "the tools bring back a share of what the frame left out"
    );
}
