//! The four chat wire formats the proxy forwards, from the upstream's side: which one a
//! request speaks, the texts of its messages, and a scripted reply in it (text or one tool
//! call, whole or streamed, as the provider sends it; a Gemini request in JSON mode answered
//! with an instance of its schema).

use serde_json::{Value, json};

use super::upstream::{Answer, Received};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Wire {
    Messages,
    Responses,
    Chat,
    /// Gemini `generateContent` and `streamGenerateContent` (`?alt=sse`).
    Gemini,
}

/// The wire format of a request to `path`; `None` for a path that is no chat request.
pub fn wire_of(path: &str) -> Option<Wire> {
    match path.split('?').next().unwrap_or_default() {
        "/v1/messages" => Some(Wire::Messages),
        "/v1/responses" => Some(Wire::Responses),
        "/v1/chat/completions" => Some(Wire::Chat),
        path if path.contains("/models/")
            && (path.ends_with(":generateContent") || path.ends_with(":streamGenerateContent")) =>
        {
            Some(Wire::Gemini)
        }
        _ => None,
    }
}

/// The texts of a Messages or Chat request's messages (a Gemini request's contents) in
/// order, each with its message's index: a content given as a string, and each text block
/// (part) of a content given as a list, one by one.
pub fn message_texts(body: &Value) -> Vec<(usize, &str)> {
    let mut texts = Vec::new();
    for (at, content) in body["contents"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        texts.extend(
            content["parts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["text"].as_str())
                .map(|text| (at, text)),
        );
    }
    for (at, message) in body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        match &message["content"] {
            Value::String(text) => texts.push((at, text.as_str())),
            Value::Array(blocks) => texts.extend(
                blocks
                    .iter()
                    .filter(|b| b["type"] == "text")
                    .filter_map(|b| b["text"].as_str())
                    .map(|text| (at, text)),
            ),
            _ => {}
        }
    }
    texts
}

/// What the upstream says in a reply.
pub enum Reply {
    Text(String),
    /// A call of the tool named first, its arguments (a JSON object's text) second.
    Call(String, String),
}

