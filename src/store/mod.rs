//! The store: RocksDB, the only module that touches it.
//!
//! Column families (key encoding in [`keys`] and `docs/format.md`):
//!
//! | family | key | value | single writer |
//! |---|---|---|---|
//! | `users` | user | the user's key (UTF-8) | [`Store::write_captures`] |
//! | `rows` | user ++ row | immutable [`Row`] | [`Store::write_captures`] |
//! | `retrieval` | user ++ row | [`RetrievalRow`] (tagged with its dictionary version) | [`Store::write_captures`] |
//! | `dark_retrieval` | user ++ row | [`RetrievalRow`] under the dark dictionary version | [`Store::rederive_step`] (rows captured before the install), [`Store::write_captures`] (after) |
//! | `activation` | user ++ row | [`Activation`] | born in [`Store::write_captures`]; patched only by [`Store::patch_activation`] (retrieval's reheat) |
//! | `log` | row | user | [`Store::write_captures`] |
//! | `counts` | token / term / total | i64 (merge: add) | [`Store::write_captures`] |
//! | `dark_counts` | as `counts`, over the dark retrieval rows | i64 (merge: add) | with `dark_retrieval` |
//! | `clock` | user | u64 tokens processed | [`Store::write_captures`] |
//! | `chain` | user ++ conversation ++ row | empty | [`Store::write_captures`] |
//! | `bindings` | user ++ conversation ++ role ++ row | name (UTF-8) | [`Store::write_captures`] |
//! | `exclusions` | user ++ row | empty | [`Store::set_excluded`] |
//! | `owners` | user | the user id of the credential a sub-user (`x-perpetuity-user`) narrows | [`Store::link_owner`] |
//! | `meta` | name | value | [`Store::open`], [`Store::write_captures`] (`next_row`), the swap ([`Store::install_dark`], [`Store::rederive_step`], [`Store::flip`]), [`Store::probe`] (`probe`) |
//! | `warm` | user ++ row | [`Activation`] of a reheated row, a copy of its `activation` entry | [`Store::patch_activation`]; [`Store::forget_cold`] removes cold ones |
//!
//! [`Store::purge_user`] deletes; it is the one other function that writes, and only removes a
//! user's entries (and subtracts their counts). The decay constant is written once, at birth, in
//! the row and in the activation; the reheat keeps it, and the integrity check compares the two.
//!
//! The serving and the dark retrieval rows and counts live in two slots of physical families
//! (`retrieval` + `counts`, `retrieval_1` + `counts_1`); the meta key `serving_slot` says which
//! slot serves, and the flip of a dictionary swap is one write of it (with the serving version).
//! [`Cf::Retrieval`] and [`Cf::Counts`] always name the serving slot, [`Cf::DarkRetrieval`] and
//! [`Cf::DarkCounts`] the other, which is empty while no dark version is installed.
//!
//! The methods of [`Store`] are kept by job: opening, the meta family and the counts here;
//! captures and the state recall changes in `write.rs`; the dictionary's two slots in `dark.rs`;
//! a user's purge in `purge.rs`; reads in `read.rs`; raw access by family and key in `raw.rs`.
//!
//! Every write that assigns row ids or reads a value it then rewrites (clock, bindings, next row)
//! happens under one mutex, so row ids are committed in increasing order: a reader that has seen
//! row `n` in the log has seen every row below it that will ever exist.

mod cf;
mod dark;
pub mod keys;
mod purge;
mod raw;
mod read;
pub mod row;
mod write;

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use rayon::prelude::*;
use serde::Serialize;

use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, DB, DBCompressionType, DBRecoveryMode, Direction,
    IteratorMode, MemtableFactory, MergeOperands, Options, ReadOptions, WriteBatch, WriteOptions,
};

use crate::codec::CodecError;
use crate::dictionary::Dictionary;
use crate::dictionary::derive::{RetrievalRow, derive};
use crate::dictionary::stats::FrequencyTable;
use crate::tokens::Tokenizer;
use crate::types::{ConversationId, Role, RowId, TermId, TokenId, UserId};
pub use cf::Cf;
use cf::{ALL_KEYS_END, SLOTS};
pub use row::{Activation, Row};

