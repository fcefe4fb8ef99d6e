//! The chat wire formats the pipeline rewrites: OpenAI Chat Completions, OpenAI Responses,
//! Anthropic Messages and Gemini `generateContent`. Reading a request (its live question, its first message),
//! replacing its messages with the frame, and reading the reply's text out of a JSON body or an
//! SSE stream.

use serde_json::{Map, Value, json};

use crate::frame::{Frame, Side};

use super::provider::Provider;

/// A chat API's wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenAI Chat Completions: `messages`, system prompt as leading messages.
    Chat,
    /// OpenAI Responses: `input` (a string or a list of items), `instructions` apart.
    Responses,
    /// Anthropic Messages: `messages`, `system` apart, `max_tokens` required.
    Messages,
    /// Gemini: `contents` of `{role: user|model, parts}`, `systemInstruction` apart, the model
    /// in the path.
    Gemini,
}

impl Format {
    /// The provider whose API this is.
    pub fn provider(self) -> Provider {
        match self {
            Self::Chat | Self::Responses => Provider::OpenAi,
            Self::Messages => Provider::Anthropic,
            Self::Gemini => Provider::Gemini,
        }
    }

    /// The body field holding the conversation.
    pub fn list(self) -> &'static str {
        match self {
            Self::Chat | Self::Messages => "messages",
            Self::Responses => "input",
            Self::Gemini => "contents",
        }
    }
}

/// A parsed chat request.
#[derive(Debug, Clone)]
pub struct Request {
    pub format: Format,
    pub body: Map<String, Value>,
    pub model: String,
    /// The conversation's messages (a Responses string input is one user message).
    pub messages: Vec<Value>,
    /// Index in `messages` of the live question: the last user message with text.
    pub question_at: Option<usize>,
    /// The live question's text.
    pub question: Option<String>,
    /// The text of the first non-system message (the conversation's default key).
    pub first: Option<String>,
    /// The provider keeps this conversation's history itself (Responses
    /// `previous_response_id`): the frame cannot replace it, so the request is forwarded as is.
    pub server_history: bool,
}

impl Request {
    /// Whether the live question is the request's last message: a new user turn to capture
    /// (otherwise the request continues a tool round of an earlier question).
    pub fn question_is_new(&self) -> bool {
        self.question_at
            .is_some_and(|i| i + 1 == self.messages.len())
    }
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
                .filter(|p| match p.get("type").and_then(Value::as_str) {
                    Some(kind) => matches!(kind, "text" | "input_text" | "output_text"),
                    // Gemini parts carry no type: a text part is `{"text": ...}` (thoughts aside).
                    None => p.get("thought").is_none_or(|t| t != true),
                })
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .filter(|t| !t.is_empty())
                .collect();
            (!texts.is_empty()).then(|| texts.join("\n\n"))
        }
        _ => None,
    }
}

/// The text of a message in any format: its `content`, or Gemini's `parts`.
fn message_text(message: &Value) -> Option<String> {
    message
        .get("content")
        .or_else(|| message.get("parts"))
        .and_then(text_of)
}

/// Whether an OpenAI message is part of the system prompt (kept in front of the frame).
fn is_system(message: &Value) -> bool {
    matches!(
        message.get("role").and_then(Value::as_str),
        Some("system" | "developer")
    )
}

