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
use std::collections::HashMap;
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
    /// The message the row is a chunk of (its first row), and the chunk's index in it.
    pub message: RowId,
    pub chunk: u16,
    pub role: Role,
    /// The speaker's name, resolved through the binding log at render time.
    pub speaker: Option<String>,
    pub timestamp_ms: Option<i64>,
    pub text: String,
    /// Tokens of `text`.
    pub tokens: usize,
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
    /// Whether the memory tools ride along (the omission line names one only then).
    pub tools: bool,
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
    fn push(&mut self, side: Side, text: &str, row: Option<RowId>) {
        match self.out.last_mut() {
            Some(last) if last.role == side => {
                last.content.push_str("\n\n");
                last.content.push_str(text);
            }
            _ => self.out.push(Message {
                role: side,
                content: text.to_owned(),
                rows: Vec::new(),
                tokens: 0,
            }),
        }
        if let Some(row) = row {
            self.out.last_mut().expect("just pushed").rows.push(row);
        }
    }

    /// Continue the last message's text (the next chunk of a message already begun).
    fn extend(&mut self, text: &str, row: RowId) {
        let last = self
            .out
            .last_mut()
            .expect("a chunk continues a started message");
        last.content.push_str(text);
        last.rows.push(row);
    }
}

/// Characters of one tool message (a call the agent made, or what a tool returned) that the
/// frame shows: calls are short, results can be whole files. The rest stays stored, whole, and
/// `memory_chain` on the message's id returns it.
pub const TOOL_PREVIEW_CHARS: usize = 600;

/// How much of the tool message being rendered has been shown, chunk after chunk.
#[derive(Debug, Default)]
struct Preview {
    chars: usize,
    cut: bool,
}

impl Preview {
    /// The part of `turn` (a chunk of a tool message) still within [`TOOL_PREVIEW_CHARS`],
    /// with a note where the message is cut; nothing once it was cut.
    fn take<'a>(&mut self, turn: &'a Turn, tools: bool) -> Cow<'a, str> {
        if self.cut {
            return Cow::Borrowed("");
        }
        let room = TOOL_PREVIEW_CHARS.saturating_sub(self.chars);
        match turn.text.char_indices().nth(room) {
            None => {
                self.chars += turn.text.chars().count();
                Cow::Borrowed(turn.text.as_str())
            }
            Some((end, _)) => {
                self.cut = true;
                let rest = if tools {
                    format!("memory_chain #{} returns the whole", turn.message.0)
                } else {
                    "the whole is stored".to_owned()
                };
                Cow::Owned(format!("{} … [cut here; {rest}]", &turn.text[..end]))
            }
        }
    }
}

