//! What agent harnesses put in a request besides the user's words, and how it is recognised
//! (`docs/proxy.md`, "Harnesses"): instructions at any position, context a harness injects in
//! the user's role (project rules, the environment, reminders), the ongoing tool round, the
//! harness's own session id, and side calls that are not conversation. Pure functions over a
//! request's JSON; every form recognised here is one a real harness was recorded sending.

use std::borrow::Cow;

use hyper::HeaderMap;
use serde_json::Value;

use super::wire::{self, Format};

/// What one item of a request's conversation list is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A `system` or `developer` message, wherever it stands (Claude Code ends its main
    /// request with one after the user's message): kept where the harness put it.
    Instructions,
    /// A user-role message holding nothing but harness context (Codex's AGENTS.md and
    /// `<environment_context>` messages): kept where the harness put it, never stored.
    Context,
    /// A user's turn: words, attachments, or both.
    Turn,
    /// Tool results (Chat `tool` messages, Responses `*_output` items, Anthropic
    /// `tool_result` blocks, Gemini `functionResponse` parts).
    Result,
    /// The assistant's messages and calls, and any other item (Responses reasoning, output
    /// items of kinds this proxy does not name).
    Agent,
}

/// Openings of a user-role text that is harness context as a whole: a project's instructions
/// file (Codex: `# AGENTS.md instructions for <dir>` then the file in `<INSTRUCTIONS>`), and the
/// summary that opens a compacted conversation (Claude Code, after `/compact` or on its own
/// near the context limit: a model's summary of turns the memory holds verbatim).
const CONTEXT_OPENINGS: [&str; 2] = [
    "# AGENTS.md instructions for ",
    "This session is being continued from a previous conversation that ran out of context.",
];

/// Words in the tag name of a block that is harness context as a whole: `<environment_context>`
/// (Codex), `<system-reminder>` (Claude Code), `<user_instructions>` (older Codex),
/// `<local-command-caveat>`, and `<command-name>` and `<local-command-stdout>` (Claude Code's
/// record of a command the user ran in it, such as `/compact`), and others of the same make.
const CONTEXT_TAG_WORDS: [&str; 6] = [
    "context",
    "instruction",
    "reminder",
    "caveat",
    "environment",
    "command",
];

/// The tag whose elements Claude Code puts inside a user's text (and as blocks of their own).
const REMINDER_TAG: &str = "system-reminder";

/// Whether `text` is harness context as a whole: one of the [`CONTEXT_OPENINGS`], or one or
/// more XML-style elements the first of which has a context tag.
pub fn is_context(text: &str) -> bool {
    let text = text.trim();
    if CONTEXT_OPENINGS.iter().any(|h| text.starts_with(h)) {
        return true;
    }
    let Some(tag) = opening_tag(text) else {
        return false;
    };
    let lower = tag.to_ascii_lowercase();
    CONTEXT_TAG_WORDS.iter().any(|w| lower.contains(w))
        && text.ends_with('>')
        && text.contains(&format!("</{tag}>"))
}

/// The name of the tag `text` opens with, when it is a plain XML-style name.
fn opening_tag(text: &str) -> Option<&str> {
    let rest = text.strip_prefix('<')?;
    let end = rest.find(['>', ' ', '\n'])?;
    let name = &rest[..end];
    let plain = !name.is_empty()
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    plain.then_some(name)
}

/// `text` without the `<system-reminder>` elements inside it: the user's words around them,
/// trimmed where an element was taken out; `text` itself, byte for byte, when it holds none.
pub fn without_reminders(text: &str) -> Cow<'_, str> {
    let (open, close) = (format!("<{REMINDER_TAG}>"), format!("</{REMINDER_TAG}>"));
    let mut out = String::new();
    let mut rest = text;
    let mut removed = false;
    while let Some(start) = rest.find(&open) {
        let Some(end) = rest[start..].find(&close) else {
            break;
        };
        out.push_str(&rest[..start]);
        rest = &rest[start + end + close.len()..];
        removed = true;
    }
    if !removed {
        return Cow::Borrowed(text);
    }
    out.push_str(rest);
    Cow::Owned(out.trim().to_owned())
}

