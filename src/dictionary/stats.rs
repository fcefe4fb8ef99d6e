//! The shared frequency statistic that representations are weighted by at score time.
//!
//! One statistic covers the whole pooled memory (every user's rows). The store keeps it
//! durable; this module states what it is and offers an in-memory table for pure code,
//! tools and tests. Counts only ever change by whole rows, so they are integers.

use std::collections::HashMap;

use crate::types::{TermId, TokenId};

/// Read access to corpus-wide counts.
pub trait FrequencyStats {
    /// Occurrences of `token` across every stored row.
    fn token_count(&self, token: TokenId) -> u64;
    /// Sum of all rows' token lengths.
    fn total_tokens(&self) -> u64;
    /// Number of rows containing `term` at least once (document frequency).
    fn term_rows(&self, term: TermId) -> u64;
    /// Number of stored rows.
    fn rows(&self) -> u64;
    /// Sum of all rows' term lengths (for the mean row length of BM25).
    fn total_terms(&self) -> u64;
    /// Start loading the count of `token` (a cache hint for the embedding's next tokens).
    fn prefetch_token_count(&self, token: TokenId);
}

/// One counted quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Count {
    /// Occurrences of a token.
    Token(TokenId),
    /// Rows containing a term.
    TermRows(TermId),
    /// Stored rows.
    Rows,
    /// Tokens over all rows.
    TotalTokens,
    /// Terms over all rows.
    TotalTerms,
}

/// Token ids below this are counted in a dense table (8 MiB at most); o200k_base's are below
/// 200,019.
pub const DENSE_TOKENS: usize = 1 << 20;

/// Counts held in memory.
#[derive(Debug, Clone, Default)]
pub struct FrequencyTable {
    /// Occurrences by token id below [`DENSE_TOKENS`]: a tokenizer's ids are dense, and the
    /// exact rescore weighs every token of every row it embeds by its count, so an index beats
    /// a hash lookup (`docs/journal/benchmarks.md`). Ids past the end count zero.
    tokens: Vec<u64>,
    /// Occurrences of tokens with larger ids, which no bundled tokenizer has: a damaged count
    /// cannot make the dense table huge.
    sparse: HashMap<TokenId, u64>,
    terms: HashMap<TermId, u64>,
    total_tokens: u64,
    total_terms: u64,
    rows: u64,
}

impl FrequencyTable {
    /// Count one row in: its tokens with their counts, its distinct terms, and its lengths in
    /// tokens and in terms ([`crate::dictionary::derive::RetrievalRow::count_into`]).
    pub fn add_row(
        &mut self,
        tokens: &[(TokenId, u32)],
        terms: impl IntoIterator<Item = TermId>,
        token_len: u64,
        term_len: u64,
    ) {
        for &(token, count) in tokens {
            *self.token_slot(token) += u64::from(count);
        }
        for term in terms {
            *self.terms.entry(term).or_default() += 1;
        }
        self.total_tokens += token_len;
        self.total_terms += term_len;
        self.rows += 1;
    }

    /// The count of `token`, the dense table grown to hold it where its id is below
    /// [`DENSE_TOKENS`].
    fn token_slot(&mut self, token: TokenId) -> &mut u64 {
        let at = token.0 as usize;
        if at >= DENSE_TOKENS {
            return self.sparse.entry(token).or_default();
        }
        if at >= self.tokens.len() {
            self.tokens.resize(at + 1, 0);
        }
        &mut self.tokens[at]
    }

