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
//!   lookups and four blends and shifts per code line (`docs/benchmarks.md`). A VNNI int8 dot
//!   over the rows' 256-byte vectors was measured and did not pay: out of cache it ran at
//!   0.87-0.96x the `wide` kernel (`docs/benchmarks.md`), so there is none.
//! - `avx2`: `core::arch` AVX2 for the 2-bit sum on CPUs without AVX-512: 32 rows' chunks
//!   regrouped by shuffles and unpacks so that a register holds one byte place of 32 rows,
//!   one `VPSHUFB` lookup a nibble, summed in 16 bits by `VPMADDUBSW` (`Isa::Avx2`; it replaced
//!   a form that looked up each nibble in all four places' tables, a quarter of each lookup
//!   useful, 1.66-1.86x slower: `docs/benchmarks.md`); and for the signature weights on CPUs
//!   without AVX-512 VL, a 64-bit bit test per row and an add of the weight masked by it; each
//!   chosen after runtime detection.
//!
//! [`Kernels::detect`] picks one implementation per kernel once, on purpose, and the choice is
//! logged by the caller. Integer kernels agree bit for bit with the scalar twin (proptests
//! below); the f32 kernel sums in another order and agrees within a stated tolerance.

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

    /// The fastest implementation of each kernel that this CPU runs, or all scalar when
    /// `force_scalar`.
    pub fn detect(force_scalar: bool) -> Self {
        if force_scalar {
            return Self::SCALAR;
        }
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
        if avx512::has_lookup() {
            k.two_bit = avx512::two_bit;
            k.two_bit_isa = Isa::Avx512;
        } else if avx512::has_bw() {
            k.two_bit = avx512::two_bit_bw;
            k.two_bit_isa = Isa::Avx512Bw;
        } else if avx2::has_avx2() {
            k.two_bit = avx2::two_bit;
            k.two_bit_isa = Isa::Avx2;
        }
        if avx512::has_vl() {
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
/// cache's few outstanding misses are held for a shorter time (`docs/benchmarks.md`, "Stage
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

/// The specification.
pub mod scalar {
    use super::{LUT_ROWS, TwoBitQuery};

    /// For each row: `Σ_p T_p[n_p]` over its pairs, `n_p` its nibble for pair `p`: the low
    /// nibble of code byte `p / 2` for even `p`, the high one for odd `p`. Loads nothing
    /// ahead (`_ahead` is a hint).
    pub fn two_bit(query: &TwoBitQuery, codes: &[u8], out: &mut [i32], _ahead: super::Lookahead) {
        let bytes = query.code_bytes();
        for (group, sums) in codes
            .chunks_exact(bytes * LUT_ROWS)
            .zip(out.chunks_exact_mut(LUT_ROWS))
        {
            for (r, sum) in sums.iter_mut().enumerate() {
                *sum = (0..query.pairs())
                    .map(|p| {
                        let byte = group[super::code_offset(r, p / 2)];
                        query.entry(p, byte >> (4 * (p % 2)) & 0x0F)
                    })
                    .sum();
            }
        }
    }

    pub fn dot_i8(query: &[i8], rows: &[i8], out: &mut [i32]) {
        let dims = query.len();
        for (o, row) in out.iter_mut().zip(rows.chunks_exact(dims)) {
            *o = query
                .iter()
                .zip(row)
                .map(|(&q, &r)| i32::from(q) * i32::from(r))
                .sum();
        }
    }

    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    pub fn at_least(values: &[f32], floor: f32) -> u64 {
        assert!(values.len() <= 64, "at most 64 values");
        values
            .iter()
            .enumerate()
            .filter(|&(_, &v)| v >= floor)
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }
}

/// 256-bit vectors via `wide` (AVX2 and FMA under the shipped baseline).
pub mod wide_impl {
    use wide::{f32x8, i8x16, i16x16, i32x8};

    /// Full 16-lane chunks through `i16x16::dot` (VPMADDWD), the tail in scalar. The query is
    /// widened chunk by chunk (no allocation), so a call for one row costs one row.
    pub fn dot_i8(query: &[i8], rows: &[i8], out: &mut [i32]) {
        let dims = query.len();
        let full = dims / 16 * 16;
        let widen = |c: &[i8]| i16x16::from_i8x16(i8x16::new(c.try_into().expect("16 lanes")));
        for (o, row) in out.iter_mut().zip(rows.chunks_exact(dims)) {
            let mut acc = i32x8::ZERO;
            for (q, r) in query[..full]
                .chunks_exact(16)
                .zip(row[..full].chunks_exact(16))
            {
                acc += widen(q).dot(widen(r));
            }
            let tail: i32 = query[full..]
                .iter()
                .zip(&row[full..])
                .map(|(&a, &b)| i32::from(a) * i32::from(b))
                .sum();
            *o = acc.reduce_add() + tail;
        }
    }

    /// Eight values a compare (`VCMPPS`, ordered: false for NaN, as `>=` is) and a move mask,
    /// the tail in scalar.
    pub fn at_least(values: &[f32], floor: f32) -> u64 {
        assert!(values.len() <= 64, "at most 64 values");
        let full = values.len() / 8 * 8;
        let floors = f32x8::splat(floor);
        let mut mask = 0u64;
        for (c, chunk) in values[..full].chunks_exact(8).enumerate() {
            let lanes = f32x8::new(chunk.try_into().expect("8 lanes"));
            mask |= u64::from(lanes.simd_ge(floors).to_bitmask()) << (8 * c);
        }
        if full < values.len() {
            mask |= super::scalar::at_least(&values[full..], floor) << full;
        }
        mask
    }

    /// Two independent 8-lane FMA accumulators, the tail in scalar.
    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let full = n / 16 * 16;
        let (mut acc0, mut acc1) = (f32x8::ZERO, f32x8::ZERO);
        for (ca, cb) in a[..full].chunks_exact(16).zip(b[..full].chunks_exact(16)) {
            let a0 = f32x8::new(ca[..8].try_into().expect("8 lanes"));
            let a1 = f32x8::new(ca[8..].try_into().expect("8 lanes"));
            let b0 = f32x8::new(cb[..8].try_into().expect("8 lanes"));
            let b1 = f32x8::new(cb[8..].try_into().expect("8 lanes"));
            acc0 = a0.mul_add(b0, acc0);
            acc1 = a1.mul_add(b1, acc1);
        }
        let tail: f32 = a[full..n].iter().zip(&b[full..n]).map(|(x, y)| x * y).sum();
        (acc0 + acc1).reduce_add() + tail
    }
}

/// AVX-512 kernels through `core::arch`, used only after runtime detection.
#[allow(unsafe_code)]
pub mod avx512 {
    /// True when the CPU runs the table-lookup 2-bit kernel (AVX-512 F, VBMI and VNNI).
    pub fn has_lookup() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vbmi")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// True when the CPU runs the 2-bit kernel's AVX-512 BW form (AVX-512 F and BW).
    pub fn has_bw() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// True when the CPU runs the masked-add signature kernel (AVX-512 F and VL).
    pub fn has_vl() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Signature weights with a bit test into a mask register and a masked add per term:
    /// one register holds a signature word of a block's eight rows, one holds their eight
    /// sums. Each lane adds the same weights in the same order as the scalar loop (an add of
    /// nothing where the scalar loop adds 0.0), so the sums are bit-identical.
    pub fn signature_weights(
        terms: &[super::SignatureTerm],
        words: usize,
        signatures: &[u64],
        out: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        super::checked_signature(
            (has_vl(), "avx512::signature_weights", x86::signature_masked),
            terms,
            words,
            signatures,
            out,
        );
        #[cfg(not(target_arch = "x86_64"))]
        super::signature_weights(terms, words, signatures, out)
    }

    /// The 2-bit sum with table lookups: for each chunk of 16 rows (one register), the low
    /// and the high nibble of each byte index the chunk's two 64-entry tables (`VPERMB`, the
    /// byte's position in its row's chunk choosing the table's quarter), and `VPDPBUSD` adds
    /// each row's four looked-up entries into its 32-bit sum. All integer, so equal to the
    /// scalar loop.
    pub fn two_bit(
        query: &super::TwoBitQuery,
        codes: &[u8],
        out: &mut [i32],
        ahead: super::Lookahead,
    ) {
        #[cfg(target_arch = "x86_64")]
        super::checked_two_bit(
            (has_lookup(), "avx512::two_bit", x86::two_bit_lookup),
            query,
            codes,
            out,
            ahead,
        );
        #[cfg(not(target_arch = "x86_64"))]
        super::scalar::two_bit(query, codes, out, ahead)
    }

    /// The 2-bit sum for AVX-512 BW without VBMI and VNNI: the same chunks, each nibble
    /// looked up with `VPSHUFB` in the 16-entry table of its byte's place in the row's chunk
    /// (four merge-masked lookups a register, one per place), each row's four entries summed
    /// by `VPMADDUBSW` and `VPMADDWD` into its 32-bit sum. All integer, so equal to the scalar
    /// loop.
    pub fn two_bit_bw(
        query: &super::TwoBitQuery,
        codes: &[u8],
        out: &mut [i32],
        ahead: super::Lookahead,
    ) {
        #[cfg(target_arch = "x86_64")]
        super::checked_two_bit(
            (has_bw(), "avx512::two_bit_bw", x86::two_bit_shuffle),
            query,
            codes,
            out,
            ahead,
        );
        #[cfg(not(target_arch = "x86_64"))]
        super::scalar::two_bit(query, codes, out, ahead)
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        #[target_feature(enable = "avx512f,avx512vl")]
        pub(super) unsafe fn signature_masked(
            terms: &[super::super::SignatureTerm],
            words: usize,
            signatures: &[u64],
            out: &mut [f32],
        ) {
            let block_words = words * 8;
            for (b, sums) in out.chunks_exact_mut(8).enumerate() {
                let base = signatures[b * block_words..].as_ptr();
                let mut acc = _mm256_setzero_ps();
                for term in terms {
                    // SAFETY: block `b` holds `words · 8` words inside `signatures` and
                    // `term.word < words`, so the 64-byte load is in bounds.
                    let lanes = unsafe { _mm512_loadu_si512(base.add(term.word * 8).cast()) };
                    let mask = _mm512_set1_epi64(term.mask as i64);
                    let set = _mm512_cmpeq_epi64_mask(_mm512_and_si512(lanes, mask), mask);
                    acc = _mm256_mask_add_ps(acc, set, acc, _mm256_set1_ps(term.weight));
                }
                // SAFETY: `sums` is 8 f32 = 32 bytes, exactly what the store writes.
                unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), acc) };
            }
        }

        /// Line `s` (16 rows) of chunk `c` of the group of codes at `group`; with it, its
        /// counterparts `ahead` start loading.
        ///
        /// # Safety
        /// The group holds `bytes · 64` bytes at `group`, `bytes` a multiple of 4, and
        /// `c < bytes / 4`, `s < 4`: the 64-byte load lies inside it.
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn chunk_line(
            group: *const u8,
            c: usize,
            s: usize,
            ahead: super::super::Lookahead,
        ) -> __m512i {
            use super::super::{CHUNK_BYTES, CHUNK_ROWS, LUT_ROWS, prefetch, prefetch_l2};
            let at = (c * LUT_ROWS + s * CHUNK_ROWS) * CHUNK_BYTES;
            // SAFETY: the caller's promise bounds `at + 64` by the group's bytes.
            let x = unsafe { _mm512_loadu_si512(group.add(at).cast()) };
            // Hints only: the addresses are never read here, and a prefetch of any address is
            // harmless.
            let line = group.wrapping_add(at);
            if ahead.near != 0 {
                prefetch(line.wrapping_offset(ahead.near));
            }
            if ahead.far != 0 {
                prefetch_l2(line.wrapping_offset(ahead.far));
            }
            x
        }

        #[target_feature(enable = "avx512f,avx512vbmi,avx512vnni")]
        pub(super) unsafe fn two_bit_lookup(
            query: &super::super::TwoBitQuery,
            codes: &[u8],
            out: &mut [i32],
            ahead: super::super::Lookahead,
        ) {
            use super::super::{CHUNK_BYTES, CHUNK_ROWS, LUT_ROWS, PAIR_ENTRIES};
            const TABLE_BYTES: usize = CHUNK_BYTES * PAIR_ENTRIES;
            const REGISTERS: usize = LUT_ROWS / CHUNK_ROWS;
            let bytes = query.code_bytes();
            let tables = query.lookup.as_ptr();
            let nibble = _mm512_set1_epi8(0x0F);
            // Byte `j` of each 32-bit lane indexes quarter `j` of a table: `16 j` ORed in.
            let quarters = _mm512_set1_epi32(0x3020_1000);
            let ones = _mm512_set1_epi8(1);
            // `(a & b) | c` as a ternary-logic truth table.
            const AND_OR: i32 = 0xEA;
            for (g, sums) in out.chunks_exact_mut(LUT_ROWS).enumerate() {
                let base = codes[g * bytes * LUT_ROWS..].as_ptr();
                // The low and the high nibbles' sums of each register's 16 rows, apart so that
                // no two adds in a row wait on each other.
                let mut low_sums = [_mm512_setzero_si512(); REGISTERS];
                let mut high_sums = [_mm512_setzero_si512(); REGISTERS];
                for c in 0..bytes / CHUNK_BYTES {
                    // SAFETY: chunk `c < code_bytes / 4` has its two tables at
                    // `c · 128 .. c · 128 + 128` inside `lookup`.
                    let (low_table, high_table) = unsafe {
                        (
                            _mm512_loadu_si512(tables.add(2 * c * TABLE_BYTES).cast()),
                            _mm512_loadu_si512(tables.add((2 * c + 1) * TABLE_BYTES).cast()),
                        )
                    };
                    for (s, (low, high)) in low_sums.iter_mut().zip(&mut high_sums).enumerate() {
                        // SAFETY: group `g` holds `bytes · 64` bytes inside `codes`, and
                        // `c < bytes / 4`, `s < 4`.
                        let x = unsafe { chunk_line(base, c, s, ahead) };
                        let low_index = _mm512_ternarylogic_epi32::<AND_OR>(x, nibble, quarters);
                        let high_index = _mm512_ternarylogic_epi32::<AND_OR>(
                            _mm512_srli_epi32::<4>(x),
                            nibble,
                            quarters,
                        );
                        *low = _mm512_dpbusd_epi32(
                            *low,
                            ones,
                            _mm512_permutexvar_epi8(low_index, low_table),
                        );
                        *high = _mm512_dpbusd_epi32(
                            *high,
                            ones,
                            _mm512_permutexvar_epi8(high_index, high_table),
                        );
                    }
                }
                for (s, (low, high)) in low_sums.into_iter().zip(high_sums).enumerate() {
                    // SAFETY: `sums` holds 64 i32; rows `16 s .. 16 s + 16` are 64 bytes of it,
                    // exactly what the store writes.
                    unsafe {
                        _mm512_storeu_si512(
                            sums[s * CHUNK_ROWS..].as_mut_ptr().cast(),
                            _mm512_add_epi32(low, high),
                        )
                    };
                }
            }
        }

        #[target_feature(enable = "avx512f,avx512bw")]
        pub(super) unsafe fn two_bit_shuffle(
            query: &super::super::TwoBitQuery,
            codes: &[u8],
            out: &mut [i32],
            ahead: super::super::Lookahead,
        ) {
            use super::super::{CHUNK_BYTES, CHUNK_ROWS, LUT_ROWS, PAIR_ENTRIES};
            const TABLE_BYTES: usize = CHUNK_BYTES * PAIR_ENTRIES;
            const REGISTERS: usize = LUT_ROWS / CHUNK_ROWS;
            // The bytes at place 1, 2 and 3 of each 32-bit lane.
            const PLACES: [__mmask64; 3] = [
                0x2222_2222_2222_2222,
                0x4444_4444_4444_4444,
                0x8888_8888_8888_8888,
            ];
            let bytes = query.code_bytes();
            let tables = query.lookup.as_ptr();
            let nibble = _mm512_set1_epi8(0x0F);
            let (ones8, ones16) = (_mm512_set1_epi8(1), _mm512_set1_epi16(1));
            for (g, sums) in out.chunks_exact_mut(LUT_ROWS).enumerate() {
                let base = codes[g * bytes * LUT_ROWS..].as_ptr();
                let mut totals = [_mm512_setzero_si512(); REGISTERS];
                for c in 0..bytes / CHUNK_BYTES {
                    // The chunk's eight 16-entry tables, each in every 128-bit lane: the low
                    // nibbles' for places 0-3, then the high nibbles'.
                    // SAFETY: chunk `c < code_bytes / 4` has its 128 entries at
                    // `c · 128 .. c · 128 + 128` inside `lookup`.
                    let table: [__m512i; 8] = std::array::from_fn(|t| unsafe {
                        _mm512_broadcast_i32x4(_mm_loadu_si128(
                            tables.add(2 * c * TABLE_BYTES + t * PAIR_ENTRIES).cast(),
                        ))
                    });
                    for (s, total) in totals.iter_mut().enumerate() {
                        // SAFETY: group `g` holds `bytes · 64` bytes inside `codes`, and
                        // `c < bytes / 4`, `s < 4`.
                        let x = unsafe { chunk_line(base, c, s, ahead) };
                        let halves = [
                            _mm512_and_si512(x, nibble),
                            _mm512_and_si512(_mm512_srli_epi32::<4>(x), nibble),
                        ];
                        for (half, index) in halves.into_iter().enumerate() {
                            let own = &table[4 * half..4 * half + 4];
                            let mut entries = _mm512_shuffle_epi8(own[0], index);
                            for (place, &mask) in PLACES.iter().enumerate() {
                                entries =
                                    _mm512_mask_shuffle_epi8(entries, mask, own[place + 1], index);
                            }
                            let pairs = _mm512_maddubs_epi16(ones8, entries);
                            *total = _mm512_add_epi32(*total, _mm512_madd_epi16(pairs, ones16));
                        }
                    }
                }
                for (s, total) in totals.into_iter().enumerate() {
                    // SAFETY: as in `two_bit_lookup`.
                    unsafe {
                        _mm512_storeu_si512(sums[s * CHUNK_ROWS..].as_mut_ptr().cast(), total)
                    };
                }
            }
        }
    }
}

