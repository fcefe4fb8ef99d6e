//! The resident arena: every stored row's first-pass code, int8 vector and per-row facts, in
//! columns, grouped in pages that each belong to one user.
//!
//! Layout, chosen for the scan: a page holds [`PAGE_ROWS`] rows of ONE user, column by column
//! (`Page`, a `#[repr(C)]` Pod struct). A user's query walks only that user's pages (or, for a
//! group scope, the pages of the group's users), so a memory pooled over many users costs a
//! query only what its scope holds; inside a page the 1-bit codes sit in blocks of eight rows,
//! word-major, the layout the Hamming kernel reads with vertical operations only.
//!
//! The arena is a cache of the store: it can always be rebuilt from it. Before every scan it
//! catches up by reading only rows newer than its watermark ([`Arena::catch_up`]), keeping a
//! resident copy of the shared frequency statistic in step (each caught-up retrieval row is
//! counted in), so the statistic never has to be reloaded. Vectors are embedded under the
//! statistic as it stands when the row is caught up; the first pass only narrows the field,
//! and the exact rescore re-embeds its candidates under the current statistic.
//!
//! Pages live in memory for now; the memory-mapped file form follows the same `Page` layout.
//! Purging while serving is not wired yet: `perpetuity purge` runs on a closed store, and the
//! next process rebuilds its arena from the store.

use std::collections::HashMap;

use bytemuck::{Pod, Zeroable};

use crate::dictionary::Dictionary;
use crate::dictionary::derive::{RetrievalRow, embed};
use crate::dictionary::stats::FrequencyTable;
use crate::scan::kernels::{BLOCK_ROWS, code_words};
use crate::store::{Row, Store, StoreError};
use crate::types::{ConversationId, RowId, TermId, UserId};

/// Rows per page: eight blocks of eight rows.
pub const PAGE_ROWS: usize = 64;
/// Dense dimensions the page layout is built for.
pub const DIMS: usize = 256;
const WORDS: usize = DIMS / 64;

/// One page: up to [`PAGE_ROWS`] rows of one user, column by column. 22,848 bytes.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct Page {
    pub user: u64,
    pub rows: u32,
    pub reserved: [u32; 13],
    pub row_ids: [u64; PAGE_ROWS],
    pub conversations: [u64; PAGE_ROWS],
    pub birth_clocks: [u64; PAGE_ROWS],
    pub decays: [f32; PAGE_ROWS],
    pub token_lens: [u32; PAGE_ROWS],
    /// int8 vector scale per row.
    pub scales: [f32; PAGE_ROWS],
    /// 1-bit codes, blocked: word `w` of row `r` at `(r / 8 · WORDS + w) · 8 + r % 8`.
    pub codes: [u64; PAGE_ROWS * WORDS],
    /// Lexical signatures, blocked like `codes`: bit [`signature_bit`] of each of the row's
    /// terms is set, so the first pass can estimate which query terms a row holds.
    pub signatures: [u64; PAGE_ROWS * WORDS],
    /// int8 vectors, row-major.
    pub vectors: [i8; PAGE_ROWS * DIMS],
}

const _: () = assert!(std::mem::size_of::<Page>() == 22_848);

/// Bits in a row's lexical signature.
pub const SIGNATURE_BITS: usize = WORDS * 64;

/// The signature bit of a term: the top byte of a multiplicative hash of its id.
pub fn signature_bit(term: TermId) -> usize {
    (term.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % SIGNATURE_BITS
}

/// Arena errors.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    /// Class: internal. Reading the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Class: corruption. A logged row has no retrieval row.
    #[error("row {row} of user {user:016x} has no retrieval row")]
    MissingRetrieval { user: u64, row: u64 },
    /// Class: configuration. The dictionary's dimensions differ from the page layout's.
    #[error("dictionary has {found} dimensions; the arena layout holds {DIMS}")]
    Dimensions { found: usize },
}

/// A row's distinct lexical terms with counts, and their total.
#[derive(Debug, Clone, Default)]
pub struct RowTerms {
    pub terms: Box<[(TermId, u32)]>,
    pub len: u64,
}

/// Where a row lives in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub page: u32,
    pub index: u32,
}

impl Slot {
    /// No row.
    pub const NONE: Slot = Slot {
        page: u32::MAX,
        index: u32::MAX,
    };
}

/// The resident arena.
#[derive(Default)]
pub struct Arena {
    pages: Vec<Page>,
    by_user: HashMap<UserId, Vec<u32>>,
    /// Slot of each row, indexed by row id (row ids are dense; purged ids hold `Slot::NONE`).
    slots: Vec<Slot>,
    /// Each row's lexical terms and term length, by page and index, for the exact lexical
    /// score of the int8 stage.
    terms: Vec<Vec<RowTerms>>,
    /// Every row id below this has been caught up (or never existed).
    watermark: RowId,
    stats: FrequencyTable,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("pages", &self.pages.len())
            .field("users", &self.by_user.len())
            .field("watermark", &self.watermark)
            .finish()
    }
}

impl Arena {
    /// An empty arena (watermark 0: the first catch-up reads everything).
    pub fn new() -> Self {
        Self::default()
    }

    /// Every row id below the watermark has been read from the store.
    pub fn watermark(&self) -> RowId {
        self.watermark
    }

    /// The resident shared frequency statistic (a recount of every caught-up row).
    pub fn stats(&self) -> &FrequencyTable {
        &self.stats
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.pages.iter().map(|p| p.rows as usize).sum()
    }

    /// Bytes per row of the resident layout.
    pub fn bytes_per_row() -> usize {
        std::mem::size_of::<Page>() / PAGE_ROWS
    }

