//! Scoring kernels, each with a dull scalar twin that reads like the specification.
//!
//! - `two_bit`: the dense sum of the first pass over 2-bit codes, `Σ_p T_p[n_p]`: the code of a
//!   row is one nibble `n_p` per pair of dimensions `p` (sign and magnitude bit of each), and
//!   the query a table `T_p` of 16 integer entries per pair ([`TwoBitQuery`]). Codes are stored
//!   in groups of [`LUT_ROWS`] rows, and inside a group in chunks of [`CHUNK_BYTES`] bytes,
//!   chunk-major ([`code_offset`]): one 512-bit register holds the same chunk of 16 rows, so
//!   one table lookup (`VPERMB`, a 64-entry table: the 16 entries of each of the chunk's four
//!   byte positions) scores four pairs of dimensions of 16 rows at once, and one `VPDPBUSD`
//!   adds each row's four entries into its 32-bit sum. The "fast scan" of faiss's 4-bit PQ,
//!   with the sum done by the VNNI dot product instead of 16-bit adds.
//! - `dot_i8`: int8 dot product into i32 (the rescore of quantised vectors).
//! - `dot_f32`: f32 dot product (the exact dense rescore).
//! - `signature`: for each row, the summed weights of the query terms whose bits its lexical
//!   signature all has (the first pass's lexical estimate). Signatures are stored in blocks of
//!   [`BLOCK_ROWS`] rows, word-major inside a block (word `w` of row `r` of block `b` at
//!   `(b · words + w) · BLOCK_ROWS + r`), so one 512-bit register holds the same word of eight
//!   rows.
//!
//! Implementations:
//! - `scalar`: plain loops.
//! - `wide`: 256-bit vectors through the `wide` crate, whose instructions are fixed at compile
//!   time by the baseline in `.cargo/config.toml` (AVX2 and FMA).
//! - `avx512`: `core::arch` AVX-512 table lookups (`VPERMB`, AVX-512 VBMI) summed by `VPDPBUSD`
//!   (AVX-512 VNNI) for the 2-bit sum, or on a CPU with AVX-512 BW but not those two, four
//!   merge-masked `VPSHUFB` lookups a register summed by `VPMADDUBSW` and `VPMADDWD`
//!   (`Isa::Avx512Bw`); and a bit test (and, compare) into a mask register with a masked add
//!   (AVX-512 F and VL) for the signature weights; each chosen only when the CPU reports the
//!   features at start-up. The lookups replaced a bit-plane popcount kernel
//!   (VPOPCNTDQ, 27 popcounts per code word of eight rows, its cost linear in the weights'
//!   bits), then a byte-major `VPSHUFB` kernel with 16-bit entries, which did twice the
//!   lookups and four blends and shifts per code line (`docs/journal/benchmarks.md`). A VNNI int8 dot
//!   over the rows' 256-byte vectors was measured and did not pay: out of cache it ran at
//!   0.87-0.96x the `wide` kernel (`docs/journal/benchmarks.md`), so there is none.
//! - `avx2`: `core::arch` AVX2 for the 2-bit sum on CPUs without AVX-512: 32 rows' chunks
//!   regrouped by shuffles and unpacks so that a register holds one byte place of 32 rows,
//!   one `VPSHUFB` lookup a nibble, summed in 16 bits by `VPMADDUBSW` (`Isa::Avx2`; it replaced
//!   a form that looked up each nibble in all four places' tables, a quarter of each lookup
//!   useful, 1.66-1.86x slower: `docs/journal/benchmarks.md`); and for the signature weights on CPUs
//!   without AVX-512 VL, a 64-bit bit test per row and an add of the weight masked by it; each
//!   chosen after runtime detection.
//!
//! [`Kernels::detect`] picks one implementation per kernel once, on purpose, and the choice is
//! logged by the caller. Integer kernels agree bit for bit with the scalar twin (proptests in
//! `tests.rs`); the f32 kernel sums in another order and agrees within a stated tolerance.

