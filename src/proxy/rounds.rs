//! The memory tools inside the reply (`docs/proxy.md`, "Memory tools"): the tools offered in
//! the provider's own schema, and the loop that runs them in the middle of a reply.
//!
//! The upstream's events pass through one at a time. A call of one of our tools is not
//! forwarded: its events are held back, and when the upstream's reply ends with nothing but our
//! calls, its closing events are held back too. The proxy runs the calls, appends each call and
//! its result to the turn's context (on top of the frame), and calls the upstream again; that
//! stream continues the same response: its opening events are dropped, content block and tool
//! call indices continue where the client's last one ended, the message id stays the first
//! round's, and the closing usage is the sum over every round. While a tool runs or the next
//! round is awaited the client gets a keep-alive (an SSE comment, or Anthropic's `ping`).
//!
//! The loop is bounded: at most `ProxyConfig::tool_rounds` upstream calls per reply, and on the
//! last one our tools are withdrawn (the earlier calls and results stay in the context as plain
//! text), so the model must answer. A reply that calls the harness's tools as well as ours
//! returns the harness's calls as usual; ours still run (their results are reheated) but are
//! never stored as rows: they only quote stored rows.
//!
//! Every chat format carries the tools (Chat Completions, Responses, Messages, Gemini), streamed
//! and whole.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::HeaderMap;
use hyper::{Response, StatusCode};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::memory_tools::{self, Call, TurnState};
use crate::recall::reheat_returned;
use crate::types::UserId;

use super::provider::Failure;
use super::wire::{self, Format};
use super::{
    Body, Channel, ProxyConfig, Reply, State, failure, forward, read_body, strip_upstream_headers,
};

/// Upstream calls per reply when not configured: up to three rounds of tool calls, then the
/// answer.
pub const DEFAULT_ROUNDS: usize = 4;

/// How often the client hears a keep-alive while a tool runs or the next round is awaited:
/// well inside the idle timeouts of common clients and load balancers (30 s and more).
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// Whether the memory tools can ride along with requests in `format`.
pub fn supports(format: Format) -> bool {
    matches!(
        format,
        Format::Chat | Format::Responses | Format::Messages | Format::Gemini
    )
}

/// A tool as `format` declares it.
fn declared(format: Format, spec: &memory_tools::Spec) -> Value {
    match format {
        Format::Messages => json!({
            "name": spec.name,
            "description": spec.description,
            "input_schema": spec.parameters,
        }),
        Format::Gemini => json!({
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        }),
        Format::Responses => json!({
            "type": "function",
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        }),
        Format::Chat => json!({
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": spec.parameters,
            },
        }),
    }
}

/// Whether an entry of a body's `tools` is one of ours (Gemini: the entry declaring ours).
fn is_ours(format: Format, tool: &Value) -> bool {
    let named = |name: &Value| name.as_str().is_some_and(memory_tools::is_memory_tool);
    match format {
        Format::Messages | Format::Responses => named(&tool["name"]),
        Format::Chat => named(&tool["function"]["name"]),
        Format::Gemini => tool["functionDeclarations"]
            .as_array()
            .is_some_and(|d| !d.is_empty() && d.iter().all(|f| named(&f["name"]))),
    }
}

/// Add the memory tools after the harness's own tools (Gemini: one more `functionDeclarations`
/// entry).
pub fn offer(format: Format, body: &mut Map<String, Value>) {
    let declared: Vec<Value> = memory_tools::specs()
        .iter()
        .map(|s| declared(format, s))
        .collect();
    let added = match format {
        Format::Gemini => vec![json!({"functionDeclarations": declared})],
        Format::Chat | Format::Responses | Format::Messages => declared,
    };
    match body.get_mut("tools") {
        Some(Value::Array(list)) => list.extend(added),
        _ => {
            body.insert("tools".into(), Value::Array(added));
        }
    }
}

/// Remove the memory tools (and the list, when nothing of the harness's is left).
fn withdraw(format: Format, body: &mut Map<String, Value>) {
    if let Some(Value::Array(list)) = body.get_mut("tools") {
        list.retain(|tool| !is_ours(format, tool));
        if list.is_empty() {
            body.remove("tools");
        }
    }
}

/// One call of ours the upstream made.
#[derive(Debug, Clone, Default)]
struct Pending {
    id: String,
    name: String,
    /// The arguments' JSON text, as streamed.
    arguments: String,
    /// Gemini: the call's part as it came (its thought signature must go back with it).
    part: Value,
}

/// One finished round of ours: what the model said besides the calls, the calls, their results.
#[derive(Debug, Clone, Default)]
struct Round {
    /// Chat: the assistant text.
    text: String,
    /// Messages: the content blocks other than our calls (text, thinking with its signature).
    blocks: Vec<Value>,
    calls: Vec<(Pending, String)>,
}

