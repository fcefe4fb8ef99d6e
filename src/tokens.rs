//! The one tokenizer: o200k_base through `tiktoken-rs`, embedded in the binary and offline.
//!
//! Every stored row keeps its token ids under this tokenizer; the same tokens advance the
//! agent's clock and count the frame budget, and retrieval representations derive from them.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, OnceLock};

use base64::Engine as _;
use fancy_regex::Regex;
use rustc_hash::FxHashMap;
use sha2::{Digest, Sha256};
use tiktoken_rs::{CoreBPE, O200K_BASE_PAT_STR, byte_pair_split};

use crate::types::TokenId;

/// The tokenizer's name as recorded in dictionary headers.
pub const TOKENIZER_NAME: &str = "o200k_base";

/// Number of ordinary (mergeable) ranks in o200k_base; ids at or above it are special tokens.
pub const VOCAB_SIZE: u32 = 199_998;

/// Bytes of text whose token counts [`Tokenizer::count`] keeps; past it they are forgotten all
/// at once and counting starts over.
const COUNTED_BYTES: usize = 32 << 20;

/// The longest run of white space, or of anything but white space, that is encoded in one
/// go. A longer run (a megabyte of one letter, a wall of spaces) is one pre-token of
/// o200k_base, and merging its bytes costs about 60 bytes of memory per byte; it is encoded
/// as consecutive runs of this many bytes instead ([`runs`]), which changes its tokens only
/// at each cut. No word of any language comes near it.
const RUN_BYTES: usize = 256;

/// Pieces of text already counted, and their bytes.
#[derive(Default)]
struct Counted {
    counts: HashMap<Box<str>, usize>,
    bytes: usize,
}

/// Ids the decoding table holds: every ordinary token and the special tokens above them
/// (o200k_base's highest is `<|endofprompt|>`, 200,018). Every id from here on is outside the
/// vocabulary.
const DECODED_IDS: u32 = 200_019;

/// o200k_base's vocabulary both ways, built once from the tokenizer's own tables: the bytes of
/// every id below [`DECODED_IDS`] end to end and where each id's start (a token is decoded by
/// two array reads), and every ordinary token's rank by its bytes.
struct Vocabulary {
    bytes: Vec<u8>,
    starts: Vec<u32>,
    /// What byte-pair merging looks up.
    ranks: FxHashMap<Vec<u8>, u32>,
}

impl Vocabulary {
    fn new(bpe: &CoreBPE) -> Self {
        let mut bytes = Vec::with_capacity(2 << 20);
        let mut starts = Vec::with_capacity(DECODED_IDS as usize + 1);
        for id in 0..DECODED_IDS {
            starts.push(bytes.len() as u32);
            // An id the vocabulary lacks stands for nothing, as the decoder's error says.
            if let Ok(token) = bpe.decode_bytes(&[id]) {
                bytes.extend_from_slice(&token);
            }
        }
        starts.push(bytes.len() as u32);
        let ranks = (0..VOCAB_SIZE)
            .map(|rank| {
                let (start, end) = (starts[rank as usize], starts[rank as usize + 1]);
                (bytes[start as usize..end as usize].to_vec(), rank)
            })
            .filter(|(token, _)| !token.is_empty())
            .collect();
        Self {
            bytes,
            starts,
            ranks,
        }
    }

    fn bytes_of(&self, token: TokenId) -> &[u8] {
        let id = token.0 as usize;
        match (self.starts.get(id), self.starts.get(id + 1)) {
            (Some(&start), Some(&end)) => &self.bytes[start as usize..end as usize],
            _ => &[],
        }
    }
}

/// Compilations of o200k_base's pre-token pattern, each thread using one ([`pre_tokens`]): a
/// compiled pattern keeps its matcher's scratch space in pools that its clones share, and hands
/// it to all but its first thread through a lock, so threads that share one wait on each
/// other. Each is compiled on its first use; a fixed number, so a burst of threads (the
/// captures run on tokio's blocking pool) does not compile and grow one each.
const PATTERNS: usize = 64;

