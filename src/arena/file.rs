//! The arena's three files, memory-mapped: `pages.bin` (two header slots, two codebook slots,
//! then pages),
//! `sketches.bin` (a header, then each page's sketch) and `terms.bin` (a header, then every
//! row's term and token entries). All grow in place; what counts is what the pages header
//! commits (see `docs/format.md`).

use std::fs::{File, OpenOptions};
use std::io;
use std::num::NonZeroU64;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use bytemuck::{Pod, Zeroable};
use memmap2::{MmapMut, MmapOptions};

use super::Unusable;
use super::codebook::Codebook;
use super::page::{DIMS, PAGE_ROWS, Page, Sketch};
use crate::relevance::TermCount;
use crate::types::{TermId, TokenId};

/// Layout version of the three files; any other version is rebuilt from the store.
pub const FORMAT_VERSION: u32 = 11;
pub const PAGES_MAGIC: [u8; 8] = *b"PPTYPAGE";
pub const TERMS_MAGIC: [u8; 8] = *b"PPTYTERM";
pub const SKETCHES_MAGIC: [u8; 8] = *b"PPTYSKCH";
/// Bytes of one header slot; `pages.bin` starts with two ([`header_range`]).
pub const PAGES_HEADER_BYTES: usize = std::mem::size_of::<PagesHeader>();
/// Bytes of one codebook slot; two follow the header slots ([`codebook_range`]).
pub const CODEBOOK_BYTES: usize = std::mem::size_of::<Codebook>();
/// Header slots, and codebook slots: a commit writes the slot the last commit did not, so a
/// process killed while it writes one leaves the other whole.
pub const SLOTS: usize = 2;
/// Bytes before the first page of `pages.bin`: the header slots and the codebook slots.
pub const PAGES_OFFSET: usize = SLOTS * (PAGES_HEADER_BYTES + CODEBOOK_BYTES);
/// Bytes before the first entry of `terms.bin`.
pub const TERMS_HEADER_BYTES: usize = std::mem::size_of::<FileHeader>();
/// Bytes before the first sketch of `sketches.bin`.
pub const SKETCHES_OFFSET: usize = std::mem::size_of::<FileHeader>();
/// Bytes of a sketch.
pub const SKETCH_BYTES: usize = std::mem::size_of::<Sketch>();
/// Smallest mapping: a file grows by a quarter at a time from here.
const MIN_MAP_BYTES: usize = 1 << 20;

/// The head of `pages.bin`: the commit record of the whole arena. Everything it does not count
/// (pages past `pages`, rows at or past `watermark`, term entries past `terms`) is ignored
/// when the files are opened again. Commits alternate between two slots ([`header_range`]):
/// the one that counts is the valid one with the most `commits` ([`read_header`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct PagesHeader {
    pub magic: [u8; 8],
    pub format_version: u32,
    pub page_bytes: u32,
    pub dims: u32,
    pub page_rows: u32,
    /// Pages in use.
    pub pages: u64,
    /// Rows held.
    pub rows: u64,
    /// Every row id below this has been caught up from the store.
    pub watermark: u64,
    /// Term entries in use in `terms.bin`.
    pub terms: u64,
    /// The store's purge count when the arena was last caught up: a purge since then
    /// invalidates it.
    pub purges: u64,
    /// SHA-256 of the serving dictionary's manifest.
    pub dictionary: [u8; 32],
    /// The committed codebook's checksum: a codebook written without its header is not
    /// taken.
    pub codebook_checksum: u32,
    /// The slot of the committed codebook (0 or 1): a recomputed codebook is written to the
    /// other one.
    pub codebook_slot: u32,
    /// Commits written to these files since they were created: this header is in slot
    /// `commits mod 2`.
    pub commits: u64,
    pub reserved: [u8; 12],
    /// CRC-32 of the header with this field zero.
    pub checksum: u32,
}

const _: () = assert!(PAGES_HEADER_BYTES == 128);
const _: () = assert!(PAGES_HEADER_BYTES.is_multiple_of(64));

