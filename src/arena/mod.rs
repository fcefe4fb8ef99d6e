//! The arena: every stored row's first-pass code, int8 vector, lexical terms and per-row facts,
//! in columns, grouped in pages that each belong to one user, memory-mapped from the data
//! directory.
//!
//! Layout, chosen for the scan: a page holds [`PAGE_ROWS`] rows of ONE user, column by column
//! ([`Page`], a `#[repr(C)]` Pod struct), and what stage one reads of them lies apart in the
//! page's [`Sketch`] (2-bit codes in chunks of four bytes, lexical signatures, code scales, term lengths,
//! row ids). A user's query walks only that user's pages (or, for a group scope, the pages of
//! the group's users), so a memory pooled over many users costs a query only what its scope
//! holds; a user's pages mostly follow each other in the file, and so do their sketches, so
//! stage one over a large scope reads one stream. The codes are encoded under the arena's
//! [`Codebook`], computed from the rows themselves and again whenever they have grown
//! fourfold.
//!
//! Files (`docs/format.md` has the grammar): `<data>/arena/<dictionary version>/pages.bin`, a
//! header that is the commit record, the codebook, then pages; `sketches.bin`, the sketch of
//! each page at the same index; and `terms.bin`, each row's distinct terms with counts for
//! the exact lexical score. Appends write the new rows first (a batch's entries by `pwrite`,
//! its columns into the mappings) and the header last, so a process killed at any point leaves
//! a header that counts only whole rows; what it does not count is cut away when the files are
//! opened again. Every page carries a checksum over itself (its sketch's checksum included)
//! and its rows' terms; a file that fails any check (magic, version, checksums, dictionary, a
//! purge since, a watermark ahead of the store) is reported and rebuilt from the store, never
//! served.
//!
//! The arena is a cache of the store: it can always be rebuilt from it. Before every scan it
//! catches up by reading only rows newer than its watermark ([`Arena::catch_up`]), keeping a
//! resident copy of the shared frequency statistic in step, so the statistic never has to be
//! reloaded. Vectors are embedded under the statistic as it stands when the row is caught up;
//! the first pass only narrows the field, and the exact rescore re-embeds its candidates under
//! the current statistic.
//!
//! A purge bumps the store's purge count and empties the purged users' pages where they lie
//! (`purge.rs`, called by `Engine::purge` with writes held back), recording the new count; an
//! arena that missed a purge (one killed before the arena's commit) sees the count differ when
//! opened, and rebuilds.

mod catch_up;
pub mod codebook;
pub mod file;
mod open;
pub mod page;
mod purge;
pub mod signature;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use bytemuck::Zeroable;
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::dictionary::derive::{Embedding, Quantized, RetrievalRow, embed_tokens};
use crate::dictionary::stats::FrequencyStats;
use crate::dictionary::stats::FrequencyTable;
use crate::dictionary::{BadVersion, Dictionary, check_version};
use crate::scan::kernels::prefetch;
use crate::store::{Cf, Row, Store, StoreError};
use crate::types::{ConversationId, RowId, TokenId, UserId};
use codebook::Codebook;
use file::{
    Entry, FORMAT_VERSION, FileHeader, MappedFile, PAGES_OFFSET, PagesHeader, SKETCH_BYTES,
    SKETCHES_MAGIC, SKETCHES_OFFSET, SLOTS, TERMS_HEADER_BYTES, TERMS_MAGIC, codebook_range,
    read_header, write_header,
};
pub use page::{
    CODE_BYTES, CodeBytes, DIMS, PAGE_ROWS, Page, SIGNATURE_BITS, SKETCH_ROW_BYTES, Sketch, WORDS,
    bfloat16, blocked, code_byte,
};

