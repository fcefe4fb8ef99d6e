//! Kernel throughput on one core, out of cache, against this machine's memory read bandwidth
//! measured in the same run.
//!
//! Run: `cargo bench --bench kernels`. Read bandwidth comes from `perpetuity::measure::read_bandwidth`
//! over 512 MiB, in the same run. Sizes: 2-bit codes of 256 dims (64 bytes per row: a nibble per
//! pair of dimensions, byte-major in groups of 64 rows) for 4M rows (256 MiB), int8 rows of 256 dims for 1M
//! rows (256 MiB); larger than the L3 cache; lexical signatures of 256 bits in blocks of 8 rows
//! for 4M rows (128 MiB), tested for 8 and for 40 query terms (a question alone, and one read
//! in its conversation with its context terms).
//! Prints medians of repeated runs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use perpetuity::scan::kernels::{
    self, BLOCK_ROWS, Ceiling, DotI8Fn, Isa, Kernels, LUT_ENTRY_MAX, LUT_ROWS, Lookahead,
    SignatureTerm, TwoBitQuery,
};
use perpetuity::scan::topk::{Hit, TopK};

const DIMS: usize = 256;
const REPEATS: usize = 5;
const CODE_ROWS: usize = 4 << 20;
const INT8_ROWS: usize = 1 << 20;
/// Words of a row's lexical signature (256 bits).
const SIGNATURE_WORDS: usize = 4;
/// What a row is, in each kernel's line.
const DIMS_SHAPE: &str = "256 dims";
const SIGNATURE_SHAPE: &str = "256 signature bits";
/// Query terms the signature kernel tests: a question alone, and one read in its conversation.
const SIGNATURE_TERMS: [usize; 2] = [8, 40];
/// Rows of codes that fit in the L2 cache (512 KiB), for the in-cache figure.
const CACHED_ROWS: usize = 8 << 10;
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

