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
use crate::arena::{
    Arena, DIMS, PAGE_ROWS, RowEntries, ScopeSketches, Side, Sketch, Slot, embed_row,
};
use crate::dictionary::Dictionary;
use crate::dictionary::derive::{
    PREFETCH_INDEX_AHEAD, PREFETCH_TOKENS_AHEAD, Quantized, prefetch_token,
};
use crate::dictionary::derive::{RetrievalRow, derive};
use crate::relevance::{
    Bm25, CONTEXT_AFTER, CONTEXT_BEFORE, HybridScorer, OPENING_AFTER, TermCount, after_shares,
    in_context, signature_share,
};
use crate::scan::kernels::{
    BLOCK_ROWS, Kernels, LUT_ENTRY_MAX, Lookahead, PAIR_ENTRIES, SignatureTerm, TwoBitQuery,
    code_words,
};
use crate::scan::topk::{Hit, TopK, parallel_top_k};
use crate::tokens::Tokenizer;
use crate::types::{RowId, TermId, UserId};

mod context;
mod first_pass;
mod refine;

use context::*;
pub use first_pass::*;
pub use refine::*;

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

/// Candidates of the int8 stage that the exact rescore scores (or the `k` asked for, if more).
/// The int8 cosine is close to the exact one, so the exact top 10 lies well inside these: with
/// 128 as with 256, 200 of 200 synthetic queries at a million rows and 1,986 of 1,986 LoCoMo
/// questions agree with brute force (`docs/journal/benchmarks.md`), and the exact rescore, which
/// re-embeds each row from its tokens, costs half.
pub const RESCORE_K: usize = 128;

/// One retrieved row.
#[derive(Debug, Clone, PartialEq)]
pub struct Retrieved {
    pub row: RowId,
    pub user: UserId,
    pub score: f32,
}

/// What a term only the question's conversation holds counts for against one of the
/// question's own ([`PreparedQuery::in_conversation`]; chosen on RealMem's even half, checked
/// on its odd half, `docs/journal/benchmarks.md`, "The question read in its conversation").
pub const CONTEXT_TERM_WEIGHT: f32 = 0.3;
/// The weight of the conversation's vector added to the question's.
pub const CONTEXT_VECTOR_WEIGHT: f32 = 0.6;
/// The most terms the conversation adds: its rarest (highest IDF). Every query term costs
/// stage one a signature test per row: at a million rows in one scope, 8 rows of context
/// (about 150 terms) took a query from 7 to 17.5 ms, 32 of their terms to 9-9.5 ms. 16 cost
/// a little less and left the evidence in the frame of RealMem's odd half where it was.
pub const CONTEXT_TERMS: usize = 32;

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
        Self::in_conversation(dictionary, arena, text, &[])
    }

    /// The question `text` read in its conversation, whose rows before it in the arena are
    /// `context`: every term of the question at its full weight and the [`CONTEXT_TERMS`]
    /// rarest terms only the context holds at [`CONTEXT_TERM_WEIGHT`], and the question's
    /// vector plus [`CONTEXT_VECTOR_WEIGHT`] times the context's, normalised. A user's turn in
    /// a working session ("go on with beat 3", "that failed again") says little alone; the
    /// turns before it say what it is about. `retrieval` stays the question's own. With no
    /// context this is the question alone.
    pub fn in_conversation(
        dictionary: &Dictionary,
        arena: &Arena,
        text: &str,
        context: &[Slot],
    ) -> Self {
        let tokenizer = Tokenizer::new();
        let retrieval = derive(dictionary, &tokenizer, None, &tokenizer.encode(text));
        let mut embedding = embed_row(dictionary, arena.stats(), retrieval.tokens.iter().copied());
        let mut terms: Vec<(TermId, u32, f32)> = retrieval
            .terms
            .iter()
            .map(|&(term, count)| (term, count, 1.0))
            .collect();
        if !context.is_empty() {
            let rows: Vec<RowEntries<'_>> = context
                .iter()
                .map(|&slot| arena.row_entries(slot))
                .collect();
            let around = embed_row(
                dictionary,
                arena.stats(),
                rows.iter().flat_map(RowEntries::token_counts),
            );
            for (unit, around) in embedding.unit.iter_mut().zip(&around.unit) {
                *unit += CONTEXT_VECTOR_WEIGHT * around;
            }
            embedding.normalise();
            let mut only_context: Vec<TermId> = rows
                .iter()
                .flat_map(|row| row.terms.iter().map(TermCount::term))
                .filter(|term| {
                    retrieval
                        .terms
                        .binary_search_by_key(term, |&(t, _)| t)
                        .is_err()
                })
                .collect();
            only_context.sort_unstable();
            only_context.dedup();
            let mut rarest: Vec<(f32, TermId)> = only_context
                .into_iter()
                .map(|term| (Bm25::idf(arena.stats(), term), term))
                .collect();
            rarest.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            terms.extend(
                rarest
                    .into_iter()
                    .take(CONTEXT_TERMS)
                    .map(|(_, term)| (term, 1, CONTEXT_TERM_WEIGHT)),
            );
            terms.sort_unstable_by_key(|&(term, _, _)| term);
        }
        let dense = DenseEstimate::new(arena.codebook(), &embedding.unit);
        let int8 = embedding.quantize();
        let weights: Vec<f32> = terms.iter().map(|&(_, _, weight)| weight).collect();
        let terms: Vec<(TermId, u32)> = terms
            .into_iter()
            .map(|(term, count, _)| (term, count))
            .collect();
        let scorer = HybridScorer::weighted(
            &terms,
            &weights,
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

/// The id of the row in `slot`.
fn row_in(arena: &Arena, slot: Slot) -> RowId {
    RowId(arena.page(slot.page).row_ids[slot.index as usize])
}

/// The row in `slot` as a result with `score`.
fn retrieved(arena: &Arena, slot: Slot, score: f32) -> Retrieved {
    Retrieved {
        row: row_in(arena, slot),
        user: UserId(arena.page(slot.page).user),
        score,
    }
}

fn rank(mut hits: Vec<Retrieved>, k: usize) -> Vec<Retrieved> {
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.row.cmp(&b.row)));
    hits.truncate(k);
    hits
}

/// The neighbours whose own scores the score in context of the row in `slot` reads: up to
/// `CONTEXT_BEFORE.len()` earlier rows of its conversation and as many later ones as it has
/// shares for ([`after_shares`]), nearest first.
type Context = (
    [Option<Slot>; CONTEXT_BEFORE.len()],
    [Option<Slot>; OPENING_AFTER.len()],
);

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

/// [`search`] from stage one's `wide` hits (in slot key order) on: stage two, the exact rescore
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
            .map(|hit| {
                let slot = Slot::from_key(hit.key);
                (row_in(arena, slot), slot)
            })
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
        let row = row_in(arena, slot);
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
                                key: slot.key(),
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
                        .map(|hit| retrieved(arena, Slot::from_key(hit.key), hit.score))
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}
