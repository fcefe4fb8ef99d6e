//! Retrieval: a query, a scope and the arena in; ranked rows by relevance out. Heat plays no
//! part here.
//!
//! The first pass reads every row of the scope in two steps. Stage one estimates the final score
//! of each row from its 2-bit code (the arena's [`Codebook`]) and the query terms its lexical
//! signature may hold (one page per task on the rayon pool, a top-k per worker, deterministic merge)
//! and keeps [`first_pass_k`] rows; stage two narrows those by the same estimate with the int8
//! vectors' cosine ([`narrow_k`]), scores the rest with the exact lexical part and the int8
//! cosine and keeps [`RESCORE_K`] for the exact rescore. The exact rescore re-embeds each candidate from the tokens the arena holds under
//! the current frequency statistic and scores it by [`HybridScorer`] (its own score); the final
//! order is each row's score in context ([`in_context`]): its own score lifted towards those of
//! the turns around it in its conversation ([`Arena::neighbour`]); ties go to the lower row id.
//! Everything reads the arena only (it holds a copy of each row's terms and tokens, checked
//! against the store by `perpetuity integrity`). No approximate index anywhere: the first pass
//! reads every row of the scope.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::arena::codebook::Codebook;
use crate::arena::signature::term_bits;
use crate::arena::{Arena, DIMS, PAGE_ROWS, Side, Sketch, Slot, embed_row};
use crate::dictionary::Dictionary;
use crate::dictionary::derive::{
    PREFETCH_INDEX_AHEAD, PREFETCH_TOKENS_AHEAD, Quantized, prefetch_token,
};
use crate::dictionary::derive::{RetrievalRow, derive};
use crate::relevance::{
    CONTEXT_AFTER, CONTEXT_BEFORE, HybridScorer, OPENING_AFTER, after_shares, in_context,
    signature_share,
};
use crate::scan::kernels::{
    BLOCK_ROWS, Kernels, LUT_ENTRY_MAX, Lookahead, PAIR_ENTRIES, SignatureTerm, TwoBitQuery,
    code_words, prefetch, prefetch_l2,
};
use crate::scan::topk::{Hit, TopK, parallel_top_k};
use crate::tokens::Tokenizer;
use crate::types::{RowId, UserId};

/// Searches running now in this process ([`yield_to_searches`]).
static SEARCHES: AtomicUsize = AtomicUsize::new(0);

/// One running search, counted in [`SEARCHES`] while it lives.
struct Searching;

impl Searching {
    fn start() -> Self {
        SEARCHES.fetch_add(1, Ordering::Relaxed);
        Self
    }
}