impl Round {
    /// The round in the context, as `format`'s messages (Responses: input items): structured
    /// tool calls and results, or plain text once the tools are withdrawn.
    fn messages(&self, format: Format, structured: bool) -> Vec<Value> {
        if !structured {
            let mut said = match format {
                Format::Messages | Format::Gemini => self
                    .blocks
                    .iter()
                    .filter(|b| b["thought"] != true)
                    .filter_map(|b| b["text"].as_str())
                    .collect::<String>(),
                Format::Responses => self
                    .blocks
                    .iter()
                    .filter_map(|item| wire::text_of(&item["content"]))
                    .collect::<Vec<_>>()
                    .join("\n\n"),
                Format::Chat => self.text.clone(),
            };
            let mut results = String::new();
            for (call, result) in &self.calls {
                if !said.is_empty() {
                    said.push('\n');
                }
                said.push_str(&format!("[called {} {}]", call.name, call.arguments));
                if !results.is_empty() {
                    results.push_str("\n\n");
                }
                results.push_str(result);
            }
            return match format {
                Format::Gemini => vec![
                    json!({"role": "model", "parts": [{"text": said}]}),
                    json!({"role": "user", "parts": [{"text": results}]}),
                ],
                Format::Chat | Format::Responses | Format::Messages => vec![
                    json!({"role": "assistant", "content": said}),
                    json!({"role": "user", "content": results}),
                ],
            };
        }
        match format {
            Format::Responses => {
                let mut items = self.blocks.clone();
                for (call, _) in &self.calls {
                    items.push(json!({"type": "function_call", "call_id": call.id, "name": call.name, "arguments": call.arguments}));
                }
                let outputs = self.calls.iter().map(|(call, result)| {
                    json!({"type": "function_call_output", "call_id": call.id, "output": result})
                });
                items.extend(outputs);
                items
            }
            Format::Gemini => {
                let mut parts = self.blocks.clone();
                let mut answers = Vec::new();
                for (call, result) in &self.calls {
                    parts.push(call.part.clone());
                    let mut answer = json!({"name": call.name, "response": {"result": result}});
                    if !call.id.is_empty() {
                        answer["id"] = json!(call.id);
                    }
                    answers.push(json!({"functionResponse": answer}));
                }
                vec![
                    json!({"role": "model", "parts": parts}),
                    json!({"role": "user", "parts": answers}),
                ]
            }
            Format::Messages => {
                // Providers refuse empty text blocks; a block that only opened says nothing.
                let mut content: Vec<Value> = self
                    .blocks
                    .iter()
                    .filter(|b| {
                        b["type"] != "text" || b["text"].as_str().is_some_and(|t| !t.is_empty())
                    })
                    .cloned()
                    .collect();
                let mut results = Vec::new();
                for (call, result) in &self.calls {
                    let input: Value =
                        serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
                    content.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
                    results.push(
                        json!({"type": "tool_result", "tool_use_id": call.id, "content": result}),
                    );
                }
                vec![
                    json!({"role": "assistant", "content": content}),
                    json!({"role": "user", "content": results}),
                ]
            }
            Format::Chat => {
                let calls: Vec<Value> = self
                    .calls
                    .iter()
                    .map(|(call, _)| json!({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}))
                    .collect();
                let content = if self.text.is_empty() {
                    Value::Null
                } else {
                    Value::String(self.text.clone())
                };
                // Chat takes one `tool` message per call, after the assistant's.
                let mut messages =
                    vec![json!({"role": "assistant", "content": content, "tool_calls": calls})];
                messages.extend(self.calls.iter().map(|(call, result)| {
                    json!({"role": "tool", "tool_call_id": call.id, "content": result})
                }));
                messages
            }
        }
    }
}

/// The body of round `rounds.len()`: the first round's body, then every finished round; on
/// the last round the tools are withdrawn and the rounds appended as plain text.
fn body_for(format: Format, base: &Map<String, Value>, rounds: &[Round], last: bool) -> Vec<u8> {
    let mut body = base.clone();
    if last {
        withdraw(format, &mut body);
    }
    if let Some(Value::Array(messages)) = body.get_mut(format.list()) {
        for round in rounds {
            messages.extend(round.messages(format, !last));
        }
    }
    serde_json::to_vec(&Value::Object(body)).expect("a JSON value serialises")
}

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
fn override_usage(base: &mut Value, later: &Value) {
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
fn field<'a>(event: &'a Map<String, Value>, key: &str) -> &'a Value {
    event.get(key).unwrap_or(&Value::Null)
}

/// What one upstream round did, as the loop needs it.
#[derive(Debug, Default)]
struct Ended {
    /// Our calls in the round.
    ours: Vec<Pending>,
    /// The round ended with nothing but our calls: run them and call the upstream again.
    again: bool,
}

/// The splice of rounds into one response: which events pass, renumbered how. Public for the
/// fuzz targets (`fuzz/`), which feed it arbitrary streams: [`Splice::new`], [`Splice::feed`]
/// and [`Splice::flush`] relay one round as a streamed reply does.
#[derive(Debug)]
pub struct Splice {
    format: Format,
    /// This round's stream, cut into events.
    events: wire::Events,
    /// Whether our calls are intercepted this round (not on the last one: the tools are gone).
    intercept: bool,
    /// Rounds finished before this one.
    finished: usize,
    /// The next index the client will see (Chat tool calls, Responses output items, Messages
    /// content blocks), and where this round's indices start.
    next_index: u64,
    base_index: u64,
    /// This round's upstream index → the client's index, `None` for our calls.
    map: HashMap<u64, Option<u64>>,
    /// This round's upstream block index → its place in `round.blocks` (Messages).
    block_at: HashMap<u64, usize>,
    /// This round's upstream index of each of our calls → its place in `ours`.
    ours_at: HashMap<u64, usize>,
    ours: Vec<Pending>,
    harness_calls: usize,
    round: Round,
    /// The usage of the finished rounds, summed, and of this round so far.
    usage: Value,
    round_usage: Value,
    /// The first round's message id (Chat chunks carry it on every chunk).
    id: Option<Value>,
    /// This round ends in our calls only: its remaining events are held back.
    holding: bool,
    /// Responses sequence numbers: what is added to the upstream's (events held back, earlier
    /// rounds), the last one the client got, and whether this round has set the shift yet.
    sequence_shift: i64,
    last_sequence: Option<u64>,
    sequenced: bool,
    /// Every output item the client has seen, all rounds (Responses: the closing response
    /// lists them).
    output: Vec<Value>,
    /// The response the first round's `response.created` announced (Responses: a refused
    /// later round closes it as failed), and the id of the latest round's.
    created: Option<Value>,
    latest_id: Option<String>,
}

impl Splice {
    /// The splice of a new response in `format`, its first round about to start; an event
    /// may be at most `limit` bytes.
    pub fn new(format: Format, limit: usize) -> Self {
        Self {
            format,
            events: wire::Events::new(limit),
            intercept: true,
            finished: 0,
            next_index: 0,
            base_index: 0,
            map: HashMap::new(),
            block_at: HashMap::new(),
            ours_at: HashMap::new(),
            ours: Vec::new(),
            harness_calls: 0,
            round: Round::default(),
            usage: Value::Null,
            round_usage: Value::Null,
            id: None,
            holding: false,
            sequence_shift: 0,
            last_sequence: None,
            sequenced: false,
            output: Vec::new(),
            created: None,
            latest_id: None,
        }
    }

    /// A Responses reply that a memory round continued as another response: the id the
    /// client got (the first round's) and the last round's.
    fn continued(&self) -> Option<(String, String)> {
        let shown = self.id.as_ref()?.as_str()?;
        let latest = self.latest_id.as_deref()?;
        (shown != latest).then(|| (shown.to_owned(), latest.to_owned()))
    }