/// Parse a chat request body in `format` (`path_model`: the model named by the path, Gemini's
/// way); the message says what is wrong.
pub fn parse(format: Format, bytes: &[u8], path_model: Option<&str>) -> Result<Request, String> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let Value::Object(body) = value else {
        return Err("the body must be a JSON object".into());
    };
    let model = match path_model {
        Some(model) => model.to_owned(),
        None => body
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .ok_or("`model` must be a non-empty string")?
            .to_owned(),
    };
    let list = format.list();
    let messages = match body.get(list) {
        Some(Value::Array(items)) => items.clone(),
        Some(Value::String(text)) if format == Format::Responses => {
            vec![json!({"role": "user", "content": text})]
        }
        _ if format == Format::Responses => {
            return Err("`input` must be a string or an array".into());
        }
        _ => return Err(format!("`{list}` must be an array")),
    };
    if format == Format::Messages && !body.get("max_tokens").is_some_and(Value::is_u64) {
        return Err("`max_tokens` must be a positive integer".into());
    }
    for (i, message) in messages.iter().enumerate() {
        // Responses items other than messages (function calls, their outputs) have no role.
        let needs_role = match format {
            Format::Responses => message.get("type").is_none(),
            // Gemini's role may be left out on a single-turn request (it means the user).
            Format::Gemini => false,
            Format::Chat | Format::Messages => true,
        };
        if needs_role && message.get("role").and_then(Value::as_str).is_none() {
            return Err(format!("{list}[{i}] has no `role` string"));
        }
    }
    let is_user_text = |m: &Value| {
        let role = m.get("role").and_then(Value::as_str);
        let user = role == Some("user") || (format == Format::Gemini && role.is_none());
        user && message_text(m).is_some()
    };
    let question_at = messages.iter().rposition(is_user_text);
    let question = question_at.and_then(|i| message_text(&messages[i]));
    let first = messages
        .iter()
        .find(|m| !is_system(m))
        .and_then(message_text);
    let server_history = format == Format::Responses
        && body
            .get("previous_response_id")
            .is_some_and(|v| !v.is_null());
    Ok(Request {
        format,
        body,
        model,
        messages,
        question_at,
        question,
        first,
        server_history,
    })
}

/// The request body with its messages replaced: OpenAI keeps its leading system and developer
/// messages, Anthropic its top-level `system`, Responses its `instructions`; then the frame
/// (which ends with the live question); then whatever followed the live question (an ongoing
/// tool round), verbatim.
pub fn with_frame(request: &Request, frame: &Frame) -> Vec<u8> {
    serde_json::to_vec(&Value::Object(framed(request, frame))).expect("a JSON value serialises")
}

/// The body [`with_frame`] sends, before it is serialised.
pub fn framed(request: &Request, frame: &Frame) -> Map<String, Value> {
    let mut out: Vec<Value> = Vec::new();
    if request.format != Format::Messages {
        out.extend(
            request
                .messages
                .iter()
                .take_while(|m| is_system(m))
                .cloned(),
        );
    }
    out.extend(frame.messages.iter().map(|m| match request.format {
        Format::Gemini => json!({
            "role": match m.role {
                Side::User => "user",
                Side::Assistant => "model",
            },
            "parts": [{"text": m.content}],
        }),
        Format::Chat | Format::Responses | Format::Messages => json!({
            "role": match m.role {
                Side::User => "user",
                Side::Assistant => "assistant",
            },
            "content": m.content,
        }),
    }));
    if let Some(at) = request.question_at {
        out.extend(request.messages.iter().skip(at + 1).cloned());
    }
    let mut body = request.body.clone();
    body.insert(request.format.list().into(), Value::Array(out));
    body
}

/// The assistant text of a non-streamed reply body.
pub fn reply_text(format: Format, body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    match format {
        Format::Chat => value["choices"][0]["message"]["content"]
            .as_str()
            .map(str::to_owned),
        Format::Messages => text_of(&value["content"]),
        Format::Gemini => text_of(&value["candidates"][0]["content"]["parts"]),
        Format::Responses => {
            let texts: Vec<String> = value["output"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|item| item["type"] == "message")
                .filter_map(|item| text_of(&item["content"]))
                .collect();
            (!texts.is_empty()).then(|| texts.join("\n\n"))
        }
    }
    .filter(|t| !t.is_empty())
}

/// Reads the assistant text out of an SSE stream as its bytes pass by.
#[derive(Debug)]
pub struct StreamReader {
    format: Format,
    pending: Vec<u8>,
    text: String,
    complete: bool,
    /// Whether the bytes seen so far end on an event boundary (a blank line).
    terminated: bool,
}

impl StreamReader {
    pub fn new(format: Format) -> Self {
        Self {
            format,
            pending: Vec::new(),
            text: String::new(),
            complete: false,
            terminated: true,
        }
    }

