//! From stored tokens to the retrieval representation: one pure, deterministic function.
//!
//! [`derive`] turns a stored row (its tokens, and the speaker's name it was captured with) into
//! its [`RetrievalRow`]: the distinct tokens with counts (the dense part's input) and the
//! lexical terms with counts. It needs only what the row stores and the dictionary, so every
//! retrieval row can be re-derived from the store at any time. The speaker's name is part of
//! the representation because questions name who said what ("When did Caroline ...?"); on
//! LoCoMo it is worth 8 points of BM25 recall@10 (`docs/journal/benchmarks.md`).
//!
//! [`embed`] turns a retrieval row into its dense [`Embedding`] under the shared frequency
//! statistic *at score time*: a SIF-weighted mean of the tokens' table vectors. Because the
//! weights are applied when scoring, nothing stored is rewritten when counts change. The
//! embedding also yields the compact codes the scan's first pass uses (int8 with a scale, and
//! one sign bit per dimension).

use super::Dictionary;
use super::stats::{FrequencyStats, FrequencyTable};
use crate::codec::{CodecError, Put as _, Reader};
use crate::tokens::Tokenizer;
use crate::types::{TermId, TokenId};

/// Leading byte of an encoded retrieval row; bump it when the encoding changes. Rows stored
/// under [`ROW_ENCODING_FIXED`] still decode.
const ROW_ENCODING: u8 = 2;
/// The first encoding, every field fixed-width: a token entry 8 bytes, a term entry 12.
const ROW_ENCODING_FIXED: u8 = 1;

/// The retrieval row derived from one stored row's tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrievalRow {
    /// The dictionary version this row was derived under.
    pub dictionary_version: String,
    /// Number of tokens counted in `tokens` (the row's text plus its speaker's name).
    pub token_len: u32,
    /// Distinct token ids with their counts, sorted by id.
    pub tokens: Vec<(TokenId, u32)>,
    /// Distinct lexical terms with their counts, sorted by id.
    pub terms: Vec<(TermId, u32)>,
}

/// A row's dense vector under one frequency statistic, L2-normalised (all zeros when no token
/// of the row has a table vector).
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    pub unit: Vec<f32>,
}

/// An int8 copy of an embedding: `unit[i] ≈ scale × values[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantized {
    pub values: Vec<i8>,
    pub scale: f32,
}

/// Derive the retrieval row of one stored row: its text `tokens` and the speaker `name` it was
/// captured with, under `dict`. The name's tokens and words count like the text's.
pub fn derive(
    dict: &Dictionary,
    tokenizer: &Tokenizer,
    name: Option<&str>,
    tokens: &[TokenId],
) -> RetrievalRow {
    let mut text = String::new();
    let mut all = Vec::with_capacity(tokens.len() + 4);
    if let Some(name) = name {
        text.push_str(name);
        text.push('\n');
        all.extend(tokenizer.encode(name));
    }
    text.push_str(&tokenizer.decode_lossy(tokens));
    all.extend_from_slice(tokens);
    all.sort_unstable();
    let mut counted: Vec<(TokenId, u32)> = Vec::with_capacity(all.len());
    for token in &all {
        match counted.last_mut() {
            Some((last, count)) if last == token => *count += 1,
            _ => counted.push((*token, 1)),
        }
    }
    RetrievalRow {
        dictionary_version: dict.version().to_owned(),
        token_len: u32::try_from(all.len()).unwrap_or(u32::MAX),
        tokens: counted,
        terms: dict.lexical().terms(&text),
    }
}

/// The SIF weight of `token`: `a / (a + p(t))`, where `p(t)` is the token's share of the
/// corpus smoothed towards the dictionary's Zipf prior with `prior_mass_tokens` pseudo-tokens:
/// `p(t) = (count(t) + m·prior(t)) / (total + m)`. A cold memory weighs by the prior alone; a
/// large one by its own counts.
pub fn token_weight(dict: &Dictionary, stats: &impl FrequencyStats, token: TokenId) -> f32 {
    let w = dict.weighting();
    let mass = w.prior_mass_tokens;
    let p = (stats.token_count(token) as f64 + mass * dict.prior(token))
        / (stats.total_tokens() as f64 + mass);
    (w.a / (w.a + p)) as f32
}

