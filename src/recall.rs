//! Recall: one question's way from the memory to the frame. Retrieve from the user's scope,
//! reheat what was selected (the single writer of activation after birth), set the budget from
//! the spread of the scores, gather what is still warm, and fit the frame to the budget.
//!
//! The arena must be caught up by the caller (the server does it before every scan).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rayon::prelude::*;
use serde::Serialize;

use crate::arena::{Arena, Slot};
use crate::budget::Budget;
use crate::dictionary::Dictionary;
use crate::frame::{self, Candidate, Frame, Layout, Omitted, Pick, Turn};
use crate::heat;
use crate::memory::Memory;
use crate::retrieve::{PreparedQuery, Retrieved, search_without};
use crate::scan::kernels::Kernels;
use crate::store::{Activation, BoundNames, Row, Store, StoreError};
use crate::tokens::Tokenizer;
use crate::types::{ConversationId, Role, RowId, TermId, UserId};

/// How a question becomes a frame. Every field has a documented default
/// (`docs/frame.md`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecallConfig {
    pub budget: Budget,
    /// Rows reheated per question: the best of the retrieved set in the frame's order, whose
    /// scores set the budget.
    pub depth: usize,
    /// Rows retrieved per question: the search's result, ranked by the frame's order
    /// ([`frame_order`]); what the frame leaves out of them, `memory_reopen` returns.
    pub reach: usize,
    /// Share of the best score in a row's conversation added to the row's score in the
    /// frame's order.
    pub conversation_lift: f32,
    /// Added to the score of a row whose speaker the question names, in the frame's order.
    pub speaker_lift: f32,
    /// Share of its score a row of the model (an assistant's, unless both sides of its
    /// conversation have a name: [`Speaker::model`]) keeps in the frame's order, before the
    /// lifts.
    pub model_weight: f32,
    /// Conversations in the frame's order whose first turn joins the retrieved set, right
    /// after the conversation's best row ([`with_openers`]): at the default, every
    /// conversation the retrieved set holds.
    pub openers: usize,
    /// The top hits of the question that join the mandatory set.
    pub mandatory_hits: usize,
    /// Tokens of the current conversation's most recent stretch ([`stretch`]: its last turn
    /// always, however long): in the mandatory set, read beside the question and passed over
    /// by the search ([`question_query`]).
    pub recent_tokens: usize,
    /// Tokens of a working session's (a conversation whose stretch holds tool rows) tool
    /// messages its stretch quotes whole while they are warm ([`stretch`]). The stretch's part
    /// beyond `recent_tokens` is framed on top of the budget.
    pub session_tokens: usize,
    /// The share of the history a harness sent ([`Ask::sent_tokens`]) that the rest of a
    /// working session's stretch takes at most (its prompts, the assistant's words and calls,
    /// older tool messages by their preview): the frame stands in for that history, in a
    /// fraction of its size.
    pub session_share: f32,
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
            reach: 256,
            conversation_lift: 0.7,
            speaker_lift: 0.05,
            model_weight: 0.8,
            openers: 256,
            mandatory_hits: 3,
            recent_tokens: 1_000,
            session_tokens: 24_000,
            session_share: 0.3,
            warm_floor: 0.05,
            tools: false,
        }
    }
}

/// One question to recall for.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// Who asks: whose clock, heat and conversation the recall reads and writes.
    pub user: UserId,
    /// Whose rows the search reads: `[user]`, or the members of the asker's group scope (the
    /// asker among them). Other members' rows join the frame by this question's ranking; their
    /// heat is theirs, so the reheat is written for the asker's own rows only.
    pub scope: &'a [UserId],
    /// The conversation being continued, if any.
    pub conversation: Option<&'a str>,
    pub question: &'a str,
    /// Probe mode: the question is not a stored turn (it is appended after the frame) and the
    /// reheat is computed for the frame but not written, so probing changes nothing.
    pub probe: bool,
    /// Rows passed over this time as if excluded: a tool round continued after a restart hides
    /// its own question and what followed it, which it forwards itself.
    pub hidden: &'a [RowId],
    /// Render time (Unix ms) for the labels' ages.
    pub now_ms: Option<i64>,
    /// The kept part of this working session's last frame, if any ([`Pin`]).
    pub pin: Option<&'a Pin>,
    /// Tokens of the history the harness sent before the live turn (estimated from its bytes),
    /// when a harness sent one: a working session's stretch takes at most `session_share` of
    /// it.
    pub sent_tokens: Option<usize>,
}

/// What a working session's frame keeps from turn to turn, so that each turn's frame starts
/// with the last one's and the provider's prefix cache serves it (a new turn otherwise rebuilds
/// the frame from its first byte). Made by a recall whose stretch holds tool rows; a later
/// recall in the same conversation given it ([`Ask::pin`]) walks the stretch back to the same
/// first row, shows the rows it kept as it showed them (whole or by their preview), renders the
/// layers of the turns before in order ([`frame::Layer`]), and adds a layer: the new question's
/// top hits and what the session did since, and nothing else. Once the stretch would outgrow
/// twice its room, the frame is made afresh and so is its pin.
#[derive(Debug, Clone, PartialEq)]
pub struct Pin {
    /// The stretch's oldest row.
    pub anchor: RowId,
    /// The stretch's rows, in row id order, each with whether it is shown by its preview.
    pub kept: Vec<(RowId, bool)>,
    /// The frame's layers, oldest first.
    pub layers: Vec<frame::Layer>,
}