/// The pattern of this thread ([`PATTERNS`]): the first threads to encode get one each.
fn pre_tokens() -> &'static Regex {
    static ALL: [OnceLock<Regex>; PATTERNS] = [const { OnceLock::new() }; PATTERNS];
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % PATTERNS;
    }
    ALL[MINE.with(|&mine| mine)].get_or_init(|| {
        Regex::new(O200K_BASE_PAT_STR).expect("o200k_base's pre-token pattern compiles")
    })
}

/// Bytes the byte-pair merges kept ([`Merged`]) take, about; past it they are forgotten all at
/// once.
const MERGED_BYTES: usize = 16 << 20;

/// What one kept merge takes beside its bytes and ranks: its two boxes and the map's slot.
const MERGED_ENTRY_BYTES: usize = 64;

/// Pre-tokens that are not tokens, with the ranks their byte-pair merge gave (process-wide): a
/// word outside the vocabulary (a name, an identifier, a word of another language) recurs in
/// a user's turns, and merging its bytes is the tokenizer's most costly step.
#[derive(Default)]
struct Merged {
    ranks: FxHashMap<Box<[u8]>, Box<[u32]>>,
    bytes: usize,
}

impl Merged {
    /// Append the ranks of `piece` (not itself a token) to `out`: kept, or merged now (outside
    /// the lock) and kept.
    fn append(piece: &[u8], ranks: &FxHashMap<Vec<u8>, u32>, out: &mut Vec<TokenId>) {
        static MERGED: LazyLock<Mutex<Merged>> = LazyLock::new(Mutex::default);
        if let Some(kept) = MERGED.lock().ranks.get(piece) {
            out.extend(kept.iter().map(|&rank| TokenId(rank)));
            return;
        }
        let merged: Box<[u32]> = byte_pair_split(piece, ranks)
            .into_iter()
            .map(|part| ranks[part])
            .collect();
        out.extend(merged.iter().map(|&rank| TokenId(rank)));
        let size = piece.len() + 4 * merged.len() + MERGED_ENTRY_BYTES;
        let mut kept = MERGED.lock();
        if kept.bytes + size > MERGED_BYTES {
            *kept = Self::default();
        }
        // Another thread may have merged the same piece meanwhile: its bytes count once.
        if !kept.ranks.contains_key(piece) {
            kept.bytes += size;
            kept.ranks.insert(piece.into(), merged);
        }
    }
}

/// The fixed tokenizer. Cheap to copy: it points at a process-wide instance.
#[derive(Clone, Copy)]
pub struct Tokenizer {
    bpe: &'static CoreBPE,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("name", &TOKENIZER_NAME)
            .finish()
    }
}

impl Default for Tokenizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Tokenizer {
    /// The process-wide o200k_base tokenizer (built once, on first use).
    pub fn new() -> Self {
        Self {
            bpe: tiktoken_rs::o200k_base_singleton(),
        }
    }

    /// Text to token ids. Special-token text is encoded as ordinary text, never as a control
    /// token: stored content can never smuggle in a special token.
    /// A run of over [`RUN_BYTES`] is encoded in parts ([`runs`]). Each part is cut into
    /// o200k_base's pre-tokens by its own pattern; a pre-token that is a token is one rank
    /// lookup, any other is byte-pair merged, once while [`Merged`] keeps it
    /// (o200k_base's own `encode_ordinary`, with the merges remembered: a proptest holds the
    /// two equal).
    pub fn encode(&self, text: &str) -> Vec<TokenId> {
        let ranks = &self.vocabulary().ranks;
        let pattern = pre_tokens();
        let mut out = Vec::with_capacity(text.len() / 3);
        for run in runs(text) {
            for piece in pattern.find_iter(run) {
                let piece = piece
                    .expect("o200k_base's pattern needs no backtracking past the limit")
                    .as_str()
                    .as_bytes();
                match ranks.get(piece) {
                    Some(&rank) => out.push(TokenId(rank)),
                    None => Merged::append(piece, ranks, &mut out),
                }
            }
        }
        out
    }