    /// Close the round: what it asked of us; the state moves on to the next round.
    fn end_round(&mut self) -> (Ended, Round) {
        let ended = Ended {
            ours: std::mem::take(&mut self.ours),
            again: self.holding,
        };
        add_usage(&mut self.usage, &std::mem::take(&mut self.round_usage));
        self.finished += 1;
        self.base_index = self.next_index;
        self.sequenced = false;
        self.map.clear();
        self.block_at.clear();
        self.ours_at.clear();
        self.harness_calls = 0;
        self.holding = false;
        (ended, std::mem::take(&mut self.round))
    }

    /// The usage of every round so far, this one included.
    fn total_usage(&self) -> Value {
        let mut total = self.usage.clone();
        add_usage(&mut total, &self.round_usage);
        total
    }

    /// Whether a round whose calls are `ours` ends in them alone (stop reason `reason`): then the
    /// loop goes on. A reply cut short (length, filter) never does.
    fn ends_in_ours(&self, reason: &str) -> bool {
        !self.ours.is_empty()
            && self.harness_calls == 0
            && !matches!(
                reason,
                "length" | "max_tokens" | "content_filter" | "MAX_TOKENS" | "SAFETY"
            )
    }

    /// The index the client sees for upstream index `at`, first seen as a call of `name`
    /// (`None`: ours, intercepted).
    fn slot(&mut self, at: u64, call: Option<(&str, &str)>) -> Option<u64> {
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

    fn argument(&mut self, at: u64, piece: &str) {
        if let Some(&i) = self.ours_at.get(&at) {
            self.ours[i].arguments.push_str(piece);
        }
    }

    /// Take in the next bytes of this round's stream: what reaches the client of the events
    /// they complete, in order, each one whole event; refused when an event runs over the
    /// limit.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, wire::Oversize> {
        let mut events = std::mem::replace(&mut self.events, wire::Events::new(0));
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
        let out = match serde_json::from_str::<Value>(&wire::event_data(raw)) {
            Ok(Value::Object(event)) => match self.format {
                Format::Messages => self.messages_event(event),
                Format::Gemini => self.gemini_event(event),
                Format::Responses => self.responses_event(event),
                Format::Chat => self.chat_event(event),
            },
            // `[DONE]`, comments, anything else: as it came, unless the round is held back.
            _ => (!self.holding).then_some(None),
        }?;
        Some(out.unwrap_or_else(|| raw.to_vec()))
    }