impl Drop for Searching {
    fn drop(&mut self) {
        SEARCHES.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Wait until no search is running, or for `most` at the longest: background work (a
/// dictionary re-derivation) calls it between small steps, so a query has the cores and the
/// memory bandwidth to itself and the work still advances under constant load.
pub fn yield_to_searches(most: Duration) {
    let started = Instant::now();
    while SEARCHES.load(Ordering::Relaxed) > 0 && started.elapsed() < most {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Candidates the first pass keeps, never fewer than this (or the whole scope).
pub const FIRST_PASS_MIN_K: usize = 512;
/// Hits per stage-two task: enough work per task to outweigh scheduling, small enough that a
/// few thousand hits still spread over every thread.
const REFINE_CHUNK_HITS: usize = 1024;
/// Slack on the stage-two bound, far above f32 rounding of a sum of a few dozen terms, so a
/// rounding difference can never skip a row that belongs.
const PRUNE_MARGIN: f32 = 1e-4;
/// How far ahead stage two starts loading a candidate's columns, and its terms (which need the
/// columns' entry offset first).
const PREFETCH_ROWS_AHEAD: usize = 8;
const PREFETCH_TERMS_AHEAD: usize = 4;
/// Candidates of the int8 stage that the exact rescore scores (or the `k` asked for, if more).
/// The int8 cosine is close to the exact one, so the exact top 10 lies well inside these: with
/// 128 as with 256, 200 of 200 synthetic queries at a million rows and 1,986 of 1,986 LoCoMo
/// questions agree with brute force (`docs/journal/benchmarks.md`), and the exact rescore, which
/// re-embeds each row from its tokens, costs half.
pub const RESCORE_K: usize = 128;
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

/// One retrieved row.
#[derive(Debug, Clone, PartialEq)]
pub struct Retrieved {
    pub row: RowId,
    pub user: UserId,
    pub score: f32,
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

/// A query prepared once: its retrieval row, its stage-one dense estimate, its int8 vector and
/// its exact scorer, all under the arena's statistic and codebook.
#[derive(Debug, Clone)]
pub struct PreparedQuery {
    pub retrieval: RetrievalRow,
    pub dense: DenseEstimate,
    pub int8: Quantized,
    pub scorer: HybridScorer,
}

impl PreparedQuery {
    pub fn new(dictionary: &Dictionary, arena: &Arena, text: &str) -> Self {
        let tokenizer = Tokenizer::new();
        let retrieval = derive(dictionary, &tokenizer, None, &tokenizer.encode(text));
        let embedding = embed_row(dictionary, arena.stats(), retrieval.tokens.iter().copied());
        let dense = DenseEstimate::new(arena.codebook(), &embedding.unit);
        let int8 = embedding.quantize();
        let scorer = HybridScorer::new(
            &retrieval.terms,
            embedding.unit,
            arena.stats(),
            dictionary.dense_weight(),
        );
        Self {
            retrieval,
            dense,
            int8,
            scorer,
        }
    }
}

/// The query terms as the signature kernel and stage two's bound read them: each term's bits
/// ([`term_bits`]; none for a stop word, which every row is taken to hold) weighted by its IDF.
fn signature_terms(query: &PreparedQuery) -> Vec<SignatureTerm> {
    query
        .scorer
        .terms()
        .iter()
        .zip(query.scorer.idf())
        .map(|(&(term, _), &idf)| {
            let bits = term_bits(term);
            SignatureTerm {
                word: bits.word,
                mask: bits.mask,
                weight: idf,
            }
        })
        .collect()
}

/// The query terms as the estimates read them: a signature match, or a stop word, counts at
/// its share of the IDF ([`signature_share`]).
fn estimate_terms(query: &PreparedQuery) -> Vec<SignatureTerm> {
    signature_terms(query)
        .into_iter()
        .map(|term| SignatureTerm {
            weight: term.weight * signature_share(term.mask == 0),
            ..term
        })
        .collect()
}

/// Stage one over every row of a scope's `sketches` ([`Arena::scope_sketches`]): the `k` best
/// by the estimate from the 2-bit codes ([`DenseEstimate`]) and the lexical signature
/// ([`HybridScorer::dense_part`] plus [`HybridScorer::estimate_lexical_part`]), ties by row id;
/// returned in row id order, the order stage two reads them back from the arena (a user's
/// pages hold its rows in row id order, so the reads move forward through memory).
pub fn first_pass(
    sketches: &[&Sketch],
    kernels: &Kernels,
    query: &PreparedQuery,
    k: usize,
) -> Vec<Hit> {
    let pass = FirstPass::new(sketches, kernels, query);
    parallel_top_k(sketches.len(), k, |p, top| pass.score_page(p, top)).into_row_order()
}

/// Stage one's work for one query, page by page: what [`first_pass`] spreads over the rayon
/// pool, and what `bench scan` replays worker by worker to simulate more cores than it has.
pub struct FirstPass<'a> {
    sketches: &'a [&'a Sketch],
    kernels: &'a Kernels,
    query: &'a PreparedQuery,
    terms: Vec<SignatureTerm>,
}

impl<'a> FirstPass<'a> {
    pub fn new(sketches: &'a [&'a Sketch], kernels: &'a Kernels, query: &'a PreparedQuery) -> Self {
        Self {
            sketches,
            kernels,
            query,
            terms: estimate_terms(query),
        }
    }

    /// Offer the rows of page `p` to `top`.
    pub fn score_page(&self, p: usize, top: &mut TopK) {
        let (sketches, kernels, query) = (self.sketches, self.kernels, self.query);
        let sketch = sketches[p];
        let (next, after) = (sketches.get(p + 1), sketches.get(p + 2));
        // The next sketch is loaded into the first-level cache and the one after it into the
        // second-level one while this one is scored: their codes by the kernel as it reads
        // this one's (at the same offsets), their other columns a part at a time after each
        // kernel.
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
            if let Some(next) = next {
                next.prefetch_first_pass(part, prefetch);
            }
            if let Some(after) = after {
                after.prefetch_first_pass(part, prefetch_l2);
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
            let cosine = query.dense.cosine(sketch.alphas[i], sums[i]);
            lexical[i] = query
                .scorer
                .estimate_lexical_part(matched[i], sketch.term_lens[i]);
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
                row: RowId(sketch.row_ids[i]),
            });
        }
    }
}

/// Stage two, in two steps. First it narrows stage one's hits to [`narrow_k`] by stage one's
/// estimate with the int8 cosine in place of the 2-bit one ([`narrow`]: only the row's vector
/// and scale are read). Then it scores those with the exact lexical part (BM25 over the row's resident terms)
/// and the int8 cosine, and keeps the `k` best, ties by row id ([`score_lexical`]). The result
/// differs from the exact score only in the int8 rounding and in weights that may have moved
/// since the row was caught up.
pub fn refine(
    arena: &Arena,
    kernels: &Kernels,
    query: &PreparedQuery,
    hits: &[Hit],
    k: usize,
) -> Vec<Hit> {
    let keep = narrow_k(hits.len()).max(k);
    if hits.len() > keep {
        let narrowed = narrow(arena, kernels, query, hits, keep);
        return score_lexical(arena, kernels, query, &narrowed, k, Cosine::Carried);
    }
    score_lexical(arena, kernels, query, hits, k, Cosine::Computed)
}

/// Hits stage two reads the terms of, out of stage one's `hits`: a quarter, at least 2,048 (4,000
/// at a million rows). Most of stage one's error is in its 2-bit cosine; with the int8 one, a
/// quarter of the candidates holds the brute-force top 10 as often as all of them: on a million
/// synthetic rows 200 of 200 queries agree (199 with an eighth), on 100,000 rows 200 of 200
/// with at least 2,048 (199 with 1,024), and LoCoMo is unchanged (`perpetuity bench fidelity`,
/// `docs/journal/benchmarks.md`).
pub fn narrow_k(hits: usize) -> usize {
    (hits / 4).max(2048)
}

/// Where stage two's walk finds a hit's int8 cosine to the query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cosine {
    /// Computed from the row's vector and scale.
    Computed,
    /// Carried in the hit ([`Hit::carried`], as [`narrow`] leaves it).
    Carried,
}