/// Render `turns` (any order) as messages: grouped by conversation, groups ordered by their most
/// recent row with `layout.current` last, each group opened by a header line on the user side
/// (so the frame starts with a user message), the omission line first when anything was left
/// out, and the probe question last. Token counts are left at zero.
pub fn render(turns: &[&Turn], layout: &Layout<'_>, omitted: Omitted) -> Vec<Message> {
    let mut groups: HashMap<&str, Vec<&Turn>> = HashMap::new();
    for &turn in turns {
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

    let mut messages = Messages::default();
    if omitted.turns > 0 {
        messages.push(Side::User, &omission_line(omitted, layout.tools), None);
    }
    for (conversation, group) in &groups {
        let which = if Some(*conversation) == layout.current {
            "This"
        } else {
            "Earlier"
        };
        let opened = group
            .first()
            .and_then(|t| when_label(t.timestamp_ms, layout.now_ms));
        let header = match &opened {
            Some(when) => format!("[{which} conversation ({conversation}), from {when}]"),
            None => format!("[{which} conversation ({conversation})]"),
        };
        messages.push(Side::User, &header, None);
        let mut shown = group.first().and_then(|t| t.timestamp_ms);
        let mut previous: Option<&Turn> = None;
        let mut preview = Preview::default();
        for &turn in group {
            let continues = previous.is_some_and(|p| {
                p.message == turn.message && p.chunk + 1 == turn.chunk && p.role == turn.role
            });
            if !continues {
                preview = Preview::default();
            }
            let text = if turn.role == Role::Tool {
                preview.take(turn, layout.tools)
            } else {
                Cow::Borrowed(turn.text.as_str())
            };
            if continues {
                messages.extend(&text, turn.row);
            } else {
                let line = format!("{} {text}", label(turn, layout.now_ms, shown));
                messages.push(Side::of(turn.role), &line, Some(turn.row));
                shown = turn.timestamp_ms.or(shown);
            }
            previous = Some(turn);
        }
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MINUTE: i64 = 60_000;
    const DAY: i64 = 24 * 60 * MINUTE;
    /// 2023-05-08 13:56 UTC.
    const MAY_8: i64 = 1_683_554_160_000;

    fn words(text: &str) -> usize {
        text.split_whitespace().count()
    }

    fn turn(row: u64, conversation: &str, role: Role, speaker: &str, text: &str) -> Turn {
        Turn {
            row: RowId(row),
            conversation: conversation.to_owned(),
            message: RowId(row),
            chunk: 0,
            role,
            speaker: Some(speaker.to_owned()),
            timestamp_ms: Some(MAY_8 + row as i64 * MINUTE),
            text: text.to_owned(),
            tokens: words(text),
        }
    }

    #[test]
    fn labels_carry_name_date_and_age() {
        let t = turn(0, "s1", Role::User, "Caroline", "hi");
        assert_eq!(
            label(&t, Some(MAY_8 + 21 * DAY), None),
            "[Caroline, 2023-05-08 13:56, 3 weeks before now]"
        );
        assert_eq!(label(&t, None, None), "[Caroline, 2023-05-08 13:56]");
        assert_eq!(
            label(&t, Some(MAY_8 + 21 * DAY), Some(MAY_8 - 3 * MINUTE)),
            "[Caroline, 13:56]"
        );
        assert_eq!(
            label(&t, Some(MAY_8 + 21 * DAY), Some(MAY_8 + 30_000)),
            "[Caroline]"
        );
        assert_eq!(
            label(&t, Some(MAY_8 + 21 * DAY), Some(MAY_8 - DAY)),
            "[Caroline, 2023-05-08 13:56, 3 weeks before now]"
        );
        let anonymous = Turn {
            speaker: None,
            timestamp_ms: None,
            ..t
        };
        assert_eq!(label(&anonymous, Some(MAY_8), None), "[user]");
    }

    #[test]
    fn ages_use_the_largest_whole_unit() {
        assert_eq!(age_label(30_000), "just now");
        assert_eq!(age_label(MINUTE), "1 minute before now");
        assert_eq!(age_label(59 * MINUTE), "59 minutes before now");
        assert_eq!(age_label(3 * 60 * MINUTE), "3 hours before now");
        assert_eq!(age_label(DAY), "1 day before now");
        assert_eq!(age_label(13 * DAY), "13 days before now");
        assert_eq!(age_label(21 * DAY), "3 weeks before now");
        assert_eq!(age_label(90 * DAY), "3 months before now");
        assert_eq!(age_label(800 * DAY), "2 years before now");
        assert_eq!(age_label(-2 * DAY), "2 days after now");
    }

    #[test]
    fn groups_by_conversation_with_the_current_one_last_and_merges_sides() {
        let turns = [
            turn(
                1,
                "s1",
                Role::User,
                "Caroline",
                "I went to the support group.",
            ),
            turn(2, "s1", Role::Assistant, "Melanie", "How was it?"),
            turn(3, "s2", Role::User, "Caroline", "Painting today."),
            turn(4, "s2", Role::User, "Caroline", "A sunset."),
            turn(5, "s1", Role::User, "Caroline", "It was great."),
        ];
        let refs: Vec<&Turn> = turns.iter().collect();
        let layout = Layout {
            now_ms: Some(MAY_8 + 10 * MINUTE),
            current: Some("s2"),
            probe_question: Some("What did Caroline paint?"),
            tools: false,
        };
        let messages = render(&refs, &layout, Omitted::default());
        let shape: Vec<(Side, Vec<u64>)> = messages
            .iter()
            .map(|m| (m.role, m.rows.iter().map(|r| r.0).collect()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (Side::User, vec![1]),
                (Side::Assistant, vec![2]),
                (Side::User, vec![5, 3, 4]),
            ]
        );
        assert_eq!(
            messages[0].content,
            "[Earlier conversation (s1), from 2023-05-08 13:57, 9 minutes before now]\n\n\
             [Caroline] I went to the support group."
        );
        assert_eq!(
            messages[2].content,
            "[Caroline, 14:01] It was great.\n\n\
             [This conversation (s2), from 2023-05-08 13:59, 7 minutes before now]\n\n\
             [Caroline] Painting today.\n\n\
             [Caroline, 14:00] A sunset.\n\n\
             What did Caroline paint?"
        );
    }

    #[test]
    fn a_group_opening_on_the_assistant_side_still_starts_with_a_user_message() {
        let turns = [turn(7, "s9", Role::Assistant, "Melanie", "Hello.")];
        let refs: Vec<&Turn> = turns.iter().collect();
        let messages = render(&refs, &Layout::default(), Omitted::default());
        assert_eq!(messages[0].role, Side::User);
        assert_eq!(
            messages[0].content,
            "[Earlier conversation (s9), from 2023-05-08 14:03]"
        );
        assert_eq!(messages[1].role, Side::Assistant);
    }

    #[test]
    fn chunks_of_one_message_join_verbatim_under_one_label() {
        let mut first = turn(10, "s1", Role::User, "Ann", "Part one. ");
        let mut second = turn(11, "s1", Role::User, "Ann", "Part two.");
        first.message = RowId(10);
        second.message = RowId(10);
        second.chunk = 1;
        let messages = render(&[&first, &second], &Layout::default(), Omitted::default());
        assert_eq!(
            messages[0].content,
            "[Earlier conversation (s1), from 2023-05-08 14:06]\n\n[Ann] Part one. Part two."
        );
        assert_eq!(messages[0].rows, vec![RowId(10), RowId(11)]);
    }

    #[test]
    fn the_omission_line_names_the_tool_only_when_tools_ride_along() {
        let omitted = Omitted {
            turns: 3,
            tokens: 120,
        };
        assert_eq!(
            omission_line(omitted, true),
            "[3 more remembered turns (120 tokens) did not fit in this frame; \
             memory_reopen returns them.]"
        );
        assert!(!omission_line(omitted, false).contains("memory"));
    }

    fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
        proptest::collection::vec(
            (
                prop_oneof![4 => 1usize..60, 1 => 60usize..400],
                0.0f32..3.0,
                proptest::bool::weighted(0.15),
                0u8..3,
            ),
            1..60,
        )
        .prop_map(|specs| {
            specs
                .into_iter()
                .enumerate()
                .map(|(i, (len, warmth, mandatory, conv))| {
                    let role = if i % 3 == 0 {
                        Role::Assistant
                    } else {
                        Role::User
                    };
                    let text = vec!["word"; len].join(" ");
                    Candidate {
                        turn: turn(i as u64, &format!("c{conv}"), role, "Sam", &text),
                        warmth,
                        mandatory,
                    }
                })
                .collect()
        })
    }

    #[test]
    fn a_long_turn_is_kept_before_shorter_ones_only_when_warmer_for_its_room() {
        let pick = |row, warmth, tokens| Pick {
            row: RowId(row),
            warmth,
            mandatory: false,
            tokens,
        };
        // Room for the long turn or for both short ones, not for all three.
        let cap = NOTE_ESTIMATE_TOKENS + 2 * (100 + LABEL_ESTIMATE_TOKENS);
        let long = 2 * (100 + LABEL_ESTIMATE_TOKENS) - LABEL_ESTIMATE_TOKENS;
        // The long turn takes the room of almost two: at 0.9 it is worth 0.48 for each 128 tokens.
        let cooler = [pick(1, 0.9, long), pick(2, 0.6, 100), pick(3, 0.5, 100)];
        assert_eq!(select(&cooler, cap), vec![1, 2]);
        let warmer = [pick(1, 0.9, long), pick(2, 0.4, 100), pick(3, 0.3, 100)];
        assert_eq!(select(&warmer, cap), vec![0]);
        // Turns within the room of one are ordered by warmth alone.
        let short = [pick(1, 0.2, 20), pick(2, 0.3, 100), pick(3, 0.25, 5)];
        assert_eq!(select(&short, usize::MAX), vec![1, 2, 0]);
    }

    /// [`select`]'s specification: the walk over every pick in full priority order.
    fn select_by_full_sort(picks: &[Pick], cap: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..picks.len()).collect();
        order.sort_by(|&a, &b| priority(&picks[a], &picks[b]));
        let mut used = NOTE_ESTIMATE_TOKENS;
        order
            .into_iter()
            .filter(|&i| {
                let keep = picks[i].mandatory || used + picks[i].estimate() <= cap;
                if keep {
                    used += picks[i].estimate();
                }
                keep
            })
            .collect()
    }

    /// Picks of distinct rows, many of them (past several chunks), warmth often tied; short
    /// turns are rare, so the room left after a chunk is often still open to one further on.
    /// Mandatory picks are few, or more than a chunk holds.
    fn many_picks() -> impl Strategy<Value = Vec<Pick>> {
        prop_oneof![Just(0.02), Just(0.5)]
            .prop_flat_map(|mandatory_share| {
                proptest::collection::vec(
                    (
                        prop_oneof![Just(0.5f32), Just(1.0), 0.0f32..4.0],
                        proptest::bool::weighted(mandatory_share),
                        prop_oneof![1 => 0usize..10, 99 => 10usize..2_000],
                    ),
                    0..3_000,
                )
            })
            .prop_map(|picks| {
                picks
                    .into_iter()
                    .enumerate()
                    .map(|(row, (warmth, mandatory, tokens))| Pick {
                        row: RowId(row as u64 * 7 % 3_001),
                        warmth,
                        mandatory,
                        tokens,
                    })
                    .collect()
            })
    }

    #[test]
    fn a_tool_message_shows_its_start_and_says_where_the_rest_is() {
        let long = "x".repeat(TOOL_PREVIEW_CHARS - 10);
        let mut first = turn(20, "s1", Role::Tool, "", &long);
        first.message = RowId(20);
        let mut second = turn(21, "s1", Role::Tool, "", "0123456789abcdefghij");
        (second.message, second.chunk) = (RowId(20), 1);
        let mut third = turn(22, "s1", Role::Tool, "", "never shown");
        (third.message, third.chunk) = (RowId(20), 2);
        let short = turn(23, "s1", Role::Tool, "", "called Bash {\"command\":\"ls\"}");
        let layout = Layout {
            tools: true,
            ..Layout::default()
        };
        let out = render(
            &[&first, &second, &third, &short],
            &layout,
            Omitted::default(),
        );
        let text = &out[0].content;
        assert!(
            text.contains(&format!(
                "{long}0123456789 … [cut here; memory_chain #20 returns the whole]"
            )),
            "{text}"
        );
        assert!(!text.contains("abcdefghij") && !text.contains("never shown"));
        assert!(
            text.ends_with("called Bash {\"command\":\"ls\"}"),
            "a short call is whole"
        );
        assert_eq!(out[0].rows, [RowId(20), RowId(21), RowId(22), RowId(23)]);
        let quiet = render(&[&first, &second], &Layout::default(), Omitted::default());
        assert!(
            quiet[0]
                .content
                .ends_with("… [cut here; the whole is stored]")
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn select_keeps_what_the_walk_over_the_full_order_keeps(
            picks in many_picks(),
            cap in prop_oneof![0usize..500, 0usize..200_000, 0usize..5_000_000],
        ) {
            prop_assert_eq!(select(&picks, cap), select_by_full_sort(&picks, cap));
        }
    }

    proptest! {
        #[test]
        fn the_cap_holds_unless_the_mandatory_set_alone_exceeds_it(
            cs in candidates(),
            cap in 0usize..3_000,
            tools in any::<bool>(),
        ) {
            let layout = Layout { tools, current: Some("c1"), ..Layout::default() };
            let frame = fit(cs.clone(), cap, &layout, words, Omitted::default());
            let mandatory: Vec<RowId> = cs.iter().filter(|c| c.mandatory).map(|c| c.turn.row).collect();
            for row in &mandatory {
                prop_assert!(frame.rows.contains(row), "mandatory {row:?} dropped");
            }
            if frame.tokens > cap {
                let mut shown = frame.rows.clone();
                shown.sort();
                let mut expected = mandatory.clone();
                expected.sort();
                prop_assert_eq!(shown, expected);
            }
            prop_assert_eq!(frame.tokens, frame.messages.iter().map(|m| words(&m.content)).sum::<usize>());
            prop_assert_eq!(frame.omitted.turns, cs.len() - frame.rows.len());
            prop_assert_eq!(frame.messages.first().map(|m| m.role), Some(Side::User));
            for pair in frame.messages.windows(2) {
                prop_assert_ne!(pair[0].role, pair[1].role);
            }
        }

        #[test]
        fn warmer_optional_turns_for_their_room_are_kept_before_cooler_ones(cs in candidates(), cap in 0usize..3_000) {
            let frame = fit(cs.clone(), cap, &Layout::default(), words, Omitted::default());
            let shown = |c: &&Candidate| !c.mandatory && frame.rows.contains(&c.turn.row);
            let left_out = |c: &&Candidate| !c.mandatory && !frame.rows.contains(&c.turn.row);
            // An optional turn worth more for its room is left out while one worth less is
            // shown only when it was the larger of the two: it did not fit where the other did.
            for out in cs.iter().filter(left_out) {
                let worth = out.pick().value();
                for kept in cs.iter().filter(shown).filter(|k| k.pick().value() < worth) {
                    prop_assert!(out.turn.tokens > kept.turn.tokens, "{out:?} left out, {kept:?} kept");
                }
            }
        }

        #[test]
        fn every_turn_appears_once_and_the_probe_question_once_at_the_end(cs in candidates()) {
            let layout = Layout { probe_question: Some("the live question?"), ..Layout::default() };
            let frame = fit(cs.clone(), usize::MAX / 2, &layout, words, Omitted::default());
            let mut rows = frame.rows.clone();
            rows.sort();
            rows.dedup();
            prop_assert_eq!(rows.len(), cs.len());
            let text: String = frame.messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n");
            prop_assert_eq!(text.matches("the live question?").count(), 1);
            prop_assert!(text.ends_with("the live question?"));
        }
    }
}
