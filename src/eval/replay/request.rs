//! A recorded model call as its harness sent it and as its provider answered: the request body
//! and headers (Claude Code's Messages request, Codex's Responses request, each carrying the
//! session id where its harness puts it), and the recorded answer as the provider's event
//! stream.

use serde_json::{Map, Value, json};

use super::transcript::{Call, Harness, Session};
use crate::proxy::sse;

/// The system prompt every replayed Claude Code request carries: the recorded sessions do not
/// hold Claude Code's own, and only its place in the request matters here.
const CLAUDE_CODE_SYSTEM: &str = "You are Claude Code, an agent for software engineering tasks. Use the tools to read and change files.";

/// Instructions of a replayed Codex request whose rollout recorded none.
const CODEX_INSTRUCTIONS: &str =
    "You are Codex, a coding agent. Use the tools to inspect and change the workspace.";

/// Claude Code's `max_tokens` on a main request.
const CLAUDE_CODE_MAX_TOKENS: u64 = 32_000;

/// The path, the headers (credential aside) and the body of `call`'s request.
pub fn direct(
    session: &Session,
    call: &Call,
) -> (&'static str, Vec<(&'static str, String)>, Value) {
    let history = Value::Array(session.items[call.from..call.at].to_vec());
    match session.harness {
        Harness::ClaudeCode => {
            let tools: Vec<Value> = session
                .tools
                .iter()
                .map(|name| {
                    json!({"name": name, "description": format!("The {name} tool."),
                    "input_schema": {"type": "object"}})
                })
                .collect();
            let user_id = json!({"device_id": "replay", "account_uuid": "",
                "session_id": call.session_id})
            .to_string();
            let body = json!({
                "model": call.model,
                "messages": history,
                "system": [{"type": "text", "text": CLAUDE_CODE_SYSTEM}],
                "tools": tools,
                "metadata": {"user_id": user_id},
                "max_tokens": CLAUDE_CODE_MAX_TOKENS,
                "stream": true
            });
            (
                "/v1/messages?beta=true",
                vec![("anthropic-version", "2023-06-01".to_owned())],
                body,
            )
        }
        Harness::Codex => {
            let tools: Vec<Value> = session
                .tools
                .iter()
                .map(|name| {
                    json!({"type": "function", "name": name,
                    "description": format!("The {name} tool."), "strict": false,
                    "parameters": {"type": "object"}})
                })
                .collect();
            let body = json!({
                "model": call.model,
                "instructions": session.instructions.as_deref().unwrap_or(CODEX_INSTRUCTIONS),
                "input": history,
                "tools": tools,
                "tool_choice": "auto",
                "parallel_tool_calls": false,
                "store": false,
                "stream": true,
                "include": [],
                "prompt_cache_key": call.session_id
            });
            let turn = json!({"request_kind": "turn"}).to_string();
            (
                "/v1/responses",
                vec![
                    ("session-id", call.session_id.clone()),
                    ("x-codex-turn-metadata", turn),
                ],
                body,
            )
        }
    }
}

/// `event` (a JSON object) as one event of `harness`'s stream.
fn event(harness: Harness, event: &Value, out: &mut Vec<u8>) {
    let empty = Map::new();
    out.extend(sse::encode_event(
        harness.format(),
        event.as_object().unwrap_or(&empty),
    ));
}

/// `call`'s recorded answer (`items[at..end]`) as `harness`'s provider streams it, the call
/// numbered `n` in its ids.
pub fn answer_stream(session: &Session, call: &Call, n: usize) -> Vec<u8> {
    let answer = &session.items[call.at..call.end];
    match session.harness {
        Harness::ClaudeCode => messages_stream(answer, &call.model, n),
        Harness::Codex => responses_stream(answer, &call.model, n),
    }
}