/// Stage two's walk: `hits` in tasks of [`REFINE_CHUNK_HITS`] on the rayon pool, each with its
/// own top `k` (merged deterministically). `score` sees each hit whose row the arena holds, with
/// its page, its index there and its int8 cosine to the query; the hits are sparse in the arena,
/// so what is read of each row is loaded a few steps ahead: its vector and scale when the
/// cosine is computed, and when `lexical` its other columns and term entries (these once its
/// entry offset is at hand).
fn walk_hits(
    arena: &Arena,
    kernels: &Kernels,
    query: &PreparedQuery,
    hits: &[Hit],
    k: usize,
    (cosine_from, lexical): (Cosine, bool),
    score: impl Fn(&mut TopK, Hit, Slot, f32) + Sync,
) -> TopK {
    let chunks = hits.len().div_ceil(REFINE_CHUNK_HITS);
    parallel_top_k(chunks, k, |c, top: &mut TopK| {
        let mut dot = [0i32; 1];
        let end = ((c + 1) * REFINE_CHUNK_HITS).min(hits.len());
        let chunk = &hits[c * REFINE_CHUNK_HITS..end];
        let slots: Vec<Option<Slot>> = chunk.iter().map(|hit| arena.slot(hit.row)).collect();
        for (n, (hit, slot)) in chunk.iter().zip(&slots).enumerate() {
            if let Some(&Some(ahead)) = slots.get(n + PREFETCH_ROWS_AHEAD) {
                if cosine_from == Cosine::Computed {
                    arena.prefetch_vector(ahead);
                }
                if lexical {
                    arena.prefetch_lexical(ahead);
                }
            }
            if lexical && let Some(&Some(ahead)) = slots.get(n + PREFETCH_TERMS_AHEAD) {
                arena.prefetch_terms(ahead);
            }
            let Some(slot) = *slot else {
                continue;
            };
            let cosine = match cosine_from {
                Cosine::Computed => {
                    let page = arena.page(slot.page);
                    let i = slot.index as usize;
                    (kernels.dot_i8)(&query.int8.values, page.vector(i), &mut dot);
                    dot[0] as f32 * query.int8.scale * page.scales[i]
                }
                Cosine::Carried => hit.carried,
            };
            score(top, *hit, slot, cosine);
        }
    })
}