#[allow(unsafe_code)]
pub mod avx2;
#[allow(unsafe_code)]
pub mod avx512;
pub mod scalar;
#[cfg(test)]
mod tests;
pub mod wide_impl;

/// Rows per block of the blocked signature layout.
pub const BLOCK_ROWS: usize = 8;

/// Words of a one-bit-per-dimension column (a lexical signature) for `dims` bits.
pub fn code_words(dims: usize) -> usize {
    dims.div_ceil(64)
}

/// Which implementation a kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Wide,
    Avx512,
    /// AVX-512 without the VBMI and VNNI the 2-bit kernel's `Avx512` form needs (AVX-512 BW
    /// only, as on Skylake and Cascade Lake servers).
    Avx512Bw,
    /// AVX2 through `core::arch`, for the stage-one kernels on CPUs without AVX-512.
    Avx2,
}

/// Rows per group of the 2-bit code layout.
pub const LUT_ROWS: usize = 64;
/// Code bytes per chunk of the 2-bit code layout: four bytes (eight pairs) of a row lie
/// together, one 32-bit lane of a register.
pub const CHUNK_BYTES: usize = 4;
/// Rows whose chunk fills a 512-bit register.
const CHUNK_ROWS: usize = 64 / CHUNK_BYTES;
const _: () = assert!(LUT_ROWS.is_multiple_of(CHUNK_ROWS));

/// Where byte `byte` of row `row` of a group lies inside the group's codes: chunk
/// `byte / CHUNK_BYTES` of the group's rows in row order, each chunk's bytes together.
#[inline]
pub fn code_offset(row: usize, byte: usize) -> usize {
    ((byte / CHUNK_BYTES) * LUT_ROWS + row) * CHUNK_BYTES + byte % CHUNK_BYTES
}

/// 2-bit sums of `query` against grouped `codes` (see [`scalar::two_bit`], the
/// specification): `out.len()` rows, a multiple of [`LUT_ROWS`], `codes` holding at least
/// `out.len() · query.code_bytes()` bytes. `ahead` is a hint that changes no result: where the
/// caller's next codes lie, to load while the kernel computes ([`Lookahead`]).
pub type TwoBitFn = fn(query: &TwoBitQuery, codes: &[u8], out: &mut [i32], ahead: Lookahead);

/// How far ahead of what it reads a streaming kernel starts loading: with each 64-byte line at
/// `p` it reads, the line at `p + near` bytes into the first-level cache ([`prefetch`]) and the
/// line at `p + far` into the second-level one ([`prefetch_l2`]); 0 loads nothing. A distance
/// may be negative (a group scope's next page may lie before this one). A hint only: it changes
/// no result. Stage one passes the distances to the next sketch and the one after.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lookahead {
    pub near: isize,
    pub far: isize,
}
/// Dot products of `query` against each row of `rows` (`out.len()` rows of `query.len()`).
pub type DotI8Fn = fn(query: &[i8], rows: &[i8], out: &mut [i32]);
/// Dot product of two equally long f32 vectors.
pub type DotF32Fn = fn(a: &[f32], b: &[f32]) -> f32;
/// Lexical-signature weights (see [`signature_weights`], the specification).
pub type SignatureFn =
    fn(terms: &[SignatureTerm], words: usize, signatures: &[u64], out: &mut [f32]);
/// Which of at most 64 `values` are at least `floor`: bit `i` of the result set where
/// `values[i] >= floor` (see [`scalar::at_least`], the specification). Stage one offers a
/// page's rows to its top-k by walking the set bits.
pub type AtLeastFn = fn(values: &[f32], floor: f32) -> u64;

/// The widest instructions [`Kernels::detect`] may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Ceiling {
    /// The fastest this CPU runs.
    Native,
    /// No AVX-512: the kernels an AVX2-only CPU runs, measurable on any CPU that has more.
    Avx2,
    /// The scalar twins only.
    Scalar,
}