    /// Take in the next bytes of the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.pending.extend_from_slice(bytes);
        while let Some((end, gap)) = event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end + gap).take(end).collect();
            self.event(&event);
        }
        self.terminated = self.pending.is_empty();
    }

    /// Whether the stream so far ends on an event boundary; a proxy must end its last event with
    /// a blank line or clients drop it.
    pub fn terminated(&self) -> bool {
        self.terminated
    }

    /// The text read so far, and whether the stream said it was complete.
    pub fn finish(mut self) -> (String, bool) {
        if !self.pending.is_empty() {
            let event = std::mem::take(&mut self.pending);
            self.event(&event);
        }
        (self.text, self.complete)
    }

    fn event(&mut self, event: &[u8]) {
        let data = event_data(event);
        if data.trim() == "[DONE]" {
            self.complete = true;
            return;
        }
        let Ok(value) = serde_json::from_str::<Value>(&data) else {
            return;
        };
        match self.format {
            Format::Chat => {
                for choice in value["choices"].as_array().into_iter().flatten() {
                    if choice["index"].as_u64().unwrap_or(0) != 0 {
                        continue;
                    }
                    if let Some(piece) = choice["delta"]["content"].as_str() {
                        self.text.push_str(piece);
                    }
                    if choice["finish_reason"].is_string() {
                        self.complete = true;
                    }
                }
            }
            Format::Messages => match value["type"].as_str() {
                Some("content_block_delta") if value["delta"]["type"] == "text_delta" => {
                    if let Some(piece) = value["delta"]["text"].as_str() {
                        self.text.push_str(piece);
                    }
                }
                Some("message_stop") => self.complete = true,
                _ => {}
            },
            Format::Gemini => {
                let candidate = &value["candidates"][0];
                if let Some(piece) = text_of(&candidate["content"]["parts"]) {
                    self.text.push_str(&piece);
                }
                if candidate["finishReason"].is_string() {
                    self.complete = true;
                }
            }
            Format::Responses => match value["type"].as_str() {
                Some("response.output_item.added")
                    if value["item"]["type"] == "message" && !self.text.is_empty() =>
                {
                    self.text.push_str("\n\n");
                }
                Some("response.output_text.delta") => {
                    if let Some(piece) = value["delta"].as_str() {
                        self.text.push_str(piece);
                    }
                }
                Some("response.completed") => self.complete = true,
                _ => {}
            },
        }
    }
}

/// The `data:` of one SSE event (without its blank line), its lines joined by newlines.
pub fn event_data(event: &[u8]) -> String {
    let text = String::from_utf8_lossy(event);
    let mut data = String::new();
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    data
}

/// One SSE event carrying `data`, as `format`'s stream carries it: Responses and Messages name
/// the event's `type` in an `event:` line (left out when there is none, or when it holds a line
/// break and so could not stay one line); Gemini ends events with CRLF pairs, as its API does.
/// [`event_end`] finds exactly this one event in it, and [`event_data`] reads `data` back.
pub fn encode_event(format: Format, data: &Map<String, Value>) -> Vec<u8> {
    let mut out = Vec::new();
    if matches!(format, Format::Responses | Format::Messages)
        && let Some(kind) = data.get("type").and_then(Value::as_str)
        && !kind.contains(['\r', '\n'])
    {
        out.extend_from_slice(format!("event: {kind}\n").as_bytes());
    }
    let end = match format {
        Format::Gemini => "\r\n\r\n",
        Format::Chat | Format::Responses | Format::Messages => "\n\n",
    };
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut out, data).expect("a JSON map serialises");
    out.extend_from_slice(end.as_bytes());
    out
}

