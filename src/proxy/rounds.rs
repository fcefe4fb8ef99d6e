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

use crate::frame::Side;
use crate::memory_tools::{self, Call, TurnState};
use crate::recall::reheat_returned;
use crate::types::UserId;

use super::format::{Event, FormatSplice};
use super::provider::Failure;
use super::sse;
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
    format.wire().tools()
}

/// Add the memory tools after the harness's own tools (Gemini: one more `functionDeclarations`
/// entry).
pub fn offer(format: Format, body: &mut Map<String, Value>) {
    let wire = format.wire();
    let declared: Vec<Value> = memory_tools::specs()
        .iter()
        .map(|s| wire.declared(s))
        .collect();
    let added = wire.offered(declared);
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
        list.retain(|tool| !format.wire().is_ours(tool));
        if list.is_empty() {
            body.remove("tools");
        }
    }
}

/// One call of ours the upstream made.
#[derive(Debug, Clone, Default)]
pub(super) struct Pending {
    pub(super) id: String,
    pub(super) name: String,
    /// The arguments' JSON text, as streamed.
    pub(super) arguments: String,
    /// Gemini: the call's part as it came (its thought signature must go back with it).
    pub(super) part: Value,
}

/// One finished round of ours: what the model said besides the calls, the calls, their results.
#[derive(Debug, Clone, Default)]
pub(super) struct Round {
    /// Chat: the assistant text.
    pub(super) text: String,
    /// Messages, Gemini, Responses: the content blocks, parts or output items other than our
    /// calls (text, thinking with its signature).
    pub(super) blocks: Vec<Value>,
    pub(super) calls: Vec<(Pending, String)>,
}

impl Round {
    /// The round in the context, as `format`'s messages (Responses: input items): structured
    /// tool calls and results, or plain text once the tools are withdrawn.
    fn messages(&self, format: Format, structured: bool) -> Vec<Value> {
        let wire = format.wire();
        if structured {
            return wire.round_items(self);
        }
        let mut said = wire.said(self);
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
        vec![
            wire.frame_item(Side::Assistant, &said),
            wire.frame_item(Side::User, &results),
        ]
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
pub(super) fn override_usage(base: &mut Value, later: &Value) {
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
pub(super) fn field<'a>(event: &'a Map<String, Value>, key: &str) -> &'a Value {
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
    events: sse::Events,
    /// What the splice keeps in every format.
    state: SpliceState,
    /// What only this format keeps, and what becomes of each of its events.
    own: Box<dyn FormatSplice>,
}

/// What the splice keeps in every format: the client's numbering, our calls, the round so far,
/// the usage, the first round's id.
#[derive(Debug, Default)]
pub(super) struct SpliceState {
    /// Whether our calls are intercepted this round (not on the last one: the tools are gone).
    pub(super) intercept: bool,
    /// Rounds finished before this one.
    pub(super) finished: usize,
    /// The next index the client will see (Chat tool calls, Responses output items, Messages
    /// content blocks), and where this round's indices start.
    next_index: u64,
    base_index: u64,
    /// This round's upstream index → the client's index, `None` for our calls.
    pub(super) map: HashMap<u64, Option<u64>>,
    /// This round's upstream index of each of our calls → its place in `ours`.
    pub(super) ours_at: HashMap<u64, usize>,
    pub(super) ours: Vec<Pending>,
    pub(super) harness_calls: usize,
    pub(super) round: Round,
    /// The usage of the finished rounds, summed, and of this round so far.
    usage: Value,
    pub(super) round_usage: Value,
    /// The first round's message id (Chat chunks carry it on every chunk).
    pub(super) id: Option<Value>,
    /// This round ends in our calls only: its remaining events are held back.
    pub(super) holding: bool,
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
    fn continued(&self) -> Option<(String, String)> {
        let shown = self.state.id.as_ref()?.as_str()?;
        let latest = self.own.latest_id()?;
        (shown != latest).then(|| (shown.to_owned(), latest.to_owned()))
    }

    /// Close the round: what it asked of us; the state moves on to the next round.
    fn end_round(&mut self) -> (Ended, Round) {
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
        let event = sse::error_event(self.format, &body, self.own.next_sequence());
        let failed = self.own.failed(&self.state, &body);
        std::iter::once(event).chain(failed).collect()
    }

    /// One whole (non-streamed) reply body: our calls taken out and the round recorded.
    fn whole(&mut self, body: &Value) -> Ended {
        self.own.whole(&mut self.state, body);
        let (ended, round) = self.end_round();
        self.state.round = round;
        ended
    }

    /// The last whole body as the client gets it: our calls out, the earlier rounds' text in
    /// front, usage summed over every round.
    fn merged(&self, mut body: Value, earlier: &[Round]) -> Value {
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
    pub(super) fn total_usage(&self) -> Value {
        let mut total = self.usage.clone();
        add_usage(&mut total, &self.round_usage);
        total
    }

    /// Keep the first round's message id (under `key`) on every event: the first one seen is
    /// remembered, a later round's replaced by it; whether `event` was changed.
    pub(super) fn same_id(&mut self, event: &mut Map<String, Value>, key: &str) -> bool {
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
    pub(super) fn ends_in_ours(&self, reason: &str) -> bool {
        !self.ours.is_empty()
            && self.harness_calls == 0
            && !matches!(
                reason,
                "length" | "max_tokens" | "content_filter" | "MAX_TOKENS" | "SAFETY"
            )
    }

    /// The index the client sees for upstream index `at`, first seen as a call of `name`
    /// (`None`: ours, intercepted).
    pub(super) fn slot(&mut self, at: u64, call: Option<(&str, &str)>) -> Option<u64> {
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
    pub(super) fn argument(&mut self, at: u64, piece: &str) {
        if let Some(&i) = self.ours_at.get(&at) {
            self.ours[i].arguments.push_str(piece);
        }
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
        gone = gone || tx.send(format.wire().keep_alive()).await.is_err();
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
    let mut reader = sse::StreamReader::new(format, limit);
    let mut rounds: Vec<Round> = Vec::new();
    'rounds: loop {
        splice.state.intercept = rounds.len() + 1 < lp.rounds();
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
    reader: &mut sse::StreamReader,
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
        splice.state.intercept = rounds.len() + 1 < lp.rounds();
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
        let round = std::mem::take(&mut splice.state.round);
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
        let bytes = if rounds.is_empty() && splice.state.finished == 1 && !round_had_ours {
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
            let harness = format.wire().declared(&memory_tools::Spec {
                name: "weather",
                description: "",
                parameters: json!({"type": "object"}),
            });
            let mut body = Map::new();
            body.insert("tools".into(), json!([harness.clone()]));
            offer(format, &mut body);
            let ours: Vec<bool> = body["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| format.wire().is_ours(t))
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