impl PagesHeader {
    /// The header of an empty arena for `dictionary`, committing [`Codebook::empty`].
    pub fn empty(dictionary: [u8; 32], purges: u64) -> Self {
        let mut header = Self::zeroed();
        header.magic = PAGES_MAGIC;
        header.format_version = FORMAT_VERSION;
        header.page_bytes = std::mem::size_of::<Page>() as u32;
        header.dims = DIMS as u32;
        header.page_rows = PAGE_ROWS as u32;
        header.dictionary = dictionary;
        header.purges = purges;
        header.codebook_checksum = Codebook::empty().checksum;
        header.checksum = header.compute_checksum();
        header
    }

    pub fn compute_checksum(&self) -> u32 {
        let mut copy = *self;
        copy.checksum = 0;
        crc32fast::hash(bytemuck::bytes_of(&copy))
    }

    /// The checks one header slot must pass to count: magic, layout version, checksum.
    fn check(&self) -> Result<(), Unusable> {
        if self.magic != PAGES_MAGIC {
            return Err(Unusable::Magic { file: "pages.bin" });
        }
        if self.format_version != FORMAT_VERSION {
            return Err(Unusable::Version {
                file: "pages.bin",
                found: self.format_version,
            });
        }
        if self.checksum != self.compute_checksum() {
            return Err(Unusable::HeaderChecksum);
        }
        Ok(())
    }
}

/// Where header slot `slot` lies in `pages.bin`.
pub fn header_range(slot: usize) -> Range<usize> {
    slot * PAGES_HEADER_BYTES..(slot + 1) * PAGES_HEADER_BYTES
}

/// Where codebook slot `slot` lies in `pages.bin`.
pub fn codebook_range(slot: usize) -> Range<usize> {
    let start = SLOTS * PAGES_HEADER_BYTES + slot * CODEBOOK_BYTES;
    start..start + CODEBOOK_BYTES
}

/// The header that counts in the bytes of `pages.bin`: of the slots that pass their checks,
/// the one with the most commits. When neither does, the first slot's reason (the second
/// slot's when the first is not a header at all, as in a file from before the slots).
pub fn read_header(pages: &[u8]) -> Result<PagesHeader, Unusable> {
    let [first, second] = [0, 1].map(|slot| {
        let header: PagesHeader = bytemuck::pod_read_unaligned(&pages[header_range(slot)]);
        header.check().map(|()| header)
    });
    match (first, second) {
        (Ok(a), Ok(b)) => Ok(if b.commits > a.commits { b } else { a }),
        (Ok(header), Err(_)) | (Err(_), Ok(header)) => Ok(header),
        (Err(Unusable::Magic { .. }), Err(reason)) | (Err(reason), Err(_)) => Err(reason),
    }
}

/// Write `header` into its slot of the bytes of `pages.bin`.
pub fn write_header(pages: &mut [u8], header: &PagesHeader) {
    pages[header_range((header.commits % SLOTS as u64) as usize)]
        .copy_from_slice(bytemuck::bytes_of(header));
}

/// The head of `terms.bin` and of `sketches.bin`: the file's magic and the layout version.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct FileHeader {
    pub magic: [u8; 8],
    pub format_version: u32,
    pub reserved: [u8; 52],
}

const _: () = assert!(TERMS_HEADER_BYTES == 64);

impl FileHeader {
    /// The header of a file with `magic`, at this layout version.
    pub fn new(magic: [u8; 8]) -> Self {
        let mut header = Self::zeroed();
        header.magic = magic;
        header.format_version = FORMAT_VERSION;
        header
    }
}

/// One distinct term (or token) of a row and its count; 12 bytes, unaligned.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Entry {
    /// A term id, or a token id (below 2³²).
    pub key: u64,
    pub count: u32,
}

impl TermCount for Entry {
    fn term(&self) -> TermId {
        TermId(self.key)
    }
    fn count(&self) -> u32 {
        self.count
    }
}

