//! Anthropic Messages: `messages` with `system` apart and `max_tokens` required, calls and
//! results as `tool_use` / `tool_result` content blocks, prompt-cache markers on blocks;
//! streamed as typed events (`message_start`, `content_block_*`, `message_delta`,
//! `message_stop`) each named in an `event:` line.

use std::collections::HashMap;

use hyper::body::Bytes;
use serde_json::{Map, Value, json};

use crate::memory_tools;
use crate::proxy::harness::{self, Kind};
use crate::proxy::provider::Provider;
use crate::proxy::rounds::{Round, SpliceState, field, override_usage};
use crate::proxy::sse::StreamReader;
use crate::proxy::wire::{Call, Outcome, Request, block_calls, block_results, text_of};

use super::{
    Event, Format, FormatSplice, WireFormat, blocks_said, borrowed, call_of, earlier_then_kept,
    names_ours,
};

/// Anthropic Messages.
pub(super) struct Messages;

/// Anthropic's limit on cache breakpoints in one request.
const CACHE_BREAKPOINTS: usize = 4;

impl WireFormat for Messages {
    fn metric(&self) -> &'static str {
        "anthropic_messages"
    }

    fn serves(&self, path: &str) -> bool {
        path == "/v1/messages"
    }

    fn provider(&self) -> Provider {
        Provider::Anthropic
    }

    fn name(&self) -> &'static str {
        "messages"
    }

    fn check(&self, body: &Map<String, Value>) -> Result<(), String> {
        if body.get("max_tokens").is_some_and(Value::is_u64) {
            Ok(())
        } else {
            Err("`max_tokens` must be a positive integer".into())
        }
    }

    /// Claude Code's `metadata.user_id`: a JSON object with `session_id` (2.1), or
    /// `user_…_account_…_session_<uuid>` (earlier versions).
    fn session(&self, body: &Map<String, Value>) -> Option<String> {
        let user_id = body.get("metadata")?.get("user_id")?.as_str()?;
        if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(user_id)
            && let Some(id) = fields
                .get("session_id")
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty())
        {
            return Some(format!("session:{id}"));
        }
        let at = user_id.rfind("session_")?;
        let id = &user_id[at + "session_".len()..];
        (!id.is_empty()).then(|| format!("session:{id}"))
    }

    /// Where the client marked the history it sent for the prompt cache (blocks with
    /// `cache_control` before the live turn, which the frame replaces), mark the frame's end,
    /// the live turn's first word block, with the last of those markers, unless it has one or
    /// the request would hold more than the provider's limit.
    fn mark_frame_end(&self, request: &Request, kept: &[Value], live: &mut Value) {
        let at = request.question_at.unwrap_or(request.messages.len());
        let dropped = request.messages[..at]
            .iter()
            .zip(&request.kinds)
            .filter(|(_, k)| !matches!(k, Kind::Instructions | Kind::Context))
            .filter_map(|(m, _)| m.get("content").and_then(Value::as_array))
            .flatten()
            .filter_map(|b| b.get("cache_control"))
            .next_back()
            .cloned();
        let Some(marker) = dropped else {
            return;
        };
        let in_use = request.body.get("system").map_or(0, count_markers)
            + request.body.get("tools").map_or(0, count_markers)
            + kept.iter().map(count_markers).sum::<usize>()
            + count_markers(live)
            + request.messages[at + 1..]
                .iter()
                .map(count_markers)
                .sum::<usize>();
        if in_use >= CACHE_BREAKPOINTS {
            return;
        }
        if let Some(Value::String(text)) = live.get("content") {
            live["content"] = json!([{"type": "text", "text": text}]);
        }
        let Some(Value::Array(blocks)) = live.get_mut("content") else {
            return;
        };
        let end = blocks.iter_mut().find(|b| {
            b.get("type").and_then(Value::as_str) == Some("text")
                && b.get("text")
                    .and_then(Value::as_str)
                    .is_some_and(|t| !harness::is_context(t) && !harness::is_markup(t))
        });
        if let Some(Value::Object(block)) = end
            && !block.contains_key("cache_control")
        {
            block.insert("cache_control".into(), marker);
        }
    }

    fn calls_in(&self, item: &Value) -> Vec<Call> {
        block_calls(item)
    }

    fn results_in(&self, item: &Value) -> Vec<Outcome> {
        block_results(item)
    }

    fn reply_text(&self, body: &Value) -> Option<String> {
        text_of(&body["content"])
    }

    fn read_event(&self, event: &Value, reader: &mut StreamReader) {
        match event["type"].as_str() {
            Some("content_block_delta") if event["delta"]["type"] == "text_delta" => {
                if let Some(piece) = event["delta"]["text"].as_str() {
                    reader.push(piece);
                }
            }
            Some("message_stop") => reader.complete(),
            _ => {}
        }
    }

    /// Typed `error`.
    fn error_data(&self, mut error: Map<String, Value>, _sequence: u64) -> Map<String, Value> {
        error.insert("type".into(), Value::from("error"));
        error
    }

    fn named_events(&self) -> bool {
        true
    }

    fn declared(&self, spec: &memory_tools::Spec) -> Value {
        json!({
            "name": spec.name,
            "description": spec.description,
            "input_schema": spec.parameters,
        })
    }

    fn is_ours(&self, tool: &Value) -> bool {
        names_ours(&tool["name"])
    }

    fn said(&self, round: &Round) -> String {
        blocks_said(round)
    }

    fn round_items(&self, round: &Round) -> Vec<Value> {
        // Providers refuse empty text blocks; a block that only opened says nothing.
        let mut content: Vec<Value> = round
            .blocks
            .iter()
            .filter(|b| b["type"] != "text" || b["text"].as_str().is_some_and(|t| !t.is_empty()))
            .cloned()
            .collect();
        let mut results = Vec::new();
        for (call, result) in &round.calls {
            let input: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
            content.push(
                json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}),
            );
            results.push(json!({"type": "tool_result", "tool_use_id": call.id, "content": result}));
        }
        vec![
            json!({"role": "assistant", "content": content}),
            json!({"role": "user", "content": results}),
        ]
    }

    /// Anthropic's `ping` event.
    fn keep_alive(&self) -> Bytes {
        Bytes::from_static(b"event: ping\ndata: {\"type\": \"ping\"}\n\n")
    }

    fn splice(&self) -> Box<dyn FormatSplice> {
        Box::<Blocks>::default()
    }

    fn merge_rounds(&self, body: &mut Value, earlier: &[Round]) {
        body["content"] = earlier_then_kept(earlier, &body["content"], |b| {
            b["type"] == "tool_use" && names_ours(&b["name"])
        });
    }
}

