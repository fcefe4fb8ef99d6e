//! Identifier terms and where they are found: the words a coding agent must copy exactly (file
//! paths, function names, versions, error codes) taken from a recorded answer, the decoded text
//! of a conversation they are looked for in, and the index of earlier sessions' text that a
//! term is looked up in without reading it all.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;
use serde_json::Value;

/// Fewest characters of a term: shorter runs (`id`, `src`, `v2`) match by chance.
pub const MIN_TERM_CHARS: usize = 5;

/// Characters an identifier is made of: letters, digits and `_ . / : -`.
fn is_term_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b':' | b'-')
}

/// Whether a run of term characters reads as an identifier rather than a word: it holds a
/// digit, `_`, `.` or `/`, or a capital after its first character (`TodoWrite`, `parseArgs`),
/// and at least one letter or digit (a rule of dots names nothing).
fn is_identifier(run: &str) -> bool {
    let bytes = run.as_bytes();
    bytes.iter().any(u8::is_ascii_alphanumeric)
        && (bytes
            .iter()
            .any(|&b| b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'/'))
            || bytes[1..].iter().any(u8::is_ascii_uppercase))
}

/// Add the identifier terms of `text` to `out`: maximal runs of term characters, sentence
/// punctuation at their end (`.` and `:`, as in "see main.rs.") taken off, of at least
/// [`MIN_TERM_CHARS`] characters, that read as identifiers.
pub fn terms_into(text: &str, out: &mut BTreeSet<String>) {
    for run in text.split(|c: char| !c.is_ascii() || !is_term_byte(c as u8)) {
        let run = run.trim_end_matches(['.', ':']);
        if run.len() >= MIN_TERM_CHARS && is_identifier(run) {
            out.insert(run.to_owned());
        }
    }
}

/// Add the text of a JSON value to `out`, each string on a line of its own: every string
/// value, decoded (so escaping never hides a term), keys and numbers left out. A call's
/// `arguments` string that holds JSON (the Responses API sends them so) is decoded too. Inline
/// attachment bytes (an Anthropic `base64` source's `data`, a `data:` URL) are left out: they
/// are not words and would match short terms by chance.
pub fn text_into(value: &Value, out: &mut String) {
    match value {
        Value::String(s) if !s.starts_with("data:") => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|v| text_into(v, out)),
        Value::Object(fields) => {
            let base64 = fields.get("type").and_then(Value::as_str) == Some("base64");
            for (key, field) in fields {
                match (key.as_str(), field) {
                    ("data", _) if base64 => {}
                    ("arguments", Value::String(raw)) => match serde_json::from_str::<Value>(raw) {
                        Ok(decoded) => text_into(&decoded, out),
                        Err(_) => text_into(field, out),
                    },
                    _ => text_into(field, out),
                }
            }
        }
        _ => {}
    }
}

/// The text of a JSON value ([`text_into`]).
pub fn text_of(value: &Value) -> String {
    let mut out = String::new();
    text_into(value, &mut out);
    out
}

/// Bytes of a 4-byte run of term characters, the key of [`Corpus`]'s index.
type Gram = [u8; 4];

/// The text of earlier sessions, with the start of every 4-byte run of term characters
/// indexed, so that whether a term occurs in it costs a look-up and a few comparisons instead
/// of a read of the whole text (tens of MB over a user's sessions, asked for every term of
/// every answer).
#[derive(Debug, Default)]
pub struct Corpus {
    text: Vec<u8>,
    grams: FxHashMap<Gram, Vec<usize>>,
}

impl Corpus {
    /// Add a session's text.
    pub fn push(&mut self, text: &str) {
        let start = self.text.len();
        self.text.extend_from_slice(text.as_bytes());
        self.text.push(b'\n');
        for at in start..self.text.len().saturating_sub(3) {
            let gram: Gram = self.text[at..at + 4].try_into().expect("four bytes");
            if gram.iter().all(|&b| is_term_byte(b)) {
                self.grams.entry(gram).or_default().push(at);
            }
        }
    }

    /// Whether `term` (term characters only, at least 4 of them) occurs in the text: the
    /// places of its rarest 4-byte run, each checked against the whole term.
    pub fn contains(&self, term: &str) -> bool {
        let term = term.as_bytes();
        if term.len() < 4 {
            return false;
        }
        let mut rarest: Option<(usize, &[usize])> = None;
        for offset in 0..=term.len() - 4 {
            let gram: Gram = term[offset..offset + 4].try_into().expect("four bytes");
            let Some(places) = self.grams.get(&gram) else {
                return false;
            };
            if rarest.is_none_or(|(_, best)| places.len() < best.len()) {
                rarest = Some((offset, places));
            }
        }
        let Some((offset, places)) = rarest else {
            return false;
        };
        places.iter().any(|&at| {
            at.checked_sub(offset)
                .and_then(|start| self.text.get(start..start + term.len()))
                == Some(term)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn terms(text: &str) -> Vec<String> {
        let mut out = BTreeSet::new();
        terms_into(text, &mut out);
        out.into_iter().collect()
    }

    #[test]
    fn identifiers_are_terms_and_words_are_not() {
        assert_eq!(
            terms("Edit src/main.rs: call parse_args() in TodoWrite, v1.2.3 on port 18080."),
            ["18080", "TodoWrite", "parse_args", "src/main.rs", "v1.2.3"]
        );
        assert!(terms("Hello there, everything works fine now").is_empty());
        assert!(terms("Rust --release ..... ----- port 8080").is_empty());
        assert_eq!(terms("see https://x.io/a-b."), ["https://x.io/a-b"]);
        assert_eq!(terms("naïve_names"), ["ve_names"], "ASCII characters only");
    }

    #[test]
    fn text_is_decoded_strings_without_attachment_bytes() {
        let item = json!({"role": "user", "content": [
            {"type": "text", "text": "a \"quoted\"\nline"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo_AAA"}},
            {"type": "function_call", "name": "shell", "arguments": "{\"cmd\":[\"cat\",\"x_1.rs\"]}"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
        ], "n": 12345});
        let text = text_of(&item);
        assert!(text.contains("a \"quoted\"\nline\n"));
        assert!(text.contains("cat\nx_1.rs\n"));
        assert!(!text.contains("iVBOR") && !text.contains("base64,") && !text.contains("12345"));
        assert!(text.contains("image/png\n"));
    }

    #[test]
    fn the_corpus_finds_terms_inside_longer_runs_and_nothing_else() {
        let mut corpus = Corpus::default();
        corpus.push("open ./src/parser_v2.rs and run cargo");
        corpus.push("second session: TodoWrite");
        for found in [
            "src/parser_v2.rs",
            "parser_v2",
            "rser_",
            "TodoWrite",
            "./src",
        ] {
            assert!(corpus.contains(found), "{found}");
        }
        for missing in ["parser_v3", "TodoRead", "cargo_x", "on: TodoWrite"] {
            assert!(!corpus.contains(missing), "{missing}");
        }
        assert!(!Corpus::default().contains("anything"));
    }
}