impl Pin {
    /// The newest row of the stretch it kept.
    fn through(&self) -> RowId {
        self.layers
            .last()
            .map_or(self.anchor, |layer| layer.through)
    }

    /// Every row it shows outside the stretch, in row id order.
    fn rest(&self) -> Vec<RowId> {
        let mut rest: Vec<RowId> = self
            .layers
            .iter()
            .flat_map(|layer| layer.rest.iter().copied())
            .collect();
        rest.sort_unstable();
        rest
    }
}

impl<'a> Ask<'a> {
    /// A probe of one user's own memory (what `perpetuity frame` and the inspector ask):
    /// `user` is the one-element slice of the asker, nothing hidden, nothing written.
    pub fn probe(
        user: &'a [UserId; 1],
        conversation: Option<&'a str>,
        question: &'a str,
        now_ms: i64,
    ) -> Self {
        Self {
            user: user[0],
            scope: user,
            conversation,
            question,
            probe: true,
            hidden: &[],
            now_ms: Some(now_ms),
            pin: None,
            sent_tokens: None,
        }
    }
}

/// What one recall produced.
#[derive(Debug, Clone, Serialize)]
pub struct Recall {
    /// The full retrieved set (`reach` rows, and the openers of `openers` conversations), best
    /// first in the frame's order, with the lifted scores; the first `depth` were reheated.
    pub retrieved: Vec<RetrievedRow>,
    /// The budget the spread of the scores gave (the frame's cap), and that spread
    /// ([`crate::budget::spread`] of the first `depth` scores).
    pub budget: usize,
    pub spread: f64,
    /// The asker's token clock the warmth was read at.
    pub clock: u64,
    /// Rows whose trajectory the reheat raised (written unless probing).
    pub reheated: usize,
    /// Rows in the scope the scan covered, and the search's time in microseconds.
    pub scanned_rows: usize,
    pub scan_us: u64,
    pub frame: Frame,
    /// Every row offered to the frame (warm enough, or mandatory), the retrieved and the
    /// still-warm alike; what is not in `frame.rows` of them the cap left out. Not serialised:
    /// a user may hold tens of thousands of warm rows (the inspector's "why" reads it).
    #[serde(skip)]
    pub offered: Vec<Pick>,
    /// What the next turn of this working session keeps of the frame (none for a chat, and
    /// in probe mode).
    #[serde(skip)]
    pub pin: Option<Pin>,
}

