//! Relevance formulas, written plainly: the specification that the scan's kernels must match.
//! Heat never appears here; relevance decides order, heat decides visibility elsewhere.

use crate::dictionary::stats::FrequencyStats;
use crate::types::TermId;

/// A row's distinct term and its count, however the row holds it.
pub trait TermCount {
    fn term(&self) -> TermId;
    fn count(&self) -> u32;
}

impl TermCount for (TermId, u32) {
    fn term(&self) -> TermId {
        self.0
    }
    fn count(&self) -> u32 {
        self.1
    }
}

/// Okapi BM25 parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bm25 {
    /// Term-frequency saturation.
    pub k1: f32,
    /// Length normalisation.
    pub b: f32,
}

impl Bm25 {
    /// The textbook setting (k1 = 1.2, b = 0.75).
    pub const STANDARD: Self = Self { k1: 1.2, b: 0.75 };

    /// A row's length term, `k1 · (1 − b + b · row_len / mean_len)`.
    #[inline]
    pub fn norm(&self, row_len: u64, mean_len: f32) -> f32 {
        self.k1 * (1.0 - self.b + self.b * row_len as f32 / mean_len.max(f32::EPSILON))
    }

    /// One matched term's share of the score: `idf · tf · (k1 + 1) / (tf + norm)`.
    #[inline]
    pub fn term_score(&self, idf: f32, tf: f32, norm: f32) -> f32 {
        idf * tf * (self.k1 + 1.0) / (tf + norm)
    }

    /// Inverse document frequency under the shared statistic, `ln(1 + (N − df + ½)/(df + ½))`:
    /// never negative, so a term in most rows still scores a little.
    pub fn idf(stats: &impl FrequencyStats, term: TermId) -> f32 {
        let n = stats.rows() as f64;
        let df = stats.term_rows(term) as f64;
        (1.0 + (n - df + 0.5) / (df + 0.5)).ln() as f32
    }

    /// BM25 of one row for a query. `query` and `row` are distinct terms with counts, both
    /// sorted by term id; each distinct query term counts once. `idf` holds the query terms'
    /// IDF in the same order as `query` (computed once per query), `mean_len` the corpus's mean
    /// row length in terms.
    pub fn score(
        &self,
        query: &[(TermId, u32)],
        idf: &[f32],
        row: &[impl TermCount],
        row_len: u64,
        mean_len: f32,
    ) -> f32 {
        let norm = self.norm(row_len, mean_len);
        let (mut qi, mut ri, mut score) = (0, 0, 0f32);
        while qi < query.len() && ri < row.len() {
            match query[qi].0.cmp(&row[ri].term()) {
                std::cmp::Ordering::Less => qi += 1,
                std::cmp::Ordering::Greater => ri += 1,
                std::cmp::Ordering::Equal => {
                    let tf = row[ri].count() as f32;
                    score += self.term_score(idf[qi], tf, norm);
                    qi += 1;
                    ri += 1;
                }
            }
        }
        score
    }
}

/// A query's distinct terms laid out for scoring many rows: a 256-bit filter and an
/// open-addressing table from term id to the term's position in the query. BM25 through it
/// ([`QueryTerms::bm25`]) visits the row's terms in id order and adds each matched term where
/// the merge of [`Bm25::score`] adds it, so the two agree bit for bit; it spends a multiply and
/// a bit test on most row terms instead of a branch per step of a merge.
#[derive(Debug, Clone)]
struct QueryTerms {
    filter: [u64; 4],
    /// `(term id, position + 1)`; 0 marks an empty slot.
    table: Vec<(u64, u32)>,
    shift: u32,
}

/// The multiplier of the query-term hash.
const TERM_HASH: u64 = 0x9E37_79B9_7F4A_7C15;

impl QueryTerms {
    fn new(terms: &[(TermId, u32)]) -> Self {
        let slots = (2 * terms.len()).next_power_of_two().max(2);
        let shift = 64 - slots.trailing_zeros();
        let mut lookup = Self {
            filter: [0; 4],
            table: vec![(0, 0); slots],
            shift,
        };
        for (position, &(term, _)) in terms.iter().enumerate() {
            let hash = term.0.wrapping_mul(TERM_HASH);
            let bit = (hash >> 56) as usize;
            lookup.filter[bit / 64] |= 1 << (bit % 64);
            let mut slot = (hash >> lookup.shift) as usize;
            while lookup.table[slot].1 != 0 {
                slot = (slot + 1) & (slots - 1);
            }
            lookup.table[slot] = (term.0, position as u32 + 1);
        }
        lookup
    }

