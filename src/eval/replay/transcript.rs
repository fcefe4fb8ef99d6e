//! Recorded sessions as their harness wrote them, read into the requests it sent: Claude Code's
//! transcripts (`~/.claude/projects/<folder>/<session id>.jsonl`) and Codex's rollouts
//! (`~/.codex/sessions/YYYY/MM/DD/rollout-….jsonl`). A session becomes its conversation's items
//! in the provider's request form (Messages `messages`, Responses `input` items), the recorded
//! answers among them, and its model calls, each naming the items its request held and the
//! items it answered with. Lines that are not JSON are skipped and counted.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};

use super::ReplayError;
use crate::proxy::wire::Format;

/// The agent harness that wrote a transcript.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Harness {
    ClaudeCode,
    Codex,
}

impl Harness {
    /// Every harness, in the order the command line and the report list them.
    pub const ALL: [Self; 2] = [Self::ClaudeCode, Self::Codex];

    /// The name `--format` takes and the report uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::ClaudeCode => "claude-code",
            Self::Codex => "codex",
        }
    }

    /// The harness named `name` (what [`Harness::name`] gives).
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.name() == name)
    }

    /// The wire format its requests are in.
    pub fn format(self) -> Format {
        match self {
            Self::ClaudeCode => Format::Messages,
            Self::Codex => Format::Responses,
        }
    }
}

/// One model call of a session: its request held `items[from..at]`, its recorded answer is
/// `items[at..end]` (empty when the answer held nothing the request form keeps, such as
/// thinking alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Where the history the harness sent begins: 0, or the summary a compaction left.
    pub from: usize,
    pub at: usize,
    pub end: usize,
    /// The session id the harness sent with the request.
    pub session_id: String,
    /// The model the call was made to.
    pub model: String,
}

/// One recorded session.
#[derive(Debug, Clone)]
pub struct Session {
    pub harness: Harness,
    pub path: PathBuf,
    /// Its first record's time in Unix milliseconds, when the file says: sessions are replayed
    /// in this order.
    pub started_ms: Option<i64>,
    /// The conversation's items in the request form, answers included, in order.
    pub items: Vec<Value>,
    pub calls: Vec<Call>,
    /// The tools its calls name, in order of first use: every request of the session offers
    /// them all, as a harness offers its whole tool list each time.
    pub tools: Vec<String>,
    /// The instructions its harness recorded (Codex's `session_meta`), if any.
    pub instructions: Option<String>,
}

/// What reading the paths met, beside the sessions.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReadCounts {
    /// Transcript files read.
    pub files: usize,
    /// Their lines, blank ones aside.
    pub lines: usize,
    /// Lines that are not JSON (skipped).
    pub not_json: usize,
    /// Claude Code records of a sub-agent's side chain (`isSidechain`; every record of an
    /// `agent-*.jsonl` file): its own conversation, not this session's requests.
    pub sidechain: usize,
    /// Claude Code records written again (a resumed session copies its history; the same
    /// time and content): read once.
    pub repeated: usize,
    /// Claude Code's own messages that no model wrote (`isApiErrorMessage`, model
    /// `<synthetic>`): never sent, never an answer.
    pub synthetic: usize,
    /// Files that held no model call (a side chain's, a summary's).
    pub without_calls: usize,
}

/// The `.jsonl` files of `paths`: a file as it is, a folder's files at any depth, in name order.
fn files_of(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ReplayError> {
    let mut files = Vec::new();
    for path in paths {
        let mut folders = vec![path.clone()];
        if path.is_file() {
            files.push(path.clone());
            continue;
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ReplayError::Io { path, source }
        };
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).map_err(io(&folder))? {
                let entry = entry.map_err(io(&folder))?.path();
                if entry.is_dir() {
                    folders.push(entry);
                } else if entry.extension().is_some_and(|e| e == "jsonl") {
                    files.push(entry);
                }
            }
        }
    }
    files.sort();
    files.dedup();
    Ok(files)
}

/// Read every transcript under `paths` as `harness` wrote it; the sessions holding model
/// calls, in time order (first record's time; files without one last, by name).
pub fn read(
    harness: Harness,
    paths: &[PathBuf],
) -> Result<(Vec<Session>, ReadCounts), ReplayError> {
    let mut counts = ReadCounts::default();
    let mut sessions = Vec::new();
    for path in files_of(paths)? {
        let bytes = std::fs::read(&path).map_err(|source| ReplayError::Io {
            path: path.clone(),
            source,
        })?;
        counts.files += 1;
        let mut records = Vec::new();
        for line in bytes.split(|&b| b == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            counts.lines += 1;
            match serde_json::from_slice::<Value>(line) {
                Ok(record) => records.push(record),
                Err(_) => counts.not_json += 1,
            }
        }
        let session = match harness {
            Harness::ClaudeCode => claude_code(&records, &mut counts),
            Harness::Codex => codex(&records),
        };
        let session = Session {
            harness,
            path,
            ..session
        };
        if session.calls.is_empty() {
            counts.without_calls += 1;
        } else {
            sessions.push(session);
        }
    }
    sessions.sort_by(|a, b| {
        (a.started_ms.is_none(), a.started_ms, &a.path).cmp(&(
            b.started_ms.is_none(),
            b.started_ms,
            &b.path,
        ))
    });
    Ok((sessions, counts))
}