const PAGE_BYTES: usize = std::mem::size_of::<Page>();
/// Rows of its user a walk to a row's conversation neighbour ([`Arena::neighbour`]) passes over
/// at most: a conversation's turns lie next to each other in its user's rows unless the user
/// holds several conversations at once, and this bounds what interleaving can cost.
pub const NEIGHBOUR_WALK_ROWS: usize = 64;
/// Rows a catch-up reads, embeds and commits at a time: its memory stays bounded however far
/// behind the arena is, and a rebuild interrupted midway resumes from its last batch.
const CATCH_UP_BATCH_ROWS: usize = 65_536;
/// Rows of one user a catch-up task reads by one range scan: small enough that one user's
/// batch still spreads over the pool.
const CATCH_UP_SPAN_ROWS: usize = 4_096;
/// Below this many rows a catch-up batch is read and embedded on the calling thread: handing
/// work to the rayon pool from outside it and waiting for it costs more than a few rows' work,
/// and a request's catch-up holds its question and the last reply (`docs/journal/benchmarks.md`,
/// "Captures on the request's path").
const CATCH_UP_PARALLEL_ROWS: usize = 64;
/// The codebook is computed again whenever the rows reach this many times the count it was
/// last computed over: every row is re-encoded then, so re-encoding costs O(1) per row
/// amortised, and no row is coded by a codebook computed over less than a quarter of today's
/// rows.
const CODEBOOK_GROWTH: u64 = 4;
const ENTRY_BYTES: usize = std::mem::size_of::<Entry>();
/// A token length no row has: [`Arena::token_len`]'s mark of a row id the arena does not hold.
const NOT_HELD: u32 = u32::MAX;

/// Arena errors.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    /// Class: internal. Reading the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Class: corruption. A logged row has no retrieval row.
    #[error("row {row} of user {user:016x} has no retrieval row")]
    MissingRetrieval { user: u64, row: u64 },
    /// Class: configuration. The dictionary has more dimensions than the page layout holds.
    #[error("dictionary has {found} dimensions; the arena layout holds at most {DIMS}")]
    Dimensions { found: usize },
    /// Class: client. A dictionary version that cannot name the arena's folder.
    #[error(transparent)]
    Version(#[from] BadVersion),
    /// Class: internal. An arena file could not be created, grown or removed.
    #[error("arena file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// Why the arena files found on disk were not used as they are. The arena is then rebuilt
/// from the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// Class: not an error. No arena was written yet for this dictionary version.
    #[error("no arena files yet")]
    Missing,
    /// Class: corruption.
    #[error("{file}: not an arena file (bad magic)")]
    Magic { file: &'static str },
    /// Class: configuration. Written by another layout version.
    #[error("{file}: layout version {found}, this build reads {FORMAT_VERSION}")]
    Version { file: &'static str, found: u32 },
    /// Class: corruption.
    #[error("pages.bin: header checksum mismatch")]
    HeaderChecksum,
    /// Class: corruption. The codebook fails its checksum or is not the one the header
    /// committed.
    #[error("pages.bin: codebook checksum mismatch")]
    CodebookChecksum,
    /// Class: configuration.
    #[error("pages.bin: page layout differs from this build's")]
    Layout,
    /// Class: configuration. Built under another dictionary.
    #[error("built for another dictionary")]
    Dictionary,
    /// Class: not an error. A user was purged since the arena was written.
    #[error("the store was purged since the arena was written")]
    Purged,
    /// Class: corruption. The arena claims rows the store never committed.
    #[error("watermark {watermark} is ahead of the store's next row {next}")]
    Ahead { watermark: u64, next: u64 },
    /// Class: corruption. A file is shorter than its header says.
    #[error("{file}: truncated ({bytes} bytes, header needs {needed})")]
    Truncated {
        file: &'static str,
        bytes: usize,
        needed: usize,
    },
    /// Class: corruption.
    #[error("page {page}: {what}")]
    Page { page: u64, what: &'static str },
    /// Class: corruption. The pages hold another number of rows than the header.
    #[error("pages hold {found} rows, the header {expected}")]
    RowCount { found: u64, expected: u64 },
}

impl Unusable {
    /// Whether the files were damaged (as opposed to absent, stale after a purge, or written
    /// for another layout or dictionary).
    pub fn is_damage(&self) -> bool {
        !matches!(
            self,
            Self::Missing | Self::Purged | Self::Version { .. } | Self::Layout | Self::Dictionary
        )
    }
}

/// How [`Arena::open`] found the files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// Mapped as they were, with this many rows.
    Mapped { rows: u64 },
    /// Not usable as they were: started empty, to be rebuilt by catch-up.
    Rebuilt { reason: Unusable },
}

/// A row's distinct lexical terms with counts (sorted by term id) and their total, and its
/// distinct tokens with counts: what the exact score reads.
#[derive(Debug, Clone, Copy)]
pub struct RowEntries<'a> {
    pub terms: &'a [Entry],
    pub len: u64,
    pub tokens: &'a [Entry],
}

impl RowEntries<'_> {
    /// The tokens as [`crate::dictionary::derive::embed_tokens`] reads them.
    pub fn token_counts(&self) -> impl Iterator<Item = (TokenId, u32)> + Clone + '_ {
        self.tokens.iter().map(Entry::token)
    }
}

