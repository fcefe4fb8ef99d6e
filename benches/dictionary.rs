//! Dictionary figures: load time, the tokenizer's rate on prose (the LoCoMo turns) and on code
//! (this crate's own sources), and derivation rate (tokens → retrieval row, and retrieval row
//! → embedding + int8 quantisation) in rows per second over the LoCoMo turns.
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

/// The text of every `.rs` file under this crate's `src/`.
fn crate_sources() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("src/ reads")
            .map(|entry| entry.expect("entry reads").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(std::fs::read_to_string(&path).expect("source reads"));
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut out);
    out
}

/// The tokenizer's rate on `texts`, one thread: the first pass (a pre-token outside the
/// vocabulary is byte-pair merged), the median of repeated passes (its merges kept), and
/// o200k_base's own `encode_ordinary` over the same texts, which keeps none.
fn encoding(tokenizer: &Tokenizer, what: &str, texts: &[String]) {
    let bytes: usize = texts.iter().map(String::len).sum();
    let pass = || {
        let started = Instant::now();
        let tokens: usize = texts.iter().map(|t| tokenizer.encode(t).len()).sum();
        (started.elapsed(), tokens)
    };
    let (first, tokens) = pass();
    let again = median((0..REPEATS).map(|_| pass().0).collect());
    let bpe = tiktoken_rs::o200k_base_singleton();
    let own = median(
        (0..REPEATS)
            .map(|_| {
                let started = Instant::now();
                let n: usize = texts.iter().map(|t| bpe.encode_ordinary(t).len()).sum();
                std::hint::black_box(n);
                started.elapsed()
            })
            .collect(),
    );
    let mb = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e6;
    println!(
        "encode {what}: {bytes} bytes, {tokens} tokens; first pass {first:?} ({:.1} MB/s), \
         again median {again:?} ({:.1} MB/s); o200k_base's encode_ordinary median {own:?} \
         ({:.1} MB/s), one thread",
        mb(first),
        mb(again),
        mb(own)
    );
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

    encoding(&tokenizer, "this crate's sources (code)", &crate_sources());
    let turns = locomo_turns();
    if turns.is_empty() {
        return;
    }
    encoding(&tokenizer, "the LoCoMo turns (prose)", &turns);
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
