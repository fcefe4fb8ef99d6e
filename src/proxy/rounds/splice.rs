//! The splice of a reply's rounds into one response (`docs/proxy.md`, "Memory tools"): each
//! upstream event held back, passed or rewritten, indices and ids continued across rounds,
//! usage summed. What every format shares is here; each format's own part is its
//! [`FormatSplice`].

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use crate::memory_tools;
use crate::proxy::format::{Event, FormatSplice};
use crate::proxy::provider::Failure;
use crate::proxy::sse;
use crate::proxy::wire::Format;

use super::{Pending, Refused, Round};

/// Add every number of `usage` into `total` (objects field by field; other values replace).
fn add_usage(total: &mut Value, usage: &Value) {
    match (total, usage) {
        (Value::Object(total), Value::Object(usage)) => {
            for (key, value) in usage {
                match total.get_mut(key) {
                    Some(slot) => add_usage(slot, value),
                    None => {
                        total.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (total @ Value::Number(_), Value::Number(n)) => {
            let sum = match (total.as_u64(), n.as_u64()) {
                (Some(a), Some(b)) => json!(a + b),
                _ => json!(total.as_f64().unwrap_or(0.0) + n.as_f64().unwrap_or(0.0)),
            };
            *total = sum;
        }
        (total, usage) if !usage.is_null() => *total = usage.clone(),
        _ => {}
    }
}

/// Replace `base`'s fields with those `later` sets (a later report of the same round's usage).
pub(in crate::proxy) fn override_usage(base: &mut Value, later: &Value) {
    let Value::Object(later) = later else { return };
    if !base.is_object() {
        *base = json!({});
    }
    if let Value::Object(base) = base {
        for (key, value) in later {
            if !value.is_null() {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

/// `key` of an event, `null` when it has none.
pub(in crate::proxy) fn field<'a>(event: &'a Map<String, Value>, key: &str) -> &'a Value {
    event.get(key).unwrap_or(&Value::Null)
}

/// What one upstream round did, as the loop needs it.
#[derive(Debug, Default)]
pub(super) struct Ended {
    /// Our calls in the round.
    pub(super) ours: Vec<Pending>,
    /// The round ended with nothing but our calls: run them and call the upstream again.
    pub(super) again: bool,
}

/// The splice of rounds into one response: which events pass, renumbered how. Public for the
/// fuzz targets (`fuzz/`), which feed it arbitrary streams: [`Splice::new`], [`Splice::feed`]
/// and [`Splice::flush`] relay one round as a streamed reply does.
#[derive(Debug)]
pub struct Splice {
    format: Format,
    /// This round's stream, cut into events.
    events: sse::Events,
    /// What the splice keeps in every format.
    pub(super) state: SpliceState,
    /// What only this format keeps, and what becomes of each of its events.
    own: Box<dyn FormatSplice>,
}

/// What the splice keeps in every format: the client's numbering, our calls, the round so far,
/// the usage, the first round's id.
#[derive(Debug, Default)]
pub(in crate::proxy) struct SpliceState {
    /// Whether our calls are intercepted this round (not on the last one: the tools are gone).
    pub(in crate::proxy) intercept: bool,
    /// Rounds finished before this one.
    pub(in crate::proxy) finished: usize,
    /// The next index the client will see (Chat tool calls, Responses output items, Messages
    /// content blocks), and where this round's indices start.
    next_index: u64,
    base_index: u64,
    /// This round's upstream index → the client's index, `None` for our calls.
    pub(in crate::proxy) map: HashMap<u64, Option<u64>>,
    /// This round's upstream index of each of our calls → its place in `ours`.
    pub(in crate::proxy) ours_at: HashMap<u64, usize>,
    pub(in crate::proxy) ours: Vec<Pending>,
    pub(in crate::proxy) harness_calls: usize,
    pub(in crate::proxy) round: Round,
    /// The usage of the finished rounds, summed, and of this round so far.
    usage: Value,
    pub(in crate::proxy) round_usage: Value,
    /// The first round's message id (Chat chunks carry it on every chunk).
    pub(in crate::proxy) id: Option<Value>,
    /// This round ends in our calls only: its remaining events are held back.
    pub(in crate::proxy) holding: bool,
}

impl Splice {
    /// The splice of a new response in `format`, its first round about to start; an event
    /// may be at most `limit` bytes.
    pub fn new(format: Format, limit: usize) -> Self {
        Self {
            format,
            events: sse::Events::new(limit),
            state: SpliceState {
                intercept: true,
                ..SpliceState::default()
            },
            own: format.wire().splice(),
        }
    }

    /// A Responses reply that a memory round continued as another response: the id the
    /// client got (the first round's) and the last round's.
    pub(super) fn continued(&self) -> Option<(String, String)> {
        let shown = self.state.id.as_ref()?.as_str()?;
        let latest = self.own.latest_id()?;
        (shown != latest).then(|| (shown.to_owned(), latest.to_owned()))
    }

    /// Close the round: what it asked of us; the state moves on to the next round.
    pub(super) fn end_round(&mut self) -> (Ended, Round) {
        self.own.end_round();
        self.state.end_round()
    }

    /// Take in the next bytes of this round's stream: what reaches the client of the events
    /// they complete, in order, each one whole event; refused when an event runs over the
    /// limit.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, sse::Oversize> {
        let mut events = std::mem::replace(&mut self.events, sse::Events::new(0));
        let mut out = Vec::new();
        let fed = events.feed(bytes, |raw, _| out.extend(self.event(raw)));
        self.events = events;
        fed.map(|()| out)
    }

    /// This round's stream has ended: what reaches the client of its last event when the
    /// upstream left off the blank line after it, or part of it (the client gets one whole).
    pub fn flush(&mut self) -> Option<Vec<u8>> {
        let tail = self.events.take_rest();
        if tail.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        let mut out = self.event(&tail)?;
        let line_ends = out
            .iter()
            .rev()
            .take_while(|&&b| matches!(b, b'\r' | b'\n'));
        out.truncate(out.len() - line_ends.count());
        out.extend_from_slice(b"\n\n");
        Some(out)
    }

    /// What of one upstream event (`raw`, its blank line included) reaches the client.
    fn event(&mut self, raw: &[u8]) -> Option<Vec<u8>> {
        let event = match serde_json::from_str::<Value>(&sse::event_data(raw)) {
            Ok(Value::Object(event)) => self.own.event(&mut self.state, event),
            // `[DONE]`, comments, anything else: as it came, unless the round is held back.
            _ if self.state.holding => Event::Hold,
            _ => Event::Pass,
        };
        match event {
            Event::Hold => None,
            Event::Pass => Some(raw.to_vec()),
            Event::Rewrite(bytes) => Some(bytes),
        }
    }

    /// The events that end a streamed reply whose later round the upstream `refused`: its
    /// own error where it answered with one (Chat, Gemini: `{"error": …}`; Messages: an
    /// `error` event), else ours; Responses gets an `error` event and then the first round's
    /// response closed as `response.failed`, numbered on from the last event the client got.
    pub(super) fn refusal(&mut self, refused: &Refused) -> Vec<Vec<u8>> {
        let theirs = refused
            .answer
            .as_ref()
            .and_then(|(_, body)| serde_json::from_slice::<Map<String, Value>>(body).ok())
            .filter(|body| body.get("error").is_some_and(Value::is_object));
        let body = theirs.map_or_else(
            || {
                self.format
                    .provider()
                    .error_body(Failure::Upstream, &refused.message)
            },
            Value::Object,
        );
        let event = sse::error_event(self.format, &body, self.own.next_sequence());
        let failed = self.own.failed(&self.state, &body);
        std::iter::once(event).chain(failed).collect()
    }

    /// One whole (non-streamed) reply body: our calls taken out and the round recorded.
    pub(super) fn whole(&mut self, body: &Value) -> Ended {
        self.own.whole(&mut self.state, body);
        let (ended, round) = self.end_round();
        self.state.round = round;
        ended
    }

    /// The last whole body as the client gets it: our calls out, the earlier rounds' text in
    /// front, usage summed over every round.
    pub(super) fn merged(&self, mut body: Value, earlier: &[Round]) -> Value {
        let wire = self.format.wire();
        wire.merge_rounds(&mut body, earlier);
        if !self.state.usage.is_null() {
            body[wire.usage_key()] = self.state.usage.clone();
        }
        body
    }
}

impl SpliceState {
    /// Close the round: what it asked of us; the state moves on to the next round.
    fn end_round(&mut self) -> (Ended, Round) {
        let ended = Ended {
            ours: std::mem::take(&mut self.ours),
            again: self.holding,
        };
        add_usage(&mut self.usage, &std::mem::take(&mut self.round_usage));
        self.finished += 1;
        self.base_index = self.next_index;
        self.map.clear();
        self.ours_at.clear();
        self.harness_calls = 0;
        self.holding = false;
        (ended, std::mem::take(&mut self.round))
    }

    /// The usage of every round so far, this one included.
    pub(in crate::proxy) fn total_usage(&self) -> Value {
        let mut total = self.usage.clone();
        add_usage(&mut total, &self.round_usage);
        total
    }

    /// Keep the first round's message id (under `key`) on every event: the first one seen is
    /// remembered, a later round's replaced by it; whether `event` was changed.
    pub(in crate::proxy) fn same_id(&mut self, event: &mut Map<String, Value>, key: &str) -> bool {
        match (&self.id, event.get(key)) {
            (None, Some(id)) => self.id = Some(id.clone()),
            (Some(first), Some(id)) if first != id => {
                event.insert(key.into(), first.clone());
                return true;
            }
            _ => {}
        }
        false
    }

    /// Whether a round whose calls are `ours` ends in them alone (stop reason `reason`): then the
    /// loop goes on. A reply cut short (length, filter) never does.
    pub(in crate::proxy) fn ends_in_ours(&self, reason: &str) -> bool {
        !self.ours.is_empty()
            && self.harness_calls == 0
            && !matches!(
                reason,
                "length" | "max_tokens" | "content_filter" | "MAX_TOKENS" | "SAFETY"
            )
    }

    /// The index the client sees for upstream index `at`, first seen as a call of `name`
    /// (`None`: ours, intercepted).
    pub(in crate::proxy) fn slot(&mut self, at: u64, call: Option<(&str, &str)>) -> Option<u64> {
        if let Some(slot) = self.map.get(&at) {
            return *slot;
        }
        let slot = match call {
            Some((name, id)) if self.intercept && memory_tools::is_memory_tool(name) => {
                self.ours_at.insert(at, self.ours.len());
                self.ours.push(Pending {
                    id: id.to_owned(),
                    name: name.to_owned(),
                    ..Pending::default()
                });
                None
            }
            _ => {
                if call.is_some() {
                    self.harness_calls += 1;
                }
                // The upstream's own numbering, shifted past the earlier rounds and closed over
                // the gaps our calls left; a round without ours keeps its numbers.
                let below = self.ours_at.keys().filter(|&&ours| ours < at).count() as u64;
                let out = self.base_index + at - below;
                self.next_index = self.next_index.max(out + 1);
                Some(out)
            }
        };
        self.map.insert(at, slot);
        slot
    }

    /// Add `piece` to the arguments of our call at upstream index `at`, if it is ours.
    pub(in crate::proxy) fn argument(&mut self, at: u64, piece: &str) {
        if let Some(&i) = self.ours_at.get(&at) {
            self.ours[i].arguments.push_str(piece);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the SSE fuzz target (`fuzz/`) on a recorded gateway stream that ends
    /// `data: [DONE]\n`: the client got the event and a stray line end after its blank line.
    #[test]
    fn a_last_event_without_its_blank_line_is_relayed_as_one_whole_event() {
        for (tail, relayed) in [
            ("data: [DONE]", "data: [DONE]\n\n"),
            ("data: [DONE]\n", "data: [DONE]\n\n"),
            ("data: [DONE]\r\n\r", "data: [DONE]\n\n"),
            ("event: ping\r\ndata: {}\r", "event: ping\r\ndata: {}\n\n"),
        ] {
            let mut splice = Splice::new(Format::Messages, 1 << 20);
            assert!(splice.feed(tail.as_bytes()).unwrap().is_empty(), "{tail:?}");
            let out = splice.flush().unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), relayed, "{tail:?}");
        }
        let mut splice = Splice::new(Format::Chat, 1 << 20);
        splice.feed(b"data: [DONE]\n\n \n").unwrap();
        assert_eq!(
            splice.flush(),
            None,
            "whitespace after the last event is no event"
        );
    }

    #[test]
    fn usage_sums_numbers_field_by_field() {
        let mut total = Value::Null;
        add_usage(
            &mut total,
            &json!({"prompt_tokens": 10, "completion_tokens": 2, "details": {"cached_tokens": 1}}),
        );
        add_usage(
            &mut total,
            &json!({"prompt_tokens": 15, "completion_tokens": 3, "details": {"cached_tokens": 0}, "tier": "standard"}),
        );
        assert_eq!(
            total,
            json!({"prompt_tokens": 25, "completion_tokens": 5, "details": {"cached_tokens": 1}, "tier": "standard"})
        );
    }
}
