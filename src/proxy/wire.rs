//! The chat wire formats the pipeline rewrites: OpenAI Chat Completions, OpenAI Responses,
//! Anthropic Messages and Gemini `generateContent`. Reading a request (its live question, its first message),
//! replacing its messages with the frame, and reading the reply's text out of a JSON body or an
//! SSE stream.

use std::collections::HashMap;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::frame::Frame;

pub use super::format::Format;
use super::harness::{self, Kind};

/// A parsed chat request, read as a harness sends it (`harness`): its instructions and injected
/// context, the live turn, and the tool round after it.
#[derive(Debug, Clone)]
pub struct Request {
    pub format: Format,
    /// The body, its conversation list left empty: the items are in `messages` (a body's
    /// parsed tree is many times its size, so it is held once).
    pub body: Map<String, Value>,
    pub model: String,
    /// The conversation's items (a Responses string input is one user message).
    pub messages: Vec<Value>,
    /// What each of `messages` is.
    pub kinds: Vec<Kind>,
    /// Index in `messages` of the live turn: the last user turn with words or attachments.
    pub question_at: Option<usize>,
    /// The live turn as stored: the user's words (harness context taken out), then one
    /// placeholder line per attachment.
    pub question: Option<String>,
    /// The words of the first user turn (the conversation's default key).
    pub first: Option<String>,
    /// The provider keeps this conversation's history itself (Responses
    /// `previous_response_id`): the frame cannot replace it, so the request is forwarded as is.
    pub server_history: bool,
    /// The body's fields as the client wrote them, in its order ([`encode`]).
    raw: Vec<(String, Box<RawValue>)>,
    /// The conversation's items as the client wrote them (none when it was a string).
    raw_items: Vec<Box<RawValue>>,
    /// The body's size in bytes.
    size: usize,
}

impl Request {
    /// Whether the live turn is new: nothing but instructions or context follows it (otherwise
    /// the request continues the tool round of an earlier question).
    pub fn question_is_new(&self) -> bool {
        self.question_at.is_some_and(|at| {
            self.kinds[at + 1..]
                .iter()
                .all(|k| matches!(k, Kind::Instructions | Kind::Context))
        })
    }

    /// Bytes of the conversation before the live turn as the client wrote it (its turns, the
    /// agent's messages and calls, tool results; not instructions or context): what the
    /// harness would have the model read of its history.
    pub fn history_bytes(&self) -> usize {
        let at = self.question_at.unwrap_or(self.messages.len());
        (0..at)
            .filter(|&i| matches!(self.kinds[i], Kind::Turn | Kind::Agent | Kind::Result))
            .map(|i| match self.raw_items.get(i) {
                Some(raw) => raw.get().len(),
                None => serde_json::to_vec(&self.messages[i]).map_or(0, |bytes| bytes.len()),
            })
            .sum()
    }

    /// The items of the ongoing tool round: everything after the live turn that the agent did
    /// or got back (its calls, their results), with their indices.
    pub fn round(&self) -> impl Iterator<Item = (usize, &Value)> {
        let from = self.question_at.map_or(self.messages.len(), |at| at + 1);
        (from..self.messages.len())
            .filter(|&i| matches!(self.kinds[i], Kind::Agent | Kind::Result))
            .map(|i| (i, &self.messages[i]))
    }
}

/// Whether a content block is text the model reads as words (`text`, `input_text`,
/// `output_text`; Gemini's untyped `{"text"}` parts, thoughts aside).
fn is_text_block(block: &Value) -> bool {
    match block.get("type").and_then(Value::as_str) {
        Some(kind) => matches!(kind, "text" | "input_text" | "output_text"),
        None => block.get("text").is_some() && block.get("thought").is_none_or(|t| t != true),
    }
}

/// Whether a content block is a tool's result (Anthropic `tool_result`, Gemini
/// `functionResponse`).
fn is_result_block(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some("tool_result")
        || block.get("functionResponse").is_some()
}

/// Whether a content block is a call the agent made (Anthropic `tool_use`, Gemini
/// `functionCall`), or its thinking.
fn is_agent_block(block: &Value) -> bool {
    matches!(
        block.get("type").and_then(Value::as_str),
        Some("tool_use" | "server_tool_use" | "thinking" | "redacted_thinking")
    ) || block.get("functionCall").is_some()
        || block.get("thought").is_some_and(|t| t == true)
}

/// The text of a message's `content`: a string, or the text parts of an array (`text`,
/// `input_text`, `output_text`) joined by blank lines. `None` when it holds no text (tool
/// results, images only).
pub fn text_of(content: &Value) -> Option<String> {
    match content {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| is_text_block(p))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .filter(|t| !t.is_empty())
                .collect();
            (!texts.is_empty()).then(|| texts.join("\n\n"))
        }
        _ => None,
    }
}