/// A key and its value, as a RocksDB iterator yields them.
type KeyValue = (Box<[u8]>, Box<[u8]>);

/// The store format this build writes: 2, rows and retrieval rows with varints
/// (`docs/format.md`).
pub const FORMAT_VERSION: u32 = 2;
/// The oldest store format this build reads: a store of format 1 holds rows of the first,
/// fixed-width encodings, which still decode. It is marked format 2 at open, since the rows
/// captured after are written with varints, which a build of format 1 cannot read.
pub const OLDEST_FORMAT_VERSION: u32 = 1;

/// Store errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Class: internal (5xx). RocksDB failed; the message is RocksDB's own.
    #[error("rocksdb at {path}: {source}")]
    Rocks {
        path: PathBuf,
        source: rocksdb::Error,
    },
    /// Class: internal (5xx). A write failed outside RocksDB: an I/O error injected by the
    /// `failpoints` feature's `store.write` point, standing in for a full disk.
    #[error("writing to the store at {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Class: corruption. A stored value or key does not decode.
    #[error("corrupt {cf} entry {key}: {source}")]
    Corrupt {
        cf: &'static str,
        key: String,
        source: CodecError,
    },
    /// Class: corruption. The data directory was written by another store format.
    #[error(
        "{path}: store format version {found} is not supported (this build reads {oldest} to {supported})"
    )]
    FormatVersion {
        path: PathBuf,
        found: u32,
        oldest: u32,
        supported: u32,
    },
    /// Class: client/config. The store serves another dictionary version than requested.
    #[error("{path}: the store serves dictionary {stored}, not {requested}")]
    DictionaryMismatch {
        path: PathBuf,
        stored: String,
        requested: String,
    },
    /// Class: client. A dictionary swap step refused in the store's present state (a dark
    /// version already installed, none installed, not derived yet, its table not loaded).
    #[error("{path}: {reason}")]
    Swap { path: PathBuf, reason: String },
    /// Class: client. A message longer than a row's 16-bit chunk index can number; nothing of
    /// the batch is written.
    #[error("a message of {chunks} chunks is too long to store (at most {max} chunks of 256 tokens)", max = MAX_CHUNKS)]
    TooLong { chunks: usize },
    /// Class: client. A moved message whose exported state does not fit it (an export from
    /// another tokenizer, or a damaged file); nothing of the batch is written.
    #[error("cannot import a moved message: {reason}")]
    Moved { reason: String },
    /// Class: configuration. The data directory could not be created, or not be made its
    /// owner's alone ([`DATA_DIR_MODE`]).
    #[error("data directory {path}: {source}")]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The mode of a data directory: its owner's alone, since the store and the arena inside it
/// hold the turns verbatim. A directory found with group or other bits is tightened to it at
/// open; what is created inside it is private through the process's umask (`main.rs`).
pub const DATA_DIR_MODE: u32 = 0o700;

/// Create the data directory `path` (and its missing parents) with [`DATA_DIR_MODE`], or
/// tighten an existing one to it.
pub fn private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DATA_DIR_MODE)
        .create(path)?;
    if std::fs::metadata(path)?.permissions().mode() & 0o777 != DATA_DIR_MODE {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(DATA_DIR_MODE))?;
    }
    Ok(())
}

/// The most chunks one message is stored in: a row numbers its chunk in 16 bits.
pub const MAX_CHUNKS: usize = u16::MAX as usize;

impl StoreError {
    /// Whether the storage failed (RocksDB refused or could not complete an operation: a full
    /// disk, an I/O error, a stopped database; or an injected write error) rather than a value
    /// read from it being damaged or the directory belonging to another format or dictionary.
    pub fn is_storage_failure(&self) -> bool {
        matches!(self, Self::Rocks { .. } | Self::Write { .. })
    }

    /// Whether the data directory is held by another process (RocksDB's lock on its `LOCK`
    /// file): a server serving it, which takes a backup through its admin endpoint instead.
    pub fn is_held_elsewhere(&self) -> bool {
        matches!(self, Self::Rocks { source, .. } if source.as_ref().contains("While lock file"))
    }
}

