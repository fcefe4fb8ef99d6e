//! The frame: what the model sees this turn, rendered from stored turns by pure functions.
//!
//! Turns are grouped by conversation (the group with the most recent turn last, the current
//! conversation after every other), quoted verbatim in capture order inside each group, and
//! labelled with the speaker's name and the time, resolved when the frame is rendered (an
//! absolute date plus the age relative to now). Consecutive turns on the same side merge into
//! one message, so the messages alternate user / assistant and the first is a user message.
//!
//! The cap is enforced on the text as rendered, in two passes: select by estimate, render,
//! count exactly, and while over the cap drop the least warm optional turns and render again.
//! The mandatory set is never dropped. When turns were left out, the frame says so in one line.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::types::{Role, RowId};

/// The memory tool that returns what the cap left out (named in the omission line when the
/// tools ride along with the request).
pub const REOPEN_TOOL: &str = "memory_reopen";

/// Tokens a turn's label adds on top of its text, for the first pass's estimate
/// (`[Caroline, 2023-05-08 13:56, 3 weeks before now] ` is about 20 under o200k_base).
pub const LABEL_ESTIMATE_TOKENS: usize = 20;

/// The room of a chat turn with its label, in tokens: the first pass counts a longer turn's
/// warmth per this many tokens of it, so a long turn (an assistant's answer, a document, one
/// chunk of up to 256 tokens) is kept before shorter ones only where it is that much warmer
/// for the room it takes. No LoCoMo turn reaches it (the longest is 87 words), so a two-person
/// chat is framed as before; on RealMem, whose assistant turns are five times its user turns,
/// the frame holds all the evidence of 0.457 of the queries instead of 0.387 at the same
/// tokens (`docs/journal/benchmarks.md`).
pub const TURN_ROOM_TOKENS: usize = 128;

/// Tokens the omission line costs, for the first pass's estimate.
const NOTE_ESTIMATE_TOKENS: usize = 30;
/// Picks [`select`] orders in its first chunk: room for several frames' worth of turns.
const SELECT_CHUNK: usize = 256;

/// One stored turn (row) as the frame quotes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    pub row: RowId,
    pub conversation: String,
    /// The message the row is a chunk of (its first row), the chunk's index in it, and the
    /// message's chunk count.
    pub message: RowId,
    pub chunk: u16,
    pub chunks: u16,
    pub role: Role,
    /// The speaker's name, resolved through the binding log at render time.
    pub speaker: Option<String>,
    pub timestamp_ms: Option<i64>,
    pub text: String,
    /// Tokens of `text`.
    pub tokens: usize,
    /// A tool message quoted whole rather than by its preview (a working session's recent
    /// work, `recall::stretch`); a message with one such chunk is quoted whole.
    pub quoted_whole: bool,
}

/// A turn offered to the frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub turn: Turn,
    /// Warmth at the current clock: the priority under the cap.
    pub warmth: f32,
    /// Part of the mandatory set (the current turn, its own retrieval, the recent stretch of
    /// this conversation): never dropped.
    pub mandatory: bool,
}

/// What the frame is rendered around.
#[derive(Debug, Clone, Copy, Default)]
pub struct Layout<'a> {
    /// The render time (Unix ms) that ages are relative to; without it only dates are shown.
    pub now_ms: Option<i64>,
    /// The conversation being continued: its group is rendered last.
    pub current: Option<&'a str>,
    /// Probe mode: the live question, appended after the frame (it is not a stored turn).
    pub probe_question: Option<&'a str>,
    /// The live question's first row, when it is a stored turn of the current conversation:
    /// the omission line goes right before it.
    pub question: Option<RowId>,
    /// The layers a working session's frame kept from its earlier turns (`recall::Pin`),
    /// oldest first; rows in none of them make the last, open layer. Empty: one layer.
    pub layers: &'a [Layer],
    /// Whether the memory tools ride along (the omission line names one only then).
    pub tools: bool,
}

/// What one turn of a working session added to its frame, kept so that later turns render it
/// again byte for byte: the current conversation's rows up to `through`, and the rows of other
/// conversations (or of this one, from before its stretch) first shown with them. A later
/// turn's frame renders its layers in order, each its earlier conversations then the current
/// one's part, and what is new after them; so what a turn saw stays the start of what the next
/// one sees, and a provider's prefix cache serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    pub through: RowId,
    /// In row id order.
    pub rest: Vec<RowId>,
    /// The render time of the turn that added it: its earlier conversations' ages count from
    /// it.
    pub now_ms: Option<i64>,
}

