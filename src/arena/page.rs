//! The page: up to [`PAGE_ROWS`] rows of one user, column by column, as it lies in memory and
//! in `pages.bin`.

use bytemuck::{Pod, Zeroable};

use crate::scan::kernels::{BLOCK_ROWS, LUT_ROWS, code_offset, prefetch_l2};

/// Rows per page: eight blocks of eight rows.
pub const PAGE_ROWS: usize = 64;
/// Dense dimensions the page layout is built for.
pub const DIMS: usize = 256;
/// Words per row of a one-bit-per-dimension column (the codes' sign and magnitude bits, the
/// lexical signature).
pub const WORDS: usize = DIMS / 64;
/// Bytes per row of the 2-bit code: a nibble per pair of dimensions.
pub const CODE_BYTES: usize = DIMS / 4;

/// One row's 2-bit code under a codebook ([`super::codebook::Codebook::encode`]): its sign and
/// magnitude bits and its scale α.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowCode {
    pub signs: [u64; WORDS],
    pub magnitudes: [u64; WORDS],
    pub alpha: f32,
}

const _: () = assert!(
    PAGE_ROWS == LUT_ROWS,
    "a page is one group of the 2-bit kernel"
);

/// One page: up to [`PAGE_ROWS`] rows of one user, column by column. 20,096 bytes. The
/// columns stage one reads lie in the page's [`Sketch`], kept apart so that a scope's sketches
/// lie end to end.
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
    /// The checksum of the codebook the page's 2-bit codes (in its sketch) were encoded
    /// under: a commit stopped while the codebook was recomputed leaves pages coded under one
    /// the header does not name, and the next open codes them again under the committed one.
    pub codebook: u32,
    /// CRC-32 of the page's sketch: the page's checksum covers it, so a sealed page vouches
    /// for its sketch.
    pub sketch: u32,
    pub reserved: [u32; 10],
    /// Each row's role code ([`crate::types::Role`]): with its conversation, the speaker slot
    /// whose bound name recall matches against the question, without reading the row.
    pub roles: [u8; PAGE_ROWS],
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
    /// int8 vectors, row-major.
    pub vectors: [i8; PAGE_ROWS * DIMS],
}

const _: () = assert!(std::mem::size_of::<Page>() == 20_096);
const _: () = assert!(std::mem::size_of::<Page>().is_multiple_of(64));

/// What stage one reads of a page's rows, in `sketches.bin` at the page's index: 6,464 bytes.
/// A scope's pages are mostly consecutive in the file (a user's rows fill one page after
/// another), and so are their sketches: stage one reads one stream instead of 7 KiB of every
/// 26 KiB, which loads about 1.5 times as fast (`docs/journal/benchmarks.md`). `rows` and
/// `term_lens` repeat the page's, `first_row` its first row id; the codes, their scales and
/// the signatures are only here. Slots at and past `rows` are zero, as in the page.
///
/// Every column is one stage one reads: a hit names its row by its slot
/// ([`super::Slot::key`]), so the page's row ids are not repeated here. Held between the
/// term lengths and the codes, they were streamed in with them though never read: without
/// them the one-scope query at a million rows was lower in seven of eight alternated rounds;
/// with its scales and term lengths in two bytes each, in six of eight more
/// (`docs/journal/benchmarks.md`, "The sketch without its row ids").
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct Sketch {
    pub rows: u32,
    pub reserved: [u32; 13],
    /// The page's first row id (0 while the page holds no row): with `rows`, what names the
    /// page whose sketch this is ([`super::open`] checks both).
    pub first_row: u64,
    /// Each row's 2-bit code scale α ([`super::codebook::Codebook::encode`]) as a bfloat16:
    /// the upper half of its `f32`, rounded to the nearest ([`Sketch::alpha`]).
    pub alphas: [u16; PAGE_ROWS],
    /// The page's `term_lens`, at most `u16::MAX` ([`Sketch::term_len`]).
    pub term_lens: [u16; PAGE_ROWS],
    /// The 2-bit codes in chunks of four bytes: byte `b` of row `r` at
    /// [`code_offset`]`(r, b)` = `(⌊b/4⌋ · PAGE_ROWS + r) · 4 + b mod 4` ([`code_byte`]).
    pub codes: [u8; PAGE_ROWS * CODE_BYTES],
    /// Lexical signatures, blocked: word `w` of row `r` at `(r / 8 · WORDS + w) · 8 + r % 8`.
    /// The bits of each of the row's terms are set ([`super::signature::term_bits`]), so the
    /// first pass can estimate which query terms a row holds.
    pub signatures: [u64; PAGE_ROWS * WORDS],
}