/// The kernels chosen for this process.
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    pub two_bit: TwoBitFn,
    pub two_bit_isa: Isa,
    pub dot_i8: DotI8Fn,
    pub dot_i8_isa: Isa,
    pub dot_f32: DotF32Fn,
    pub dot_f32_isa: Isa,
    pub signature: SignatureFn,
    pub signature_isa: Isa,
    pub at_least: AtLeastFn,
    pub at_least_isa: Isa,
}

impl Kernels {
    /// Every kernel scalar (the `--scalar-kernels` switch, and the reference in tests).
    pub const SCALAR: Self = Self {
        two_bit: scalar::two_bit,
        two_bit_isa: Isa::Scalar,
        dot_i8: scalar::dot_i8,
        dot_i8_isa: Isa::Scalar,
        dot_f32: scalar::dot_f32,
        dot_f32_isa: Isa::Scalar,
        signature: signature_weights,
        signature_isa: Isa::Scalar,
        at_least: scalar::at_least,
        at_least_isa: Isa::Scalar,
    };

    /// The fastest implementation of each kernel that this CPU runs within `ceiling`.
    pub fn detect(ceiling: Ceiling) -> Self {
        if ceiling == Ceiling::Scalar {
            return Self::SCALAR;
        }
        let avx512_allowed = ceiling == Ceiling::Native;
        let mut k = Self {
            two_bit: scalar::two_bit,
            two_bit_isa: Isa::Scalar,
            dot_i8: wide_impl::dot_i8,
            dot_i8_isa: Isa::Wide,
            dot_f32: wide_impl::dot_f32,
            dot_f32_isa: Isa::Wide,
            signature: signature_weights,
            signature_isa: Isa::Scalar,
            at_least: wide_impl::at_least,
            at_least_isa: Isa::Wide,
        };
        if avx512_allowed && avx512::has_lookup() {
            k.two_bit = avx512::two_bit;
            k.two_bit_isa = Isa::Avx512;
        } else if avx512_allowed && avx512::has_bw() {
            k.two_bit = avx512::two_bit_bw;
            k.two_bit_isa = Isa::Avx512Bw;
        } else if avx2::has_avx2() {
            k.two_bit = avx2::two_bit;
            k.two_bit_isa = Isa::Avx2;
        }
        if avx512_allowed && avx512::has_vl() {
            k.signature = avx512::signature_weights;
            k.signature_isa = Isa::Avx512;
        } else if avx2::has_avx2() {
            k.signature = avx2::signature_weights;
            k.signature_isa = Isa::Avx2;
        }
        k
    }

    /// One line naming each choice, for the start-up log.
    pub fn describe(&self) -> String {
        format!(
            "two_bit={:?} dot_i8={:?} dot_f32={:?} signature={:?} at_least={:?}",
            self.two_bit_isa,
            self.dot_i8_isa,
            self.dot_f32_isa,
            self.signature_isa,
            self.at_least_isa
        )
    }
}

/// Every form of the 2-bit kernel this CPU runs, scalar first (for the equivalence tests and
/// the kernel benchmark; [`Kernels::detect`] picks one).
pub fn two_bit_forms() -> Vec<(Isa, TwoBitFn)> {
    let mut forms: Vec<(Isa, TwoBitFn)> = vec![(Isa::Scalar, scalar::two_bit)];
    if avx512::has_lookup() {
        forms.push((Isa::Avx512, avx512::two_bit));
    }
    if avx512::has_bw() {
        forms.push((Isa::Avx512Bw, avx512::two_bit_bw));
    }
    if avx2::has_avx2() {
        forms.push((Isa::Avx2, avx2::two_bit));
    }
    forms
}

/// Every form of the signature kernel this CPU runs, the plain loop first.
pub fn signature_forms() -> Vec<(Isa, SignatureFn)> {
    let mut forms: Vec<(Isa, SignatureFn)> = vec![(Isa::Scalar, signature_weights)];
    if avx512::has_vl() {
        forms.push((Isa::Avx512, avx512::signature_weights));
    }
    if avx2::has_avx2() {
        forms.push((Isa::Avx2, avx2::signature_weights));
    }
    forms
}