/// A message's content in any format: its `content`, or Gemini's `parts`.
fn content_of(message: &Value) -> Option<&Value> {
    message.get("content").or_else(|| message.get("parts"))
}

/// A user message's words: its text blocks that are not harness context, reminders taken out,
/// joined by blank lines.
fn words_of(content: &Value) -> Option<String> {
    let words: Vec<String> = match content {
        Value::String(s) => vec![s.clone()],
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| is_text_block(b))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .filter(|t| !harness::is_context(t) && !harness::is_markup(t))
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    let words: Vec<String> = words
        .iter()
        .map(|w| harness::without_reminders(w).into_owned())
        .filter(|w| !w.trim().is_empty() && !harness::is_context(w))
        .collect();
    (!words.is_empty()).then(|| words.join("\n\n"))
}

/// A user message's attachments: its blocks that are neither text nor tool traffic.
fn attachments_of(content: &Value) -> Vec<&Value> {
    match content {
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| !is_text_block(b) && !is_result_block(b) && !is_agent_block(b))
            .collect(),
        _ => Vec::new(),
    }
}

/// What an item of a conversation is by its role (formats read typed items first).
pub(super) fn kind_by_role(item: &Value) -> Kind {
    match item.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => Kind::Instructions,
        Some("tool" | "function") => Kind::Result,
        Some("user") => user_kind(item),
        _ => Kind::Agent,
    }
}

/// What a user-role message is: tool results, a turn (words or attachments), or context.
pub(super) fn user_kind(message: &Value) -> Kind {
    let Some(content) = content_of(message) else {
        return Kind::Context;
    };
    if content
        .as_array()
        .is_some_and(|b| b.iter().any(is_result_block))
    {
        return Kind::Result;
    }
    if words_of(content).is_some() || !attachments_of(content).is_empty() {
        Kind::Turn
    } else {
        Kind::Context
    }
}

/// One line standing for an attachment in the stored turn: its kind, media type, size and a
/// content hash; never its bytes.
fn placeholder(block: &Value) -> String {
    let kind = block
        .get("type")
        .and_then(Value::as_str)
        .map(|k| k.trim_start_matches("input_").trim_end_matches("_url"))
        .or_else(|| {
            block
                .get("inlineData")
                .or_else(|| block.get("fileData"))
                .map(|_| "file")
        })
        .unwrap_or("attachment");
    let (mut media, mut bytes) = (None, 0usize);
    let mut visit = vec![block];
    while let Some(value) = visit.pop() {
        match value {
            Value::Object(fields) => {
                for (key, field) in fields {
                    match (key.as_str(), field) {
                        ("media_type" | "mimeType" | "mime_type" | "format", Value::String(m)) => {
                            media.get_or_insert_with(|| m.clone());
                        }
                        (
                            "data" | "file_data" | "url" | "image_url" | "fileUri",
                            Value::String(d),
                        ) => {
                            let (head, payload) = match d.strip_prefix("data:") {
                                Some(rest) => rest.split_once(',').unwrap_or(("", rest)),
                                None => ("", d.as_str()),
                            };
                            if let Some(m) = head.split(';').next().filter(|m| !m.is_empty()) {
                                media.get_or_insert_with(|| m.to_owned());
                            }
                            bytes += if head.ends_with("base64") || key == "data" {
                                payload.len() / 4 * 3
                            } else {
                                payload.len()
                            };
                        }
                        _ => visit.push(field),
                    }
                }
            }
            Value::Array(items) => visit.extend(items),
            _ => {}
        }
    }
    let digest = Sha256::digest(block.to_string().as_bytes());
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let kind = if kind == "file" {
        media
            .as_deref()
            .and_then(|m| m.split('/').next())
            .filter(|m| *m == "image")
            .unwrap_or("file")
    } else {
        kind
    };
    format!(
        "[{kind} attached: {}, {bytes} bytes, sha256 {hash}]",
        media.as_deref().unwrap_or("unknown type")
    )
}