/// The summed weights of `terms` whose bits the signature of row `i` of `sketch` holds.
fn signature_sum(sketch: &Sketch, i: usize, terms: &[SignatureTerm]) -> f32 {
    terms
        .iter()
        .filter(|t| sketch.signature_word(i, t.word) & t.mask == t.mask)
        .map(|t| t.weight)
        .sum()
}

/// The `keep` best of `hits` by stage one's estimate with the int8 cosine in place of the 2-bit
/// one: the lexical part is the one stage one computed from the signature and carried in the
/// hit, so only the row's vector and scale are read. Returned in row id order, each hit
/// carrying its int8 cosine on to [`score_lexical`].
fn narrow(
    arena: &Arena,
    kernels: &Kernels,
    query: &PreparedQuery,
    hits: &[Hit],
    keep: usize,
) -> Vec<Hit> {
    walk_hits(
        arena,
        kernels,
        query,
        hits,
        keep,
        (Cosine::Computed, false),
        |top, hit, _, cosine| {
            top.push(Hit {
                score: query.scorer.dense_part(cosine) + hit.carried,
                carried: cosine,
                row: hit.row,
            });
        },
    )
    .into_row_order()
}

/// The `k` best of `hits` by the int8 cosine (computed, or carried from [`narrow`]) and the
/// exact lexical part.
///
/// Once `k` rows are kept, a row is skipped without its BM25 when even the most its lexical
/// part could reach (every query term its signature may hold, at BM25's ceiling
/// `idf · (k1 + 1)`) cannot lift it past the worst kept row: the skip never changes the result.
/// Each task prunes against its floor (its own kept rows', or the tasks' shared one), never
/// above the merged k-th score, so the skip stays exact.
fn score_lexical(
    arena: &Arena,
    kernels: &Kernels,
    query: &PreparedQuery,
    hits: &[Hit],
    k: usize,
    cosine: Cosine,
) -> Vec<Hit> {
    let terms = signature_terms(query);
    let ceiling = query.scorer.lexical_ceiling_factor();
    walk_hits(
        arena,
        kernels,
        query,
        hits,
        k,
        (cosine, true),
        |top, hit, slot, cosine| {
            let floor = top.floor();
            if floor > f32::NEG_INFINITY {
                let may_hold = signature_sum(arena.sketch(slot.page), slot.index as usize, &terms);
                let bound = query.scorer.dense_part(cosine) + ceiling * may_hold;
                if bound + PRUNE_MARGIN < floor {
                    return;
                }
            }
            let entries = arena.row_entries(slot);
            top.push(Hit {
                score: query
                    .scorer
                    .score_with_cosine(entries.terms, entries.len, cosine),
                carried: 0.0,
                row: hit.row,
            });
        },
    )
    .into_sorted()
}