/// Headers naming the harness's session: Claude Code's `X-Claude-Code-Session-Id`, OpenCode's
/// `x-session-id`, Codex's `session-id` (its thread id, also its `prompt_cache_key`), and the
/// underscore spelling (pi on Responses).
const SESSION_HEADERS: [&str; 4] = [
    "x-claude-code-session-id",
    "x-session-id",
    "session-id",
    "session_id",
];

/// The harness's own id of the conversation, where it sends one: a session header
/// ([`SESSION_HEADERS`]), else Claude Code's `metadata.user_id`: a JSON object with
/// `session_id` (2.1), or `user_…_account_…_session_<uuid>` (earlier versions).
pub fn session(
    format: Format,
    body: &serde_json::Map<String, Value>,
    headers: &HeaderMap,
) -> Option<String> {
    if let Some(id) = SESSION_HEADERS
        .iter()
        .find_map(|name| headers.get(*name)?.to_str().ok())
        .filter(|v| !v.is_empty())
    {
        return Some(format!("session:{id}"));
    }
    format.wire().session(body)
}

/// The header in which Codex describes each request (JSON with `request_kind`: `turn` for the
/// conversation, another kind for its compaction and other side calls).
const CODEX_TURN_METADATA: &str = "x-codex-turn-metadata";

/// The header and value Claude Code names itself with on every request.
const CLAUDE_CODE_APP: (&str, &str) = ("x-app", "cli");

/// What Claude Code's request to compact a conversation asks, after the conversation itself
/// (it opens "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.").
pub const COMPACTION_REQUEST: &str =
    "Your task is to create a detailed summary of the conversation so far";

/// Whether a request offers the model tools (`tools`, in every format).
pub fn offers_tools(body: &serde_json::Map<String, Value>) -> bool {
    body.get("tools")
        .and_then(Value::as_array)
        .is_some_and(|tools| !tools.is_empty())
}

/// Whether a request asks for structured output (JSON mode or a schema): Chat's
/// `response_format`, Responses' `text.format`, Gemini's `responseMimeType` /
/// `responseSchema` / `responseJsonSchema`, Anthropic's `output_format` / `output_config`.
pub fn asks_structured_output(body: &serde_json::Map<String, Value>) -> bool {
    let json_type = |format: Option<&Value>| {
        format
            .and_then(|f| f.get("type"))
            .and_then(Value::as_str)
            .is_some_and(|t| t.starts_with("json"))
    };
    let gemini = body.get("generationConfig").is_some_and(|config| {
        config
            .get("responseMimeType")
            .and_then(Value::as_str)
            .is_some_and(|m| m.starts_with("application/json"))
            || config.get("responseSchema").is_some()
            || config.get("responseJsonSchema").is_some()
    });
    json_type(body.get("response_format"))
        || json_type(body.get("text").and_then(|t| t.get("format")))
        || gemini
        || body.get("output_format").is_some()
        || body
            .get("output_config")
            .is_some_and(|c| c.get("format").is_some())
}

/// The instructions a request gives, wherever its format puts them (Anthropic `system`,
/// Responses `instructions`, Gemini `systemInstruction`, `system` / `developer` messages),
/// joined.
fn instructions_text(body: &serde_json::Map<String, Value>, messages: &[Value]) -> String {
    let mut texts: Vec<String> = ["system", "instructions", "systemInstruction"]
        .iter()
        .filter_map(|key| body.get(*key))
        .filter_map(|value| match value {
            Value::String(text) => Some(text.clone()),
            Value::Array(_) => wire::text_of(value),
            Value::Object(_) => value.get("parts").and_then(wire::text_of),
            _ => None,
        })
        .collect();
    texts.extend(
        messages
            .iter()
            .filter(|m| wire::kind_by_role(m) == Kind::Instructions)
            .filter_map(|m| m.get("content").and_then(wire::text_of)),
    );
    texts.join("\n")
}

/// Whether a request without tools asks for a title: its instructions or its first user
/// message speak of a title to generate for the conversation or thread (OpenCode's "You are
/// a title generator", Claude Code's session titles).
fn asks_title(body: &serde_json::Map<String, Value>, messages: &[Value]) -> bool {
    let first_user = messages
        .iter()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|m| m.get("content").or_else(|| m.get("parts")))
        .and_then(wire::text_of)
        .unwrap_or_default();
    let text = format!("{}\n{first_user}", instructions_text(body, messages)).to_lowercase();
    text.contains("title")
        && ["generat", "this conversation", "the conversation", "thread"]
            .iter()
            .any(|w| text.contains(w))
}