/// One kernel's line: `rows` rows of `bytes_per_row` bytes (`shape`, e.g. "256 dims") in `t`,
/// against `bandwidth`.
fn report(name: &str, shape: &str, rows: usize, bytes_per_row: usize, t: Duration, bandwidth: f64) {
    let rows_per_s = rows as f64 / t.as_secs_f64();
    let bytes_per_s = rows_per_s * bytes_per_row as f64;
    println!(
        "{name}: {rows} rows x {shape} in {t:.2?}: {:.1}M rows/s/core, {:.2} GB/s, {:.0}% of read bandwidth",
        rows_per_s / 1e6,
        bytes_per_s / 1e9,
        100.0 * bytes_per_s / bandwidth
    );
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

/// The next group of codes into the first-level cache, the one after into the second-level.
fn group_ahead(code_bytes: usize) -> Lookahead {
    let group = (LUT_ROWS * code_bytes) as isize;
    Lookahead {
        near: group,
        far: 2 * group,
    }
}

fn main() {
    let chosen = Kernels::detect(Ceiling::Native);
    println!("kernels chosen at start-up: {}", chosen.describe());

    let code_bytes = DIMS / 4;
    let codes: Vec<u8> = fill(CODE_ROWS * code_bytes / 8)
        .into_iter()
        .flat_map(u64::to_le_bytes)
        .collect();
    let bandwidth = perpetuity::measure::read_bandwidth(BANDWIDTH_BYTES);
    println!(
        "memory read bandwidth, one core, {} MiB sequential: {:.2} GB/s",
        BANDWIDTH_BYTES >> 20,
        bandwidth / 1e9
    );

    // Pairs of dimensions, 16 entries each.
    let table: Vec<i8> = fill(DIMS / 2 * 16 / 8)
        .into_iter()
        .flat_map(|w| (0..8).map(move |k| (w >> (8 * k)) as i8 % LUT_ENTRY_MAX))
        .collect();
    let query = TwoBitQuery::new(table);
    let mut out = vec![0i32; CODE_ROWS];
    for (isa, f) in kernels::two_bit_forms() {
        let t = time(|| {
            f(&query, &codes, &mut out, Lookahead::default());
            black_box(&out);
        });
        report(
            &format!("two_bit {isa:?}"),
            DIMS_SHAPE,
            CODE_ROWS,
            code_bytes,
            t,
            bandwidth,
        );
        // The same, loading each line's counterparts one and two groups (64 rows each) ahead
        // as it reads it: how stage one reads a scope's sketches.
        let ahead = group_ahead(code_bytes);
        let t = time(|| {
            f(&query, &codes, &mut out, ahead);
            black_box(&out);
        });
        report(
            &format!(
                "two_bit {isa:?}, loading {} and {} bytes ahead",
                ahead.near, ahead.far
            ),
            DIMS_SHAPE,
            CODE_ROWS,
            code_bytes,
            t,
            bandwidth,
        );
        // The same kernel over a slice that stays in the L2 cache, many times: what the
        // arithmetic alone allows.
        let cached = &codes[..CACHED_ROWS * code_bytes];
        let t = time(|| {
            for _ in 0..CODE_ROWS / CACHED_ROWS {
                f(
                    &query,
                    cached,
                    &mut out[..CACHED_ROWS],
                    Lookahead::default(),
                );
                black_box(&out);
            }
        });
        report(
            &format!("two_bit {isa:?}, in cache ({CACHED_ROWS} rows repeated)"),
            DIMS_SHAPE,
            CODE_ROWS,
            code_bytes,
            t,
            bandwidth,
        );
    }
    drop(out);

    // The dense first pass end to end on one core: the chosen 2-bit kernel in chunks, loading
    // ahead as stage one does, then top-k.
    let scan = || {
        let mut top = TopK::new(TOP_K);
        let mut buf = vec![0i32; SCAN_CHUNK_ROWS];
        // Rows arrive in increasing id, so a sum equal to the worst kept one loses its tie:
        // only strictly larger sums can enter once the top-k is full.
        let mut bound = i32::MIN;
        for (c, chunk) in codes.chunks(SCAN_CHUNK_ROWS * code_bytes).enumerate() {
            let rows = chunk.len() / code_bytes;
            (chosen.two_bit)(&query, chunk, &mut buf[..rows], group_ahead(code_bytes));
            for (i, &sum) in buf[..rows].iter().enumerate() {
                if sum > bound {
                    top.push(Hit {
                        score: sum as f32,
                        carried: 0.0,
                        key: (c * SCAN_CHUNK_ROWS + i) as u64,
                    });
                    if let Some(worst) = top.threshold() {
                        bound = worst.score as i32;
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
        "first pass (two_bit {:?} + top-{TOP_K}): {CODE_ROWS} rows in {t:.2?}: {:.0}M rows/s/core, {:.0}% of read bandwidth",
        chosen.two_bit_isa,
        scan_rows_per_s / 1e6,
        100.0 * scan_rows_per_s * code_bytes as f64 / bandwidth
    );
    drop(codes);
    assert_eq!(CODE_ROWS % LUT_ROWS, 0);
    assert_eq!(SCAN_CHUNK_ROWS % LUT_ROWS, 0);

    signatures(bandwidth);

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
        report(
            &format!("dot_i8 {isa:?}"),
            DIMS_SHAPE,
            INT8_ROWS,
            DIMS,
            t,
            bandwidth,
        );
    }
    faiss_reference(scan_rows_per_s);
}

/// The signature kernel's forms over `CODE_ROWS` rows of random signatures (about half their
/// bits set, so a term of three bits matches one row in eight), out of cache and in cache, for
/// each count of `SIGNATURE_TERMS`: its cost grows with the query's terms, where the 2-bit
/// kernel's does not.
fn signatures(bandwidth: f64) {
    let signatures = fill(CODE_ROWS * SIGNATURE_WORDS);
    let mut out = vec![0f32; CODE_ROWS];
    let bytes_per_row = SIGNATURE_WORDS * 8;
    for count in SIGNATURE_TERMS {
        let terms: Vec<SignatureTerm> = fill(count)
            .into_iter()
            .enumerate()
            .map(|(t, w)| SignatureTerm {
                word: t % SIGNATURE_WORDS,
                mask: (0..3).fold(0, |mask, b| mask | 1 << ((w >> (8 * b)) % 64)),
                weight: 1.0 + t as f32,
            })
            .collect();
        for (isa, f) in kernels::signature_forms() {
            let t = time(|| {
                f(&terms, SIGNATURE_WORDS, &signatures, &mut out);
                black_box(&out);
            });
            report(
                &format!("signature {isa:?}, {count} terms"),
                SIGNATURE_SHAPE,
                CODE_ROWS,
                bytes_per_row,
                t,
                bandwidth,
            );
            let cached = &signatures[..CACHED_ROWS * SIGNATURE_WORDS];
            let t = time(|| {
                for _ in 0..CODE_ROWS / CACHED_ROWS {
                    f(&terms, SIGNATURE_WORDS, cached, &mut out[..CACHED_ROWS]);
                    black_box(&out);
                }
            });
            report(
                &format!(
                    "signature {isa:?}, {count} terms, in cache ({CACHED_ROWS} rows repeated)"
                ),
                SIGNATURE_SHAPE,
                CODE_ROWS,
                bytes_per_row,
                t,
                bandwidth,
            );
        }
    }
    assert_eq!(CODE_ROWS % BLOCK_ROWS, 0);
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
            // The same code size as the 2-bit code: two bits per dimension.
            "--binary-bits",
            &(2 * DIMS).to_string(),
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
        "faiss {} (one core, k={TOP_K}): IndexBinaryFlat ({} bits, the 2-bit code's size) {:.0}M rows/s (2-bit first pass here: {:.2}x), SQ8 flat {:.1}M rows/s",
        figures["faiss_version"],
        figures["binary_bits"],
        binary / 1e6,
        first_pass_rows_per_s / binary,
        sq8 / 1e6
    );
}