/// A run of turns rendered under one header (or none: the current conversation going on
/// where its last part ended).
struct Segment<'t> {
    current: bool,
    header: Option<String>,
    /// The render time labels count ages from.
    now_ms: Option<i64>,
    turns: Vec<&'t Turn>,
}

/// `turns` as the segments [`render`] writes, in order: layer by layer ([`Layout::layers`]),
/// each layer's turns grouped by conversation, groups ordered by their most recent row with
/// the current conversation last.
fn segments<'t>(turns: &[&'t Turn], layout: &Layout<'_>) -> Vec<Segment<'t>> {
    let layers = layout.layers;
    let is_current = |turn: &Turn| Some(turn.conversation.as_str()) == layout.current;
    let mut by_layer: Vec<Vec<&Turn>> = vec![Vec::new(); layers.len() + 1];
    for &turn in turns {
        let at = if is_current(turn) {
            layers.iter().position(|l| turn.row <= l.through)
        } else {
            layers
                .iter()
                .position(|l| l.rest.binary_search(&turn.row).is_ok())
        };
        by_layer[at.unwrap_or(layers.len())].push(turn);
    }
    let mut out = Vec::new();
    let mut opened = false;
    for (i, layer) in by_layer.into_iter().enumerate() {
        let now = layers.get(i).map_or(layout.now_ms, |l| l.now_ms);
        let mut groups: HashMap<&str, Vec<&Turn>> = HashMap::new();
        for turn in layer {
            groups.entry(&turn.conversation).or_default().push(turn);
        }
        let mut groups: Vec<(&str, Vec<&Turn>)> = groups.into_iter().collect();
        for (_, group) in &mut groups {
            group.sort_by_key(|t| t.row);
        }
        groups.sort_by_key(|(conversation, group)| {
            (
                Some(*conversation) == layout.current,
                group.last().map(|t| t.row),
            )
        });
        let mut interrupted = false;
        for (conversation, group) in groups {
            let current = Some(conversation) == layout.current;
            // The current conversation's header carries no age (it would change every
            // minute); an earlier one's counts from the render time of its layer.
            let when = |now| {
                group
                    .first()
                    .and_then(|t| when_label(t.timestamp_ms, now))
                    .map_or(String::new(), |when| format!(" from {when}"))
            };
            let header = if !current {
                interrupted = true;
                Some(format!("[Earlier conversation{}]", when(now)))
            } else if !opened {
                Some(format!("[This conversation{}]", when(None)))
            } else if interrupted {
                Some("[This conversation, continued]".to_owned())
            } else {
                None
            };
            opened |= current;
            out.push(Segment {
                current,
                header,
                now_ms: if current { layout.now_ms } else { now },
                turns: group,
            });
        }
    }
    out
}

/// Which side of the conversation a message is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    User,
    Assistant,
}

impl Side {
    /// Assistant turns on the assistant side; user, system and tool turns on the user side.
    pub fn of(role: Role) -> Self {
        match role {
            Role::Assistant => Self::Assistant,
            Role::User | Role::System | Role::Tool => Self::User,
        }
    }
}

/// One rendered message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub role: Side,
    pub content: String,
    /// The stored rows quoted in this message, in order.
    pub rows: Vec<RowId>,
    /// Of `rows`, those quoted only in part (a tool message's rows past its preview's cut):
    /// the memory tools still return them.
    pub partial: Vec<RowId>,
    /// Exact tokens of `content`.
    pub tokens: usize,
}

/// What the cap left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Omitted {
    pub turns: usize,
    /// Tokens of their texts.
    pub tokens: usize,
}

/// A rendered frame.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Frame {
    pub messages: Vec<Message>,
    /// Exact tokens of every message's content.
    pub tokens: usize,
    /// The cap this frame was fitted to.
    pub cap: usize,
    /// The rows shown, in frame order.
    pub rows: Vec<RowId>,
    /// Rows in the mandatory set.
    pub mandatory: usize,
    pub omitted: Omitted,
}