/// How the store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// fsync the WAL on every write. Off, a write survives a process crash but not a power
    /// loss of the last moments; on, it survives both, at the cost of one fsync per capture.
    pub sync_writes: bool,
    /// LZ4-compress the blocks of every level below the first two ([`PER_LEVEL_COMPRESSION`]).
    /// Tests that grep the files for text turn it off.
    pub compression: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            sync_writes: false,
            compression: true,
        }
    }
}

/// One chunk of a message, ready to store.
#[derive(Debug, Clone)]
pub struct NewChunk {
    pub text: String,
    pub tokens: Vec<crate::types::TokenId>,
    pub retrieval: RetrievalRow,
}

/// One message, chunked and derived, ready to store.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub user: UserId,
    pub user_key: String,
    pub conversation: String,
    pub role: Role,
    pub name: Option<String>,
    pub timestamp_ms: Option<i64>,
    pub source_turn: Option<String>,
    /// Decay constant for every chunk, fixed here at birth.
    pub decay: f32,
    /// Peak of the born-hot activation.
    pub born_peak: f32,
    pub chunks: Vec<NewChunk>,
    /// A message moved from another store: its state kept as exported rather than made anew.
    pub moved: Option<Moved>,
}

/// What a moved message keeps from the store it left ([`crate::ingest::import`]): the user's
/// clock at its birth, and each chunk's activation, warm listing and exclusion. Its decay is
/// [`NewMessage::decay`], the exported one.
#[derive(Debug, Clone)]
pub struct Moved {
    pub birth_clock: u64,
    pub chunks: Vec<MovedChunk>,
}

/// One chunk's state in a [`Moved`] message.
#[derive(Debug, Clone, Copy)]
pub struct MovedChunk {
    pub activation: Activation,
    /// Listed in the user's warm index (reheated and not yet cooled below the frame's floor).
    pub warm: bool,
    /// Excluded from the user's recall.
    pub excluded: bool,
}

/// What [`Store::remove_credential`] removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purged {
    /// Rows removed, over the credential's own user and its sub-users.
    pub rows: u64,
    /// The sub-users purged with it.
    pub sub_users: Vec<UserId>,
}

/// A raw key and value as RocksDB returns them.
pub type RawEntry = (Box<[u8]>, Box<[u8]>);

/// The state guarded by the write mutex.
#[derive(Debug)]
struct Writer {
    /// The dark dictionary version, while one is installed.
    dark: Option<Dark>,
    /// The purge epoch (see [`Store::purge_epoch`]) at which each user purged since open was
    /// purged last.
    purged: HashMap<UserId, u64>,
    /// Each user's clock as the writer last read or wrote it: every write of a clock holds the
    /// writer lock, so a capture reads its users' clocks here instead of from the store, where
    /// each read searched a memtable holding one entry per user per capture (5.3% of an
    /// ingest's time, under the lock; `docs/journal/benchmarks.md`, "The writer's clocks
    /// kept"). Forgotten whole past [`CLOCK_CACHE_USERS`] users, and by a raw write of a clock.
    clocks: HashMap<UserId, u64>,
}

/// Users whose clocks the writer keeps at most (16 bytes and a map's overhead each) before it
/// forgets them all and reads them from the store again.
const CLOCK_CACHE_USERS: usize = 1 << 20;

impl Writer {
    fn new(dark: Option<Dark>) -> Self {
        Self {
            dark,
            purged: HashMap::new(),
            clocks: HashMap::new(),
        }
    }

    /// `user`'s clock: the kept one, or `stored` read and kept.
    fn clock(
        &mut self,
        user: UserId,
        stored: impl FnOnce() -> Result<u64, StoreError>,
    ) -> Result<u64, StoreError> {
        if let Some(&clock) = self.clocks.get(&user) {
            return Ok(clock);
        }
        let clock = stored()?;
        self.keep_clock(user, clock);
        Ok(clock)
    }