/// One row of the retrieved set.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RetrievedRow {
    pub row: u64,
    pub score: f32,
    /// For the first `depth` rows: the warmth at the clock once this recall's reheat is
    /// applied, the peak the row's rank earned ([`heat::reheat_peak`]; another group member's
    /// row keeps its own heat and earns none), and whether that peak raised its trajectory.
    pub warmth: Option<f32>,
    pub reheat: Option<f32>,
    pub raised: bool,
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
    let mut excluded = store.scope_exclusions(ask.scope)?;
    excluded.extend(ask.hidden.iter().copied());
    // The current conversation's most recent stretch joins the mandatory set. The question is
    // read beside it, and the search passes over it: the frame holds it whatever is found.
    let stretch = stretch(store, arena, ask, config, &excluded)?;
    // What the session's last frame showed outside its stretch, where the stretch could keep
    // its first row.
    let pinned = ask.pin.filter(|_| stretch.anchored);
    let kept: Vec<RowId> = pinned.map_or_else(Vec::new, Pin::rest);
    let started = std::time::Instant::now();
    let query = question_query(
        &memory.dictionary,
        arena,
        ask,
        &stretch.rows[..stretch.recent],
    );
    let passed_over: HashSet<RowId> = excluded.iter().copied().chain(stretch.ids()).collect();
    let found = search_without(
        &memory.dictionary,
        arena,
        kernels,
        ask.scope,
        &query,
        config.reach.max(config.depth),
        &passed_over,
    );
    let scan_us = started.elapsed().as_micros() as u64;
    // Speakers are resolved only where one can move a row.
    let speakers = if config.speaker_lift > 0.0 || config.model_weight != 1.0 {
        speakers(memory, arena, &query, &found)?
    } else {
        vec![Speaker::default(); found.len()]
    };
    let conversations: Vec<(UserId, u64)> = found
        .iter()
        .map(|hit| (hit.user, conversation_in(arena, hit.row)))
        .collect();
    let ordered = with_openers(
        store,
        arena,
        frame_order(found, &conversations, &speakers, config),
        ask.conversation.map(ConversationId::from_key),
        &excluded,
        config.openers,
    )?;
    let hits = &ordered[..ordered.len().min(config.depth)];
    let scanned_rows = arena.scope_rows(ask.scope);
    let clock = stretch.clock;
    let mut states = warm_states(
        store,
        arena,
        ask,
        clock,
        config.warm_floor,
        hits,
        &stretch
            .rows
            .iter()
            .copied()
            .chain(kept.iter().filter_map(|&row| Some((row, arena.slot(row)?))))
            .collect::<Vec<_>>(),
    )?;
    states.retain(|(row, _)| !excluded.contains(row));
    let ranked: Vec<RowId> = hits.iter().map(|h| h.row).collect();
    let mut updates = reheat(ask.user, &ranked, &mut states, clock);
    let foreign: HashSet<RowId> = hits
        .iter()
        .filter(|h| h.user != ask.user)
        .map(|h| h.row)
        .collect();
    updates.retain(|(_, row, _, _)| !foreign.contains(row));
    // A working session's kept part is held like the mandatory set, and nothing else joins it.
    let mut mandatory: Vec<RowId> = hits
        .iter()
        .take(config.mandatory_hits)
        .map(|h| h.row)
        .chain(stretch.ids())
        .chain(kept.iter().copied())
        .collect();
    mandatory.sort_unstable();
    // A working session's recent tool messages are quoted whole.
    let quoted_whole: HashSet<RowId> = stretch
        .ids()
        .filter(|row| is_tool(arena, *row) && !stretch.previewed.contains(row))
        .collect();

    // First pass on what the arena knows (warmth, length); only the kept rows are read.
    let picks: Vec<Pick> = states
        .iter()
        .filter_map(|&(row, ref state)| {
            let warmth = heat::warmth(state, clock);
            let is_mandatory = mandatory.binary_search(&row).is_ok();
            if (warmth < config.warm_floor || stretch.anchored) && !is_mandatory {
                return None;
            }
            let tokens = arena.token_len(row)?;
            Some(Pick {
                row,
                warmth,
                mandatory: is_mandatory,
                // A tool message not quoted whole is shown by its preview.
                tokens: if is_tool(arena, row) && !quoted_whole.contains(&row) {
                    tokens.min(frame::TOOL_PREVIEW_TOKENS)
                } else {
                    tokens
                },
            })
        })
        .collect();
    let scores: Vec<f32> = hits.iter().map(|h| h.score).collect();
    let budget = config.budget.tokens(&scores);
    let spread = crate::budget::spread(&scores);
    // The reheat is written while the frame is made: the frame reads it from `states`.
    let (patched, frame) = rayon::join(
        || {
            if ask.probe {
                Ok(())
            } else {
                store.patch_activation(&updates)
            }
        },
        || {
            frame_of(
                memory,
                arena,
                ask,
                config,
                &picks,
                (
                    budget + stretch.beyond_tokens,
                    &quoted_whole,
                    &stretch,
                    pinned,
                ),
            )
        },
    );
    patched?;
    let frame = frame?;
    let raised: HashSet<RowId> = updates.iter().map(|&(_, row, _, _)| row).collect();
    let retrieved = ordered
        .iter()
        .enumerate()
        .map(|(rank, h)| {
            let within = rank < hits.len();
            let state = states
                .binary_search_by_key(&h.row, |&(row, _)| row)
                .ok()
                .filter(|_| within);
            RetrievedRow {
                row: h.row.0,
                score: h.score,
                warmth: state.map(|at| heat::warmth(&states[at].1, clock)),
                reheat: (within && !foreign.contains(&h.row)).then(|| heat::reheat_peak(rank)),
                raised: raised.contains(&h.row),
            }
        })
        .collect();
    let pin = (stretch.session && !ask.probe)
        .then(|| next_pin((pinned, &kept), &stretch, &frame, ask.now_ms))
        .flatten();
    Ok(Recall {
        retrieved,
        budget,
        spread,
        clock,
        reheated: updates.len(),
        scanned_rows,
        scan_us,
        frame,
        offered: picks,
        pin,
    })
}

/// The room of a working session's stretch for `ask` besides its tool messages quoted whole:
/// [`RecallConfig::session_share`] of the history the harness sent, or `session_tokens`
/// without one.
pub fn session_room(config: &RecallConfig, ask: &Ask<'_>) -> usize {
    ask.sent_tokens.map_or(config.session_tokens, |sent| {
        (sent as f64 * f64::from(config.session_share)) as usize
    })
}

/// The pin of a working session's frame for its next turn: `pinned`'s layers (none when the
/// frame was made afresh) and a layer for this turn, the rows it shows outside the stretch that
/// no earlier layer holds (`kept`, in row id order); the stretch's rows as shown.
fn next_pin(
    (pinned, kept): (Option<&Pin>, &[RowId]),
    stretch: &Stretch,
    frame: &Frame,
    now_ms: Option<i64>,
) -> Option<Pin> {
    let through = stretch.rows.first()?.0;
    let anchor = match pinned {
        Some(pin) => pin.anchor,
        None => stretch.rows.last()?.0,
    };
    let in_stretch: HashSet<RowId> = stretch.ids().collect();
    let mut rest: Vec<RowId> = frame
        .rows
        .iter()
        .copied()
        .filter(|row| !in_stretch.contains(row) && kept.binary_search(row).is_err())
        .collect();
    rest.sort_unstable();
    rest.dedup();
    let mut layers = pinned.map_or_else(Vec::new, |pin| pin.layers.clone());
    layers.push(frame::Layer {
        through,
        rest,
        now_ms,
    });
    let mut kept: Vec<(RowId, bool)> = stretch
        .ids()
        .map(|row| (row, stretch.previewed.contains(&row)))
        .collect();
    kept.sort_unstable_by_key(|&(row, _)| row);
    Some(Pin {
        anchor,
        kept,
        layers,
    })
}

