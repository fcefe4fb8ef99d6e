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
    assert_eq!(
        Kernels::detect(Ceiling::Scalar).describe(),
        Kernels::SCALAR.describe()
    );
    let k = Kernels::detect(Ceiling::Native);
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

#[test]
fn an_avx2_ceiling_chooses_no_avx512_kernel() {
    let k = Kernels::detect(Ceiling::Avx2);
    let chosen = [
        k.two_bit_isa,
        k.dot_i8_isa,
        k.dot_f32_isa,
        k.signature_isa,
        k.at_least_isa,
    ];
    assert!(
        !chosen.contains(&Isa::Avx512) && !chosen.contains(&Isa::Avx512Bw),
        "{}",
        k.describe()
    );
    let expected = if avx2::has_avx2() {
        Isa::Avx2
    } else {
        Isa::Scalar
    };
    assert_eq!((k.two_bit_isa, k.signature_isa), (expected, expected));
}