    /// How many tokens `text` encodes to: `encode(text).len()`, exactly, without encoding what
    /// was counted before. The text is cut before every `[` that follows a line break, and
    /// each piece's count is kept (process-wide, up to [`COUNTED_BYTES`]). No pre-token of
    /// o200k_base spans such a cut: its word patterns hold no line break, its punctuation
    /// pattern ends in line breaks or `/` only, its other patterns are digits or white space;
    /// and the one lookahead (`\s+(?!\S)`) never decides a run of white space that ends in a
    /// line break. So the tokens of the text are the pieces' tokens in order (a proptest
    /// holds the sum to the full encoding). A frame is cut so at each turn's `[` label; the
    /// turns of one conversation recur from one recall to the next, and their tokens are not
    /// counted again.
    pub fn count(&self, text: &str) -> usize {
        static COUNTED: LazyLock<Mutex<Counted>> = LazyLock::new(Mutex::default);
        pieces(text)
            .map(|piece| {
                let known = COUNTED.lock().counts.get(piece).copied();
                known.unwrap_or_else(|| {
                    let tokens = self.encode(piece).len();
                    let mut counted = COUNTED.lock();
                    if counted.bytes + piece.len() > COUNTED_BYTES {
                        *counted = Counted::default();
                    }
                    // Another turn may have counted the same piece meanwhile: its bytes count once.
                    if !counted.counts.contains_key(piece) {
                        counted.bytes += piece.len();
                        counted.counts.insert(piece.into(), tokens);
                    }
                    tokens
                })
            })
            .sum()
    }

    /// The bytes that a run of tokens stands for: each token's [`Tokenizer::token_bytes`] in
    /// order. Ids outside the vocabulary decode to nothing; a run cut in the middle of a UTF-8
    /// sequence yields its partial bytes.
    pub fn decode_bytes(&self, tokens: &[TokenId]) -> Vec<u8> {
        let table = self.vocabulary();
        let mut out = Vec::with_capacity(tokens.len() * 4);
        for &token in tokens {
            out.extend_from_slice(table.bytes_of(token));
        }
        out
    }

    /// The bytes one token stands for: an ordinary token's, a special token's text, nothing for
    /// an id outside the vocabulary. Read from [`Vocabulary`], built once from the tokenizer's own
    /// decoder: a capture decodes every token it stores (its chunk cuts, its lexical terms),
    /// and the decoder's hash map lookup per token was 8% of a real conversation's ingest.
    pub fn token_bytes(&self, token: TokenId) -> &'static [u8] {
        self.vocabulary().bytes_of(token)
    }

    fn vocabulary(&self) -> &'static Vocabulary {
        static VOCABULARY: OnceLock<Vocabulary> = OnceLock::new();
        VOCABULARY.get_or_init(|| Vocabulary::new(self.bpe))
    }

    /// Lossy UTF-8 text of a run of tokens.
    pub fn decode_lossy(&self, tokens: &[TokenId]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(tokens)).into_owned()
    }

    /// SHA-256 (hex) of the rank file this tokenizer was built from, recomputed from the
    /// in-memory table (`base64(bytes) rank\n` for every rank, the `.tiktoken` file format).
    /// Dictionary headers record the file's hash, so a dictionary built for another vocabulary
    /// is refused at load. Computed once per process.
    pub fn fingerprint(&self) -> &'static str {
        static FINGERPRINT: OnceLock<String> = OnceLock::new();
        FINGERPRINT.get_or_init(|| {
            let mut hasher = Sha256::new();
            let engine = base64::engine::general_purpose::STANDARD;
            for rank in 0..VOCAB_SIZE {
                let bytes = self.token_bytes(TokenId(rank));
                hasher.update(engine.encode(bytes).as_bytes());
                hasher.update(format!(" {rank}\n").as_bytes());
            }
            hex(&hasher.finalize())
        })
    }
}

