//! Recall: one question's way from the memory to the frame. Retrieve from the user's scope,
//! reheat what was selected (the single writer of activation after birth), set the budget from
//! the spread of the scores, gather what is still warm, and fit the frame to the budget.
//!
//! The arena must be caught up by the caller (the server does it before every scan).

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::arena::Arena;
use crate::budget::Budget;
use crate::frame::{self, Candidate, Frame, Layout, Turn};
use crate::heat;
use crate::memory::Memory;
use crate::retrieve::{PreparedQuery, Retrieved, search};
use crate::scan::kernels::Kernels;
use crate::store::{Activation, StoreError};
use crate::tokens::Tokenizer;
use crate::types::{Role, RowId, UserId};

/// How a question becomes a frame. Every field has a documented default
/// (`docs/frame.md`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecallConfig {
    pub budget: Budget,
    /// Rows retrieved and reheated per question: the turn's full retrieved set before the cap.
    pub depth: usize,
    /// The top hits of the question that join the mandatory set.
    pub mandatory_hits: usize,
    /// Tokens of the current conversation's most recent stretch in the mandatory set (its last
    /// turn always, however long).
    pub recent_tokens: usize,
    /// Warmth below which a row is no longer offered to the frame.
    pub warm_floor: f32,
    /// Whether the memory tools ride along (the omission line names one only then).
    pub tools: bool,
}

impl Default for RecallConfig {
    fn default() -> Self {
        Self {
            budget: Budget::default(),
            depth: 100,
            mandatory_hits: 3,
            recent_tokens: 1_000,
            warm_floor: 0.05,
            tools: false,
        }
    }
}

/// One question to recall for.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub user: UserId,
    /// The conversation being continued, if any.
    pub conversation: Option<&'a str>,
    pub question: &'a str,
    /// Probe mode: the question is not a stored turn (it is appended after the frame) and the
    /// reheat is computed for the frame but not written, so probing changes nothing.
    pub probe: bool,
    /// Render time (Unix ms) for the labels' ages.
    pub now_ms: Option<i64>,
}

/// What one recall produced.
#[derive(Debug, Clone, Serialize)]
pub struct Recall {
    /// The full retrieved set, best first.
    pub retrieved: Vec<RetrievedRow>,
    /// The budget the spread of the scores gave (the frame's cap).
    pub budget: usize,
    /// Rows whose trajectory the reheat raised (written unless probing).
    pub reheated: usize,
    /// Rows in the scope the scan covered, and the search's time in microseconds.
    pub scanned_rows: usize,
    pub scan_us: u64,
    pub frame: Frame,
}

/// One row of the retrieved set.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RetrievedRow {
    pub row: u64,
    pub score: f32,
}

/// Recall for `ask` over the caught-up `arena` of `memory`.
pub fn recall(
    memory: &Memory,
    arena: &Arena,
    kernels: &Kernels,
    config: &RecallConfig,
    ask: &Ask<'_>,
) -> Result<Recall, StoreError> {
    let store = &memory.store;
    let started = std::time::Instant::now();
    let query = PreparedQuery::new(&memory.dictionary, arena, ask.question);
    let hits = search(
        &memory.dictionary,
        arena,
        kernels,
        &[ask.user],
        &query,
        config.depth,
    );
    let scan_us = started.elapsed().as_micros() as u64;
    let scanned_rows = arena
        .scope_pages(&[ask.user])
        .iter()
        .map(|p| p.rows as usize)
        .sum();
    let clock = store.clock(ask.user)?;
    let mut states: HashMap<RowId, Activation> =
        store.activations_of(ask.user).collect::<Result<_, _>>()?;
    let updates = reheat(ask.user, &hits, &mut states, clock);
    if !ask.probe {
        store.patch_activation(&updates)?;
    }

    let mut mandatory: HashSet<RowId> = hits
        .iter()
        .take(config.mandatory_hits)
        .map(|h| h.row)
        .collect();
    let mut turns: HashMap<RowId, Turn> = HashMap::new();
    let mut names = Names::default();
    if let Some(conversation) = ask.conversation {
        let mut stretch = 0;
        for id in store.conversation_rows_newest_first(ask.user, conversation) {
            let id = id?;
            let Some(turn) = names.turn(memory, ask.user, id)? else {
                continue;
            };
            stretch += turn.tokens;
            mandatory.insert(id);
            turns.insert(id, turn);
            if stretch >= config.recent_tokens {
                break;
            }
        }
    }

    let mut candidates = Vec::new();
    for (&id, state) in &states {
        let warmth = heat::warmth(state, clock);
        let is_mandatory = mandatory.contains(&id);
        if warmth < config.warm_floor && !is_mandatory {
            continue;
        }
        let turn = match turns.remove(&id) {
            Some(turn) => turn,
            None => match names.turn(memory, ask.user, id)? {
                Some(turn) => turn,
                None => continue,
            },
        };
        candidates.push(Candidate {
            turn,
            warmth,
            mandatory: is_mandatory,
        });
    }

    let scores: Vec<f32> = hits.iter().map(|h| h.score).collect();
    let budget = config.budget.tokens(&scores);
    let layout = Layout {
        now_ms: ask.now_ms,
        current: ask.conversation,
        probe_question: ask.probe.then_some(ask.question),
        tools: config.tools,
    };
    let tokenizer = Tokenizer::new();
    let frame = frame::fit(candidates, budget, &layout, |text| {
        tokenizer.encode(text).len()
    });
    Ok(Recall {
        retrieved: hits
            .iter()
            .map(|h| RetrievedRow {
                row: h.row.0,
                score: h.score,
            })
            .collect(),
        budget,
        reheated: updates.len(),
        scanned_rows,
        scan_us,
        frame,
    })
}

/// Reheat the retrieved rows in `states` (rank order) at clock `now`; returns the raised
/// trajectories as the store's patch list.
fn reheat(
    user: UserId,
    hits: &[Retrieved],
    states: &mut HashMap<RowId, Activation>,
    now: u64,
) -> Vec<(UserId, RowId, u64, f32)> {
    let mut updates = Vec::new();
    for (rank, hit) in hits.iter().enumerate() {
        let Some(state) = states.get_mut(&hit.row) else {
            continue;
        };
        if let Some(next) = heat::reheat(state, now, rank) {
            *state = next;
            updates.push((user, hit.row, next.last_clock, next.peak));
        }
    }
    updates
}

/// Speaker names resolved through the binding log, once per conversation and role.
#[derive(Default)]
struct Names {
    bound: HashMap<(String, Role), Option<String>>,
}

impl Names {
    /// The stored row `id` as a frame turn, its speaker resolved now; `None` if it is gone.
    fn turn(
        &mut self,
        memory: &Memory,
        user: UserId,
        id: RowId,
    ) -> Result<Option<Turn>, StoreError> {
        let Some(row) = memory.store.row(user, id)? else {
            return Ok(None);
        };
        let slot = (row.conversation.clone(), row.role);
        let bound = match self.bound.get(&slot) {
            Some(name) => name.clone(),
            None => {
                let name = memory.store.bound_name(user, &row.conversation, row.role)?;
                self.bound.insert(slot, name.clone());
                name
            }
        };
        Ok(Some(Turn {
            row: id,
            speaker: bound.or(row.name),
            tokens: row.tokens.len(),
            conversation: row.conversation,
            message: row.message,
            chunk: row.chunk,
            role: row.role,
            timestamp_ms: row.timestamp_ms,
            text: row.text,
        }))
    }
}
