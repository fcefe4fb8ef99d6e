//! Scoring kernels, each with a dull scalar twin that reads like the specification.
//!
//! - `two_bit`: the dense sum of the first pass over 2-bit codes, `Σ_i σ_i · (a_i + m_i · c_i)`
//!   with a row's sign bits `σ_i = ±1` and magnitude bits `m_i`, and per-query integer weights
//!   `a`, `c` ([`TwoBitQuery`]). Codes are stored in blocks of [`BLOCK_ROWS`] rows, word-major
//!   inside a block (word `w` of row `r` of block `b` at `(b · words + w) · BLOCK_ROWS + r`).
//!   The layout lets one 512-bit register hold the same word of eight rows, so a block is
//!   scored with vertical operations only: no horizontal sums, no shuffles.
//! - `dot_i8`: int8 dot product into i32 (the rescore of quantised vectors).
//! - `dot_f32`: f32 dot product (the exact dense rescore).
//! - `signature`: for each row, the summed weights of the query terms whose bit its lexical
//!   signature has (the first pass's lexical estimate), over the same blocked layout.
//!
//! Implementations:
//! - `scalar`: plain loops. `u64::count_ones` compiles to `POPCNT` on the x86-64-v3 baseline.
//! - `wide`: 256-bit vectors through the `wide` crate, whose instructions are fixed at compile
//!   time by the baseline in `.cargo/config.toml` (AVX2 and FMA).
//! - `avx512`: `core::arch` AVX-512 VPOPCNTDQ for the 2-bit sum (bit-planes of the weights,
//!   masked popcounts), and a bit test into a mask register
//!   with a masked add (AVX-512 F and VL) for the signature weights, each chosen only when the
//!   CPU reports the features at start-up. A VNNI int8 kernel was measured and did not pay: out of cache it ran
//!   at 0.87-0.96x the `wide` kernel (`docs/benchmarks.md`), so there is none.
//!
//! [`Kernels::detect`] picks one implementation per kernel once, on purpose, and the choice is
//! logged by the caller. Integer kernels agree bit for bit with the scalar twin (proptests
//! below); the f32 kernel sums in another order and agrees within a stated tolerance.

/// Rows per block of the blocked code layout.
pub const BLOCK_ROWS: usize = 8;

/// Words of a one-bit-per-dimension code column for `dims` dimensions.
pub fn code_words(dims: usize) -> usize {
    dims.div_ceil(64)
}

/// Which implementation a kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Wide,
    Avx512,
}

/// 2-bit sums of `query` against blocked `signs` and `magnitudes` (see [`scalar::two_bit`], the
/// specification): `out.len()` rows, a multiple of [`BLOCK_ROWS`], each code column holding at
/// least `out.len() · query.words()` words.
pub type TwoBitFn = fn(query: &TwoBitQuery, signs: &[u64], magnitudes: &[u64], out: &mut [i32]);
/// Dot products of `query` against each row of `rows` (`out.len()` rows of `query.len()`).
pub type DotI8Fn = fn(query: &[i8], rows: &[i8], out: &mut [i32]);
/// Dot product of two equally long f32 vectors.
pub type DotF32Fn = fn(a: &[f32], b: &[f32]) -> f32;
/// Lexical-signature weights (see [`signature_weights`], the specification).
pub type SignatureFn =
    fn(terms: &[SignatureTerm], words: usize, signatures: &[u64], out: &mut [f32]);

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
        };
        if avx512::has_vpopcntdq() {
            k.two_bit = avx512::two_bit;
            k.two_bit_isa = Isa::Avx512;
        }
        if avx512::has_vl() {
            k.signature = avx512::signature_weights;
            k.signature_isa = Isa::Avx512;
        }
        k
    }

    /// One line naming each choice, for the start-up log.
    pub fn describe(&self) -> String {
        format!(
            "two_bit={:?} dot_i8={:?} dot_f32={:?} signature={:?}",
            self.two_bit_isa, self.dot_i8_isa, self.dot_f32_isa, self.signature_isa
        )
    }
}

