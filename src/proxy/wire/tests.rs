use super::*;
use crate::frame::{Message, Omitted, Side};
use crate::proxy::sse::StreamReader;
use crate::types::RowId;

/// The body sent for `request` with `frame` in it.
fn with_frame(request: &Request, frame: &Frame) -> Vec<u8> {
    let framed = framed(request, &frame_items(request.format, frame), &[]);
    encode(
        request,
        &framed.body,
        Some(&framed.verbatim),
        &[request.format.list()],
    )
}

fn frame(messages: &[(Side, &str)]) -> Frame {
    Frame {
        messages: messages
            .iter()
            .map(|(role, content)| Message {
                role: *role,
                content: (*content).to_owned(),
                rows: vec![RowId(1)],
                partial: Vec::new(),
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
        json!([{"type": "text", "text": "[frame] what is the weather?"}]),
        "the live turn keeps its shape, the frame in its words' place"
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
        serde_json::from_slice(&with_frame(&request, &frame(&[(Side::User, "hello")]))).unwrap();
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

    let chained = json!({"model": "gpt-5", "input": "and then?", "previous_response_id": "resp_1"});
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
    let mut reader = StreamReader::new(Format::Responses, 1 << 20);
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
    let mut reader = StreamReader::new(Format::Gemini, 1 << 20);
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