/// The dense embedding of `row` under `stats`.
pub fn embed(dict: &Dictionary, stats: &impl FrequencyStats, row: &RetrievalRow) -> Embedding {
    embed_tokens(dict, stats, row.tokens.iter().copied())
}

/// Tokens ahead of the one being summed whose vectors [`embed_tokens`] starts loading, and
/// further ahead, where in the table those vectors are (their row index).
pub const PREFETCH_TOKENS_AHEAD: usize = 4;
pub const PREFETCH_INDEX_AHEAD: usize = 8;

/// Start loading what [`embed_tokens`] reads to add `token`: its vector and scale, and its
/// count in `stats` (a cache hint).
pub fn prefetch_token(dict: &Dictionary, stats: &impl FrequencyStats, token: TokenId) {
    dict.prefetch_vector(token);
    stats.prefetch_token_count(token);
}

/// The dense embedding of a row's distinct tokens with their counts under `stats`, in two
/// passes. The first weighs each token (a chain of divisions: apart from the sums, the chains
/// of many tokens overlap, where beside them their latency was most of the time), reading
/// the tokens three times: [`PREFETCH_TOKENS_AHEAD`] places ahead to load their vectors and
/// counts early ([`prefetch_token`]), and [`PREFETCH_INDEX_AHEAD`] places ahead to load where
/// those vectors are ([`Dictionary::prefetch_row_index`]): the exact rescore embeds hundreds
/// of rows a query, and waiting on the table was most of its time. The second sums the
/// weighted vectors two tokens a pass over the sums: the same additions in the same order,
/// with half the loads and stores of the sums.
pub fn embed_tokens<I>(dict: &Dictionary, stats: &impl FrequencyStats, tokens: I) -> Embedding
where
    I: IntoIterator<Item = (TokenId, u32)>,
    I::IntoIter: Clone,
{
    let tokens = tokens.into_iter();
    let mut ahead = tokens.clone().skip(PREFETCH_TOKENS_AHEAD);
    let mut further = tokens.clone().skip(PREFETCH_INDEX_AHEAD);
    let weighted: Vec<(f32, &[i8])> = tokens
        .filter_map(|(token, count)| {
            if let Some((later, _)) = further.next() {
                dict.prefetch_row_index(later);
            }
            if let Some((next, _)) = ahead.next() {
                prefetch_token(dict, stats, next);
            }
            let (scale, values) = dict.vector(token)?;
            Some((
                token_weight(dict, stats, token) * count as f32 * scale,
                values,
            ))
        })
        .collect();
    let mut acc = vec![0f32; dict.dims()];
    let (pairs, last) = weighted.as_chunks::<2>();
    for [(w1, v1), (w2, v2)] in pairs {
        for ((a, &x), &y) in acc.iter_mut().zip(*v1).zip(*v2) {
            *a = *a + w1 * f32::from(x) + w2 * f32::from(y);
        }
    }
    for (w, values) in last {
        for (a, &v) in acc.iter_mut().zip(*values) {
            *a += w * f32::from(v);
        }
    }
    let mut embedding = Embedding { unit: acc };
    embedding.normalise();
    embedding
}

impl Embedding {
    /// Scale to unit length (all zeros stay zeros).
    pub fn normalise(&mut self) {
        let norm = self.unit.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            self.unit.iter_mut().for_each(|x| *x /= norm);
        }
    }

    /// Symmetric int8 quantisation with one scale: `max |x| ↦ 127`, round half away from zero.
    pub fn quantize(&self) -> Quantized {
        let max = self.unit.iter().fold(0f32, |m, x| m.max(x.abs()));
        if max == 0.0 {
            return Quantized {
                values: vec![0; self.unit.len()],
                scale: 0.0,
            };
        }
        let scale = max / 127.0;
        let values = self
            .unit
            .iter()
            .map(|x| (x / scale).round().clamp(-127.0, 127.0) as i8)
            .collect();
        Quantized { values, scale }
    }
}