/// A record's `timestamp` in Unix milliseconds.
fn time_ms(record: &Value) -> Option<i64> {
    let text = record.get("timestamp")?.as_str()?;
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// An empty session of `harness`, filled by a reader.
fn empty(harness: Harness) -> Session {
    Session {
        harness,
        path: PathBuf::new(),
        started_ms: None,
        items: Vec::new(),
        calls: Vec::new(),
        tools: Vec::new(),
        instructions: None,
    }
}

/// Note a tool's name among the session's tools.
fn offer(tools: &mut Vec<String>, name: Option<&str>) {
    if let Some(name) = name.filter(|n| !n.is_empty())
        && !tools.iter().any(|t| t == name)
    {
        tools.push(name.to_owned());
    }
}

/// A message's content as a list of blocks (a string becomes one text block).
fn blocks_of(content: &Value) -> Vec<Value> {
    match content {
        Value::Array(blocks) => blocks.clone(),
        Value::String(text) => vec![json!({"type": "text", "text": text})],
        _ => Vec::new(),
    }
}

/// A Claude Code transcript: `user` and `assistant` records in file order. An assistant API
/// message is written one content block a line, the lines sharing `message.id`: merged, it is
/// one model call's answer, and the request of that call is every message before it. Thinking
/// blocks are dropped (they are sent back only with their signatures, which a replay cannot
/// reproduce). A user message following another with no call between (a prompt typed after a
/// tool's result) is merged into it, as Claude Code sends them. A `compact_boundary` record
/// starts the history again at the summary after it. Side-chain, repeated and synthetic records
/// are skipped and counted.
fn claude_code(records: &[Value], counts: &mut ReadCounts) -> Session {
    let mut session = empty(Harness::ClaudeCode);
    let mut seen: HashSet<(String, String)> = HashSet::new();
    let (mut from, mut compacted) = (0, false);
    // The message id of the call being read, while its lines follow one another.
    let mut answering: Option<String> = None;
    // Whether the last item is a user message no call has been made after.
    let mut mergeable = false;
    for record in records {
        let kind = record.get("type").and_then(Value::as_str).unwrap_or("");
        if kind == "system"
            && record.get("subtype").and_then(Value::as_str) == Some("compact_boundary")
        {
            compacted = true;
            continue;
        }
        if kind != "user" && kind != "assistant" {
            continue;
        }
        if record.get("isSidechain").and_then(Value::as_bool) == Some(true) {
            counts.sidechain += 1;
            continue;
        }
        let message = &record["message"];
        let key = (
            record
                .get("timestamp")
                .map(Value::to_string)
                .unwrap_or_default(),
            message
                .get("content")
                .map(Value::to_string)
                .unwrap_or_default(),
        );
        if !seen.insert(key) {
            counts.repeated += 1;
            continue;
        }
        let model = message.get("model").and_then(Value::as_str).unwrap_or("");
        if record.get("isApiErrorMessage").and_then(Value::as_bool) == Some(true)
            || model == "<synthetic>"
        {
            counts.synthetic += 1;
            continue;
        }
        session.started_ms = session.started_ms.or_else(|| time_ms(record));
        let content = message.get("content").unwrap_or(&Value::Null);
        if kind == "assistant" {
            let blocks: Vec<Value> = blocks_of(content)
                .into_iter()
                .filter(|b| {
                    !matches!(
                        b.get("type").and_then(Value::as_str),
                        Some("thinking" | "redacted_thinking")
                    )
                })
                .collect();
            for block in &blocks {
                if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                    offer(
                        &mut session.tools,
                        block.get("name").and_then(Value::as_str),
                    );
                }
            }
            let id = message.get("id").and_then(Value::as_str).map(str::to_owned);
            let continues = id.is_some() && answering == id;
            if !continues {
                let at = session.items.len();
                session.calls.push(Call {
                    from,
                    at,
                    end: at,
                    session_id: record
                        .get("sessionId")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                    model: model.to_owned(),
                });
                answering = id;
                mergeable = false;
            }
            let call = session.calls.last_mut().expect("a call was opened");
            if blocks.is_empty() {
                continue;
            }
            if call.end > call.at {
                let answer = &mut session.items[call.at]["content"];
                if let Value::Array(kept) = answer {
                    kept.extend(blocks);
                }
            } else {
                session
                    .items
                    .push(json!({"role": "assistant", "content": blocks}));
                call.end = session.items.len();
            }
            continue;
        }
        answering = None;
        if compacted {
            from = session.items.len();
            compacted = false;
            mergeable = false;
        }
        if mergeable && let Some(last) = session.items.last_mut() {
            let mut merged = blocks_of(&last["content"]);
            merged.extend(blocks_of(content));
            last["content"] = Value::Array(merged);
        } else {
            session
                .items
                .push(json!({"role": "user", "content": content}));
            mergeable = true;
        }
    }
    session
}

