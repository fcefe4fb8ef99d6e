//! Top-k selection with a deterministic merge.
//!
//! Order is score descending, then row id ascending: a total order, so the k best of a set are
//! one well-defined list. Each worker keeps its own [`TopK`] over the blocks it scores; the
//! partial lists are merged once. Because the global k best always lie in the union of the
//! partial k-best lists under the same total order, the result is identical for any split of
//! the blocks and any number of threads.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

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

/// Heap entry ordered so the heap's top is the worst kept hit.
#[derive(Debug, Clone, Copy)]
struct Worst(Hit);

impl PartialEq for Worst {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Worst {}
impl PartialOrd for Worst {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Worst {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.rank_cmp(&other.0)
    }
}

/// The k best hits pushed so far.
#[derive(Debug, Clone)]
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Worst>,
}

impl TopK {
    pub fn new(k: usize) -> Self {
        Self {
            k,
            // Grown on demand: a scan makes one per task, and most tasks see few rows.
            heap: BinaryHeap::with_capacity((k + 1).min(INITIAL_CAPACITY)),
        }
    }

    /// Offer one hit; kept only if it ranks among the k best so far.
    #[inline]
    pub fn push(&mut self, hit: Hit) {
        if self.heap.len() < self.k {
            self.heap.push(Worst(hit));
        } else if let Some(worst) = self.heap.peek()
            && hit.rank_cmp(&worst.0) == Ordering::Less
        {
            self.heap.pop();
            self.heap.push(Worst(hit));
        }
    }

    /// The worst kept hit once k hits are kept: a hit that does not rank before it cannot
    /// enter, so a scan may skip it without calling [`TopK::push`].
    #[inline]
    pub fn threshold(&self) -> Option<Hit> {
        if self.heap.len() < self.k {
            None
        } else {
            self.heap.peek().map(|w| w.0)
        }
    }

    /// Fold another partial result in: both lists together, the k best selected in linear
    /// time and heapified (pushing one list into the other would cost k·log k per merge, and a
    /// scan merges once per task).
    pub fn merge(self, other: TopK) -> TopK {
        let k = self.k;
        let mut all = self.heap.into_vec();
        all.extend(other.heap.into_vec());
        if all.len() > k {
            if k == 0 {
                all.clear();
            } else {
                all.select_nth_unstable_by(k - 1, |a, b| a.0.rank_cmp(&b.0));
                all.truncate(k);
            }
        }
        TopK {
            k,
            heap: BinaryHeap::from(all),
        }
    }

    /// The kept hits, best first.
    pub fn into_sorted(self) -> Vec<Hit> {
        let mut hits: Vec<Hit> = self.heap.into_iter().map(|Worst(h)| h).collect();
        hits.sort_by(Hit::rank_cmp);
        hits
    }
}

/// The k best hits over `blocks` blocks, scored by `score_block(block, &mut top)` on the current
/// rayon pool (each task keeps its own [`TopK`]; partial results are merged once). The result is
/// the same for any number of threads.
pub fn parallel_top_k<F>(blocks: usize, k: usize, score_block: F) -> Vec<Hit>
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
        .into_sorted()
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
    fn threshold_is_the_worst_kept_hit_once_full() {
        let mut top = TopK::new(2);
        let hit = |score, row| Hit {
            score,
            row: RowId(row),
        };
        top.push(hit(1.0, 5));
        assert_eq!(top.threshold(), None);
        top.push(hit(3.0, 9));
        assert_eq!(top.threshold(), Some(hit(1.0, 5)));
        top.push(hit(1.0, 4)); // same score, lower row id: ranks before row 5
        assert_eq!(top.threshold(), Some(hit(1.0, 4)));
        top.push(hit(1.0, 6)); // ties the worst but ranks after it: not kept
        assert_eq!(top.into_sorted(), [hit(3.0, 9), hit(1.0, 4)]);
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
                });
                prop_assert_eq!(&got, &expected, "{} threads", threads);
            }
        }
    }
}
