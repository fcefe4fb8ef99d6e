//! The one tokenizer: o200k_base through `tiktoken-rs`, embedded in the binary and offline.
//!
//! Every stored row keeps its token ids under this tokenizer; the same tokens advance the
//! agent's clock and count the frame budget, and retrieval representations derive from them.

use std::sync::OnceLock;

use base64::Engine as _;
use sha2::{Digest, Sha256};
use tiktoken_rs::CoreBPE;

use crate::types::TokenId;

/// The tokenizer's name as recorded in dictionary headers.
pub const TOKENIZER_NAME: &str = "o200k_base";

/// Number of ordinary (mergeable) ranks in o200k_base; ids at or above it are special tokens.
pub const VOCAB_SIZE: u32 = 199_998;

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
    pub fn encode(&self, text: &str) -> Vec<TokenId> {
        self.bpe
            .encode_ordinary(text)
            .into_iter()
            .map(TokenId)
            .collect()
    }

    /// The bytes that a run of tokens stands for. Ids outside the vocabulary decode to nothing;
    /// a run cut in the middle of a UTF-8 sequence yields its partial bytes.
    pub fn decode_bytes(&self, tokens: &[TokenId]) -> Vec<u8> {
        let mut out = Vec::with_capacity(tokens.len() * 4);
        for token in tokens {
            if let Ok(bytes) = self.bpe.decode_bytes(&[token.0]) {
                out.extend_from_slice(&bytes);
            }
        }
        out
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
                let bytes = self.decode_bytes(&[TokenId(rank)]);
                hasher.update(engine.encode(&bytes).as_bytes());
                hasher.update(format!(" {rank}\n").as_bytes());
            }
            hex(&hasher.finalize())
        })
    }
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

    #[test]
    fn fingerprint_matches_the_published_rank_file() {
        // sha256 of o200k_base.tiktoken as published (and as shipped by tiktoken-rs).
        assert_eq!(
            Tokenizer::new().fingerprint(),
            "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
        );
    }
}