/// A user's turn as stored: its words, then a placeholder line per attachment.
pub fn turn_text(message: &Value) -> Option<String> {
    let content = content_of(message)?;
    let lines: Vec<String> = words_of(content)
        .into_iter()
        .chain(attachments_of(content).into_iter().map(placeholder))
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// Parse a chat request body in `format` (`path_model`: the model named by the path, Gemini's
/// way); the message says what is wrong.
pub fn parse(format: Format, bytes: &[u8], path_model: Option<&str>) -> Result<Request, String> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let Value::Object(mut body) = value else {
        return Err("the body must be a JSON object".into());
    };
    let RawFields(raw) =
        serde_json::from_slice(bytes).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let model = match path_model {
        Some(model) => model.to_owned(),
        None => body
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .ok_or("`model` must be a non-empty string")?
            .to_owned(),
    };
    let wire = format.wire();
    let list = wire.list();
    let messages = wire.take_items(&mut body)?;
    wire.check(&body)?;
    for (i, message) in messages.iter().enumerate() {
        if wire.needs_role(message) && message.get("role").and_then(Value::as_str).is_none() {
            return Err(format!("{list}[{i}] has no `role` string"));
        }
    }
    let raw_items = raw
        .iter()
        .rev()
        .find(|(key, _)| key == list)
        .and_then(|(_, items)| serde_json::from_str::<Vec<Box<RawValue>>>(items.get()).ok())
        .unwrap_or_default();
    let kinds: Vec<Kind> = messages.iter().map(|m| wire.kind_of(m)).collect();
    let question_at = kinds.iter().rposition(|k| *k == Kind::Turn);
    let question = question_at.and_then(|i| turn_text(&messages[i]));
    let first = kinds
        .iter()
        .position(|k| *k == Kind::Turn)
        .and_then(|i| turn_text(&messages[i]));
    let server_history = wire.server_history(&body);
    Ok(Request {
        format,
        body,
        model,
        messages,
        kinds,
        question_at,
        question,
        first,
        server_history,
        raw,
        raw_items,
        size: bytes.len(),
    })
}

/// The frame's messages as `format`'s conversation items.
pub fn frame_items(format: Format, frame: &Frame) -> Vec<Value> {
    frame
        .messages
        .iter()
        .map(|m| format.wire().frame_item(m.role, &m.content))
        .collect()
}

/// The request body with the frame's items ([`frame_items`]) in place of the conversation:
/// the harness's instructions and context that came before the live turn, and the items of
/// its history the memory does not hold (`context`, indices in order: [`super::held`]), in
/// their order; the frame, whose last message (ending with the live question) takes the live
/// turn's place with the turn's other blocks (attachments, context, cache markers) kept where
/// they were; then everything after the live turn (the tool round, trailing instructions),
/// verbatim. Where the client marked its history for the prompt cache (Anthropic), the frame's
/// end carries the last such marker, within the provider's limit of four.
pub fn framed(request: &Request, frame: &[Value], context: &[usize]) -> Framed {
    let at = request.question_at.unwrap_or(request.messages.len());
    let mut out: Vec<Value> = Vec::new();
    let mut verbatim: Vec<Option<usize>> = Vec::new();
    for (i, (message, kind)) in request.messages[..at]
        .iter()
        .zip(&request.kinds)
        .enumerate()
    {
        if matches!(kind, Kind::Instructions | Kind::Context) || context.binary_search(&i).is_ok() {
            out.push(message.clone());
            verbatim.push(Some(i));
        }
    }
    let (last, earlier) = match frame.split_last() {
        Some((last, earlier)) if last.get("role").and_then(Value::as_str) == Some("user") => {
            (Some(last), earlier)
        }
        _ => (None, frame),
    };
    out.extend(earlier.iter().cloned());
    verbatim.resize(out.len(), None);
    let live = request.question_at.map(|i| &request.messages[i]);
    let mut live = match (live, last) {
        (Some(live), Some(last)) => Some(in_place(live, last)),
        (None, Some(last)) => Some(last.clone()),
        (Some(live), None) => Some(live.clone()),
        (None, None) => None,
    };
    if let Some(live) = &mut live {
        request.format.wire().mark_frame_end(request, &out, live);
    }
    out.extend(live);
    verbatim.resize(out.len(), None);
    for i in at + 1..request.messages.len() {
        out.push(request.messages[i].clone());
        verbatim.push(Some(i));
    }
    let list = request.format.list();
    let mut items = Some(Value::Array(out));
    let mut body: Map<String, Value> = request
        .body
        .iter()
        .map(|(key, value)| match items.take_if(|_| key == list) {
            Some(items) => (key.clone(), items),
            None => (key.clone(), value.clone()),
        })
        .collect();
    if let Some(items) = items {
        body.insert(list.into(), items);
    }
    Framed { body, verbatim }
}

/// A request body with the frame in it ([`framed`]), and where each item of its conversation
/// came from: `Some(i)` for the client's item `i` as it came, `None` for one the proxy made.
#[derive(Debug, Clone)]
pub struct Framed {
    pub body: Map<String, Value>,
    pub verbatim: Vec<Option<usize>>,
}