/// The current conversation's stretch the frame holds whatever is found, newest first
/// ([`stretch`]).
#[derive(Debug, Clone, Default)]
pub struct Stretch {
    /// Its rows, newest first, each with its slot.
    pub rows: Vec<(RowId, Slot)>,
    /// How many of the newest rows make the chat's stretch: back to `recent_tokens` tokens,
    /// the live turn whole. The question is read beside these ([`question_query`]).
    pub recent: usize,
    /// Its tool rows shown by their preview ([`frame::TOOL_PREVIEW_CHARS`]), not whole.
    pub previewed: HashSet<RowId>,
    /// Tokens of its rows past the chat's stretch, as shown: a working session's room on top
    /// of the budget.
    pub beyond_tokens: usize,
    /// How many of the newest rows are the live turn's (a run of user rows).
    pub own: usize,
    /// Whether it holds tool rows: the conversation is a working session.
    pub session: bool,
    /// Whether it was walked back to a kept part's first row ([`Ask::pin`]).
    pub anchored: bool,
    /// The asker's token clock it was read at (its tool messages' warmth).
    pub clock: u64,
}

impl Stretch {
    /// Every row of the stretch.
    pub fn ids(&self) -> impl Iterator<Item = RowId> + '_ {
        self.rows.iter().map(|&(id, _)| id)
    }

    /// Take the tool message's first chunk `id` (`len` tokens) to be shown by its preview, if
    /// the preview's tokens keep `cost` within `room`; whether it did.
    fn preview(
        &mut self,
        (id, slot, len): (RowId, Slot, usize),
        cost: &mut usize,
        room: usize,
    ) -> bool {
        let shown = len.min(frame::TOOL_PREVIEW_TOKENS);
        if *cost + shown > room {
            return false;
        }
        *cost += shown;
        self.beyond_tokens += shown;
        self.rows.push((id, slot));
        self.previewed.insert(id);
        true
    }
}

/// The most recent stretch of the conversation `ask` continues, newest first, leaving out
/// `excluded` and rows the arena does not hold; empty without a conversation.
///
/// A chat's stretch is its rows back to `recent_tokens` tokens, and always the whole of its
/// newest turn: the newest run of user rows (the live question's chunks, however long). A
/// working session, whose stretch holds a tool row among its newest [`SESSION_PROBE_ROWS`]
/// rows or its chat part, goes on: a coding agent spends a turn's tokens on files it read and
/// commands it ran, so a chat's stretch would hold less than one of its turns. Past the live
/// turn, a tool message is quoted whole while it is warm ([`WHOLE_WARMTH`] from its birth), up
/// to `session_tokens` of them; an older one (or one past that) is shown by its preview, so
/// only its first chunk is in the stretch, counted at the preview's size
/// ([`frame::TOOL_PREVIEW_TOKENS`]), and its other chunks are left to the search like any other
/// row. The prompts, the assistant's words and the calls around them are quoted whole. These
/// and the previews take at most the room ([`session_room`]): the session's own course stays in
/// view at a fraction of its tool traffic. Given a pin ([`Ask::pin`]), the stretch goes back to
/// its first row instead, the rows it kept shown as they were, as long as that takes at most
/// twice the room and the ceiling.
pub fn stretch(
    store: &Store,
    arena: &Arena,
    ask: &Ask<'_>,
    config: &RecallConfig,
    excluded: &HashSet<RowId>,
) -> Result<Stretch, StoreError> {
    let clock = store.clock(ask.user)?;
    let tokens = (
        config.recent_tokens,
        session_room(config, ask),
        config.session_tokens,
        clock,
    );
    let walked = match ask.pin {
        Some(pin) => walk(store, arena, ask, tokens, excluded, Some(pin))?,
        None => None,
    };
    let walked = match walked {
        Some(kept) => kept,
        None => walk(store, arena, ask, tokens, excluded, None)?.unwrap_or_default(),
    };
    Ok(Stretch { clock, ..walked })
}

/// Warmth above which a working session's tool message is quoted whole in its stretch (from
/// its birth: about one half-life of the agent's work since).
pub const WHOLE_WARMTH: f32 = 0.9;

/// Rows a stretch is walked for a tool row before its conversation is taken for a chat.
const SESSION_PROBE_ROWS: usize = 64;