/// `text` cut inside every run of white space, or of anything but white space, every
/// [`RUN_BYTES`] bytes (at a character's boundary) from the run's start. A cut of [`pieces`]
/// falls where a run of white space ends, so cutting a piece gives the cuts that cutting the
/// whole text gives.
fn runs(text: &str) -> impl Iterator<Item = &str> {
    let mut start = 0;
    std::iter::from_fn(move || {
        let rest = &text[start..];
        if rest.is_empty() {
            return None;
        }
        if rest.len() <= RUN_BYTES {
            start = text.len();
            return Some(rest);
        }
        let mut run_start = 0;
        let mut white = None;
        let end = rest
            .char_indices()
            .find_map(|(at, c)| {
                if white != Some(c.is_whitespace()) {
                    white = Some(c.is_whitespace());
                    run_start = at;
                }
                (at - run_start >= RUN_BYTES).then_some(at)
            })
            .unwrap_or(rest.len());
        start += end;
        Some(&rest[..end])
    })
}

/// `text` cut before every `[` that follows a line break ([`Tokenizer::count`]).
fn pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut cuts = text.match_indices("\n[").map(|(at, _)| at + 1);
    let mut start = 0;
    std::iter::from_fn(move || {
        if start == text.len() {
            return None;
        }
        let end = cuts.next().unwrap_or(text.len());
        let piece = &text[start..end];
        start = end;
        Some(piece)
    })
}