    /// Keep `clock` as `user`'s, just written or read under the writer lock.
    fn keep_clock(&mut self, user: UserId, clock: u64) {
        if self.clocks.len() >= CLOCK_CACHE_USERS && !self.clocks.contains_key(&user) {
            self.clocks.clear();
        }
        self.clocks.insert(user, clock);
    }
}

/// An installed dark version, as the writer needs it.
#[derive(Debug)]
struct Dark {
    version: String,
    /// The dark table, once attached ([`Store::attach_dark`]): captures need it.
    dictionary: Option<Arc<Dictionary>>,
}

/// A dark dictionary version's progress, as the meta family records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DarkVersion {
    pub version: String,
    /// Rows from this id on were derived by their capture (the next row id at the install).
    pub from: u64,
    /// Every row below this id (and below `from`) has been re-derived.
    pub next: u64,
    /// Rows re-derived so far, of `total`, the rows stored at the install.
    pub done: u64,
    pub total: u64,
}

impl DarkVersion {
    /// Every stored row has its dark retrieval row: the version can be flipped to.
    pub fn is_derived(&self) -> bool {
        self.next >= self.from
    }
}

/// Frequency-count changes, as merge operands: token occurrences, rows per term, and the
/// totals (rows, tokens, terms).
#[derive(Debug, Default)]
struct Deltas {
    tokens: HashMap<TokenId, i64>,
    terms: HashMap<TermId, i64>,
    totals: [i64; 3],
}

impl Deltas {
    /// Count `row` in, `sign` times (1 to add, -1 to subtract).
    fn add(&mut self, row: &RetrievalRow, sign: i64) {
        for &(token, count) in &row.tokens {
            *self.tokens.entry(token).or_default() += sign * i64::from(count);
        }
        for &(term, _) in &row.terms {
            *self.terms.entry(term).or_default() += sign;
        }
        self.totals[0] += sign;
        self.totals[1] += sign * i64::from(row.token_len);
        self.totals[2] += sign * row.term_len() as i64;
    }
}

/// How many table files RocksDB may hold open: a quarter of the process's soft descriptor
/// limit (raised to the hard limit by `serve`), at least 32 and at most 4,096.
pub fn table_file_budget() -> i32 {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let budget = limit
        .current
        .map_or(4096, |soft| (soft / 4).clamp(32, 4096));
    budget as i32
}

/// The RocksDB-backed store.
pub struct Store {
    db: DB,
    path: PathBuf,
    write_options: WriteOptions,
    writer: Mutex<Writer>,
    /// The row id the next capture will get, moved only under the writer lock and only once the
    /// write that took the ids below it is committed: read without the lock, every row below
    /// it is committed.
    next_row: AtomicU64,
    /// Purges run since open; moved only under the writer lock.
    purge_epoch: AtomicU64,
    /// The slot (0 or 1) whose retrieval rows and counts serve: the meta key `serving_slot`,
    /// changed only by [`Store::flip`] under the writer lock.
    serving_slot: AtomicUsize,
    /// The warm index of every user read since open, in memory (recall reads it every turn;
    /// the `warm` family stays the record). A user's entry is loaded on its first read under
    /// the writer lock, so no write slips between the read and the entry; every write to the
    /// family updates the entry after the write lands, still under the writer lock.
    warm: Mutex<HashMap<UserId, WarmIndex>>,
    /// The names bound now to the speaker slots of every user read since open, in memory
    /// (recall resolves the speaker of every retrieved row each turn; the `bindings` family
    /// stays the record). Loaded and kept like `warm`: first read under the writer lock,
    /// updated by [`Store::write_captures`] after its batch lands, dropped by a purge.
    bound: Mutex<HashMap<UserId, BoundNames>>,
}

/// One user's warm index: each reheated row still listed, with its activation, in row order.
/// Shared with readers as a snapshot; a write copies it only while a reader still holds one.
pub type WarmIndex = Arc<BTreeMap<RowId, Activation>>;

/// One user's bound names: the latest name bound to each speaker slot (conversation, role)
/// that has one. Shared with readers as a snapshot, like [`WarmIndex`].
pub type BoundNames = Arc<HashMap<(ConversationId, Role), Arc<str>>>;