/// Whether a Responses item is the model's own output (a message of the assistant, a call, its
/// reasoning): a run of them after input items is one model call's answer.
fn is_output(item: &Value) -> bool {
    match item.get("type").and_then(Value::as_str) {
        Some("message") | None => item.get("role").and_then(Value::as_str) == Some("assistant"),
        Some(kind) => kind == "reasoning" || kind.ends_with("_call"),
    }
}

/// Whether a Responses item is one a request carries: its reasoning is dropped (sent back only
/// encrypted, which a replay cannot reproduce), and so are the harness's own records that are
/// never sent (`ghost_snapshot`, `compaction` markers).
fn is_sent(item: &Value) -> bool {
    !matches!(
        item.get("type").and_then(Value::as_str),
        Some("reasoning" | "ghost_snapshot" | "compaction" | "compaction_summary" | "other")
    )
}

/// A Codex rollout: `response_item` lines are the conversation's items; a maximal run of the
/// model's own items after input items is one model call, whose request held every item before
/// it. `session_meta` names the session (and its instructions, where recorded), `turn_context`
/// the model. A `compacted` line starts the history again: at its replacement history when it
/// records one, else at its summary as a user message.
fn codex(records: &[Value]) -> Session {
    let mut session = empty(Harness::Codex);
    let (mut id, mut model) = (String::new(), String::from("gpt-5-codex"));
    let (mut from, mut in_call) = (0, false);
    for record in records {
        let payload = &record["payload"];
        session.started_ms = session.started_ms.or_else(|| time_ms(record));
        match record.get("type").and_then(Value::as_str) {
            Some("session_meta") => {
                if let Some(meta_id) = payload.get("id").and_then(Value::as_str) {
                    meta_id.clone_into(&mut id);
                }
                session.instructions = payload
                    .get("instructions")
                    .and_then(Value::as_str)
                    .or_else(|| payload["base_instructions"]["text"].as_str())
                    .map(str::to_owned);
            }
            Some("turn_context") => {
                if let Some(named) = payload.get("model").and_then(Value::as_str) {
                    named.clone_into(&mut model);
                }
            }
            Some("compacted") => {
                from = session.items.len();
                in_call = false;
                match payload.get("replacement_history").and_then(Value::as_array) {
                    Some(history) => session
                        .items
                        .extend(history.iter().filter(|i| is_sent(i)).cloned()),
                    None => {
                        let summary = payload.get("message").and_then(Value::as_str);
                        session.items.push(json!({"type": "message", "role": "user",
                            "content": [{"type": "input_text", "text": summary.unwrap_or("")}]}));
                    }
                }
            }
            Some("response_item") => {
                let output = is_output(payload);
                if output && !in_call {
                    let at = session.items.len();
                    session.calls.push(Call {
                        from,
                        at,
                        end: at,
                        session_id: id.clone(),
                        model: model.clone(),
                    });
                }
                in_call = output;
                if matches!(
                    payload.get("type").and_then(Value::as_str),
                    Some("function_call" | "custom_tool_call")
                ) {
                    offer(
                        &mut session.tools,
                        payload.get("name").and_then(Value::as_str),
                    );
                }
                if is_sent(payload) {
                    session.items.push(payload.clone());
                    if output && let Some(call) = session.calls.last_mut() {
                        call.end = session.items.len();
                    }
                }
            }
            _ => {}
        }
    }
    session
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<Value> {
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    #[test]
    fn claude_codes_blocks_merge_into_calls_and_prompts_into_one_message() {
        let records = lines(
            r#"{"type":"user","sessionId":"s","timestamp":"2026-01-02T03:04:05.000Z","message":{"role":"user","content":"Fix main.rs"}}
{"type":"assistant","sessionId":"s","timestamp":"t1","message":{"id":"m1","model":"claude-x","role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"x"}]}}
{"type":"assistant","sessionId":"s","timestamp":"t2","message":{"id":"m1","model":"claude-x","role":"assistant","content":[{"type":"tool_use","id":"tu1","name":"Read","input":{"file_path":"main.rs"}}]}}
{"type":"progress","timestamp":"t3"}
{"type":"user","sessionId":"s","timestamp":"t4","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu1","content":"fn main() {}"}]}}
{"type":"user","sessionId":"s","timestamp":"t5","message":{"role":"user","content":"and add tests"}}
{"type":"user","sessionId":"s","timestamp":"t5","message":{"role":"user","content":"and add tests"}}
{"type":"assistant","sessionId":"s","timestamp":"t6","isSidechain":true,"message":{"id":"m9","model":"claude-x","content":[{"type":"text","text":"side"}]}}
{"type":"assistant","sessionId":"s","timestamp":"t7","isApiErrorMessage":true,"message":{"id":"m8","model":"<synthetic>","content":[{"type":"text","text":"API Error"}]}}
{"type":"assistant","sessionId":"s","timestamp":"t8","message":{"id":"m2","model":"claude-x","content":[{"type":"text","text":"Done."}]}}"#,
        );
        let mut counts = ReadCounts::default();
        let session = claude_code(&records, &mut counts);
        assert_eq!(
            (counts.sidechain, counts.repeated, counts.synthetic),
            (1, 1, 1)
        );
        assert_eq!(session.started_ms, Some(1_767_323_045_000));
        assert_eq!(session.tools, ["Read"]);
        assert_eq!(session.items.len(), 4);
        assert_eq!(spans(&session), [(0, 1, 2), (0, 3, 4)]);
        assert_eq!(session.items[1]["content"][0]["type"], "tool_use");
        assert_eq!(session.items[1]["content"].as_array().unwrap().len(), 1);
        let merged = session.items[2]["content"].as_array().unwrap();
        assert_eq!(merged[0]["type"], "tool_result");
        assert_eq!(merged[1], json!({"type": "text", "text": "and add tests"}));
        assert_eq!(session.calls[0].session_id, "s");
    }

    /// Each call's history start, place and end, as item indices.
    fn spans(session: &Session) -> Vec<(usize, usize, usize)> {
        session
            .calls
            .iter()
            .map(|c| (c.from, c.at, c.end))
            .collect()
    }

    #[test]
    fn a_compaction_starts_claude_codes_history_again() {
        let records = lines(
            r#"{"type":"user","timestamp":"a","message":{"role":"user","content":"one"}}
{"type":"assistant","timestamp":"b","message":{"id":"m1","content":[{"type":"text","text":"r1"}]}}
{"type":"system","subtype":"compact_boundary","timestamp":"c"}
{"type":"user","timestamp":"d","isCompactSummary":true,"message":{"role":"user","content":"This session is being continued from a previous conversation that ran out of context."}}
{"type":"user","timestamp":"e","message":{"role":"user","content":"two"}}
{"type":"assistant","timestamp":"f","message":{"id":"m2","content":[{"type":"text","text":"r2"}]}}"#,
        );
        let session = claude_code(&records, &mut ReadCounts::default());
        assert_eq!(session.calls[1].from, 2);
        assert_eq!(session.calls[1].at, 3);
        assert_eq!(session.items[2]["content"][1]["text"], "two");
    }

    #[test]
    fn codexs_runs_of_output_items_are_calls_without_their_reasoning() {
        let records = lines(
            r#"{"timestamp":"2026-01-02T03:04:05.000Z","type":"session_meta","payload":{"id":"th-1","instructions":"Be brief."}}
{"timestamp":"x","type":"turn_context","payload":{"model":"gpt-9"}}
{"timestamp":"x","type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"list files"}]}}
{"timestamp":"x","type":"response_item","payload":{"type":"reasoning","summary":[],"encrypted_content":"zz"}}
{"timestamp":"x","type":"response_item","payload":{"type":"function_call","name":"shell","arguments":"{\"command\":[\"ls\"]}","call_id":"c1"}}
{"timestamp":"x","type":"event_msg","payload":{"type":"token_count"}}
{"timestamp":"x","type":"response_item","payload":{"type":"function_call_output","call_id":"c1","output":"a.rs"}}
{"timestamp":"x","type":"response_item","payload":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a.rs"}]}}"#,
        );
        let session = codex(&records);
        assert_eq!(session.instructions.as_deref(), Some("Be brief."));
        assert_eq!(session.tools, ["shell"]);
        assert_eq!(session.items.len(), 4);
        assert_eq!(spans(&session), [(0, 1, 2), (0, 3, 4)]);
        assert_eq!(session.calls[0].session_id, "th-1");
        assert_eq!(session.calls[0].model, "gpt-9");
    }
}
