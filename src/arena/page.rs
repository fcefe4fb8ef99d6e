//! The page: up to [`PAGE_ROWS`] rows of one user, column by column, as it lies in memory and
//! in `pages.bin`.

use bytemuck::{Pod, Zeroable};

use super::codebook::RowCode;
use crate::scan::kernels::{BLOCK_ROWS, code_words};
use crate::types::TermId;

/// Rows per page: eight blocks of eight rows.
pub const PAGE_ROWS: usize = 64;
/// Dense dimensions the page layout is built for.
pub const DIMS: usize = 256;
/// Code words per row.
pub const WORDS: usize = DIMS / 64;

/// One page: up to [`PAGE_ROWS`] rows of one user, column by column. 26,432 bytes.
///
/// Slots at and past `rows` are zero: a page is zeroed when allocated and rows are only ever
/// appended, so a page's bytes are a function of its first `rows` rows (the checksum relies on
/// it).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct Page {
    pub user: u64,
    pub rows: u32,
    /// CRC-32 of the page with this field zero, followed by its rows' entries.
    pub checksum: u32,
    pub reserved: [u32; 12],
    pub row_ids: [u64; PAGE_ROWS],
    pub conversations: [u64; PAGE_ROWS],
    pub birth_clocks: [u64; PAGE_ROWS],
    /// Where each row's entries start in `terms.bin`, in entries: its terms, then its tokens.
    pub term_offsets: [u64; PAGE_ROWS],
    pub decays: [f32; PAGE_ROWS],
    pub token_lens: [u32; PAGE_ROWS],
    /// int8 vector scale per row.
    pub scales: [f32; PAGE_ROWS],
    /// Each row's length in lexical terms (BM25's row length).
    pub term_lens: [u32; PAGE_ROWS],
    /// Each row's number of distinct terms (entries in `terms.bin`).
    pub term_counts: [u32; PAGE_ROWS],
    /// Each row's number of distinct tokens (entries in `terms.bin`, after its terms): what
    /// the exact rescore embeds.
    pub token_counts: [u32; PAGE_ROWS],
    /// Each row's 2-bit code scale α ([`super::codebook::Codebook::encode`]).
    pub alphas: [f32; PAGE_ROWS],
    /// Sign bits of the 2-bit codes, blocked: word `w` of row `r` at
    /// `(r / 8 · WORDS + w) · 8 + r % 8`.
    pub signs: [u64; PAGE_ROWS * WORDS],
    /// Magnitude bits of the 2-bit codes, blocked like `signs`.
    pub magnitudes: [u64; PAGE_ROWS * WORDS],
    /// Lexical signatures, blocked like `signs`: bit [`signature_bit`] of each of the row's
    /// terms is set, so the first pass can estimate which query terms a row holds.
    pub signatures: [u64; PAGE_ROWS * WORDS],
    /// int8 vectors, row-major.
    pub vectors: [i8; PAGE_ROWS * DIMS],
}

const _: () = assert!(std::mem::size_of::<Page>() == 26_432);
const _: () = assert!(std::mem::size_of::<Page>().is_multiple_of(64));

/// Bits in a row's lexical signature.
pub const SIGNATURE_BITS: usize = WORDS * 64;

/// The signature bit of a term: the top byte of a multiplicative hash of its id.
pub fn signature_bit(term: TermId) -> usize {
    (term.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % SIGNATURE_BITS
}

/// Index of word `word` of row `i` in a blocked column.
#[inline]
pub fn blocked(i: usize, word: usize) -> usize {
    (i / BLOCK_ROWS * WORDS + word) * BLOCK_ROWS + i % BLOCK_ROWS
}

impl Page {
    /// The sign bits of the page's first `blocks` blocks.
    pub fn signs_of_blocks(&self, blocks: usize) -> &[u64] {
        &self.signs[..blocks * BLOCK_ROWS * code_words(DIMS)]
    }

    /// The magnitude bits of the page's first `blocks` blocks.
    pub fn magnitudes_of_blocks(&self, blocks: usize) -> &[u64] {
        &self.magnitudes[..blocks * BLOCK_ROWS * code_words(DIMS)]
    }

    /// Write row `i`'s 2-bit code.
    pub fn set_code(&mut self, i: usize, code: &RowCode) {
        for w in 0..WORDS {
            self.signs[blocked(i, w)] = code.signs[w];
            self.magnitudes[blocked(i, w)] = code.magnitudes[w];
        }
        self.alphas[i] = code.alpha;
    }

    /// Blocks holding at least one row.
    pub fn blocks(&self) -> usize {
        (self.rows as usize).div_ceil(BLOCK_ROWS)
    }

    /// Word `word` of row `i`'s lexical signature.
    #[inline]
    pub fn signature_word(&self, i: usize, word: usize) -> u64 {
        self.signatures[blocked(i, word)]
    }

    /// The lexical signatures of the page's first `blocks` blocks.
    pub fn signatures_of_blocks(&self, blocks: usize) -> &[u64] {
        &self.signatures[..blocks * BLOCK_ROWS * WORDS]
    }

    /// Entries of row `i` in `terms.bin`: its terms, then its tokens.
    pub fn entries_of(&self, i: usize) -> usize {
        self.term_counts[i] as usize + self.token_counts[i] as usize
    }

    /// The int8 vector of row `i`.
    pub fn vector(&self, i: usize) -> &[i8] {
        &self.vectors[i * DIMS..(i + 1) * DIMS]
    }

    /// Zero every slot from row `from` on and set `rows` to `from`: the page as it was when it
    /// held `from` rows.
    pub fn truncate(&mut self, from: usize) {
        let tail = from..PAGE_ROWS;
        self.row_ids[tail.clone()].fill(0);
        self.conversations[tail.clone()].fill(0);
        self.birth_clocks[tail.clone()].fill(0);
        self.term_offsets[tail.clone()].fill(0);
        self.decays[tail.clone()].fill(0.0);
        self.token_lens[tail.clone()].fill(0);
        self.scales[tail.clone()].fill(0.0);
        self.alphas[tail.clone()].fill(0.0);
        self.term_lens[tail.clone()].fill(0);
        self.term_counts[tail.clone()].fill(0);
        self.token_counts[tail.clone()].fill(0);
        for i in tail {
            for w in 0..WORDS {
                self.signs[blocked(i, w)] = 0;
                self.magnitudes[blocked(i, w)] = 0;
                self.signatures[blocked(i, w)] = 0;
            }
            self.vectors[i * DIMS..(i + 1) * DIMS].fill(0);
        }
        self.rows = from as u32;
    }
}
