//! Requests shaped as harnesses we did not build the rules from send them (Aider, OpenCode,
//! Gemini CLI, mini-swe-agent), through the proxy over real HTTP on loopback in front of a
//! scripted upstream: what the memory never captured (example turns, files put in the chat, a
//! repository map) arrives where the harness put it on every request and is never stored; a
//! turn the memory holds is replaced by the frame; side calls (titles, a routing classifier,
//! structured output, a tool-less helper of a tool-using session) pass through untouched; a
//! template around the user's words is stored once; a harness's session header names the
//! conversation.

mod common;

use hyper::StatusCode;
use serde_json::{Value, json};

use common::upstream::{Answer, Harness, body_of, header};
use perpetuity::store::Row;
use perpetuity::types::Role;

const ANTHROPIC_KEY: &str = "sk-ant-aider";

fn whole(body: Value) -> Answer {
    Answer::Whole(200, "application/json", body.to_string().into_bytes())
}

fn messages_reply(text: &str) -> Answer {
    whole(
        json!({"id": "msg_1", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 5, "output_tokens": 2}}),
    )
}

fn chat_reply(text: &str) -> Answer {
    whole(
        json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
            "finish_reason": "stop"}]}),
    )
}

fn responses_reply(text: &str) -> Answer {
    whole(
        json!({"id": "resp_1", "object": "response", "status": "completed",
        "model": "gpt-5", "output": [{"type": "message", "id": "msg_1", "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}]}),
    )
}

fn gemini_reply(text: &str) -> Answer {
    whole(
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
        "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 2}}),
    )
}

async fn post(h: &Harness, path: &str, headers: &[(&str, &str)], body: &Value) -> String {
    let response = h
        .send("POST", path, headers, body.to_string().as_bytes())
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let memory = header(&response, "x-perpetuity-memory").to_owned();
    body_of(response).await;
    memory
}

/// A message of the memory: its chunks' rows joined.
struct Said {
    role: Role,
    text: String,
    conversation: String,
}

/// The messages of `credential`'s memory once `expected` are there, exactly that many.
fn said(h: &Harness, credential: &str, expected: usize) -> Vec<Said> {
    let started = std::time::Instant::now();
    loop {
        let rows: Vec<Row> = h.rows_of(credential, 0);
        let mut messages: Vec<Said> = Vec::new();
        for row in rows {
            if row.chunk == 0 {
                messages.push(Said {
                    role: row.role,
                    text: row.text,
                    conversation: row.conversation,
                });
            } else if let Some(last) = messages.last_mut() {
                last.text.push_str(&row.text);
            }
        }
        if messages.len() >= expected || started.elapsed() > std::time::Duration::from_secs(10) {
            let texts: Vec<&str> = messages.iter().map(|m| m.text.as_str()).collect();
            assert_eq!(messages.len(), expected, "{texts:#?}");
            return messages;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Aider's edit-format rules, appended to the live message after a blank line (3 KB).
fn aider_rules() -> String {
    format!(
        "# *SEARCH/REPLACE block* Rules:\n\n{}",
        "Every *SEARCH/REPLACE block* must use this format: the file path alone on a line, then the opening fence.\n"
            .repeat(30)
    )
}

/// Aider's context before the history (its example exchanges, the switch to this code base,
/// the repository map, each answered by the assistant), as its Anthropic requests carry it.
fn aider_preamble() -> Vec<Value> {
    let said = |role: &str, text: &str| json!({"role": role, "content": text});
    vec![
        said("user", "Change get_factorial() to use math.factorial"),
        said(
            "assistant",
            "To make this change we need to modify `mathweb/flask/app.py`: EXAMPLE-REPLY-ONE",
        ),
        said("user", "Refactor hello() into its own file."),
        said(
            "assistant",
            "To make this change we need to modify `main.py`: EXAMPLE-REPLY-TWO",
        ),
        said(
            "user",
            "I switched to a new code base. Please don't consider the above files or try to edit them any longer.",
        ),
        said("assistant", "Ok."),
        said(
            "user",
            "Here are summaries of some files present in my git repository.\nDo not propose changes to these files, treat them as *read-only*.\n\nmain.py:\n│class Greeter:\n│    def greet(self, name):\n",
        ),
        said(
            "assistant",
            "Ok, I won't try and edit those files without asking first.",
        ),
    ]
}

/// The files Aider put in the chat, and the assistant's acknowledgement.
fn aider_files() -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "I have *added these files to the chat* so you can go ahead and edit them.\n\ncalc.py\n```\ndef add(a, b):\n    return a + b  # FILE-BODY-7731\n```\n"}),
        json!({"role": "assistant", "content": "Ok, any changes I propose will be to those files."}),
    ]
}

/// Aider's request: its preamble, the `history` of this chat, the files, then the words with
/// the rules appended.
fn aider(history: &[Value], words: &str) -> Value {
    let mut messages = aider_preamble();
    messages.extend(history.iter().cloned());
    messages.extend(aider_files());
    messages.push(json!({"role": "user", "content": format!("{words}\n\n{}", aider_rules())}));
    json!({"model": "claude-sonnet-4-5", "system": "Act as an expert software developer.",
        "messages": messages, "temperature": 0, "max_tokens": 64000})
}

const AIDER_HEADERS: [(&str, &str); 3] = [
    ("x-api-key", ANTHROPIC_KEY),
    ("anthropic-version", "2023-06-01"),
    ("content-type", "application/json"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiders_files_and_examples_reach_the_model_every_turn_and_only_its_words_are_stored() {
    let h = Harness::start(|_| {}).await;
    h.answer(messages_reply("Added the docstring to add."));
    let first = aider(&[], "Add a docstring to add.");
    assert_eq!(post(&h, "/v1/messages", &AIDER_HEADERS, &first).await, "ok");
    h.answer(messages_reply("Renamed it to plus."));
    let history = [
        json!({"role": "user", "content": "Add a docstring to add."}),
        json!({"role": "assistant", "content": "Added the docstring to add."}),
    ];
    let second = aider(&history, "Now rename add to plus.");
    assert_eq!(
        post(&h, "/v1/messages", &AIDER_HEADERS, &second).await,
        "ok"
    );

    let received = h.received();
    for (sent, asked) in received.iter().zip([&first, &second]) {
        let messages = sent.json()["messages"].as_array().unwrap().clone();
        assert_eq!(
            messages[..8],
            aider_preamble()[..],
            "the examples and the repository map arrive as sent, first"
        );
        let files = messages
            .iter()
            .position(|m| m == &aider_files()[0])
            .expect("the files put in the chat reach the model on every request");
        assert_eq!(messages[files + 1], aider_files()[1]);
        assert_eq!(sent.text().matches("FILE-BODY-7731").count(), 1);
        assert_eq!(sent.text().matches("EXAMPLE-REPLY-ONE").count(), 1);
        assert_eq!(
            sent.json()["system"],
            asked["system"],
            "the instructions arrive as sent"
        );
    }
    let second_sent = received[1].text();
    assert_eq!(
        second_sent.matches("Add a docstring to add.").count(),
        1,
        "the turn the memory holds is replaced by the frame, not sent twice: {second_sent}"
    );
    assert_eq!(
        second_sent.matches("Now rename add to plus.").count(),
        1,
        "the live question appears once"
    );

    let stored = said(&h, ANTHROPIC_KEY, 4);
    let words: Vec<(Role, &str)> = stored.iter().map(|r| (r.role, r.text.as_str())).collect();
    assert_eq!(words[0].0, Role::User);
    assert!(
        words[0]
            .1
            .starts_with("Add a docstring to add.\n\n# *SEARCH/REPLACE block* Rules:"),
        "the first question brings the template, stored once"
    );
    assert_eq!(
        words[2],
        (Role::User, "Now rename add to plus."),
        "the template is not stored again"
    );
    assert_eq!(words[3], (Role::Assistant, "Renamed it to plus."));
    assert!(
        stored
            .iter()
            .all(|r| !r.text.contains("FILE-BODY-7731") && !r.text.contains("EXAMPLE-REPLY")),
        "what the harness composed is never stored"
    );
    assert!(
        stored
            .iter()
            .all(|r| r.conversation == stored[0].conversation),
        "both turns are one conversation"
    );

    // Another Aider chat opens with the same examples: a conversation of its own.
    h.answer(messages_reply("Done."));
    let other = aider(&[], "Write a test for main.");
    post(&h, "/v1/messages", &AIDER_HEADERS, &other).await;
    let stored = said(&h, ANTHROPIC_KEY, 6);
    assert_eq!(stored[4].text, "Write a test for main.");
    assert_ne!(stored[4].conversation, stored[0].conversation);
}

const OPENCODE_TITLE: &str = "You are a title generator. You output ONLY a thread title. Nothing else.\n\n<task>\nGenerate a brief title that would help the user find this conversation later.\n</task>";

fn opencode_tools_chat() -> Value {
    json!([{"type": "function", "function": {"name": "bash", "description": "Runs a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencodes_title_request_passes_through_in_every_format_and_its_session_names_the_conversation()
 {
    let h = Harness::start(|_| {}).await;
    let prompt = "\"Where is the retry budget set?\"";
    let session = ("x-session-id", "ses_4f1a");
    // Chat Completions: the title request, then the turn.
    let chat_headers = [
        ("authorization", "Bearer sk-opencode"),
        ("content-type", "application/json"),
        session,
    ];
    let title = json!({"model": "fake-model", "stream": false, "max_tokens": 32000,
        "messages": [{"role": "system", "content": OPENCODE_TITLE},
            {"role": "user", "content": "Generate a title for this conversation:\n"},
            {"role": "user", "content": prompt}]});
    h.answer(chat_reply("Retry budget"));
    assert_eq!(
        post(&h, "/v1/chat/completions", &chat_headers, &title).await,
        "off"
    );
    let turn = json!({"model": "fake-model", "stream": false, "tool_choice": "auto",
        "messages": [{"role": "system", "content": "You are opencode, an interactive CLI tool."},
            {"role": "user", "content": prompt}],
        "tools": opencode_tools_chat()});
    h.answer(chat_reply("In config/retry.toml."));
    assert_eq!(
        post(&h, "/v1/chat/completions", &chat_headers, &turn).await,
        "ok"
    );
    let received = h.received();
    assert_eq!(
        received[0].json(),
        title,
        "the title request reaches the upstream untouched"
    );
    assert_eq!(received[1].text().matches("retry budget").count(), 1);
    let stored = said(&h, "sk-opencode", 2);
    assert_eq!(
        (stored[0].role, stored[0].text.as_str()),
        (Role::User, prompt)
    );
    assert_eq!(stored[1].text, "In config/retry.toml.");
    assert_eq!(stored[0].conversation, "session:ses_4f1a");

    // Responses and Messages: the title request is passed through and nothing is stored.
    let responses_title = json!({"model": "gpt-5.4-nano", "stream": false, "store": false,
        "input": [{"role": "developer", "content": OPENCODE_TITLE},
            {"role": "user", "content": "Generate a title for this conversation:\n"},
            {"role": "user", "content": prompt}]});
    h.answer(responses_reply("Retry budget"));
    assert_eq!(
        post(&h, "/v1/responses", &chat_headers, &responses_title).await,
        "off"
    );
    let messages_title = json!({"model": "claude-haiku-4-5-20251001", "max_tokens": 48000,
        "system": [{"type": "text", "text": OPENCODE_TITLE, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Generate a title for this conversation:\n"},
            {"type": "text", "text": prompt}]}]});
    h.answer(messages_reply("Retry budget"));
    let anthropic = [
        ("x-api-key", "sk-opencode"),
        ("anthropic-version", "2023-06-01"),
        ("content-type", "application/json"),
        session,
    ];
    assert_eq!(
        post(&h, "/v1/messages", &anthropic, &messages_title).await,
        "off"
    );
    let received = h.received();
    assert_eq!(received[2].json(), responses_title);
    assert_eq!(received[3].json(), messages_title);
    said(&h, "sk-opencode", 2);
}

/// Gemini CLI's first user content: its session context as one part, then the words.
fn gemini_cli_turn(words: &str) -> Value {
    json!({"role": "user", "parts": [
        {"text": "<session_context>\nThis is the Gemini CLI. We are setting up the context for our chat.\nMy operating system is: linux\n</session_context>"},
        {"text": words}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_clis_routing_classifier_passes_through_and_the_question_is_sent_once() {
    let h = Harness::start(|_| {}).await;
    let key = [
        ("x-goog-api-key", "g-gemini-cli"),
        ("content-type", "application/json"),
    ];
    let words = "Which file holds the retry budget?";
    let classifier = json!({
        "contents": [gemini_cli_turn(words)],
        "systemInstruction": {"role": "user", "parts": [{"text": "You are a specialized Task Routing AI. Assign a Complexity Score from 1 to 100."}]},
        "generationConfig": {"temperature": 1, "responseMimeType": "application/json",
            "responseJsonSchema": {"type": "OBJECT", "properties": {
                "complexity_reasoning": {"type": "STRING"},
                "complexity_score": {"type": "INTEGER"}},
                "required": ["complexity_reasoning", "complexity_score"]}}});
    h.answer(gemini_reply(
        r#"{"complexity_reasoning":"a lookup","complexity_score":12}"#,
    ));
    let path = "/v1beta/models/gemini-3.5-flash-lite:generateContent";
    assert_eq!(post(&h, path, &key, &classifier).await, "off");
    let turn = json!({
        "contents": [gemini_cli_turn(words)],
        "systemInstruction": {"role": "user", "parts": [{"text": "You are Gemini CLI, an autonomous CLI agent."}]},
        "tools": [{"functionDeclarations": [{"name": "read_file", "description": "Reads a file.",
            "parameters": {"type": "OBJECT", "properties": {"path": {"type": "STRING"}}}}]}],
        "generationConfig": {"temperature": 1}});
    h.answer(gemini_reply("config/retry.toml holds it."));
    let main = "/v1beta/models/gemini-3.8-flash:generateContent";
    assert_eq!(post(&h, main, &key, &turn).await, "ok");
    let received = h.received();
    assert_eq!(
        received[0].json(),
        classifier,
        "the classifier reaches the upstream untouched, without the memory tools"
    );
    assert_eq!(received[1].text().matches(words).count(), 1);
    assert_ne!(
        received[1].json()["tools"],
        turn["tools"],
        "a turn carries the memory tools beside the harness's"
    );
    assert!(
        received[1].text().contains("<session_context>"),
        "the harness's context stays in place"
    );
    let stored = said(&h, "g-gemini-cli", 2);
    assert_eq!(
        (stored[0].role, stored[0].text.as_str()),
        (Role::User, words)
    );
    assert_eq!(stored[1].text, "config/retry.toml holds it.");

    // A turn that offers tools and asks for JSON is a turn, but Gemini does not call
    // functions in JSON mode: the memory tools stay out of it.
    let mut json_turn = turn.clone();
    json_turn["contents"] = json!([gemini_cli_turn("List the config files as JSON.")]);
    json_turn["generationConfig"]["responseMimeType"] = json!("application/json");
    h.answer(gemini_reply("[]"));
    assert_eq!(post(&h, main, &key, &json_turn).await, "ok");
    let sent = h.received().pop().unwrap().json();
    assert_eq!(sent["tools"], json_turn["tools"], "no memory tools added");
    said(&h, "g-gemini-cli", 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_output_and_a_tool_less_helper_of_a_tool_using_session_are_side_calls() {
    let h = Harness::start(|_| {}).await;
    let headers = [
        ("authorization", "Bearer sk-helper"),
        ("content-type", "application/json"),
        ("x-session-id", "ses_9"),
    ];
    let extract = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "Extract the city from: I live in Oslo."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "city",
            "schema": {"type": "object", "properties": {"city": {"type": "string"}}}}}});
    h.answer(chat_reply(r#"{"city":"Oslo"}"#));
    assert_eq!(
        post(&h, "/v1/chat/completions", &headers, &extract).await,
        "off"
    );
    let turn = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "List the files."}], "tools": opencode_tools_chat()});
    h.answer(chat_reply("There are two."));
    assert_eq!(
        post(&h, "/v1/chat/completions", &headers, &turn).await,
        "ok"
    );
    let helper = json!({"model": "gpt-4o-mini", "messages": [
        {"role": "user", "content": "Summarise in five words: List the files."}]});
    h.answer(chat_reply("Listing the project files."));
    assert_eq!(
        post(&h, "/v1/chat/completions", &headers, &helper).await,
        "off"
    );
    let received = h.received();
    assert_eq!(received[0].json(), extract);
    assert_eq!(received[2].json(), helper);
    let stored = said(&h, "sk-helper", 2);
    assert_eq!(stored[0].text, "List the files.");
    assert_eq!(stored[1].text, "There are two.");
}

/// mini-swe-agent's task template around the task (3 KB, the same for every task).
fn mini_swe_agent(task: &str) -> Value {
    let rules = "## Command Execution Rules\nYou are operating in an environment where each command runs in a new subshell.\n".repeat(25);
    json!({"model": "gpt-4o-mini", "messages": [
        {"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
        {"role": "user", "content": format!("Please solve this issue: {task}\n\nYou can execute bash commands and edit files to implement the necessary changes.\n\n{rules}")}],
        "tools": [{"type": "function", "function": {"name": "bash", "description": "Execute a bash command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_template_repeated_around_every_task_is_stored_once() {
    let h = Harness::start(|_| {}).await;
    let headers = [
        ("authorization", "Bearer sk-mini"),
        ("content-type", "application/json"),
    ];
    for (task, answer) in [
        ("Add a docstring to add in calc.py.", "Done one."),
        ("Fix the off-by-one in pager.py.", "Done two."),
    ] {
        h.answer(chat_reply(answer));
        let body = mini_swe_agent(task);
        assert_eq!(
            post(&h, "/v1/chat/completions", &headers, &body).await,
            "ok"
        );
        let sent = h.received().pop().unwrap();
        assert!(
            sent.text()
                .contains("Command Execution Rules\\nYou are operating"),
            "the live turn is forwarded whole"
        );
    }
    let stored = said(&h, "sk-mini", 4);
    assert!(stored[0].text.contains("## Command Execution Rules"));
    assert_eq!(
        stored[2].text, "Fix the off-by-one in pager.py.",
        "the template is stored once, with the first task"
    );
}