/// AVX2 kernels through `core::arch`, for CPUs without AVX-512, used only after runtime
/// detection.
#[allow(unsafe_code)]
pub mod avx2 {
    /// True when the CPU runs the AVX2 forms.
    pub fn has_avx2() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// The 2-bit sum for CPUs without AVX-512: the same chunks, regrouped 32 rows at a time so
    /// that a 256-bit register holds one byte place of 32 rows (a `VPSHUFB` within each 128-bit
    /// lane puts each row's four bytes in four places, unpacks of 32- and 64-bit lanes gather
    /// one place from four registers). Every lane of a lookup is then useful: each nibble is
    /// looked up with one `VPSHUFB` in its place's 16-entry table, and the entries are summed
    /// in 16 bits per row (even and odd rows apart, by `VPMADDUBSW`), widened every 16 chunks,
    /// and put back in row order at the end. All integer, so equal to the scalar loop.
    pub fn two_bit(
        query: &super::TwoBitQuery,
        codes: &[u8],
        out: &mut [i32],
        ahead: super::Lookahead,
    ) {
        #[cfg(target_arch = "x86_64")]
        super::checked_two_bit(
            (has_avx2(), "avx2::two_bit", x86::two_bit_regrouped),
            query,
            codes,
            out,
            ahead,
        );
        #[cfg(not(target_arch = "x86_64"))]
        super::scalar::two_bit(query, codes, out, ahead)
    }