    /// A Chat Completions chunk: `None` held back, `Some(None)` as it came, `Some(Some(bytes))`
    /// rewritten.
    fn chat_event(&mut self, mut chunk: Map<String, Value>) -> Option<Option<Vec<u8>>> {
        let mut changed = false;
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()).cloned() {
            override_usage(&mut self.round_usage, &usage);
            if self.finished > 0 && !self.holding {
                chunk.insert("usage".into(), self.total_usage());
                changed = true;
            }
        }
        if self.holding {
            return None;
        }
        match (&self.id, chunk.get("id")) {
            (None, Some(id)) => self.id = Some(id.clone()),
            (Some(first), Some(id)) if first != id => {
                chunk.insert("id".into(), first.clone());
                changed = true;
            }
            _ => {}
        }
        let mut said = false;
        let mut finished = None;
        if let Some(Value::Array(choices)) = chunk.get_mut("choices") {
            for choice in choices
                .iter_mut()
                .filter(|c| c["index"].as_u64().unwrap_or(0) == 0)
            {
                if let Some(reason) = choice["finish_reason"].as_str() {
                    finished = Some(reason.to_owned());
                }
                let Some(Value::Object(delta)) = choice.get_mut("delta") else {
                    continue;
                };
                if self.finished > 0 && delta.remove("role").is_some() {
                    changed = true;
                }
                if let Some(text) = delta.get("content").and_then(Value::as_str) {
                    self.round.text.push_str(text);
                }
                if let Some(Value::Array(calls)) = delta.get_mut("tool_calls") {
                    let mut kept = Vec::new();
                    for mut call in std::mem::take(calls) {
                        let at = call["index"].as_u64().unwrap_or(0);
                        let named = call["function"]["name"]
                            .as_str()
                            .map(|n| (n.to_owned(), call["id"].as_str().unwrap_or("").to_owned()));
                        let slot =
                            self.slot(at, named.as_ref().map(|(n, i)| (n.as_str(), i.as_str())));
                        match slot {
                            None => {
                                if let Some(piece) = call["function"]["arguments"].as_str() {
                                    self.argument(at, piece);
                                }
                                changed = true;
                            }
                            Some(out) => {
                                if out != at {
                                    call["index"] = json!(out);
                                    changed = true;
                                }
                                kept.push(call);
                            }
                        }
                    }
                    if kept.is_empty() {
                        delta.remove("tool_calls");
                    } else {
                        *calls = kept;
                    }
                }
                said |= !delta.is_empty();
            }
        }
        if let Some(reason) = &finished
            && self.ends_in_ours(reason)
        {
            self.holding = true;
            return None;
        }
        if !changed {
            return Some(None);
        }
        if !said && finished.is_none() && !chunk.get("usage").is_some_and(Value::is_object) {
            return None;
        }
        Some(Some(wire::encode_event(self.format, &chunk)))
    }

    /// Take our calls out of a Gemini response (a streamed chunk or a whole body), recording
    /// the round's other parts: whether anything was taken, the finish reason, whether parts
    /// are left.
    fn gemini_parts(&mut self, response: &mut Map<String, Value>) -> (bool, Option<String>, bool) {
        let Some(candidate) = response.get_mut("candidates").and_then(|c| c.get_mut(0)) else {
            return (false, None, false);
        };
        let finish = candidate["finishReason"].as_str().map(str::to_owned);
        let mut taken = false;
        let mut left = false;
        if let Some(Value::Array(parts)) = candidate
            .get_mut("content")
            .and_then(|c| c.get_mut("parts"))
        {
            let mut kept = Vec::new();
            for part in std::mem::take(parts) {
                if let Some(call) = part.get("functionCall") {
                    let name = call["name"].as_str().unwrap_or("");
                    if self.intercept && memory_tools::is_memory_tool(name) {
                        self.ours.push(Pending {
                            id: call["id"].as_str().unwrap_or("").to_owned(),
                            name: name.to_owned(),
                            arguments: if call["args"].is_object() {
                                call["args"].to_string()
                            } else {
                                String::new()
                            },
                            part: part.clone(),
                        });
                        taken = true;
                        continue;
                    }
                    self.harness_calls += 1;
                }
                self.round.blocks.push(part.clone());
                kept.push(part);
            }
            left = !kept.is_empty();
            *parts = kept;
        }
        (taken, finish, left)
    }

    /// A Gemini chunk (a whole `GenerateContentResponse`), answered as
    /// [`Splice::chat_event`] answers.
    fn gemini_event(&mut self, mut chunk: Map<String, Value>) -> Option<Option<Vec<u8>>> {
        if let Some(usage) = chunk
            .get("usageMetadata")
            .filter(|u| u.is_object())
            .cloned()
        {
            override_usage(&mut self.round_usage, &usage);
        }
        if self.holding {
            return None;
        }
        let mut changed = false;
        match (&self.id, chunk.get("responseId")) {
            (None, Some(id)) => self.id = Some(id.clone()),
            (Some(first), Some(id)) if first != id => {
                chunk.insert("responseId".into(), first.clone());
                changed = true;
            }
            _ => {}
        }
        let (taken, finish, left) = self.gemini_parts(&mut chunk);
        changed |= taken;
        if let Some(reason) = &finish
            && self.ends_in_ours(reason)
        {
            self.holding = true;
            return None;
        }
        let usage = chunk.contains_key("usageMetadata");
        if self.finished > 0 && usage {
            chunk.insert("usageMetadata".into(), self.total_usage());
            changed = true;
        }
        if !changed {
            return Some(None);
        }
        // A chunk left without parts by taking ours out is dropped, usage or not (the usage is
        // counted, and later chunks carry it): Gemini's chat history refuses a turn in which a
        // chunk has no parts.
        if !left && finish.is_none() && (taken || !usage) {
            return None;
        }
        Some(Some(wire::encode_event(self.format, &chunk)))
    }

    /// An OpenAI Responses event, answered as [`Splice::chat_event`] answers. Output indices
    /// continue across rounds, sequence numbers keep increasing over the events the client
    /// gets, and the closing `response.completed` carries the first round's id, every round's
    /// visible output and the summed usage.
    fn responses_event(&mut self, mut event: Map<String, Value>) -> Option<Option<Vec<u8>>> {
        let kind = field(&event, "type").as_str().unwrap_or("").to_owned();
        let sequence = field(&event, "sequence_number").as_u64();
        if let Some(seq) = sequence
            && !self.sequenced
        {
            self.sequenced = true;
            if let Some(last) = self.last_sequence {
                self.sequence_shift = last as i64 + 1 - seq as i64;
            }
        }
        let Some(mut changed) = self.responses_pass(&kind, &mut event) else {
            if sequence.is_some() {
                self.sequence_shift -= 1;
            }
            return None;
        };
        if let Some(seq) = sequence {
            let out = u64::try_from(seq as i64 + self.sequence_shift).unwrap_or(0);
            if out != seq {
                event.insert("sequence_number".into(), json!(out));
                changed = true;
            }
            self.last_sequence = Some(out);
        }
        Some(changed.then(|| wire::encode_event(self.format, &event)))
    }

    /// Whether a Responses event passes (`None`: held back) and whether it was rewritten.
    fn responses_pass(&mut self, kind: &str, event: &mut Map<String, Value>) -> Option<bool> {
        let mut changed = false;
        match kind {
            "response.created" | "response.in_progress" => {
                if self.id.is_none() {
                    self.id = field(event, "response").get("id").cloned();
                }
                if self.created.is_none() {
                    self.created = Some(field(event, "response").clone());
                }
                if let Some(id) = field(event, "response")["id"].as_str() {
                    self.latest_id = Some(id.to_owned());
                }
                if self.finished > 0 {
                    return None;
                }
            }
            "response.output_item.added" => {
                let item = field(event, "item");
                let call = (item["type"] == "function_call").then(|| {
                    (
                        item["name"].as_str().unwrap_or("").to_owned(),
                        item["call_id"].as_str().unwrap_or("").to_owned(),
                    )
                });
                let at = field(event, "output_index").as_u64().unwrap_or(0);
                self.slot(at, call.as_ref().map(|(n, i)| (n.as_str(), i.as_str())));
            }
            "response.output_item.done" => {
                let at = field(event, "output_index").as_u64().unwrap_or(0);
                let item = field(event, "item").clone();
                match self.ours_at.get(&at) {
                    Some(&i) => {
                        self.ours[i].arguments =
                            item["arguments"].as_str().unwrap_or("").to_owned();
                    }
                    None => {
                        self.output.push(item.clone());
                        self.round.blocks.push(item);
                    }
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = field(event, "response").clone();
                override_usage(&mut self.round_usage, &response["usage"]);
                let status = response["status"].as_str().unwrap_or("");
                if self.ends_in_ours(if status == "completed" {
                    "stop"
                } else {
                    "length"
                }) {
                    self.holding = true;
                    return None;
                }
                if self.finished > 0 || !self.ours.is_empty() {
                    let mut response = response;
                    if let Some(id) = &self.id {
                        response["id"] = id.clone();
                    }
                    response["output"] = Value::Array(self.output.clone());
                    response["usage"] = self.total_usage();
                    event.insert("response".into(), response);
                    changed = true;
                }
            }
            _ => {}
        }
        if self.holding {
            return None;
        }
        if let Some(at) = field(event, "output_index").as_u64() {
            let out = (*self.map.get(&at)?)?;
            if out != at {
                event.insert("output_index".into(), json!(out));
                changed = true;
            }
        }
        Some(changed)
    }

    /// The Responses sequence number of the next event the splice adds itself.
    fn next_sequence(&mut self) -> u64 {
        let next = self.last_sequence.map_or(0, |last| last + 1);
        self.last_sequence = Some(next);
        next
    }

    /// The events that end a streamed reply whose later round the upstream `refused`: its
    /// own error where it answered with one (Chat, Gemini: `{"error": …}`; Messages: an
    /// `error` event), else ours; Responses gets an `error` event and then the first round's
    /// response closed as `response.failed`, numbered on from the last event the client got.
    fn refusal(&mut self, refused: &Refused) -> Vec<Vec<u8>> {
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
        let event = wire::error_event(self.format, &body, self.next_sequence());
        match self.format {
            Format::Chat | Format::Gemini | Format::Messages => vec![event],
            Format::Responses => {
                let error = &body["error"];
                let failed_at = self.next_sequence();
                let mut response = self.created.clone().unwrap_or_else(|| json!({}));
                if let Some(id) = &self.id {
                    response["id"] = id.clone();
                }
                let code = error["code"].as_str().or(error["type"].as_str());
                response["status"] = json!("failed");
                response["error"] = json!({"code": code, "message": error["message"]});
                response["output"] = Value::Array(self.output.clone());
                response["usage"] = self.total_usage();
                let failed = json!({"type": "response.failed", "sequence_number": failed_at, "response": response});
                let failed = failed.as_object().expect("an event is a JSON object");
                vec![event, wire::encode_event(self.format, failed)]
            }
        }
    }

    /// An Anthropic Messages event, answered as [`Splice::chat_event`] answers.
    fn messages_event(&mut self, mut event: Map<String, Value>) -> Option<Option<Vec<u8>>> {
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let at = event.get("index").and_then(Value::as_u64).unwrap_or(0);
        let mut changed = false;
        match kind.as_str() {
            "message_start" => {
                override_usage(&mut self.round_usage, &field(&event, "message")["usage"]);
                if self.finished > 0 {
                    return None;
                }
            }
            "content_block_start" => {
                let block = event.get("content_block").cloned().unwrap_or(Value::Null);
                let call = (block["type"] == "tool_use").then(|| {
                    (
                        block["name"].as_str().unwrap_or("").to_owned(),
                        block["id"].as_str().unwrap_or("").to_owned(),
                    )
                });
                let out = self.slot(at, call.as_ref().map(|(n, i)| (n.as_str(), i.as_str())))?;
                if call.is_none() {
                    self.block_at.insert(at, self.round.blocks.len());
                    self.round.blocks.push(block);
                }
                if out != at {
                    event.insert("index".into(), json!(out));
                    changed = true;
                }
            }
            "content_block_delta" | "content_block_stop" => {
                let Some(&slot) = self.map.get(&at) else {
                    return (!self.holding).then_some(None);
                };
                let delta = field(&event, "delta").clone();
                let Some(out) = slot else {
                    if let Some(piece) = delta["partial_json"].as_str() {
                        self.argument(at, piece);
                    }
                    return None;
                };
                if let Some(&i) = self.block_at.get(&at) {
                    let block = &mut self.round.blocks[i];
                    for (field, kind) in [
                        ("text", "text_delta"),
                        ("thinking", "thinking_delta"),
                        ("signature", "signature_delta"),
                    ] {
                        if delta["type"] == kind
                            && let Some(piece) = delta[field].as_str()
                        {
                            let joined = format!("{}{piece}", block[field].as_str().unwrap_or(""));
                            block[field] = json!(joined);
                        }
                    }
                }
                if out != at {
                    event.insert("index".into(), json!(out));
                    changed = true;
                }
            }
            "message_delta" => {
                override_usage(&mut self.round_usage, field(&event, "usage"));
                let reason = field(&event, "delta")["stop_reason"].as_str().unwrap_or("");
                if self.ends_in_ours(reason) {
                    self.holding = true;
                    return None;
                }
                if self.finished > 0 {
                    let mut usage = event.get("usage").cloned().unwrap_or_else(|| json!({}));
                    override_usage(&mut usage, &self.total_usage());
                    event.insert("usage".into(), usage);
                    changed = true;
                }
            }
            "message_stop" if self.holding => return None,
            _ => {}
        }
        if self.holding {
            return None;
        }
        Some(changed.then(|| wire::encode_event(self.format, &event)))
    }

    /// One whole (non-streamed) reply body: our calls taken out and the round recorded.
    fn whole(&mut self, body: &Value) -> Ended {
        match self.format {
            Format::Gemini => {
                if let Value::Object(mut response) = body.clone() {
                    let (_, finish, _) = self.gemini_parts(&mut response);
                    override_usage(&mut self.round_usage, &body["usageMetadata"]);
                    self.holding = finish.is_some_and(|r| self.ends_in_ours(&r));
                }
            }
            Format::Messages => {
                for (at, block) in body["content"].as_array().into_iter().flatten().enumerate() {
                    let call = (block["type"] == "tool_use").then(|| {
                        (
                            block["name"].as_str().unwrap_or("").to_owned(),
                            block["id"].as_str().unwrap_or("").to_owned(),
                        )
                    });
                    if self
                        .slot(
                            at as u64,
                            call.as_ref().map(|(n, i)| (n.as_str(), i.as_str())),
                        )
                        .is_none()
                    {
                        self.argument(at as u64, &block["input"].to_string());
                    } else if call.is_none() {
                        self.round.blocks.push(block.clone());
                    }
                }
                override_usage(&mut self.round_usage, &body["usage"]);
                let reason = body["stop_reason"].as_str().unwrap_or("");
                self.holding = self.ends_in_ours(reason);
            }
            Format::Responses => {
                for (at, item) in body["output"].as_array().into_iter().flatten().enumerate() {
                    let call = (item["type"] == "function_call").then(|| {
                        (
                            item["name"].as_str().unwrap_or("").to_owned(),
                            item["call_id"].as_str().unwrap_or("").to_owned(),
                        )
                    });
                    if self
                        .slot(
                            at as u64,
                            call.as_ref().map(|(n, i)| (n.as_str(), i.as_str())),
                        )
                        .is_none()
                    {
                        self.argument(at as u64, item["arguments"].as_str().unwrap_or(""));
                    } else {
                        self.round.blocks.push(item.clone());
                    }
                }
                override_usage(&mut self.round_usage, &body["usage"]);
                let status = body["status"].as_str().unwrap_or("");
                self.holding = self.ends_in_ours(if status == "completed" {
                    "stop"
                } else {
                    "length"
                });
            }
            Format::Chat => {
                let choice = &body["choices"][0];
                let message = &choice["message"];
                if let Some(text) = message["content"].as_str() {
                    self.round.text.push_str(text);
                }
                for (at, call) in message["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let name = call["function"]["name"].as_str().unwrap_or("");
                    let id = call["id"].as_str().unwrap_or("");
                    if self.slot(at as u64, Some((name, id))).is_none() {
                        self.argument(
                            at as u64,
                            call["function"]["arguments"].as_str().unwrap_or(""),
                        );
                    }
                }
                override_usage(&mut self.round_usage, &body["usage"]);
                let reason = choice["finish_reason"].as_str().unwrap_or("");
                self.holding = self.ends_in_ours(reason);
            }
        }
        let (ended, round) = self.end_round();
        self.round = round;
        ended
    }

    /// The last whole body as the client gets it: our calls out, the earlier rounds' text in
    /// front, usage summed over every round.
    fn merged(&self, mut body: Value, earlier: &[Round]) -> Value {
        let mut usage_key = "usage";
        match self.format {
            Format::Gemini => {
                usage_key = "usageMetadata";
                let mut parts: Vec<Value> = earlier
                    .iter()
                    .flat_map(|r| r.blocks.iter().cloned())
                    .collect();
                let content = &mut body["candidates"][0]["content"];
                parts.extend(
                    content["parts"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|p| {
                            !p["functionCall"]["name"]
                                .as_str()
                                .is_some_and(memory_tools::is_memory_tool)
                        })
                        .cloned(),
                );
                content["parts"] = Value::Array(parts);
            }
            Format::Messages => {
                let mut content: Vec<Value> = earlier
                    .iter()
                    .flat_map(|r| r.blocks.iter().cloned())
                    .collect();
                content.extend(
                    body["content"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|b| {
                            !(b["type"] == "tool_use"
                                && b["name"].as_str().is_some_and(memory_tools::is_memory_tool))
                        })
                        .cloned(),
                );
                body["content"] = Value::Array(content);
            }
            Format::Responses => {
                let mut output: Vec<Value> = earlier
                    .iter()
                    .flat_map(|r| r.blocks.iter().cloned())
                    .collect();
                output.extend(
                    body["output"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|item| {
                            !(item["type"] == "function_call"
                                && item["name"]
                                    .as_str()
                                    .is_some_and(memory_tools::is_memory_tool))
                        })
                        .cloned(),
                );
                body["output"] = Value::Array(output);
            }
            Format::Chat => {
                let message = &mut body["choices"][0]["message"];
                let mut text: String = earlier.iter().map(|r| r.text.as_str()).collect();
                if let Some(last) = message["content"].as_str() {
                    text.push_str(last);
                }
                if !text.is_empty() {
                    message["content"] = json!(text);
                }
                if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
                    calls.retain(|c| {
                        !c["function"]["name"]
                            .as_str()
                            .is_some_and(memory_tools::is_memory_tool)
                    });
                    if calls.is_empty()
                        && let Some(message) = message.as_object_mut()
                    {
                        message.remove("tool_calls");
                    }
                }
            }
        }
        if !self.usage.is_null() {
            body[usage_key] = self.usage.clone();
        }
        body
    }
}