/// The bytes of `body` (the request's own body with what the proxy `owned` changed, or
/// [`Framed::body`] with `verbatim`) as the client wrote them wherever the proxy changed
/// nothing: every field it does not own is copied byte for byte from the request, in the
/// client's order; in the conversation, the client's items kept as they came are copied too;
/// an owned list the proxy only appended to (the memory tools after the harness's) keeps the
/// client's items' bytes before the appended ones. Fields the proxy added come last.
pub fn encode(
    request: &Request,
    body: &Map<String, Value>,
    verbatim: Option<&[Option<usize>]>,
    owned: &[&str],
) -> Vec<u8> {
    let list = request.format.list();
    let mut out = Vec::with_capacity(request.size + 4096);
    out.push(b'{');
    let mut written: Vec<&str> = Vec::with_capacity(request.raw.len());
    for (key, raw) in &request.raw {
        let Some(value) = body.get(key) else {
            continue;
        };
        if !written.is_empty() {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, key).expect("a key serialises");
        out.push(b':');
        if key == list
            && let Some(verbatim) = verbatim
        {
            let items = value.as_array().map_or(&[][..], Vec::as_slice);
            write_items(&mut out, items, |j| {
                verbatim
                    .get(j)
                    .copied()
                    .flatten()
                    .and_then(|i| request.raw_items.get(i))
            });
        } else if owned.contains(&key.as_str()) {
            let kept: Vec<Box<RawValue>> = serde_json::from_str(raw.get()).unwrap_or_default();
            match value.as_array() {
                Some(items) if kept.len() <= items.len() => {
                    write_items(&mut out, items, |j| kept.get(j));
                }
                _ => serde_json::to_writer(&mut out, value).expect("a JSON value serialises"),
            }
        } else {
            out.extend_from_slice(raw.get().as_bytes());
        }
        written.push(key);
    }
    for (key, value) in body.iter().filter(|(k, _)| !written.contains(&k.as_str())) {
        if out.len() > 1 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, key).expect("a key serialises");
        out.push(b':');
        serde_json::to_writer(&mut out, value).expect("a JSON value serialises");
    }
    out.push(b'}');
    out
}

/// A JSON array of `items`, each written as the raw bytes `raw(j)` gives for it, or serialised.
fn write_items<'a>(
    out: &mut Vec<u8>,
    items: &[Value],
    raw: impl Fn(usize) -> Option<&'a Box<RawValue>>,
) {
    out.push(b'[');
    for (j, item) in items.iter().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        match raw(j) {
            Some(raw) => out.extend_from_slice(raw.get().as_bytes()),
            None => serde_json::to_writer(&mut *out, item).expect("a JSON value serialises"),
        }
    }
    out.push(b']');
}

