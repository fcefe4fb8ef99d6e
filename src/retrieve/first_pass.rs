//! Stage one: every row of the scope estimated from its 2-bit code and its lexical signature,
//! one page per task, a top-k per worker, merged deterministically.

use super::*;

/// Candidates the first pass keeps, never fewer than this (or the whole scope).
pub const FIRST_PASS_MIN_K: usize = 512;

/// Growth of the first pass with the scope: `FIRST_PASS_SQRT_FACTOR · √rows`. How far down
/// stage one's order the rows of the brute-force top 10 lie grows with the scope and with how
/// coarse the estimate is. With one signature bit per term, stage one kept twice `16 · √rows`
/// (at least 512) to hold the fidelity target; with three bits per term and no stop words
/// ([`crate::arena::signature`]) once is enough: on a million synthetic rows 200 of 200
/// queries agree with brute force, 197 with half as many candidates, 193 with a quarter
/// (`perpetuity bench fidelity`, which reports those shallower counts; `docs/journal/benchmarks.md`).
pub const FIRST_PASS_SQRT_FACTOR: f64 = 16.0;

/// Candidates kept by the first pass for a scope of `live_rows` rows: at least
/// [`FIRST_PASS_MIN_K`], growing as `16 · √rows` (1,227 at 5,882 rows, 16,000 at one million),
/// never more than the scope.
pub fn first_pass_k(live_rows: usize) -> usize {
    let grown = (FIRST_PASS_SQRT_FACTOR * (live_rows as f64).sqrt()).ceil() as usize;
    grown.max(FIRST_PASS_MIN_K).min(live_rows)
}

/// The dense part of stage one's estimate for one query: a row's cosine is estimated as
/// `base + α · step · S`, with `S` the 2-bit kernel's integer sum over the row's code, `α` the
/// row's scale, `base = q · μ`.
#[derive(Debug, Clone)]
pub struct DenseEstimate {
    pub weights: TwoBitQuery,
    pub base: f32,
    pub step: f32,
}

impl DenseEstimate {
    /// The estimate of unit vector `unit` under `codebook`. Dimension `i` adds
    /// `±(q_i · lo_i + m_i · q_i · (hi_i − lo_i))`, the sign the row's sign bit, `m_i` its
    /// magnitude bit; the table of a pair of dimensions holds the sum of both for each of the 16
    /// nibbles, quantised on one common step to integers in `±LUT_ENTRY_MAX`.
    pub fn new(codebook: &Codebook, unit: &[f32]) -> Self {
        let part = |i: usize, bits: usize| {
            let b = unit[i]
                * if bits & 2 != 0 {
                    codebook.hi[i]
                } else {
                    codebook.lo[i]
                };
            if bits & 1 != 0 { b } else { -b }
        };
        let table: Vec<f32> = (0..unit.len() / 2)
            .flat_map(|p| {
                (0..PAIR_ENTRIES).map(move |n| part(2 * p, n & 3) + part(2 * p + 1, n >> 2))
            })
            .collect();
        let largest = table.iter().fold(0f32, |m, x| m.max(x.abs()));
        let entry_max = f32::from(LUT_ENTRY_MAX);
        let step = if largest > 0.0 {
            largest / entry_max
        } else {
            1.0
        };
        let quantised = table
            .iter()
            .map(|x| (x / step).round().clamp(-entry_max, entry_max) as i8)
            .collect();
        Self {
            weights: TwoBitQuery::new(quantised),
            base: crate::relevance::dot(unit, &codebook.mean),
            step,
        }
    }

    /// The estimated cosine of a row with scale `alpha` and kernel sum `sum`.
    #[inline]
    pub fn cosine(&self, alpha: f32, sum: i32) -> f32 {
        self.base + alpha * self.step * sum as f32
    }
}

/// The query terms as the estimates read them, each weighted by the share of its IDF that a
/// signature match, or a stop word, counts for ([`signature_share`]): the terms a signature
/// is tested for, with their bits ([`term_bits`]), and the summed weight of the stop words,
/// which no signature holds and every row is taken to hold. A question's stop words are
/// often a third of its terms; tested, each would cost the signature kernel a pass over
/// every row to add the same weight to each.
fn estimate_terms(query: &PreparedQuery) -> (Vec<SignatureTerm>, f32) {
    let mut tested = Vec::new();
    let mut held = 0.0;
    for (&(term, _), &idf) in query.scorer.terms().iter().zip(query.scorer.idf()) {
        let bits = term_bits(term);
        if bits.mask == 0 {
            held += idf * signature_share(true);
        } else {
            tested.push(SignatureTerm {
                word: bits.word,
                mask: bits.mask,
                weight: idf * signature_share(false),
            });
        }
    }
    (tested, held)
}