impl RetrievalRow {
    /// Sum of the term counts: the row's length for BM25.
    pub fn term_len(&self) -> u64 {
        self.terms.iter().map(|&(_, c)| u64::from(c)).sum()
    }

    /// Count this row into `table`.
    pub fn count_into(&self, table: &mut FrequencyTable) {
        table.add_row(
            &self.tokens,
            self.terms.iter().map(|&(term, _)| term),
            u64::from(self.token_len),
            self.term_len(),
        );
    }

    /// The row's stored bytes (little-endian, `v` an unsigned LEB128 varint; grammar in
    /// `docs/format.md`): `2:u8 version_len:u8 version token_len:v n:v (gap:v count:v)×n m:v
    /// (term:u64 count:v)×m`, each token id as its gap from the one before (the first from 0).
    /// A token entry takes two or three bytes instead of the first encoding's eight; a term's
    /// id is a hash, whose gaps are as wide as the ids, so it stays eight bytes.
    pub fn encode(&self) -> Vec<u8> {
        let version = self.dictionary_version.as_bytes();
        let mut out =
            Vec::with_capacity(8 + version.len() + self.tokens.len() * 3 + self.terms.len() * 9);
        out.put_u8(ROW_ENCODING);
        out.put_u8(u8::try_from(version.len()).expect("dictionary versions are at most 255 bytes"));
        out.extend_from_slice(version);
        out.put_varint(u64::from(self.token_len));
        out.put_varint(self.tokens.len() as u64);
        let mut previous = 0;
        for &(token, count) in &self.tokens {
            let gap = token
                .0
                .checked_sub(previous)
                .expect("a retrieval row's tokens are sorted by id");
            out.put_varint(u64::from(gap));
            out.put_varint(u64::from(count));
            previous = token.0;
        }
        out.put_varint(self.terms.len() as u64);
        for &(term, count) in &self.terms {
            out.put_u64(term.0);
            out.put_varint(u64::from(count));
        }
        out
    }

    /// Decode [`RetrievalRow::encode`]'s bytes, or a row stored under the first encoding;
    /// anything malformed is a typed error.
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        let mut r = Reader::new("retrieval row", bytes);
        let tag = r.u8()?;
        if tag != ROW_ENCODING && tag != ROW_ENCODING_FIXED {
            return Err(r.error(format!("unknown encoding tag {tag}")));
        }
        let version_len = usize::from(r.u8()?);
        let version = std::str::from_utf8(r.slice(version_len)?)
            .map_err(|_| r.error("version is not UTF-8"))?
            .to_owned();
        // The first encoding writes each id whole, the current one a token's gap from the one
        // before; counts and lengths fixed-width or as varints.
        let varint = tag == ROW_ENCODING;
        let token_len = r.u32_or_varint(varint)?;
        let n = if varint {
            r.varint_count(2)?
        } else {
            r.count(8)?
        };
        let mut tokens = Vec::with_capacity(n);
        let mut previous = 0u32;
        for _ in 0..n {
            let written = r.u32_or_varint(varint)?;
            let token = if varint {
                previous
                    .checked_add(written)
                    .ok_or_else(|| r.error("token id over 32 bits"))?
            } else {
                written
            };
            tokens.push((TokenId(token), r.u32_or_varint(varint)?));
            previous = token;
        }
        let m = if varint {
            r.varint_count(9)?
        } else {
            r.count(12)?
        };
        let mut terms = Vec::with_capacity(m);
        for _ in 0..m {
            terms.push((TermId(r.u64()?), r.u32_or_varint(varint)?));
        }
        r.finish()?;
        Ok(Self {
            dictionary_version: version,
            token_len,
            tokens,
            terms,
        })
    }
}