/// The exact scores of the row in `slot` for each of `queries`: its vector re-embedded once
/// from its tokens under the arena's current statistic, its exact lexical score from its terms.
fn exact_scores<'q>(
    dictionary: &Dictionary,
    arena: &Arena,
    slot: Slot,
    queries: impl IntoIterator<Item = &'q PreparedQuery>,
) -> impl Iterator<Item = f32> {
    let entries = arena.row_entries(slot);
    let vector = embed_row(dictionary, arena.stats(), entries.token_counts());
    queries
        .into_iter()
        .map(move |query| query.scorer.score(entries.terms, entries.len, &vector.unit))
}

/// Rows ahead of the one being scored whose page columns (entry offset and counts)
/// [`exact_many`] starts loading, then whose entries, then where the table holds their first
/// tokens' vectors; the next row's first token vectors start loading last.
const EXACT_PAGE_AHEAD: usize = 5;
const EXACT_ENTRIES_AHEAD: usize = 3;
const EXACT_INDEX_AHEAD: usize = 2;
/// Rows an [`exact_many`] task scores, one after the other.
const EXACT_CHUNK_ROWS: usize = 16;

/// The exact score of each row in `slots` for `query` ([`exact_scores`]), in order, in tasks
/// of [`EXACT_CHUNK_ROWS`] on the rayon pool. The rows are scattered in the arena and their
/// token vectors in the dictionary, and a row's first tokens are summed as soon as it starts:
/// so while a row is scored, what the rows after it read is loaded in steps, each once the
/// step before has brought in its address (the page columns, then the entries, then the first
/// token vectors). Only loads are added: the scores are those of [`exact_scores`].
fn exact_many(
    dictionary: &Dictionary,
    arena: &Arena,
    query: &PreparedQuery,
    slots: &[Slot],
) -> Vec<f32> {
    slots
        .par_chunks(EXACT_CHUNK_ROWS)
        .flat_map_iter(|chunk| {
            (0..chunk.len()).map(move |n| {
                if let Some(&ahead) = chunk.get(n + EXACT_PAGE_AHEAD) {
                    arena.prefetch_lexical(ahead);
                }
                if let Some(&ahead) = chunk.get(n + EXACT_ENTRIES_AHEAD) {
                    arena.prefetch_entries(ahead);
                }
                if let Some(&ahead) = chunk.get(n + EXACT_INDEX_AHEAD) {
                    let entries = arena.row_entries(ahead);
                    for (token, _) in entries.token_counts().take(PREFETCH_INDEX_AHEAD) {
                        dictionary.prefetch_row_index(token);
                    }
                }
                if let Some(&next) = chunk.get(n + 1) {
                    let entries = arena.row_entries(next);
                    for (token, _) in entries.token_counts().take(PREFETCH_TOKENS_AHEAD) {
                        prefetch_token(dictionary, arena.stats(), token);
                    }
                }
                exact_scores(dictionary, arena, chunk[n], [query])
                    .next()
                    .expect("one query, one score")
            })
        })
        .collect()
}

/// The row in `slot` as a result with `score`.
fn retrieved(arena: &Arena, slot: Slot, score: f32) -> Retrieved {
    let page = arena.page(slot.page);
    Retrieved {
        row: RowId(page.row_ids[slot.index as usize]),
        user: UserId(page.user),
        score,
    }
}

fn rank(mut hits: Vec<Retrieved>, k: usize) -> Vec<Retrieved> {
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.row.cmp(&b.row)));
    hits.truncate(k);
    hits
}