/// Ask the CPU to start loading the cache line holding `p`: a hint that never faults and
/// changes no result, for scans that know which rows they read next but not in an order the
/// hardware prefetcher follows.
#[allow(unsafe_code)]
#[inline]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 belongs to SSE, part of every x86-64 CPU; prefetching any address,
    // valid or not, never faults and brings nothing into the program's state.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    }
}

/// Bits of a quantised 2-bit weight. The kernel's cost is linear in it, but fewer bits lose
/// fidelity: with 6 the million-row synthetic pool agreed with brute force on 0.980 of queries
/// and with 4 on 0.670, against 0.995 with 8 (`docs/benchmarks.md`).
pub const WEIGHT_BITS: usize = 8;
/// What a stored weight carries on top of its signed value, so that it is unsigned: a weight
/// `v` in `−127..=127` is stored as `v + WEIGHT_OFFSET`. A power of two, so the kernels
/// multiply by it with a shift.
pub const WEIGHT_OFFSET: i32 = 1 << (WEIGHT_BITS - 1);

/// A query's per-dimension weights as the 2-bit kernel reads them: `a` (added for every
/// dimension) and `c` (added where the row's magnitude bit is set), each stored unsigned with
/// [`WEIGHT_OFFSET`], and their bit-planes for the popcount kernel (plane `j` holds bit `j` of
/// every dimension's weight, one bit per dimension like the codes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TwoBitQuery {
    a: Vec<u8>,
    c: Vec<u8>,
    /// Word `w` of plane `j` at `j · words + w`.
    a_planes: Vec<u64>,
    c_planes: Vec<u64>,
    /// `Σ_i a_i` as stored (offset included).
    a_total: i64,
}

impl TwoBitQuery {
    /// Weights for `a.len()` dimensions, a multiple of 64; `c` as long.
    pub fn new(a: Vec<u8>, c: Vec<u8>) -> Self {
        assert_eq!(a.len(), c.len(), "one weight of each kind per dimension");
        assert!(a.len().is_multiple_of(64), "whole code words only");
        let words = a.len() / 64;
        let planes = |weights: &[u8]| {
            let mut planes = vec![0u64; WEIGHT_BITS * words];
            for (i, &v) in weights.iter().enumerate() {
                for (j, plane) in planes.chunks_exact_mut(words).enumerate() {
                    plane[i / 64] |= u64::from(v >> j & 1) << (i % 64);
                }
            }
            planes
        };
        Self {
            a_planes: planes(&a),
            c_planes: planes(&c),
            a_total: a.iter().map(|&v| i64::from(v)).sum(),
            a,
            c,
        }
    }

    /// Code words per row.
    pub fn words(&self) -> usize {
        self.a.len() / 64
    }

    /// The signed weights `(a_i, c_i)` of dimension `i`.
    pub fn weights(&self, i: usize) -> (i32, i32) {
        (
            i32::from(self.a[i]) - WEIGHT_OFFSET,
            i32::from(self.c[i]) - WEIGHT_OFFSET,
        )
    }
}

/// A query term as the lexical-signature kernel reads it: which word of the signature holds
/// its bit, the bit as a mask, and the weight it adds when set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SignatureTerm {
    pub word: usize,
    pub mask: u64,
    pub weight: f32,
}

/// For each row of blocked `signatures` (same layout as the code bits, `words` u64 per row):
/// `out[r]` = the sum of the weights of the `terms` whose bit row `r` has. Written block by
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
                *a += if w & term.mask != 0 { term.weight } else { 0.0 };
            }
        }
    }
}

/// The specification.
pub mod scalar {
    use super::{BLOCK_ROWS, TwoBitQuery};

