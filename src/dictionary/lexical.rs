//! The lexical analyzer: how stored tokens decode and fold into terms for the exact lexical
//! score. Its settings are data (the `lexical` block of `dictionary.json`), so a new dictionary
//! version can change them without a code change; this build knows the values below and refuses
//! others with a typed error at load.

use std::collections::HashSet;
use std::sync::OnceLock;

use rust_stemmers::{Algorithm, Stemmer};
use serde::{Deserialize, Serialize};

use crate::types::TermId;

/// How token bytes become text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decode {
    /// Concatenate the tokens' bytes, replace invalid UTF-8 with U+FFFD.
    Utf8Lossy,
}

/// Case folding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Case {
    /// Unicode lower-casing (`char::to_lowercase`).
    Lowercase,
    /// Keep case.
    Preserve,
}

/// Word splitting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// A term is a maximal run of `char::is_alphanumeric` characters. BPE pieces of one word
    /// join because the whole row decodes before splitting.
    UnicodeAlphanumericRuns,
}

/// Stemming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stem {
    /// Terms are the folded words as they are.
    None,
    /// Each folded word but a stop word ([`STOP_WORDS`]) becomes its Snowball English
    /// (Porter2) stem, so "hikes", "hiking" and "hiked" are one term. Stop words pass as they
    /// are: the lexical signature leaves them out by name.
    SnowballEnglish,
}

/// Function words, as the default analyzer folds them (lower case): the lexical signature
/// leaves them out of every row (`arena::signature`), and stemming passes them unchanged.
pub const STOP_WORDS: &[&str] = &[
    "a", "about", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as", "at",
    "be", "been", "before", "being", "both", "but", "by", "can", "could", "did", "do", "does",
    "doing", "down", "during", "each", "for", "from", "had", "has", "have", "having", "he", "her",
    "here", "hers", "him", "his", "how", "i", "if", "in", "into", "is", "it", "its", "just", "me",
    "more", "most", "my", "no", "nor", "not", "now", "of", "off", "on", "once", "only", "or",
    "other", "our", "ours", "out", "over", "own", "same", "she", "should", "so", "some", "such",
    "than", "that", "the", "their", "them", "then", "there", "these", "they", "this", "those",
    "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what", "when",
    "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your",
    "yours", "s", "t", "ll", "re", "ve", "d", "m", "don", "didn", "doesn", "isn", "wasn", "won",
    "yes", "oh", "ok", "really", "like",
];

/// The analyzer's settings, as stored in the dictionary header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LexicalSpec {
    pub decode: Decode,
    pub case: Case,
    pub split: Split,
    pub stem: Stem,
    /// Longer words are cut to this many bytes (at a char boundary) before hashing, so one
    /// pathological run cannot make an unbounded term.
    pub max_term_bytes: u32,
}

impl LexicalSpec {
    /// The folded (and stemmed, where the spec says so) words of `text`, in order of
    /// appearance.
    pub fn words(&self, text: &str) -> Vec<String> {
        let stemmer = match self.stem {
            Stem::None => None,
            Stem::SnowballEnglish => Some(Stemmer::create(Algorithm::English)),
        };
        let term = |word: String| {
            let word = match &stemmer {
                Some(stemmer) if !stop_words().contains(word.as_str()) => {
                    stemmer.stem(&word).into_owned()
                }
                _ => word,
            };
            self.bound(word)
        };
        let mut words = Vec::new();
        let mut current = String::new();
        for ch in text.chars() {
            if ch.is_alphanumeric() {
                match self.case {
                    Case::Lowercase => current.extend(ch.to_lowercase()),
                    Case::Preserve => current.push(ch),
                }
            } else if !current.is_empty() {
                words.push(term(std::mem::take(&mut current)));
            }
        }
        if !current.is_empty() {
            words.push(term(current));
        }
        words
    }

    /// Distinct terms of `text` with their counts, sorted by term id.
    pub fn terms(&self, text: &str) -> Vec<(TermId, u32)> {
        let mut ids: Vec<TermId> = self.words(text).iter().map(|w| term_id(w)).collect();
        ids.sort_unstable();
        let mut out: Vec<(TermId, u32)> = Vec::with_capacity(ids.len());
        for id in ids {
            match out.last_mut() {
                Some((last, count)) if *last == id => *count += 1,
                _ => out.push((id, 1)),
            }
        }
        out
    }

    fn bound(&self, mut word: String) -> String {
        let max = self.max_term_bytes as usize;
        if word.len() > max {
            let mut cut = max;
            while !word.is_char_boundary(cut) {
                cut -= 1;
            }
            word.truncate(cut);
        }
        word
    }
}

fn stop_words() -> &'static HashSet<&'static str> {
    static STOP: OnceLock<HashSet<&'static str>> = OnceLock::new();
    STOP.get_or_init(|| STOP_WORDS.iter().copied().collect())
}

/// The term id of a folded word: 64-bit FNV-1a over its UTF-8 bytes.
pub fn term_id(word: &str) -> TermId {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    TermId(
        word.bytes()
            .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: LexicalSpec = LexicalSpec {
        decode: Decode::Utf8Lossy,
        case: Case::Lowercase,
        split: Split::UnicodeAlphanumericRuns,
        stem: Stem::None,
        max_term_bytes: 8,
    };

    #[test]
    fn folds_and_splits() {
        assert_eq!(
            SPEC.words("Hi, Mel! Über-cool 2023's"),
            ["hi", "mel", "über", "cool", "2023", "s"]
        );
    }

    #[test]
    fn counts_repeated_terms() {
        let terms = SPEC.terms("the cat and THE dog");
        let the = terms.iter().find(|(id, _)| *id == term_id("the")).unwrap();
        assert_eq!(the.1, 2);
        assert_eq!(terms.len(), 4);
        assert!(terms.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn stemming_joins_a_words_forms_and_passes_stop_words() {
        let spec = LexicalSpec {
            stem: Stem::SnowballEnglish,
            max_term_bytes: 64,
            ..SPEC
        };
        assert_eq!(
            spec.words("Hikes, hiking and HIKED: activities being done"),
            ["hike", "hike", "and", "hike", "activ", "being", "done"]
        );
        assert_eq!(spec.terms("hikes"), spec.terms("hiking"));
        assert_ne!(SPEC.terms("hikes"), SPEC.terms("hiking"));
        // Without the exception, "being" would stem to "be" and "does" to "doe".
        assert_eq!(spec.words("does being"), ["does", "being"]);
    }

    #[test]
    fn cuts_long_words_on_char_boundaries() {
        assert_eq!(SPEC.words("abcdefghij ééééé"), ["abcdefgh", "éééé"]);
    }

    #[test]
    fn fnv_reference_values() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(term_id(""), TermId(0xcbf2_9ce4_8422_2325));
        assert_eq!(term_id("a"), TermId(0xaf63_dc4c_8601_ec8c));
        assert_eq!(term_id("foobar"), TermId(0x8594_4171_f739_67e8));
    }
}
