//! OpenAI Responses: `input` (a string or a list of items), `instructions` apart, calls and
//! their outputs as typed items, `previous_response_id` for history the provider keeps;
//! streamed as typed, numbered events each named in an `event:` line.

use serde_json::{Map, Value, json};

use crate::memory_tools;
use crate::proxy::harness::Kind;
use crate::proxy::provider::Provider;
use crate::proxy::rounds::{Round, SpliceState, field, override_usage};
use crate::proxy::sse::{self, StreamReader};
use crate::proxy::wire::{self, Call, Outcome, as_text, result_text, string_field, text_of};

use super::{
    Event, Format, FormatSplice, WireFormat, borrowed, call_of, earlier_then_kept, names_ours,
};

/// OpenAI Responses.
pub(super) struct Responses;

impl WireFormat for Responses {
    fn metric(&self) -> &'static str {
        "openai_responses"
    }

    fn serves(&self, path: &str) -> bool {
        path == "/v1/responses"
    }

    fn provider(&self) -> Provider {
        Provider::OpenAi
    }

    fn name(&self) -> &'static str {
        "responses"
    }

    fn list(&self) -> &'static str {
        "input"
    }

    /// A string input is one user message (the body keeps the string).
    fn take_items(&self, body: &mut Map<String, Value>) -> Result<Vec<Value>, String> {
        match body.get_mut("input") {
            Some(Value::Array(items)) => Ok(std::mem::take(items)),
            Some(Value::String(text)) => Ok(vec![json!({"role": "user", "content": text})]),
            _ => Err("`input` must be a string or an array".into()),
        }
    }

    /// Items other than messages (function calls, their outputs) have no role.
    fn needs_role(&self, item: &Value) -> bool {
        item.get("type").is_none()
    }

    fn kind_of(&self, item: &Value) -> Kind {
        match item.get("type").and_then(Value::as_str) {
            Some(kind) if kind != "message" && kind.ends_with("_output") => Kind::Result,
            Some(kind) if kind != "message" => Kind::Agent,
            _ => wire::kind_by_role(item),
        }
    }

    fn server_history(&self, body: &Map<String, Value>) -> bool {
        body.get("previous_response_id")
            .is_some_and(|v| !v.is_null())
    }

    fn calls_in(&self, item: &Value) -> Vec<Call> {
        match item.get("type").and_then(Value::as_str) {
            Some(kind) if kind.ends_with("_call") => vec![Call {
                id: string_field(item, "call_id"),
                name: string_field(item, "name").unwrap_or_else(|| kind.to_owned()),
                arguments: as_text(
                    item.get("arguments")
                        .or_else(|| item.get("input"))
                        .or_else(|| item.get("action"))
                        .unwrap_or(&Value::Null),
                ),
            }],
            _ => Vec::new(),
        }
    }

    fn results_in(&self, item: &Value) -> Vec<Outcome> {
        match item.get("type").and_then(Value::as_str) {
            Some(kind) if kind.ends_with("_output") => vec![Outcome {
                id: string_field(item, "call_id"),
                name: None,
                text: item.get("output").map(result_text).unwrap_or_default(),
            }],
            _ => Vec::new(),
        }
    }

    fn reply_text(&self, body: &Value) -> Option<String> {
        let texts: Vec<String> = body["output"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|item| item["type"] == "message")
            .filter_map(|item| text_of(&item["content"]))
            .collect();
        (!texts.is_empty()).then(|| texts.join("\n\n"))
    }

    fn read_event(&self, event: &Value, reader: &mut StreamReader) {
        match event["type"].as_str() {
            Some("response.output_item.added")
                if event["item"]["type"] == "message" && reader.has_text() =>
            {
                reader.push("\n\n");
            }
            Some("response.output_text.delta") => {
                if let Some(piece) = event["delta"].as_str() {
                    reader.push(piece);
                }
            }
            Some("response.completed") => reader.complete(),
            _ => {}
        }
    }

    /// An `error` event numbered `sequence`, carrying the error's fields.
    fn error_data(&self, mut error: Map<String, Value>, sequence: u64) -> Map<String, Value> {
        let error = error.remove("error").unwrap_or_default();
        Map::from_iter([
            ("type".to_owned(), Value::from("error")),
            ("sequence_number".to_owned(), Value::from(sequence)),
            ("error".to_owned(), error),
        ])
    }

    fn named_events(&self) -> bool {
        true
    }

    fn declared(&self, spec: &memory_tools::Spec) -> Value {
        json!({
            "type": "function",
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        })
    }

    fn is_ours(&self, tool: &Value) -> bool {
        names_ours(&tool["name"])
    }

    fn said(&self, round: &Round) -> String {
        round
            .blocks
            .iter()
            .filter_map(|item| text_of(&item["content"]))
            .collect::<Vec<_>>()
            .join("\n\n")
    }

    fn round_items(&self, round: &Round) -> Vec<Value> {
        let mut items = round.blocks.clone();
        for (call, _) in &round.calls {
            items.push(json!({"type": "function_call", "call_id": call.id, "name": call.name, "arguments": call.arguments}));
        }
        let outputs = round.calls.iter().map(|(call, result)| {
            json!({"type": "function_call_output", "call_id": call.id, "output": result})
        });
        items.extend(outputs);
        items
    }

    fn splice(&self) -> Box<dyn FormatSplice> {
        Box::<Sequenced>::default()
    }

    fn merge_rounds(&self, body: &mut Value, earlier: &[Round]) {
        body["output"] = earlier_then_kept(earlier, &body["output"], |item| {
            item["type"] == "function_call" && names_ours(&item["name"])
        });
    }
}

