//! The two chat wire formats the pipeline rewrites: OpenAI Chat Completions and Anthropic
//! Messages. Reading a request (its live question, its first message), replacing its messages
//! with the frame, and reading the reply's text out of a JSON body or an SSE stream.

use serde_json::{Map, Value, json};

use crate::frame::{Frame, Side};

use super::provider::Provider;

/// A parsed chat request.
#[derive(Debug, Clone)]
pub struct Request {
    pub body: Map<String, Value>,
    pub model: String,
    pub stream: bool,
    /// Index in `messages` of the live question: the last user message with text.
    pub question_at: Option<usize>,
    /// The live question's text.
    pub question: Option<String>,
    /// The text of the first non-system message (the conversation's default key).
    pub first: Option<String>,
}

impl Request {
    /// Whether the live question is the request's last message: a new user turn to capture
    /// (otherwise the request continues a tool round of an earlier question).
    pub fn question_is_new(&self) -> bool {
        let len = self.messages().map_or(0, Vec::len);
        self.question_at.is_some_and(|i| i + 1 == len)
    }

    fn messages(&self) -> Option<&Vec<Value>> {
        self.body.get("messages").and_then(Value::as_array)
    }
}

/// The text of a message's `content`: a string, or the text parts of an array joined by blank
/// lines. `None` when it holds no text (tool results, images only).
pub fn text_of(content: &Value) -> Option<String> {
    match content {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .filter(|t| !t.is_empty())
                .collect();
            (!texts.is_empty()).then(|| texts.join("\n\n"))
        }
        _ => None,
    }
}

/// Whether an OpenAI message is part of the system prompt (kept in front of the frame).
fn is_system(message: &Value) -> bool {
    matches!(
        message.get("role").and_then(Value::as_str),
        Some("system" | "developer")
    )
}

/// Parse a chat request body of `provider`; the message says what is wrong.
pub fn parse(provider: Provider, bytes: &[u8]) -> Result<Request, String> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let Value::Object(body) = value else {
        return Err("the body must be a JSON object".into());
    };
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or("`model` must be a non-empty string")?
        .to_owned();
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("`messages` must be an array")?;
    if provider == Provider::Anthropic && !body.get("max_tokens").is_some_and(Value::is_u64) {
        return Err("`max_tokens` must be a positive integer".into());
    }
    for (i, message) in messages.iter().enumerate() {
        if message.get("role").and_then(Value::as_str).is_none() {
            return Err(format!("messages[{i}] has no `role` string"));
        }
    }
    let role = |m: &Value| {
        m.get("role")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let question_at = messages
        .iter()
        .rposition(|m| role(m) == "user" && m.get("content").and_then(text_of).is_some());
    let question = question_at.and_then(|i| messages[i].get("content").and_then(text_of));
    let first = messages
        .iter()
        .find(|m| !is_system(m))
        .and_then(|m| m.get("content").and_then(text_of));
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    Ok(Request {
        body,
        model,
        stream,
        question_at,
        question,
        first,
    })
}

/// The request body with its messages replaced: OpenAI keeps its leading system and developer
/// messages, Anthropic its top-level `system`; then the frame (which ends with the live
/// question); then whatever followed the live question (an ongoing tool round), verbatim.
pub fn with_frame(provider: Provider, request: &Request, frame: &Frame) -> Vec<u8> {
    let messages = request.messages().cloned().unwrap_or_default();
    let mut out: Vec<Value> = Vec::new();
    if provider == Provider::OpenAi {
        out.extend(messages.iter().take_while(|m| is_system(m)).cloned());
    }
    out.extend(frame.messages.iter().map(|m| {
        json!({
            "role": match m.role {
                Side::User => "user",
                Side::Assistant => "assistant",
            },
            "content": m.content,
        })
    }));
    if let Some(at) = request.question_at {
        out.extend(messages.into_iter().skip(at + 1));
    }
    let mut body = request.body.clone();
    body.insert("messages".into(), Value::Array(out));
    serde_json::to_vec(&Value::Object(body)).expect("a JSON value serialises")
}

/// The assistant text of a non-streamed reply body.
pub fn reply_text(provider: Provider, body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    match provider {
        Provider::OpenAi => value["choices"][0]["message"]["content"]
            .as_str()
            .map(str::to_owned),
        Provider::Anthropic => text_of(&value["content"]),
        Provider::Gemini => None,
    }
    .filter(|t| !t.is_empty())
}

/// Reads the assistant text out of an SSE stream as its bytes pass by.
#[derive(Debug)]
pub struct StreamReader {
    provider: Provider,
    pending: Vec<u8>,
    text: String,
    complete: bool,
    /// Whether the bytes seen so far end on an event boundary (a blank line).
    terminated: bool,
}

impl StreamReader {
    pub fn new(provider: Provider) -> Self {
        Self {
            provider,
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
        if data.trim() == "[DONE]" {
            self.complete = true;
            return;
        }
        let Ok(value) = serde_json::from_str::<Value>(&data) else {
            return;
        };
        match self.provider {
            Provider::OpenAi => {
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
            Provider::Anthropic => match value["type"].as_str() {
                Some("content_block_delta") if value["delta"]["type"] == "text_delta" => {
                    if let Some(piece) = value["delta"]["text"].as_str() {
                        self.text.push_str(piece);
                    }
                }
                Some("message_stop") => self.complete = true,
                _ => {}
            },
            Provider::Gemini => {}
        }
    }
}

/// The end of the first complete event in `bytes` and the length of the blank line after it.
fn event_end(bytes: &[u8]) -> Option<(usize, usize)> {
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
        let request = parse(Provider::OpenAi, body.to_string().as_bytes()).unwrap();
        assert_eq!(request.question.as_deref(), Some("what is the weather?"));
        assert_eq!(request.first.as_deref(), Some("first question"));
        assert!(!request.question_is_new());
        assert!(request.stream);
        let out: Value = serde_json::from_slice(&with_frame(
            Provider::OpenAi,
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
        let request = parse(Provider::Anthropic, body.to_string().as_bytes()).unwrap();
        assert!(request.question_is_new());
        let out: Value = serde_json::from_slice(&with_frame(
            Provider::Anthropic,
            &request,
            &frame(&[(Side::User, "hello")]),
        ))
        .unwrap();
        assert_eq!(out["system"], body["system"]);
        assert_eq!(
            out["messages"],
            json!([{"role": "user", "content": "hello"}])
        );
        let missing = json!({"model": "claude-haiku-4-5", "messages": []});
        assert!(
            parse(Provider::Anthropic, missing.to_string().as_bytes())
                .unwrap_err()
                .contains("max_tokens")
        );
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
            let err = parse(Provider::OpenAi, body.as_bytes()).unwrap_err();
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
            let mut reader = StreamReader::new(Provider::OpenAi);
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
        let mut reader = StreamReader::new(Provider::Anthropic);
        reader.feed(stream.as_bytes());
        assert!(!reader.terminated());
        assert_eq!(reader.finish(), ("Hi".to_owned(), true));
    }
}