/// Stage one over every row of a scope's `sketches` ([`Arena::scope_sketches`]): the `k` best
/// by the estimate from the 2-bit codes ([`DenseEstimate`]) and the lexical signature
/// ([`HybridScorer::dense_part`] plus [`HybridScorer::estimate_lexical_part`]), each hit keyed
/// by its row's slot ([`Slot::key`]; ties to the lower key, which within one user is the lower
/// row id); returned in key order, the order stage two reads them back from the arena, so its
/// reads move forward through memory. No row id is read: the sketch's copy of them is not
/// loaded, and stage two finds each row by its key.
pub fn first_pass(
    sketches: &ScopeSketches<'_>,
    kernels: &Kernels,
    query: &PreparedQuery,
    k: usize,
) -> Vec<Hit> {
    let pass = FirstPass::new(sketches, kernels, query);
    parallel_top_k(sketches.sketches.len(), k, |p, top| pass.score_page(p, top)).into_key_order()
}

/// Stage one's work for one query, page by page: what [`first_pass`] spreads over the rayon
/// pool, and what `bench scan` replays worker by worker to simulate more cores than it has.
pub struct FirstPass<'a> {
    sketches: &'a ScopeSketches<'a>,
    kernels: &'a Kernels,
    query: &'a PreparedQuery,
    /// The terms the signatures are tested for, and the stop words' weight every row holds
    /// ([`estimate_terms`]).
    terms: Vec<SignatureTerm>,
    held: f32,
}

impl<'a> FirstPass<'a> {
    pub fn new(
        sketches: &'a ScopeSketches<'a>,
        kernels: &'a Kernels,
        query: &'a PreparedQuery,
    ) -> Self {
        let (terms, held) = estimate_terms(query);
        Self {
            sketches,
            kernels,
            query,
            terms,
            held,
        }
    }

    /// Offer the rows of page `p` to `top`.
    pub fn score_page(&self, p: usize, top: &mut TopK) {
        let (sketches, kernels, query) = (&self.sketches.sketches, self.kernels, self.query);
        let sketch = sketches[p];
        let first = Slot {
            page: self.sketches.pages[p],
            index: 0,
        }
        .key();
        let (next, after) = (sketches.get(p + 1), sketches.get(p + 2));
        // The next sketch's codes are loaded into the first-level cache and the one after it
        // into the second-level one while this one is scored, by the kernel as it reads this
        // one's (at the same offsets); the other columns of both into the second-level cache, a
        // part at a time after each kernel. Loaded into the first level a page ahead, those
        // columns queued with the codes' loads. The next one's are mostly there already (asked
        // for a page before, as the one after); asking only for the one after's was not faster
        // (`docs/journal/benchmarks.md`, "Stage one's other columns loaded ahead into the
        // second-level cache").
        let distance = |to: Option<&&Sketch>| {
            to.map_or(0, |to| {
                (std::ptr::from_ref(*to) as isize).wrapping_sub(std::ptr::from_ref(sketch) as isize)
            })
        };
        let ahead = Lookahead {
            near: distance(next),
            far: distance(after),
        };
        let load_ahead = |part| {
            for sketch in [next, after].into_iter().flatten() {
                sketch.prefetch_first_pass(part);
            }
        };
        let blocks = sketch.blocks();
        let mut sums = [0i32; PAGE_ROWS];
        (kernels.two_bit)(&query.dense.weights, &sketch.codes, &mut sums, ahead);
        load_ahead(0);
        let mut matched = [0f32; PAGE_ROWS];
        (kernels.signature)(
            &self.terms,
            code_words(DIMS),
            sketch.signatures_of_blocks(blocks),
            &mut matched[..blocks * BLOCK_ROWS],
        );
        load_ahead(1);
        let rows = sketch.rows as usize;
        // The estimates first, in a loop of arithmetic only (the compiler vectorises it), then
        // the offers to the top-k, which mostly end at its threshold.
        let (mut estimates, mut lexical) = ([0f32; PAGE_ROWS], [0f32; PAGE_ROWS]);
        for i in 0..rows {
            let cosine = query.dense.cosine(sketch.alpha(i), sums[i]);
            lexical[i] = query
                .scorer
                .estimate_lexical_part(self.held + matched[i], sketch.term_len(i));
            estimates[i] = query.scorer.dense_part(cosine) + lexical[i];
        }
        // Most rows fall below the floor: compare the page's estimates with it at once, and
        // offer only the rest, in row order (the same test `TopK::push` makes first, so the
        // kept set is unchanged).
        let mut offered = (kernels.at_least)(&estimates[..rows], top.floor());
        while offered != 0 {
            let i = offered.trailing_zeros() as usize;
            offered &= offered - 1;
            top.push(Hit {
                score: estimates[i],
                carried: lexical[i],
                key: first + i as u64,
            });
        }
    }
}