/// Whether a request is a one-shot helper call that a harness makes beside its turns, passed
/// through untouched (nothing stored, no frame, no memory tools), recognised by what it is:
/// - a quota probe (`max_tokens` 1: no real turn asks for one token);
/// - a request for structured output without tools ([`asks_structured_output`]: Gemini
///   CLI's routing classifier, Claude Code's session title, an extraction call);
/// - a request without tools that asks for a title (OpenCode's, Claude Code's);
/// - a request without tools, holding nothing the agent did, in a harness session whose turns
///   offer tools (`session_offers_tools`: an agent's turns always do; its helpers often do
///   not);
/// - Claude Code's compaction (the last message asks for the conversation's summary), and
///   any Claude Code request without tools;
/// - a Codex request whose metadata names a kind other than `turn`.
pub fn is_side_call(
    body: &serde_json::Map<String, Value>,
    messages: &[Value],
    headers: &HeaderMap,
    session_offers_tools: bool,
) -> bool {
    if body.get("max_tokens").and_then(Value::as_u64) == Some(1) {
        return true;
    }
    let tools = offers_tools(body);
    if !tools && asks_structured_output(body) {
        return true;
    }
    if !tools {
        let agent_did_nothing = messages.iter().all(|m| {
            matches!(
                wire::kind_by_role(m),
                Kind::Instructions | Kind::Context | Kind::Turn
            )
        });
        if asks_title(body, messages) || (session_offers_tools && agent_did_nothing) {
            return true;
        }
    }
    let (name, value) = CLAUDE_CODE_APP;
    if headers
        .get(name)
        .is_some_and(|v| v.as_bytes() == value.as_bytes())
    {
        let compacts = messages
            .last()
            .and_then(|last| last.get("content"))
            .and_then(wire::text_of)
            .is_some_and(|text| text.contains(COMPACTION_REQUEST));
        if !tools || compacts {
            return true;
        }
    }
    headers
        .get(CODEX_TURN_METADATA)
        .and_then(|v| serde_json::from_slice::<Value>(v.as_bytes()).ok())
        .and_then(|meta| meta.get("request_kind")?.as_str().map(str::to_owned))
        .is_some_and(|kind| kind != "turn")
}

/// The shortest run of text two of a user's questions must share, at their start or their
/// end, to be taken for a harness's template around the user's words (mini-swe-agent's task
/// wrapper, Aider's edit-format rules: each about 3 KB).
pub const TEMPLATE_BYTES: usize = 1024;

/// The shortest run of text beside a template ([`TEMPLATE_BYTES`]) that is taken for the
/// rest of it at the other end of the words ("Please solve this issue: " before a task whose
/// wrapper's long part follows it).
pub const TEMPLATE_OPENING_BYTES: usize = 16;

/// `words` without the text it shares with the user's `previous` question at its start or its
/// end, when one of those shared runs is at least [`TEMPLATE_BYTES`] long: a harness's
/// template around the user's words, stored once (with the question that brought it first),
/// not with every question. The long run is cut at a line boundary; the run at the other end,
/// part of the same template when it is [`TEMPLATE_OPENING_BYTES`] or more, at a word
/// boundary. `words` itself when no run is long enough or nothing would be left.
pub fn without_template<'a>(words: &'a str, previous: &str) -> Cow<'a, str> {
    let (a, b) = (words.as_bytes(), previous.as_bytes());
    let mut shared_head = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    while !words.is_char_boundary(shared_head) {
        shared_head -= 1;
    }
    let opening = &words[..shared_head];
    let cut_back = |at: fn(char) -> bool| {
        opening
            .char_indices()
            .rev()
            .find(|(_, c)| at(*c))
            .map_or(0, |(i, c)| i + c.len_utf8())
    };
    let heads = (cut_back(|c| c == '\n'), cut_back(char::is_whitespace));
    let mut from = a.len()
        - a.iter()
            .rev()
            .zip(b.iter().rev())
            .take_while(|(x, y)| x == y)
            .count()
            .min(a.len() - shared_head);
    while !words.is_char_boundary(from) {
        from += 1;
    }
    let ending = &words[from..];
    let cut_on = |at: fn(char) -> bool| ending.find(at).map_or(0, |i| ending.len() - i);
    let tails = (cut_on(|c| c == '\n'), cut_on(char::is_whitespace));
    let (head, tail) = match (heads.0 >= TEMPLATE_BYTES, tails.0 >= TEMPLATE_BYTES) {
        (false, false) => return Cow::Borrowed(words),
        (true, true) => (heads.0, tails.0),
        (true, false) => (
            heads.0,
            tails.1 * usize::from(tails.1 >= TEMPLATE_OPENING_BYTES),
        ),
        (false, true) => (
            heads.1 * usize::from(heads.1 >= TEMPLATE_OPENING_BYTES),
            tails.0,
        ),
    };
    let kept = words[head..words.len() - tail].trim();
    if kept.is_empty() {
        Cow::Borrowed(words)
    } else {
        Cow::Owned(kept.to_owned())
    }
}

