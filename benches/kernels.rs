//! Kernel throughput on one core, out of cache, against this machine's memory read bandwidth
//! measured in the same run.
//!
//! Run: `cargo bench --bench kernels`. Sizes: 1-bit codes of 256 dims (32 bytes per row, in
//! blocks of 8 rows) for 8M rows (256 MiB), int8 rows of 256 dims for 1M rows (256 MiB); larger than the L3 cache.
//! Prints medians of repeated runs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use perpetuity::scan::kernels::{self, DotI8Fn, HammingFn, Isa, Kernels};

const DIMS: usize = 256;
const REPEATS: usize = 5;
const CODE_ROWS: usize = 8 << 20;
const INT8_ROWS: usize = 1 << 20;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

/// Deterministic filler (xorshift).
fn fill(words: usize) -> Vec<u64> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    (0..words)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        })
        .collect()
}

/// Sequential read bandwidth (bytes/s) of one core over `data`: XOR of every word, so the
/// loop is bound by memory, not by arithmetic.
fn read_bandwidth(data: &[u64]) -> f64 {
    let times: Vec<Duration> = (0..REPEATS)
        .map(|_| {
            let started = Instant::now();
            let mut acc = [0u64; 8];
            for chunk in data.chunks_exact(8) {
                for (a, w) in acc.iter_mut().zip(chunk) {
                    *a ^= w;
                }
            }
            black_box(acc);
            started.elapsed()
        })
        .collect();
    std::mem::size_of_val(data) as f64 / median(times).as_secs_f64()
}

fn time_hamming(f: HammingFn, query: &[u64], codes: &[u64], out: &mut [u32]) -> Duration {
    median(
        (0..REPEATS)
            .map(|_| {
                let started = Instant::now();
                f(query, codes, out);
                black_box(&out);
                started.elapsed()
            })
            .collect(),
    )
}

fn time_dot(f: DotI8Fn, query: &[i8], rows: &[i8], out: &mut [i32]) -> Duration {
    median(
        (0..REPEATS)
            .map(|_| {
                let started = Instant::now();
                f(query, rows, out);
                black_box(&out);
                started.elapsed()
            })
            .collect(),
    )
}

fn main() {
    let chosen = Kernels::detect(false);
    println!("kernels chosen at start-up: {}", chosen.describe());

    let words = kernels::code_words(DIMS);
    let codes = fill(CODE_ROWS * words);
    let bandwidth = read_bandwidth(&codes);
    println!(
        "memory read bandwidth, one core, {} MiB sequential: {:.2} GB/s",
        std::mem::size_of_val(&codes[..]) >> 20,
        bandwidth / 1e9
    );

    let query = fill(words + 1)[1..].to_vec();
    let mut out = vec![0u32; CODE_ROWS];
    let mut hammings: Vec<(Isa, HammingFn)> = vec![(Isa::Scalar, kernels::scalar::hamming)];
    if kernels::avx512::has_vpopcntdq() {
        hammings.push((Isa::Avx512, kernels::avx512::hamming));
    }
    for (isa, f) in hammings {
        let t = time_hamming(f, &query, &codes, &mut out);
        let rows_per_s = CODE_ROWS as f64 / t.as_secs_f64();
        let bytes_per_s = rows_per_s * (words * 8) as f64;
        println!(
            "hamming {isa:?}: {CODE_ROWS} rows x {DIMS} bits in {t:.2?}: {:.0}M rows/s/core, {:.2} GB/s, {:.0}% of read bandwidth",
            rows_per_s / 1e6,
            bytes_per_s / 1e9,
            100.0 * bytes_per_s / bandwidth
        );
    }
    drop(out);
    drop(codes);

    let bytes: Vec<i8> = fill(INT8_ROWS * DIMS / 8)
        .into_iter()
        .flat_map(u64::to_le_bytes)
        .map(|b| b as i8)
        .collect();
    let query: Vec<i8> = bytes[..DIMS].iter().map(|&b| b.max(-127)).collect();
    let mut out = vec![0i32; INT8_ROWS];
    let dots: [(Isa, DotI8Fn); 2] = [
        (Isa::Scalar, kernels::scalar::dot_i8),
        (Isa::Wide, kernels::wide_impl::dot_i8),
    ];
    for (isa, f) in dots {
        let t = time_dot(f, &query, &bytes, &mut out);
        let rows_per_s = INT8_ROWS as f64 / t.as_secs_f64();
        let bytes_per_s = rows_per_s * DIMS as f64;
        println!(
            "dot_i8 {isa:?}: {INT8_ROWS} rows x {DIMS} dims in {t:.2?}: {:.1}M rows/s/core, {:.2} GB/s, {:.0}% of read bandwidth",
            rows_per_s / 1e6,
            bytes_per_s / 1e9,
            100.0 * bytes_per_s / bandwidth
        );
    }
}
