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
//! Every write that assigns row ids or reads a value it then rewrites (clock, bindings, next row)
//! happens under one mutex, so row ids are committed in increasing order: a reader that has seen
//! row `n` in the log has seen every row below it that will ever exist.

pub mod keys;
pub mod row;

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use rayon::prelude::*;
use serde::Serialize;

use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, DB, DBCompressionType, DBRecoveryMode, Direction,
    IteratorMode, MergeOperands, Options, ReadOptions, WriteBatch, WriteOptions,
};

use crate::codec::CodecError;
use crate::dictionary::Dictionary;
use crate::dictionary::derive::{RetrievalRow, derive};
use crate::dictionary::stats::FrequencyTable;
use crate::tokens::Tokenizer;
use crate::types::{ConversationId, Role, RowId, TermId, TokenId, UserId};
pub use row::{Activation, Row};

/// A key and its value, as a RocksDB iterator yields them.
type KeyValue = (Box<[u8]>, Box<[u8]>);

/// The store format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// The column families, declared once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cf {
    Users,
    Rows,
    Retrieval,
    Activation,
    Log,
    Counts,
    Clock,
    Chain,
    Bindings,
    Meta,
    Warm,
    /// The dark dictionary version's retrieval rows (the slot that does not serve).
    DarkRetrieval,
    /// The dark dictionary version's frequency counts.
    DarkCounts,
    /// Rows a user excluded from its own recall (kept, never shown).
    Exclusions,
    /// A sub-user's link to its credential's own user, so a purge of the credential can find
    /// its sub-users without the credential being stored.
    Owners,
}

/// The physical families of the two slots: `[retrieval, counts]` each.
const SLOTS: [[&str; 2]; 2] = [["retrieval", "counts"], ["retrieval_1", "counts_1"]];
/// A key above every key of the slotted families (their keys are at most 16 bytes): the end
/// of a range that clears one.
const ALL_KEYS_END: [u8; 17] = [0xff; 17];

impl Cf {
    pub const ALL: [Cf; 15] = [
        Cf::Users,
        Cf::Rows,
        Cf::Retrieval,
        Cf::Activation,
        Cf::Log,
        Cf::Counts,
        Cf::Clock,
        Cf::Chain,
        Cf::Bindings,
        Cf::Meta,
        Cf::Warm,
        Cf::DarkRetrieval,
        Cf::DarkCounts,
        Cf::Exclusions,
        Cf::Owners,
    ];