/// The walk of [`stretch`], back to a pin's first row when given ([`Pin`]), the rows it kept
/// shown as it kept them and the stretch then allowed twice its room; `None` when it overran
/// before reaching it.
fn walk(
    store: &Store,
    arena: &Arena,
    ask: &Ask<'_>,
    (recent_tokens, room, ceiling, clock): (usize, usize, usize, u64),
    excluded: &HashSet<RowId>,
    pin: Option<&Pin>,
) -> Result<Option<Stretch>, StoreError> {
    let anchor = pin.map(|pin| pin.anchor);
    let through = pin.map(Pin::through);
    let mut stretch = Stretch::default();
    let Some(conversation) = ask.conversation else {
        return Ok(Some(stretch));
    };
    // A pin's stretch may take twice the room before the frame is made afresh.
    let stretched = if anchor.is_some() { 2 } else { 1 };
    let (room, ceiling) = (stretched * room, stretched * ceiling);
    // Tokens of the stretch; as shown, of its tool messages quoted whole while warm, and of
    // the rest past the live turn.
    let (mut tokens, mut warm_cost, mut cost) = (0, 0, 0usize);
    let (mut own, mut overran) = (true, false);
    let mut recent = None;
    // A tool message to show by its preview, as far as its first chunk is known: the chunks of
    // one message share their birth clock, and only the first is kept (the preview is cut
    // within it); its other chunks stay out of the stretch, so the search can reach them.
    let mut pending: Option<(RowId, Slot, usize, u64)> = None;
    for id in store.conversation_rows_newest_first(ask.user, conversation) {
        let id = id?;
        if anchor.is_some_and(|anchor| id < anchor) {
            break;
        }
        let Some(slot) = arena.slot(id).filter(|_| !excluded.contains(&id)) else {
            continue;
        };
        let page = arena.page(slot.page);
        let i = slot.index as usize;
        let role = Role::from_code(page.roles[i]);
        let len = page.token_lens[i] as usize;
        let birth = page.birth_clocks[i];
        let tool = role == Some(Role::Tool);
        if let Some((first, first_slot, first_len, first_birth)) = pending.take() {
            if tool && birth == first_birth {
                pending = Some((id, slot, len, birth));
                tokens += len;
                continue;
            }
            if !stretch.preview((first, first_slot, first_len), &mut cost, room) {
                overran = true;
                break;
            }
        }
        own &= role == Some(Role::User);
        if !own && recent.is_none() && tokens >= recent_tokens {
            recent = Some(stretch.rows.len());
        }
        let beyond = recent.is_some();
        stretch.session |= tool;
        if beyond && !stretch.session && stretch.rows.len() >= SESSION_PROBE_ROWS {
            // No tool row near the question: a chat, whose stretch ends at `recent_tokens`.
            break;
        }
        let kept = match pin.filter(|_| through.is_some_and(|through| id <= through)) {
            // A row the pin kept is shown as it was; one it did not keep stays out.
            Some(pin) => match pin.kept.binary_search_by_key(&id, |&(row, _)| row) {
                Ok(at) => Some(pin.kept[at].1),
                Err(_) => continue,
            },
            None => None,
        };
        tokens += len;
        if own {
            stretch.own += 1;
            stretch.rows.push((id, slot));
            continue;
        }
        // A tool message is quoted whole while warm (its birth's warmth at the clock now),
        // within the ceiling; in the chat's stretch, within the room; else by its preview.
        let warm = tool
            && heat::warmth(&heat::born(birth, page.decays[i]), clock) >= WHOLE_WARMTH
            && warm_cost + len <= ceiling;
        let previewed = match kept {
            Some(previewed) => previewed,
            None => tool && !warm && (beyond || cost + len > room),
        };
        if previewed {
            if kept.is_none() {
                pending = Some((id, slot, len, birth));
            } else if !stretch.preview((id, slot, len), &mut cost, room) {
                overran = true;
                break;
            }
            continue;
        }
        if tool && (warm || kept.is_some()) {
            if warm_cost + len > ceiling {
                overran = true;
                break;
            }
            warm_cost += len;
        } else {
            if beyond && cost + len > room {
                overran = true;
                break;
            }
            cost += len;
        }
        if beyond {
            stretch.beyond_tokens += len;
        }
        stretch.rows.push((id, slot));
    }
    if let Some((first, first_slot, first_len, _)) = pending {
        overran |= !stretch.preview((first, first_slot, first_len), &mut cost, room);
    }
    if overran && anchor.is_some() {
        return Ok(None);
    }
    stretch.anchored = anchor.is_some();
    stretch.recent = recent.unwrap_or(stretch.rows.len());
    if !stretch.session {
        stretch.rows.truncate(stretch.recent);
        stretch.beyond_tokens = 0;
    }
    Ok(Some(stretch))
}

/// The question of `ask` as the search reads it: in its conversation, beside the rows of the
/// `stretch` before its own turn ([`PreparedQuery::in_conversation`]). The stretch's newest
/// user rows are that turn: the question itself once captured (or again, on a client's
/// retry), so they are left out, and a live turn, its retry and a probe read one query.
pub fn question_query(
    dictionary: &Dictionary,
    arena: &Arena,
    ask: &Ask<'_>,
    stretch: &[(RowId, Slot)],
) -> PreparedQuery {
    let own = stretch
        .iter()
        .take_while(|&&(_, slot)| {
            Role::from_code(arena.page(slot.page).roles[slot.index as usize]) == Some(Role::User)
        })
        .count();
    let context: Vec<Slot> = stretch[own..].iter().map(|&(_, slot)| slot).collect();
    PreparedQuery::in_conversation(dictionary, arena, ask.question, &context)
}

