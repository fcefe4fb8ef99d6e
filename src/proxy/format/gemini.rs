//! Gemini `generateContent`: `contents` of `{role: user|model, parts}`, the model in the path,
//! calls and results as `functionCall` / `functionResponse` parts; streamed as whole
//! `GenerateContentResponse` chunks ending with CRLF pairs.

use serde_json::{Map, Value, json};

use crate::frame::Side;
use crate::memory_tools;
use crate::proxy::harness::Kind;
use crate::proxy::provider::Provider;
use crate::proxy::rounds::{Pending, Round, SpliceState, override_usage};
use crate::proxy::sse::{StreamReader, encode_event};
use crate::proxy::wire::{self, Call, Outcome, block_calls, block_results, text_of};

use super::{Event, Format, FormatSplice, WireFormat, blocks_said, earlier_then_kept, names_ours};

/// Gemini `generateContent` and `streamGenerateContent`.
#[derive(Debug)]
pub(super) struct Gemini;

impl WireFormat for Gemini {
    fn metric(&self) -> &'static str {
        "gemini_generate"
    }

    fn serves(&self, path: &str) -> bool {
        model_in(path).is_some()
    }

    fn path_model<'p>(&self, path: &'p str) -> Option<&'p str> {
        model_in(path)
    }

    fn provider(&self) -> Provider {
        Provider::Gemini
    }

    fn name(&self) -> &'static str {
        "gemini"
    }

    fn list(&self) -> &'static str {
        "contents"
    }

    /// Gemini's role may be left out on a single-turn request (it means the user).
    fn needs_role(&self, _item: &Value) -> bool {
        false
    }

    fn kind_of(&self, item: &Value) -> Kind {
        match item.get("role").and_then(Value::as_str) {
            None => wire::user_kind(item),
            Some(_) => wire::kind_by_role(item),
        }
    }

    fn frame_item(&self, side: Side, text: &str) -> Value {
        json!({
            "role": match side {
                Side::User => "user",
                Side::Assistant => "model",
            },
            "parts": [{"text": text}],
        })
    }

    fn calls_in(&self, item: &Value) -> Vec<Call> {
        block_calls(item)
    }

    fn results_in(&self, item: &Value) -> Vec<Outcome> {
        block_results(item)
    }

    fn reply_text(&self, body: &Value) -> Option<String> {
        text_of(&body["candidates"][0]["content"]["parts"])
    }

    fn read_event(&self, event: &Value, reader: &mut StreamReader) {
        let candidate = &event["candidates"][0];
        if let Some(piece) = text_of(&candidate["content"]["parts"]) {
            reader.push(&piece);
        }
        if candidate["finishReason"].is_string() {
            reader.complete();
        }
    }

    fn event_gap(&self) -> &'static str {
        "\r\n\r\n"
    }

    fn declared(&self, spec: &memory_tools::Spec) -> Value {
        json!({
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        })
    }

    /// The entry declaring ours: every declaration in it is one of ours.
    fn is_ours(&self, tool: &Value) -> bool {
        tool["functionDeclarations"]
            .as_array()
            .is_some_and(|d| !d.is_empty() && d.iter().all(|f| names_ours(&f["name"])))
    }

    /// One more `functionDeclarations` entry.
    fn offered(&self, declared: Vec<Value>) -> Vec<Value> {
        vec![json!({"functionDeclarations": declared})]
    }

    fn said(&self, round: &Round) -> String {
        blocks_said(round)
    }

    fn round_items(&self, round: &Round) -> Vec<Value> {
        let mut parts = round.blocks.clone();
        let mut answers = Vec::new();
        for (call, result) in &round.calls {
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

    fn splice(&self) -> Box<dyn FormatSplice> {
        Box::new(Gemini)
    }

    fn merge_rounds(&self, body: &mut Value, earlier: &[Round]) {
        let content = &mut body["candidates"][0]["content"];
        content["parts"] = earlier_then_kept(earlier, &content["parts"], |p| {
            names_ours(&p["functionCall"]["name"])
        });
    }

    fn usage_key(&self) -> &'static str {
        "usageMetadata"
    }
}

/// Gemini keeps no splice state of its own: the ids and indices are every format's.
impl FormatSplice for Gemini {
    /// A Gemini chunk (a whole `GenerateContentResponse`): the first round's `responseId`, our
    /// calls' parts taken out, the usage summed once rounds were spliced.
    fn event(&mut self, splice: &mut SpliceState, mut chunk: Map<String, Value>) -> Event {
        if let Some(usage) = chunk
            .get("usageMetadata")
            .filter(|u| u.is_object())
            .cloned()
        {
            override_usage(&mut splice.round_usage, &usage);
        }
        if splice.holding {
            return Event::Hold;
        }
        let mut changed = splice.same_id(&mut chunk, "responseId");
        let (taken, finish, left) = take_ours(splice, &mut chunk);
        changed |= taken;
        if let Some(reason) = &finish
            && splice.ends_in_ours(reason)
        {
            splice.holding = true;
            return Event::Hold;
        }
        let usage = chunk.contains_key("usageMetadata");
        if splice.finished > 0 && usage {
            chunk.insert("usageMetadata".into(), splice.total_usage());
            changed = true;
        }
        if !changed {
            return Event::Pass;
        }
        // A chunk left without parts by taking ours out is dropped, usage or not (the usage is
        // counted, and later chunks carry it): Gemini's chat history refuses a turn in which a
        // chunk has no parts.
        if !left && finish.is_none() && (taken || !usage) {
            return Event::Hold;
        }
        Event::Rewrite(encode_event(Format::Gemini, &chunk))
    }

    fn whole(&mut self, splice: &mut SpliceState, body: &Value) {
        if let Value::Object(mut response) = body.clone() {
            let (_, finish, _) = take_ours(splice, &mut response);
            override_usage(&mut splice.round_usage, &body["usageMetadata"]);
            splice.holding = finish.is_some_and(|r| splice.ends_in_ours(&r));
        }
    }
}

/// Take our calls out of a Gemini response (a streamed chunk or a whole body), recording the
/// round's other parts: whether anything was taken, the finish reason, whether parts are left.
fn take_ours(
    splice: &mut SpliceState,
    response: &mut Map<String, Value>,
) -> (bool, Option<String>, bool) {
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
                if splice.intercept && memory_tools::is_memory_tool(name) {
                    splice.ours.push(Pending {
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
                splice.harness_calls += 1;
            }
            splice.round.blocks.push(part.clone());
            kept.push(part);
        }
        left = !kept.is_empty();
        *parts = kept;
    }
    (taken, finish, left)
}

/// The Gemini API's versions: the stable `v1` (the path `google-genai` 3.x calls by default)
/// and the previews, which only Gemini serves.
pub(in crate::proxy) const GEMINI_VERSIONS: [&str; 3] = ["/v1/", "/v1beta/", "/v1alpha/"];

/// The model of a Gemini `generateContent` / `streamGenerateContent` path, in any of
/// [`GEMINI_VERSIONS`].
fn model_in(path: &str) -> Option<&str> {
    let rest = GEMINI_VERSIONS
        .iter()
        .find_map(|version| path.strip_prefix(version))?;
    let (model, method) = rest.strip_prefix("models/")?.split_once(':')?;
    (matches!(method, "generateContent" | "streamGenerateContent") && !model.is_empty())
        .then_some(model)
}