/// Ask the CPU to start loading the cache line holding `p`: a hint that never faults and
/// changes no result, for scans that know which rows they read next but not in an order the
/// hardware prefetcher follows.
#[inline]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    hint::<{ std::arch::x86_64::_MM_HINT_T0 }, T>(p);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// [`prefetch`] into the second-level cache only (`PREFETCHT2`): for lines needed a step after
/// the next, which then come from the L2 when [`prefetch`] asks for them, so the first-level
/// cache's few outstanding misses are held for a shorter time (`docs/journal/benchmarks.md`, "Stage
/// one loads two sketches ahead").
#[inline]
pub fn prefetch_l2<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    hint::<{ std::arch::x86_64::_MM_HINT_T2 }, T>(p);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline]
fn hint<const LEVEL: i32, T>(p: *const T) {
    // SAFETY: PREFETCHh belongs to SSE, part of every x86-64 CPU; prefetching any address,
    // valid or not, never faults and brings nothing into the program's state.
    unsafe { std::arch::x86_64::_mm_prefetch::<LEVEL>(p.cast()) }
}

/// Entries of a pair's table: one per nibble.
pub const PAIR_ENTRIES: usize = 16;
/// Largest magnitude of a table entry: entries are `i8`, the operand `VPDPBUSD` multiplies.
/// A pair's contribution is rounded once on a step of 1/127 of the largest entry; the sum of
/// 128 of them is exact in 32 bits.
pub const LUT_ENTRY_MAX: i8 = 127;
/// Pairs of dimensions in a chunk of code bytes (two a byte).
pub const PAIRS_PER_CHUNK: usize = 2 * CHUNK_BYTES;

/// A query's per-pair tables as the 2-bit kernel reads them: entry `n` of pair `p` is what a
/// row whose nibble for `p` is `n` adds to its sum. Kept twice: pair by pair (the
/// specification), and as the kernel's lookup tables, two of 64 entries per chunk: entry
/// `16 j + n` of the first is entry `n` of the low-nibble pair of the chunk's byte `j`, of the
/// second that of its high-nibble pair (the operands of `VPERMB`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TwoBitQuery {
    /// Entry `n` of pair `p` at `p · 16 + n`.
    table: Vec<i8>,
    lookup: Vec<i8>,
}

impl TwoBitQuery {
    /// Tables for `table.len() / 16` pairs, a multiple of [`PAIRS_PER_CHUNK`]; every entry
    /// within `±LUT_ENTRY_MAX`.
    pub fn new(table: Vec<i8>) -> Self {
        assert!(
            table.len().is_multiple_of(PAIR_ENTRIES * PAIRS_PER_CHUNK),
            "whole chunks of pairs only"
        );
        assert!(
            table
                .iter()
                .all(|e| e.unsigned_abs() <= LUT_ENTRY_MAX.unsigned_abs()),
            "a table entry past LUT_ENTRY_MAX"
        );
        let chunks = table.len() / (PAIR_ENTRIES * PAIRS_PER_CHUNK);
        let lookup = (0..chunks)
            .flat_map(|c| {
                let table = &table;
                (0..2).flat_map(move |half| {
                    (0..CHUNK_BYTES * PAIR_ENTRIES).map(move |at| {
                        let (j, n) = (at / PAIR_ENTRIES, at % PAIR_ENTRIES);
                        table[(2 * (CHUNK_BYTES * c + j) + half) * PAIR_ENTRIES + n]
                    })
                })
            })
            .collect();
        Self { table, lookup }
    }

    /// Pairs of dimensions.
    pub fn pairs(&self) -> usize {
        self.table.len() / PAIR_ENTRIES
    }

    /// Code bytes per row (two pairs each).
    pub fn code_bytes(&self) -> usize {
        self.pairs() / 2
    }

    /// Entry `nibble` of pair `pair`.
    pub fn entry(&self, pair: usize, nibble: u8) -> i32 {
        i32::from(self.table[pair * PAIR_ENTRIES + usize::from(nibble)])
    }
}