impl Frame {
    /// The rows quoted only in part, of every message ([`Message::partial`]).
    pub fn partial_rows(&self) -> HashSet<RowId> {
        self.messages
            .iter()
            .flat_map(|m| m.partial.iter().copied())
            .collect()
    }

    /// The rows shown whole, in frame order: [`Frame::rows`] less those quoted only in part
    /// ([`Message::partial`]). The memory tools count these as shown, so `memory_chain` on a
    /// tool message the preview cut returns the whole of it.
    pub fn whole_rows(&self) -> Vec<RowId> {
        let partial = self.partial_rows();
        self.rows
            .iter()
            .copied()
            .filter(|row| !partial.contains(row))
            .collect()
    }
}

/// `2023-05-08 13:56` (UTC), or `None` for a time outside the calendar.
pub fn date_label(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.format("%Y-%m-%d %H:%M").to_string())
}

/// The age of a moment `delta_ms` before now (negative: after now), in the largest whole unit:
/// `just now`, `5 minutes before now`, `3 weeks before now`, `2 days after now`.
pub fn age_label(delta_ms: i64) -> String {
    let minutes = delta_ms.unsigned_abs() / 60_000;
    if minutes == 0 {
        return "just now".to_owned();
    }
    let (hours, days) = (minutes / 60, minutes / (60 * 24));
    let (n, unit) = match () {
        () if hours == 0 => (minutes, "minute"),
        () if days == 0 => (hours, "hour"),
        () if days < 14 => (days, "day"),
        () if days < 61 => (days / 7, "week"),
        () if days < 730 => (days / 30, "month"),
        () => (days / 365, "year"),
    };
    let plural = if n == 1 { "" } else { "s" };
    let side = if delta_ms < 0 { "after" } else { "before" };
    format!("{n} {unit}{plural} {side} now")
}

/// `2023-05-08 13:56, 3 weeks before now` (the age only with a render time), or `None` for an
/// unknown time.
pub fn when_label(at_ms: Option<i64>, now_ms: Option<i64>) -> Option<String> {
    let at = at_ms?;
    let mut out = date_label(at)?;
    if let Some(now) = now_ms {
        let _ = write!(out, ", {}", age_label(now.saturating_sub(at)));
    }
    Some(out)
}

/// The day of a time (`2023-05-08`, UTC).
pub fn day_label(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.format("%Y-%m-%d").to_string())
}

/// A turn's label. In full, `[Caroline, 2023-05-08 13:56, 3 weeks before now]`; what the
/// reader already has from the line above or the group's header (`shown`, the time last shown)
/// is not repeated: on the same day only the time of day, `[Caroline, 13:56]`, and in the same
/// minute no time at all, `[Caroline]`. The speaker falls back to the role; the time is left
/// out when unknown.
pub fn label(turn: &Turn, now_ms: Option<i64>, shown: Option<i64>) -> String {
    let mut out = String::from("[");
    match &turn.speaker {
        Some(name) => out.push_str(name),
        None => out.push_str(match turn.role {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::System => "system",
            Role::Tool => "tool",
        }),
    }
    let at = turn.timestamp_ms;
    let shown_minute = shown.and_then(date_label);
    if let Some(at_minute) = at.and_then(date_label) {
        if shown_minute.as_deref() == Some(at_minute.as_str()) {
            // The reader has this very minute.
        } else if shown.and_then(day_label) == at.and_then(day_label) {
            let _ = write!(out, ", {}", &at_minute[11..]);
        } else if let Some(when) = when_label(at, now_ms) {
            let _ = write!(out, ", {when}");
        }
    }
    out.push(']');
    out
}

/// The one line that says what the cap left out.
pub fn omission_line(omitted: Omitted, tools: bool) -> String {
    let plural = if omitted.turns == 1 { "" } else { "s" };
    let mut line = format!(
        "[{} more remembered turn{plural} ({} tokens) did not fit in this frame",
        omitted.turns, omitted.tokens
    );
    if tools {
        let _ = write!(line, "; {REOPEN_TOOL} returns them");
    }
    line.push_str(".]");
    line
}

/// Messages under construction: consecutive text on one side merges.
#[derive(Default)]
struct Messages {
    out: Vec<Message>,
}