/// The upstream's answer to request `index`: what `reply` says to its body, in its wire
/// format, streamed when it asks for a stream (Gemini: `streamGenerateContent`); a Gemini
/// request in JSON mode (`responseMimeType` `application/json`) is answered with an instance
/// of its schema instead; `count_tokens` is answered with a count, any other path that is no
/// chat request with a 404.
pub fn answer(
    index: usize,
    request: &Received,
    reply: impl FnOnce(Wire, &Value) -> Reply,
) -> Answer {
    if request.path.starts_with("/v1/messages/count_tokens") {
        return Answer::Whole(200, "application/json", br#"{"input_tokens":42}"#.to_vec());
    }
    let Some(wire) = wire_of(&request.path) else {
        let error = json!({"error": {"type": "not_found_error", "message": "not scripted"}});
        return Answer::Whole(404, "application/json", error.to_string().into_bytes());
    };
    let body = request.json();
    let model = body["model"].as_str().unwrap_or("model").to_owned();
    let config = &body["generationConfig"];
    let reply = if wire == Wire::Gemini && config["responseMimeType"] == "application/json" {
        let schema = match &config["responseJsonSchema"] {
            Value::Null => &config["responseSchema"],
            schema => schema,
        };
        Reply::Text(instance(schema).to_string())
    } else {
        reply(wire, &body)
    };
    let (whole, events) = match wire {
        Wire::Messages => messages_answer(index, &model, &reply),
        Wire::Responses => responses_answer(index, &model, &reply),
        Wire::Chat => chat_answer(index, &model, &reply),
        Wire::Gemini => gemini_answer(index, &request.path, &reply),
    };
    let streamed = match wire {
        Wire::Gemini => request.path.contains(":streamGenerateContent"),
        _ => body["stream"] == true,
    };
    if streamed {
        Answer::Whole(200, "text/event-stream", events.into_bytes())
    } else {
        Answer::Whole(200, "application/json", whole.to_string().into_bytes())
    }
}

/// An event stream of `events`, each named by its `type` when `named` (Messages, Responses),
/// else a bare `data:` line (Chat).
fn sse(events: &[Value], named: bool) -> String {
    events
        .iter()
        .map(|data| match data["type"].as_str().filter(|_| named) {
            Some(name) => format!("event: {name}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        })
        .collect()
}

/// A Messages reply: the whole body and its stream.
fn messages_answer(index: usize, model: &str, reply: &Reply) -> (Value, String) {
    let usage = json!({"input_tokens": 10, "output_tokens": 5});
    let (block, empty, delta, stop) = match reply {
        Reply::Call(name, input) => {
            let id = format!("toolu_harness_{index}");
            (
                json!({"type": "tool_use", "id": id, "name": name, "input": serde_json::from_str::<Value>(input).unwrap()}),
                json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                json!({"type": "input_json_delta", "partial_json": input}),
                "tool_use",
            )
        }
        Reply::Text(text) => (
            json!({"type": "text", "text": text}),
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": text}),
            "end_turn",
        ),
    };
    let id = format!("msg_harness_{index}");
    let message = |content: Value, stop: Value| json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": content, "stop_reason": stop, "stop_sequence": null, "usage": usage});
    let whole = message(json!([block]), json!(stop));
    let events = [
        json!({"type": "message_start", "message": message(json!([]), Value::Null)}),
        json!({"type": "content_block_start", "index": 0, "content_block": empty}),
        json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 5}}),
        json!({"type": "message_stop"}),
    ];
    (whole, sse(&events, true))
}

/// A Responses reply: the whole body and its stream.
fn responses_answer(index: usize, model: &str, reply: &Reply) -> (Value, String) {
    let response = |status: &str, output: Value| json!({"id": format!("resp_harness_{index}"), "object": "response", "created_at": 1_800_000_000, "status": status, "model": model, "output": output, "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}});
    let mut events = vec![
        json!({"type": "response.created", "response": response("in_progress", json!([]))}),
        json!({"type": "response.in_progress", "response": response("in_progress", json!([]))}),
    ];
    let item = match reply {
        Reply::Call(name, arguments) => {
            let id = format!("fc_harness_{index}");
            let item = json!({"type": "function_call", "id": id, "call_id": format!("call_harness_{index}"), "name": name, "arguments": arguments, "status": "completed"});
            let mut added = item.clone();
            added["arguments"] = json!("");
            added["status"] = json!("in_progress");
            events.extend([
                json!({"type": "response.output_item.added", "output_index": 0, "item": added}),
                json!({"type": "response.function_call_arguments.delta", "item_id": id, "output_index": 0, "delta": arguments}),
                json!({"type": "response.function_call_arguments.done", "item_id": id, "output_index": 0, "arguments": arguments}),
            ]);
            item
        }
        Reply::Text(text) => {
            let id = format!("msg_harness_{index}");
            let part = json!({"type": "output_text", "text": text, "annotations": []});
            let item = json!({"type": "message", "id": id, "status": "completed", "role": "assistant", "content": [part]});
            let at = json!({"item_id": id, "output_index": 0, "content_index": 0});
            let with = |extra: Value| {
                let mut event = at.clone();
                event
                    .as_object_mut()
                    .unwrap()
                    .extend(extra.as_object().unwrap().clone());
                event
            };
            events.extend([
                json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}}),
                with(json!({"type": "response.content_part.added", "part": {"type": "output_text", "text": "", "annotations": []}})),
                with(json!({"type": "response.output_text.delta", "delta": text})),
                with(json!({"type": "response.output_text.done", "text": text})),
                with(json!({"type": "response.content_part.done", "part": part})),
            ]);
            item
        }
    };
    let whole = response("completed", json!([item]));
    events.push(json!({"type": "response.output_item.done", "output_index": 0, "item": item}));
    events.push(json!({"type": "response.completed", "response": whole}));
    for (n, event) in events.iter_mut().enumerate() {
        event["sequence_number"] = json!(n);
    }
    (whole, sse(&events, true))
}