    /// The query position of `term`, if the query has it.
    #[inline]
    fn position(&self, term: TermId) -> Option<usize> {
        let hash = term.0.wrapping_mul(TERM_HASH);
        let bit = (hash >> 56) as usize;
        if self.filter[bit / 64] & (1 << (bit % 64)) == 0 {
            return None;
        }
        let mask = self.table.len() - 1;
        let mut slot = (hash >> self.shift) as usize;
        loop {
            let (id, position) = self.table[slot];
            if position == 0 {
                return None;
            }
            if id == term.0 {
                return Some(position as usize - 1);
            }
            slot = (slot + 1) & mask;
        }
    }

    /// [`Bm25::score`] of `row` for the query these terms were built from.
    fn bm25(
        &self,
        bm25: &Bm25,
        idf: &[f32],
        row: &[impl TermCount],
        row_len: u64,
        mean_len: f32,
    ) -> f32 {
        let norm = bm25.norm(row_len, mean_len);
        let mut score = 0f32;
        for entry in row {
            if let Some(q) = self.position(entry.term()) {
                let tf = entry.count() as f32;
                score += bm25.term_score(idf[q], tf, norm);
            }
        }
        score
    }
}

/// The BM25 of the hybrid's lexical part: quicker saturation and milder length normalisation
/// than [`Bm25::STANDARD`] (which the evaluation's baseline keeps). Chat turns are short and a
/// second occurrence of a word in one says little more than the first; chosen with the dense
/// weight ([`crate::dictionary::DEFAULT_DENSE_WEIGHT`]).
pub const HYBRID_BM25: Bm25 = Bm25 { k1: 0.9, b: 0.3 };

/// The share of a query term's IDF that the first pass's estimate counts when a row's lexical
/// signature holds the term ([`crate::arena::signature`]). A match is right most of the time
/// (about one false match in sixty on rows of thirty terms), but it says nothing of how often
/// the term occurs. It shapes stage one's ranking only, never a score.
pub const SIGNATURE_MATCH_SHARE: f32 = 1.0;

/// The share of a query stop word's IDF that the first pass's estimate counts for every row:
/// signatures leave stop words out, and a stop word is in about half of the rows.
pub const STOP_WORD_SHARE: f32 = 0.5;

/// The share of an IDF the first pass's estimate counts for a query term: [`STOP_WORD_SHARE`]
/// for a stop word, else [`SIGNATURE_MATCH_SHARE`] where the signature holds the term.
pub fn signature_share(stop_word: bool) -> f32 {
    if stop_word {
        STOP_WORD_SHARE
    } else {
        SIGNATURE_MATCH_SHARE
    }
}

/// The exact score of a row on its own for one query (the final order reads it in context,
/// [`in_context`]): `w · cosine + (1 − w) · BM25 / BM25_max`, where `w` is the table's dense
/// weight ([`crate::dictionary::Dictionary::dense_weight`]) and `BM25_max = Σ idf · (k1 + 1)`
/// bounds the query's BM25 from above.
/// Both parts are normalised by the query alone, never by the candidate set, so a row's score
/// does not depend on which other rows were scored: a two-stage search and a brute-force one
/// agree whenever the first stage kept the right rows.
#[derive(Debug, Clone)]
pub struct HybridScorer {
    terms: Vec<(TermId, u32)>,
    lookup: QueryTerms,
    idf: Vec<f32>,
    bm25_max: f32,
    mean_len: f32,
    query_vector: Vec<f32>,
    /// The dense part's share of the score.
    dense_weight: f32,
    /// [`HybridScorer::estimate_lexical_part`] as `matched · lexical / (base + slope · len)`:
    /// the constants of the query, so a scan of many rows divides once per row.
    estimate_lexical: f32,
    estimate_len_base: f32,
    estimate_len_slope: f32,
}

impl HybridScorer {
    /// A scorer for the query with `terms` and unit `query_vector` under `stats`, the dense
    /// part weighted `dense_weight`.
    pub fn new(
        terms: &[(TermId, u32)],
        query_vector: Vec<f32>,
        stats: &impl FrequencyStats,
        dense_weight: f32,
    ) -> Self {
        Self::weighted(
            terms,
            &vec![1.0; terms.len()],
            query_vector,
            stats,
            dense_weight,
        )
    }

