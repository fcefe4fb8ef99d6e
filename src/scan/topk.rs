//! Top-k selection with a deterministic merge.
//!
//! Order is score descending, then key ascending: a total order, so the k best of a set are
//! one well-defined list. Each worker keeps its own [`TopK`] over the blocks it scores; the
//! partial lists are merged once. Because the global k best always lie in the union of the
//! partial k-best lists under the same total order, the result is identical for any split of
//! the blocks and any number of threads.
//!
//! The workers of one [`parallel_top_k`] share a floor ([`SharedFloor`]): a score that k hits
//! the workers hold reach. A hit scoring strictly below it cannot be among the k best, so no
//! worker keeps it; without it each worker would keep its first 2k hits whatever they scored.

use std::cmp::Ordering;
use std::sync::atomic::{AtomicU32, Ordering as MemoryOrdering};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

/// Hits a new [`TopK`] has room for before it grows.
const INITIAL_CAPACITY: usize = 256;
/// Hits a sharing [`TopK`] takes in at least between two publications of its share: each costs
/// a linear selection over its buffer.
const SHARE_STEP_MIN: usize = 64;

/// A scored row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    pub score: f32,
    /// A part of `score` the caller carries to a later stage (stage one: the lexical part of
    /// its estimate; stage two's narrowing: the int8 cosine); never compared. It fills what
    /// would be padding: a hit is 16 bytes either way.
    pub carried: f32,
    /// The row, as the caller names it: the search names a row by where the arena holds it
    /// ([`crate::arena::Slot::key`], so no stage reads a row id until the results), a test
    /// by its row id. Of two equal scores the lower key ranks first.
    pub key: u64,
}

const _: () = assert!(std::mem::size_of::<Hit>() == 16);

impl Hit {
    /// The result order: higher score first, then lower key. Scores are never NaN
    /// (`total_cmp` keeps the order total even if one were).
    pub fn rank_cmp(&self, other: &Self) -> Ordering {
        other
            .score
            .total_cmp(&self.score)
            .then(self.key.cmp(&other.key))
    }
}

/// The floor the workers of one [`parallel_top_k`] share: a hit scoring strictly below it
/// cannot rank among the k best. Two claims raise it, each about hits the workers hold to the
/// end (a worker drops a kept hit only for a better one, and keeps at least its k best):
/// - one worker's k-th best: that worker alone holds k hits scoring at least it;
/// - the `parts`-th highest of the workers' shares, a worker's share being its
///   `⌈k / parts⌉`-th best: those `parts` workers together hold k hits scoring at least it.
///
/// The first waits until one worker has kept k hits; the second rises once every worker has
/// seen a few times `k / parts` rows. Where k is a large part of each worker's rows (a first
/// pass at a million rows keeps 16,000, a sixteenth of the rows is 62,500), the first leaves
/// most rows offered and merged, the second few (`docs/journal/benchmarks.md`). A hit scoring exactly
/// the floor may still win a tie on its key, and is kept.
#[derive(Debug)]
pub struct SharedFloor {
    floor: AtomicU32,
    /// Each worker's share (order keys; negative infinity until it publishes one).
    shares: Box<[AtomicU32]>,
    /// How many shares hold k hits together.
    parts: usize,
}

impl SharedFloor {
    /// A floor for the lists of `slots` workers, any `parts` of whose shares hold k hits.
    pub fn new(slots: usize, parts: usize) -> Self {
        let unknown = || AtomicU32::new(order_key(f32::NEG_INFINITY));
        Self {
            floor: unknown(),
            shares: (0..slots).map(|_| unknown()).collect(),
            parts: parts.max(1),
        }
    }

    /// The floor now (negative infinity until a worker publishes one).
    #[inline]
    pub fn get(&self) -> f32 {
        from_order_key(self.floor.load(MemoryOrdering::Relaxed))
    }

    /// Raise the floor to `score` if that is higher.
    fn raise(&self, score: f32) {
        self.floor
            .fetch_max(order_key(score), MemoryOrdering::Relaxed);
    }

    /// The rank of a worker's share among its hits.
    fn share_rank(&self, k: usize) -> usize {
        k.div_ceil(self.parts)
    }

    /// Publish that worker `slot` holds [`Self::share_rank`] hits scoring at least `score`, and
    /// raise the floor to the `parts`-th highest share.
    fn share(&self, slot: usize, score: f32) {
        self.shares[slot].fetch_max(order_key(score), MemoryOrdering::Relaxed);
        let mut keys: Vec<u32> = self
            .shares
            .iter()
            .map(|share| share.load(MemoryOrdering::Relaxed))
            .collect();
        keys.sort_unstable_by(|a, b| b.cmp(a));
        if let Some(&key) = keys.get(self.parts - 1) {
            self.raise(from_order_key(key));
        }
    }
}