/// The frame of `picks` within `cap` tokens: the turns it selects read from the store (the tool
/// messages of `quoted_whole` to be quoted whole), rendered and fitted (after the layers of
/// the pin the stretch kept, if any); what the cap left out counted in its omission line.
fn frame_of(
    memory: &Memory,
    arena: &Arena,
    ask: &Ask<'_>,
    config: &RecallConfig,
    picks: &[Pick],
    (cap, quoted_whole, stretch, pinned): (usize, &HashSet<RowId>, &Stretch, Option<&Pin>),
) -> Result<Frame, StoreError> {
    let layout = Layout {
        now_ms: ask.now_ms,
        current: ask.conversation,
        probe_question: ask.probe.then_some(ask.question),
        question: stretch
            .own
            .checked_sub(1)
            .filter(|_| !ask.probe)
            .map(|oldest| stretch.rows[oldest].0),
        layers: pinned.map_or(&[], |pin| pin.layers.as_slice()),
        tools: config.tools,
    };
    let kept = frame::select(picks, cap);
    let mut outside = Omitted::default();
    let mut is_kept = vec![false; picks.len()];
    for &i in &kept {
        is_kept[i] = true;
    }
    for (pick, _) in picks.iter().zip(&is_kept).filter(|(_, kept)| !**kept) {
        outside.turns += 1;
        outside.tokens += pick.tokens;
    }
    let owned: Vec<(Pick, UserId)> = kept
        .iter()
        .filter_map(|&i| Some((picks[i], arena.owner_in(picks[i].row, ask.scope)?)))
        .collect();
    let mut turns = Turns::default();
    turns.read_rows(memory, owned.iter().map(|&(pick, owner)| (owner, pick.row)))?;
    let mut candidates = Vec::with_capacity(owned.len());
    for (pick, owner) in owned {
        if let Some(mut turn) = turns.turn(memory, owner, pick.row)? {
            turn.quoted_whole = quoted_whole.contains(&pick.row);
            candidates.push(Candidate {
                turn,
                warmth: pick.warmth,
                mandatory: pick.mandatory,
            });
        }
    }
    let tokenizer = Tokenizer::new();
    Ok(frame::fit(
        candidates,
        cap,
        &layout,
        |text| tokenizer.count(text),
        outside,
    ))
}

/// Whether `row` is a tool message's (a call the agent made or what a tool returned), as the
/// arena holds it.
fn is_tool(arena: &Arena, row: RowId) -> bool {
    arena.slot(row).is_some_and(|slot| {
        Role::from_code(arena.page(slot.page).roles[slot.index as usize]) == Some(Role::Tool)
    })
}

/// The conversation of `row` as the arena holds it (0 for a row it does not hold).
fn conversation_in(arena: &Arena, row: RowId) -> u64 {
    arena.slot(row).map_or(0, |slot| {
        arena.page(slot.page).conversations[slot.index as usize]
    })
}

/// `ordered` (the frame's order) with the first turn of each of its first `openers`
/// conversations (other than the one being continued, whose turns the request carries)
/// inserted right after that conversation's best row, with its score, where it is not in
/// `ordered` already and not excluded. A conversation's opening states what it is about (an
/// agent session's task, the user's request), and a retrieved turn of it is read in its light:
/// on RealMem a third of the evidence turns open their session and rank far below their
/// session's best row (`docs/journal/benchmarks.md`). The conversations' chains are read
/// with one iterator, one seek each.
fn with_openers(
    store: &Store,
    arena: &Arena,
    ordered: Vec<Retrieved>,
    current: Option<ConversationId>,
    excluded: &HashSet<RowId>,
    openers: usize,
) -> Result<Vec<Retrieved>, StoreError> {
    let mut opened: HashSet<(UserId, ConversationId)> = HashSet::new();
    // For each hit, the conversation whose opening follows it (at its best row, the first).
    let opens: Vec<Option<(UserId, ConversationId)>> = ordered
        .iter()
        .map(|hit| {
            let conversation = ConversationId(conversation_in(arena, hit.row));
            (Some(conversation) != current
                && opened.len() < openers
                && opened.insert((hit.user, conversation)))
            .then_some((hit.user, conversation))
        })
        .collect();
    let wanted: Vec<(UserId, ConversationId)> = opens.iter().flatten().copied().collect();
    let mut firsts = store.first_rows_of(&wanted)?.into_iter();
    let firsts = opens
        .iter()
        .map(|open| open.and_then(|_| firsts.next().flatten()));
    let mut present: HashSet<RowId> = ordered.iter().map(|hit| hit.row).collect();
    let mut out = Vec::with_capacity(ordered.len() + opened.len());
    for (hit, first) in ordered.into_iter().zip(firsts) {
        let (user, score) = (hit.user, hit.score);
        out.push(hit);
        if let Some(first) = first
            && !excluded.contains(&first)
            && present.insert(first)
        {
            out.push(Retrieved {
                row: first,
                user,
                score,
            });
        }
    }
    Ok(out)
}

/// What the frame's order knows of a hit's speaker ([`speakers`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Speaker {
    /// The question names the row's speaker.
    pub named: bool,
    /// The row is the model's own words: an assistant's, in a conversation whose two sides do
    /// not both have a name.
    pub model: bool,
}

/// The frame's order of a search's `hits` (best first). A row of the model
/// (`speakers[i].model`) first keeps `model_weight` of its score where positive; then each
/// row's score is lifted by `conversation_lift` times the best such score among the hits of
/// its conversation (`conversations[i]` is hit `i`'s: its owner's, in a group scope), and by
/// `speaker_lift` where `speakers[i].named` (the question names its speaker); best lifted
/// score first, ties by row id. Each hit's score becomes its lifted one. A conversation that
/// holds a strong match is likely about the question in other turns too, and a question about
/// a person is mostly answered by what that person said: on LoCoMo both raise the share of
/// questions whose evidence the frame holds. In a memory of a person and a model, what the
/// person said is most of what is asked about, and the model's long answers, holding more of
/// any question's words, outrank it: on RealMem 78% of the evidence is the user's turns, and
/// the assistant's fill more than half of the search's top ten (`docs/journal/benchmarks.md`).
/// The search itself stays exact: this only reorders what it returned.
pub fn frame_order<C: Copy + Eq + std::hash::Hash>(
    mut hits: Vec<Retrieved>,
    conversations: &[C],
    speakers: &[Speaker],
    config: &RecallConfig,
) -> Vec<Retrieved> {
    for (hit, speaker) in hits.iter_mut().zip(speakers) {
        if speaker.model && hit.score > 0.0 {
            hit.score *= config.model_weight;
        }
    }
    let mut best: HashMap<C, f32> = HashMap::new();
    for (hit, &conversation) in hits.iter().zip(conversations) {
        let top = best.entry(conversation).or_insert(hit.score);
        *top = top.max(hit.score);
    }
    let mut lifted: Vec<Retrieved> = hits
        .into_iter()
        .zip(conversations.iter().zip(speakers))
        .map(|(mut hit, (conversation, speaker))| {
            hit.score += config.conversation_lift * best[conversation];
            if speaker.named {
                hit.score += config.speaker_lift;
            }
            hit
        })
        .collect();
    lifted.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.row.cmp(&b.row)));
    lifted
}