    /// [`HybridScorer::new`] with each term's IDF scaled by its weight in `weights` (in term
    /// order): a term weighted 0.3 counts for 0.3 of what it would alone, in the score, its
    /// bound `BM25_max` and the first pass's estimate alike.
    pub fn weighted(
        terms: &[(TermId, u32)],
        weights: &[f32],
        query_vector: Vec<f32>,
        stats: &impl FrequencyStats,
        dense_weight: f32,
    ) -> Self {
        debug_assert_eq!(terms.len(), weights.len());
        let idf: Vec<f32> = terms
            .iter()
            .zip(weights)
            .map(|(&(t, _), w)| w * Bm25::idf(stats, t))
            .collect();
        let bm25_max = idf.iter().sum::<f32>() * (HYBRID_BM25.k1 + 1.0);
        let mean_len = mean_row_len(stats);
        let Bm25 { k1, b } = HYBRID_BM25;
        let mut scorer = Self {
            terms: terms.to_vec(),
            lookup: QueryTerms::new(terms),
            idf,
            bm25_max,
            mean_len,
            query_vector,
            dense_weight,
            estimate_lexical: 0.0,
            estimate_len_base: 1.0 + k1 * (1.0 - b),
            estimate_len_slope: k1 * b / mean_len.max(f32::EPSILON),
        };
        scorer.estimate_lexical = scorer.lexical_factor() * (k1 + 1.0);
        scorer
    }

    /// The query's terms' IDFs, in term order.
    pub fn idf(&self) -> &[f32] {
        &self.idf
    }

    /// The query's terms, sorted by id.
    pub fn terms(&self) -> &[(TermId, u32)] {
        &self.terms
    }

    /// The lexical part of the first pass's cheap estimate of [`HybridScorer::score`], from
    /// `matched_idf`, the IDF sum of the query terms the row may hold, each at its share
    /// ([`signature_share`]), scored as if each occurred once in a row of `row_len` terms
    /// (`idf · (k1 + 1) / (1 + k1 · (1 − b + b · row_len / mean_len))`). The estimate is
    /// [`HybridScorer::dense_part`] of an estimated cosine plus this, kept apart so a later
    /// stage can swap in a better cosine without the row's lexical facts.
    #[inline]
    pub fn estimate_lexical_part(&self, matched_idf: f32, row_len: u32) -> f32 {
        self.estimate_lexical * matched_idf
            / (self.estimate_len_base + self.estimate_len_slope * row_len as f32)
    }

    /// The factor turning a BM25 sum into the lexical part of the score.
    fn lexical_factor(&self) -> f32 {
        if self.bm25_max > 0.0 {
            (1.0 - self.dense_weight) / self.bm25_max
        } else {
            0.0
        }
    }

    /// The dense part of the score for a cosine.
    #[inline]
    pub fn dense_part(&self, cosine: f32) -> f32 {
        self.dense_weight * cosine
    }

    /// The score of a row with `terms` (`term_len` in all) and unit vector `vector`.
    pub fn score(&self, terms: &[impl TermCount], term_len: u64, vector: &[f32]) -> f32 {
        self.score_with_cosine(terms, term_len, dot(&self.query_vector, vector))
    }

    /// The score of a row with `terms` (`term_len` in all) whose cosine to the query is
    /// `cosine` (exact or estimated).
    pub fn score_with_cosine(&self, terms: &[impl TermCount], term_len: u64, cosine: f32) -> f32 {
        let lexical = if self.bm25_max > 0.0 {
            self.lookup
                .bm25(&HYBRID_BM25, &self.idf, terms, term_len, self.mean_len)
                / self.bm25_max
        } else {
            0.0
        };
        self.dense_part(cosine) + (1.0 - self.dense_weight) * lexical
    }
}

/// Shares of the gap to a more relevant earlier turn of the same conversation that a row's
/// score takes, nearest first. A conversation's turns are read in context: the turn that
/// answers a question rarely repeats the question's words, the turn before it (the question
/// asked, the topic raised) often does.
pub const CONTEXT_BEFORE: [f32; 2] = [0.5, 0.25];
/// The same for later turns, nearest first: a turn followed by a closely matching one is
/// often what that one answers or continues.
pub const CONTEXT_AFTER: [f32; 1] = [0.25];

