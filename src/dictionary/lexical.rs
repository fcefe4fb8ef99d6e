//! The lexical analyzer: how stored tokens decode and fold into terms for the exact lexical
//! score. Its settings are data (the `lexical` block of `dictionary.json`), so a new dictionary
//! version can change them without a code change; this build knows the values below and refuses
//! others with a typed error at load.

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
}

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
    /// The folded words of `text`, in order of appearance.
    pub fn words(&self, text: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut current = String::new();
        for ch in text.chars() {
            if ch.is_alphanumeric() {
                match self.case {
                    Case::Lowercase => current.extend(ch.to_lowercase()),
                    Case::Preserve => current.push(ch),
                }
            } else if !current.is_empty() {
                words.push(self.bound(std::mem::take(&mut current)));
            }
        }
        if !current.is_empty() {
            words.push(self.bound(current));
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
