//! The store: RocksDB, the only module that touches it.
//!
//! Column families (key encoding in [`keys`] and `docs/format.md`):
//!
//! | family | key | value | single writer |
//! |---|---|---|---|
//! | `users` | user | the user's key (UTF-8) | [`Store::write_captures`] |
//! | `rows` | user ++ row | immutable [`Row`] | [`Store::write_captures`] |
//! | `retrieval` | user ++ row | [`RetrievalRow`] (tagged with its dictionary version) | [`Store::write_captures`] |
//! | `activation` | user ++ row | [`Activation`] | born in [`Store::write_captures`]; patched only by [`Store::patch_activation`] (retrieval's reheat) |
//! | `log` | row | user | [`Store::write_captures`] |
//! | `counts` | token / term / total | i64 (merge: add) | [`Store::write_captures`] |
//! | `clock` | user | u64 tokens processed | [`Store::write_captures`] |
//! | `chain` | user ++ conversation ++ row | empty | [`Store::write_captures`] |
//! | `bindings` | user ++ conversation ++ role ++ row | name (UTF-8) | [`Store::write_captures`] |
//! | `meta` | name | value | [`Store::open`], [`Store::write_captures`] (`next_row`), [`Store::probe`] (`probe`) |
//! | `warm` | user ++ row | [`Activation`] of a reheated row, a copy of its `activation` entry | [`Store::patch_activation`]; [`Store::forget_cold`] removes cold ones |
//!
//! [`Store::purge_user`] deletes; it is the one other function that writes, and only removes a
//! user's entries (and subtracts their counts). The decay constant is written once, at birth, in
//! the row and in the activation; the reheat keeps it, and the integrity check compares the two.
//!
//! Every write that assigns row ids or reads a value it then rewrites (clock, bindings, next row)
//! happens under one mutex, so row ids are committed in increasing order: a reader that has seen
//! row `n` in the log has seen every row below it that will ever exist.

pub mod keys;
pub mod row;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, DB, DBCompressionType, DBRecoveryMode, Direction,
    IteratorMode, MergeOperands, Options, ReadOptions, WriteBatch, WriteOptions,
};

use crate::codec::CodecError;
use crate::dictionary::derive::RetrievalRow;
use crate::dictionary::stats::FrequencyTable;
use crate::types::{ConversationId, Role, RowId, UserId};
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
}

impl Cf {
    pub const ALL: [Cf; 11] = [
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
    ];

    /// The family's name on disk.
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
        }
    }

    /// Families whose keys all start with the user id.
    const PER_USER: [Cf; 8] = [
        Cf::Users,
        Cf::Rows,
        Cf::Retrieval,
        Cf::Activation,
        Cf::Clock,
        Cf::Chain,
        Cf::Bindings,
        Cf::Warm,
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
}