/// A JSON object's fields as the bytes the client wrote, in its order.
struct RawFields(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for RawFields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = RawFields;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawFields, A::Error> {
                let mut fields = Vec::new();
                while let Some(field) = map.next_entry::<String, Box<RawValue>>()? {
                    fields.push(field);
                }
                Ok(RawFields(fields))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// The live turn `live` with its words replaced by the frame's last message `last`: a string
/// content becomes the frame's text; in a list, the first word block takes it (its other
/// fields, a cache marker say, kept), later word blocks go (their words are in the frame), and
/// every other block stays where it was. The message's own fields stay as they came.
fn in_place(live: &Value, last: &Value) -> Value {
    let key = if live.get("parts").is_some() {
        "parts"
    } else {
        "content"
    };
    let text = content_of(last).and_then(text_of).unwrap_or_default();
    let Some(Value::Array(blocks)) = live.get(key) else {
        let mut out = live.clone();
        out[key] = Value::String(text);
        return out;
    };
    let mut placed = false;
    let mut kept = Vec::with_capacity(blocks.len());
    for block in blocks {
        let is_words = is_text_block(block)
            && block
                .get("text")
                .and_then(Value::as_str)
                .is_some_and(|t| !harness::is_context(t) && !harness::is_markup(t));
        if !is_words {
            kept.push(block.clone());
        } else if !placed {
            let mut block = block.clone();
            block["text"] = Value::String(text.clone());
            kept.push(block);
            placed = true;
        }
    }
    if !placed {
        let block = match key {
            "parts" => json!({"text": text}),
            _ if blocks.iter().any(|b| b["type"] == "input_text") => {
                json!({"type": "input_text", "text": text})
            }
            _ => json!({"type": "text", "text": text}),
        };
        let at = kept
            .iter()
            .position(|b| !is_text_block(b))
            .unwrap_or(kept.len());
        kept.insert(at, block);
    }
    let mut out = live.clone();
    out[key] = Value::Array(kept);
    out
}

/// The tool round's items after the question from the `from`th on (counted from the question),
/// as the texts of the turn's tool rows: each call the agent made (`called NAME ARGUMENTS`),
/// each result it got back (`NAME returned: RESULT`, attachments as placeholders), in order;
/// and how many items follow the question. The assistant's words are not here: its reply's
/// text was captured as it streamed.
pub fn round_rows(request: &Request, from: usize) -> (Vec<String>, usize) {
    let Some(at) = request.question_at else {
        return (Vec::new(), 0);
    };
    let after = request.messages.len() - at - 1;
    let mut names: HashMap<String, String> = HashMap::new();
    let mut rows = Vec::new();
    for (i, item) in request.round() {
        let calls = request.format.wire().calls_in(item);
        for call in &calls {
            if let Some(id) = &call.id {
                names.insert(id.clone(), call.name.clone());
            }
        }
        if i - at - 1 < from {
            continue;
        }
        rows.extend(
            calls
                .iter()
                .map(|c| format!("called {} {}", c.name, c.arguments)),
        );
        rows.extend(request.format.wire().results_in(item).into_iter().map(|r| {
            let name = r
                .name
                .or_else(|| r.id.and_then(|id| names.get(&id).cloned()))
                .unwrap_or_else(|| "a tool".into());
            format!("{name} returned: {}", r.text)
        }));
    }
    (rows, after)
}

/// How many items after the question come before the round's last step (the agent's last
/// calls and the results after them).
pub fn last_step(request: &Request) -> usize {
    let Some(at) = request.question_at else {
        return 0;
    };
    let tail = &request.kinds[at + 1..];
    let results = tail
        .iter()
        .rposition(|k| *k != Kind::Result && *k != Kind::Instructions && *k != Kind::Context)
        .unwrap_or(0);
    tail[..results]
        .iter()
        .rposition(|k| *k != Kind::Agent)
        .map_or(0, |i| i + 1)
}

/// A call the agent made: its id (to name its result), tool and arguments.
pub(super) struct Call {
    pub(super) id: Option<String>,
    pub(super) name: String,
    pub(super) arguments: String,
}

/// A result the agent got back: the call it answers (by id or by name) and its text.
pub(super) struct Outcome {
    pub(super) id: Option<String>,
    pub(super) name: Option<String>,
    pub(super) text: String,
}

/// A JSON value as stored text: a string as it is, anything else compact.
pub(super) fn as_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The text of a tool's result content: strings and text blocks as they are, other blocks as
/// placeholders, one per line.
pub(super) fn result_text(content: &Value) -> String {
    match content {
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| match b.get("text").and_then(Value::as_str) {
                Some(text) if is_text_block(b) => text.to_owned(),
                _ => placeholder(b),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        other => as_text(other),
    }
}

/// `key` of `value` as an owned string, when it is one.
pub(super) fn string_field(value: &Value, key: &str) -> Option<String> {
    value.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// The calls in one item's content blocks (Anthropic `tool_use`, Gemini `functionCall`).
pub(super) fn block_calls(item: &Value) -> Vec<Call> {
    content_of(item)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|b| {
            if b.get("type").and_then(Value::as_str) == Some("tool_use") {
                return Some(Call {
                    id: string_field(b, "id"),
                    name: string_field(b, "name").unwrap_or_else(|| "a tool".into()),
                    arguments: as_text(&b["input"]),
                });
            }
            let call = b.get("functionCall")?;
            Some(Call {
                id: string_field(call, "id"),
                name: string_field(call, "name").unwrap_or_else(|| "a tool".into()),
                arguments: as_text(&call["args"]),
            })
        })
        .collect()
}

/// The results in one item's content blocks (Anthropic `tool_result`, Gemini
/// `functionResponse`).
pub(super) fn block_results(item: &Value) -> Vec<Outcome> {
    content_of(item)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|b| {
            if b.get("type").and_then(Value::as_str) == Some("tool_result") {
                return Some(Outcome {
                    id: string_field(b, "tool_use_id"),
                    name: None,
                    text: b.get("content").map(result_text).unwrap_or_default(),
                });
            }
            let response = b.get("functionResponse")?;
            Some(Outcome {
                id: string_field(response, "id"),
                name: string_field(response, "name"),
                text: as_text(&response["response"]),
            })
        })
        .collect()
}

/// The assistant text of a non-streamed reply body.
pub fn reply_text(format: Format, body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    format.wire().reply_text(&value).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests;