impl Entry {
    /// The entry as a token and its count (token entries hold ids below 2³²).
    pub fn token(&self) -> (TokenId, u32) {
        (TokenId(self.key as u32), self.count)
    }
}

/// A file mapped read-write in full, or an anonymous mapping of the same shape for an arena
/// that lives in memory only.
pub struct MappedFile {
    file: Option<(File, PathBuf)>,
    map: MmapMut,
}

impl MappedFile {
    /// An anonymous mapping (zeroed) of at least `bytes`.
    pub fn anonymous(bytes: usize) -> io::Result<Self> {
        Ok(Self {
            file: None,
            map: anonymous(bytes.max(MIN_MAP_BYTES))?,
        })
    }

    /// Open (or create) `path` and map it whole; an empty file is first grown to the minimum.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if file.metadata()?.len() < MIN_MAP_BYTES as u64 {
            allocate(&file, MIN_MAP_BYTES)?;
        }
        let map = map(&file)?;
        Ok(Self {
            file: Some((file, path.to_path_buf())),
            map,
        })
    }

    /// Grow the mapping (and the file) to hold at least `bytes`, by a quarter at least (growth
    /// stays amortised O(1) per byte, and allocated space at most a quarter over what is used).
    /// Existing contents are kept; new bytes are zero.
    pub fn reserve(&mut self, bytes: usize) -> io::Result<()> {
        if bytes <= self.map.len() {
            return Ok(());
        }
        let grown = bytes.max(self.map.len() + self.map.len() / 4);
        match &self.file {
            Some((file, _)) => {
                crate::failpoint::io_error("arena.grow")?;
                self.map.flush_async()?;
                allocate(file, grown)?;
                self.map = map(file)?;
            }
            None => {
                let mut larger = anonymous(grown)?;
                larger[..self.map.len()].copy_from_slice(&self.map);
                self.map = larger;
            }
        }
        Ok(())
    }

    /// Write `bytes` at `at`, growing the file first where it is shorter. A file's bytes go in
    /// by `pwrite`, which the mapping sees (a shared mapping of the same page cache): a write
    /// into the mapping instead faults each new page in, and the kernel zero-fills it (read
    /// from an unwritten extent) before the copy overwrites it.
    pub fn write_at(&mut self, at: usize, bytes: &[u8]) -> io::Result<()> {
        self.reserve(at + bytes.len())?;
        match &self.file {
            Some((file, _)) => file.write_all_at(bytes, at as u64),
            None => {
                self.map[at..at + bytes.len()].copy_from_slice(bytes);
                Ok(())
            }
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map
    }

    /// Ask the kernel to write dirty pages back (no wait). Nothing depends on it for a process
    /// crash (the page cache keeps every write); it bounds what a power loss can tear.
    pub fn flush_async(&self) -> io::Result<()> {
        self.map.flush_async()
    }

    /// Ask the kernel to read the first `bytes` of the file into the page cache, a piece at a
    /// time in file order ([`READ_AHEAD_BYTES`]), until done or `stop` is set. Each request only
    /// starts the reads; a full queue of them makes the next wait. Opening a mapped arena checks
    /// every page against its rows' term entries, which lie all over `terms.bin`: faulted in one
    /// at a time, cold, at ten million rows the open took 25-48 s; with the file read ahead in
    /// order beside it, 10-14 s (`docs/journal/benchmarks.md`, "A cold open reads ahead"). An
    /// anonymous mapping, or a kernel that refuses, changes nothing but speed.
    pub fn read_ahead(&self, bytes: usize, stop: &AtomicBool) {
        let Some((file, _)) = &self.file else {
            return;
        };
        let end = bytes.min(self.map.len()) as u64;
        let mut offset = 0;
        while offset < end && !stop.load(Ordering::Relaxed) {
            let len = READ_AHEAD_BYTES.min(end - offset);
            if let Err(error) = rustix::fs::fadvise(
                file,
                offset,
                NonZeroU64::new(len),
                rustix::fs::Advice::WillNeed,
            ) {
                tracing::debug!(%error, "read-ahead of an arena file refused");
                return;
            }
            offset += len;
        }
    }

    /// The file's path, or `None` for an anonymous mapping.
    pub fn path(&self) -> Option<&Path> {
        self.file.as_ref().map(|(_, path)| path.as_path())
    }
}

