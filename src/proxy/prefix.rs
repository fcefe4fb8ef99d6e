//! `perpetuity bench prefix`: how much of each forwarded request the provider's prefix cache can
//! serve. A scripted agent session in Claude Code's recorded shape (a reminder block before the
//! words, a trailing `system` message whose content turns from blocks to a string after the
//! first request, Bash calls whose results carry the moving cache marker, the whole history
//! resent each turn, one session id) is sent through the proxy to a local upstream that records
//! what it receives. For each request after the first, the share of its input that is a common
//! prefix with the previous request of the conversation is computed, for what the client sent
//! (a direct call forwards exactly that) and for what the proxy forwarded, inside tool loops
//! and across turns. Input is read in the provider's prompt order: tools, system, messages.

use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt as _, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::wire::{self, Format};
use super::{State, serve};

/// The credential the session runs under.
pub const CREDENTIAL: &str = "bench-prefix";

/// The stream the upstream answers every request with (Anthropic Messages).
const STREAM: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_bench\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-bench\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Working on it.\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":4}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// Mean prefix shares of one way of calling.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Shares {
    /// Over the requests that continue a tool round (against the turn's previous request).
    pub in_loop: f64,
    /// Over the first requests of later turns (against the last request of the turn before).
    pub across_turns: f64,
    /// Mean input bytes of a request.
    pub mean_input_bytes: f64,
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct PrefixReport {
    pub turns: usize,
    pub steps: usize,
    pub requests: usize,
    pub direct: Shares,
    pub proxy: Shares,
    /// `proxy.in_loop / direct.in_loop` (target at least 0.9).
    pub in_loop_ratio: f64,
}

/// The scripted session: per turn, its requests' bodies (the first, then one per tool step).
pub fn session(turns: usize, steps: usize) -> Vec<Vec<Value>> {
    let marker = json!({"type": "ephemeral"});
    let mut history: Vec<Value> = Vec::new();
    let mut out = Vec::with_capacity(turns);
    for turn in 0..turns {
        let live = json!({"role": "user", "content": [
            {"type": "text", "text": format!("<system-reminder>\nTodo list for turn {turn}: empty.\n</system-reminder>\n")},
            {"type": "text", "text": format!("Module {turn} fails its parser tests on input {}; find the cause and fix it.", turn * 37 + 11)}
        ]});
        let environment = format!(
            "# Environment\nPrimary working directory: /work/app\nToday's date is 2026-12-{:02}.",
            turn % 28 + 1
        );
        let mut round: Vec<Value> = Vec::new();
        let mut requests = Vec::with_capacity(steps + 1);
        for step in 0..=steps {
            let system = if step == 0 {
                json!({"role": "system", "content": [{"type": "text", "text": environment,
                    "cache_control": marker}], "output_config": {"effort": "medium"}})
            } else {
                json!({"role": "system", "content": environment, "output_config": {"effort": "medium"}})
            };
            let mut messages = history.clone();
            messages.push(live.clone());
            messages.push(system);
            messages.extend(round.iter().cloned());
            if step > 0
                && let Some(Value::Array(blocks)) =
                    messages.last_mut().and_then(|m| m.get_mut("content"))
                && let Some(Value::Object(block)) = blocks.last_mut()
            {
                block.insert("cache_control".into(), marker.clone());
            }
            requests.push(request(messages));
            if step < steps {
                let id = format!("toolu_{turn}_{step}");
                round.push(json!({"role": "assistant", "content": [
                    {"type": "text", "text": format!("Reading file {step} of module {turn}.")},
                    {"type": "tool_use", "id": id, "name": "Bash",
                        "input": {"command": format!("cat src/module_{turn}/part_{step}.rs"),
                            "description": "Read a source file"}}]}));
                round.push(json!({"role": "user", "content": [{"tool_use_id": id,
                    "type": "tool_result", "content": source(turn, step), "is_error": false}]}));
            }
        }
        history.push(live);
        history.push(json!({"role": "system", "content": environment}));
        history.extend(round);
        history.push(json!({"role": "assistant", "content": [{"type": "text",
            "text": format!("Fixed module {turn}: the parser now accepts the input.")}]}));
        out.push(requests);
    }
    out
}

/// The tool rows the proxy stores for the session: each turn's calls and results, read off the
/// turn's last request as the proxy reads a continuation (`wire::round_rows`).
pub fn tool_rows(turns: usize, steps: usize) -> Vec<String> {
    session(turns, steps)
        .iter()
        .filter_map(|requests| requests.last())
        .flat_map(|body| {
            let request = wire::parse(Format::Messages, body.to_string().as_bytes(), None)
                .expect("the scripted session is a valid Messages request");
            wire::round_rows(&request, 0).0
        })
        .collect()
}

/// A Claude Code main request around `messages`.
fn request(messages: Vec<Value>) -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "messages": messages,
        "system": [
            {"type": "text", "text": "You are an agent for software engineering tasks."},
            {"type": "text", "text": "Use the tools to read and change files; keep answers short.",
                "cache_control": {"type": "ephemeral"}}
        ],
        "tools": [{"name": "Bash", "description": "Runs a shell command.", "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"},
                "description": {"type": "string"}},
            "required": ["command"], "additionalProperties": false}}],
        "metadata": {"user_id": "{\"device_id\":\"bench\",\"account_uuid\":\"\",\"session_id\":\"bench-session\"}"},
        "max_tokens": 32000,
        "stream": true
    })
}