impl Messages {
    /// Add `text` on `side`, quoting `quoted`: a row, and whether it is shown whole.
    fn push(&mut self, side: Side, text: &str, quoted: Option<(RowId, bool)>) {
        match self.out.last_mut() {
            Some(last) if last.role == side => {
                last.content.push_str("\n\n");
                last.content.push_str(text);
            }
            _ => self.out.push(Message {
                role: side,
                content: text.to_owned(),
                rows: Vec::new(),
                partial: Vec::new(),
                tokens: 0,
            }),
        }
        if let Some((row, whole)) = quoted {
            self.quote(row, whole);
        }
    }

    /// Continue the last message's text (the next chunk of a message already begun).
    fn extend(&mut self, text: &str, row: RowId, whole: bool) {
        self.out
            .last_mut()
            .expect("a chunk continues a started message")
            .content
            .push_str(text);
        self.quote(row, whole);
    }

    fn quote(&mut self, row: RowId, whole: bool) {
        let last = self.out.last_mut().expect("a message to quote in");
        last.rows.push(row);
        if !whole {
            last.partial.push(row);
        }
    }
}

/// Characters of one tool message (a call the agent made, or what a tool returned) that the
/// frame shows: calls are short, results can be whole files. The rest stays stored, whole, and
/// `memory_chain` on the message's id returns it.
pub const TOOL_PREVIEW_CHARS: usize = 600;

/// Tokens a tool message's preview takes at most, for a first pass's estimate: its
/// [`TOOL_PREVIEW_CHARS`] at about four characters a token, and the note where it is cut.
pub const TOOL_PREVIEW_TOKENS: usize = TOOL_PREVIEW_CHARS / 4 + 20;

/// How much of the tool message being rendered has been shown, chunk after chunk.
#[derive(Debug, Default)]
struct Preview {
    chars: usize,
    cut: bool,
}

impl Preview {
    /// The part of `turn` (a chunk of a tool message) still within [`TOOL_PREVIEW_CHARS`],
    /// with a note where the message is cut, nothing once it was cut; and whether that is the
    /// whole of `turn`.
    fn take<'a>(&mut self, turn: &'a Turn, tools: bool) -> (Cow<'a, str>, bool) {
        if self.cut {
            return (Cow::Borrowed(""), false);
        }
        let room = TOOL_PREVIEW_CHARS.saturating_sub(self.chars);
        match turn.text.char_indices().nth(room) {
            None => {
                self.chars += turn.text.chars().count();
                (Cow::Borrowed(turn.text.as_str()), true)
            }
            Some((end, _)) => {
                self.cut = true;
                let shown = format!(
                    "{} … [cut here; {}]",
                    &turn.text[..end],
                    where_whole(turn, tools, "the whole")
                );
                (Cow::Owned(shown), false)
            }
        }
    }
}

/// Where the whole of `turn`'s message is, for a note on a part of it: the chain tool's call
/// when the memory tools ride along, which returns what of the message was not shown whole
/// (`what`: the whole of a tool message past its preview, the rest of a message shown in
/// part).
fn where_whole(turn: &Turn, tools: bool, what: &str) -> String {
    if tools {
        format!("memory_chain #{} returns {what}", turn.message.0)
    } else {
        "the whole is stored".to_owned()
    }
}

/// Whether `turn` is the chunk right after `previous` in one message.
fn continues(previous: &Turn, turn: &Turn) -> bool {
    previous.message == turn.message
        && previous.chunk + 1 == turn.chunk
        && previous.role == turn.role
}

/// The note closing a shown run of a message's chunks that ends with `last` and began at chunk
/// `first`, where the run is not the whole message: its end cut (`… [cut here; …]`, as a tool
/// message's preview says it), or else its start (the run then opens with `…`). `None` for a
/// whole message.
fn excerpt_note(first: u16, last: &Turn, tools: bool) -> Option<String> {
    let whole = || where_whole(last, tools, "the rest");
    if last.chunk + 1 < last.chunks {
        Some(format!(" … [cut here; {}]", whole()))
    } else if first > 0 {
        Some(format!(" [its start is cut; {}]", whole()))
    } else {
        None
    }
}