    /// Signature weights with a bit test (and, 64-bit compare) and an add of the weight masked
    /// by it: two registers hold a signature word of a block's eight rows, one their eight sums.
    /// Each lane adds the weight or 0.0, as the scalar loop does, in the same order, so the sums
    /// are bit-identical.
    pub fn signature_weights(
        terms: &[super::SignatureTerm],
        words: usize,
        signatures: &[u64],
        out: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        super::checked_signature(
            (has_avx2(), "avx2::signature_weights", x86::signature_and),
            terms,
            words,
            signatures,
            out,
        );
        #[cfg(not(target_arch = "x86_64"))]
        super::signature_weights(terms, words, signatures, out)
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        #[target_feature(enable = "avx2")]
        pub(super) unsafe fn signature_and(
            terms: &[super::super::SignatureTerm],
            words: usize,
            signatures: &[u64],
            out: &mut [f32],
        ) {
            use super::super::BLOCK_ROWS;
            let block_words = words * BLOCK_ROWS;
            for (b, sums) in out.chunks_exact_mut(BLOCK_ROWS).enumerate() {
                let base = signatures[b * block_words..].as_ptr();
                // The sums in the lane order the per-term gather leaves: rows 0, 1, 4, 5, 2,
                // 3, 6, 7; put in row order once, before the store.
                let mut acc = _mm256_setzero_ps();
                for term in terms {
                    // SAFETY: block `b` holds `words · 8` words inside `signatures` and
                    // `term.word < words`, so both 32-byte loads are in bounds.
                    let (low, high) = unsafe {
                        let word = base.add(term.word * BLOCK_ROWS);
                        (
                            _mm256_loadu_si256(word.cast()),
                            _mm256_loadu_si256(word.add(4).cast()),
                        )
                    };
                    let mask = _mm256_set1_epi64x(term.mask as i64);
                    let set = |lanes| _mm256_cmpeq_epi64(_mm256_and_si256(lanes, mask), mask);
                    // The low half of each row's 64-bit test: rows 0, 1, 4, 5 in the lower
                    // 128 bits, 2, 3, 6, 7 in the upper.
                    let rows = _mm256_shuffle_ps::<0b10_00_10_00>(
                        _mm256_castsi256_ps(set(low)),
                        _mm256_castsi256_ps(set(high)),
                    );
                    acc = _mm256_add_ps(acc, _mm256_and_ps(rows, _mm256_set1_ps(term.weight)));
                }
                let in_order = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_castps_si256(acc));
                // SAFETY: `sums` is 8 f32 = 32 bytes, exactly what the store writes.
                unsafe { _mm256_storeu_si256(sums.as_mut_ptr().cast(), in_order) };
            }
        }