/// The stop reason a response's `status` stands for: complete, or cut short.
fn stop_reason(status: &str) -> &'static str {
    if status == "completed" {
        "stop"
    } else {
        "length"
    }
}

/// What the Responses splice keeps of its own: the sequence numbers the client sees, the
/// output it has seen, the responses the rounds announced.
#[derive(Debug, Default)]
struct Sequenced {
    /// What is added to the upstream's sequence numbers (events held back, earlier rounds), the
    /// last one the client got, and whether this round has set the shift yet.
    sequence_shift: i64,
    last_sequence: Option<u64>,
    sequenced: bool,
    /// Every output item the client has seen, all rounds (the closing response lists them).
    output: Vec<Value>,
    /// The response the first round's `response.created` announced (a refused later round
    /// closes it as failed), and the id of the latest round's.
    created: Option<Value>,
    latest_id: Option<String>,
}

impl FormatSplice for Sequenced {
    /// An OpenAI Responses event. Output indices continue across rounds, sequence numbers
    /// keep increasing over the events the client gets, and the closing `response.completed`
    /// carries the first round's id, every round's visible output and the summed usage.
    fn event(&mut self, splice: &mut SpliceState, mut event: Map<String, Value>) -> Event {
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
        let Some(mut changed) = self.passes(splice, &kind, &mut event) else {
            if sequence.is_some() {
                self.sequence_shift -= 1;
            }
            return Event::Hold;
        };
        if let Some(seq) = sequence {
            let out = u64::try_from(seq as i64 + self.sequence_shift).unwrap_or(0);
            if out != seq {
                event.insert("sequence_number".into(), json!(out));
                changed = true;
            }
            self.last_sequence = Some(out);
        }
        Event::changed(changed, Format::Responses, &event)
    }

    fn whole(&mut self, splice: &mut SpliceState, body: &Value) {
        for (at, item) in body["output"].as_array().into_iter().flatten().enumerate() {
            let call = call_of(item["type"] == "function_call", item, "call_id");
            if splice.slot(at as u64, borrowed(&call)).is_none() {
                splice.argument(at as u64, item["arguments"].as_str().unwrap_or(""));
            } else {
                splice.round.blocks.push(item.clone());
            }
        }
        override_usage(&mut splice.round_usage, &body["usage"]);
        let status = body["status"].as_str().unwrap_or("");
        splice.holding = splice.ends_in_ours(stop_reason(status));
    }