/// What the Messages splice keeps of its own: where each of this round's content blocks
/// is recorded, to add their deltas to it.
#[derive(Debug, Default)]
struct Blocks {
    /// This round's upstream block index → its place in the round's `blocks`.
    block_at: HashMap<u64, usize>,
}

impl FormatSplice for Blocks {
    /// An Anthropic Messages event: content block indices continued, our `tool_use` blocks
    /// held back, later rounds' `message_start` dropped and the closing usage summed.
    fn event(&mut self, splice: &mut SpliceState, mut event: Map<String, Value>) -> Event {
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let at = event.get("index").and_then(Value::as_u64).unwrap_or(0);
        let mut changed = false;
        match kind.as_str() {
            "message_start" => {
                override_usage(&mut splice.round_usage, &field(&event, "message")["usage"]);
                if splice.finished > 0 {
                    return Event::Hold;
                }
            }
            "content_block_start" => {
                let block = event.get("content_block").cloned().unwrap_or(Value::Null);
                let call = call_of(block["type"] == "tool_use", &block, "id");
                let Some(out) = splice.slot(at, borrowed(&call)) else {
                    return Event::Hold;
                };
                if call.is_none() {
                    self.block_at.insert(at, splice.round.blocks.len());
                    splice.round.blocks.push(block);
                }
                if out != at {
                    event.insert("index".into(), json!(out));
                    changed = true;
                }
            }
            "content_block_delta" | "content_block_stop" => {
                let Some(&slot) = splice.map.get(&at) else {
                    return if splice.holding {
                        Event::Hold
                    } else {
                        Event::Pass
                    };
                };
                let delta = field(&event, "delta").clone();
                let Some(out) = slot else {
                    if let Some(piece) = delta["partial_json"].as_str() {
                        splice.argument(at, piece);
                    }
                    return Event::Hold;
                };
                if let Some(&i) = self.block_at.get(&at) {
                    let block = &mut splice.round.blocks[i];
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
                override_usage(&mut splice.round_usage, field(&event, "usage"));
                let reason = field(&event, "delta")["stop_reason"].as_str().unwrap_or("");
                if splice.ends_in_ours(reason) {
                    splice.holding = true;
                    return Event::Hold;
                }
                if splice.finished > 0 {
                    let mut usage = event.get("usage").cloned().unwrap_or_else(|| json!({}));
                    override_usage(&mut usage, &splice.total_usage());
                    event.insert("usage".into(), usage);
                    changed = true;
                }
            }
            "message_stop" if splice.holding => return Event::Hold,
            _ => {}
        }
        if splice.holding {
            return Event::Hold;
        }
        Event::changed(changed, Format::Messages, &event)
    }

    fn whole(&mut self, splice: &mut SpliceState, body: &Value) {
        for (at, block) in body["content"].as_array().into_iter().flatten().enumerate() {
            let call = call_of(block["type"] == "tool_use", block, "id");
            if splice.slot(at as u64, borrowed(&call)).is_none() {
                splice.argument(at as u64, &block["input"].to_string());
            } else if call.is_none() {
                splice.round.blocks.push(block.clone());
            }
        }
        override_usage(&mut splice.round_usage, &body["usage"]);
        let reason = body["stop_reason"].as_str().unwrap_or("");
        splice.holding = splice.ends_in_ours(reason);
    }

    fn end_round(&mut self) {
        self.block_at.clear();
    }
}

/// The `cache_control` markers anywhere in `value`.
fn count_markers(value: &Value) -> usize {
    match value {
        Value::Object(fields) => fields
            .iter()
            .map(|(k, v)| usize::from(k == "cache_control" && !v.is_null()) + count_markers(v))
            .sum(),
        Value::Array(items) => items.iter().map(count_markers).sum(),
        _ => 0,
    }
}