/// Whether `text` is one markup tag alone, opening or closing, that a harness wraps around an
/// attachment (Codex: `<image name=[Image #1] path="…">` before an image and `</image>` after
/// it): kept in place beside the attachment, not stored as the user's words.
pub fn is_markup(text: &str) -> bool {
    let text = text.trim();
    let Some(inner) = text.strip_prefix('<').and_then(|t| t.strip_suffix('>')) else {
        return false;
    };
    let name = inner.strip_prefix('/').unwrap_or(inner);
    opening_tag(&format!("<{name}>")).is_some() && !inner.contains(['<', '>', '\n'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_and_claude_code_context_is_recognised_and_words_are_not() {
        assert!(is_context(
            "# AGENTS.md instructions for /work/app\n\n<INSTRUCTIONS>\nUse tabs.\n</INSTRUCTIONS>"
        ));
        assert!(is_context(
            "<environment_context>\n  <cwd>/work/app</cwd>\n  <shell>bash</shell>\n</environment_context>"
        ));
        assert!(is_context(
            "<system-reminder>\nAs you answer, follow CLAUDE.md.\n</system-reminder>"
        ));
        assert!(!is_context("What is <b>bold</b> in HTML?"));
        assert!(!is_context("<b>bold</b>"));
        assert!(!is_context("my environment is broken"));
        assert!(!is_context("<environment_context> unclosed"));
    }

    #[test]
    fn reminders_are_taken_out_of_the_users_words() {
        assert_eq!(
            without_reminders(
                "<system-reminder>todo: none</system-reminder>\nFix the parser.\n<system-reminder>x</system-reminder>"
            ),
            "Fix the parser."
        );
        assert_eq!(without_reminders("plain, verbatim "), "plain, verbatim ");
        assert_eq!(
            without_reminders("a <system-reminder>unclosed"),
            "a <system-reminder>unclosed"
        );
    }

    #[test]
    fn sessions_come_from_claude_codes_metadata_and_codexs_header() {
        let body = |user_id: &str| {
            serde_json::json!({"metadata": {"user_id": user_id}})
                .as_object()
                .unwrap()
                .clone()
        };
        let none = HeaderMap::new();
        assert_eq!(
            session(
                Format::Messages,
                &body("user_ab12_account_c3_session_5f0e-77"),
                &none
            )
            .as_deref(),
            Some("session:5f0e-77")
        );
        assert_eq!(
            session(
                Format::Messages,
                &body(r#"{"device_id":"d","session_id":"s-9"}"#),
                &none
            )
            .as_deref(),
            Some("session:s-9")
        );
        assert_eq!(session(Format::Messages, &body("plain-user"), &none), None);
        let mut headers = HeaderMap::new();
        headers.insert("session-id", "019a-c0de".parse().unwrap());
        assert_eq!(
            session(Format::Responses, &serde_json::Map::new(), &headers).as_deref(),
            Some("session:019a-c0de")
        );
    }

    #[test]
    fn quota_probes_and_codex_side_requests_are_side_calls() {
        let body = |value: Value| value.as_object().unwrap().clone();
        let none = HeaderMap::new();
        assert!(is_side_call(
            &body(serde_json::json!({"max_tokens": 1})),
            &[],
            &none,
            false
        ));
        assert!(!is_side_call(
            &body(serde_json::json!({"max_tokens": 32000})),
            &[],
            &none,
            false
        ));
        let mut headers = HeaderMap::new();
        headers.insert(
            CODEX_TURN_METADATA,
            r#"{"session_id":"s","request_kind":"compact"}"#.parse().unwrap(),
        );
        assert!(is_side_call(&serde_json::Map::new(), &[], &headers, false));
        headers.insert(
            CODEX_TURN_METADATA,
            r#"{"session_id":"s","request_kind":"turn"}"#.parse().unwrap(),
        );
        assert!(!is_side_call(&serde_json::Map::new(), &[], &headers, false));
    }

    #[test]
    fn claude_codes_titles_and_compactions_are_side_calls_and_its_turns_are_not() {
        let mut claude_code = HeaderMap::new();
        claude_code.insert("x-app", "cli".parse().unwrap());
        let with_tools =
            serde_json::json!({"tools": [{"name": "Bash", "input_schema": {"type": "object"}}]});
        let with_tools = with_tools.as_object().unwrap();
        let no_tools = serde_json::json!({"tools": []});
        let no_tools = no_tools.as_object().unwrap();
        let asked = [serde_json::json!({"role": "user", "content": "Fix the parser."})];
        assert!(!is_side_call(with_tools, &asked, &claude_code, false));
        assert!(
            is_side_call(no_tools, &asked, &claude_code, false),
            "a title"
        );
        assert!(
            !is_side_call(no_tools, &asked, &HeaderMap::new(), false),
            "a library's request without tools is a turn"
        );
        let compact = format!("CRITICAL: Respond with TEXT ONLY.\n\n{COMPACTION_REQUEST}.");
        let as_string = [serde_json::json!({"role": "user", "content": compact})];
        assert!(is_side_call(with_tools, &as_string, &claude_code, false));
        let as_block =
            [serde_json::json!({"role": "user", "content": [{"type": "text", "text": compact}]})];
        assert!(is_side_call(with_tools, &as_block, &claude_code, false));
    }

    #[test]
    fn a_compacted_conversations_summary_and_command_record_are_context() {
        assert!(is_context(
            "This session is being continued from a previous conversation that ran out of context. The summary below covers the earlier portion of the conversation."
        ));
        assert!(is_context(
            "<command-name>/compact</command-name>\n  <command-message>compact</command-message>\n  <command-args></command-args>\n"
        ));
        assert!(is_context(
            "<local-command-stdout>Compacted</local-command-stdout>\n"
        ));
        assert!(!is_context(
            "Was this session continued from a previous conversation?"
        ));
    }

    #[test]
    fn a_template_shared_with_the_last_question_is_taken_off_and_words_are_kept() {
        let rules = format!(
            "# Rules:\n{}",
            "Every block must use this format.\n".repeat(40)
        );
        let ask = |words: &str| format!("{words}\n\n{rules}");
        assert_eq!(
            without_template(&ask("Add a docstring to add."), &ask("Rename main.")),
            "Add a docstring to add."
        );
        let wrap = |task: &str| format!("Please solve this issue: {task}\n\n{rules}");
        assert_eq!(
            without_template(&wrap("fix the parser"), &wrap("add tests")),
            "fix the parser",
            "the wrapper's opening goes with its long part"
        );
        assert_eq!(
            without_template(&format!("é{rules}"), &format!("è{rules}")),
            "é# Rules:",
            "a shared run that starts inside a character starts after it"
        );
        let short = "Thanks.\nAnd one more thing: the parser.";
        assert_eq!(without_template(short, "Thanks.\nfine"), short);
        assert_eq!(
            without_template(&ask("same"), &ask("same")),
            ask("same"),
            "a question asked again is kept whole"
        );
        let log = format!("{rules}the stack trace ends here");
        assert_eq!(
            without_template(&log, &format!("{rules}another ending")),
            "the stack trace ends here"
        );
    }

    #[test]
    fn attachment_markup_is_a_lone_tag() {
        assert!(is_markup(r#"<image name=[Image #1] path="/tmp/dot.png">"#));
        assert!(is_markup("</image>"));
        assert!(!is_markup("<b>bold</b>"));
        assert!(!is_markup("Describe the image."));
    }
}