/// Render `turns` (any order) as messages: grouped by conversation, groups ordered by their most
/// recent row with `layout.current` last, each group opened by a header line on the user side
/// (so the frame starts with a user message), the omission line when anything was left out
/// right before the live question (`layout.question`, or the probe question), and the probe
/// question last. The frame's stable part comes first and what changes every turn last, so a
/// provider's prefix cache serves the one from turn to turn. Token counts are left at zero.
pub fn render(turns: &[&Turn], layout: &Layout<'_>, omitted: Omitted) -> Vec<Message> {
    let whole_messages: HashSet<RowId> = turns
        .iter()
        .filter(|t| t.quoted_whole)
        .map(|t| t.message)
        .collect();
    let mut messages = Messages::default();
    let mut omission = (omitted.turns > 0).then(|| omission_line(omitted, layout.tools));
    let mut shown = None;
    let mut previous: Option<&Turn> = None;
    let mut preview = Preview::default();
    let mut first = 0;
    for segment in segments(turns, layout) {
        if let Some(header) = &segment.header {
            messages.push(Side::User, header, None);
            shown = segment.turns.first().and_then(|t| t.timestamp_ms);
            previous = None;
        }
        for (n, &turn) in segment.turns.iter().enumerate() {
            if segment.current && Some(turn.row) == layout.question {
                // What did not fit is said last, just before the question.
                if let Some(line) = omission.take() {
                    messages.push(Side::User, &line, None);
                }
            }
            let joined = previous.is_some_and(|p| continues(p, turn));
            if !joined {
                preview = Preview::default();
                first = turn.chunk;
            }
            let (mut text, whole) =
                if turn.role == Role::Tool && !whole_messages.contains(&turn.message) {
                    preview.take(turn, layout.tools)
                } else {
                    (Cow::Borrowed(turn.text.as_str()), true)
                };
            // A message shown in part says so where it is cut, once a run of its chunks.
            if !joined && first > 0 {
                let gap = if text.starts_with(char::is_whitespace) {
                    ""
                } else {
                    " "
                };
                text = Cow::Owned(format!("…{gap}{text}"));
            }
            let ends = segment
                .turns
                .get(n + 1)
                .is_none_or(|next| !continues(turn, next));
            if ends
                && !preview.cut
                && let Some(note) = excerpt_note(first, turn, layout.tools)
            {
                let spaced = text.ends_with(char::is_whitespace);
                text.to_mut()
                    .push_str(if spaced { note.trim_start() } else { &note });
            }
            if joined {
                messages.extend(&text, turn.row, whole);
            } else {
                let line = format!("{} {text}", label(turn, segment.now_ms, shown));
                messages.push(Side::of(turn.role), &line, Some((turn.row, whole)));
                shown = turn.timestamp_ms.or(shown);
            }
            previous = Some(turn);
        }
    }
    if let Some(line) = omission {
        messages.push(Side::User, &line, None);
    }
    if let Some(question) = layout.probe_question {
        messages.push(Side::User, question, None);
    }
    messages.out
}

/// A turn offered to the frame before its text is read: what the first pass needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pick {
    pub row: RowId,
    pub warmth: f32,
    pub mandatory: bool,
    /// Tokens of the turn's text.
    pub tokens: usize,
}

impl Pick {
    /// The first pass's estimate of the turn's rendered cost.
    fn estimate(&self) -> usize {
        self.tokens + LABEL_ESTIMATE_TOKENS
    }

    /// What the turn is worth to the first pass: its warmth, counted per [`TURN_ROOM_TOKENS`]
    /// of its estimate where it takes more room than that.
    fn value(&self) -> f32 {
        self.warmth / (self.estimate() as f32 / TURN_ROOM_TOKENS as f32).max(1.0)
    }
}

impl Candidate {
    pub fn pick(&self) -> Pick {
        Pick {
            row: self.turn.row,
            warmth: self.warmth,
            mandatory: self.mandatory,
            tokens: self.turn.tokens,
        }
    }
}

