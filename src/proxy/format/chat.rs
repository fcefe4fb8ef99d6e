//! OpenAI Chat Completions: `messages` with the system prompt as leading messages, tool calls
//! on the assistant's message, one `tool` message per result; streamed as `data:` chunks of
//! `choices` deltas ending in `[DONE]`.

use serde_json::{Map, Value, json};

use crate::memory_tools;
use crate::proxy::provider::Provider;
use crate::proxy::rounds::{Round, SpliceState, override_usage};
use crate::proxy::sse::{StreamReader, encode_event};
use crate::proxy::wire::{Call, Outcome, as_text, result_text, string_field};

use super::{Event, Format, FormatSplice, WireFormat, borrowed, names_ours};

/// OpenAI Chat Completions.
#[derive(Debug)]
pub(super) struct Chat;

impl WireFormat for Chat {
    fn metric(&self) -> &'static str {
        "openai_chat"
    }

    fn serves(&self, path: &str) -> bool {
        path == "/v1/chat/completions"
    }

    fn provider(&self) -> Provider {
        Provider::OpenAi
    }

    fn name(&self) -> &'static str {
        "chat_completions"
    }

    fn calls_in(&self, item: &Value) -> Vec<Call> {
        item.get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| Call {
                id: string_field(c, "id"),
                name: c["function"]["name"]
                    .as_str()
                    .unwrap_or("a tool")
                    .to_owned(),
                arguments: as_text(&c["function"]["arguments"]),
            })
            .collect()
    }

    fn results_in(&self, item: &Value) -> Vec<Outcome> {
        match item.get("role").and_then(Value::as_str) {
            Some("tool" | "function") => vec![Outcome {
                id: string_field(item, "tool_call_id"),
                name: string_field(item, "name"),
                text: item.get("content").map(result_text).unwrap_or_default(),
            }],
            _ => Vec::new(),
        }
    }

    fn reply_text(&self, body: &Value) -> Option<String> {
        body["choices"][0]["message"]["content"]
            .as_str()
            .map(str::to_owned)
    }

    fn read_event(&self, event: &Value, reader: &mut StreamReader) {
        for choice in event["choices"].as_array().into_iter().flatten() {
            if choice["index"].as_u64().unwrap_or(0) != 0 {
                continue;
            }
            if let Some(piece) = choice["delta"]["content"].as_str() {
                reader.push(piece);
            }
            if choice["finish_reason"].is_string() {
                reader.complete();
            }
        }
    }

    fn declared(&self, spec: &memory_tools::Spec) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": spec.parameters,
            },
        })
    }

    fn is_ours(&self, tool: &Value) -> bool {
        names_ours(&tool["function"]["name"])
    }

    fn said(&self, round: &Round) -> String {
        round.text.clone()
    }

    fn round_items(&self, round: &Round) -> Vec<Value> {
        let calls: Vec<Value> = round
            .calls
            .iter()
            .map(|(call, _)| json!({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}))
            .collect();
        let content = if round.text.is_empty() {
            Value::Null
        } else {
            Value::String(round.text.clone())
        };
        // Chat takes one `tool` message per call, after the assistant's.
        let mut messages =
            vec![json!({"role": "assistant", "content": content, "tool_calls": calls})];
        messages.extend(round.calls.iter().map(
            |(call, result)| json!({"role": "tool", "tool_call_id": call.id, "content": result}),
        ));
        messages
    }

    fn splice(&self) -> Box<dyn FormatSplice> {
        Box::new(Chat)
    }

    fn merge_rounds(&self, body: &mut Value, earlier: &[Round]) {
        let message = &mut body["choices"][0]["message"];
        let mut text: String = earlier.iter().map(|r| r.text.as_str()).collect();
        if let Some(last) = message["content"].as_str() {
            text.push_str(last);
        }
        if !text.is_empty() {
            message["content"] = json!(text);
        }
        if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
            calls.retain(|c| !names_ours(&c["function"]["name"]));
            if calls.is_empty()
                && let Some(message) = message.as_object_mut()
            {
                message.remove("tool_calls");
            }
        }
    }
}

/// Chat keeps no splice state of its own: the ids and indices are every format's.
impl FormatSplice for Chat {
    /// A Chat Completions chunk: the first round's id on every chunk, the role only on the
    /// first round's, tool call indices continued, our calls taken out.
    fn event(&mut self, splice: &mut SpliceState, mut chunk: Map<String, Value>) -> Event {
        let mut changed = false;
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()).cloned() {
            override_usage(&mut splice.round_usage, &usage);
            if splice.finished > 0 && !splice.holding {
                chunk.insert("usage".into(), splice.total_usage());
                changed = true;
            }
        }
        if splice.holding {
            return Event::Hold;
        }
        changed |= splice.same_id(&mut chunk, "id");
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
                if splice.finished > 0 && delta.remove("role").is_some() {
                    changed = true;
                }
                if let Some(text) = delta.get("content").and_then(Value::as_str) {
                    splice.round.text.push_str(text);
                }
                if let Some(Value::Array(calls)) = delta.get_mut("tool_calls") {
                    let mut kept = Vec::new();
                    for mut call in std::mem::take(calls) {
                        let at = call["index"].as_u64().unwrap_or(0);
                        let named = call["function"]["name"]
                            .as_str()
                            .map(|n| (n.to_owned(), call["id"].as_str().unwrap_or("").to_owned()));
                        match splice.slot(at, borrowed(&named)) {
                            None => {
                                if let Some(piece) = call["function"]["arguments"].as_str() {
                                    splice.argument(at, piece);
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
            && splice.ends_in_ours(reason)
        {
            splice.holding = true;
            return Event::Hold;
        }
        if !changed {
            return Event::Pass;
        }
        if !said && finished.is_none() && !chunk.get("usage").is_some_and(Value::is_object) {
            return Event::Hold;
        }
        Event::Rewrite(encode_event(Format::Chat, &chunk))
    }

    fn whole(&mut self, splice: &mut SpliceState, body: &Value) {
        let choice = &body["choices"][0];
        let message = &choice["message"];
        if let Some(text) = message["content"].as_str() {
            splice.round.text.push_str(text);
        }
        for (at, call) in message["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let name = call["function"]["name"].as_str().unwrap_or("");
            let id = call["id"].as_str().unwrap_or("");
            if splice.slot(at as u64, Some((name, id))).is_none() {
                splice.argument(
                    at as u64,
                    call["function"]["arguments"].as_str().unwrap_or(""),
                );
            }
        }
        override_usage(&mut splice.round_usage, &body["usage"]);
        let reason = choice["finish_reason"].as_str().unwrap_or("");
        splice.holding = splice.ends_in_ours(reason);
    }
}
