//! Dictionary figures: load time, and derivation rate (tokens → retrieval row, and retrieval
//! row → embedding + int8 quantisation) in rows per second over the LoCoMo turns.
//!
//! Run: `cargo bench --bench dictionary`. Prints medians of repeated runs.

use std::path::Path;
use std::time::{Duration, Instant};

use perpetuity::config::default_dictionaries_root;
use perpetuity::datasets::{self, Format};
use perpetuity::dictionary::derive::{derive, embed};
use perpetuity::dictionary::stats::FrequencyTable;
use perpetuity::dictionary::{DEFAULT_VERSION, Dictionary};
use perpetuity::tokens::Tokenizer;

const REPEATS: usize = 7;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

/// Every LoCoMo turn text, or a clear message and nothing when the data is absent.
fn locomo_turns() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/locomo/locomo10.json");
    if !path.is_file() {
        eprintln!("SKIP derivation figures: {} is absent", path.display());
        return Vec::new();
    }
    datasets::load(Format::Locomo, &path)
        .expect("locomo10.json loads")
        .messages
        .into_iter()
        .map(|m| m.text)
        .collect()
}

fn main() {
    let root = default_dictionaries_root();
    let tokenizer = Tokenizer::new();
    // The tokenizer's fingerprint is computed once per process; keep it out of the load figure.
    let started = Instant::now();
    tokenizer.fingerprint();
    println!(
        "tokenizer fingerprint (once per process): {:?}",
        started.elapsed()
    );

    let loads: Vec<Duration> = (0..REPEATS)
        .map(|_| {
            let started = Instant::now();
            Dictionary::load_version(&root, DEFAULT_VERSION).expect("dictionary loads");
            started.elapsed()
        })
        .collect();
    let dict = Dictionary::load_version(&root, DEFAULT_VERSION).expect("dictionary loads");
    println!(
        "dictionary {}: {} rows x {} dims, load (read + sha256 + validate) median {:?}",
        dict.version(),
        dict.rows(),
        dict.dims(),
        median(loads)
    );

    let turns = locomo_turns();
    if turns.is_empty() {
        return;
    }
    let tokens: Vec<_> = turns.iter().map(|t| tokenizer.encode(t)).collect();
    let total_tokens: usize = tokens.iter().map(Vec::len).sum();
    println!(
        "input: {} LoCoMo turns, {} tokens",
        tokens.len(),
        total_tokens
    );

    let mut derive_times = Vec::new();
    let mut embed_times = Vec::new();
    for _ in 0..REPEATS {
        let started = Instant::now();
        let rows: Vec<_> = tokens
            .iter()
            .map(|t| derive(&dict, &tokenizer, None, t))
            .collect();
        derive_times.push(started.elapsed());
        let mut stats = FrequencyTable::default();
        rows.iter().for_each(|r| r.count_into(&mut stats));
        let started = Instant::now();
        let mut sink = 0u64;
        for row in &rows {
            let e = embed(&dict, &stats, row);
            sink = sink.wrapping_add(e.quantize().values.len() as u64);
        }
        embed_times.push(started.elapsed());
        std::hint::black_box(sink);
    }
    let rate = |d: Duration| tokens.len() as f64 / d.as_secs_f64();
    let (d, e) = (median(derive_times), median(embed_times));
    println!(
        "derive (tokens -> terms + token counts): median {d:?}, {:.0} rows/s, one thread",
        rate(d)
    );
    println!(
        "embed (row -> weighted unit vector + int8 + sign bits): median {e:?}, {:.0} rows/s, one thread",
        rate(e)
    );
}
