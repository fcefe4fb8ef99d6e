//! Top-k selection with a deterministic merge.
//!
//! Order is score descending, then row id ascending: a total order, so the k best of a set are
//! one well-defined list. Each worker keeps its own [`TopK`] over the blocks it scores; the
//! partial lists are merged once. Because the global k best always lie in the union of the
//! partial k-best lists under the same total order, the result is identical for any split of
//! the blocks and any number of threads.

use std::cmp::Ordering;

use rayon::prelude::*;

use crate::types::RowId;

/// Hits a new [`TopK`] has room for before it grows.
const INITIAL_CAPACITY: usize = 256;

/// A scored row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    pub score: f32,
    pub row: RowId,
}

impl Hit {
    /// The result order: higher score first, then lower row id. Scores are never NaN
    /// (`total_cmp` keeps the order total even if one were).
    pub fn rank_cmp(&self, other: &Self) -> Ordering {
        other
            .score
            .total_cmp(&self.score)
            .then(self.row.cmp(&other.row))
    }
}

/// The k best hits pushed so far, kept as a selection buffer: hits are appended, and whenever
/// the buffer reaches 2k the k best are selected in linear time (`select_nth_unstable_by`) and
/// the rest dropped. A push costs amortised O(1) whatever k is, which matters when a first
/// pass keeps tens of thousands of candidates; a heap would pay log k on every entry.
#[derive(Debug, Clone)]
pub struct TopK {
    k: usize,
    hits: Vec<Hit>,
    /// The worst hit kept by the last selection: nothing that ranks after it can enter.
    bound: Option<Hit>,
}

impl TopK {
    pub fn new(k: usize) -> Self {
        Self {
            k,
            // Grown on demand: a scan makes one per task, and most tasks see few rows.
            hits: Vec::with_capacity((2 * k).min(INITIAL_CAPACITY)),
            bound: None,
        }
    }

    /// Offer one hit; kept only if it can still rank among the k best.
    #[inline]
    pub fn push(&mut self, hit: Hit) {
        if self.k == 0 {
            return;
        }
        if let Some(bound) = self.bound
            && hit.rank_cmp(&bound) != Ordering::Less
        {
            return;
        }
        self.hits.push(hit);
        if self.hits.len() >= 2 * self.k {
            self.select();
        }
    }

    /// Keep the k best of the buffer and remember the worst of them.
    fn select(&mut self) {
        if self.hits.len() > self.k {
            self.hits.select_nth_unstable_by(self.k - 1, Hit::rank_cmp);
            self.hits.truncate(self.k);
        }
        if self.hits.len() == self.k {
            self.bound = self.hits.iter().copied().max_by(Hit::rank_cmp);
        }
    }

    /// A hit that does not rank before this one cannot enter (once one is known: after the
    /// first selection). A scan may skip such hits without calling [`TopK::push`].
    #[inline]
    pub fn threshold(&self) -> Option<Hit> {
        self.bound
    }

    /// Fold another partial result in: both buffers together, then one selection.
    pub fn merge(mut self, other: TopK) -> TopK {
        self.hits.extend(other.hits);
        self.bound = None;
        self.select();
        self
    }

    /// The k best hits, best first.
    pub fn into_sorted(mut self) -> Vec<Hit> {
        self.select();
        self.hits.sort_by(Hit::rank_cmp);
        self.hits
    }

    /// The k best hits in row id order (for a pass that reads them back from the arena, where
    /// a user's rows lie in row id order).
    pub fn into_row_order(mut self) -> Vec<Hit> {
        self.select();
        self.hits.sort_unstable_by_key(|h| h.row);
        self.hits
    }
}

/// The k best hits over `blocks` blocks, scored by `score_block(block, &mut top)` on the current
/// rayon pool (each task keeps its own [`TopK`]; partial results are merged once). The result is
/// the same for any number of threads.
pub fn parallel_top_k<F>(blocks: usize, k: usize, score_block: F) -> TopK
where
    F: Fn(usize, &mut TopK) + Sync,
{
    (0..blocks)
        .into_par_iter()
        .fold(
            || TopK::new(k),
            |mut top, block| {
                score_block(block, &mut top);
                top
            },
        )
        .reduce(|| TopK::new(k), TopK::merge)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn brute_force(scores: &[f32], k: usize) -> Vec<Hit> {
        let mut hits: Vec<Hit> = scores
            .iter()
            .enumerate()
            .map(|(i, &score)| Hit {
                score,
                row: RowId(i as u64),
            })
            .collect();
        hits.sort_by(Hit::rank_cmp);
        hits.truncate(k);
        hits
    }

    #[test]
    fn threshold_is_the_worst_kept_hit_after_a_selection() {
        let mut top = TopK::new(2);
        let hit = |score, row| Hit {
            score,
            row: RowId(row),
        };
        top.push(hit(1.0, 5));
        top.push(hit(3.0, 9));
        assert_eq!(top.threshold(), None, "no selection yet");
        top.push(hit(1.0, 4)); // same score, lower row id: ranks before row 5
        top.push(hit(0.5, 1)); // fourth hit: the buffer holds 2k, so the two best are selected
        assert_eq!(top.threshold(), Some(hit(1.0, 4)));
        top.push(hit(1.0, 6)); // ties the bound but ranks after it: not kept
        top.push(hit(2.0, 7));
        assert_eq!(top.into_sorted(), [hit(3.0, 9), hit(2.0, 7)]);
    }

    proptest! {
        /// Any split into blocks and any thread count give exactly the brute-force list, ties
        /// (frequent here: scores are drawn from a few values) broken by row id.
        #[test]
        fn parallel_top_k_is_exact_and_deterministic(
            scores in proptest::collection::vec(prop_oneof![Just(0.5f32), Just(1.0), Just(-2.0), -5.0f32..5.0], 0..400),
            k in 0usize..40,
            block_rows in 1usize..50,
        ) {
            let expected = brute_force(&scores, k);
            let blocks = scores.len().div_ceil(block_rows);
            for threads in [1, 2, 4, 16] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let got = pool.install(|| {
                    parallel_top_k(blocks, k, |b, top| {
                        let end = ((b + 1) * block_rows).min(scores.len());
                        for (i, &score) in scores.iter().enumerate().take(end).skip(b * block_rows) {
                            top.push(Hit { score, row: RowId(i as u64) });
                        }
                    })
                    .into_sorted()
                });
                prop_assert_eq!(&got, &expected, "{} threads", threads);
            }
        }
    }
}
