//! The lexical signature: which query terms a row may hold, in 256 bits per row, for the first
//! pass's lexical estimate and stage two's bound.
//!
//! A blocked Bloom filter: a term's hash picks one of the signature's four 64-bit words and
//! [`TERM_BITS`] bits inside it; a row sets those bits for each of its terms, and a row "may
//! hold" a query term when all of the term's bits are set. A set test never misses a term the
//! row has; it wrongly reports one the row lacks with a probability that grows with how full
//! the word is. One bit per term (layout version 4) wrongly matched about one query term in
//! nine on rows of thirty terms; three bits in one word, with the stop words below left out,
//! about one in sixty (`docs/journal/benchmarks.md`).
//!
//! Stop words (the most frequent English function words) are never set: they are in almost
//! every row, so their bits would fill the signature while saying nothing. A query's stop word
//! is taken as present in every row ([`term_bits`] gives it no bits; every signature holds the
//! empty set), which keeps stage two's bound an upper bound.

use std::collections::HashSet;
use std::sync::OnceLock;

use super::page::WORDS;
use crate::dictionary::lexical::{STOP_WORDS, term_id};
use crate::types::TermId;

/// Bits a term sets in its word.
pub const TERM_BITS: usize = 3;

fn stop_terms() -> &'static HashSet<TermId> {
    static STOP: OnceLock<HashSet<TermId>> = OnceLock::new();
    STOP.get_or_init(|| STOP_WORDS.iter().map(|w| term_id(w)).collect())
}

/// Whether `term` is a stop word, left out of every signature.
pub fn is_stop_term(term: TermId) -> bool {
    stop_terms().contains(&term)
}

/// A term's bits in a signature: `mask` in word `word`. The empty mask (a stop word) is held by
/// every signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermBits {
    pub word: usize,
    pub mask: u64,
}

/// The bits of `term`: none for a stop word; else a word and [`TERM_BITS`] bits in it, from
/// disjoint bit fields of one multiplicative hash of the term id (two fields may name the same
/// bit, leaving fewer set).
pub fn term_bits(term: TermId) -> TermBits {
    if is_stop_term(term) {
        return TermBits { word: 0, mask: 0 };
    }
    let hash = term.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let word = (hash >> 62) as usize % WORDS;
    let mask = (0..TERM_BITS).fold(0u64, |mask, k| mask | 1 << ((hash >> (56 - 6 * k)) & 63));
    TermBits { word, mask }
}

/// The signature of a row holding `terms`: each term's bits set in its word.
pub fn signature(terms: impl IntoIterator<Item = TermId>) -> [u64; WORDS] {
    let mut words = [0u64; WORDS];
    for term in terms {
        let bits = term_bits(term);
        words[bits.word] |= bits.mask;
    }
    words
}

/// Whether a signature word `held` holds every bit of `bits` (always, for a stop word).
#[inline]
pub fn holds(held: u64, bits: TermBits) -> bool {
    held & bits.mask == bits.mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_term_sets_up_to_three_bits_in_one_word_and_stop_words_none() {
        let garden = term_bits(term_id("garden"));
        assert!(garden.word < WORDS);
        assert!((1..=TERM_BITS as u32).contains(&garden.mask.count_ones()));
        assert_eq!(term_bits(term_id("the")).mask, 0);
        assert!(holds(0, term_bits(term_id("the"))));
        assert!(!holds(0, garden));
        assert!(holds(garden.mask, garden));
    }

    #[test]
    fn few_terms_share_all_their_bits() {
        // Terms whose bits are a subset of another term's word are the only false matches of
        // a one-term row: count them over many distinct terms.
        let bits: Vec<TermBits> = (0..5_000)
            .map(|i| term_bits(term_id(&format!("word{i}"))))
            .collect();
        let probe = bits[0];
        let shared = bits[1..]
            .iter()
            .filter(|b| b.word == probe.word && holds(b.mask, probe))
            .count();
        assert!(
            shared < 10,
            "{shared} of 4,999 terms hold every bit of one term"
        );
    }
}