/// The shares of later turns for a row with no earlier turn to read (a conversation's
/// opening): the earlier turns' shares mirrored onto the later ones, so the opening reads as
/// much context as any other row. The turn that answers an opening echoes it as an answer
/// echoes its question; with the later side's share alone an opening scored as if its
/// context were missing, and openings hold a conversation's request (on RealMem 53% of the
/// evidence turns open their session, where one turn in seven opens one; on LoCoMo 14%, where
/// one turn in 22 does; `docs/journal/benchmarks.md`).
pub const OPENING_AFTER: [f32; 2] = [CONTEXT_AFTER[0] + CONTEXT_BEFORE[0], CONTEXT_BEFORE[1]];

const _: () = assert!(
    CONTEXT_BEFORE[0] + CONTEXT_BEFORE[1] + CONTEXT_AFTER[0] <= 1.0
        && OPENING_AFTER[0] + OPENING_AFTER[1] <= 1.0,
    "the shares sum to at most one, so a row's score in context never passes its best neighbour's"
);

/// A row's score in context: its own score `own`, lifted towards each neighbour in its
/// conversation that scores higher by that neighbour's share ([`CONTEXT_BEFORE`],
/// [`CONTEXT_AFTER`], or [`OPENING_AFTER`] where `before` is empty) of the gap. `before` and
/// `after` hold the neighbours' own scores, nearest first (shorter at a conversation's ends;
/// extra ones are ignored). Never below `own`; since the shares sum to at most one, never
/// above the best of `own` and the neighbours' scores, so a row can only enter a ranking next
/// to a row that scores at least as high on its own.
pub fn in_context(own: f32, before: &[f32], after: &[f32]) -> f32 {
    let lift = |shares: &[f32], scores: &[f32]| -> f32 {
        shares
            .iter()
            .zip(scores)
            .map(|(share, score)| share * (score - own).max(0.0))
            .sum()
    };
    own + lift(&CONTEXT_BEFORE, before) + lift(after_shares(before.len()), after)
}

/// The shares of the later turns for a row that reads `before` earlier ones.
pub fn after_shares(before: usize) -> &'static [f32] {
    if before == 0 {
        &OPENING_AFTER
    } else {
        &CONTEXT_AFTER
    }
}

/// Mean row length in terms under `stats` (1 for an empty corpus).
pub fn mean_row_len(stats: &impl FrequencyStats) -> f32 {
    if stats.rows() == 0 {
        1.0
    } else {
        (stats.total_terms() as f64 / stats.rows() as f64) as f32
    }
}