    /// Set one count (a zero count removes the entry).
    pub fn set(&mut self, count: Count, value: u64) {
        fn slot<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u64>, key: K, value: u64) {
            if value == 0 {
                map.remove(&key);
            } else {
                map.insert(key, value);
            }
        }
        match count {
            Count::Token(token) if token.0 as usize >= DENSE_TOKENS => {
                slot(&mut self.sparse, token, value)
            }
            Count::Token(token) => *self.token_slot(token) = value,
            Count::TermRows(term) => slot(&mut self.terms, term, value),
            Count::Rows => self.rows = value,
            Count::TotalTokens => self.total_tokens = value,
            Count::TotalTerms => self.total_terms = value,
        }
    }

    /// Every non-zero count, in a fixed order (totals first, then tokens, then terms, each by
    /// id), so two tables can be compared entry by entry.
    pub fn entries(&self) -> Vec<(Count, u64)> {
        let mut out: Vec<(Count, u64)> = [
            (Count::Rows, self.rows),
            (Count::TotalTokens, self.total_tokens),
            (Count::TotalTerms, self.total_terms),
        ]
        .into_iter()
        .filter(|&(_, v)| v != 0)
        .collect();
        let mut sparse: Vec<_> = self
            .sparse
            .iter()
            .map(|(&t, &v)| (Count::Token(t), v))
            .collect();
        sparse.sort_unstable();
        // Every sparse id is above every dense one.
        let tokens = self
            .tokens
            .iter()
            .enumerate()
            .filter(|&(_, &v)| v != 0)
            .map(|(t, &v)| (Count::Token(TokenId(t as u32)), v))
            .chain(sparse);
        let mut terms: Vec<_> = self
            .terms
            .iter()
            .map(|(&t, &v)| (Count::TermRows(t), v))
            .collect();
        terms.sort_unstable();
        out.extend(tokens);
        out.extend(terms);
        out
    }
}

/// Two tables are equal when every count is: a token count of zero is the same whether its
/// slot was ever grown or not.
impl PartialEq for FrequencyTable {
    fn eq(&self, other: &Self) -> bool {
        self.entries() == other.entries()
    }
}

impl Eq for FrequencyTable {}

impl FrequencyStats for FrequencyTable {
    fn token_count(&self, token: TokenId) -> u64 {
        match self.tokens.get(token.0 as usize) {
            Some(&count) => count,
            None => self.sparse.get(&token).copied().unwrap_or(0),
        }
    }
    fn total_tokens(&self) -> u64 {
        self.total_tokens
    }
    fn prefetch_token_count(&self, token: TokenId) {
        if let Some(count) = self.tokens.get(token.0 as usize) {
            crate::scan::kernels::prefetch(count);
        }
    }
    fn term_rows(&self, term: TermId) -> u64 {
        self.terms.get(&term).copied().unwrap_or(0)
    }
    fn rows(&self) -> u64 {
        self.rows
    }
    fn total_terms(&self) -> u64 {
        self.total_terms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Token ids on both sides of [`DENSE_TOKENS`], and the very largest.
    fn token() -> impl Strategy<Value = TokenId> {
        prop_oneof![
            (0u32..300).prop_map(TokenId),
            ((DENSE_TOKENS as u32 - 3)..(DENSE_TOKENS as u32 + 3)).prop_map(TokenId),
            Just(TokenId(u32::MAX)),
        ]
    }

    proptest! {
        /// Token counts read back as a plain map of the same sets gives them, zeros removing
        /// the entry, wherever the id lies; entries come in id order; equality ignores how
        /// far the dense table grew.
        #[test]
        fn token_counts_match_a_map_of_the_same_sets(
            sets in proptest::collection::vec((token(), prop_oneof![Just(0u64), 1u64..5]), 0..60),
        ) {
            let mut table = FrequencyTable::default();
            let mut model: BTreeMap<TokenId, u64> = BTreeMap::new();
            for &(token, value) in &sets {
                table.set(Count::Token(token), value);
                if value == 0 {
                    model.remove(&token);
                } else {
                    model.insert(token, value);
                }
            }
            for &(token, _) in &sets {
                prop_assert_eq!(table.token_count(token), model.get(&token).copied().unwrap_or(0));
            }
            let expected: Vec<(Count, u64)> =
                model.iter().map(|(&t, &v)| (Count::Token(t), v)).collect();
            prop_assert_eq!(table.entries(), expected);
            let mut rebuilt = FrequencyTable::default();
            for (count, value) in table.entries() {
                rebuilt.set(count, value);
            }
            prop_assert_eq!(&rebuilt, &table);
            prop_assert!(table.tokens.len() <= DENSE_TOKENS);
        }
    }
}