const _: () = assert!(std::mem::size_of::<Sketch>() == 6_464);
const _: () = assert!(std::mem::size_of::<Sketch>().is_multiple_of(64));

/// Bytes of a sketch for each of its rows, its header aside: what stage one reads of a row
/// (its code, signature, scale and term length; 100).
pub const SKETCH_ROW_BYTES: usize =
    (std::mem::size_of::<Sketch>() - std::mem::offset_of!(Sketch, alphas)) / PAGE_ROWS;

const _: () = assert!(
    SKETCH_ROW_BYTES == CODE_BYTES + SIGNATURE_BITS / 8 + 4,
    "a sketch holds, for each row, its code, signature and two bytes each of scale and length"
);

/// The bfloat16 nearest `x` (ties to even): the upper 16 bits of its `f32` after rounding. A
/// scale α is finite and non-negative, far below where rounding could carry it to infinity.
pub fn bfloat16(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7FFF + (bits >> 16 & 1));
    (rounded >> 16) as u16
}

/// The `f32` a bfloat16 holds ([`bfloat16`]'s result widened back): a shift, which a loop over
/// a page's rows vectorises.
fn from_bfloat16(x: u16) -> f32 {
    f32::from_bits(u32::from(x) << 16)
}

/// Bits in a row's lexical signature.
pub const SIGNATURE_BITS: usize = WORDS * 64;

/// The code byte of dimensions `4b .. 4b + 4` of a row whose 2-bit code has sign bits `signs`
/// and magnitude bits `magnitudes`: pair `2b` (dimensions `4b`, `4b + 1`) in the low nibble,
/// pair `2b + 1` in the high one; a pair's nibble holds, from its lowest bit, the sign and
/// magnitude bit of its first dimension, then those of its second.
pub fn code_byte(signs: &[u64; WORDS], magnitudes: &[u64; WORDS], b: usize) -> u8 {
    let bit = |column: &[u64; WORDS], d: usize| (column[d / 64] >> (d % 64) & 1) as u8;
    (0..4)
        .map(|k| {
            let d = 4 * b + k;
            (bit(signs, d) | bit(magnitudes, d) << 1) << (2 * k)
        })
        .fold(0, |byte, part| byte | part)
}

/// Index of word `word` of row `i` in a blocked column.
#[inline]
pub fn blocked(i: usize, word: usize) -> usize {
    (i / BLOCK_ROWS * WORDS + word) * BLOCK_ROWS + i % BLOCK_ROWS
}

impl Page {
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
        self.roles[tail.clone()].fill(0);
        self.row_ids[tail.clone()].fill(0);
        self.conversations[tail.clone()].fill(0);
        self.birth_clocks[tail.clone()].fill(0);
        self.term_offsets[tail.clone()].fill(0);
        self.decays[tail.clone()].fill(0.0);
        self.token_lens[tail.clone()].fill(0);
        self.scales[tail.clone()].fill(0.0);
        self.term_lens[tail.clone()].fill(0);
        self.term_counts[tail.clone()].fill(0);
        self.token_counts[tail].fill(0);
        self.vectors[from * DIMS..].fill(0);
        self.rows = from as u32;
    }
}

/// A row's 2-bit code as a sketch holds it: its code bytes in order ([`code_byte`]) and its
/// scale α. Computed apart from placing it, so that a batch of rows is coded in parallel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CodeBytes {
    pub bytes: [u8; CODE_BYTES],
    pub alpha: f32,
}

impl From<&RowCode> for CodeBytes {
    fn from(code: &RowCode) -> Self {
        Self {
            bytes: std::array::from_fn(|b| code_byte(&code.signs, &code.magnitudes, b)),
            alpha: code.alpha,
        }
    }
}

impl Sketch {
    /// Write row `i`: its id, term length, 2-bit code and the signature of its lexical terms
    /// ([`super::signature::signature`]).
    pub fn set_row(
        &mut self,
        i: usize,
        id: u64,
        term_len: u32,
        code: &CodeBytes,
        signature: &[u64; WORDS],
    ) {
        if i == 0 {
            self.first_row = id;
        }
        self.term_lens[i] = term_len.min(u32::from(u16::MAX)) as u16;
        self.place_code(i, code);
        for (w, &word) in signature.iter().enumerate() {
            self.signatures[blocked(i, w)] = word;
        }
    }

    /// Whether row `i` holds the same columns in both sketches.
    pub fn same_row(&self, other: &Sketch, i: usize) -> bool {
        (i != 0 || self.first_row == other.first_row)
            && self.term_lens[i] == other.term_lens[i]
            && self.alphas[i] == other.alphas[i]
            && self.code_bytes(i) == other.code_bytes(i)
            && (0..WORDS).all(|w| self.signature_word(i, w) == other.signature_word(i, w))
    }