/// The neighbours of the row in `slot` in its conversation towards `side`, nearest first,
/// up to `steps` of them ([`Arena::neighbour`] followed `steps` times at most, stopping at the
/// first gap).
fn walk<const N: usize>(arena: &Arena, slot: Slot, side: Side, steps: usize) -> [Option<Slot>; N] {
    let mut out = [None; N];
    let mut at = slot;
    for place in out.iter_mut().take(steps) {
        match arena.neighbour(at, side) {
            Some(next) => {
                *place = Some(next);
                at = next;
            }
            None => break,
        }
    }
    out
}

/// The neighbours whose own scores the score in context of the row in `slot` reads: up to
/// `CONTEXT_BEFORE.len()` earlier rows of its conversation and as many later ones as it has
/// shares for ([`after_shares`]), nearest first.
type Context = (
    [Option<Slot>; CONTEXT_BEFORE.len()],
    [Option<Slot>; OPENING_AFTER.len()],
);

fn context(arena: &Arena, slot: Slot) -> Context {
    let before: [Option<Slot>; CONTEXT_BEFORE.len()] =
        walk(arena, slot, Side::Before, CONTEXT_BEFORE.len());
    let read = before.iter().map_while(|s| *s).count();
    let after = walk(arena, slot, Side::After, after_shares(read).len());
    (before, after)
}

/// [`in_context`] of a row with own score `own` and neighbours `context`, each neighbour's own
/// score read through `own_of`.
fn score_in_context(own: f32, context: &Context, own_of: impl Fn(Slot) -> f32) -> f32 {
    fn scores<const N: usize>(
        slots: &[Option<Slot>; N],
        own_of: &impl Fn(Slot) -> f32,
    ) -> ([f32; N], usize) {
        let mut out = [0f32; N];
        let mut n = 0;
        for slot in slots.iter().map_while(|s| *s) {
            out[n] = own_of(slot);
            n += 1;
        }
        (out, n)
    }
    let (before, b) = scores(&context.0, &own_of);
    let (after, a) = scores(&context.1, &own_of);
    in_context(own, &before[..b], &after[..a])
}

/// The rows whose score in context reads the row in `slot` ([`context`] the other way): the
/// rows up to `CONTEXT_BEFORE.len()` after it, the one before it, and an opening up to
/// `OPENING_AFTER.len()` before it.
fn read_by(arena: &Arena, slot: Slot) -> impl Iterator<Item = Slot> {
    let after: [Option<Slot>; CONTEXT_BEFORE.len()] =
        walk(arena, slot, Side::After, CONTEXT_BEFORE.len());
    let before: [Option<Slot>; OPENING_AFTER.len()] =
        walk(arena, slot, Side::Before, OPENING_AFTER.len());
    let reads = move |(distance, row): (usize, Slot)| {
        distance < CONTEXT_AFTER.len() || arena.neighbour(row, Side::Before).is_none()
    };
    after.into_iter().flatten().chain(
        before
            .into_iter()
            .map_while(|s| s)
            .enumerate()
            .filter(move |&pair| reads(pair))
            .map(|(_, row)| row),
    )
}

/// `slots` and the rows `around` gives for each, once each, in row id order.
fn with_rows_around<I: Iterator<Item = Slot>>(
    arena: &Arena,
    slots: impl IntoIterator<Item = Slot>,
    around: impl Fn(Slot) -> I,
) -> Vec<(RowId, Slot)> {
    let id = |slot: Slot| RowId(arena.page(slot.page).row_ids[slot.index as usize]);
    let mut out: Vec<(RowId, Slot)> = slots
        .into_iter()
        .flat_map(|slot| std::iter::once(slot).chain(around(slot)))
        .map(|slot| (id(slot), slot))
        .collect();
    out.sort_unstable_by_key(|&(row, _)| row);
    out.dedup_by_key(|&mut (row, _)| row);
    out
}