/// The first pass: `picks` in priority order (mandatory first, then the warmest for the room
/// they take, newer first among equals; [`priority`]), keeping every mandatory one and the
/// others while the estimate fits `cap`. Returns indices into `picks`, in priority order. A caller can run it on turns whose text is
/// not read yet, and read only what it keeps.
///
/// A user may hold tens of thousands of warm rows and a frame keeps about a hundred, so the
/// order is built a chunk at a time ([`SELECT_CHUNK`] picks first, then twice as many each
/// time: a partial selection, then a sort of the chunk); once every mandatory pick is kept,
/// what is left of the order after each chunk is cut to the picks that fit the room left, so
/// the walk ends as soon as none does. The result is the walk over the fully sorted order (a
/// test holds it to that).
pub fn select(picks: &[Pick], cap: usize) -> Vec<usize> {
    let priority = |a: &usize, b: &usize| priority(&picks[*a], &picks[*b]);
    let mut order: Vec<usize> = (0..picks.len()).collect();
    let mut used = NOTE_ESTIMATE_TOKENS;
    let mut kept = Vec::new();
    let (mut start, mut chunk) = (0, SELECT_CHUNK);
    while start < order.len() {
        let rest = &mut order[start..];
        let end = if rest.len() > chunk {
            rest.select_nth_unstable_by(chunk - 1, priority);
            rest[..chunk].sort_by(priority);
            start + chunk
        } else {
            rest.sort_by(priority);
            order.len()
        };
        for &i in &order[start..end] {
            let pick = &picks[i];
            if pick.mandatory || used + pick.estimate() <= cap {
                used += pick.estimate();
                kept.push(i);
            }
        }
        if !picks[order[end - 1]].mandatory {
            // Every mandatory pick is kept; an optional one that does not fit the room left now
            // never will (the room only shrinks), so it leaves the order unsorted.
            let room = cap.saturating_sub(used);
            let mut position = 0;
            order.retain(|&i| {
                position += 1;
                position <= end || picks[i].estimate() <= room
            });
        }
        (start, chunk) = (end, chunk * 2);
    }
    kept
}

/// The order of [`select`]: mandatory first, then by [`Pick::value`] (warmth, per
/// [`TURN_ROOM_TOKENS`] for a longer turn), newer first among equals.
fn priority(a: &Pick, b: &Pick) -> std::cmp::Ordering {
    b.mandatory
        .cmp(&a.mandatory)
        .then(b.value().total_cmp(&a.value()))
        .then(b.row.cmp(&a.row))
}

/// Select from `candidates` ([`select`]) and render under `cap` tokens as counted by `count`;
/// then, while the exact count is over the cap, drop the last optional turns in [`select`]'s
/// order and render again. The result is within the cap unless the mandatory set alone exceeds
/// it, and then it holds exactly the mandatory set. `outside` is what a caller's own first pass already left
/// out (it counts in the omission line).
pub fn fit(
    candidates: Vec<Candidate>,
    cap: usize,
    layout: &Layout<'_>,
    count: impl Fn(&str) -> usize,
    outside: Omitted,
) -> Frame {
    let picks: Vec<Pick> = candidates.iter().map(Candidate::pick).collect();
    let mandatory = picks.iter().filter(|p| p.mandatory).count();
    let mut selected = select(&picks, cap);
    loop {
        let frame = assemble(
            &candidates,
            &selected,
            cap,
            mandatory,
            outside,
            layout,
            &count,
        );
        let optional = selected.len() - mandatory;
        if frame.tokens <= cap || optional == 0 {
            return frame;
        }
        let mut excess = frame.tokens - cap;
        while selected.len() > mandatory {
            let dropped = selected.pop().expect("optional turns remain");
            let freed = picks[dropped].estimate();
            if freed >= excess {
                break;
            }
            excess -= freed;
        }
    }
}

/// Render the selected candidates and count every message exactly.
fn assemble(
    candidates: &[Candidate],
    selected: &[usize],
    cap: usize,
    mandatory: usize,
    outside: Omitted,
    layout: &Layout<'_>,
    count: &impl Fn(&str) -> usize,
) -> Frame {
    let mut shown = vec![false; candidates.len()];
    for &i in selected {
        shown[i] = true;
    }
    let omitted = candidates
        .iter()
        .zip(&shown)
        .filter(|(_, shown)| !**shown)
        .fold(outside, |o, (c, _)| Omitted {
            turns: o.turns + 1,
            tokens: o.tokens + c.turn.tokens,
        });
    let turns: Vec<&Turn> = selected.iter().map(|&i| &candidates[i].turn).collect();
    let mut messages = render(&turns, layout, omitted);
    for message in &mut messages {
        message.tokens = count(&message.content);
    }
    Frame {
        tokens: messages.iter().map(|m| m.tokens).sum(),
        rows: messages
            .iter()
            .flat_map(|m| m.rows.iter().copied())
            .collect(),
        messages,
        cap,
        mandatory,
        omitted,
    }
}

#[cfg(test)]
mod tests;
