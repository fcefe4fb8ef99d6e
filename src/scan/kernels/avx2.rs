//! AVX2 kernels through `core::arch`, for CPUs without AVX-512, used only after runtime
//! detection.

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
pub fn two_bit(query: &super::TwoBitQuery, codes: &[u8], out: &mut [i32], ahead: super::Lookahead) {
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
            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6,
            10, 14, 3, 7, 11, 15,
        );
        let (even, odd) = (_mm256_set1_epi16(0x0001), _mm256_set1_epi16(0x0100));
        for (g, sums) in out.chunks_exact_mut(LUT_ROWS).enumerate() {
            let base = codes[g * bytes * LUT_ROWS..].as_ptr();
            for (h, sums) in sums.chunks_exact_mut(HALF_ROWS).enumerate() {
                let mut totals = [0i32; HALF_ROWS];
                let chunks = bytes / CHUNK_BYTES;
                for run in (0..chunks).step_by(RUN) {
                    let (mut evens, mut odds) = (_mm256_setzero_si256(), _mm256_setzero_si256());
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
                                                (2 * c + half) * TABLE_BYTES + place * PAIR_ENTRIES,
                                            )
                                            .cast(),
                                    ))
                                };
                                let entries = _mm256_shuffle_epi8(table, index);
                                evens =
                                    _mm256_add_epi16(evens, _mm256_maddubs_epi16(even, entries));
                                odds = _mm256_add_epi16(odds, _mm256_maddubs_epi16(odd, entries));
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