        #[target_feature(enable = "avx2")]
        pub(super) unsafe fn two_bit_regrouped(
            query: &super::super::TwoBitQuery,
            codes: &[u8],
            out: &mut [i32],
            ahead: super::super::Lookahead,
        ) {
            use super::super::{CHUNK_BYTES, LUT_ROWS, PAIR_ENTRIES, prefetch, prefetch_l2};
            const TABLE_BYTES: usize = CHUNK_BYTES * PAIR_ENTRIES;
            const HALF_ROWS: usize = LUT_ROWS / 2;
            // Chunks summed in 16 bits before widening: 16 chunks of 8 entries of at most
            // 127 stay within i16.
            const RUN: usize = 16;
            let bytes = query.code_bytes();
            let tables = query.lookup.as_ptr();
            let nibble = _mm256_set1_epi8(0x0F);
            // Within each 128-bit lane (four rows' chunks): byte `4k + i` takes byte `4i + k`,
            // place `k` of the lane's row `i`.
            let by_place = _mm256_setr_epi8(
                0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2,
                6, 10, 14, 3, 7, 11, 15,
            );
            let (even, odd) = (_mm256_set1_epi16(0x0001), _mm256_set1_epi16(0x0100));
            for (g, sums) in out.chunks_exact_mut(LUT_ROWS).enumerate() {
                let base = codes[g * bytes * LUT_ROWS..].as_ptr();
                for (h, sums) in sums.chunks_exact_mut(HALF_ROWS).enumerate() {
                    let mut totals = [0i32; HALF_ROWS];
                    let chunks = bytes / CHUNK_BYTES;
                    for run in (0..chunks).step_by(RUN) {
                        let (mut evens, mut odds) =
                            (_mm256_setzero_si256(), _mm256_setzero_si256());
                        for c in run..(run + RUN).min(chunks) {
                            let at = (c * LUT_ROWS + h * HALF_ROWS) * CHUNK_BYTES;
                            // Hints only, for both 64-byte lines: the addresses are never read.
                            for line in [0, 64] {
                                let line = base.wrapping_add(at + line);
                                if ahead.near != 0 {
                                    prefetch(line.wrapping_offset(ahead.near));
                                }
                                if ahead.far != 0 {
                                    prefetch_l2(line.wrapping_offset(ahead.far));
                                }
                            }
                            // SAFETY: group `g` holds `bytes · 64` bytes inside `codes`, and
                            // with `c < bytes / 4`, `h < 2` the 128 bytes at `at` lie inside it.
                            let r: [__m256i; 4] = std::array::from_fn(|s| {
                                _mm256_shuffle_epi8(
                                    unsafe { _mm256_loadu_si256(base.add(at + 32 * s).cast()) },
                                    by_place,
                                )
                            });
                            // A 4x4 transpose of 32-bit lanes: `places[k]`, lane `L`, byte
                            // `4s + i` is place `k` of row `8s + 4L + i` of this half.
                            let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
                            let t1 = _mm256_unpacklo_epi32(r[2], r[3]);
                            let t2 = _mm256_unpackhi_epi32(r[0], r[1]);
                            let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
                            let places = [
                                _mm256_unpacklo_epi64(t0, t1),
                                _mm256_unpackhi_epi64(t0, t1),
                                _mm256_unpacklo_epi64(t2, t3),
                                _mm256_unpackhi_epi64(t2, t3),
                            ];
                            for (place, p) in places.into_iter().enumerate() {
                                let halves = [
                                    _mm256_and_si256(p, nibble),
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(p), nibble),
                                ];
                                for (half, index) in halves.into_iter().enumerate() {
                                    // SAFETY: chunk `c < code_bytes / 4` has its 128 entries
                                    // at `c · 128 .. c · 128 + 128` inside `lookup`.
                                    let table = unsafe {
                                        _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                            tables
                                                .add(
                                                    (2 * c + half) * TABLE_BYTES
                                                        + place * PAIR_ENTRIES,
                                                )
                                                .cast(),
                                        ))
                                    };
                                    let entries = _mm256_shuffle_epi8(table, index);
                                    evens = _mm256_add_epi16(
                                        evens,
                                        _mm256_maddubs_epi16(even, entries),
                                    );
                                    odds =
                                        _mm256_add_epi16(odds, _mm256_maddubs_epi16(odd, entries));
                                }
                            }
                        }
                        let (mut e, mut o) = ([0i16; 16], [0i16; 16]);
                        // SAFETY: each array is 16 i16 = 32 bytes, what the store writes.
                        unsafe {
                            _mm256_storeu_si256(e.as_mut_ptr().cast(), evens);
                            _mm256_storeu_si256(o.as_mut_ptr().cast(), odds);
                        }
                        // 16-bit lane `j` of lane `L` holds bytes `2j` (even) and `2j + 1` (odd).
                        for lane in 0..2 {
                            for j in 0..8 {
                                let row = 8 * (j / 2) + 4 * lane + 2 * (j % 2);
                                totals[row] += i32::from(e[lane * 8 + j]);
                                totals[row + 1] += i32::from(o[lane * 8 + j]);
                            }
                        }
                    }
                    sums.copy_from_slice(&totals);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Table entries with the edges over-represented.
    fn entry_edge() -> impl Strategy<Value = i8> {
        prop_oneof![
            Just(-LUT_ENTRY_MAX),
            Just(LUT_ENTRY_MAX),
            Just(0i8),
            Just(-1i8),
            Just(1i8),
            -LUT_ENTRY_MAX..=LUT_ENTRY_MAX
        ]
    }