/// Dot product of two equally long f32 vectors (cosine for unit vectors).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dictionary::lexical::term_id;
    use proptest::prelude::*;

    proptest! {
        /// The first pass's estimate is the formula it documents, `dense_part(cosine) +
        /// lexical_factor · matched · idf-free BM25 of one occurrence`, within f32 rounding.
        #[test]
        fn estimate_is_one_occurrence_of_each_matched_term(
            cosine in -1.0f32..1.0,
            matched in 0.0f32..40.0,
            row_len in 0u32..500,
            rows in 1u64..1_000_000,
            mean_len in 1u64..60,
            df in proptest::collection::vec(1u64..1000, 1..12),
        ) {
            use crate::dictionary::stats::{Count, FrequencyTable};
            let mut stats = FrequencyTable::default();
            stats.set(Count::Rows, rows);
            stats.set(Count::TotalTerms, rows * mean_len);
            let terms: Vec<(TermId, u32)> = (0..df.len() as u64).map(|t| (TermId(t + 1), 1)).collect();
            for (&(term, _), &df) in terms.iter().zip(&df) {
                stats.set(Count::TermRows(term), df.min(rows));
            }
            let scorer = HybridScorer::new(
                &terms,
                vec![0.0; 4],
                &stats,
                crate::dictionary::DEFAULT_DENSE_WEIGHT,
            );
            let bm25 = HYBRID_BM25;
            let once = bm25.term_score(1.0, 1.0, bm25.norm(u64::from(row_len), mean_row_len(&stats)));
            let textbook = scorer.dense_part(cosine) + scorer.lexical_factor() * matched * once;
            let estimate = scorer.dense_part(cosine) + scorer.estimate_lexical_part(matched, row_len);
            prop_assert!((estimate - textbook).abs() <= 1e-5 * textbook.abs().max(1.0), "{} vs {}", estimate, textbook);
        }

        /// The lookup BM25 equals the merge (the specification) bit for bit, on queries and rows
        /// drawn from a small vocabulary so they share terms.
        #[test]
        fn lookup_bm25_is_the_merge(
            query in proptest::collection::btree_map(0u64..60, 1u32..3, 0..40),
            row in proptest::collection::btree_map(0u64..60, 1u32..6, 0..50),
            idf in proptest::collection::vec(0.01f32..9.0, 40),
            mean_len in 1.0f32..40.0,
        ) {
            let spread = |m: std::collections::BTreeMap<u64, u32>| {
                let mut v: Vec<(TermId, u32)> =
                    m.into_iter().map(|(t, c)| (TermId(t.wrapping_mul(0x2545_F491_4F6C_DD1D)), c)).collect();
                v.sort();
                v
            };
            let (query, row) = (spread(query), spread(row));
            let row_len: u64 = row.iter().map(|&(_, c)| u64::from(c)).sum();
            let idf = &idf[..query.len()];
            let merge = Bm25::STANDARD.score(&query, idf, &row, row_len, mean_len);
            let lookup = QueryTerms::new(&query).bm25(&Bm25::STANDARD, idf, &row, row_len, mean_len);
            prop_assert_eq!(merge.to_bits(), lookup.to_bits());
        }
    }

    proptest! {
        /// A row's score in context is never below its own and never above the best of its
        /// own and its neighbours' (the shares sum to at most one), whatever the neighbours.
        #[test]
        fn context_lifts_within_the_neighbours(
            own in -1.0f32..2.0,
            before in proptest::collection::vec(-1.0f32..2.0, 0..4),
            after in proptest::collection::vec(-1.0f32..2.0, 0..3),
        ) {
            let lifted = in_context(own, &before, &after);
            let best = before.iter().chain(&after).fold(own, |m, &s| m.max(s));
            prop_assert!(lifted >= own);
            prop_assert!(lifted <= best + 1e-6, "{lifted} > {best}");
        }

        /// A better neighbour never lowers the score in context.
        #[test]
        fn context_is_monotone_in_the_neighbours(
            own in -1.0f32..2.0,
            before in proptest::collection::vec(-1.0f32..2.0, 2),
            after in -1.0f32..2.0,
            raise in 0.0f32..1.0,
            which in 0usize..3,
        ) {
            let (mut b, mut a) = (before.clone(), vec![after]);
            match which {
                0 | 1 => b[which] += raise,
                _ => a[0] += raise,
            }
            prop_assert!(in_context(own, &b, &a) >= in_context(own, &before, &[after]));
        }
    }

    #[test]
    fn context_matches_hand_computation() {
        // Previous turn 0.9 (share 0.5), the one before 0.2 (below own: nothing), next 0.6
        // (share 0.25): 0.4 + 0.5 · 0.5 + 0.25 · 0.2.
        let lifted = in_context(0.4, &[0.9, 0.2], &[0.6]);
        assert!((lifted - (0.4 + 0.25 + 0.05)).abs() < 1e-6, "{lifted}");
        assert_eq!(in_context(0.4, &[], &[]), 0.4);
        assert_eq!(in_context(0.4, &[0.1, 0.3], &[0.0]), 0.4);
        // An opening: the next turn 0.6 at 0.75, the one after 0.8 at 0.25.
        let opening = in_context(0.4, &[], &[0.6, 0.8]);
        assert!((opening - (0.4 + 0.15 + 0.1)).abs() < 1e-6, "{opening}");
        // With an earlier turn, the second later one is not read.
        let inner = in_context(0.4, &[0.0], &[0.6, 0.8]);
        assert!((inner - (0.4 + 0.05)).abs() < 1e-6, "{inner}");
    }

    #[test]
    fn bm25_matches_hand_computation() {
        let t = |w| term_id(w);
        let mut query = vec![(t("cat"), 1), (t("dog"), 1)];
        query.sort();
        let idf: Vec<f32> = query
            .iter()
            .map(|(id, _)| if *id == t("cat") { 2.0 } else { 1.0 })
            .collect();
        let mut row = vec![(t("cat"), 2), (t("fish"), 1)];
        row.sort();
        let bm = Bm25::STANDARD;
        // row_len 3, mean 3: norm = k1; cat: 2 · 2 · 2.2 / (2 + 1.2)
        let expected = 2.0 * 2.0 * 2.2 / (2.0 + 1.2);
        assert!((bm.score(&query, &idf, &row, 3, 3.0) - expected).abs() < 1e-5);
    }
}