/// Bytes one read-ahead request asks for ([`MappedFile::read_ahead`]): the kernel reads at most
/// its readahead window for one request (16 MiB on the machines measured, less on others), so a
/// whole file is asked for in pieces no larger than the smallest window.
const READ_AHEAD_BYTES: u64 = 2 << 20;

/// Grow `file` to `bytes` with its blocks allocated on disk, so a full disk fails here, as an
/// error, rather than later as a fault (SIGBUS) on a write into a sparse part of the mapping.
/// A filesystem without `fallocate` gets a plain (sparse) resize.
fn allocate(file: &File, bytes: usize) -> io::Result<()> {
    let len = file.metadata()?.len();
    if bytes as u64 <= len {
        return Ok(());
    }
    match rustix::fs::fallocate(
        file,
        rustix::fs::FallocateFlags::empty(),
        len,
        bytes as u64 - len,
    ) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP) => file.set_len(bytes as u64),
        Err(errno) => Err(errno.into()),
    }
}

/// A zeroed anonymous mapping of `bytes`, huge pages asked for.
fn anonymous(bytes: usize) -> io::Result<MmapMut> {
    let map = MmapMut::map_anon(bytes)?;
    huge_pages(&map);
    Ok(map)
}

#[allow(unsafe_code)]
fn map(file: &File) -> io::Result<MmapMut> {
    // SAFETY: the arena's files are opened only by the process that holds the store's RocksDB
    // lock on the same data directory, so no other process maps, truncates or writes them
    // while this mapping lives; every access goes through this `MmapMut`, and the borrow
    // checker keeps references into it from outliving a remap (`reserve` takes `&mut self`).
    let map = unsafe { MmapOptions::new().map_mut(file) }?;
    huge_pages(&map);
    Ok(map)
}

/// Ask for the mapping to be backed by 2 MiB pages where the kernel can (transparent huge
/// pages, `madvise` mode included; on ext4 from Linux 6.16 the page cache then holds 2 MiB
/// folios, mapped whole). A scan reads a few lines of each of hundreds of thousands of 4 KiB
/// pages; with 2 MiB pages its address translations hit the TLB instead of walking the page
/// tables. A kernel that refuses changes nothing but speed.
fn huge_pages(map: &MmapMut) {
    if let Err(error) = map.advise(memmap2::Advice::HugePage) {
        tracing::debug!(%error, "huge pages not available for the arena mapping");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes written past the end of the map, across a growth, read back through the mapping,
    /// and what was there before them kept.
    fn writes_read_back_through_the_map(mut file: MappedFile) {
        let first: Vec<u8> = (0..1_000u32).map(|i| i as u8).collect();
        file.write_at(10, &first).unwrap();
        let past = MIN_MAP_BYTES * 2 - 7;
        let second = vec![0xA5u8; MIN_MAP_BYTES];
        file.write_at(past, &second).unwrap();
        assert!(file.bytes().len() >= past + second.len());
        assert_eq!(&file.bytes()[10..1_010], first.as_slice());
        assert_eq!(&file.bytes()[past..past + second.len()], second.as_slice());
        assert!(file.bytes()[1_010..past].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_file_written_at_an_offset_reads_back_through_its_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("terms.bin");
        writes_read_back_through_the_map(MappedFile::open(&path).unwrap());
        let reopened = MappedFile::open(&path).unwrap();
        assert_eq!(reopened.bytes()[10 + 999], (999u32 as u8));
    }

    #[test]
    fn an_anonymous_mapping_written_at_an_offset_reads_back() {
        writes_read_back_through_the_map(MappedFile::anonymous(0).unwrap());
    }
}