/// The end of the first complete event in `bytes` and the length of the blank line after it.
pub fn event_end(bytes: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i < bytes.len() {
        for gap in [&b"\r\n\r\n"[..], b"\n\n", b"\r\r"] {
            if bytes[i..].starts_with(gap) {
                return Some((i, gap.len()));
            }
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Message, Omitted};
    use crate::types::RowId;

    fn frame(messages: &[(Side, &str)]) -> Frame {
        Frame {
            messages: messages
                .iter()
                .map(|(role, content)| Message {
                    role: *role,
                    content: (*content).to_owned(),
                    rows: vec![RowId(1)],
                    tokens: 1,
                })
                .collect(),
            tokens: messages.len(),
            cap: 100,
            rows: vec![RowId(1)],
            mandatory: 1,
            omitted: Omitted::default(),
        }
    }

    #[test]
    fn openai_keeps_system_messages_and_the_tool_round_after_the_question() {
        let body = json!({
            "model": "gpt-4o",
            "stream": true,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "first question"},
                {"role": "assistant", "content": "first answer"},
                {"role": "user", "content": [{"type": "text", "text": "what is the weather?"}]},
                {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
            ]
        });
        let request = parse(Format::Chat, body.to_string().as_bytes(), None).unwrap();
        assert_eq!(request.question.as_deref(), Some("what is the weather?"));
        assert_eq!(request.first.as_deref(), Some("first question"));
        assert!(!request.question_is_new());
        let out: Value = serde_json::from_slice(&with_frame(
            &request,
            &frame(&[(Side::User, "[frame] what is the weather?")]),
        ))
        .unwrap();
        let roles: Vec<&str> = out["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(
            out["messages"][1]["content"],
            "[frame] what is the weather?"
        );
        assert_eq!(out["model"], "gpt-4o");
    }

    #[test]
    fn anthropic_keeps_its_system_and_requires_max_tokens() {
        let body = json!({
            "model": "claude-haiku-4-5",
            "max_tokens": 100,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "hello"}]
        });
        let request = parse(Format::Messages, body.to_string().as_bytes(), None).unwrap();
        assert!(request.question_is_new());
        let out: Value =
            serde_json::from_slice(&with_frame(&request, &frame(&[(Side::User, "hello")])))
                .unwrap();
        assert_eq!(out["system"], body["system"]);
        assert_eq!(
            out["messages"],
            json!([{"role": "user", "content": "hello"}])
        );
        let missing = json!({"model": "claude-haiku-4-5", "messages": []});
        assert!(
            parse(Format::Messages, missing.to_string().as_bytes(), None)
                .unwrap_err()
                .contains("max_tokens")
        );
    }

    #[test]
    fn responses_take_a_string_or_items_and_keep_instructions_and_the_tool_round() {
        let text = json!({"model": "gpt-5", "instructions": "Be brief.", "input": "hello"});
        let request = parse(Format::Responses, text.to_string().as_bytes(), None).unwrap();
        assert_eq!(request.question.as_deref(), Some("hello"));
        assert!(request.question_is_new() && !request.server_history);
        let out: Value = serde_json::from_slice(&with_frame(
            &request,
            &frame(&[(Side::User, "[frame] hello")]),
        ))
        .unwrap();
        assert_eq!(out["instructions"], "Be brief.");
        assert_eq!(
            out["input"],
            json!([{"role": "user", "content": "[frame] hello"}])
        );

        let items = json!({
            "model": "gpt-5",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
            ],
            "previous_response_id": null
        });
        let request = parse(Format::Responses, items.to_string().as_bytes(), None).unwrap();
        assert_eq!(request.question.as_deref(), Some("weather?"));
        assert!(!request.question_is_new());
        let out: Value = serde_json::from_slice(&with_frame(
            &request,
            &frame(&[(Side::User, "[frame] weather?")]),
        ))
        .unwrap();
        let kinds: Vec<String> = out["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                i["role"]
                    .as_str()
                    .or(i["type"].as_str())
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(
            kinds,
            ["developer", "user", "function_call", "function_call_output"]
        );

        let chained =
            json!({"model": "gpt-5", "input": "and then?", "previous_response_id": "resp_1"});
        assert!(
            parse(Format::Responses, chained.to_string().as_bytes(), None)
                .unwrap()
                .server_history
        );
        assert!(
            parse(
                Format::Responses,
                br#"{"model": "gpt-5", "input": 3}"#,
                None
            )
            .is_err()
        );
    }

    #[test]
    fn responses_text_from_a_body_and_a_stream() {
        let body = json!({"output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "content": [{"type": "output_text", "text": "Sunny."}]}
        ]});
        assert_eq!(
            reply_text(Format::Responses, body.to_string().as_bytes()).as_deref(),
            Some("Sunny.")
        );
        let stream = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Sun\"}\n\n\
                      event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"ny.\"}\n\n\
                      event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n";
        let mut reader = StreamReader::new(Format::Responses);
        reader.feed(stream.as_bytes());
        assert_eq!(reader.finish(), ("Sunny.".to_owned(), true));
    }

    #[test]
    fn gemini_takes_its_model_from_the_path_and_speaks_parts() {
        let body = json!({
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
            "contents": [
                {"role": "user", "parts": [{"text": "old"}]},
                {"role": "model", "parts": [{"text": "RESENT", "thoughtSignature": "x"}]},
                {"role": "user", "parts": [{"text": "How many r's in strawberry?"}]}
            ]
        });
        let request = parse(
            Format::Gemini,
            body.to_string().as_bytes(),
            Some("gemini-3-pro-preview"),
        )
        .unwrap();
        assert_eq!(request.model, "gemini-3-pro-preview");
        assert_eq!(
            request.question.as_deref(),
            Some("How many r's in strawberry?")
        );
        assert!(request.question_is_new());
        let out: Value = serde_json::from_slice(&with_frame(
            &request,
            &frame(&[
                (Side::User, "[frame]"),
                (Side::Assistant, "earlier"),
                (Side::User, "q"),
            ]),
        ))
        .unwrap();
        assert_eq!(out["systemInstruction"], body["systemInstruction"]);
        assert_eq!(
            out["contents"],
            json!([
                {"role": "user", "parts": [{"text": "[frame]"}]},
                {"role": "model", "parts": [{"text": "earlier"}]},
                {"role": "user", "parts": [{"text": "q"}]}
            ])
        );
        let reply = json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "thinking", "thought": true}, {"text": "Three."}
        ]}, "finishReason": "STOP"}]});
        assert_eq!(
            reply_text(Format::Gemini, reply.to_string().as_bytes()).as_deref(),
            Some("Three.")
        );
        let stream = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Thr\"}]}}]}\r\n\r\n\
                      data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"ee.\"}]},\"finishReason\":\"STOP\"}]}\r\n\r\n";
        let mut reader = StreamReader::new(Format::Gemini);
        reader.feed(stream.as_bytes());
        assert!(reader.terminated());
        assert_eq!(reader.finish(), ("Three.".to_owned(), true));
    }

    #[test]
    fn malformed_bodies_are_refused_with_a_reason() {
        for (body, reason) in [
            ("{", "not valid JSON"),
            ("[]", "JSON object"),
            (r#"{"messages": []}"#, "`model`"),
            (r#"{"model": "gpt-4o"}"#, "`messages`"),
            (
                r#"{"model": "gpt-4o", "messages": [{"content": "x"}]}"#,
                "role",
            ),
        ] {
            let err = parse(Format::Chat, body.as_bytes(), None).unwrap_err();
            assert!(err.contains(reason), "{body}: {err}");
        }
    }

    #[test]
    fn stream_text_survives_any_split_of_the_bytes() {
        let stream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
                      data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Gr\u{fc}\u{df}e \"}}]}\n\n\
                      data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other choice\"}}]}\n\n\
                      data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\u{f7} 2\"},\"finish_reason\":\"stop\"}]}\n\n\
                      data: [DONE]\n\n";
        let bytes = stream.as_bytes();
        for cut in 0..bytes.len() {
            let mut reader = StreamReader::new(Format::Chat);
            reader.feed(&bytes[..cut]);
            reader.feed(&bytes[cut..]);
            assert!(reader.terminated());
            assert_eq!(
                reader.finish(),
                ("Gr\u{fc}\u{df}e \u{f7} 2".to_owned(), true)
            );
        }
    }

    #[test]
    fn anthropic_text_deltas_and_an_unterminated_end() {
        let stream = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n\
                      event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
                      event: message_stop\ndata: {\"type\":\"message_stop\"}";
        let mut reader = StreamReader::new(Format::Messages);
        reader.feed(stream.as_bytes());
        assert!(!reader.terminated());
        assert_eq!(reader.finish(), ("Hi".to_owned(), true));
    }

    #[test]
    fn an_encoded_event_is_one_event_holding_its_data() {
        let cases = [
            (Format::Chat, json!({"id": "a", "choices": []}), "data: "),
            (Format::Gemini, json!({"candidates": []}), "data: "),
            (
                Format::Messages,
                json!({"type": "message_stop"}),
                "event: message_stop\ndata: ",
            ),
            (
                Format::Responses,
                json!({"type": "response.completed"}),
                "event: response.completed\ndata: ",
            ),
            (Format::Responses, json!({"error": {}}), "data: "),
            // A type holding a blank line would end the event early and make its data a
            // second event: the event line is left out.
            (
                Format::Messages,
                json!({"type": "a\n\ndata: {}", "text": "x\r\ny"}),
                "data: ",
            ),
        ];
        for (format, data, head) in cases {
            let Value::Object(data) = data else {
                unreachable!()
            };
            let event = encode_event(format, &data);
            let text = String::from_utf8(event.clone()).unwrap();
            assert!(text.starts_with(head), "{text:?}");
            let (end, gap) = event_end(&event).unwrap();
            assert_eq!(end + gap, event.len(), "{text:?}");
            let back: Value = serde_json::from_str(&event_data(&event[..end])).unwrap();
            assert_eq!(back, Value::Object(data));
        }
    }
}