    /// Write row `i`'s 2-bit code.
    pub fn set_code(&mut self, i: usize, code: &RowCode) {
        self.place_code(i, &CodeBytes::from(code));
    }

    /// Write row `i`'s code bytes where the layout puts them, and its scale.
    fn place_code(&mut self, i: usize, code: &CodeBytes) {
        for (b, &byte) in code.bytes.iter().enumerate() {
            self.codes[code_offset(i, b)] = byte;
        }
        self.alphas[i] = bfloat16(code.alpha);
    }

    /// Row `i`'s scale α, as stage one reads it.
    #[inline]
    pub fn alpha(&self, i: usize) -> f32 {
        from_bfloat16(self.alphas[i])
    }

    /// Row `i`'s term length, as stage one reads it (the page's, at most `u16::MAX`).
    #[inline]
    pub fn term_len(&self, i: usize) -> u32 {
        u32::from(self.term_lens[i])
    }

    /// Row `i`'s code bytes, in order.
    pub fn code_bytes(&self, i: usize) -> [u8; CODE_BYTES] {
        std::array::from_fn(|b| self.codes[code_offset(i, b)])
    }

    /// Start loading into the second-level cache ([`prefetch_l2`]) the columns stage one reads
    /// besides the codes (which its kernel loads ahead itself,
    /// [`crate::scan::kernels::Lookahead`]), part `part` of two: the signatures (0), the scales
    /// α and term lengths (1). Issued a part at a time between the kernels of a sketch before,
    /// the loads overlap with its arithmetic instead of queueing all at once; loaded into the
    /// first level, they queued with the codes' loads (`docs/journal/benchmarks.md`, "Stage
    /// one's other columns loaded ahead into the second-level cache").
    pub fn prefetch_first_pass(&self, part: usize) {
        let lines = |bytes: &[u8]| {
            for line in bytes.chunks(64) {
                prefetch_l2(line.as_ptr());
            }
        };
        if part == 0 {
            lines(bytemuck::cast_slice(&self.signatures));
        } else {
            lines(bytemuck::cast_slice(&self.alphas));
            lines(bytemuck::cast_slice(&self.term_lens));
        }
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

    /// The lexical signatures of the sketch's first `blocks` blocks.
    pub fn signatures_of_blocks(&self, blocks: usize) -> &[u64] {
        &self.signatures[..blocks * BLOCK_ROWS * WORDS]
    }

    /// Zero every slot from row `from` on and set `rows` to `from` ([`Page::truncate`]).
    pub fn truncate(&mut self, from: usize) {
        let tail = from..PAGE_ROWS;
        self.alphas[tail.clone()].fill(0);
        self.term_lens[tail.clone()].fill(0);
        if from == 0 {
            self.first_row = 0;
        }
        for i in tail {
            for w in 0..WORDS {
                self.signatures[blocked(i, w)] = 0;
            }
            for b in 0..CODE_BYTES {
                self.codes[code_offset(i, b)] = 0;
            }
        }
        self.rows = from as u32;
    }

    /// CRC-32 of the sketch: what its page's `sketch` field holds once sealed.
    pub fn checksum(&self) -> u32 {
        crc32fast::hash(bytemuck::bytes_of(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bfloat16_rounds_to_the_nearest_ties_to_even() {
        assert_eq!(bfloat16(0.0), 0);
        assert_eq!(bfloat16(1.0), 0x3F80);
        assert_eq!(bfloat16(0.5), 0x3F00);
        // Seven stored bits of mantissa: the next bfloat16 after 1 is 1 + 2^-7.
        let step = 2f32.powi(-7);
        assert_eq!(
            from_bfloat16(bfloat16(1.0 + step / 2.0)),
            1.0,
            "a tie goes to the even one"
        );
        assert_eq!(
            from_bfloat16(bfloat16(1.0 + 1.5 * step)),
            1.0 + 2.0 * step,
            "a tie goes to the even one"
        );
        assert_eq!(from_bfloat16(bfloat16(1.0 + 0.6 * step)), 1.0 + step);
        assert_eq!(from_bfloat16(bfloat16(1.0 + 0.4 * step)), 1.0);
    }

    proptest! {
        #[test]
        fn bfloat16_is_the_nearest(x in 0f32..1e30) {
            let y = from_bfloat16(bfloat16(x));
            let below = from_bfloat16((x.to_bits() >> 16) as u16);
            let above = f32::from_bits(below.to_bits() + (1 << 16));
            prop_assert!(y == below || y == above);
            prop_assert!((y - x).abs() <= (x - below).abs().min((above - x).abs()));
        }
    }
}