    /// Read every row newer than the watermark from the store, count its retrieval row into
    /// the resident statistic, embed it and append it to its user's last page. Returns the
    /// number of rows read. Row ids are committed in increasing order (the store's write
    /// mutex), so after reading row `n` no row below `n` can appear later.
    pub fn catch_up(
        &mut self,
        store: &Store,
        dictionary: &Dictionary,
    ) -> Result<usize, ArenaError> {
        if dictionary.dims() != DIMS {
            return Err(ArenaError::Dimensions {
                found: dictionary.dims(),
            });
        }
        let mut fresh: Vec<(Row, RetrievalRow)> = Vec::new();
        for row in store.rows_since(self.watermark) {
            let row = row?;
            let retrieval =
                store
                    .retrieval(row.user, row.id)?
                    .ok_or(ArenaError::MissingRetrieval {
                        user: row.user.0,
                        row: row.id.0,
                    })?;
            self.stats.add(&retrieval);
            fresh.push((row, retrieval));
        }
        for (row, retrieval) in &fresh {
            self.append(dictionary, row, retrieval);
            self.watermark = RowId(row.id.0 + 1);
        }
        Ok(fresh.len())
    }

    fn append(&mut self, dictionary: &Dictionary, row: &Row, retrieval: &RetrievalRow) {
        let pages = self.by_user.entry(row.user).or_default();
        let page_index = match pages.last() {
            Some(&p) if (self.pages[p as usize].rows as usize) < PAGE_ROWS => p,
            _ => {
                let mut page = Page::zeroed();
                page.user = row.user.0;
                self.pages.push(page);
                self.terms.push(Vec::with_capacity(PAGE_ROWS));
                let p = (self.pages.len() - 1) as u32;
                pages.push(p);
                p
            }
        };
        let page = &mut self.pages[page_index as usize];
        let i = page.rows as usize;
        let embedding = embed(dictionary, &self.stats, retrieval);
        let quantized = embedding.quantize();
        page.row_ids[i] = row.id.0;
        page.conversations[i] = ConversationId::from_key(&row.conversation).0;
        page.birth_clocks[i] = row.birth_clock;
        page.decays[i] = row.decay;
        page.token_lens[i] = row.tokens.len() as u32;
        page.scales[i] = quantized.scale;
        for (w, bits) in embedding.sign_bits().into_iter().enumerate() {
            page.codes[(i / BLOCK_ROWS * WORDS + w) * BLOCK_ROWS + i % BLOCK_ROWS] = bits;
        }
        for &(term, _) in &retrieval.terms {
            let bit = signature_bit(term);
            page.signatures[(i / BLOCK_ROWS * WORDS + bit / 64) * BLOCK_ROWS + i % BLOCK_ROWS] |=
                1 << (bit % 64);
        }
        page.vectors[i * DIMS..(i + 1) * DIMS].copy_from_slice(&quantized.values);
        page.rows += 1;
        self.terms[page_index as usize].push(RowTerms {
            terms: retrieval.terms.clone().into_boxed_slice(),
            len: retrieval.term_len(),
        });
        let id = row.id.0 as usize;
        if self.slots.len() <= id {
            self.slots.resize(id + 1, Slot::NONE);
        }
        self.slots[id] = Slot {
            page: page_index,
            index: i as u32,
        };
    }

    /// Where row `id` lives, if the arena holds it.
    pub fn slot(&self, id: RowId) -> Option<Slot> {
        self.slots
            .get(id.0 as usize)
            .copied()
            .filter(|s| *s != Slot::NONE)
    }

    /// The lexical terms of the row in `slot`.
    pub fn row_terms(&self, slot: Slot) -> &RowTerms {
        &self.terms[slot.page as usize][slot.index as usize]
    }

    /// The page at `index`.
    pub fn page(&self, index: u32) -> &Page {
        &self.pages[index as usize]
    }

    /// The pages a scope may read: the tenant predicate, in one place. A user's scope is their
    /// own pages; a group scope is the union of its members' pages. No other user's row is ever
    /// handed to a scorer.
    pub fn scope_pages(&self, scope: &[UserId]) -> Vec<&Page> {
        let mut users = scope.to_vec();
        users.sort_unstable();
        users.dedup();
        users
            .iter()
            .filter_map(|u| self.by_user.get(u))
            .flatten()
            .map(|&p| &self.pages[p as usize])
            .collect()
    }
}

impl Page {
    /// The 1-bit codes of the page's first `blocks` blocks.
    pub fn codes_of_blocks(&self, blocks: usize) -> &[u64] {
        &self.codes[..blocks * BLOCK_ROWS * code_words(DIMS)]
    }

    /// Blocks holding at least one row.
    pub fn blocks(&self) -> usize {
        (self.rows as usize).div_ceil(BLOCK_ROWS)
    }

    /// Word `word` of row `i`'s lexical signature.
    #[inline]
    pub fn signature_word(&self, i: usize, word: usize) -> u64 {
        self.signatures[(i / BLOCK_ROWS * WORDS + word) * BLOCK_ROWS + i % BLOCK_ROWS]
    }

    /// The lexical signatures of the page's first `blocks` blocks.
    pub fn signatures_of_blocks(&self, blocks: usize) -> &[u64] {
        &self.signatures[..blocks * BLOCK_ROWS * WORDS]
    }

    /// The int8 vector of row `i`.
    pub fn vector(&self, i: usize) -> &[i8] {
        &self.vectors[i * DIMS..(i + 1) * DIMS]
    }
}
