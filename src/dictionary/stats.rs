//! The shared frequency statistic that representations are weighted by at score time.
//!
//! One statistic covers the whole pooled memory (every user's rows). The store keeps it
//! durable; this module states what it is and offers an in-memory table for pure code,
//! tools and tests. Counts only ever change by whole rows, so they are integers.

use std::collections::HashMap;

use crate::types::{TermId, TokenId};

use super::derive::RetrievalRow;

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

/// Counts held in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrequencyTable {
    tokens: HashMap<TokenId, u64>,
    terms: HashMap<TermId, u64>,
    total_tokens: u64,
    total_terms: u64,
    rows: u64,
}

impl FrequencyTable {
    /// Count one row in.
    pub fn add(&mut self, row: &RetrievalRow) {
        for &(token, count) in &row.tokens {
            *self.tokens.entry(token).or_default() += u64::from(count);
        }
        for &(term, _) in &row.terms {
            *self.terms.entry(term).or_default() += 1;
        }
        self.total_tokens += u64::from(row.token_len);
        self.total_terms += row.term_len();
        self.rows += 1;
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
            Count::Token(token) => slot(&mut self.tokens, token, value),
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
        let mut tokens: Vec<_> = self
            .tokens
            .iter()
            .map(|(&t, &v)| (Count::Token(t), v))
            .collect();
        tokens.sort_unstable();
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

impl FrequencyStats for FrequencyTable {
    fn token_count(&self, token: TokenId) -> u64 {
        self.tokens.get(&token).copied().unwrap_or(0)
    }
    fn total_tokens(&self) -> u64 {
        self.total_tokens
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