/// Each hit's [`Speaker`]: whether the question names it (every lexical term of the name now
/// bound to the row's speaker slot, its conversation and role read from the arena, is among
/// the question's terms), and whether it is the model: an assistant, unless both sides of its
/// conversation have a name bound (a chat between two people, as LoCoMo's, whose second
/// speaker is stored as the assistant). The proxy captures a reply under the model's id and
/// the question under no name; a log of a person and an assistant names the person only. A
/// row captured with a name always has one bound to its slot (the capture binds it), so rows
/// without a bound name have no speaker's name and are named by no question. Nothing is read
/// from the store but each hit owner's bound names, held in memory.
fn speakers(
    memory: &Memory,
    arena: &Arena,
    query: &PreparedQuery,
    hits: &[Retrieved],
) -> Result<Vec<Speaker>, StoreError> {
    let asked: HashSet<TermId> = query.retrieval.terms.iter().map(|&(t, _)| t).collect();
    let mut bound: HashMap<UserId, BoundNames> = HashMap::new();
    let mut verdicts: HashMap<Arc<str>, bool> = HashMap::new();
    let mut speakers = Vec::with_capacity(hits.len());
    for hit in hits {
        let slot = arena.slot(hit.row).and_then(|slot| {
            let page = arena.page(slot.page);
            let i = slot.index as usize;
            Some((
                ConversationId(page.conversations[i]),
                Role::from_code(page.roles[i])?,
            ))
        });
        let names = match bound.entry(hit.user) {
            Entry::Occupied(names) => names.into_mut(),
            Entry::Vacant(names) => names.insert(memory.store.bound_names(hit.user)?),
        };
        let name = slot.and_then(|slot| names.get(&slot));
        speakers.push(Speaker {
            named: name.is_some_and(|name| {
                *verdicts.entry(name.clone()).or_insert_with_key(|name| {
                    let terms = memory.dictionary.lexical().terms(name);
                    !terms.is_empty() && terms.iter().all(|(term, _)| asked.contains(term))
                })
            }),
            model: slot.is_some_and(|(conversation, role)| {
                role == Role::Assistant
                    && (name.is_none() || !names.contains_key(&(conversation, Role::User)))
            }),
        });
    }
    Ok(speakers)
}

/// The activation of every row that may still be warm enough for the frame, of the retrieved
/// rows and of the rows of `stretch`, in row id order: the warm index (reheated rows; those now
/// below `floor` are dropped from it, unless probing), then, where the index does not hold them,
/// the user's newest rows within [`heat::born_reach`], the hits and `stretch` at their birth
/// state (another group member's hit at no warmth). Read from the arena and the small warm
/// index, never from every activation of the user. A vector in row order rather than a map:
/// a user may hold tens of thousands of warm rows, and this runs every turn.
fn warm_states(
    store: &crate::store::Store,
    arena: &Arena,
    ask: &Ask<'_>,
    clock: u64,
    floor: f32,
    hits: &[Retrieved],
    stretch: &[(RowId, crate::arena::Slot)],
) -> Result<Vec<(RowId, Activation)>, StoreError> {
    let user = ask.user;
    let warm = store.warm_of(user)?;
    let mut held = Vec::with_capacity(warm.len());
    let mut cold = Vec::new();
    for (&row, &state) in warm.iter() {
        if heat::warmth(&state, clock) >= floor {
            held.push((row, state));
        } else {
            cold.push(row);
        }
    }
    if !ask.probe {
        store.forget_cold(user, &cold)?;
    }
    let mut unheld = Vec::new();
    let reach = heat::born_reach(floor);
    'pages: for page in arena.scope_pages(&[user]).iter().rev() {
        for i in (0..page.rows as usize).rev() {
            if clock.saturating_sub(page.birth_clocks[i]) > reach {
                break 'pages;
            }
            let born = heat::born(page.birth_clocks[i], page.decays[i]);
            unheld.push((RowId(page.row_ids[i]), born));
        }
    }
    for hit in hits {
        if let Some(slot) = arena.slot(hit.row) {
            let state = if hit.user == user {
                born_state(arena, slot)
            } else {
                unwarmed_state(arena, slot, clock)
            };
            unheld.push((hit.row, state));
        }
    }
    unheld.extend(
        stretch
            .iter()
            .map(|&(id, slot)| (id, born_state(arena, slot))),
    );
    unheld.sort_by_key(|&(row, _)| row);
    unheld.dedup_by_key(|&mut (row, _)| row);
    Ok(merge_by_row(held, unheld))
}