    /// For each row: `Σ_i σ_i · (a_i + m_i · c_i)` over its dimensions, with `σ_i = +1` where
    /// its sign bit is set and `−1` where not, `m_i` its magnitude bit, `a_i`, `c_i` the query's
    /// signed weights. Bit `i % 64` of word `i / 64` is dimension `i`.
    pub fn two_bit(query: &TwoBitQuery, signs: &[u64], magnitudes: &[u64], out: &mut [i32]) {
        let words = query.words();
        for ((s, m), sums) in signs
            .chunks_exact(words * BLOCK_ROWS)
            .zip(magnitudes.chunks_exact(words * BLOCK_ROWS))
            .zip(out.chunks_exact_mut(BLOCK_ROWS))
        {
            for (r, sum) in sums.iter_mut().enumerate() {
                *sum = (0..words * 64)
                    .map(|i| {
                        let bit = |column: &[u64]| column[i / 64 * BLOCK_ROWS + r] >> (i % 64) & 1;
                        let (a, c) = query.weights(i);
                        let b = a + if bit(m) == 1 { c } else { 0 };
                        if bit(s) == 1 { b } else { -b }
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
    /// True when the CPU runs the VPOPCNTDQ 2-bit kernel.
    pub fn has_vpopcntdq() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vpopcntdq")
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
        assert!(
            has_vl(),
            "avx512::signature_weights called without AVX-512 VL"
        );
        assert_eq!(out.len() % super::BLOCK_ROWS, 0, "whole blocks only");
        assert!(
            signatures.len() >= out.len() * words,
            "signatures shorter than out"
        );
        assert!(
            terms.iter().all(|t| t.word < words),
            "a term names a word past the signature"
        );
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the first assert checked the CPU features `signature_masked` is compiled
        // for; the others guarantee whole blocks, that `signatures` holds every block `out`
        // asks for, and that every term's word lies inside a block, which bounds each load and
        // store.
        unsafe {
            x86::signature_masked(terms, words, signatures, out)
        }
        #[cfg(not(target_arch = "x86_64"))]
        super::signature_weights(terms, words, signatures, out)
    }

    /// The 2-bit sum with `VPOPCNTQ` over the weights' bit-planes: for the masks `s`, `s ∧ m`
    /// and `m` of a word of eight rows, `Σ_mask w = Σ_j 2^j · popcount(mask ∧ plane_j)`, and
    /// `S = 2·Σ_s a − Σ a + 2·Σ_{s∧m} c − Σ_m c`, each corrected for [`super::WEIGHT_OFFSET`]
    /// by the plain popcounts of the masks. All integer, so equal to the scalar loop.
    pub fn two_bit(query: &super::TwoBitQuery, signs: &[u64], magnitudes: &[u64], out: &mut [i32]) {
        assert!(has_vpopcntdq(), "avx512::two_bit called without VPOPCNTDQ");
        assert_eq!(out.len() % super::BLOCK_ROWS, 0, "whole blocks only");
        let words = query.words();
        assert!(
            signs.len() >= out.len() * words && magnitudes.len() >= out.len() * words,
            "codes shorter than out"
        );
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the first assert checked the CPU features `two_bit_vpopcnt` is compiled for;
        // the others guarantee whole blocks and that both code columns hold every block `out`
        // asks for, which bounds each of its loads and stores.
        unsafe {
            x86::two_bit_vpopcnt(query, signs, magnitudes, out)
        }
        #[cfg(not(target_arch = "x86_64"))]
        super::scalar::two_bit(query, signs, magnitudes, out)
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
                    let set = _mm512_test_epi64_mask(lanes, _mm512_set1_epi64(term.mask as i64));
                    acc = _mm256_mask_add_ps(acc, set, acc, _mm256_set1_ps(term.weight));
                }
                // SAFETY: `sums` is 8 f32 = 32 bytes, exactly what the store writes.
                unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), acc) };
            }
        }

        #[target_feature(enable = "avx512f,avx512vpopcntdq")]
        pub(super) unsafe fn two_bit_vpopcnt(
            query: &super::super::TwoBitQuery,
            signs: &[u64],
            magnitudes: &[u64],
            out: &mut [i32],
        ) {
            use super::super::{WEIGHT_BITS, WEIGHT_OFFSET};
            let words = query.words();
            // Plane words are broadcast where they are used (a load-and-broadcast each): a
            // call allocates nothing, and a scan makes one call per page.
            let (a_planes, c_planes) = (&query.a_planes, &query.c_planes);
            // What does not depend on the row: `−Σ a + offset · dims`.
            let constant =
                _mm512_set1_epi64(-query.a_total + i64::from(WEIGHT_OFFSET) * (words * 64) as i64);
            let block_words = words * 8;
            for (b, sums) in out.chunks_exact_mut(8).enumerate() {
                let (s_base, m_base) = (
                    signs[b * block_words..].as_ptr(),
                    magnitudes[b * block_words..].as_ptr(),
                );
                // `twice`: 2·Σ_s a + 2·Σ_{s∧m} c; `once`: Σ_m c; `counts`: the offset's share,
                // 2·|s| + 2·|s∧m| − |m|.
                let (mut twice, mut once, mut counts) = (
                    _mm512_setzero_si512(),
                    _mm512_setzero_si512(),
                    _mm512_setzero_si512(),
                );
                for w in 0..words {
                    // SAFETY: block `b` holds `words · 8` words inside each column and
                    // `w < words`, so both 64-byte loads are in bounds.
                    let (s, m) = unsafe {
                        (
                            _mm512_loadu_si512(s_base.add(w * 8).cast()),
                            _mm512_loadu_si512(m_base.add(w * 8).cast()),
                        )
                    };
                    let sm = _mm512_and_si512(s, m);
                    let (pop_s, pop_sm) = (_mm512_popcnt_epi64(s), _mm512_popcnt_epi64(sm));
                    counts = _mm512_add_epi64(
                        counts,
                        _mm512_sub_epi64(
                            _mm512_slli_epi64::<1>(_mm512_add_epi64(pop_s, pop_sm)),
                            _mm512_popcnt_epi64(m),
                        ),
                    );
                    for j in 0..WEIGHT_BITS {
                        let (a, c) = (
                            _mm512_set1_epi64(a_planes[j * words + w] as i64),
                            _mm512_set1_epi64(c_planes[j * words + w] as i64),
                        );
                        let both = _mm512_add_epi64(
                            _mm512_popcnt_epi64(_mm512_and_si512(s, a)),
                            _mm512_popcnt_epi64(_mm512_and_si512(sm, c)),
                        );
                        let shift = _mm512_set1_epi64(j as i64);
                        twice = _mm512_add_epi64(twice, _mm512_sllv_epi64(both, shift));
                        once = _mm512_add_epi64(
                            once,
                            _mm512_sllv_epi64(_mm512_popcnt_epi64(_mm512_and_si512(m, c)), shift),
                        );
                    }
                }
                let sum = _mm512_add_epi64(
                    _mm512_sub_epi64(_mm512_slli_epi64::<1>(twice), once),
                    _mm512_sub_epi64(
                        constant,
                        _mm512_slli_epi64::<{ WEIGHT_BITS as u32 - 1 }>(counts),
                    ),
                );
                // SAFETY: `sums` is 8 i32 = 32 bytes, exactly what the store writes.
                unsafe {
                    _mm256_storeu_si256(sums.as_mut_ptr().cast(), _mm512_cvtepi64_epi32(sum))
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every implementation this CPU can run, scalar first.
    fn two_bit_impls() -> Vec<(Isa, TwoBitFn)> {
        let mut v: Vec<(Isa, TwoBitFn)> = vec![(Isa::Scalar, scalar::two_bit)];
        if avx512::has_vpopcntdq() {
            v.push((Isa::Avx512, avx512::two_bit));
        }
        v
    }

    /// u8 weights with the edges over-represented.
    fn weight_edge() -> impl Strategy<Value = u8> {
        prop_oneof![Just(0u8), Just(1u8), Just(128u8), Just(255u8), any::<u8>()]
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
            words in 1usize..6,
            blocks in 0usize..4,
            seed in proptest::collection::vec(
                prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()], 2 * 5 * 3 * BLOCK_ROWS),
            weights in proptest::collection::vec(weight_edge(), 2 * 5 * 64),
        ) {
            let rows = blocks * BLOCK_ROWS;
            let (signs, magnitudes) = seed.split_at(seed.len() / 2);
            let (signs, magnitudes) = (&signs[..rows * words], &magnitudes[..rows * words]);
            let dims = words * 64;
            let query = TwoBitQuery::new(weights[..dims].to_vec(), weights[dims..2 * dims].to_vec());
            let mut expected = vec![i32::MIN; rows];
            scalar::two_bit(&query, signs, magnitudes, &mut expected);
            // The specification is the sum it names, read straight from the blocked layout.
            for (r, &sum) in expected.iter().enumerate() {
                let (b, i) = (r / BLOCK_ROWS, r % BLOCK_ROWS);
                let direct: i32 = (0..dims)
                    .map(|d| {
                        let at = (b * words + d / 64) * BLOCK_ROWS + i;
                        let (s, m) = (signs[at] >> (d % 64) & 1, magnitudes[at] >> (d % 64) & 1);
                        let (a, c) = query.weights(d);
                        (2 * s as i32 - 1) * (a + m as i32 * c)
                    })
                    .sum();
                prop_assert_eq!(sum, direct);
            }
            for (isa, f) in two_bit_impls() {
                let mut got = vec![i32::MAX; rows];
                f(&query, signs, magnitudes, &mut got);
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
            terms in proptest::collection::vec((0usize..64, 0usize..6, -4.0f32..4.0), 0..40),
        ) {
            let rows = blocks * BLOCK_ROWS;
            let signatures = &seed[..rows * words];
            let terms: Vec<SignatureTerm> = terms
                .into_iter()
                .map(|(bit, word, weight)| SignatureTerm { word: word % words, mask: 1 << bit, weight })
                .collect();
            let mut expected = vec![f32::NAN; rows];
            signature_weights(&terms, words, signatures, &mut expected);
            if avx512::has_vl() {
                let mut got = vec![f32::NAN; rows];
                avx512::signature_weights(&terms, words, signatures, &mut got);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&got), bits(&expected));
            }
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
        // Dimension 0: a = 3, c = 5; dimension 1: a = −2, c = 10; the rest zero.
        let mut a = vec![128u8; 64];
        let mut c = vec![128u8; 64];
        (a[0], c[0], a[1], c[1]) = (131, 133, 126, 138);
        let query = TwoBitQuery::new(a, c);
        // Row 0: both signs set, magnitude of dimension 0: (3 + 5) + (−2) = 6.
        // Row 1: no sign set, magnitude of dimension 1: −3 − (−2 + 10) = −11.
        let mut signs = vec![0u64; BLOCK_ROWS];
        let mut magnitudes = vec![0u64; BLOCK_ROWS];
        (signs[0], magnitudes[0], magnitudes[1]) = (0b11, 0b01, 0b10);
        for (isa, f) in two_bit_impls() {
            let mut out = [7i32; BLOCK_ROWS];
            f(&query, &signs, &magnitudes, &mut out);
            assert_eq!(out, [6, -11, -1, -1, -1, -1, -1, -1], "{isa:?}");
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
        assert_eq!(k.two_bit_isa == Isa::Avx512, avx512::has_vpopcntdq());
        assert_eq!(k.dot_i8_isa, Isa::Wide);
        assert_eq!(k.signature_isa == Isa::Avx512, avx512::has_vl());
    }
}