/// A scope's sketches ([`Arena::scope_sketches`]): `sketches[i]` is the sketch of page
/// `pages[i]`.
pub struct ScopeSketches<'a> {
    pub pages: Vec<u32>,
    pub sketches: Vec<&'a Sketch>,
}

/// A direction in a user's rows: towards earlier or later rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Before,
    After,
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

    /// The slot as one number, `page · PAGE_ROWS + index`: ordered as the arena lays rows
    /// out (a user's rows lie in row id order, so within one user as their row ids are), and
    /// compact, so a radix sort of a scope's keys takes as few passes as its row ids would.
    pub fn key(self) -> u64 {
        u64::from(self.page) * PAGE_ROWS as u64 + u64::from(self.index)
    }

    /// The slot whose [`Slot::key`] is `key`.
    pub fn from_key(key: u64) -> Self {
        Self {
            page: (key / PAGE_ROWS as u64) as u32,
            index: (key % PAGE_ROWS as u64) as u32,
        }
    }
}

/// What a row's page and sketch hold that is computed from it alone, before it is placed: its
/// quantised vector, 2-bit code and lexical signature.
struct Sketched {
    quantized: Quantized,
    code: CodeBytes,
    signature: [u64; WORDS],
}

/// The arena.
pub struct Arena {
    pages: MappedFile,
    /// Page `p`'s sketch at index `p`.
    sketches: MappedFile,
    terms: MappedFile,
    /// The committed header, updated in memory during a catch-up and written at its end.
    header: PagesHeader,
    /// The codebook the rows' 2-bit codes were encoded with, written with the header.
    codebook: Codebook,
    by_user: HashMap<UserId, Vec<u32>>,
    /// Rows held of each user (what [`Arena::scope_rows`] sums without visiting a page).
    rows_by_user: HashMap<UserId, usize>,
    /// Slot of each row, indexed by row id (row ids are dense; purged ids hold `Slot::NONE`).
    slots: Vec<Slot>,
    /// Token length of each row, indexed by row id ([`NOT_HELD`] where `slots` holds
    /// `Slot::NONE`): recall sizes every warm row of a user from it, a few thousand reads a
    /// turn that in the pages would each be a cache miss 26 KiB away from the last.
    token_lens: Vec<u32>,
    stats: FrequencyTable,
    /// The resident statistic counts every stored row below this (and only those).
    counted_below: RowId,
    /// Pages written since the last commit, whose checksums are due.
    dirty: Vec<u32>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("file", &self.pages.path())
            .field("pages", &self.header.pages)
            .field("users", &self.by_user.len())
            .field("watermark", &self.header.watermark)
            .finish()
    }
}

/// The folder of the arena for dictionary `version` in data directory `data`; refused for a
/// version that cannot name a folder ([`check_version`]).
pub fn arena_dir(data: &Path, version: &str) -> Result<PathBuf, ArenaError> {
    Ok(data.join("arena").join(check_version(version)?))
}

/// Remove the arena of dictionary `version` (a retired version's, after a flip).
pub fn remove_version(data: &Path, version: &str) -> Result<(), ArenaError> {
    remove_dir(arena_dir(data, version)?)
}

fn remove_dir(dir: PathBuf) -> Result<(), ArenaError> {
    match std::fs::remove_dir_all(&dir) {
        Err(source) if source.kind() != io::ErrorKind::NotFound => {
            Err(ArenaError::Io { path: dir, source })
        }
        _ => Ok(()),
    }
}

/// A row's (or a query's) dense embedding as the arena holds it: the dictionary's embedding
/// of its tokens with counts, zero-padded to [`DIMS`] when the dictionary has fewer dimensions
/// (zeros change no dot product, cosine or norm, and code to nothing).
pub fn embed_row<I>(dictionary: &Dictionary, stats: &impl FrequencyStats, tokens: I) -> Embedding
where
    I: IntoIterator<Item = (TokenId, u32)>,
    I::IntoIter: Clone,
{
    let mut embedding = embed_tokens(dictionary, stats, tokens);
    embedding.unit.resize(DIMS, 0.0);
    embedding
}