/// Lower-case hex of a byte string.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_text() {
        let tok = Tokenizer::new();
        let text = "Caroline went to the LGBTQ support group on 7 May 2023. Ünïcödé ✓";
        assert_eq!(tok.decode_lossy(&tok.encode(text)), text);
    }

    #[test]
    fn special_token_text_stays_ordinary() {
        let tok = Tokenizer::new();
        let ids = tok.encode("<|endoftext|>");
        assert!(
            ids.len() > 1,
            "special-token text must not become one control token"
        );
        assert!(ids.iter().all(|t| t.0 < VOCAB_SIZE));
    }

    /// Text made of pieces that meet the cut in every way a frame and a stored turn can:
    /// brackets after one or more line breaks, white space and punctuation before them, `/`
    /// (which the punctuation pattern takes after line breaks), digits, other scripts.
    fn texts() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let fragment = prop_oneof![
            Just("["),
            Just("]"),
            Just("\n"),
            Just("\n\n"),
            Just("\r\n"),
            Just(" "),
            Just("  "),
            Just("\t"),
            Just("/"),
            Just("!"),
            Just("."),
            Just("'s"),
            Just("Hello"),
            Just("world"),
            Just("[Caroline, 13:56]"),
            Just("2023-05-08 13:56"),
            Just("1234567"),
            Just("日本語"),
            Just("Ünïcödé"),
            Just("🙂"),
        ]
        .prop_map(String::from);
        // Runs long enough to be encoded in parts.
        let long = prop_oneof![
            (1..3 * RUN_BYTES).prop_map(|n| "x".repeat(n)),
            (1..3 * RUN_BYTES).prop_map(|n| " ".repeat(n)),
            (1..RUN_BYTES).prop_map(|n| "é".repeat(n)),
        ];
        let fragment = prop_oneof![9 => fragment, 1 => long];
        proptest::collection::vec(fragment, 0..60).prop_map(|parts| parts.concat())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]
        /// The frame's texts, and made-up words, contractions, mixed case, digits and any
        /// character at all (pieces that are not tokens): merged, then read from what was kept.
        #[test]
        fn encode_is_the_tokenizers_own(
            text in proptest::prop_oneof![
                texts(),
                "([A-Za-z]{1,12}('s|'T|'re)?[ ,.!?0-9]{0,3}){0,30}",
                proptest::prelude::any::<String>(),
            ],
        ) {
            let tok = Tokenizer::new();
            let expected: Vec<TokenId> = runs(&text)
                .flat_map(|run| tok.bpe.encode_ordinary(run))
                .map(TokenId)
                .collect();
            proptest::prop_assert_eq!(&tok.encode(&text), &expected);
            // Again, from the merges kept.
            proptest::prop_assert_eq!(tok.encode(&text), expected);
        }

        #[test]
        fn count_is_the_length_of_the_encoding(text in texts()) {
            let tok = Tokenizer::new();
            let expected = tok.encode(&text).len();
            proptest::prop_assert_eq!(tok.count(&text), expected);
            // Again, from the counts kept.
            proptest::prop_assert_eq!(tok.count(&text), expected);
        }
    }

    #[test]
    fn a_long_run_is_encoded_in_parts_that_decode_to_it() {
        let tok = Tokenizer::new();
        let text = format!(
            "a {} b{}",
            "x".repeat(5 * RUN_BYTES + 3),
            " ".repeat(RUN_BYTES + 1)
        );
        let parts: Vec<&str> = runs(&text).collect();
        assert_eq!(parts.concat(), text);
        assert!(parts.len() >= 7, "{}", parts.len());
        let (letters, spaces) = ("x".repeat(RUN_BYTES + 1), " ".repeat(RUN_BYTES + 1));
        assert!(
            parts
                .iter()
                .all(|part| !part.contains(&letters) && !part.contains(&spaces))
        );
        assert_eq!(tok.decode_lossy(&tok.encode(&text)), text);
        let accented = "é".repeat(RUN_BYTES);
        assert!(runs(&accented).all(|part| part.chars().all(|c| c == 'é')));
    }

    #[test]
    fn pieces_are_cut_before_each_bracket_after_a_line_break() {
        assert_eq!(
            pieces("[a] x\n\n[b] y\n[c]\n\nz[").collect::<Vec<_>>(),
            ["[a] x\n\n", "[b] y\n", "[c]\n\nz["]
        );
        assert_eq!(pieces("").count(), 0);
        assert_eq!(pieces("\n[").collect::<Vec<_>>(), ["\n", "["]);
    }

    proptest::proptest! {
        /// The table decodes every id as the tokenizer's own decoder does: ordinary and
        /// special tokens to their bytes, ids outside the vocabulary (in the table's range and
        /// past it) to nothing.
        #[test]
        fn the_table_decodes_as_the_decoder(
            ids in proptest::collection::vec(
                proptest::prop_oneof![
                    0u32..VOCAB_SIZE,
                    VOCAB_SIZE - 2..DECODED_IDS + 2,
                    proptest::prelude::any::<u32>(),
                ],
                0..40,
            ),
        ) {
            let tok = Tokenizer::new();
            let mut expected = Vec::new();
            for &id in &ids {
                expected.extend(tok.bpe.decode_bytes(&[id]).unwrap_or_default());
            }
            let tokens: Vec<TokenId> = ids.iter().copied().map(TokenId).collect();
            proptest::prop_assert_eq!(tok.decode_bytes(&tokens), expected);
        }
    }

    #[test]
    fn the_table_holds_the_special_tokens_and_nothing_past_them() {
        let tok = Tokenizer::new();
        for special in tok.bpe.special_tokens() {
            let ids = tok.bpe.encode_with_special_tokens(special);
            assert_eq!(ids.len(), 1, "{special}");
            assert!(ids[0] < DECODED_IDS, "{special} is {}", ids[0]);
            assert_eq!(tok.token_bytes(TokenId(ids[0])), special.as_bytes());
        }
        for id in DECODED_IDS..DECODED_IDS + 1_000 {
            assert!(tok.bpe.decode_bytes(&[id]).is_err(), "{id}");
        }
    }

    #[test]
    fn fingerprint_matches_the_published_rank_file() {
        // sha256 of o200k_base.tiktoken as published (and as shipped by tiktoken-rs).
        assert_eq!(
            Tokenizer::new().fingerprint(),
            "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
        );
    }
}