/// Two lists in row id order as one, each row once: `first`'s entry where both hold it.
fn merge_by_row<T>(first: Vec<(RowId, T)>, second: Vec<(RowId, T)>) -> Vec<(RowId, T)> {
    let mut out = Vec::with_capacity(first.len() + second.len());
    let mut second = second.into_iter().peekable();
    for entry in first {
        while let Some(next) = second.next_if(|next| next.0 <= entry.0) {
            if next.0 < entry.0 {
                out.push(next);
            }
        }
        out.push(entry);
    }
    out.extend(second);
    out
}

/// The birth state of the row in `slot` (its state unless it was reheated).
fn born_state(arena: &Arena, slot: crate::arena::Slot) -> Activation {
    let page = arena.page(slot.page);
    let i = slot.index as usize;
    heat::born(page.birth_clocks[i], page.decays[i])
}

/// The state another group member's row starts from in the asker's recall: no warmth on the
/// asker's clock (its birth clock counts on its owner's clock), so the reheat gives it exactly
/// the trajectory its rank earns now.
fn unwarmed_state(arena: &Arena, slot: crate::arena::Slot, clock: u64) -> Activation {
    let page = arena.page(slot.page);
    Activation {
        last_clock: clock,
        peak: 0.0,
        decay: page.decays[slot.index as usize],
    }
}

/// Reheat `rows` (rank order) in `states` at clock `now`; returns the raised trajectories as
/// the store's patch list.
fn reheat(
    user: UserId,
    rows: &[RowId],
    states: &mut [(RowId, Activation)],
    now: u64,
) -> Vec<(UserId, RowId, u64, f32)> {
    let mut updates = Vec::new();
    for (rank, &row) in rows.iter().enumerate() {
        let Ok(at) = states.binary_search_by_key(&row, |&(row, _)| row) else {
            continue;
        };
        let state = &mut states[at].1;
        if let Some(next) = heat::reheat(state, now, rank) {
            *state = next;
            updates.push((user, row, next.last_clock, next.peak));
        }
    }
    updates
}

/// Reheat rows a memory tool returned (rank order) as retrieval does, at the user's clock now:
/// each row's current state is its warm index entry, else its birth state. Returns how many
/// trajectories were raised (and written).
pub fn reheat_returned(
    memory: &Memory,
    arena: &Arena,
    user: UserId,
    rows: &[RowId],
) -> Result<usize, StoreError> {
    let store = &memory.store;
    let clock = store.clock(user)?;
    // Another group member's rows keep their own heat.
    let rows: Vec<RowId> = rows
        .iter()
        .copied()
        .filter(|&row| arena.owner_in(row, &[user]).is_some())
        .collect();
    let warm = store.warm_of(user)?;
    let mut states: Vec<(RowId, Activation)> = rows
        .iter()
        .filter_map(|&row| {
            let slot = arena.slot(row)?;
            let state = warm.get(&row).copied();
            Some((row, state.unwrap_or_else(|| born_state(arena, slot))))
        })
        .collect();
    states.sort_by_key(|&(row, _)| row);
    states.dedup_by_key(|&mut (row, _)| row);
    let updates = reheat(user, &rows, &mut states, clock);
    store.patch_activation(&updates)?;
    Ok(updates.len())
}

/// Stored rows read for a frame or a tool's answer, their speakers resolved through the
/// binding log (held in memory by the store).
#[derive(Default)]
pub struct Turns {
    /// Rows read ahead by [`Turns::read_rows`], taken by [`Turns::turn`].
    read: HashMap<RowId, Row>,
}

impl Turns {
    /// Read the stored rows `rows` (user, row) not read yet: each a point read of the store,
    /// so they are spread over the rayon pool (a frame reads up to a few hundred).
    pub fn read_rows(
        &mut self,
        memory: &Memory,
        rows: impl IntoIterator<Item = (UserId, RowId)>,
    ) -> Result<(), StoreError> {
        let wanted: Vec<(UserId, RowId)> = rows
            .into_iter()
            .filter(|(_, id)| !self.read.contains_key(id))
            .collect();
        let read: Vec<Option<Row>> = wanted
            .par_iter()
            .map(|&(user, id)| memory.store.row(user, id))
            .collect::<Result<_, StoreError>>()?;
        self.read
            .extend(read.into_iter().flatten().map(|row| (row.id, row)));
        Ok(())
    }

    /// The stored row `id` as a frame turn, its speaker resolved now; `None` if it is gone.
    pub fn turn(
        &mut self,
        memory: &Memory,
        user: UserId,
        id: RowId,
    ) -> Result<Option<Turn>, StoreError> {
        let row = match self.read.remove(&id) {
            Some(row) => row,
            None => match memory.store.row(user, id)? {
                Some(row) => row,
                None => return Ok(None),
            },
        };
        let bound =
            memory
                .store
                .bound_name(user, ConversationId::from_key(&row.conversation), row.role)?;
        Ok(Some(Turn {
            row: id,
            speaker: bound.map(|name| name.to_string()).or(row.name),
            tokens: row.tokens.len(),
            conversation: row.conversation,
            message: row.message,
            chunk: row.chunk,
            chunks: row.chunks,
            role: row.role,
            timestamp_ms: row.timestamp_ms,
            text: row.text,
            quoted_whole: false,
        }))
    }
}

#[cfg(test)]
mod tests;