/// A vector form of the 2-bit kernel, compiled for CPU features detected at run time.
#[cfg(target_arch = "x86_64")]
type TwoBitKernel = unsafe fn(&TwoBitQuery, &[u8], &mut [i32], Lookahead);

/// Run the 2-bit kernel's vector form `kernel` (`form` in messages) once `supported`, the
/// run-time detection of the CPU features it is compiled for, holds, and with it what every
/// form relies on: whole groups, and `codes` holding every group `out` asks for.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn checked_two_bit(
    (supported, form, kernel): (bool, &str, TwoBitKernel),
    query: &TwoBitQuery,
    codes: &[u8],
    out: &mut [i32],
    ahead: Lookahead,
) {
    assert!(supported, "{form} called without the CPU features it needs");
    assert_eq!(out.len() % LUT_ROWS, 0, "whole groups only");
    assert!(
        codes.len() >= out.len() * query.code_bytes(),
        "codes shorter than out"
    );
    // SAFETY: the first assert checked the CPU features `kernel` is compiled for; the others
    // guarantee whole groups and that `codes` holds every group `out` asks for, and
    // `TwoBitQuery::new` that its lookup tables hold 128 entries for each of the
    // `code_bytes() / 4` chunks, which bounds each of the kernel's loads and stores.
    unsafe { kernel(query, codes, out, ahead) }
}

/// A vector form of the signature kernel, compiled for CPU features detected at run time.
#[cfg(target_arch = "x86_64")]
type SignatureKernel = unsafe fn(&[SignatureTerm], usize, &[u64], &mut [f32]);

/// Run the signature kernel's vector form `kernel` (`form` in messages) once `supported`, the
/// run-time detection of the CPU features it is compiled for, holds, and with it what every
/// form relies on: whole blocks, `signatures` holding every block `out` asks for, and every
/// term's word inside a row's signature.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn checked_signature(
    (supported, form, kernel): (bool, &str, SignatureKernel),
    terms: &[SignatureTerm],
    words: usize,
    signatures: &[u64],
    out: &mut [f32],
) {
    assert!(supported, "{form} called without the CPU features it needs");
    assert_eq!(out.len() % BLOCK_ROWS, 0, "whole blocks only");
    assert!(
        signatures.len() >= out.len() * words,
        "signatures shorter than out"
    );
    assert!(
        terms.iter().all(|t| t.word < words),
        "a term names a word past the signature"
    );
    // SAFETY: the first assert checked the CPU features `kernel` is compiled for; the others
    // guarantee whole blocks, that `signatures` holds every block `out` asks for, and that
    // every term's word lies inside a block, which bounds each of the kernel's loads and
    // stores.
    unsafe { kernel(terms, words, signatures, out) }
}

/// A query term as the lexical-signature kernel reads it: which word of the signature holds
/// its bits, the bits as a mask, and the weight it adds when every bit of the mask is set (the
/// empty mask is always set).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SignatureTerm {
    pub word: usize,
    pub mask: u64,
    pub weight: f32,
}

/// For each row of blocked `signatures` (same layout as the code bits, `words` u64 per row):
/// `out[r]` = the sum of the weights of the `terms` whose bits row `r` all has. Written block by
/// block, term by term, so the eight rows of a block are one vertical operation the compiler
/// vectorises at the baseline; a single plain loop, so it is its own specification.
pub fn signature_weights(
    terms: &[SignatureTerm],
    words: usize,
    signatures: &[u64],
    out: &mut [f32],
) {
    for (block, acc) in signatures
        .chunks_exact(words * BLOCK_ROWS)
        .zip(out.chunks_exact_mut(BLOCK_ROWS))
    {
        acc.fill(0.0);
        for term in terms {
            let lanes = &block[term.word * BLOCK_ROWS..(term.word + 1) * BLOCK_ROWS];
            for (a, &w) in acc.iter_mut().zip(lanes) {
                *a += if w & term.mask == term.mask {
                    term.weight
                } else {
                    0.0
                };
            }
        }
    }
}