    /// The family's name in reports. The four slotted families are named by role
    /// (`retrieval`, `counts`, `dark_retrieval`, `dark_counts`); their physical families on
    /// disk depend on the serving slot.
    pub fn name(self) -> &'static str {
        match self {
            Cf::Users => "users",
            Cf::Rows => "rows",
            Cf::Retrieval => "retrieval",
            Cf::Activation => "activation",
            Cf::Log => "log",
            Cf::Counts => "counts",
            Cf::Clock => "clock",
            Cf::Chain => "chain",
            Cf::Bindings => "bindings",
            Cf::Meta => "meta",
            Cf::Warm => "warm",
            Cf::DarkRetrieval => "dark_retrieval",
            Cf::DarkCounts => "dark_counts",
            Cf::Exclusions => "exclusions",
            Cf::Owners => "owners",
        }
    }

    /// The family on disk when slot `serving` serves.
    fn physical(self, serving: usize) -> &'static str {
        match self {
            Cf::Retrieval => SLOTS[serving][0],
            Cf::Counts => SLOTS[serving][1],
            Cf::DarkRetrieval => SLOTS[1 - serving][0],
            Cf::DarkCounts => SLOTS[1 - serving][1],
            other => other.name(),
        }
    }

    /// Families whose keys all start with the user id.
    const PER_USER: [Cf; 11] = [
        Cf::Users,
        Cf::Rows,
        Cf::Retrieval,
        Cf::DarkRetrieval,
        Cf::Activation,
        Cf::Clock,
        Cf::Chain,
        Cf::Bindings,
        Cf::Warm,
        Cf::Exclusions,
        Cf::Owners,
    ];
}

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
    #[error("{path}: store format version {found} is not supported (this build reads {supported})")]
    FormatVersion {
        path: PathBuf,
        found: u32,
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
    /// LZ4-compress row blocks. Tests that grep the files for text turn it off.
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

/// What [`Store::purge_credential`] removed.
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
    next_row: u64,
    /// The dark dictionary version, while one is installed.
    dark: Option<Dark>,
    /// The purge epoch (see [`Store::purge_epoch`]) at which each user purged since open was
    /// purged last.
    purged: HashMap<UserId, u64>,
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
fn table_file_budget() -> i32 {
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
        // Keep the info LOG small; it holds no user data.
        db_options.set_keep_log_file_num(4);
        // Table files held open: RocksDB's default is unbounded, which under many connections
        // runs the process out of descriptors; a share of the limit leaves the rest to them.
        db_options.set_max_open_files(table_file_budget());

        let physical = Cf::ALL
            .iter()
            .filter(|&&cf| cf != Cf::DarkRetrieval && cf != Cf::DarkCounts)
            .map(|&cf| cf.physical(0))
            .chain([Cf::Retrieval.physical(1), Cf::Counts.physical(1)]);
        let descriptors = physical.map(|name| {
            let mut cf_options = Options::default();
            cf_options.set_compression_type(if options.compression {
                DBCompressionType::Lz4
            } else {
                DBCompressionType::None
            });
            if SLOTS.iter().any(|slot| slot[1] == name) {
                cf_options.set_merge_operator_associative("perpetuity.add_i64", add_i64);
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
            writer: Mutex::new(Writer {
                next_row: 1,
                dark: None,
                purged: HashMap::new(),
            }),
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
                if found != FORMAT_VERSION {
                    return Err(StoreError::FormatVersion {
                        path: path.to_path_buf(),
                        found,
                        supported: FORMAT_VERSION,
                    });
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
        store.writer = Mutex::new(Writer {
            next_row,
            dark,
            purged: HashMap::new(),
        });
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
        let writer = self.writer.lock();
        Ok((self.frequency_table_in(cf)?, RowId(writer.next_row)))
    }

    /// The row id the next capture will get: every stored row's id is below it.
    pub fn next_row(&self) -> RowId {
        RowId(self.writer.lock().next_row)
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

    /// The installed dark dictionary version and its progress, if one is installed.
    pub fn dark(&self) -> Result<Option<DarkVersion>, StoreError> {
        let Some(version) = self.meta(keys::meta::DARK_VERSION)? else {
            return Ok(None);
        };
        let number = |key, what| self.meta_u64(key, what).map(Option::unwrap_or_default);
        Ok(Some(DarkVersion {
            version: String::from_utf8_lossy(&version).into_owned(),
            from: number(keys::meta::DARK_FROM, "dark_from")?,
            next: number(keys::meta::DARK_NEXT, "dark_next")?,
            done: number(keys::meta::DARK_DONE, "dark_done")?,
            total: number(keys::meta::DARK_TOTAL, "dark_total")?,
        }))
    }

    fn swap_refused(&self, reason: String) -> StoreError {
        StoreError::Swap {
            path: self.path.clone(),
            reason,
        }
    }

    /// Install `dictionary` as the dark version: its slot is cleared, and from the next row on
    /// every capture is derived under it too, in the same batch. The rows stored before are
    /// re-derived by [`Store::rederive_step`]. Refused while another dark version is
    /// installed, and for the serving version.
    pub fn install_dark(&self, dictionary: Arc<Dictionary>) -> Result<DarkVersion, StoreError> {
        let mut writer = self.writer.lock();
        let version = dictionary.version().to_owned();
        if let Some(dark) = &writer.dark {
            return Err(self.swap_refused(format!(
                "dark version {} is installed already (flip to it first)",
                dark.version
            )));
        }
        if self.dictionary_version()?.as_deref() == Some(version.as_str()) {
            return Err(self.swap_refused(format!("{version} is the serving version")));
        }
        let total = self
            .get(Cf::Counts, keys::count::ROWS)?
            .map(|value| decode_count(keys::count::ROWS, &value))
            .transpose()?
            .unwrap_or(0)
            .max(0) as u64;
        let state = DarkVersion {
            version: version.clone(),
            from: writer.next_row,
            next: 1,
            done: 0,
            total,
        };
        let mut batch = WriteBatch::default();
        for cf in [Cf::DarkRetrieval, Cf::DarkCounts] {
            batch.delete_range_cf(&self.cf(cf), &[][..], &ALL_KEYS_END[..]);
        }
        let meta = self.cf(Cf::Meta);
        batch.put_cf(&meta, keys::meta::DARK_VERSION, version.as_bytes());
        batch.put_cf(&meta, keys::meta::DARK_FROM, state.from.to_le_bytes());
        batch.put_cf(&meta, keys::meta::DARK_NEXT, state.next.to_le_bytes());
        batch.put_cf(&meta, keys::meta::DARK_DONE, 0u64.to_le_bytes());
        batch.put_cf(&meta, keys::meta::DARK_TOTAL, total.to_le_bytes());
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|e| self.rocks(e))?;
        writer.dark = Some(Dark {
            version,
            dictionary: Some(dictionary),
        });
        Ok(state)
    }

    /// Give the store the table of its installed dark version (after it was opened again):
    /// captures are refused until it is attached, since they must derive under it too.
    pub fn attach_dark(&self, dictionary: Arc<Dictionary>) -> Result<(), StoreError> {
        let mut writer = self.writer.lock();
        match writer.dark.as_mut() {
            Some(dark) if dark.version == dictionary.version() => {
                dark.dictionary = Some(dictionary);
                Ok(())
            }
            other => Err(self.swap_refused(format!(
                "{} is not the installed dark version ({:?})",
                dictionary.version(),
                other.map(|d| &d.version)
            ))),
        }
    }

    /// The attached dark table, if any.
    pub fn dark_dictionary(&self) -> Option<Arc<Dictionary>> {
        let writer = self.writer.lock();
        writer.dark.as_ref().and_then(|d| d.dictionary.clone())
    }

    /// Whether `version` is the installed dark version (its rows and counts are the `Dark`
    /// families); any other version reads the serving ones.
    pub fn is_dark(&self, version: &str) -> bool {
        let writer = self.writer.lock();
        writer.dark.as_ref().is_some_and(|d| d.version == version)
    }

    /// Re-derive up to `max_rows` more of the rows stored before the install under the dark
    /// version (on the rayon pool, outside the write lock), then write their dark retrieval
    /// rows, their counts and the progress in one batch. Heat, decay and novelty are not
    /// touched. A purge meanwhile discards the step (it is redone). Returns the progress.
    pub fn rederive_step(&self, max_rows: usize) -> Result<DarkVersion, StoreError> {
        let (dictionary, purges) = {
            let writer = self.writer.lock();
            let dark = writer
                .dark
                .as_ref()
                .ok_or_else(|| self.swap_refused("no dark version is installed".into()))?;
            let dictionary = dark.dictionary.clone().ok_or_else(|| {
                self.swap_refused(format!("the table of {} is not attached", dark.version))
            })?;
            (dictionary, self.purges()?)
        };
        let state = self.dark()?.expect("a dark version is installed");
        if state.is_derived() {
            return Ok(state);
        }
        let rows = self
            .rows_since(RowId(state.next))
            .take_while(|row| row.as_ref().map_or(true, |row| row.id.0 < state.from))
            .take(max_rows)
            .collect::<Result<Vec<Row>, StoreError>>()?;
        let next = match rows.last() {
            Some(last) if rows.len() == max_rows => last.id.0 + 1,
            _ => state.from,
        };
        let tokenizer = Tokenizer::new();
        let derived: Vec<RetrievalRow> = rows
            .par_iter()
            .map(|row| derive(&dictionary, &tokenizer, row.name.as_deref(), &row.tokens))
            .collect();

        let _writer = self.writer.lock();
        if self.purges()? != purges {
            return Ok(state);
        }
        let mut batch = WriteBatch::default();
        let mut deltas = Deltas::default();
        let dark_cf = self.cf(Cf::DarkRetrieval);
        for (row, retrieval) in rows.iter().zip(&derived) {
            batch.put_cf(
                &dark_cf,
                keys::user_row(row.user, row.id),
                retrieval.encode(),
            );
            deltas.add(retrieval, 1);
        }
        self.merge_counts(&mut batch, Cf::DarkCounts, &deltas);
        let state = DarkVersion {
            next,
            done: state.done + rows.len() as u64,
            ..state
        };
        let meta = self.cf(Cf::Meta);
        batch.put_cf(&meta, keys::meta::DARK_NEXT, state.next.to_le_bytes());
        batch.put_cf(&meta, keys::meta::DARK_DONE, state.done.to_le_bytes());
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|e| self.rocks(e))?;
        crate::failpoint::hit("dict.mid_derive");
        Ok(state)
    }

    /// The flip: the dark version serves from now on, in ONE write (the serving version and
    /// slot); the retired version's slot is cleared after it. Refused unless every row has
    /// been re-derived. Returns the retired version.
    pub fn flip(&self) -> Result<String, StoreError> {
        let mut writer = self.writer.lock();
        let state = self
            .dark()?
            .ok_or_else(|| self.swap_refused("no dark version is installed".into()))?;
        if !state.is_derived() {
            return Err(self.swap_refused(format!(
                "{} is not derived yet: {}/{} rows",
                state.version, state.done, state.total
            )));
        }
        let retired = self.dictionary_version()?.unwrap_or_default();
        let slot = 1 - self.serving_slot.load(Ordering::Acquire);
        let mut batch = WriteBatch::default();
        let meta = self.cf(Cf::Meta);
        let mut earlier = self.retired_versions()?;
        earlier.retain(|v| *v != retired && *v != state.version);
        earlier.push(retired.clone());
        batch.put_cf(&meta, keys::meta::RETIRED, earlier.join("\n").as_bytes());
        batch.put_cf(
            &meta,
            keys::meta::DICTIONARY_VERSION,
            state.version.as_bytes(),
        );
        batch.put_cf(&meta, keys::meta::SERVING_SLOT, [slot as u8]);
        for key in keys::meta::DARK {
            batch.delete_cf(&meta, key);
        }
        crate::failpoint::hit("dict.before_flip");
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|e| self.rocks(e))?;
        crate::failpoint::hit("dict.after_flip");
        self.serving_slot.store(slot, Ordering::Release);
        writer.dark = None;
        drop(writer);
        self.clear_dark()?;
        Ok(retired)
    }

    /// The versions that served before the serving one, oldest first.
    pub fn retired_versions(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .meta(keys::meta::RETIRED)?
            .map(|v| {
                String::from_utf8_lossy(&v)
                    .lines()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Empty the dark slot when it holds anything (what a retired version left behind).
    fn clear_dark(&self) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        for cf in [Cf::DarkRetrieval, Cf::DarkCounts] {
            if self.iter_all(cf).next().is_some() {
                batch.delete_range_cf(&self.cf(cf), &[][..], &ALL_KEYS_END[..]);
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|e| self.rocks(e))
    }

    /// A user's clock: tokens captured so far.
    pub fn clock(&self, user: UserId) -> Result<u64, StoreError> {
        let value = self
            .db
            .get_cf(&self.cf(Cf::Clock), keys::user(user))
            .map_err(|e| self.rocks(e))?;
        Ok(value
            .and_then(|v| v.as_slice().try_into().ok().map(u64::from_le_bytes))
            .unwrap_or(0))
    }

    /// The name most recently bound to `role` in a conversation, if any.
    fn latest_binding(
        &self,
        user: UserId,
        conversation: ConversationId,
        role: Role,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let prefix = keys::binding_prefix(user, conversation, role);
        let end = keys::binding(user, conversation, role, RowId(u64::MAX));
        let mut iter = self.db.iterator_cf(
            &self.cf(Cf::Bindings),
            IteratorMode::From(&end, Direction::Reverse),
        );
        match iter.next() {
            Some(Ok((key, value))) if key.starts_with(&prefix) => Ok(Some(value.into_vec())),
            Some(Err(e)) => Err(self.rocks(e)),
            _ => Ok(None),
        }
    }

    /// The name bound to `role` in a conversation now (the latest binding), if any: what a
    /// frame labels the speaker with. Read from memory after the user's first read since open.
    pub fn bound_name(
        &self,
        user: UserId,
        conversation: ConversationId,
        role: Role,
    ) -> Result<Option<Arc<str>>, StoreError> {
        Ok(self.bound_names(user)?.get(&(conversation, role)).cloned())
    }

    /// Every speaker slot of `user` that has a name bound, with the latest one.
    pub fn bound_names(&self, user: UserId) -> Result<BoundNames, StoreError> {
        self.per_user(&self.bound, user, || {
            let mut names = HashMap::new();
            for entry in self.iter_user(Cf::Bindings, user) {
                let (key, value) = entry?;
                let (_, conversation, role, _) =
                    keys::parse_binding(&key).ok_or_else(|| StoreError::Corrupt {
                        cf: Cf::Bindings.name(),
                        key: hex_key(&key),
                        source: CodecError {
                            what: "binding key",
                            reason: "not user ++ conversation ++ role ++ row".into(),
                        },
                    })?;
                // Keys ascend by row within a slot: the last one read is the latest.
                names.insert((conversation, role), bound_name_of(&value));
            }
            Ok(Arc::new(names))
        })
    }

    /// `user`'s entry of the in-memory cache `cache` (`warm`, `bound`), loaded by `load` on
    /// its first read: under the writer lock, so no write slips between the load and the
    /// entry (every writer updates the entry after its batch lands, under the same lock).
    fn per_user<T: Clone>(
        &self,
        cache: &Mutex<HashMap<UserId, T>>,
        user: UserId,
        load: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Some(entry) = cache.lock().get(&user) {
            return Ok(entry.clone());
        }
        let _guard = self.writer.lock();
        if let Some(entry) = cache.lock().get(&user) {
            return Ok(entry.clone());
        }
        let entry = load()?;
        cache.lock().insert(user, entry.clone());
        Ok(entry)
    }

    /// Every activation state of a user's rows, in row order.
    pub fn activations_of(
        &self,
        user: UserId,
    ) -> impl Iterator<Item = Result<(RowId, Activation), StoreError>> + '_ {
        self.activation_entries(Cf::Activation, user)
    }

    /// One row's activation state, `None` for a row that is not stored.
    pub fn activation(&self, user: UserId, row: RowId) -> Result<Option<Activation>, StoreError> {
        let key = keys::user_row(user, row);
        self.get(Cf::Activation, &key)?
            .map(|bytes| {
                Activation::decode(&bytes).map_err(|source| StoreError::Corrupt {
                    cf: Cf::Activation.name(),
                    key: hex_key(&key),
                    source,
                })
            })
            .transpose()
    }

    /// The user's entries of a family holding activation states (`activation`, `warm`).
    fn activation_entries(
        &self,
        cf: Cf,
        user: UserId,
    ) -> impl Iterator<Item = Result<(RowId, Activation), StoreError>> + '_ {
        self.iter_user(cf, user).map(move |entry| {
            let (key, value) = entry?;
            let corrupt = |source| StoreError::Corrupt {
                cf: cf.name(),
                key: hex_key(&key),
                source,
            };
            let (_, row) = user_row_key(cf, &key, "activation key")?;
            Ok((row, Activation::decode(&value).map_err(corrupt)?))
        })
    }

    /// The rows of one conversation, newest first (from its chain).
    pub fn conversation_rows_newest_first(
        &self,
        user: UserId,
        conversation: &str,
    ) -> impl Iterator<Item = Result<RowId, StoreError>> + '_ {
        let conversation = ConversationId::from_key(conversation);
        let prefix = keys::chain_prefix(user, conversation);
        let end = keys::chain(user, conversation, RowId(u64::MAX));
        let mut read = ReadOptions::default();
        read.set_iterate_lower_bound(prefix.to_vec());
        self.db
            .iterator_cf_opt(
                &self.cf(Cf::Chain),
                read,
                IteratorMode::From(&end, Direction::Reverse),
            )
            .map(move |item| self.chain_row(item))
    }

    /// The rows of one conversation from row `from` on, oldest first (from its chain): one
    /// range scan, so a page of a long conversation costs its own rows.
    pub fn conversation_rows_from(
        &self,
        user: UserId,
        conversation: &str,
        from: RowId,
    ) -> impl Iterator<Item = Result<RowId, StoreError>> + '_ {
        self.chain_from(user, ConversationId::from_key(conversation), from)
    }

    /// [`Store::conversation_rows_from`] by the conversation's id.
    fn chain_from(
        &self,
        user: UserId,
        conversation: ConversationId,
        from: RowId,
    ) -> impl Iterator<Item = Result<RowId, StoreError>> + '_ {
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(keys::chain(user, conversation, RowId(u64::MAX)).to_vec());
        self.db
            .iterator_cf_opt(
                &self.cf(Cf::Chain),
                read,
                IteratorMode::From(&keys::chain(user, conversation, from), Direction::Forward),
            )
            .map(move |item| self.chain_row(item))
    }

    /// `user`'s conversations in id order after `after` (all of them without), each with its
    /// first row: one seek a conversation, whatever its length.
    pub fn conversations_of(
        &self,
        user: UserId,
        after: Option<ConversationId>,
    ) -> impl Iterator<Item = Result<(ConversationId, RowId), StoreError>> + '_ {
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(keys::user_end(user).to_vec());
        let mut cursor = self.db.raw_iterator_cf_opt(&self.cf(Cf::Chain), read);
        let mut next = match after {
            None => Some(keys::user(user).to_vec()),
            Some(after) => after
                .0
                .checked_add(1)
                .map(|id| keys::chain_prefix(user, ConversationId(id)).to_vec()),
        };
        std::iter::from_fn(move || {
            cursor.seek(next.take()?);
            if !cursor.valid() {
                return cursor.status().err().map(|e| Err(self.rocks(e)));
            }
            let (_, conversation, row) = match chain_key(cursor.key().unwrap_or_default()) {
                Ok(parsed) => parsed,
                Err(err) => return Some(Err(err)),
            };
            next = conversation
                .0
                .checked_add(1)
                .map(|id| keys::chain_prefix(user, ConversationId(id)).to_vec());
            Some(Ok((conversation, row)))
        })
    }

    /// The first row of a conversation (from its chain), if it has any.
    pub fn first_row_of(
        &self,
        user: UserId,
        conversation: ConversationId,
    ) -> Result<Option<RowId>, StoreError> {
        self.chain_from(user, conversation, RowId(0))
            .next()
            .transpose()
    }

    /// The row a `chain` entry (as an iterator yields it) names.
    fn chain_row(&self, item: Result<KeyValue, rocksdb::Error>) -> Result<RowId, StoreError> {
        let (key, _) = item.map_err(|e| self.rocks(e))?;
        chain_key(&key).map(|(_, _, row)| row)
    }

    /// The rows of `row`'s conversation around it, in capture order: up to `reach` before it,
    /// the row itself, and up to `reach` after it (from its chain).
    pub fn conversation_rows_around(
        &self,
        user: UserId,
        conversation: &str,
        row: RowId,
        reach: usize,
    ) -> Result<Vec<RowId>, StoreError> {
        let conversation = ConversationId::from_key(conversation);
        let prefix = keys::chain_prefix(user, conversation);
        let walk = |from: [u8; 24], direction: Direction, take: usize| {
            let mut read = ReadOptions::default();
            read.set_iterate_lower_bound(prefix.to_vec());
            read.set_iterate_upper_bound(keys::chain(user, conversation, RowId(u64::MAX)).to_vec());
            self.db
                .iterator_cf_opt(
                    &self.cf(Cf::Chain),
                    read,
                    IteratorMode::From(&from, direction),
                )
                .take(take)
                .map(|item| self.chain_row(item))
                .collect::<Result<Vec<RowId>, StoreError>>()
        };
        let mut rows = walk(
            keys::chain(user, conversation, row),
            Direction::Reverse,
            reach + 1,
        )?;
        rows.reverse();
        rows.extend(walk(
            keys::chain(user, conversation, RowId(row.0.saturating_add(1))),
            Direction::Forward,
            reach,
        )?);
        Ok(rows)
    }

    /// Store messages: each message's rows, retrieval rows, born-hot activation, chain links,
    /// name binding, frequency-count increments, clock advance and the new `next_row`, all in
    /// ONE write batch, so either everything about every message is stored or nothing is.
    /// Returns each message's row ids.
    ///
    /// The single writer of rows, retrieval rows, birth activation, decay, the log, counts,
    /// clocks, the chain graph and the binding log.
    pub fn write_captures(&self, messages: &[NewMessage]) -> Result<Vec<Vec<RowId>>, StoreError> {
        self.write_captures_since(messages, None)
    }

    /// The purge epoch: how many purges have run since the store was opened. A capture that
    /// began at epoch `e` is written with [`Store::write_captures_since`]`(.., Some(e))`.
    pub fn purge_epoch(&self) -> u64 {
        self.purge_epoch.load(Ordering::Acquire)
    }

    /// [`Store::write_captures`] for a capture that began at purge epoch `since`: the messages
    /// of a user purged after it are dropped (no ids), so a request in flight across a purge
    /// cannot bring the user back. Checked under the writer lock, which the purge holds too.
    pub fn write_captures_since(
        &self,
        messages: &[NewMessage],
        since: Option<u64>,
    ) -> Result<Vec<Vec<RowId>>, StoreError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(message) = messages.iter().find(|m| {
            m.moved
                .as_ref()
                .is_some_and(|moved| moved.chunks.len() != m.chunks.len())
        }) {
            return Err(StoreError::Moved {
                reason: format!(
                    "a moved message of {} chunks carries the state of {}",
                    message.chunks.len(),
                    message.moved.as_ref().map_or(0, |moved| moved.chunks.len())
                ),
            });
        }
        if let Some(message) = messages.iter().find(|m| m.chunks.len() > MAX_CHUNKS) {
            return Err(StoreError::TooLong {
                chunks: message.chunks.len(),
            });
        }
        let mut writer = self.writer.lock();
        let dark = match &writer.dark {
            None => None,
            Some(dark) => Some(dark.dictionary.clone().ok_or_else(|| {
                self.swap_refused(format!(
                    "dark version {} is installed but its table is not attached",
                    dark.version
                ))
            })?),
        };
        let tokenizer = Tokenizer::new();
        let mut batch = WriteBatch::default();
        let mut next_row = writer.next_row;
        let mut clocks: HashMap<UserId, u64> = HashMap::new();
        let mut bindings: HashMap<(UserId, ConversationId, Role), Option<Vec<u8>>> = HashMap::new();
        let (mut deltas, mut dark_deltas) = (Deltas::default(), Deltas::default());
        let mut ids = Vec::with_capacity(messages.len());
        let mut warmed = Vec::new();

        let (users_cf, rows_cf, retrieval_cf, activation_cf) = (
            self.cf(Cf::Users),
            self.cf(Cf::Rows),
            self.cf(Cf::Retrieval),
            self.cf(Cf::Activation),
        );
        let (log_cf, chain_cf, bindings_cf) =
            (self.cf(Cf::Log), self.cf(Cf::Chain), self.cf(Cf::Bindings));

        for message in messages {
            let user = message.user;
            if since.is_some_and(|since| writer.purged.get(&user).is_some_and(|&at| at > since)) {
                tracing::info!("a capture begun before its user's purge is dropped");
                ids.push(Vec::new());
                continue;
            }
            let conversation = ConversationId::from_key(&message.conversation);
            let clock = match clocks.get(&user) {
                Some(&c) => c,
                None => self.clock(user)?,
            };
            let message_tokens: u64 = message.chunks.iter().map(|c| c.tokens.len() as u64).sum();
            let (clock, kept) = match &message.moved {
                Some(moved) => (moved.birth_clock, clock.max(moved.birth_clock)),
                None => (clock + message_tokens, clock + message_tokens),
            };
            clocks.insert(user, kept);
            batch.put_cf(&users_cf, keys::user(user), message.user_key.as_bytes());

            let first = RowId(next_row);
            if let Some(name) = &message.name {
                let slot = (user, conversation, message.role);
                let latest = match bindings.get(&slot) {
                    Some(latest) => latest.clone(),
                    None => self.latest_binding(user, conversation, message.role)?,
                };
                if latest.as_deref() != Some(name.as_bytes()) {
                    batch.put_cf(
                        &bindings_cf,
                        keys::binding(user, conversation, message.role, first),
                        name.as_bytes(),
                    );
                    bindings.insert(slot, Some(name.as_bytes().to_vec()));
                }
            }

            // At most MAX_CHUNKS (checked before the lock), so it and each index fit.
            let chunks = message.chunks.len() as u16;
            let mut message_ids = Vec::with_capacity(message.chunks.len());
            for (index, chunk) in message.chunks.iter().enumerate() {
                let id = RowId(next_row);
                next_row += 1;
                let row = Row {
                    id,
                    user,
                    conversation: message.conversation.clone(),
                    message: first,
                    chunk: index as u16,
                    chunks,
                    role: message.role,
                    name: message.name.clone(),
                    timestamp_ms: message.timestamp_ms,
                    source_turn: message.source_turn.clone(),
                    birth_clock: clock,
                    decay: message.decay,
                    tokens: chunk.tokens.clone(),
                    text: chunk.text.clone(),
                };
                let key = keys::user_row(user, id);
                batch.put_cf(&rows_cf, key, row.encode());
                batch.put_cf(&retrieval_cf, key, chunk.retrieval.encode());
                if let Some(dictionary) = &dark {
                    let retrieval = derive(
                        dictionary,
                        &tokenizer,
                        message.name.as_deref(),
                        &chunk.tokens,
                    );
                    batch.put_cf(&self.cf(Cf::DarkRetrieval), key, retrieval.encode());
                    dark_deltas.add(&retrieval, 1);
                }
                let moved = message.moved.as_ref().map(|moved| moved.chunks[index]);
                let activation = moved.map_or(
                    Activation {
                        last_clock: clock,
                        peak: message.born_peak,
                        decay: message.decay,
                    },
                    |moved| moved.activation,
                );
                batch.put_cf(&activation_cf, key, activation.encode());
                if let Some(moved) = moved {
                    if moved.warm {
                        batch.put_cf(&self.cf(Cf::Warm), key, activation.encode());
                        warmed.push((user, id, activation));
                    }
                    if moved.excluded {
                        batch.put_cf(&self.cf(Cf::Exclusions), key, []);
                    }
                }
                batch.put_cf(&log_cf, keys::log(id), keys::user(user));
                batch.put_cf(&chain_cf, keys::chain(user, conversation, id), []);
                deltas.add(&chunk.retrieval, 1);
                message_ids.push(id);
            }
            ids.push(message_ids);
        }

        let clock_cf = self.cf(Cf::Clock);
        for (user, clock) in &clocks {
            batch.put_cf(&clock_cf, keys::user(*user), clock.to_le_bytes());
        }
        self.merge_counts(&mut batch, Cf::Counts, &deltas);
        if dark.is_some() {
            self.merge_counts(&mut batch, Cf::DarkCounts, &dark_deltas);
        }
        batch.put_cf(
            &self.cf(Cf::Meta),
            keys::meta::NEXT_ROW,
            next_row.to_le_bytes(),
        );
        self.write(batch)?;
        crate::failpoint::hit("store.after_commit");
        writer.next_row = next_row;
        let mut cached = self.bound.lock();
        for ((user, conversation, role), name) in bindings {
            if let (Some(names), Some(name)) = (cached.get_mut(&user), name) {
                Arc::make_mut(names).insert((conversation, role), bound_name_of(&name));
            }
        }
        let mut cached = self.warm.lock();
        for (user, row, activation) in warmed {
            if let Some(index) = cached.get_mut(&user) {
                Arc::make_mut(index).insert(row, activation);
            }
        }
        Ok(ids)
    }

    /// Move `user`'s clock on to `clock` when it is behind (a moved user's clock, which counts
    /// every token the user's requests brought, not only those of its stored rows).
    pub fn advance_clock(&self, user: UserId, clock: u64) -> Result<(), StoreError> {
        let _guard = self.writer.lock();
        if self.clock(user)? >= clock {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        batch.put_cf(&self.cf(Cf::Clock), keys::user(user), clock.to_le_bytes());
        self.write(batch)
    }

    /// Add count deltas to the batch as merge operands of family `cf` (`Counts` or
    /// `DarkCounts`), in key order: the memtable then inserts each next to the one before
    /// instead of searching from its top (a bulk ingest ran 1.15 times as fast as in hash
    /// order, `docs/benchmarks.md`).
    fn merge_counts(&self, batch: &mut WriteBatch, cf: Cf, deltas: &Deltas) {
        let counts_cf = self.cf(cf);
        let mut tokens: Vec<(&TokenId, &i64)> = deltas.tokens.iter().collect();
        tokens.sort_unstable();
        for (token, delta) in tokens {
            batch.merge_cf(&counts_cf, keys::count::token(*token), delta.to_le_bytes());
        }
        let mut terms: Vec<(&TermId, &i64)> = deltas.terms.iter().collect();
        terms.sort_unstable();
        for (term, delta) in terms {
            batch.merge_cf(&counts_cf, keys::count::term(*term), delta.to_le_bytes());
        }
        // A zero total (no rows of this family) writes nothing: an empty family stays empty.
        for (key, delta) in [keys::count::ROWS, keys::count::TOKENS, keys::count::TERMS]
            .into_iter()
            .zip(deltas.totals)
            .filter(|&(_, delta)| delta != 0)
        {
            batch.merge_cf(&counts_cf, key, delta.to_le_bytes());
        }
    }

    /// Replace the activation of rows with new states. The single patcher of activation: only
    /// retrieval's reheat calls it. A row that no longer exists (purged meanwhile) is skipped;
    /// the decay is always the stored one, whatever the caller passed.
    pub fn patch_activation(
        &self,
        updates: &[(UserId, RowId, u64, f32)],
    ) -> Result<(), StoreError> {
        let _guard = self.writer.lock();
        let cf = self.cf(Cf::Activation);
        let warm = self.cf(Cf::Warm);
        let mut batch = WriteBatch::default();
        let mut written = Vec::with_capacity(updates.len());
        for &(user, row, last_clock, peak) in updates {
            let key = keys::user_row(user, row);
            let Some(bytes) = self.db.get_cf(&cf, key).map_err(|e| self.rocks(e))? else {
                continue;
            };
            let current = Activation::decode(&bytes).map_err(|source| StoreError::Corrupt {
                cf: Cf::Activation.name(),
                key: format!("{}/{}", user.0, row.0),
                source,
            })?;
            let next = Activation {
                last_clock,
                peak,
                decay: current.decay,
            };
            batch.put_cf(&cf, key, next.encode());
            batch.put_cf(&warm, key, next.encode());
            written.push((user, row, next));
        }
        self.write(batch)?;
        let mut cached = self.warm.lock();
        for (user, row, next) in written {
            if let Some(index) = cached.get_mut(&user) {
                Arc::make_mut(index).insert(row, next);
            }
        }
        Ok(())
    }

    /// Exclude `rows` of `user` from the user's recall (or, with `excluded` false, include them
    /// again): the rows stay stored, and retrieval, the frame and the memory tools pass over
    /// them. The single writer of the exclusions. Rows that are not the user's are left alone;
    /// returns the rows whose state changed.
    pub fn set_excluded(
        &self,
        user: UserId,
        rows: &[RowId],
        excluded: bool,
    ) -> Result<Vec<RowId>, StoreError> {
        let _guard = self.writer.lock();
        let (rows_cf, exclusions) = (self.cf(Cf::Rows), self.cf(Cf::Exclusions));
        let mut batch = WriteBatch::default();
        let mut changed = Vec::new();
        for &row in rows {
            let key = keys::user_row(user, row);
            let stored = self
                .db
                .get_pinned_cf(&rows_cf, key)
                .map_err(|e| self.rocks(e))?;
            let listed = self
                .db
                .get_pinned_cf(&exclusions, key)
                .map_err(|e| self.rocks(e))?;
            if stored.is_none() || listed.is_some() == excluded || changed.contains(&row) {
                continue;
            }
            if excluded {
                batch.put_cf(&exclusions, key, []);
            } else {
                batch.delete_cf(&exclusions, key);
            }
            changed.push(row);
        }
        self.write(batch)?;
        Ok(changed)
    }

    /// The rows `user` excluded from its recall ([`Store::set_excluded`]).
    pub fn exclusions(&self, user: UserId) -> Result<HashSet<RowId>, StoreError> {
        self.iter_user(Cf::Exclusions, user)
            .map(|entry| {
                let (key, _) = entry?;
                user_row_key(Cf::Exclusions, &key, "exclusion key").map(|(_, row)| row)
            })
            .collect()
    }

    /// The rows any user of `scope` excluded: a group scope's search passes over each
    /// member's exclusions among that member's rows (row ids are unique across users, so one
    /// set holds them all).
    pub fn scope_exclusions(&self, scope: &[UserId]) -> Result<HashSet<RowId>, StoreError> {
        let mut excluded = HashSet::new();
        for &user in scope {
            excluded.extend(self.exclusions(user)?);
        }
        Ok(excluded)
    }

    /// The warm index of a user: every reheated row still listed, with its activation, in row
    /// order. Rows born hot and never reheated are not listed (their state is the birth state).
    /// Read from memory after the user's first read since open.
    pub fn warm_of(&self, user: UserId) -> Result<WarmIndex, StoreError> {
        self.per_user(&self.warm, user, || {
            Ok(Arc::new(
                self.activation_entries(Cf::Warm, user)
                    .collect::<Result<_, _>>()?,
            ))
        })
    }

    /// Drop rows that have cooled below the frame's floor from the warm index (their
    /// activation stays). Called by retrieval's recall, the writer of activation.
    pub fn forget_cold(&self, user: UserId, rows: &[RowId]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let _guard = self.writer.lock();
        let warm = self.cf(Cf::Warm);
        let mut batch = WriteBatch::default();
        for &row in rows {
            batch.delete_cf(&warm, keys::user_row(user, row));
        }
        self.write(batch)?;
        if let Some(index) = self.warm.lock().get_mut(&user) {
            let index = Arc::make_mut(index);
            for row in rows {
                index.remove(row);
            }
        }
        Ok(())
    }

    /// Record that `user` is a sub-user of the credential whose own user is `owner`, unless it
    /// is recorded already: the single writer of the `owners` family. Written before the
    /// sub-user's first capture, so every sub-user with rows can be found by
    /// [`Store::sub_users`]; a link alone holds no text.
    pub fn link_owner(&self, user: UserId, owner: UserId) -> Result<(), StoreError> {
        let linked = keys::user(owner);
        if self.get(Cf::Owners, &keys::user(user))?.as_deref() == Some(&linked[..]) {
            return Ok(());
        }
        let _guard = self.writer.lock();
        let mut batch = WriteBatch::default();
        batch.put_cf(&self.cf(Cf::Owners), keys::user(user), linked);
        self.write(batch)
    }

    /// The credential's own user `user` is a sub-user of ([`Store::link_owner`]), if any.
    pub fn owner_of(&self, user: UserId) -> Result<Option<UserId>, StoreError> {
        let Some(value) = self.get(Cf::Owners, &keys::user(user))? else {
            return Ok(None);
        };
        keys::parse_user(&value)
            .map(Some)
            .ok_or_else(|| StoreError::Corrupt {
                cf: Cf::Owners.name(),
                key: hex_key(&keys::user(user)),
                source: CodecError {
                    what: "owner link",
                    reason: "value is not a user id".into(),
                },
            })
    }

    /// The sub-users linked to `owner` ([`Store::link_owner`]), in id order.
    pub fn sub_users(&self, owner: UserId) -> Result<Vec<UserId>, StoreError> {
        let mut found = Vec::new();
        for entry in self.iter_all(Cf::Owners) {
            let (key, value) = entry?;
            let (Some(user), Some(linked)) = (keys::parse_user(&key), keys::parse_user(&value))
            else {
                return Err(StoreError::Corrupt {
                    cf: Cf::Owners.name(),
                    key: hex_key(&key),
                    source: CodecError {
                        what: "owner link",
                        reason: "key or value is not a user id".into(),
                    },
                });
            };
            if linked == owner {
                found.push(user);
            }
        }
        Ok(found)
    }

    /// [`Store::purge_user`] of every sub-user of `owner`, then of `owner` itself: a
    /// credential's whole memory. Each user is purged as a unit; a purge stopped between two
    /// users leaves the rest linked, so asking again completes it.
    pub fn purge_credential(&self, owner: UserId) -> Result<Purged, StoreError> {
        let sub_users = self.sub_users(owner)?;
        let mut rows = 0;
        for &user in sub_users.iter().chain([&owner]) {
            rows += self.purge_user(user)?;
        }
        Ok(Purged { rows, sub_users })
    }

    /// Remove a user's memory as a unit: rows, retrieval rows, activation, log entries, clock,
    /// chain, bindings, the user entry, and the user's contribution to the frequency counts,
    /// in one batch. Then flush and compact the user's key ranges so the bytes are physically
    /// gone from the data directory. Returns the number of rows removed.
    pub fn purge_user(&self, user: UserId) -> Result<u64, StoreError> {
        let removed = {
            let mut writer = self.writer.lock();
            let mut batch = WriteBatch::default();
            let log_cf = self.cf(Cf::Log);
            let deltas = self.user_deltas(Cf::Retrieval, user)?;
            self.merge_counts(&mut batch, Cf::Counts, &deltas);
            let dark_deltas = self.user_deltas(Cf::DarkRetrieval, user)?;
            self.merge_counts(&mut batch, Cf::DarkCounts, &dark_deltas);
            for entry in self.iter_user(Cf::Rows, user) {
                let (key, _) = entry?;
                if let Some((_, row)) = keys::parse_user_row(&key) {
                    batch.delete_cf(&log_cf, keys::log(row));
                }
            }
            for cf in Cf::PER_USER {
                batch.delete_range_cf(&self.cf(cf), keys::user(user), keys::user_end(user));
            }
            batch.put_cf(
                &self.cf(Cf::Meta),
                keys::meta::PURGES,
                (self.purges()? + 1).to_le_bytes(),
            );
            self.write(batch)?;
            let epoch = self.purge_epoch.load(Ordering::Relaxed) + 1;
            writer.purged.insert(user, epoch);
            self.purge_epoch.store(epoch, Ordering::Release);
            self.warm.lock().remove(&user);
            self.bound.lock().remove(&user);
            crate::failpoint::hit("purge.after_batch");
            (-deltas.totals[0]) as u64
        };
        self.compact_user(user)?;
        Ok(removed)
    }

    /// The count deltas that remove `user`'s retrieval rows of family `cf` (negated counts).
    fn user_deltas(&self, cf: Cf, user: UserId) -> Result<Deltas, StoreError> {
        let mut deltas = Deltas::default();
        for entry in self.iter_user(cf, user) {
            let (key, value) = entry?;
            let retrieval = RetrievalRow::decode(&value).map_err(|source| StoreError::Corrupt {
                cf: cf.name(),
                key: hex_key(&key),
                source,
            })?;
            deltas.add(&retrieval, -1);
        }
        Ok(deltas)
    }

    /// Flush every family and compact `user`'s ranges (and the log and counts), so deleted
    /// values are dropped from the SST files and the WAL holding them is retired.
    fn compact_user(&self, user: UserId) -> Result<(), StoreError> {
        let families: Vec<_> = Cf::ALL.iter().map(|&cf| self.cf(cf)).collect();
        let refs: Vec<_> = families.iter().collect();
        self.db
            .flush_cfs_opt(&refs, &rocksdb::FlushOptions::default())
            .map_err(|e| self.rocks(e))?;
        crate::failpoint::hit("purge.mid_compaction");
        for cf in Cf::PER_USER {
            self.db.compact_range_cf(
                &self.cf(cf),
                Some(keys::user(user)),
                Some(keys::user_end(user)),
            );
        }
        for cf in [Cf::Log, Cf::Counts, Cf::DarkCounts] {
            self.db
                .compact_range_cf(&self.cf(cf), None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }

    /// One raw value.
    pub fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.get_cf(&self.cf(cf), key).map_err(|e| self.rocks(e))
    }

    /// Write one raw value, bypassing every invariant: for repair tools and for the tests
    /// that seed corruption to prove the integrity check finds it. Never used when serving.
    pub fn raw_put(&self, cf: Cf, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.db
            .put_cf_opt(&self.cf(cf), key, value, &self.write_options)
            .map_err(|e| self.rocks(e))
    }

    /// Delete one raw value, bypassing every invariant (see [`Store::raw_put`]).
    pub fn raw_delete(&self, cf: Cf, key: &[u8]) -> Result<(), StoreError> {
        self.db
            .delete_cf_opt(&self.cf(cf), key, &self.write_options)
            .map_err(|e| self.rocks(e))
    }

    /// Every entry of one family, in key order.
    pub fn iter_all(&self, cf: Cf) -> impl Iterator<Item = Result<RawEntry, StoreError>> + '_ {
        self.db
            .iterator_cf(&self.cf(cf), IteratorMode::Start)
            .map(move |item| item.map_err(|e| self.rocks(e)))
    }

    /// Every entry of one per-user family under `user`, in key order.
    pub fn iter_user(
        &self,
        cf: Cf,
        user: UserId,
    ) -> impl Iterator<Item = Result<RawEntry, StoreError>> + '_ {
        self.iter_range(cf, &keys::user(user), &keys::user_end(user))
    }

    /// The entries of family `cf` from key `from` up to, not including, key `below`, in key
    /// order: one range scan.
    fn iter_range<'s>(
        &'s self,
        cf: Cf,
        from: &[u8],
        below: &[u8],
    ) -> impl Iterator<Item = Result<RawEntry, StoreError>> + use<'s> {
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(below.to_vec());
        self.db
            .iterator_cf_opt(
                &self.cf(cf),
                read,
                IteratorMode::From(from, Direction::Forward),
            )
            .map(move |item| item.map_err(|e| self.rocks(e)))
    }

    /// The rows the capture log names for `user` (`ids`, ascending), each with its retrieval
    /// row of family `retrieval` (`None` where it has none), read by one range scan of each
    /// family instead of a lookup a row: the arena's catch-up reads its batches this way.
    pub fn logged_rows(
        &self,
        retrieval: Cf,
        user: UserId,
        ids: &[RowId],
    ) -> Result<Vec<(Row, Option<RetrievalRow>)>, StoreError> {
        let (Some(&first), Some(&last)) = (ids.first(), ids.last()) else {
            return Ok(Vec::new());
        };
        let corrupt = |cf: Cf, key: &[u8], source| StoreError::Corrupt {
            cf: cf.name(),
            key: hex_key(key),
            source,
        };
        // Each family's entries from `first` to `last`, with their row ids: one range scan.
        let (from, below) = (
            keys::user_row(user, first),
            keys::user_row(user, RowId(last.0 + 1)),
        );
        let span = |cf: Cf| {
            self.iter_range(cf, &from, &below)
                .map(|entry| {
                    let (key, value) = entry?;
                    Ok((user_row_key(cf, &key, "row key")?.1, key, value))
                })
                .collect::<Result<Vec<_>, StoreError>>()
                .map(|entries| entries.into_iter().peekable())
        };
        let (mut rows, mut retrievals) = (span(Cf::Rows)?, span(retrieval)?);
        let mut read = Vec::with_capacity(ids.len());
        for &id in ids {
            while rows.next_if(|(at, ..)| *at < id).is_some() {}
            let (_, key, value) = rows
                .next_if(|(at, ..)| *at == id)
                .ok_or_else(|| log_corrupt(&keys::log(id), "logged row is missing from rows"))?;
            let row =
                Row::decode(user, id, &value).map_err(|source| corrupt(Cf::Rows, &key, source))?;
            let mut found = None;
            while let Some((at, key, value)) = retrievals.next_if(|(at, ..)| *at <= id) {
                if at == id {
                    found = Some(
                        RetrievalRow::decode(&value)
                            .map_err(|source| corrupt(retrieval, &key, source))?,
                    );
                }
            }
            read.push((row, found));
        }
        Ok(read)
    }

    /// Rows in global capture order, starting at `from`.
    pub fn rows_since(&self, from: RowId) -> impl Iterator<Item = Result<Row, StoreError>> + '_ {
        self.log_since(from)
            .map(move |entry| entry.and_then(|(id, user)| self.logged_row(id, user)))
    }

    /// The capture log from `from` on: each row's id and user, in capture order (the arena's
    /// catch-up reads a batch of it, then the rows themselves in parallel).
    pub fn log_since(
        &self,
        from: RowId,
    ) -> impl Iterator<Item = Result<(RowId, UserId), StoreError>> + '_ {
        self.db
            .iterator_cf(
                &self.cf(Cf::Log),
                IteratorMode::From(&keys::log(from), Direction::Forward),
            )
            .map(move |item| {
                let (key, value) = item.map_err(|e| self.rocks(e))?;
                let row = keys::parse_log(&key)
                    .ok_or_else(|| log_corrupt(&key, "key is not a row id"))?;
                let user: [u8; 8] = value[..]
                    .try_into()
                    .map_err(|_| log_corrupt(&key, "value is not a user id"))?;
                Ok((row, UserId(u64::from_be_bytes(user))))
            })
    }

    /// The row the capture log names: `user`'s row `id`, which the rows must hold.
    pub fn logged_row(&self, id: RowId, user: UserId) -> Result<Row, StoreError> {
        self.row(user, id)?
            .ok_or_else(|| log_corrupt(&keys::log(id), "logged row is missing from rows"))
    }

    /// A user's rows in capture order.
    pub fn rows_of(&self, user: UserId) -> impl Iterator<Item = Result<Row, StoreError>> + '_ {
        self.rows_of_from(user, RowId(0))
    }

    /// [`Store::rows_of`] from row `from` on: one range scan that starts there (a page of a
    /// million-row user costs its own rows, not those before it).
    pub fn rows_of_from(
        &self,
        user: UserId,
        from: RowId,
    ) -> impl Iterator<Item = Result<Row, StoreError>> + '_ {
        self.iter_range(Cf::Rows, &keys::user_row(user, from), &keys::user_end(user))
            .map(|entry| {
                let (key, value) = entry?;
                let corrupt = |source| StoreError::Corrupt {
                    cf: Cf::Rows.name(),
                    key: hex_key(&key),
                    source,
                };
                let (user, id) = user_row_key(Cf::Rows, &key, "row key")?;
                Row::decode(user, id, &value).map_err(corrupt)
            })
    }

    /// One row.
    pub fn row(&self, user: UserId, id: RowId) -> Result<Option<Row>, StoreError> {
        let key = keys::user_row(user, id);
        let Some(bytes) = self
            .db
            .get_pinned_cf(&self.cf(Cf::Rows), key)
            .map_err(|e| self.rocks(e))?
        else {
            return Ok(None);
        };
        Row::decode(user, id, &bytes)
            .map(Some)
            .map_err(|source| StoreError::Corrupt {
                cf: Cf::Rows.name(),
                key: hex_key(&key),
                source,
            })
    }

    /// The user a row belongs to, from the capture log.
    pub fn user_of(&self, row: RowId) -> Result<Option<UserId>, StoreError> {
        Ok(self
            .get(Cf::Log, &keys::log(row))?
            .and_then(|v| <[u8; 8]>::try_from(&v[..]).ok())
            .map(|v| UserId(u64::from_be_bytes(v))))
    }

    /// One retrieval row.
    pub fn retrieval(&self, user: UserId, id: RowId) -> Result<Option<RetrievalRow>, StoreError> {
        self.retrieval_in(Cf::Retrieval, user, id)
    }

    /// One retrieval row of family `cf` (`Retrieval` or `DarkRetrieval`).
    pub fn retrieval_in(
        &self,
        cf: Cf,
        user: UserId,
        id: RowId,
    ) -> Result<Option<RetrievalRow>, StoreError> {
        let key = keys::user_row(user, id);
        let Some(bytes) = self
            .db
            .get_pinned_cf(&self.cf(cf), key)
            .map_err(|e| self.rocks(e))?
        else {
            return Ok(None);
        };
        RetrievalRow::decode(&bytes)
            .map(Some)
            .map_err(|source| StoreError::Corrupt {
                cf: cf.name(),
                key: hex_key(&key),
                source,
            })
    }

    /// A user's key as it was captured, if the user has a memory.
    pub fn user_key(&self, user: UserId) -> Result<Option<String>, StoreError> {
        Ok(self
            .db
            .get_cf(&self.cf(Cf::Users), keys::user(user))
            .map_err(|e| self.rocks(e))?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// The stored frequency counts as a table (zero counts are absent). A negative or
    /// malformed count is corruption.
    pub fn frequency_table(&self) -> Result<FrequencyTable, StoreError> {
        self.frequency_table_in(Cf::Counts)
    }

    /// [`Store::frequency_table`] of one family of counts (`Counts` or `DarkCounts`).
    pub fn frequency_table_in(&self, cf: Cf) -> Result<FrequencyTable, StoreError> {
        let mut table = FrequencyTable::default();
        for entry in self.iter_all(cf) {
            let (key, value) = entry?;
            let corrupt = |reason: String| StoreError::Corrupt {
                cf: cf.name(),
                key: hex_key(&key),
                source: CodecError {
                    what: "count",
                    reason,
                },
            };
            let count = keys::count::parse(&key).ok_or_else(|| corrupt("unknown key".into()))?;
            let value = decode_count(&key, &value)?;
            let value = u64::try_from(value).map_err(|_| corrupt(format!("negative: {value}")))?;
            table.set(count, value);
        }
        Ok(table)
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
