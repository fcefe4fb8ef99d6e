//! The specification.

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
