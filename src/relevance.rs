//! Relevance formulas, written plainly: the specification that the scan's kernels must match.
//! Heat never appears here; relevance decides order, heat decides visibility elsewhere.

use crate::dictionary::stats::FrequencyStats;
use crate::types::TermId;

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
        row: &[(TermId, u32)],
        row_len: u64,
        mean_len: f32,
    ) -> f32 {
        let norm = self.k1 * (1.0 - self.b + self.b * row_len as f32 / mean_len.max(f32::EPSILON));
        let (mut qi, mut ri, mut score) = (0, 0, 0f32);
        while qi < query.len() && ri < row.len() {
            match query[qi].0.cmp(&row[ri].0) {
                std::cmp::Ordering::Less => qi += 1,
                std::cmp::Ordering::Greater => ri += 1,
                std::cmp::Ordering::Equal => {
                    let tf = row[ri].1 as f32;
                    score += idf[qi] * tf * (self.k1 + 1.0) / (tf + norm);
                    qi += 1;
                    ri += 1;
                }
            }
        }
        score
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