/// The store's families of `dictionary`'s retrieval rows and counts: the dark ones while it is
/// the installed dark version, else the serving ones.
fn families(store: &Store, dictionary: &Dictionary) -> (Cf, Cf) {
    if store.is_dark(dictionary.version()) {
        (Cf::DarkRetrieval, Cf::DarkCounts)
    } else {
        (Cf::Retrieval, Cf::Counts)
    }
}

/// SHA-256 of a dictionary's manifest: what the arena's vectors were derived under.
fn dictionary_id(dictionary: &Dictionary) -> [u8; 32] {
    let manifest = serde_json::to_vec(dictionary.manifest()).expect("a manifest serialises");
    Sha256::digest(&manifest).into()
}

impl Arena {
    /// Every row id below the watermark has been read from the store.
    pub fn watermark(&self) -> RowId {
        RowId(self.header.watermark)
    }

    /// The resident shared frequency statistic (a recount of every caught-up row).
    pub fn stats(&self) -> &FrequencyTable {
        &self.stats
    }

    /// Rows held.
    /// Pages in use, emptied ones among them.
    pub fn page_count(&self) -> usize {
        self.header.pages as usize
    }

    pub fn rows(&self) -> usize {
        self.header.rows as usize
    }

    /// Bytes per row of the page layout, sketches included (the entries, 12 bytes per distinct
    /// term or token, come on top).
    pub fn bytes_per_row() -> usize {
        (PAGE_BYTES + SKETCH_BYTES) / PAGE_ROWS
    }

    /// Bytes the arena's committed pages, sketches and term entries occupy.
    pub fn bytes(&self) -> u64 {
        self.header.pages * (PAGE_BYTES + SKETCH_BYTES) as u64
            + self.header.terms * ENTRY_BYTES as u64
    }

    fn page_slice(&self) -> &[Page] {
        bytemuck::cast_slice(&self.pages.bytes()[PAGES_OFFSET..needed_pages(&self.header)])
    }

    fn sketch_slice(&self) -> &[Sketch] {
        bytemuck::cast_slice(&self.sketches.bytes()[SKETCHES_OFFSET..needed_sketches(&self.header)])
    }

    /// The codebook of the rows' 2-bit codes.
    pub fn codebook(&self) -> &Codebook {
        &self.codebook
    }

    fn entries(&self) -> &[Entry] {
        bytemuck::cast_slice(
            &self.terms.bytes()[TERMS_HEADER_BYTES..][..self.header.terms as usize * ENTRY_BYTES],
        )
    }

    /// Where row `id` lives, if the arena holds it.
    pub fn slot(&self, id: RowId) -> Option<Slot> {
        self.slots
            .get(id.0 as usize)
            .copied()
            .filter(|s| *s != Slot::NONE)
    }

    /// The token length of row `id`, if the arena holds it (the same as its page's
    /// `token_lens` entry, read from a dense array by row id).
    pub fn token_len(&self, id: RowId) -> Option<usize> {
        self.token_lens
            .get(id.0 as usize)
            .filter(|&&len| len != NOT_HELD)
            .map(|&len| len as usize)
    }

    /// The user row `id` belongs to, when that user is in `scope`: the tenant predicate for
    /// one row named by id (a memory tool's item, a retrieved row of a group scope), beside
    /// [`Arena::scope_pages`] for scans.
    pub fn owner_in(&self, id: RowId, scope: &[UserId]) -> Option<UserId> {
        let slot = self.slot(id)?;
        let user = UserId(self.page(slot.page).user);
        scope.contains(&user).then_some(user)
    }