/// The `k` most relevant rows of `scope`: first pass, exact rescore, then each row in context.
///
/// The exact rescore scores its candidates on their own; the k-th best of those own scores is
/// a floor of the k-th best score in context (a row's score in context is never below its
/// own). The candidates that reach the floor are widened by the rows they can lift (those that
/// hold them among their context neighbours), every row of that set is ranked by its score in
/// context ([`in_context`]), and every neighbour those scores read is scored exactly too. A
/// row's score in context never passes the best own score around it, so a row outside the
/// widened set stays below the floor whenever the candidates hold every row whose own score
/// reaches it: the result is brute force's under the same condition as before the context
/// step.
pub fn search(
    dictionary: &Dictionary,
    arena: &Arena,
    kernels: &Kernels,
    scope: &[UserId],
    query: &PreparedQuery,
    k: usize,
) -> Vec<Retrieved> {
    let _searching = Searching::start();
    let sketches = arena.scope_sketches(scope);
    let wide = first_pass(
        &sketches,
        kernels,
        query,
        first_pass_k(arena.scope_rows(scope)),
    );
    search_from(dictionary, arena, kernels, query, &wide, k)
}

/// [`search`] passing over the rows in `excluded` (the exclusions of the scope's members): asks
/// for `k` more than `excluded` holds and drops those, so the result is exactly the `k` best of
/// the other rows. An excluded row still reads as a neighbour in context (its conversation as
/// it was said), but is never returned.
pub fn search_without(
    dictionary: &Dictionary,
    arena: &Arena,
    kernels: &Kernels,
    scope: &[UserId],
    query: &PreparedQuery,
    k: usize,
    excluded: &HashSet<RowId>,
) -> Vec<Retrieved> {
    let deeper = k.saturating_add(excluded.len());
    let mut hits = search(dictionary, arena, kernels, scope, query, deeper);
    hits.retain(|hit| !excluded.contains(&hit.row));
    hits.truncate(k);
    hits
}

/// [`search`] from stage one's `wide` hits (in row id order) on: stage two, the exact rescore
/// and the score in context.
pub fn search_from(
    dictionary: &Dictionary,
    arena: &Arena,
    kernels: &Kernels,
    query: &PreparedQuery,
    wide: &[Hit],
    k: usize,
) -> Vec<Retrieved> {
    let candidates = refine(arena, kernels, query, wide, RESCORE_K.max(k));
    let scored = |rows: Vec<(RowId, Slot)>| {
        let slots: Vec<Slot> = rows.iter().map(|&(_, slot)| slot).collect();
        let scores = exact_many(dictionary, arena, query, &slots);
        rows.into_iter()
            .zip(scores)
            .map(|((row, slot), score)| (row, slot, score))
    };
    let mut own: Vec<(RowId, Slot, f32)> = scored(
        candidates
            .iter()
            .filter_map(|hit| Some((hit.row, arena.slot(hit.row)?)))
            .collect(),
    )
    .collect();
    // The k-th best own score is a floor of the k-th best score in context; only rows reaching
    // it can lift a row into the top k.
    let mut best: Vec<f32> = own.iter().map(|&(_, _, score)| score).collect();
    best.sort_unstable_by(|a, b| b.total_cmp(a));
    let floor = best
        .get(k.saturating_sub(1))
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    // A row lifts the rows that read it among their neighbours ([`read_by`]).
    let ranked = with_rows_around(
        arena,
        own.iter()
            .filter(|&&(_, _, score)| score >= floor)
            .map(|&(_, slot, _)| slot),
        |slot| read_by(arena, slot),
    );
    own.sort_unstable_by_key(|&(row, _, _)| row);
    let unscored: Vec<(RowId, Slot)> =
        with_rows_around(arena, ranked.iter().map(|&(_, slot)| slot), |slot| {
            let (before, after) = context(arena, slot);
            before.into_iter().chain(after).flatten()
        })
        .into_iter()
        .filter(|&(row, _)| own.binary_search_by_key(&row, |&(id, _, _)| id).is_err())
        .collect();
    own.extend(scored(unscored));
    own.sort_unstable_by_key(|&(row, _, _)| row);
    let own_of = |slot: Slot| {
        let row = RowId(arena.page(slot.page).row_ids[slot.index as usize]);
        let at = own
            .binary_search_by_key(&row, |&(id, _, _)| id)
            .expect("every neighbour read was scored");
        own[at].2
    };
    let scored: Vec<Retrieved> = ranked
        .par_iter()
        .map(|&(_, slot)| {
            let score = score_in_context(own_of(slot), &context(arena, slot), own_of);
            retrieved(arena, slot, score)
        })
        .collect();
    rank(scored, k)
}