/// How many continued Responses replies the proxy remembers: the newest, a few MiB at most.
const CONTINUED_KEPT: usize = 65_536;

/// Responses replies that a memory round continued as another response, per user: the id the
/// client got (the first round's response, which ends in our call and so cannot be
/// continued) → the last round's, which holds the whole reply. A later request naming the
/// first as its `previous_response_id` is sent on naming the last. Held in memory, the newest
/// [`CONTINUED_KEPT`]; after a restart such a request reaches the provider as it came.
#[derive(Debug, Default)]
pub struct Continued(Mutex<ContinuedIds>);

type ContinuedIds = (
    HashMap<(UserId, String), String>,
    VecDeque<(UserId, String)>,
);

impl Continued {
    fn record(&self, user: UserId, shown: String, latest: String) {
        let mut ids = self.0.lock();
        let (map, order) = &mut *ids;
        let key = (user, shown);
        if map.insert(key.clone(), latest).is_none() {
            order.push_back(key);
            if order.len() > CONTINUED_KEPT
                && let Some(oldest) = order.pop_front()
            {
                map.remove(&oldest);
            }
        }
    }

    /// The response that holds the reply `user` got as `id`, when a memory round continued it.
    pub(super) fn resolve(&self, user: UserId, id: &str) -> Option<String> {
        let ids = self.0.lock();
        ids.0.get(&(user, id.to_owned())).cloned()
    }
}