    /// The nearest row of the same user and conversation as the row in `slot`, towards `side`
    /// in row id order (capture order), among the [`NEIGHBOUR_WALK_ROWS`] rows of the user on
    /// that side. Never a row of another user: the walk stays on the row's user's pages. Each
    /// page's stretch of conversation keys is searched in one pass, and the user's pages looked
    /// up once a walk: a row at a conversation's edge walks the whole bound, and a
    /// scope of many short conversations has many such rows (a search's context reads the
    /// neighbours of a thousand rows a recall).
    pub fn neighbour(&self, slot: Slot, side: Side) -> Option<Slot> {
        let (mut number, mut page) = (slot.page, self.page(slot.page));
        let conversation = page.conversations[slot.index as usize];
        let mut left = NEIGHBOUR_WALK_ROWS;
        // The rows of `page` the walk reads next: before `index` (Before) or from it (After).
        let mut index = match side {
            Side::Before => slot.index as usize,
            Side::After => slot.index as usize + 1,
        };
        // The user's pages and where the walk stands in them, looked up at its first page edge.
        let mut pages: Option<(&[u32], usize)> = None;
        loop {
            let rows = page.rows as usize;
            let found = match side {
                Side::Before => {
                    let from = index.saturating_sub(left);
                    left -= index - from;
                    page.conversations[from..index]
                        .iter()
                        .rposition(|&c| c == conversation)
                        .map(|i| from + i)
                }
                Side::After => {
                    let to = rows.min(index + left).max(index);
                    left -= to - index;
                    page.conversations[index..to]
                        .iter()
                        .position(|&c| c == conversation)
                        .map(|i| index + i)
                }
            };
            if let Some(found) = found {
                return Some(Slot {
                    page: number,
                    index: found as u32,
                });
            }
            if left == 0 {
                return None;
            }
            let (list, at) = match pages {
                Some(stand) => stand,
                None => {
                    let list = self.by_user.get(&UserId(page.user))?;
                    (list.as_slice(), list.binary_search(&number).ok()?)
                }
            };
            let at = match side {
                Side::Before => at.checked_sub(1)?,
                Side::After => at + 1,
            };
            number = *list.get(at)?;
            (page, pages) = (self.page(number), Some((list, at)));
            if page.rows == 0 {
                return None;
            }
            index = match side {
                Side::Before => page.rows as usize,
                Side::After => 0,
            };
        }
    }

    /// The lexical terms and tokens of the row in `slot`.
    pub fn row_entries(&self, slot: Slot) -> RowEntries<'_> {
        let page = self.page(slot.page);
        let i = slot.index as usize;
        let start = page.term_offsets[i] as usize;
        let (terms, tokens) = self.entries()[start..start + page.entries_of(i)]
            .split_at(page.term_counts[i] as usize);
        RowEntries {
            terms,
            len: u64::from(page.term_lens[i]),
            tokens,
        }
    }

    /// Start loading the int8 vector and scale of the row in `slot` (what stage two's first
    /// step reads of it).
    pub fn prefetch_vector(&self, slot: Slot) {
        let page = self.page(slot.page);
        let i = slot.index as usize;
        let vector = page.vector(i);
        for line in (0..vector.len()).step_by(64) {
            prefetch(&vector[line]);
        }
        prefetch(&page.scales[i]);
    }

    /// Start loading what an exact lexical score reads of the row in `slot` before its
    /// entries: its entry offset and counts and its term length.
    pub fn prefetch_lexical(&self, slot: Slot) {
        let page = self.page(slot.page);
        let i = slot.index as usize;
        prefetch(&page.term_offsets[i]);
        prefetch(&page.term_counts[i]);
        prefetch(&page.term_lens[i]);
    }

    /// Start loading the lexical terms of the row in `slot` (reads its entry offset).
    pub fn prefetch_terms(&self, slot: Slot) {
        let page = self.page(slot.page);
        self.prefetch_entries_of(slot, page.term_counts[slot.index as usize] as usize);
    }

    /// Start loading every entry of the row in `slot`, its terms and its tokens (reads its
    /// entry offset and counts).
    pub fn prefetch_entries(&self, slot: Slot) {
        let page = self.page(slot.page);
        self.prefetch_entries_of(slot, page.entries_of(slot.index as usize));
    }

    /// Start loading the first `count` entries of the row in `slot`.
    fn prefetch_entries_of(&self, slot: Slot, count: usize) {
        let start = self.page(slot.page).term_offsets[slot.index as usize] as usize;
        let bytes: &[u8] = bytemuck::cast_slice(&self.entries()[start..start + count]);
        for line in (0..bytes.len()).step_by(64) {
            prefetch(&bytes[line]);
        }
    }

    /// The page at `index`.
    pub fn page(&self, index: u32) -> &Page {
        &self.page_slice()[index as usize]
    }

    /// The sketch of the page at `index`.
    pub fn sketch(&self, index: u32) -> &Sketch {
        &self.sketch_slice()[index as usize]
    }

    /// The pages a scope may read: the tenant predicate, in one place. A user's scope is their
    /// own pages; a group scope is the union of its members' pages. No other user's row is ever
    /// handed to a scorer.
    pub fn scope_pages(&self, scope: &[UserId]) -> Vec<&Page> {
        let pages = self.page_slice();
        self.scope_page_numbers(scope)
            .into_iter()
            .map(|p| &pages[p as usize])
            .collect()
    }

    /// The sketches of the pages [`Arena::scope_pages`] hands out, in the same order, with
    /// their page numbers: what stage one scans.
    pub fn scope_sketches(&self, scope: &[UserId]) -> ScopeSketches<'_> {
        let all = self.sketch_slice();
        let pages = self.scope_page_numbers(scope);
        let sketches = pages.iter().map(|&p| &all[p as usize]).collect();
        ScopeSketches { pages, sketches }
    }

    /// Rows of the pages [`Arena::scope_pages`] hands out (a group's members counted once).
    pub fn scope_rows(&self, scope: &[UserId]) -> usize {
        let mut users = scope.to_vec();
        users.sort_unstable();
        users.dedup();
        users.iter().filter_map(|u| self.rows_by_user.get(u)).sum()
    }

    /// The numbers of the pages [`Arena::scope_pages`] hands out, in the same order.
    pub fn scope_page_numbers(&self, scope: &[UserId]) -> Vec<u32> {
        let mut users = scope.to_vec();
        users.sort_unstable();
        users.dedup();
        users
            .iter()
            .filter_map(|u| self.by_user.get(u))
            .flatten()
            .copied()
            .collect()
    }
}