/// A Chat Completions reply: the whole body and its stream.
fn chat_answer(index: usize, model: &str, reply: &Reply) -> (Value, String) {
    let id = format!("chatcmpl-harness-{index}");
    let chunk = |choices: Value| json!({"id": id, "object": "chat.completion.chunk", "created": 1, "model": model, "choices": choices});
    let usage = json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15});
    let (message, delta, finish) = match reply {
        Reply::Call(name, arguments) => {
            let call = json!({"id": format!("call_harness_{index}"), "type": "function", "function": {"name": name, "arguments": arguments}});
            let mut indexed = call.clone();
            indexed["index"] = json!(0);
            (
                json!({"role": "assistant", "content": null, "tool_calls": [call]}),
                json!({"role": "assistant", "content": null, "tool_calls": [indexed]}),
                "tool_calls",
            )
        }
        Reply::Text(text) => (
            json!({"role": "assistant", "content": text}),
            json!({"role": "assistant", "content": text}),
            "stop",
        ),
    };
    let whole = json!({"id": id, "object": "chat.completion", "created": 1, "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage});
    let mut last = chunk(json!([]));
    last["usage"] = usage;
    let mut events = sse(
        &[
            chunk(json!([{"index": 0, "delta": delta, "finish_reason": null}])),
            chunk(json!([{"index": 0, "delta": {}, "finish_reason": finish}])),
            last,
        ],
        false,
    );
    events.push_str("data: [DONE]\n\n");
    (whole, events)
}

/// An instance of the JSON schema `schema` (OpenAPI's upper-case type names too): an object's
/// every property, an enum's first value, a number's `minimum` (else 10), a string "simple".
fn instance(schema: &Value) -> Value {
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return first.clone();
    }
    let kind = schema["type"]
        .as_str()
        .unwrap_or("object")
        .to_ascii_lowercase();
    match kind.as_str() {
        "object" => Value::Object(
            schema["properties"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(name, property)| (name.clone(), instance(property)))
                .collect(),
        ),
        "array" => json!([]),
        "integer" | "number" => schema
            .get("minimum")
            .filter(|m| m.is_number())
            .cloned()
            .unwrap_or(json!(10)),
        "boolean" => json!(false),
        _ => json!("simple"),
    }
}

/// A Gemini reply to the request at `path`: the whole body and its stream (the text, or the
/// call as a `functionCall` part, in a first chunk, the finish reason and usage in a second,
/// CRLF-framed as Google sends them).
fn gemini_answer(index: usize, path: &str, reply: &Reply) -> (Value, String) {
    let model = path
        .split("/models/")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .unwrap_or("gemini");
    let part = match reply {
        Reply::Call(name, args) => {
            json!({"functionCall": {"name": name, "args": serde_json::from_str::<Value>(args).unwrap()}})
        }
        Reply::Text(text) => json!({"text": text}),
    };
    let usage = json!({"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15});
    let id = format!("gemini-harness-{index}");
    let chunk = |parts: Value, finish: Option<&str>| {
        let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        if let Some(finish) = finish {
            candidate["finishReason"] = json!(finish);
        }
        json!({"candidates": [candidate], "usageMetadata": usage, "modelVersion": model, "responseId": id})
    };
    let whole = chunk(json!([part]), Some("STOP"));
    let events = [
        chunk(json!([part]), None),
        chunk(json!([{"text": ""}]), Some("STOP")),
    ]
    .iter()
    .map(|data| format!("data: {data}\r\n\r\n"))
    .collect();
    (whole, events)
}
