//! What each model call is measured on, whatever the frame: the request the harness sent (its
//! live turn, as the proxy reads it), the identifier terms of the recorded answer, and where
//! they were to be found: in the current turn, only in earlier turns of the session's history,
//! or in no earlier part of the session but in an earlier session of the same user.

use std::collections::BTreeSet;

use serde_json::Value;

use super::request;
use super::terms::{Corpus, terms_into, text_into, text_of};
use super::transcript::Session;
use crate::proxy::wire;

/// The answer's terms found in the history the harness sent, by where they first appear, and
/// those found only in an earlier session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// In the live turn or the tool round after it.
    pub current: Vec<String>,
    /// Only in earlier turns of the history the harness sent.
    pub earlier: Vec<String>,
    /// In no earlier part of the session (compacted away or not), but in an earlier session.
    pub cross: Vec<String>,
}

/// One call, ready to replay and measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Its session (index into the replayed sessions) and call (into the session's calls).
    pub session: usize,
    pub call: usize,
    /// The live turn's place in the request's history (the last user turn with words or
    /// attachments), as the proxy reads it.
    pub live: Option<usize>,
    /// Whether the call opens its turn (its live turn is not the previous call's).
    pub opens_turn: bool,
    /// The live turn's words as the proxy stores them (harness context taken out), attachment
    /// placeholders aside.
    pub prompt: Option<String>,
    pub terms: Split,
}

/// Each item's text ([`text_into`]) laid end to end, and where each item's text ends: the text
/// of any run of items is a slice of it.
#[derive(Debug, Default)]
pub struct ItemsText {
    pub text: String,
    ends: Vec<usize>,
}

impl ItemsText {
    pub fn new(items: &[Value]) -> Self {
        let mut out = Self::default();
        for item in items {
            text_into(item, &mut out.text);
            out.ends.push(out.text.len());
        }
        out
    }

    /// The text of items `from..to`.
    pub fn of(&self, from: usize, to: usize) -> &str {
        let start = |i: usize| if i == 0 { 0 } else { self.ends[i - 1] };
        &self.text[start(from)..start(to)]
    }
}

/// The identifier terms of a recorded answer: its text, and its calls' names and arguments
/// (a JSON arguments' string values, else their raw text), never its ids or block types.
pub fn answer_terms(answer: &[Value]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let text = |value: &Value, out: &mut BTreeSet<String>| terms_into(&text_of(value), out);
    for item in answer {
        let name = &item["name"];
        match item.get("type").and_then(Value::as_str) {
            Some("function_call") => {
                text(name, &mut out);
                text(
                    &serde_json::json!({"arguments": item["arguments"]}),
                    &mut out,
                );
            }
            Some("custom_tool_call") => {
                text(name, &mut out);
                text(&item["input"], &mut out);
            }
            Some(kind) if kind.ends_with("_call") => text(&item["action"], &mut out),
            _ => {
                for block in item["content"].as_array().into_iter().flatten() {
                    match block.get("type").and_then(Value::as_str) {
                        Some("text" | "output_text") => text(&block["text"], &mut out),
                        Some("tool_use") => {
                            text(&block["name"], &mut out);
                            text(&block["input"], &mut out);
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    out
}

/// A stored turn's words without the attachment placeholder lines the proxy appends
/// (`[image attached: …]`).
fn words_of(question: &str) -> String {
    let mut lines: Vec<&str> = question.lines().collect();
    while lines
        .last()
        .is_some_and(|l| l.starts_with('[') && l.contains(" attached: ") && l.ends_with(']'))
    {
        lines.pop();
    }
    lines.join("\n")
}

/// The plans of every call of `sessions`, in replay order. Each session's text joins the
/// earlier sessions' once its calls are planned.
pub fn plans(sessions: &[Session]) -> Vec<Plan> {
    let mut corpus = Corpus::default();
    let mut plans = Vec::new();
    for (s, session) in sessions.iter().enumerate() {
        let texts = ItemsText::new(&session.items);
        let format = session.harness.format();
        let mut previous_live = None;
        for (c, call) in session.calls.iter().enumerate() {
            let (_, _, body) = request::direct(session, call);
            let parsed = wire::parse(format, body.to_string().as_bytes(), None).ok();
            let live = parsed.as_ref().and_then(|r| r.question_at);
            let prompt = parsed
                .and_then(|r| r.question)
                .map(|q| words_of(&q))
                .filter(|w| !w.is_empty());
            let turn_at = live.map(|at| call.from + at);
            let opens_turn = c == 0 || turn_at != previous_live;
            previous_live = turn_at;
            let current_from = call.from + live.unwrap_or(0);
            let (current, earlier) = (
                texts.of(current_from, call.at),
                texts.of(call.from, current_from),
            );
            let before = texts.of(0, call.at);
            let mut split = Split::default();
            for term in answer_terms(&session.items[call.at..call.end]) {
                if current.contains(&term) {
                    split.current.push(term);
                } else if earlier.contains(&term) {
                    split.earlier.push(term);
                } else if !before.contains(&term) && corpus.contains(&term) {
                    split.cross.push(term);
                }
            }
            plans.push(Plan {
                session: s,
                call: c,
                live,
                opens_turn,
                prompt,
                terms: split,
            });
        }
        corpus.push(&texts.text);
    }
    plans
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answer_terms_come_from_text_names_and_argument_values_only() {
        let answer = [
            json!({"role": "assistant", "content": [
                {"type": "text", "text": "I will open config.toml."},
                {"type": "tool_use", "id": "toolu_01ABCdef", "name": "TodoWrite",
                    "input": {"file_path": "/src/lib.rs", "limit": 12345}}]}),
            json!({"type": "function_call", "name": "apply_patch", "call_id": "call_XYZ99",
                "arguments": "{\"path\":\"a/b_c.py\"}"}),
            json!({"type": "custom_tool_call", "name": "shell", "call_id": "c_1", "input": "cat x_y.rs"}),
        ];
        let got: Vec<String> = answer_terms(&answer).into_iter().collect();
        assert_eq!(
            got,
            [
                "/src/lib.rs",
                "TodoWrite",
                "a/b_c.py",
                "apply_patch",
                "config.toml",
                "x_y.rs"
            ]
        );
    }

    #[test]
    fn placeholders_are_not_words() {
        assert_eq!(
            words_of("Look at this\n[image attached: image/png, 12 bytes, sha256 ab]"),
            "Look at this"
        );
        assert_eq!(words_of("[draft] plan"), "[draft] plan");
    }

    #[test]
    fn items_text_slices_runs_of_items() {
        let items = [
            json!({"content": "one"}),
            json!({"content": "two"}),
            json!("three"),
        ];
        let texts = ItemsText::new(&items);
        assert_eq!(texts.of(0, 3), "one\ntwo\nthree\n");
        assert_eq!(texts.of(1, 2), "two\n");
        assert_eq!(texts.of(2, 2), "");
    }
}