/// A `bindings` value as the name it binds (UTF-8; damaged bytes replaced, never refused).
fn bound_name_of(value: &[u8]) -> Arc<str> {
    Arc::from(String::from_utf8_lossy(value).as_ref())
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// The counts merge operator: every operand and the existing value are i64 LE; the result is
/// their sum. Malformed operands (never written by this code) count as zero rather than
/// failing the whole read; the integrity check reports the key.
fn add_i64(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let decode = |b: &[u8]| b.try_into().map(i64::from_le_bytes).unwrap_or(0);
    let sum = operands.iter().fold(existing.map_or(0, decode), |acc, op| {
        acc.wrapping_add(decode(op))
    });
    Some(sum.to_le_bytes().to_vec())
}

/// What a key's first bytes name for the memtable's insert hint: the user, in the families whose
/// keys begin with one (`keys`).
const INSERT_HINT_PREFIX: &str = "memtable_insert_with_hint_prefix_extractor=rocksdb.FixedPrefix.8";

/// The options of a family keyed by user, before its own settings: each memtable keeps, for
/// every user, where it last inserted that user's key and starts the next insert of the user there. A user's rows
/// are keyed by their ids, which only grow, so each lands next to the user's last one; in a
/// pooled memory of thousands of users a capture's batch otherwise searched each skiplist from
/// its top for every key (`docs/journal/benchmarks.md`, "Ingest: each user's keys inserted where
/// its last one went"). A hint changes where a search starts, never what is stored. Not in
/// RocksDB's C API but for its options string; a library that refused it would cost speed only.
fn family_options() -> Options {
    Options::default()
        .get_options_from_string(INSERT_HINT_PREFIX)
        .unwrap_or_else(|error| {
            tracing::warn!(%error, "memtable insert hints not available");
            Options::default()
        })
}

/// The memtable of each counts family, in bytes (RocksDB's default is 64 MiB).
const COUNTS_WRITE_BUFFER: usize = 4 << 20;

/// Each level's compression when the store compresses: none for level 0 (what a flush writes)
/// and for the level level 0 is merged into, LZ4 below them.
const PER_LEVEL_COMPRESSION: [DBCompressionType; 7] = [
    DBCompressionType::None,
    DBCompressionType::None,
    DBCompressionType::Lz4,
    DBCompressionType::Lz4,
    DBCompressionType::Lz4,
    DBCompressionType::Lz4,
    DBCompressionType::Lz4,
];

/// The write-ahead log's files kept at most, in bytes, before the families whose unflushed
/// writes hold the oldest file are flushed so it can go. A log file is deleted only once every
/// family written in it has flushed, and the small families (a user's clock, bindings, the
/// meta) fill their memtables slowly: without this bound (RocksDB's default is four times all
/// memtables, some 8 GiB here) a long ingest kept 3.9 GB of logs beside 2.5 GB of tables at
/// three million rows, all of it read again at the next open (`docs/journal/benchmarks.md`,
/// "The write-ahead log bounded").
const WAL_BUDGET: u64 = 512 << 20;

impl Store {
    /// Open (or create) the store in `path`, a directory made (or tightened to)
    /// [`DATA_DIR_MODE`] first.
    pub fn open(path: &Path, options: &StoreOptions) -> Result<Self, StoreError> {
        private_dir(path).map_err(|source| StoreError::Directory {
            path: path.to_path_buf(),
            source,
        })?;
        let rocks = |source| StoreError::Rocks {
            path: path.to_path_buf(),
            source,
        };
        let mut db_options = Options::default();
        db_options.create_if_missing(true);
        db_options.create_missing_column_families(true);
        // Verify checksums and fail loudly on any inconsistency found while opening or reading,
        // rather than serving possibly damaged data.
        db_options.set_paranoid_checks(true);
        // After a crash the write-ahead log is replayed up to its last whole record: every
        // write that returned before the crash comes back, a batch torn by the crash is dropped
        // whole (a capture is one batch, so it is never half-applied), and nothing after a torn
        // record is guessed at. RocksDB's default, named here because the "nothing
        // acknowledged is lost, nothing is half-stored" promise rests on it.
        db_options.set_wal_recovery_mode(DBRecoveryMode::PointInTime);
        // Old WAL files are deleted as soon as their data is flushed (no archive): a purged
        // user's text must not linger in a log file once compaction has removed it.
        db_options.set_wal_ttl_seconds(0);
        db_options.set_wal_size_limit_mb(0);
        db_options.set_max_total_wal_size(WAL_BUDGET);
        // Keep the info LOG small; it holds no user data.
        db_options.set_keep_log_file_num(4);
        // Table files held open: RocksDB's default is unbounded, which under many connections
        // runs the process out of descriptors; a share of the limit leaves the rest to them.
        db_options.set_max_open_files(table_file_budget());
        // Required by the counts' vector memtables. It costs nothing measurable here: the
        // writes that carry rows and counts take the writer lock, so they never overlap.
        db_options.set_allow_concurrent_memtable_write(false);

        let physical = Cf::ALL
            .iter()
            .filter(|&&cf| cf != Cf::DarkRetrieval && cf != Cf::DarkCounts)
            .map(|&cf| cf.physical(0))
            .chain([Cf::Retrieval.physical(1), Cf::Counts.physical(1)]);
        let descriptors = physical.map(|name| {
            let counts = SLOTS.iter().any(|slot| slot[1] == name);
            let retrieval = SLOTS.iter().any(|slot| slot[0] == name);
            // Hints only where a key begins with its user: not the log's (row ids), the meta
            // entries' or the counts' (token and term ids, in vector memtables, which take none).
            let by_user = !counts && name != Cf::Log.name() && name != Cf::Meta.name();
            let mut cf_options = if by_user {
                family_options()
            } else {
                Options::default()
            };
            if options.compression && !retrieval {
                // What a flush writes, and the level it is first merged into, is rewritten
                // soon by the next compaction: compressing it spent a fifth of an ingest's CPU
                // on two cores. Only the levels below, which hold most of the bytes, are
                // compressed (`docs/journal/benchmarks.md`, "The first two levels stored
                // plain").
                cf_options.set_compression_per_level(&PER_LEVEL_COMPRESSION);
            } else {
                // Plain where the store does not compress, and always for the retrieval rows
                // (int8 vectors, 2-bit codes, term ids): LZ4 saved 0.2% of an ingest's tables
                // and cost its compactions' CPU (`docs/journal/benchmarks.md`, "The retrieval
                // rows stored plain").
                cf_options.set_compression_type(DBCompressionType::None);
            }
            if counts {
                cf_options.set_merge_operator_associative("perpetuity.add_i64", add_i64);
                // Every capture merges one operand per distinct token and term of each row
                // into the counts: most of a capture's writes. Only the statistic's snapshot
                // (at open, at a swap, in the integrity check) reads them, so their memtable is
                // a vector, which appends where a skiplist searches, and is sorted when read or
                // flushed; kept small so that sort stays short (`docs/journal/benchmarks.md`,
                // "Captures on the request's path").
                cf_options.set_memtable_factory(MemtableFactory::Vector);
                cf_options.set_write_buffer_size(COUNTS_WRITE_BUFFER);
            }
            ColumnFamilyDescriptor::new(name, cf_options)
        });
        let db = DB::open_cf_descriptors(&db_options, path, descriptors).map_err(rocks)?;

        let mut write_options = WriteOptions::default();
        // Every write goes through the write-ahead log: a write that returned survives a crash
        // of the process (the log is in the page cache), with `sync_writes` a power loss too.
        write_options.disable_wal(false);
        write_options.set_sync(options.sync_writes);

        let mut store = Self {
            db,
            path: path.to_path_buf(),
            write_options,
            writer: Mutex::new(Writer::new(None)),
            next_row: AtomicU64::new(1),
            purge_epoch: AtomicU64::new(0),
            serving_slot: AtomicUsize::new(0),
            warm: Mutex::new(HashMap::new()),
            bound: Mutex::new(HashMap::new()),
        };
        match store.meta(keys::meta::FORMAT_VERSION)? {
            None => store.put_meta(keys::meta::FORMAT_VERSION, &FORMAT_VERSION.to_le_bytes())?,
            Some(bytes) => {
                let found = bytes
                    .as_slice()
                    .try_into()
                    .map(u32::from_le_bytes)
                    .unwrap_or(u32::MAX);
                if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&found) {
                    return Err(StoreError::FormatVersion {
                        path: path.to_path_buf(),
                        found,
                        oldest: OLDEST_FORMAT_VERSION,
                        supported: FORMAT_VERSION,
                    });
                }
                if found < FORMAT_VERSION {
                    store.put_meta(keys::meta::FORMAT_VERSION, &FORMAT_VERSION.to_le_bytes())?;
                }
            }
        }
        let slot = store.meta(keys::meta::SERVING_SLOT)?;
        store.serving_slot = AtomicUsize::new(usize::from(slot.as_deref() == Some(&[1])));
        let next_row = store.next_row_recorded()?;
        let dark = store.dark()?.map(|dark| Dark {
            version: dark.version,
            dictionary: None,
        });
        if dark.is_none() {
            // A flip that crashed before clearing the retired slot: finish it.
            store.clear_dark()?;
        }
        store.writer = Mutex::new(Writer::new(dark));
        store.next_row = AtomicU64::new(next_row);
        Ok(store)
    }

    /// Write a consistent copy of the store into `path` (a folder that must not exist yet)
    /// while it keeps taking writes: RocksDB's checkpoint after a flush of every family, its
    /// table files hard-linked where `path` is on the same file system and copied otherwise.
    /// Returns the next row id read before it began: every row below it is in the copy, and
    /// every capture in it is whole (each is one batch).
    pub fn checkpoint(&self, path: &Path) -> Result<RowId, StoreError> {
        let before = self.next_row();
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|checkpoint| checkpoint.create_checkpoint_with_log_size(path, 0))
            .map_err(|source| StoreError::Rocks {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(before)
    }

    /// The data directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn rocks(&self, source: rocksdb::Error) -> StoreError {
        StoreError::Rocks {
            path: self.path.clone(),
            source,
        }
    }

    fn cf(&self, cf: Cf) -> &ColumnFamily {
        self.db
            .cf_handle(cf.physical(self.serving_slot.load(Ordering::Acquire)))
            .expect("every family is created at open")
    }

    fn meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db
            .get_cf(&self.cf(Cf::Meta), key)
            .map_err(|e| self.rocks(e))
    }

    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        batch.put_cf(&self.cf(Cf::Meta), key, value);
        self.write(batch)
    }

    /// Commit one batch through the write-ahead log: every write of the store but the repair
    /// tools' raw ones. On a full disk or an I/O error RocksDB refuses it and every write after
    /// it until it has recovered (see [`Store::probe`]).
    fn write(&self, batch: WriteBatch) -> Result<(), StoreError> {
        crate::failpoint::io_error("store.write").map_err(|source| StoreError::Write {
            path: self.path.clone(),
            source,
        })?;
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|e| self.rocks(e))
    }

    /// Whether the store takes writes again: one small write (meta `probe`, the time in ms)
    /// through the write-ahead log, as a capture's. After a full disk RocksDB stops taking
    /// writes and resumes on its own once there is room again (its file manager checks the
    /// free space every few seconds); this is how the server finds out.
    pub fn probe(&self, now_ms: i64) -> Result<(), StoreError> {
        self.put_meta(keys::meta::PROBE, &now_ms.to_le_bytes())
    }

    /// The recorded next row id (1 for a new store).
    fn next_row_recorded(&self) -> Result<u64, StoreError> {
        self.meta_u64(keys::meta::NEXT_ROW, "next_row")
            .map(|n| n.unwrap_or(1))
    }

    /// A u64 meta value, if recorded.
    fn meta_u64(&self, key: &[u8], what: &'static str) -> Result<Option<u64>, StoreError> {
        self.meta(key)?
            .map(|bytes| {
                bytes
                    .as_slice()
                    .try_into()
                    .map(u64::from_le_bytes)
                    .map_err(|_| StoreError::Corrupt {
                        cf: Cf::Meta.name(),
                        key: what.into(),
                        source: CodecError {
                            what,
                            reason: format!("{} bytes, expected 8", bytes.len()),
                        },
                    })
            })
            .transpose()
    }

    /// How many purges this store has seen.
    pub fn purges(&self) -> Result<u64, StoreError> {
        self.meta_u64(keys::meta::PURGES, "purges")
            .map(|n| n.unwrap_or(0))
    }

    /// The stored frequency counts and the next row id, read in one step (no capture or purge
    /// commits in between): the counts are exactly those of the rows below that id.
    pub fn counts_snapshot(&self) -> Result<(FrequencyTable, RowId), StoreError> {
        self.counts_snapshot_in(Cf::Counts)
    }

    /// [`Store::counts_snapshot`] of one family of counts (`Counts` or `DarkCounts`).
    pub fn counts_snapshot_in(&self, cf: Cf) -> Result<(FrequencyTable, RowId), StoreError> {
        let _writer = self.writer.lock();
        Ok((self.frequency_table_in(cf)?, self.next_row()))
    }

    /// The row id the next capture will get: every stored row's id is below it. Read without
    /// the writer lock (a capture being written is not waited for).
    pub fn next_row(&self) -> RowId {
        RowId(self.next_row.load(Ordering::Acquire))
    }

    /// The serving dictionary version: recorded on first use, refused if it differs later
    /// (changing it is the hot swap's job).
    pub fn bind_dictionary(&self, version: &str) -> Result<(), StoreError> {
        let _guard = self.writer.lock();
        match self.meta(keys::meta::DICTIONARY_VERSION)? {
            None => self.put_meta(keys::meta::DICTIONARY_VERSION, version.as_bytes()),
            Some(stored) if stored == version.as_bytes() => Ok(()),
            Some(stored) => Err(StoreError::DictionaryMismatch {
                path: self.path.clone(),
                stored: String::from_utf8_lossy(&stored).into_owned(),
                requested: version.to_owned(),
            }),
        }
    }

    /// The serving dictionary version, if one was bound.
    pub fn dictionary_version(&self) -> Result<Option<String>, StoreError> {
        Ok(self
            .meta(keys::meta::DICTIONARY_VERSION)?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }
}