impl StoreError {
    /// Whether the storage failed (RocksDB refused or could not complete an operation: a full
    /// disk, an I/O error, a stopped database; or an injected write error) rather than a value
    /// read from it being damaged or the directory belonging to another format or dictionary.
    pub fn is_storage_failure(&self) -> bool {
        matches!(self, Self::Rocks { .. } | Self::Write { .. })
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
}

/// A raw key and value as RocksDB returns them.
pub type RawEntry = (Box<[u8]>, Box<[u8]>);

/// The state guarded by the write mutex.
#[derive(Debug)]
struct Writer {
    next_row: u64,
}

/// The RocksDB-backed store.
pub struct Store {
    db: DB,
    path: PathBuf,
    write_options: WriteOptions,
    writer: Mutex<Writer>,
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
    /// Open (or create) the store in `path`.
    pub fn open(path: &Path, options: &StoreOptions) -> Result<Self, StoreError> {
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

        let descriptors = Cf::ALL.iter().map(|&cf| {
            let mut cf_options = Options::default();
            cf_options.set_compression_type(if options.compression {
                DBCompressionType::Lz4
            } else {
                DBCompressionType::None
            });
            if cf == Cf::Counts {
                cf_options.set_merge_operator_associative("perpetuity.add_i64", add_i64);
            }
            ColumnFamilyDescriptor::new(cf.name(), cf_options)
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
            writer: Mutex::new(Writer { next_row: 1 }),
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
        let next_row = store.next_row_recorded()?;
        store.writer = Mutex::new(Writer { next_row });
        Ok(store)
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
            .cf_handle(cf.name())
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
        let writer = self.writer.lock().expect("writer lock");
        Ok((self.frequency_table()?, RowId(writer.next_row)))
    }

    /// The row id the next capture will get: every stored row's id is below it.
    pub fn next_row(&self) -> RowId {
        RowId(self.writer.lock().expect("writer lock").next_row)
    }

    /// The serving dictionary version: recorded on first use, refused if it differs later
    /// (changing it is the hot swap's job).
    pub fn bind_dictionary(&self, version: &str) -> Result<(), StoreError> {
        let _guard = self.writer.lock().expect("writer lock");
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
    /// label shows when the frame is rendered.
    pub fn bound_name(
        &self,
        user: UserId,
        conversation: &str,
        role: Role,
    ) -> Result<Option<String>, StoreError> {
        Ok(self
            .latest_binding(user, ConversationId::from_key(conversation), role)?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Every activation state of a user's rows, in row order.
    pub fn activations_of(
        &self,
        user: UserId,
    ) -> impl Iterator<Item = Result<(RowId, Activation), StoreError>> + '_ {
        self.activation_entries(Cf::Activation, user)
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
            let (_, row) = keys::parse_user_row(&key).ok_or_else(|| {
                corrupt(CodecError {
                    what: "activation key",
                    reason: "not user ++ row".into(),
                })
            })?;
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

    /// The row a `chain` entry (as an iterator yields it) names.
    fn chain_row(&self, item: Result<KeyValue, rocksdb::Error>) -> Result<RowId, StoreError> {
        let (key, _) = item.map_err(|e| self.rocks(e))?;
        keys::parse_chain(&key)
            .map(|(_, _, row)| row)
            .ok_or_else(|| StoreError::Corrupt {
                cf: Cf::Chain.name(),
                key: hex_key(&key),
                source: CodecError {
                    what: "chain key",
                    reason: "not user ++ conversation ++ row".into(),
                },
            })
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
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let mut writer = self.writer.lock().expect("writer lock");
        let mut batch = WriteBatch::default();
        let mut next_row = writer.next_row;
        let mut clocks: HashMap<UserId, u64> = HashMap::new();
        let mut bindings: HashMap<(UserId, ConversationId, Role), Option<Vec<u8>>> = HashMap::new();
        let mut token_counts: HashMap<crate::types::TokenId, i64> = HashMap::new();
        let mut term_counts: HashMap<crate::types::TermId, i64> = HashMap::new();
        let (mut rows_total, mut tokens_total, mut terms_total) = (0i64, 0i64, 0i64);
        let mut ids = Vec::with_capacity(messages.len());

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
            let conversation = ConversationId::from_key(&message.conversation);
            let clock = match clocks.get(&user) {
                Some(&c) => c,
                None => self.clock(user)?,
            };
            let message_tokens: u64 = message.chunks.iter().map(|c| c.tokens.len() as u64).sum();
            let clock = clock + message_tokens;
            clocks.insert(user, clock);
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

            let chunks = u16::try_from(message.chunks.len()).expect("chunk count fits u16");
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
                let born = Activation {
                    last_clock: clock,
                    peak: message.born_peak,
                    decay: message.decay,
                };
                batch.put_cf(&activation_cf, key, born.encode());
                batch.put_cf(&log_cf, keys::log(id), keys::user(user));
                batch.put_cf(&chain_cf, keys::chain(user, conversation, id), []);

                for &(token, count) in &chunk.retrieval.tokens {
                    *token_counts.entry(token).or_default() += i64::from(count);
                }
                for &(term, _) in &chunk.retrieval.terms {
                    *term_counts.entry(term).or_default() += 1;
                }
                rows_total += 1;
                tokens_total += i64::from(chunk.retrieval.token_len);
                terms_total += chunk.retrieval.term_len() as i64;
                message_ids.push(id);
            }
            ids.push(message_ids);
        }

        let clock_cf = self.cf(Cf::Clock);
        for (user, clock) in &clocks {
            batch.put_cf(&clock_cf, keys::user(*user), clock.to_le_bytes());
        }
        self.merge_counts(
            &mut batch,
            &token_counts,
            &term_counts,
            [rows_total, tokens_total, terms_total],
        );
        batch.put_cf(
            &self.cf(Cf::Meta),
            keys::meta::NEXT_ROW,
            next_row.to_le_bytes(),
        );
        self.write(batch)?;
        crate::failpoint::hit("store.after_commit");
        writer.next_row = next_row;
        Ok(ids)
    }

    /// Add (or, negated, subtract) count deltas to the batch as merge operands.
    fn merge_counts(
        &self,
        batch: &mut WriteBatch,
        tokens: &HashMap<crate::types::TokenId, i64>,
        terms: &HashMap<crate::types::TermId, i64>,
        totals: [i64; 3],
    ) {
        let counts_cf = self.cf(Cf::Counts);
        for (token, delta) in tokens {
            batch.merge_cf(&counts_cf, keys::count::token(*token), delta.to_le_bytes());
        }
        for (term, delta) in terms {
            batch.merge_cf(&counts_cf, keys::count::term(*term), delta.to_le_bytes());
        }
        for (key, delta) in [keys::count::ROWS, keys::count::TOKENS, keys::count::TERMS]
            .into_iter()
            .zip(totals)
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
        let _guard = self.writer.lock().expect("writer lock");
        let cf = self.cf(Cf::Activation);
        let warm = self.cf(Cf::Warm);
        let mut batch = WriteBatch::default();
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
        }
        self.write(batch)
    }

    /// The warm index of a user: every reheated row still listed, with its activation, in row
    /// order. Rows born hot and never reheated are not listed (their state is the birth state).
    pub fn warm_of(
        &self,
        user: UserId,
    ) -> impl Iterator<Item = Result<(RowId, Activation), StoreError>> + '_ {
        self.activation_entries(Cf::Warm, user)
    }

    /// Drop rows that have cooled below the frame's floor from the warm index (their
    /// activation stays). Called by retrieval's recall, the writer of activation.
    pub fn forget_cold(&self, user: UserId, rows: &[RowId]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let _guard = self.writer.lock().expect("writer lock");
        let warm = self.cf(Cf::Warm);
        let mut batch = WriteBatch::default();
        for &row in rows {
            batch.delete_cf(&warm, keys::user_row(user, row));
        }
        self.write(batch)
    }

    /// Remove a user's memory as a unit: rows, retrieval rows, activation, log entries, clock,
    /// chain, bindings, the user entry, and the user's contribution to the frequency counts,
    /// in one batch. Then flush and compact the user's key ranges so the bytes are physically
    /// gone from the data directory. Returns the number of rows removed.
    pub fn purge_user(&self, user: UserId) -> Result<u64, StoreError> {
        let removed = {
            let _guard = self.writer.lock().expect("writer lock");
            let mut batch = WriteBatch::default();
            let mut token_counts = HashMap::new();
            let mut term_counts = HashMap::new();
            let (mut rows, mut tokens, mut terms) = (0i64, 0i64, 0i64);
            let log_cf = self.cf(Cf::Log);
            for entry in self.iter_user(Cf::Retrieval, user) {
                let (key, value) = entry?;
                let retrieval =
                    RetrievalRow::decode(&value).map_err(|source| StoreError::Corrupt {
                        cf: Cf::Retrieval.name(),
                        key: hex_key(&key),
                        source,
                    })?;
                for &(token, count) in &retrieval.tokens {
                    *token_counts.entry(token).or_insert(0i64) -= i64::from(count);
                }
                for &(term, _) in &retrieval.terms {
                    *term_counts.entry(term).or_insert(0i64) -= 1;
                }
                rows -= 1;
                tokens -= i64::from(retrieval.token_len);
                terms -= retrieval.term_len() as i64;
            }
            for entry in self.iter_user(Cf::Rows, user) {
                let (key, _) = entry?;
                if let Some((_, row)) = keys::parse_user_row(&key) {
                    batch.delete_cf(&log_cf, keys::log(row));
                }
            }
            for cf in Cf::PER_USER {
                batch.delete_range_cf(&self.cf(cf), keys::user(user), keys::user_end(user));
            }
            self.merge_counts(
                &mut batch,
                &token_counts,
                &term_counts,
                [rows, tokens, terms],
            );
            batch.put_cf(
                &self.cf(Cf::Meta),
                keys::meta::PURGES,
                (self.purges()? + 1).to_le_bytes(),
            );
            self.write(batch)?;
            crate::failpoint::hit("purge.after_batch");
            (-rows) as u64
        };
        self.compact_user(user)?;
        Ok(removed)
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
        for cf in [Cf::Log, Cf::Counts] {
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
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(keys::user_end(user).to_vec());
        self.db
            .iterator_cf_opt(
                &self.cf(cf),
                read,
                IteratorMode::From(&keys::user(user), Direction::Forward),
            )
            .map(move |item| item.map_err(|e| self.rocks(e)))
    }

    /// Rows in global capture order, starting at `from` (the arena's catch-up reads this).
    pub fn rows_since(&self, from: RowId) -> impl Iterator<Item = Result<Row, StoreError>> + '_ {
        self.db
            .iterator_cf(
                &self.cf(Cf::Log),
                IteratorMode::From(&keys::log(from), Direction::Forward),
            )
            .map(move |item| {
                let (key, value) = item.map_err(|e| self.rocks(e))?;
                let corrupt = |reason: &str| StoreError::Corrupt {
                    cf: Cf::Log.name(),
                    key: hex_key(&key),
                    source: CodecError {
                        what: "log entry",
                        reason: reason.into(),
                    },
                };
                let row = keys::parse_log(&key).ok_or_else(|| corrupt("key is not a row id"))?;
                let user: [u8; 8] = value[..]
                    .try_into()
                    .map_err(|_| corrupt("value is not a user id"))?;
                let user = UserId(u64::from_be_bytes(user));
                self.row(user, row)?
                    .ok_or_else(|| corrupt("logged row is missing from rows"))
            })
    }

    /// A user's rows in capture order.
    pub fn rows_of(&self, user: UserId) -> impl Iterator<Item = Result<Row, StoreError>> + '_ {
        self.iter_user(Cf::Rows, user).map(|entry| {
            let (key, value) = entry?;
            let corrupt = |source| StoreError::Corrupt {
                cf: Cf::Rows.name(),
                key: hex_key(&key),
                source,
            };
            let (user, id) = keys::parse_user_row(&key).ok_or_else(|| {
                corrupt(CodecError {
                    what: "row key",
                    reason: "not user ++ row".into(),
                })
            })?;
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
        let key = keys::user_row(user, id);
        let Some(bytes) = self
            .db
            .get_pinned_cf(&self.cf(Cf::Retrieval), key)
            .map_err(|e| self.rocks(e))?
        else {
            return Ok(None);
        };
        RetrievalRow::decode(&bytes)
            .map(Some)
            .map_err(|source| StoreError::Corrupt {
                cf: Cf::Retrieval.name(),
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
        let mut table = FrequencyTable::default();
        for entry in self.iter_all(Cf::Counts) {
            let (key, value) = entry?;
            let corrupt = |reason: String| StoreError::Corrupt {
                cf: Cf::Counts.name(),
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

/// A key as lower-case hex, for error messages and reports.
pub fn hex_key(key: &[u8]) -> String {
    crate::tokens::hex(key)
}