    fn end_round(&mut self) {
        self.sequenced = false;
    }

    /// The sequence number after the last one the client got.
    fn next_sequence(&mut self) -> u64 {
        let next = self.last_sequence.map_or(0, |last| last + 1);
        self.last_sequence = Some(next);
        next
    }

    /// The first round's response closed as `response.failed`, numbered on from the error
    /// event.
    fn failed(&mut self, splice: &SpliceState, error: &Value) -> Option<Vec<u8>> {
        let error = &error["error"];
        let failed_at = self.next_sequence();
        let mut response = self.created.clone().unwrap_or_else(|| json!({}));
        if let Some(id) = &splice.id {
            response["id"] = id.clone();
        }
        let code = error["code"].as_str().or(error["type"].as_str());
        response["status"] = json!("failed");
        response["error"] = json!({"code": code, "message": error["message"]});
        response["output"] = Value::Array(self.output.clone());
        response["usage"] = splice.total_usage();
        let failed =
            json!({"type": "response.failed", "sequence_number": failed_at, "response": response});
        let failed = failed.as_object().expect("an event is a JSON object");
        Some(sse::encode_event(Format::Responses, failed))
    }

    fn latest_id(&self) -> Option<&str> {
        self.latest_id.as_deref()
    }
}

impl Sequenced {
    /// Whether a Responses event passes (`None`: held back) and whether it was rewritten.
    fn passes(
        &mut self,
        splice: &mut SpliceState,
        kind: &str,
        event: &mut Map<String, Value>,
    ) -> Option<bool> {
        let mut changed = false;
        match kind {
            "response.created" | "response.in_progress" => {
                if splice.id.is_none() {
                    splice.id = field(event, "response").get("id").cloned();
                }
                if self.created.is_none() {
                    self.created = Some(field(event, "response").clone());
                }
                if let Some(id) = field(event, "response")["id"].as_str() {
                    self.latest_id = Some(id.to_owned());
                }
                if splice.finished > 0 {
                    return None;
                }
            }
            "response.output_item.added" => {
                let item = field(event, "item");
                let call = call_of(item["type"] == "function_call", item, "call_id");
                let at = field(event, "output_index").as_u64().unwrap_or(0);
                splice.slot(at, borrowed(&call));
            }
            "response.output_item.done" => {
                let at = field(event, "output_index").as_u64().unwrap_or(0);
                let item = field(event, "item").clone();
                match splice.ours_at.get(&at) {
                    Some(&i) => {
                        splice.ours[i].arguments =
                            item["arguments"].as_str().unwrap_or("").to_owned();
                    }
                    None => {
                        self.output.push(item.clone());
                        splice.round.blocks.push(item);
                    }
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = field(event, "response").clone();
                override_usage(&mut splice.round_usage, &response["usage"]);
                let status = response["status"].as_str().unwrap_or("");
                if splice.ends_in_ours(stop_reason(status)) {
                    splice.holding = true;
                    return None;
                }
                if splice.finished > 0 || !splice.ours.is_empty() {
                    let mut response = response;
                    if let Some(id) = &splice.id {
                        response["id"] = id.clone();
                    }
                    response["output"] = Value::Array(self.output.clone());
                    response["usage"] = splice.total_usage();
                    event.insert("response".into(), response);
                    changed = true;
                }
            }
            _ => {}
        }
        if splice.holding {
            return None;
        }
        if let Some(at) = field(event, "output_index").as_u64() {
            let out = (*splice.map.get(&at)?)?;
            if out != at {
                event.insert("output_index".into(), json!(out));
                changed = true;
            }
        }
        Some(changed)
    }
}
