//! Stage two: stage one's hits narrowed by the int8 cosine, then scored with the exact lexical
//! part, down to the candidates of the exact rescore.

use super::*;

/// Hits per stage-two task: enough work per task to outweigh scheduling, small enough that a
/// few thousand hits still spread over every thread.
const REFINE_CHUNK_HITS: usize = 1024;

/// How far ahead stage two starts loading a candidate's columns, and its terms (which need the
/// columns' entry offset first).
const PREFETCH_ROWS_AHEAD: usize = 8;

const PREFETCH_TERMS_AHEAD: usize = 4;

/// Stage two, in two steps. First it narrows stage one's hits to [`narrow_k`] by stage one's
/// estimate with the int8 cosine in place of the 2-bit one ([`narrow`]: only the row's vector
/// and scale are read). Then it scores those with the exact lexical part (BM25 over the row's resident terms)
/// and the int8 cosine, and keeps the `k` best, ties by slot key ([`score_lexical`]). The result
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
/// own top `k` (merged deterministically). `score` sees each hit, with
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
        let slots: Vec<Slot> = chunk.iter().map(|hit| Slot::from_key(hit.key)).collect();
        for (n, (hit, &slot)) in chunk.iter().zip(&slots).enumerate() {
            if let Some(&ahead) = slots.get(n + PREFETCH_ROWS_AHEAD) {
                if cosine_from == Cosine::Computed {
                    arena.prefetch_vector(ahead);
                }
                if lexical {
                    arena.prefetch_lexical(ahead);
                }
            }
            if lexical && let Some(&ahead) = slots.get(n + PREFETCH_TERMS_AHEAD) {
                arena.prefetch_terms(ahead);
            }
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

/// The `keep` best of `hits` by stage one's estimate with the int8 cosine in place of the 2-bit
/// one: the lexical part is the one stage one computed from the signature and carried in the
/// hit, so only the row's vector and scale are read. Returned in key order, each hit
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
                key: hit.key,
            });
        },
    )
    .into_key_order()
}

/// The `k` best of `hits` by the int8 cosine (computed, or carried from [`narrow`]) and the
/// exact lexical part. Every hit's terms are read: a bound from the signature (each query term
/// it may hold at BM25's ceiling) skipped none of them, at a million synthetic rows or on
/// LoCoMo and RealMem (`docs/journal/benchmarks.md`), and cost four more lines a row.
fn score_lexical(
    arena: &Arena,
    kernels: &Kernels,
    query: &PreparedQuery,
    hits: &[Hit],
    k: usize,
    cosine: Cosine,
) -> Vec<Hit> {
    walk_hits(
        arena,
        kernels,
        query,
        hits,
        k,
        (cosine, true),
        |top, hit, slot, cosine| {
            let entries = arena.row_entries(slot);
            top.push(Hit {
                score: query
                    .scorer
                    .score_with_cosine(entries.terms, entries.len, cosine),
                carried: 0.0,
                key: hit.key,
            });
        },
    )
    .into_sorted()
}
