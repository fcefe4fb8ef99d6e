//! 256-bit vectors via `wide` (AVX2 and FMA under the shipped baseline).

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
