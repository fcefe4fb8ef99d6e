//! Kernel throughput on one core, out of cache, against this machine's memory read bandwidth
//! measured in the same run.
//!
//! Run: `cargo bench --bench kernels`. Read bandwidth comes from `perpetuity::bench::read_bandwidth`
//! over 512 MiB, in the same run. Sizes: 1-bit codes of 256 dims (32 bytes per row, in
//! blocks of 8 rows) for 8M rows (256 MiB), int8 rows of 256 dims for 1M rows (256 MiB); larger than the L3 cache.
//! Prints medians of repeated runs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use perpetuity::scan::kernels::{self, BLOCK_ROWS, DotI8Fn, HammingFn, Isa, Kernels};
use perpetuity::scan::topk::{Hit, TopK};
use perpetuity::types::RowId;

const DIMS: usize = 256;
const REPEATS: usize = 5;
const CODE_ROWS: usize = 8 << 20;
const INT8_ROWS: usize = 1 << 20;
/// Buffer of the read-bandwidth reference: twice the L3 cache of the machines we measure on.
const BANDWIDTH_BYTES: usize = 512 << 20;
/// Rows scored into one buffer before their hits are offered to the top-k.
const SCAN_CHUNK_ROWS: usize = 1024;
/// Hits kept, as in the faiss reference.
const TOP_K: usize = 10;

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

/// Median wall time of `REPEATS` runs of `run`.
fn time(mut run: impl FnMut()) -> Duration {
    median(
        (0..REPEATS)
            .map(|_| {
                let started = Instant::now();
                run();
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
    let bandwidth = perpetuity::bench::read_bandwidth(BANDWIDTH_BYTES);
    println!(
        "memory read bandwidth, one core, {} MiB sequential: {:.2} GB/s",
        BANDWIDTH_BYTES >> 20,
        bandwidth / 1e9
    );

    let query = fill(words + 1)[1..].to_vec();
    let mut out = vec![0u32; CODE_ROWS];
    let mut hammings: Vec<(Isa, HammingFn)> = vec![(Isa::Scalar, kernels::scalar::hamming)];
    if kernels::avx512::has_vpopcntdq() {
        hammings.push((Isa::Avx512, kernels::avx512::hamming));
    }
    for (isa, f) in hammings {
        let t = time(|| {
            f(&query, &codes, &mut out);
            black_box(&out);
        });
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

    // The first pass end to end on one core: chosen Hamming kernel in chunks, then top-k.
    let scan = || {
        let mut top = TopK::new(TOP_K);
        let mut buf = vec![0u32; SCAN_CHUNK_ROWS];
        // Rows arrive in increasing id, so a distance equal to the worst kept one loses its
        // tie: only strictly smaller distances can enter once the top-k is full.
        let mut bound = u32::MAX;
        for (c, chunk) in codes.chunks(SCAN_CHUNK_ROWS * words).enumerate() {
            let rows = chunk.len() / words;
            (chosen.hamming)(&query, chunk, &mut buf[..rows]);
            for (i, &d) in buf[..rows].iter().enumerate() {
                if d < bound {
                    top.push(Hit {
                        score: -(d as f32),
                        row: RowId((c * SCAN_CHUNK_ROWS + i) as u64),
                    });
                    if let Some(worst) = top.threshold() {
                        bound = (-worst.score) as u32;
                    }
                }
            }
        }
        top.into_sorted()
    };
    let t = time(|| {
        black_box(scan());
    });
    let scan_rows_per_s = CODE_ROWS as f64 / t.as_secs_f64();
    println!(
        "first pass (hamming {:?} + top-{TOP_K}): {CODE_ROWS} rows in {t:.2?}: {:.0}M rows/s/core, {:.0}% of read bandwidth",
        chosen.hamming_isa,
        scan_rows_per_s / 1e6,
        100.0 * scan_rows_per_s * (words * 8) as f64 / bandwidth
    );
    drop(codes);
    assert_eq!(CODE_ROWS % BLOCK_ROWS, 0);

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
        let t = time(|| {
            f(&query, &bytes, &mut out);
            black_box(&out);
        });
        let rows_per_s = INT8_ROWS as f64 / t.as_secs_f64();
        let bytes_per_s = rows_per_s * DIMS as f64;
        println!(
            "dot_i8 {isa:?}: {INT8_ROWS} rows x {DIMS} dims in {t:.2?}: {:.1}M rows/s/core, {:.2} GB/s, {:.0}% of read bandwidth",
            rows_per_s / 1e6,
            bytes_per_s / 1e9,
            100.0 * bytes_per_s / bandwidth
        );
    }
    faiss_reference(scan_rows_per_s);
}

/// faiss's flat scans on the same shapes, run now when `PERPETUITY_FAISS_PYTHON` names a Python
/// with faiss-cpu (see `benches/faiss_flat.py`).
fn faiss_reference(first_pass_rows_per_s: f64) {
    let Some(python) = std::env::var_os("PERPETUITY_FAISS_PYTHON") else {
        println!(
            "faiss reference: skipped (set PERPETUITY_FAISS_PYTHON to a Python with faiss-cpu)"
        );
        return;
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/faiss_flat.py");
    let output = std::process::Command::new(python)
        .arg(script)
        .args([
            "--dims",
            &DIMS.to_string(),
            "--code-rows",
            &CODE_ROWS.to_string(),
        ])
        .args(["--int8-rows", &INT8_ROWS.to_string()])
        .output()
        .expect("faiss script runs");
    assert!(
        output.status.success(),
        "faiss script failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let figures: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("faiss script prints JSON");
    let binary = figures["binary_flat_rows_per_s"]
        .as_f64()
        .unwrap_or(f64::NAN);
    let sq8 = figures["sq8_flat_rows_per_s"].as_f64().unwrap_or(f64::NAN);
    println!(
        "faiss {} (one core, k={TOP_K}): IndexBinaryFlat {:.0}M rows/s (first pass here: {:.2}x), SQ8 flat {:.1}M rows/s",
        figures["faiss_version"],
        binary / 1e6,
        first_pass_rows_per_s / binary,
        sq8 / 1e6
    );
}