/// What the loop needs besides the first upstream answer.
pub(super) struct Loop {
    pub(super) state: Arc<State>,
    pub(super) parts: hyper::http::request::Parts,
    pub(super) format: Format,
    /// The first round's body: the frame, the tools offered.
    pub(super) base: Map<String, Value>,
    pub(super) turn: TurnState,
    /// Where the reply, and the tool calls with their results, are captured (`None`: nothing
    /// of this request is written).
    pub(super) reply: Option<Reply>,
    /// The request's entry in the inspector's log, where each call is noted.
    pub(super) log: Option<Arc<super::recent::Logged>>,
    pub(super) permit: tokio::sync::OwnedSemaphorePermit,
}

impl Loop {
    fn rounds(&self) -> usize {
        self.state.config.tool_rounds
    }

    /// Run our calls of one round: results (in call order), each call captured with the turn
    /// and what it returned reheated, as the switches allow.
    fn run(&mut self, calls: &[Pending]) -> Vec<String> {
        let state = &self.state;
        let generation = state.engine.writing();
        // What was stored since the turn's frame was recalled (a continuation reuses the
        // frame without a search; a new credential's question is written after its recall).
        let arena = generation.caught_up().unwrap_or_else(|err| {
            tracing::error!(%err, "catching the arena up for a memory tool failed");
            generation.arena.read()
        });
        let mut results = Vec::with_capacity(calls.len());
        for call in calls {
            let result = match Call::parse(&call.name, &call.arguments) {
                Err(reason) => format!("{}: {reason}", call.name),
                Ok(parsed) => {
                    match self
                        .turn
                        .run(&generation.memory, &arena, &state.engine.kernels, &parsed)
                    {
                        Ok(outcome) => {
                            if self.reply.is_some()
                                && let Err(err) = reheat_returned(
                                    &generation.memory,
                                    &arena,
                                    self.turn.user,
                                    &outcome.rows,
                                )
                            {
                                tracing::error!(%err, "reheating a tool's result failed");
                                state
                                    .health
                                    .report("reheating a tool's result", &err.into());
                            }
                            outcome.text
                        }
                        Err(err) => {
                            tracing::error!(%err, tool = call.name, "a memory tool failed");
                            format!("{}: the memory could not be read ({err})", call.name)
                        }
                    }
                }
            };
            if let Some(log) = &self.log {
                log.after.lock().rounds.push(super::recent::ToolRound {
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    result: result.clone(),
                });
            }
            results.push(result);
        }
        results
    }
}