/// A source file as a tool returns it: about 1.5 KB of distinct lines.
fn source(turn: usize, step: usize) -> String {
    (0..40)
        .map(|line| {
            format!(
                "    let token_{line} = parse_{turn}_{step}(input, {});",
                line * 7 + step
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A request's input in the provider's prompt order: tools, system (Messages) or instructions
/// (Responses), then the conversation (`messages` or `input`); fields the body lacks are left
/// out.
pub fn input_of(body: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for key in ["tools", "system", "instructions", "messages", "input"] {
        if let Some(value) = body.get(key) {
            serde_json::to_writer(&mut out, value).expect("a JSON value serialises");
        }
    }
    out
}

/// Bytes at the start of `later` that `earlier` starts with too: what a prefix cache filled by
/// `earlier` serves of `later`.
pub fn common_prefix(earlier: &[u8], later: &[u8]) -> usize {
    earlier
        .iter()
        .zip(later)
        .take_while(|(a, b)| a == b)
        .count()
}

/// The share of `later` that is a common prefix with `earlier`.
fn prefix_share(earlier: &[u8], later: &[u8]) -> f64 {
    common_prefix(earlier, later) as f64 / later.len().max(1) as f64
}

/// The shares of a run's requests (`sent`, in order) over a session of `steps` steps a turn.
fn shares(sent: &[Vec<u8>], steps: usize) -> Shares {
    let (mut in_loop, mut across) = (Vec::new(), Vec::new());
    for (i, pair) in sent.windows(2).enumerate() {
        let share = prefix_share(&pair[0], &pair[1]);
        if (i + 1) % (steps + 1) == 0 {
            across.push(share);
        } else {
            in_loop.push(share);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    Shares {
        in_loop: mean(&in_loop),
        across_turns: mean(&across),
        mean_input_bytes: sent.iter().map(Vec::len).sum::<usize>() as f64
            / sent.len().max(1) as f64,
    }
}

/// Start a local upstream that answers every request with [`STREAM`] and records the bodies it
/// receives; returns its address and the record.
pub async fn recording_upstream() -> std::io::Result<(SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>)> {
    let received = Arc::new(Mutex::new(Vec::new()));
    let addr = super::load::answering_upstream(
        STREAM,
        Some(Arc::clone(&received)),
        std::time::Duration::ZERO,
    )
    .await?;
    Ok((addr, received))
}

/// Send the session of `turns` turns of `steps` tool steps through a proxy serving `state`
/// (whose Anthropic upstream records into `received`), one request at a time, and compare what
/// it forwarded with what the client sent.
pub async fn measure(
    state: Arc<State>,
    received: Arc<Mutex<Vec<Vec<u8>>>>,
    turns: usize,
    steps: usize,
) -> std::io::Result<PrefixReport> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let proxy = listener.local_addr()?;
    tokio::spawn(serve(listener, state));
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let bodies: Vec<Value> = session(turns, steps).into_iter().flatten().collect();
    for body in &bodies {
        let request = Request::post(format!("http://{proxy}/v1/messages?beta=true"))
            .header("x-api-key", CREDENTIAL)
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a valid request");
        let response = client
            .request(request)
            .await
            .map_err(std::io::Error::other)?;
        response
            .into_body()
            .collect()
            .await
            .map_err(std::io::Error::other)?;
    }
    let forwarded: Vec<Vec<u8>> = received
        .lock()
        .iter()
        .map(|body| input_of(&serde_json::from_slice(body).unwrap_or(Value::Null)))
        .collect();
    if forwarded.len() != bodies.len() {
        return Err(std::io::Error::other(format!(
            "the upstream received {} of {} requests",
            forwarded.len(),
            bodies.len()
        )));
    }
    let sent: Vec<Vec<u8>> = bodies.iter().map(input_of).collect();
    let (direct, through) = (shares(&sent, steps), shares(&forwarded, steps));
    Ok(PrefixReport {
        turns,
        steps,
        requests: bodies.len(),
        in_loop_ratio: through.in_loop / direct.in_loop.max(f64::MIN_POSITIVE),
        direct,
        proxy: through,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_split_loops_from_turns() {
        assert_eq!(prefix_share(b"abcd", b"abXY"), 0.5);
        let sent = [b"aaaa".to_vec(), b"aaab".to_vec(), b"zzzz".to_vec()];
        let got = shares(&sent, 1);
        assert_eq!((got.in_loop, got.across_turns), (0.75, 0.0));
    }

    #[test]
    fn the_sessions_tool_rows_are_its_calls_and_results() {
        let rows = tool_rows(2, 3);
        assert_eq!(rows.len(), 2 * 3 * 2);
        assert!(rows[0].starts_with("called Bash {\"command\":\"cat src/module_0/part_0.rs\""));
        assert!(rows[1].starts_with("Bash returned:     let token_0 = parse_0_0(input, 0);"));
    }

    #[test]
    fn the_session_grows_its_round_and_its_history() {
        let turns = session(2, 3);
        assert_eq!(turns.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4]);
        let messages = |body: &Value| body["messages"].as_array().unwrap().len();
        assert_eq!(messages(&turns[0][0]), 2);
        assert_eq!(messages(&turns[0][3]), 8);
        assert_eq!(messages(&turns[1][0]), 8 + 1 + 2);
    }
}
