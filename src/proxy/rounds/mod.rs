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

mod splice;

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::HeaderMap;
use hyper::{Response, StatusCode};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::frame::Side;
use crate::memory_tools::{self, Call, TurnState};
use crate::recall::reheat_returned;
use crate::types::UserId;

use super::provider::Failure;
use super::sse;
use super::wire::{self, Format};
use super::{
    Body, Channel, ProxyConfig, Reply, State, failure, forward, read_body, strip_upstream_headers,
};

pub use splice::Splice;
pub(super) use splice::{SpliceState, field, override_usage};

/// Upstream calls per reply when not configured: up to three rounds of tool calls, then the
/// answer.
pub const DEFAULT_ROUNDS: usize = 4;

/// How often the client hears a keep-alive while a tool runs or the next round is awaited:
/// well inside the idle timeouts of common clients and load balancers (30 s and more).
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);

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

/// The most memory tool calls run in one round: the model is told of any past it (each call
/// still gets its result), so one prompt cannot make a round search without end.
pub const MAX_CALLS_A_ROUND: usize = 16;

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
        for (at, call) in calls.iter().enumerate() {
            let result = match Call::parse(&call.name, &call.arguments) {
                _ if at >= MAX_CALLS_A_ROUND => format!(
                    "{}: not run: at most {MAX_CALLS_A_ROUND} memory tool calls are run a round",
                    call.name
                ),
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
                state.recent.add_round(
                    log,
                    super::recent::ToolRound {
                        name: call.name.clone(),
                        arguments: call.arguments.clone(),
                        result: result.clone(),
                    },
                );
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
    // The stream ends for the client once what it may continue from is recorded and its reply
    // stored (as in `reply::relay`).
    if let Some((shown, latest)) = splice.continued() {
        lp.state.continued.record(lp.turn.user, shown, latest);
    }
    let Loop { reply, permit, .. } = lp;
    if let Some(reply) = reply {
        let (text, complete) = reader.finish();
        let _ = tokio::task::spawn_blocking(move || reply.capture(text, complete)).await;
    }
    drop(tx);
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
    use serde_json::json;

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