/// Run `calls` on the blocking pool, the loop handed there and back.
async fn run_calls(lp: Loop, calls: Vec<Pending>) -> (Loop, Vec<String>) {
    tokio::task::spawn_blocking(move || {
        let mut lp = lp;
        let results = lp.run(&calls);
        (lp, results)
    })
    .await
    .expect("the tool task does not panic")
}

/// What a keep-alive looks like in `format`'s stream.
fn keep_alive(format: Format) -> Bytes {
    match format {
        Format::Messages => Bytes::from_static(b"event: ping\ndata: {\"type\": \"ping\"}\n\n"),
        Format::Chat | Format::Responses | Format::Gemini => {
            Bytes::from_static(b": keep-alive\n\n")
        }
    }
}

/// Await `work`, sending the client a keep-alive now and every [`KEEP_ALIVE`] while it runs;
/// also says whether the client has gone meanwhile (the work is finished all the same).
async fn kept_alive<T>(
    work: impl Future<Output = T>,
    tx: &mpsc::Sender<Bytes>,
    format: Format,
) -> (T, bool) {
    tokio::pin!(work);
    let mut gone = false;
    loop {
        gone = gone || tx.send(keep_alive(format)).await.is_err();
        tokio::select! {
            done = &mut work => return (done, gone),
            () = tokio::time::sleep(KEEP_ALIVE) => {}
        }
    }
}

/// A later round the upstream did not answer with a reply.
struct Refused {
    /// The upstream's own error answer (status, headers, body), when one came.
    answer: Option<(hyper::http::response::Parts, Bytes)>,
    /// What happened, for an error of our own when the upstream's answer cannot be passed on.
    message: String,
}

impl Refused {
    /// Log the refusal at WARN: the upstream's status and the size of its body, never the
    /// body itself, which may echo the request (the credential, the user's words).
    fn log(&self) {
        match &self.answer {
            Some((parts, body)) => tracing::warn!(
                status = %parts.status,
                body_bytes = body.len(),
                "the upstream refused a memory tool round"
            ),
            None => tracing::warn!(message = %self.message, "a memory tool round failed"),
        }
    }
}

/// Call the upstream for the next round.
async fn next_round(lp: &Loop, rounds: &[Round]) -> Result<Response<Incoming>, Refused> {
    let last = rounds.len() + 1 >= lp.rounds();
    let body = body_for(lp.format, &lp.base, rounds, last);
    let unanswered = |(_, message)| Refused {
        answer: None,
        message,
    };
    let response = forward(&lp.state, lp.format.provider(), &lp.parts, body.into())
        .await
        .map_err(unanswered)?;
    if response.status().is_success() {
        return Ok(response);
    }
    let (parts, body) = response.into_parts();
    let config = &lp.state.config;
    let body = read_body(
        body,
        config.body_limit,
        config.stream_idle_timeout,
        Failure::Timeout,
    )
    .await
    .map_err(unanswered)?;
    Err(Refused {
        message: format!(
            "the upstream refused a memory tool round with {}: {}",
            parts.status,
            String::from_utf8_lossy(&body)
        ),
        answer: Some((parts, body)),
    })
}

/// The upstream's first answer to a request that carries the memory tools, passed to the client
/// with the tool rounds spliced in; `report` adds the pipeline's headers.
pub(super) async fn answer_with_rounds(
    lp: Loop,
    upstream: Response<Incoming>,
    report: HeaderMap,
) -> Response<Body> {
    let streaming = super::is_event_stream(upstream.headers());
    if !upstream.status().is_success() {
        let Loop {
            state,
            format,
            reply,
            permit,
            ..
        } = lp;
        let config: &ProxyConfig = &state.config;
        return super::answer(
            upstream,
            report,
            format.provider(),
            Some(format),
            reply,
            config,
            Some(permit),
        )
        .await;
    }
    let (mut parts, body) = upstream.into_parts();
    strip_upstream_headers(&mut parts.headers);
    parts.headers.extend(report);
    if streaming {
        super::relay_unbuffered(&mut parts.headers);
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        tokio::spawn(streamed(lp, body, tx));
        return Response::from_parts(parts, Channel(rx).boxed());
    }
    whole(lp, parts, body).await
}

/// The streamed loop: relay each round through the splice, run our calls between rounds.
async fn streamed(mut lp: Loop, mut body: Incoming, tx: mpsc::Sender<Bytes>) {
    let format = lp.format;
    let (idle, limit) = (
        lp.state.config.stream_idle_timeout,
        lp.state.config.body_limit,
    );
    let mut splice = Splice::new(format, limit);
    let mut reader = wire::StreamReader::new(format, limit);
    let mut rounds: Vec<Round> = Vec::new();
    'rounds: loop {
        splice.intercept = rounds.len() + 1 < lp.rounds();
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(idle, body.frame()) => next,
                () = tx.closed() => break 'rounds,
            };
            let Ok(Some(Ok(frame))) = next else {
                if next.is_err() {
                    tracing::warn!(?idle, "the upstream stream went silent; ending it");
                }
                break;
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let events = match splice.feed(&data) {
                Ok(events) => events,
                Err(oversize) => {
                    tracing::warn!(
                        limit,
                        "the upstream sent an over-long stream event; ending the reply"
                    );
                    let refused = Refused {
                        answer: None,
                        message: oversize.to_string(),
                    };
                    for event in splice.refusal(&refused) {
                        if relay_to(&tx, &mut reader, event).await.is_err() {
                            break;
                        }
                    }
                    break 'rounds;
                }
            };
            for out in events {
                if relay_to(&tx, &mut reader, out).await.is_err() {
                    break 'rounds;
                }
            }
        }
        if let Some(out) = splice.flush()
            && relay_to(&tx, &mut reader, out).await.is_err()
        {
            break;
        }
        let (ended, mut round) = splice.end_round();
        if ended.ours.is_empty() {
            break;
        }
        let ((back, results), gone) =
            kept_alive(run_calls(lp, ended.ours.clone()), &tx, format).await;
        lp = back;
        round.calls = ended.ours.into_iter().zip(results).collect();
        rounds.push(round);
        if gone {
            break;
        }
        if !ended.again {
            break;
        }
        let (next, gone) = kept_alive(next_round(&lp, &rounds), &tx, format).await;
        if gone {
            break;
        }
        match next {
            Ok(next) => body = next.into_body(),
            Err(refused) => {
                refused.log();
                for event in splice.refusal(&refused) {
                    if relay_to(&tx, &mut reader, event).await.is_err() {
                        break;
                    }
                }
                break;
            }
        }
    }
    drop(body);
    drop(tx);
    if let Some((shown, latest)) = splice.continued() {
        lp.state.continued.record(lp.turn.user, shown, latest);
    }
    let Loop { reply, permit, .. } = lp;
    if let Some(reply) = reply {
        let (text, complete) = reader.finish();
        let _ = tokio::task::spawn_blocking(move || reply.capture(text, complete)).await;
    }
    drop(permit);
}

