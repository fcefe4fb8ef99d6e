//! The lexical analyzer: how stored tokens decode and fold into terms for the exact lexical
//! score. Its settings are data (the `lexical` block of `dictionary.json`), so a new dictionary
//! version can change them without a code change; this build knows the values below and refuses
//! others with a typed error at load.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
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

/// Folded words a thread keeps the term of ([`LexicalSpec::terms`]) before it starts over: a
/// language's common words are most of any text, and stemming each anew was a tenth of
/// capture's time (`docs/journal/benchmarks.md`). A few megabytes a thread at most.
const TERM_CACHE_WORDS: usize = 16_384;

thread_local! {
    /// The term of each folded word this thread analysed lately, under the spec it was
    /// analysed with (another spec starts the cache over).
    static TERMS: RefCell<(Option<LexicalSpec>, HashMap<String, TermId>)> =
        RefCell::new((None, HashMap::new()));
}

impl LexicalSpec {
    /// The folded (and stemmed, where the spec says so) words of `text`, in order of
    /// appearance.
    pub fn words(&self, text: &str) -> Vec<String> {
        let stemmer = self.stemmer();
        let mut words = Vec::new();
        self.each_folded(text, |word| words.push(self.term(stemmer.as_ref(), word)));
        words
    }

    /// Distinct terms of `text` with their counts, sorted by term id: the ids of
    /// [`Self::words`], each folded word's looked up in the thread's cache first.
    pub fn terms(&self, text: &str) -> Vec<(TermId, u32)> {
        let stemmer = self.stemmer();
        let mut ids: Vec<TermId> = Vec::new();
        TERMS.with_borrow_mut(|(spec, cache)| {
            if *spec != Some(*self) {
                cache.clear();
                *spec = Some(*self);
            }
            self.each_folded(text, |word| {
                let id = match cache.get(word) {
                    Some(&id) => id,
                    None => {
                        let id = term_id(&self.term(stemmer.as_ref(), word));
                        if cache.len() >= TERM_CACHE_WORDS {
                            cache.clear();
                        }
                        cache.insert(word.to_owned(), id);
                        id
                    }
                };
                ids.push(id);
            });
        });
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

    fn stemmer(&self) -> Option<Stemmer> {
        match self.stem {
            Stem::None => None,
            Stem::SnowballEnglish => Some(Stemmer::create(Algorithm::English)),
        }
    }

    /// `emit` each maximal run of alphanumeric characters of `text`, case-folded as the spec
    /// says, in order.
    fn each_folded(&self, text: &str, mut emit: impl FnMut(&str)) {
        let mut current = String::new();
        for ch in text.chars() {
            if ch.is_alphanumeric() {
                match self.case {
                    Case::Lowercase => current.extend(ch.to_lowercase()),
                    Case::Preserve => current.push(ch),
                }
            } else if !current.is_empty() {
                emit(&current);
                current.clear();
            }
        }
        if !current.is_empty() {
            emit(&current);
        }
    }

    /// The term of one folded word: its stem unless it is a stop word, cut to the bound.
    fn term(&self, stemmer: Option<&Stemmer>, word: &str) -> String {
        let word = match stemmer {
            Some(stemmer) if !stop_words().contains(word) => stemmer.stem(word).into_owned(),
            _ => word.to_owned(),
        };
        self.bound(word)
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

    /// The terms of `text` as [`LexicalSpec::words`] names them, counted: what the cached
    /// path must return.
    fn counted_words(spec: &LexicalSpec, text: &str) -> Vec<(TermId, u32)> {
        let mut counts = std::collections::BTreeMap::new();
        for word in spec.words(text) {
            *counts.entry(term_id(&word)).or_insert(0) += 1;
        }
        counts.into_iter().collect()
    }

    proptest::proptest! {
        #[test]
        fn cached_terms_are_the_terms_of_the_words(
            texts in proptest::collection::vec("(?i)(hik(es|ing|ed)|being|does|ÜBER|a1|[a-zé ,.]{0,12}){0,12}", 1..6),
        ) {
            let stemmed = LexicalSpec { stem: Stem::SnowballEnglish, ..SPEC };
            // Each text twice under each spec, the specs alternating: the second reading is
            // served from the cache, and a spec change starts it over.
            for text in texts.iter().flat_map(|t| [t, t]) {
                for spec in [&SPEC, &stemmed] {
                    proptest::prop_assert_eq!(spec.terms(text), counted_words(spec, text));
                }
            }
        }
    }

    #[test]
    fn the_cache_starts_over_when_full() {
        let words: Vec<String> = (0..TERM_CACHE_WORDS + 10)
            .map(|n| format!("w{n}"))
            .collect();
        let text = words.join(" ");
        assert_eq!(SPEC.terms(&text), counted_words(&SPEC, &text));
        assert_eq!(SPEC.terms("w1 w1 w2"), counted_words(&SPEC, "w1 w1 w2"));
        TERMS.with_borrow(|(_, cache)| assert!(cache.len() <= TERM_CACHE_WORDS));
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