    fn dot_i8_impls() -> Vec<(Isa, DotI8Fn)> {
        vec![
            (Isa::Scalar, scalar::dot_i8),
            (Isa::Wide, wide_impl::dot_i8),
        ]
    }

    /// i8 values with the edges over-represented.
    fn i8_edge() -> impl Strategy<Value = i8> {
        prop_oneof![
            Just(i8::MIN),
            Just(i8::MAX),
            Just(-1i8),
            Just(0i8),
            any::<i8>()
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn two_bit_agrees_with_scalar(
            chunks in 1usize..17,
            groups in 0usize..3,
            seed in proptest::collection::vec(
                prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()], 2 * 16 * 4 * 8),
            table in proptest::collection::vec(entry_edge(), 16 * PAIRS_PER_CHUNK * PAIR_ENTRIES),
            near in prop_oneof![Just(0isize), -(1isize << 20)..1 << 20, Just(isize::MIN), Just(isize::MAX)],
            far in prop_oneof![Just(0isize), -(1isize << 21)..1 << 21, Just(isize::MIN)],
        ) {
            let pairs = chunks * PAIRS_PER_CHUNK;
            let query = TwoBitQuery::new(table[..pairs * PAIR_ENTRIES].to_vec());
            let rows = groups * LUT_ROWS;
            let bytes: Vec<u8> = seed.iter().flat_map(|w| w.to_le_bytes()).collect();
            let codes = &bytes[..rows * query.code_bytes()];
            let mut expected = vec![i32::MIN; rows];
            scalar::two_bit(&query, codes, &mut expected, Lookahead::default());
            // The specification is the sum it names, read straight from the chunked layout:
            // byte `b` of row `i` of group `g` at `g · bytes · 64 + (⌊b/4⌋ · 64 + i) · 4 + b % 4`.
            for (r, &sum) in expected.iter().enumerate() {
                let (g, i) = (r / LUT_ROWS, r % LUT_ROWS);
                let direct: i32 = (0..pairs)
                    .map(|p| {
                        let b = p / 2;
                        let at = g * query.code_bytes() * LUT_ROWS + (b / 4 * LUT_ROWS + i) * 4 + b % 4;
                        let byte = codes[at];
                        let nibble = if p % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                        i32::from(table[p * PAIR_ENTRIES + usize::from(nibble)])
                    })
                    .sum();
                prop_assert_eq!(sum, direct);
            }
            for (isa, f) in two_bit_forms() {
                let mut got = vec![i32::MAX; rows];
                // Loading ahead is a hint: it changes no sum.
                f(&query, codes, &mut got, Lookahead { near, far });
                prop_assert_eq!(&got, &expected, "{:?}", isa);
            }
        }

        #[test]
        fn dot_i8_agrees_with_scalar(
            dims in 1usize..300,
            rows in 0usize..5,
            values in proptest::collection::vec(i8_edge(), 300 * 6),
        ) {
            let query = &values[..dims];
            let data = &values[dims..dims + rows * dims];
            let mut expected = vec![0i32; rows];
            scalar::dot_i8(query, data, &mut expected);
            for (isa, f) in dot_i8_impls() {
                let mut got = vec![i32::MAX; rows];
                f(query, data, &mut got);
                prop_assert_eq!(&got, &expected, "{:?}", isa);
            }
        }

        /// Bit-identical: each lane adds the same weights in the same order.
        #[test]
        fn signature_weights_agree_with_scalar(
            words in 1usize..6,
            blocks in 0usize..4,
            seed in proptest::collection::vec(
                prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()], 5 * 3 * BLOCK_ROWS),
            terms in proptest::collection::vec(
                (prop_oneof![Just(0u64), any::<u64>(), (0u32..64, 0u32..64, 0u32..64)
                    .prop_map(|(a, b, c)| 1u64 << a | 1 << b | 1 << c)], 0usize..6, -4.0f32..4.0),
                0..40),
        ) {
            let rows = blocks * BLOCK_ROWS;
            let signatures = &seed[..rows * words];
            let terms: Vec<SignatureTerm> = terms
                .into_iter()
                .map(|(mask, word, weight)| SignatureTerm { word: word % words, mask, weight })
                .collect();
            let mut expected = vec![f32::NAN; rows];
            signature_weights(&terms, words, signatures, &mut expected);
            for (isa, f) in signature_forms() {
                let mut got = vec![f32::NAN; rows];
                f(&terms, words, signatures, &mut got);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&got), bits(&expected), "{:?}", isa);
            }
        }

        /// Bit-exact: a compare per value, NaN and infinities included.
        #[test]
        fn at_least_agrees_with_scalar(
            values in proptest::collection::vec(prop_oneof![
                Just(0.5f32), Just(-0.0f32), Just(0.0f32), Just(f32::NAN),
                Just(f32::INFINITY), Just(f32::NEG_INFINITY), -2.0f32..2.0], 0..=64),
            floor in prop_oneof![Just(0.5f32), Just(0.0f32), Just(f32::NEG_INFINITY),
                Just(f32::NAN), -2.0f32..2.0],
        ) {
            let expected = scalar::at_least(&values, floor);
            for (i, v) in values.iter().enumerate() {
                prop_assert_eq!(expected >> i & 1 == 1, *v >= floor);
            }
            prop_assert_eq!(expected >> values.len().min(63) >> 1, 0);
            prop_assert_eq!(wide_impl::at_least(&values, floor), expected);
        }

        /// Sums in another order may differ in the last bits: within 1e-5 relative to the sum
        /// of absolute products (plus 1e-6 absolute).
        #[test]
        fn dot_f32_agrees_with_scalar(
            pairs in proptest::collection::vec((-1.0f32..1.0, -1.0f32..1.0), 0..600),
        ) {
            let (a, b): (Vec<f32>, Vec<f32>) = pairs.into_iter().unzip();
            let expected = scalar::dot_f32(&a, &b);
            let magnitude: f32 = a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum();
            let got = wide_impl::dot_f32(&a, &b);
            prop_assert!((got - expected).abs() <= 1e-5 * magnitude + 1e-6, "{} vs {}", got, expected);
        }
    }

    #[test]
    fn signature_weights_sum_the_set_terms() {
        let words = 2;
        // One block of 8 rows: row r has bit r of word 0, and row 7 also bit 3 of word 1.
        let mut signatures = vec![0u64; words * BLOCK_ROWS];
        for (r, word) in signatures.iter_mut().take(BLOCK_ROWS).enumerate() {
            *word = 1 << r;
        }
        signatures[BLOCK_ROWS + 7] = 1 << 3;
        let terms = [
            SignatureTerm {
                word: 0,
                mask: 1 << 2,
                weight: 1.5,
            },
            SignatureTerm {
                word: 1,
                mask: 1 << 3,
                weight: 0.25,
            },
            SignatureTerm {
                word: 0,
                mask: 1 << 7,
                weight: 2.0,
            },
        ];
        let mut out = [9.0f32; BLOCK_ROWS];
        signature_weights(&terms, words, &signatures, &mut out);
        assert_eq!(out, [0.0, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0, 2.25]);
    }

    #[test]
    fn two_bit_sums_a_hand_example() {
        // Pair 0: entry 5 is 7, entry 0 is −3; pair 1: entry 2 is 100; pair 63: entry 15 is
        // −127; pair 62: entry 3 is 11; every other entry 0.
        let mut table = vec![0i8; 64 * PAIR_ENTRIES];
        (table[5], table[0], table[PAIR_ENTRIES + 2]) = (7, -3, 100);
        table[63 * PAIR_ENTRIES + 15] = -LUT_ENTRY_MAX;
        table[62 * PAIR_ENTRIES + 3] = 11;
        let query = TwoBitQuery::new(table);
        let mut codes = vec![0u8; query.code_bytes() * LUT_ROWS];
        // Row 0: byte 0 = pair 0 nibble 5, pair 1 nibble 2. Row 1: byte 31 (chunk 7, its
        // fourth byte) high nibble 15. Row 17 (the second register): byte 31 low nibble 3.
        codes[0] = 0x25;
        codes[(7 * LUT_ROWS + 1) * 4 + 3] = 0xF0;
        codes[(7 * LUT_ROWS + 17) * 4 + 3] = 0x03;
        for (isa, f) in two_bit_forms() {
            let mut out = [9i32; LUT_ROWS];
            f(&query, &codes, &mut out, Lookahead::default());
            // Every nibble not set above is 0, which only pair 0 weighs (−3).
            let mut expected = [-3i32; LUT_ROWS];
            expected[0] = 107;
            expected[1] = -3 - 127;
            expected[17] = -3 + 11;
            assert_eq!(out, expected, "{isa:?}");
        }
    }

    /// Long rows at the table's edges: every form widens its narrow partial sums before they
    /// could overflow (512 pairs at ±127 is far past 16 bits).
    #[test]
    fn two_bit_extreme_long_rows_are_exact() {
        let pairs = 512;
        let table: Vec<i8> = (0..pairs * PAIR_ENTRIES)
            .map(|at| match at % PAIR_ENTRIES {
                15 => LUT_ENTRY_MAX,
                0 => -LUT_ENTRY_MAX,
                _ => 1,
            })
            .collect();
        let query = TwoBitQuery::new(table);
        // Rows 0-31 every nibble 15, rows 32-63 every nibble 0.
        let mut codes = vec![0u8; query.code_bytes() * LUT_ROWS];
        for row in 0..32 {
            for byte in 0..query.code_bytes() {
                codes[code_offset(row, byte)] = 0xFF;
            }
        }
        let mut expected = [0i32; LUT_ROWS];
        scalar::two_bit(&query, &codes, &mut expected, Lookahead::default());
        assert_eq!(expected[0], 512 * 127);
        assert_eq!(expected[63], -512 * 127);
        for (isa, f) in two_bit_forms() {
            let mut out = [0i32; LUT_ROWS];
            f(&query, &codes, &mut out, Lookahead::default());
            assert_eq!(out, expected, "{isa:?}");
        }
    }

    #[test]
    fn extreme_int8_rows_are_exact() {
        let dims = 256;
        let query = vec![i8::MIN; dims];
        let rows = vec![i8::MIN; dims * 2];
        let mut expected = vec![0; 2];
        scalar::dot_i8(&query, &rows, &mut expected);
        assert_eq!(expected[0], 128 * 128 * 256);
        for (isa, f) in dot_i8_impls() {
            let mut got = vec![0; 2];
            f(&query, &rows, &mut got);
            assert_eq!(got, expected, "{isa:?}");
        }
    }

    #[test]
    fn detect_is_deliberate() {
        assert_eq!(Kernels::detect(true).describe(), Kernels::SCALAR.describe());
        let k = Kernels::detect(false);
        assert_eq!(k.dot_f32_isa, Isa::Wide);
        assert_eq!(k.two_bit_isa == Isa::Avx512, avx512::has_lookup());
        assert_eq!(
            k.two_bit_isa == Isa::Avx512Bw,
            avx512::has_bw() && !avx512::has_lookup()
        );
        assert_eq!(
            k.two_bit_isa == Isa::Avx2,
            avx2::has_avx2() && !avx512::has_bw()
        );
        assert_eq!(k.dot_i8_isa, Isa::Wide);
        assert_eq!(k.signature_isa == Isa::Avx512, avx512::has_vl());
        assert_eq!(
            k.signature_isa == Isa::Avx2,
            avx2::has_avx2() && !avx512::has_vl()
        );
    }
}