/// An Anthropic Messages stream: `message_start`, each text or `tool_use` block as
/// `content_block_start`, one delta (`text_delta`, `input_json_delta`) and
/// `content_block_stop`, then `message_delta` with the stop reason and `message_stop`.
fn messages_stream(answer: &[Value], model: &str, n: usize) -> Vec<u8> {
    let h = Harness::ClaudeCode;
    let mut out = Vec::new();
    event(
        h,
        &json!({"type": "message_start", "message": {"id": format!("msg_replay_{n}"),
            "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0}}}),
        &mut out,
    );
    let blocks = answer
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten();
    let (mut index, mut called) = (0, false);
    for block in blocks {
        let (start, delta) = match block["type"].as_str() {
            Some("text") => (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": block["text"]}),
            ),
            Some("tool_use") => {
                called = true;
                (
                    json!({"type": "tool_use", "id": block["id"], "name": block["name"],
                        "input": {}}),
                    json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
                )
            }
            _ => continue,
        };
        event(
            h,
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
            &mut out,
        );
        event(
            h,
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            &mut out,
        );
        event(
            h,
            &json!({"type": "content_block_stop", "index": index}),
            &mut out,
        );
        index += 1;
    }
    let stop = if called { "tool_use" } else { "end_turn" };
    event(
        h,
        &json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": 0}}),
        &mut out,
    );
    event(h, &json!({"type": "message_stop"}), &mut out);
    out
}

/// A Responses stream: `response.created`; each output item as `response.output_item.added`,
/// its text parts (`content_part.added`, one `output_text.delta`, `output_text.done`,
/// `content_part.done`) or a function call's `arguments` (one delta, done), and
/// `response.output_item.done`; then `response.completed` listing every item. Events are
/// numbered in order.
fn responses_stream(answer: &[Value], model: &str, n: usize) -> Vec<u8> {
    let h = Harness::Codex;
    let id = format!("resp_replay_{n}");
    let mut out = Vec::new();
    let mut sequence = 0u64;
    let mut emit = |mut data: Value, out: &mut Vec<u8>| {
        data["sequence_number"] = json!(sequence);
        sequence += 1;
        event(h, &data, out);
    };
    emit(
        json!({"type": "response.created", "response": {"id": id, "object": "response",
            "status": "in_progress", "model": model, "output": []}}),
        &mut out,
    );
    let mut done = Vec::with_capacity(answer.len());
    for (index, item) in answer.iter().enumerate() {
        let item_id = format!("item_{n}_{index}");
        let mut whole = item.clone();
        whole["id"] = json!(item_id);
        let mut added = whole.clone();
        match item["type"].as_str() {
            Some("message") | None => added["content"] = json!([]),
            Some("function_call") => added["arguments"] = json!(""),
            _ => {}
        }
        emit(
            json!({"type": "response.output_item.added", "output_index": index,
                "item": added}),
            &mut out,
        );
        let parts = item["content"].as_array().into_iter().flatten();
        for (part, content) in parts.enumerate() {
            let text = content["text"].as_str().unwrap_or("");
            let whole_part = json!({"type": "output_text", "text": text, "annotations": []});
            for (kind, field, value) in [
                (
                    "response.content_part.added",
                    "part",
                    json!({"type": "output_text", "text": "", "annotations": []}),
                ),
                ("response.output_text.delta", "delta", json!(text)),
                ("response.output_text.done", "text", json!(text)),
                ("response.content_part.done", "part", whole_part),
            ] {
                emit(
                    json!({"type": kind, "item_id": item_id, "output_index": index,
                        "content_index": part, field: value}),
                    &mut out,
                );
            }
        }
        if let Some(arguments) = item["arguments"].as_str() {
            for (kind, field) in [
                ("response.function_call_arguments.delta", "delta"),
                ("response.function_call_arguments.done", "arguments"),
            ] {
                emit(
                    json!({"type": kind, "item_id": item_id, "output_index": index,
                        field: arguments}),
                    &mut out,
                );
            }
        }
        emit(
            json!({"type": "response.output_item.done", "output_index": index, "item": whole}),
            &mut out,
        );
        done.push(whole);
    }
    emit(
        json!({"type": "response.completed", "response": {"id": id, "object": "response",
            "status": "completed", "model": model, "output": done,
            "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}}}),
        &mut out,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::sse::StreamReader;
    use crate::proxy::wire;

    fn session(harness: Harness, items: Vec<Value>) -> Session {
        Session {
            harness,
            path: "s.jsonl".into(),
            started_ms: None,
            items,
            calls: Vec::new(),
            tools: vec!["Read".into()],
            instructions: None,
        }
    }

    fn call(at: usize, end: usize) -> Call {
        Call {
            from: 0,
            at,
            end,
            session_id: "sess-1".into(),
            model: "m".into(),
        }
    }

    /// The reply text the proxy reads out of a whole stream, and whether the stream said the
    /// reply is complete.
    fn read(harness: Harness, stream: &[u8]) -> (String, bool) {
        let mut reader = StreamReader::new(harness.format(), 1 << 20);
        reader.feed(stream);
        assert!(reader.terminated());
        reader.finish()
    }

    #[test]
    fn claude_code_requests_carry_the_session_and_answers_stream_as_recorded() {
        let s = session(
            Harness::ClaudeCode,
            vec![
                json!({"role": "user", "content": "Read a.rs"}),
                json!({"role": "assistant", "content": [{"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "tu1", "name": "Read", "input": {"file_path": "a.rs"}}]}),
            ],
        );
        let (path, headers, body) = direct(&s, &call(1, 2));
        assert_eq!(path, "/v1/messages?beta=true");
        assert_eq!(headers[0].0, "anthropic-version");
        let request =
            wire::parse(wire::Format::Messages, body.to_string().as_bytes(), None).unwrap();
        assert_eq!(request.messages.len(), 1);
        assert_eq!(request.question.as_deref(), Some("Read a.rs"));
        assert!(
            body["metadata"]["user_id"]
                .as_str()
                .unwrap()
                .contains("\"session_id\":\"sess-1\"")
        );
        let stream = answer_stream(&s, &call(1, 2), 7);
        let text = String::from_utf8(stream.clone()).unwrap();
        assert!(text.contains("\"partial_json\":\"{\\\"file_path\\\":\\\"a.rs\\\"}\""));
        assert!(text.contains("\"stop_reason\":\"tool_use\""));
        assert_eq!(
            read(Harness::ClaudeCode, &stream),
            ("Reading.".to_owned(), true)
        );
    }

    #[test]
    fn codex_requests_carry_the_session_header_and_answers_stream_as_recorded() {
        let s = session(
            Harness::Codex,
            vec![
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]}),
                json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listing."}]}),
                json!({"type": "function_call", "name": "shell", "arguments": "{\"command\":[\"ls\"]}", "call_id": "c1"}),
            ],
        );
        let (path, headers, body) = direct(&s, &call(1, 3));
        assert_eq!(path, "/v1/responses");
        assert_eq!(headers[0], ("session-id", "sess-1".to_owned()));
        assert_eq!(body["input"].as_array().unwrap().len(), 1);
        let stream = answer_stream(&s, &call(1, 3), 2);
        let text = String::from_utf8(stream.clone()).unwrap();
        assert!(text.contains("event: response.function_call_arguments.delta\n"));
        assert!(text.contains("\"sequence_number\":10"));
        assert_eq!(read(Harness::Codex, &stream), ("Listing.".to_owned(), true));
    }
}