/// A stored count value (i64 LE).
pub fn decode_count(key: &[u8], value: &[u8]) -> Result<i64, StoreError> {
    value
        .try_into()
        .map(i64::from_le_bytes)
        .map_err(|_| StoreError::Corrupt {
            cf: Cf::Counts.name(),
            key: hex_key(key),
            source: CodecError {
                what: "count",
                reason: format!("{} bytes, expected 8", value.len()),
            },
        })
}

/// The user and row of a `user ++ row` key of family `cf`; `what` names the key in the error
/// where it is not one.
fn user_row_key(cf: Cf, key: &[u8], what: &'static str) -> Result<(UserId, RowId), StoreError> {
    keys::parse_user_row(key).ok_or_else(|| StoreError::Corrupt {
        cf: cf.name(),
        key: hex_key(key),
        source: CodecError {
            what,
            reason: "not user ++ row".into(),
        },
    })
}

/// A capture-log entry that does not read as one.
fn log_corrupt(key: &[u8], reason: &str) -> StoreError {
    StoreError::Corrupt {
        cf: Cf::Log.name(),
        key: hex_key(key),
        source: CodecError {
            what: "log entry",
            reason: reason.into(),
        },
    }
}

/// A key as lower-case hex, for error messages and reports.
/// A `chain` key's user, conversation and row.
fn chain_key(key: &[u8]) -> Result<(UserId, ConversationId, RowId), StoreError> {
    keys::parse_chain(key).ok_or_else(|| StoreError::Corrupt {
        cf: Cf::Chain.name(),
        key: hex_key(key),
        source: CodecError {
            what: "chain key",
            reason: "not user ++ conversation ++ row".into(),
        },
    })
}

pub fn hex_key(key: &[u8]) -> String {
    crate::tokens::hex(key)
}