impl Default for Arena {
    fn default() -> Self {
        Self::new()
    }
}

/// An I/O error on `file`, naming it.
fn io_error(file: &MappedFile, source: io::Error) -> ArenaError {
    ArenaError::Io {
        path: file
            .path()
            .map_or_else(|| PathBuf::from("<memory>"), Path::to_path_buf),
        source,
    }
}

/// The arena's three files, mapped.
pub struct ArenaFiles {
    pub pages: MappedFile,
    pub sketches: MappedFile,
    pub terms: MappedFile,
}

impl ArenaFiles {
    /// The files' names in the arena's directory, in field order.
    pub const NAMES: [&str; 3] = ["pages.bin", "sketches.bin", "terms.bin"];

    /// Write the heads of an empty arena: the pages header, the codebook, the sketches and
    /// terms headers.
    fn write_heads(&mut self, header: &PagesHeader, codebook: &Codebook) {
        let pages = self.pages.bytes_mut();
        write_header(pages, header);
        pages[codebook_range(header.codebook_slot as usize)]
            .copy_from_slice(bytemuck::bytes_of(codebook));
        self.sketches.bytes_mut()[..SKETCHES_OFFSET]
            .copy_from_slice(bytemuck::bytes_of(&FileHeader::new(SKETCHES_MAGIC)));
        self.terms.bytes_mut()[..TERMS_HEADER_BYTES]
            .copy_from_slice(bytemuck::bytes_of(&FileHeader::new(TERMS_MAGIC)));
    }
}

/// Keep the writes to the mappings before this point ahead of those after it: a process
/// killed between two instructions leaves in the page cache every write it made before the
/// instruction it was stopped at, so what a commit protocol writes first must come first in
/// the code the compiler emits too.
pub fn in_order() {
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// End of the committed pages' sketches in `sketches.bin`.
fn needed_sketches(header: &PagesHeader) -> usize {
    (header.pages as usize)
        .saturating_mul(SKETCH_BYTES)
        .saturating_add(SKETCHES_OFFSET)
}

/// End of the committed pages in `pages.bin`.
fn needed_pages(header: &PagesHeader) -> usize {
    // Saturating: a header can claim any count, and no file is `usize::MAX` bytes long.
    (header.pages as usize)
        .saturating_mul(PAGE_BYTES)
        .saturating_add(PAGES_OFFSET)
}

/// CRC-32 of a page (its checksum field taken as zero) followed by its rows' entries: what a
/// commit seals each page it wrote with.
pub fn page_checksum(page: &Page, entries: &[Entry]) -> u32 {
    const FIELD: std::ops::Range<usize> = 12..16;
    let bytes = bytemuck::bytes_of(page);
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[..FIELD.start]);
    hasher.update(&[0; 4]);
    hasher.update(&bytes[FIELD.end..]);
    for i in 0..page.rows as usize {
        let start = page.term_offsets[i] as usize;
        hasher.update(bytemuck::cast_slice(
            &entries[start..start + page.entries_of(i)],
        ));
    }
    hasher.finalize()
}