/// The reference: the exact score in context of every row of `scope`, no first pass.
pub fn brute_force(
    dictionary: &Dictionary,
    arena: &Arena,
    scope: &[UserId],
    query: &PreparedQuery,
    k: usize,
) -> Vec<Retrieved> {
    brute_force_many(dictionary, arena, scope, std::slice::from_ref(query), k)
        .pop()
        .expect("one query, one list")
}

/// Queries [`brute_force_many`] scores together: their own scores of every row of the scope
/// are held at once (4 bytes per row and query).
const BRUTE_FORCE_QUERIES: usize = 32;

/// [`brute_force`] for many queries, [`BRUTE_FORCE_QUERIES`] at a time: one pass over the
/// scope scores every row's own score for each query (each row re-embedded once), a second
/// ranks every row by its score in context (pages split across the rayon pool in both,
/// per-task top-k per query, deterministic merge).
pub fn brute_force_many(
    dictionary: &Dictionary,
    arena: &Arena,
    scope: &[UserId],
    queries: &[PreparedQuery],
    k: usize,
) -> Vec<Vec<Retrieved>> {
    let pages = arena.scope_page_numbers(scope);
    let position: std::collections::HashMap<u32, usize> =
        pages.iter().enumerate().map(|(i, &p)| (p, i)).collect();
    queries
        .chunks(BRUTE_FORCE_QUERIES)
        .flat_map(|batch| {
            let n = batch.len();
            let mut own = vec![0f32; pages.len() * PAGE_ROWS * n];
            own.par_chunks_mut(PAGE_ROWS * n)
                .zip(&pages)
                .for_each(|(out, &p)| {
                    let page = arena.page(p);
                    for index in 0..page.rows {
                        let slot = Slot { page: p, index };
                        let at = index as usize * n;
                        for (o, score) in out[at..at + n]
                            .iter_mut()
                            .zip(exact_scores(dictionary, arena, slot, batch))
                        {
                            *o = score;
                        }
                    }
                });
            let own_of = |slot: Slot, q: usize| {
                own[(position[&slot.page] * PAGE_ROWS + slot.index as usize) * n + q]
            };
            let fresh = || vec![TopK::new(k); n];
            let tops = pages
                .par_iter()
                .fold(fresh, |mut tops, &p| {
                    let page = arena.page(p);
                    for index in 0..page.rows {
                        let slot = Slot { page: p, index };
                        let around = context(arena, slot);
                        for (q, top) in tops.iter_mut().enumerate() {
                            top.push(Hit {
                                score: score_in_context(own_of(slot, q), &around, |s| own_of(s, q)),
                                carried: 0.0,
                                row: RowId(page.row_ids[index as usize]),
                            });
                        }
                    }
                    tops
                })
                .reduce(fresh, |a, b| {
                    a.into_iter().zip(b).map(|(x, y)| x.merge(y)).collect()
                });
            tops.into_iter()
                .map(|top| {
                    top.into_sorted()
                        .into_iter()
                        .filter_map(|hit| Some(retrieved(arena, arena.slot(hit.row)?, hit.score)))
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}
