//! AVX-512 kernels through `core::arch`, used only after runtime detection.

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
pub fn two_bit(query: &super::TwoBitQuery, codes: &[u8], out: &mut [i32], ahead: super::Lookahead) {
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
                unsafe { _mm512_storeu_si512(sums[s * CHUNK_ROWS..].as_mut_ptr().cast(), total) };
            }
        }
    }
}