/// A score's bits mapped so that unsigned order is the scores' order (negative scores have
/// every bit flipped, others the sign bit set).
fn order_key(score: f32) -> u32 {
    let bits = score.to_bits();
    if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    }
}

fn from_order_key(key: u32) -> f32 {
    f32::from_bits(if key >> 31 == 1 {
        key & !(1 << 31)
    } else {
        !key
    })
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
    /// The floor shared with the other workers of the same [`parallel_top_k`], and this list's
    /// slot in it, if any.
    shared: Option<(Arc<SharedFloor>, usize)>,
    /// The buffer's length at which this list next publishes its share.
    next_share: usize,
}

impl TopK {
    pub fn new(k: usize) -> Self {
        Self {
            k,
            // Grown on demand: a scan makes one per worker, and a small scope's see few rows.
            hits: Vec::with_capacity((2 * k).min(INITIAL_CAPACITY)),
            bound: None,
            shared: None,
            next_share: usize::MAX,
        }
    }

    /// A top k that publishes its floor and its share to `shared` as worker `slot`, and drops
    /// what scores below the shared floor.
    pub fn sharing(k: usize, shared: Arc<SharedFloor>, slot: usize) -> Self {
        Self {
            next_share: shared.share_rank(k),
            shared: Some((shared, slot)),
            ..Self::new(k)
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
        if let Some((shared, _)) = &self.shared
            && hit.score < shared.get()
        {
            return;
        }
        self.hits.push(hit);
        if self.hits.len() >= 2 * self.k {
            self.select();
            self.publish_share();
        } else if self.hits.len() >= self.next_share {
            self.publish_share();
        }
    }

    /// Publish this list's share (its `⌈k / parts⌉`-th best) to the shared floor, and when to
    /// publish it next.
    fn publish_share(&mut self) {
        let Some((shared, slot)) = &self.shared else {
            return;
        };
        let rank = shared.share_rank(self.k);
        if self.hits.len() >= rank {
            let (_, nth, _) = self.hits.select_nth_unstable_by(rank - 1, Hit::rank_cmp);
            shared.share(*slot, nth.score);
        }
        self.next_share = self.hits.len() + rank.max(SHARE_STEP_MIN);
    }

    /// Keep the k best of the buffer and remember the worst of them (the selection's k-th).
    fn select(&mut self) {
        if let Some(worst) = self.keep_best() {
            self.bound = Some(worst);
        } else if self.hits.len() == self.k {
            self.bound = self.hits.iter().copied().max_by(Hit::rank_cmp);
        }
        if let (Some((shared, _)), Some(bound)) = (&self.shared, self.bound) {
            shared.raise(bound.score);
        }
    }

    /// Keep the k best of the buffer; the worst of them when a selection was made. A list
    /// read out takes this alone: nothing is pushed after, so it needs no bound.
    fn keep_best(&mut self) -> Option<Hit> {
        if self.hits.len() <= self.k {
            return None;
        }
        let (_, worst, _) = self.hits.select_nth_unstable_by(self.k - 1, Hit::rank_cmp);
        let worst = *worst;
        self.hits.truncate(self.k);
        Some(worst)
    }

    /// A hit that does not rank before this one cannot enter (once one is known: after the
    /// first selection). A scan may skip such hits without calling [`TopK::push`].
    #[inline]
    pub fn threshold(&self) -> Option<Hit> {
        self.bound
    }

    /// A score strictly below this cannot enter, by this top k's own bound or the shared
    /// floor (negative infinity while neither is known). A scan may skip such hits without
    /// calling [`TopK::push`].
    #[inline]
    pub fn floor(&self) -> f32 {
        let own = self.bound.map_or(f32::NEG_INFINITY, |bound| bound.score);
        self.shared
            .as_ref()
            .map_or(own, |(shared, _)| own.max(shared.get()))
    }

    /// Drop the hits scoring strictly below `floor`, a floor of the merge this list goes into
    /// ([`merge_floor`]): each worker's share of a merge's filtering, done where the workers
    /// run.
    pub fn cut_to(&mut self, floor: f32) {
        self.hits.retain(|hit| hit.score >= floor);
    }

    /// Fold another partial result in ([`merged`]).
    pub fn merge(self, other: TopK) -> TopK {
        let k = self.k;
        merged([self, other], k)
    }

    /// The k best hits, best first.
    pub fn into_sorted(mut self) -> Vec<Hit> {
        self.keep_best();
        self.hits.sort_by(Hit::rank_cmp);
        self.hits
    }

    /// The k best hits in key order (for a pass that reads them back from the arena: by slot
    /// key, in the arena's order).
    pub fn into_key_order(mut self) -> Vec<Hit> {
        self.keep_best();
        radix_sort_by_key(&mut self.hits);
        self.hits
    }
}

/// Sort `hits` by key, least significant byte first over the bytes in which their keys
/// differ from the least of them (three passes over the keys of a million-row scope): the
/// first pass's 16,000 candidates sort in a fraction of what a comparison sort takes (half of
/// the merge of sixteen workers' lists; `docs/journal/benchmarks.md`).
fn radix_sort_by_key(hits: &mut Vec<Hit>) {
    let Some(least) = hits.iter().map(|h| h.key).min() else {
        return;
    };
    let span = hits.iter().map(|h| h.key - least).max().unwrap_or(0);
    let bytes = (u64::BITS - span.leading_zeros()).div_ceil(8);
    let mut from = std::mem::take(hits);
    let mut to = vec![
        Hit {
            score: 0.0,
            carried: 0.0,
            key: 0,
        };
        from.len()
    ];
    for byte in 0..bytes {
        let digit = |hit: &Hit| ((hit.key - least) >> (8 * byte) & 0xFF) as usize;
        let mut starts = [0usize; 257];
        for hit in &from {
            starts[digit(hit) + 1] += 1;
        }
        for d in 0..256 {
            starts[d + 1] += starts[d];
        }
        for hit in &from {
            let at = &mut starts[digit(hit)];
            to[*at] = *hit;
            *at += 1;
        }
        std::mem::swap(&mut from, &mut to);
    }
    *hits = from;
}

/// The k best hits over `blocks` blocks, scored by `score_block(block, &mut top)` on the current
/// rayon pool. Each worker thread keeps one [`TopK`] over every block it scores (all of them
/// sharing one [`SharedFloor`]); at the end each list is cut to the merge's floor on the pool
/// ([`TopK::cut_to`]), so the one merge after reads only hits that may rank. The result is the
/// same for any number of threads.
///
/// One list per worker rather than per rayon task: rayon splits a scan into tens of tasks, and
/// with k in the thousands each task's list grew from empty, kept no floor of its own until it
/// held 2k hits, and cost a k-sized merge (a million rows in one scope, two threads: query p50
/// 0.87x with one list per worker; `docs/journal/benchmarks.md`). `score_block` must not wait on rayon
/// work (its worker's list is locked while it runs).
pub fn parallel_top_k<F>(blocks: usize, k: usize, score_block: F) -> TopK
where
    F: Fn(usize, &mut TopK) + Sync,
{
    let workers = rayon::current_num_threads();
    // One list a pool thread and one for a caller outside the pool; the pool's threads' shares
    // hold k hits together.
    let shared = Arc::new(SharedFloor::new(workers + 1, workers));
    let tops: Vec<Mutex<TopK>> = (0..=workers)
        .map(|slot| Mutex::new(TopK::sharing(k, shared.clone(), slot)))
        .collect();
    (0..blocks).into_par_iter().for_each(|block| {
        let worker = rayon::current_thread_index().map_or(workers, |i| i.min(workers));
        let mut top = tops[worker].lock().expect("a worker's top-k lock");
        score_block(block, &mut top);
    });
    let mut tops: Vec<TopK> = tops
        .into_iter()
        .map(|top| top.into_inner().expect("a worker's top-k lock"))
        .collect();
    let floor = merge_floor(&tops);
    tops.par_iter_mut().for_each(|top| top.cut_to(floor));
    merged(tops, k)
}

/// The highest of the floors of `tops` ([`TopK::floor`]): a hit of any of them scoring strictly
/// below it cannot rank among the k best of their union.
pub fn merge_floor(tops: &[TopK]) -> f32 {
    tops.iter()
        .map(TopK::floor)
        .fold(f32::NEG_INFINITY, f32::max)
}

/// The k best of the partial lists `tops`: one selection over the hits of all of them that
/// reach the highest of their floors ([`TopK::floor`]; a hit strictly below it cannot rank
/// among the k best).
pub fn merged(tops: impl IntoIterator<Item = TopK>, k: usize) -> TopK {
    let tops: Vec<TopK> = tops.into_iter().collect();
    let floor = merge_floor(&tops);
    let mut out = TopK::new(k);
    out.hits = Vec::with_capacity(tops.iter().map(|top| top.hits.len()).sum());
    for top in &tops {
        out.hits
            .extend(top.hits.iter().filter(|hit| hit.score >= floor));
    }
    out.select();
    out
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
                carried: 0.0,
                key: i as u64,
            })
            .collect();
        hits.sort_by(Hit::rank_cmp);
        hits.truncate(k);
        hits
    }

    proptest! {
        /// The radix sort by key agrees with a comparison sort, whatever the ids' spread.
        #[test]
        fn rows_sort_as_a_comparison_sort_does(
            rows in proptest::collection::hash_set(any::<u64>().prop_map(|r| r >> 5), 0..600),
            near in proptest::collection::hash_set(0u64..5_000, 0..600),
            base in any::<u64>().prop_map(|b| b >> 8),
        ) {
            for ids in [
                rows.into_iter().collect::<Vec<u64>>(),
                near.into_iter().map(|r| base + r).collect(),
            ] {
                let mut hits: Vec<Hit> = ids
                    .iter()
                    .map(|&r| Hit { score: (r % 7) as f32, carried: 0.5, key: r })
                    .collect();
                let mut expected = hits.clone();
                expected.sort_unstable_by_key(|h| h.key);
                radix_sort_by_key(&mut hits);
                prop_assert_eq!(hits, expected);
            }
        }

        #[test]
        fn sharing_lists_fed_in_turns_merge_to_the_k_best(
            scores in proptest::collection::vec(prop_oneof![Just(0.5f32), Just(1.0), -5.0f32..5.0], 0..3000),
            k in 0usize..300,
            workers in 1usize..20,
            turn in 1usize..40,
        ) {
            let shared = Arc::new(SharedFloor::new(workers, workers));
            let mut tops: Vec<TopK> = (0..workers).map(|w| TopK::sharing(k, shared.clone(), w)).collect();
            // Worker w takes the w-th of `workers` runs of the scores, `turn` at a time.
            let runs: Vec<(usize, usize)> = (0..workers)
                .map(|w| (w * scores.len() / workers, (w + 1) * scores.len() / workers))
                .collect();
            let mut at: Vec<usize> = runs.iter().map(|r| r.0).collect();
            while (0..workers).any(|w| at[w] < runs[w].1) {
                for w in 0..workers {
                    let end = (at[w] + turn).min(runs[w].1);
                    for (i, &score) in scores.iter().enumerate().take(end).skip(at[w]) {
                        tops[w].push(Hit { score, carried: 0.0, key: i as u64 });
                    }
                    at[w] = end;
                }
            }
            prop_assert_eq!(merged(tops, k).into_sorted(), brute_force(&scores, k));
        }
    }

    #[test]
    fn threshold_is_the_worst_kept_hit_after_a_selection() {
        let mut top = TopK::new(2);
        let hit = |score, row| Hit {
            score,
            carried: 0.0,
            key: row,
        };
        top.push(hit(1.0, 5));
        top.push(hit(3.0, 9));
        assert_eq!(top.threshold(), None, "no selection yet");
        top.push(hit(1.0, 4)); // same score, lower key: ranks before key 5
        top.push(hit(0.5, 1)); // fourth hit: the buffer holds 2k, so the two best are selected
        assert_eq!(top.threshold(), Some(hit(1.0, 4)));
        top.push(hit(1.0, 6)); // ties the bound but ranks after it: not kept
        top.push(hit(2.0, 7));
        assert_eq!(top.into_sorted(), [hit(3.0, 9), hit(2.0, 7)]);
    }

    proptest! {
        /// The floor's integer keys keep the scores' order and give the score back.
        #[test]
        fn order_keys_keep_the_order(a in proptest::num::f32::NORMAL | proptest::num::f32::ZERO | proptest::num::f32::INFINITE, b in proptest::num::f32::ANY) {
            prop_assume!(!b.is_nan());
            prop_assert_eq!(a.total_cmp(&b), order_key(a).cmp(&order_key(b)));
            prop_assert_eq!(from_order_key(order_key(a)).to_bits(), a.to_bits());
        }

        /// Any split into blocks and any thread count give exactly the brute-force list, ties
        /// (frequent here: scores are drawn from a few values) broken by key.
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
                            top.push(Hit { score, carried: 0.0, key: i as u64 });
                        }
                    })
                    .into_sorted()
                });
                prop_assert_eq!(&got, &expected, "{} threads", threads);
            }
        }
    }
}