/// Send `bytes` to the client, then read them for the reply: the reader sees only what was
/// relayed, so a reply counts as complete once its closing event reached the client, whatever
/// the client does afterwards.
async fn relay_to(
    tx: &mpsc::Sender<Bytes>,
    reader: &mut wire::StreamReader,
    bytes: Vec<u8>,
) -> Result<(), mpsc::error::SendError<Bytes>> {
    let bytes = Bytes::from(bytes);
    tx.send(bytes.clone()).await?;
    reader.feed(&bytes);
    Ok(())
}

/// A later round's answer `next` (status and headers) as the client gets it: the upstream's
/// own `x-perpetuity-*` headers dropped, the pipeline's report in the first answer `parts`
/// kept.
fn later_round(
    parts: &hyper::http::response::Parts,
    mut next: hyper::http::response::Parts,
) -> hyper::http::response::Parts {
    strip_upstream_headers(&mut next.headers);
    for (name, value) in parts
        .headers
        .iter()
        .filter(|(n, _)| n.as_str().starts_with("x-perpetuity-"))
    {
        next.headers.insert(name.clone(), value.clone());
    }
    next
}

/// The whole (non-streamed) loop: one body per round, the client gets the last, merged.
async fn whole(
    mut lp: Loop,
    mut parts: hyper::http::response::Parts,
    mut body: Incoming,
) -> Response<Body> {
    let provider = lp.format.provider();
    let limit = lp.state.config.body_limit;
    let idle = lp.state.config.stream_idle_timeout;
    let mut splice = Splice::new(lp.format, limit);
    let mut rounds: Vec<Round> = Vec::new();
    loop {
        splice.intercept = rounds.len() + 1 < lp.rounds();
        let bytes = match read_body(body, limit, idle, Failure::Timeout).await {
            Ok(bytes) => bytes,
            Err((Failure::Timeout, message)) => {
                return failure(provider, Failure::Timeout, &message);
            }
            Err((_, message)) => return failure(provider, Failure::Upstream, &message),
        };
        let Ok(value) = serde_json::from_slice::<Value>(&bytes) else {
            return Response::from_parts(parts, Full::new(bytes).boxed());
        };
        let ended = splice.whole(&value);
        let round_had_ours = !ended.ours.is_empty();
        let round = std::mem::take(&mut splice.round);
        if !ended.ours.is_empty() {
            let (back, results) = run_calls(lp, ended.ours.clone()).await;
            lp = back;
            let mut round = round;
            round.calls = ended.ours.into_iter().zip(results).collect();
            if ended.again {
                rounds.push(round);
                match next_round(&lp, &rounds).await {
                    Ok(next) => {
                        let (next_parts, next_body) = next.into_parts();
                        parts = later_round(&parts, next_parts);
                        body = next_body;
                        continue;
                    }
                    Err(refused) => {
                        refused.log();
                        let Some((refusal, body)) = refused.answer else {
                            return failure(provider, Failure::Upstream, &refused.message);
                        };
                        // The upstream's own error, as it would have reached the client
                        // without the memory tools (its status, `retry-after` and all).
                        let refusal = later_round(&parts, refusal);
                        return Response::from_parts(refusal, Full::new(body).boxed());
                    }
                }
            }
        }
        // A reply that never called ours reaches the client as it came.
        let bytes = if rounds.is_empty() && splice.finished == 1 && !round_had_ours {
            bytes
        } else {
            Bytes::from(
                serde_json::to_vec(&splice.merged(value, &rounds))
                    .expect("a JSON value serialises"),
            )
        };
        let Loop {
            reply,
            permit,
            format,
            ..
        } = lp;
        if let Some(reply) = reply
            && let Some(text) = wire::reply_text(format, &bytes)
        {
            let stored = tokio::task::spawn_blocking(move || reply.capture(text, true)).await;
            if stored.unwrap_or(false) {
                super::acknowledge(&mut parts.headers, "reply");
            }
        }
        drop(permit);
        parts.status = StatusCode::OK;
        return Response::from_parts(parts, Full::new(bytes).boxed());
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

    #[test]
    fn offer_appends_after_the_harness_tools_and_withdraw_removes_only_ours() {
        for format in [Format::Chat, Format::Messages] {
            let harness = declared(
                format,
                &memory_tools::Spec {
                    name: "weather",
                    description: "",
                    parameters: json!({"type": "object"}),
                },
            );
            let mut body = Map::new();
            body.insert("tools".into(), json!([harness.clone()]));
            offer(format, &mut body);
            let ours: Vec<bool> = body["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| is_ours(format, t))
                .collect();
            assert_eq!(ours, [false, true, true, true, true]);
            withdraw(format, &mut body);
            assert_eq!(body["tools"], json!([harness]));
            let mut bare = Map::new();
            offer(format, &mut bare);
            withdraw(format, &mut bare);
            assert!(bare.is_empty(), "no tools list is left behind");
        }
    }
}
