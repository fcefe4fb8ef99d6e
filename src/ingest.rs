//! Bulk capture, export and import: many messages in, a user's rows out, and back in elsewhere.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead as _, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::capture::{Capturer, Message};
use crate::dictionary::Dictionary;
use crate::store::{Activation, Moved, MovedChunk, NewMessage, Row, Store, StoreError};
use crate::types::{Role, RowId, UserId};

/// Messages per write batch in bulk ingest. Each message is still all-or-nothing (a batch is
/// atomic); batching amortises the WAL write and the frequency statistic's merges (one per
/// distinct token and term of the batch: about 7,900 for 2,048 synthetic messages, as many as
/// a third of the batch's memtable inserts, and they grow slower than the batch). 8,192 took
/// `bench ingest` from 41-44k to 47-49k rows/s; 16,384 was no faster, 32,768 slower
/// (`docs/journal/benchmarks.md`). Large enough to keep both cores busy preparing.
pub const INGEST_BATCH_MESSAGES: usize = 8_192;

/// What a bulk ingest did.
#[derive(Debug, Clone, Copy, Default)]
pub struct IngestSummary {
    pub messages: u64,
    pub rows: u64,
    pub tokens: u64,
    pub elapsed: Duration,
}

impl IngestSummary {
    /// Two ingests as one: counts and time added.
    pub fn plus(&self, other: &Self) -> Self {
        Self {
            messages: self.messages + other.messages,
            rows: self.rows + other.rows,
            tokens: self.tokens + other.tokens,
            elapsed: self.elapsed + other.elapsed,
        }
    }

    pub fn rows_per_second(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

/// Capture `messages` in order, preparing each batch on all cores and writing it as one batch;
/// the next batch is prepared while one is written. `progress` is called after every batch with
/// the summary so far.
pub fn ingest(
    store: &Store,
    dictionary: &Dictionary,
    messages: &[Message],
    mut progress: impl FnMut(&IngestSummary, usize),
) -> Result<IngestSummary, StoreError> {
    let capturer = Capturer::new(dictionary);
    let prepare = |batch: &[Message]| -> Vec<NewMessage> {
        batch
            .par_iter()
            .filter_map(|m| capturer.prepare(m))
            .collect()
    };
    let started = Instant::now();
    let mut summary = IngestSummary::default();
    let mut batches = messages.chunks(INGEST_BATCH_MESSAGES);
    let mut next = batches.next().map(|batch| (batch.len(), prepare(batch)));
    while let Some((messages_in, prepared)) = next.take() {
        let (ids, following) = rayon::join(
            || store.write_captures(&prepared),
            || batches.next().map(|batch| (batch.len(), prepare(batch))),
        );
        let ids = ids?;
        next = following;
        summary.messages += messages_in as u64;
        summary.rows += ids.iter().map(|r| r.len() as u64).sum::<u64>();
        summary.tokens += prepared
            .iter()
            .flat_map(|m| &m.chunks)
            .map(|c| c.tokens.len() as u64)
            .sum::<u64>();
        summary.elapsed = started.elapsed();
        progress(&summary, messages.len());
    }
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// One exported row: the row as stored, with its activation state, whether the user's warm
/// index lists it and whether the user excluded it (`docs/scale-out.md`, "Moving a user").
#[derive(Debug, Serialize, Deserialize)]
struct ExportedRow {
    row: u64,
    user: String,
    conversation: String,
    message: u64,
    chunk: u16,
    chunks: u16,
    role: Role,
    name: Option<String>,
    timestamp_ms: Option<i64>,
    source_turn: Option<String>,
    birth_clock: u64,
    /// The decay constant fixed at birth.
    decay: f32,
    /// The activation: clock position of the last one and the heat it reached.
    last_clock: u64,
    peak: f32,
    warm: bool,
    excluded: bool,
    text: String,
}

/// One exported user, after its rows: its clock and the credential it is a sub-user of.
#[derive(Debug, Serialize, Deserialize)]
struct ExportedUser {
    /// Always `user`: what tells this line from a row's.
    kind: String,
    user: String,
    clock: u64,
    /// The id of the credential's own user this user is a sub-user of, if any.
    owner: Option<u64>,
}

/// A line of an export.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Exported {
    User(ExportedUser),
    Row(Box<ExportedRow>),
}

/// What an export needs of a user besides its rows, read once.
struct UserState {
    key: String,
    activations: HashMap<RowId, Activation>,
    warm: crate::store::WarmIndex,
    excluded: HashSet<RowId>,
}

impl UserState {
    fn read(store: &Store, user: UserId, key: String) -> Result<Self, StoreError> {
        Ok(Self {
            key,
            activations: store.activations_of(user).collect::<Result<_, _>>()?,
            warm: store.warm_of(user)?,
            excluded: store.exclusions(user)?,
        })
    }

    fn write_row(&self, out: &mut impl Write, row: Row) -> Result<(), ExportError> {
        let activation = self
            .activations
            .get(&row.id)
            .copied()
            .unwrap_or(Activation {
                last_clock: row.birth_clock,
                peak: crate::heat::BORN_PEAK,
                decay: row.decay,
            });
        let exported = ExportedRow {
            row: row.id.0,
            user: self.key.clone(),
            conversation: row.conversation,
            message: row.message.0,
            chunk: row.chunk,
            chunks: row.chunks,
            role: row.role,
            name: row.name,
            timestamp_ms: row.timestamp_ms,
            source_turn: row.source_turn,
            birth_clock: row.birth_clock,
            decay: row.decay,
            last_clock: activation.last_clock,
            peak: activation.peak,
            warm: self.warm.contains_key(&row.id),
            excluded: self.excluded.contains(&row.id),
            text: row.text,
        };
        serde_json::to_writer(&mut *out, &exported).map_err(std::io::Error::from)?;
        Ok(out.write_all(b"\n")?)
    }

    fn write_user(
        &self,
        out: &mut impl Write,
        store: &Store,
        user: UserId,
    ) -> Result<(), ExportError> {
        let exported = ExportedUser {
            kind: "user".into(),
            user: self.key.clone(),
            clock: store.clock(user)?,
            owner: store.owner_of(user)?.map(|owner| owner.0),
        };
        serde_json::to_writer(&mut *out, &exported).map_err(std::io::Error::from)?;
        Ok(out.write_all(b"\n")?)
    }
}

/// Errors of an export.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Class: internal. Writing the output failed.
    #[error("writing the export: {0}")]
    Write(#[from] std::io::Error),
}

/// Write rows as JSON lines in capture order, one user's (by key) or everyone's, each with its
/// activation, warm listing and exclusion; then a line per user with its clock and owner.
/// Returns the number of rows written.
pub fn export(
    store: &Store,
    user_key: Option<&str>,
    out: &mut impl Write,
) -> Result<u64, ExportError> {
    let mut written = 0;
    let mut users: Vec<(UserId, UserState)> = Vec::new();
    let mut seen: HashMap<UserId, usize> = HashMap::new();
    let rows: Box<dyn Iterator<Item = Result<Row, StoreError>>> = match user_key {
        Some(key) => Box::new(store.rows_of(UserId::from_key(key))),
        None => Box::new(store.rows_since(RowId(0))),
    };
    for row in rows {
        let row = row?;
        let at = match seen.get(&row.user) {
            Some(&at) => at,
            None => {
                let key = match user_key {
                    Some(key) => key.to_owned(),
                    None => store.user_key(row.user)?.unwrap_or_default(),
                };
                users.push((row.user, UserState::read(store, row.user, key)?));
                seen.insert(row.user, users.len() - 1);
                users.len() - 1
            }
        };
        users[at].1.write_row(out, row)?;
        written += 1;
    }
    for (user, state) in &users {
        state.write_user(out, store, *user)?;
    }
    out.flush()?;
    Ok(written)
}

/// Errors of an import.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Class: client. The file is not an export this build reads; nothing was imported.
    #[error("{path}:{line}: {reason}")]
    Bad {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    /// Class: client. A user in the file already has rows, a clock or an owner link here;
    /// nothing was imported.
    #[error(
        "user {user:?} already has memory in this store: purge it here first, or import it into another"
    )]
    Present { user: String },
    /// Class: as its cause. Writing the file failed midway; what it had written was purged
    /// again, so nothing of it is kept.
    #[error("{0}; nothing of the file was kept")]
    RolledBack(Box<ImportError>),
    /// Class: internal. Reading the file failed.
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What an import did.
#[derive(Debug, Clone, Copy, Default)]
pub struct ImportSummary {
    pub users: u64,
    pub messages: u64,
    pub rows: u64,
}

/// The longest line an export may hold: a row's chunk of text, JSON-escaped, is far shorter.
pub const MAX_EXPORT_LINE: usize = 16 * 1024 * 1024;

/// The highest clock an import accepts: a clock advances by the tokens a user captures, so one
/// this far below `u64::MAX` never reaches it.
pub const MAX_IMPORTED_CLOCK: u64 = 1 << 62;

/// One line of an export file: its number, a keyed hash of its text (the second pass checks
/// the file is the one the first pass checked), and what it says.
type ExportLine = (usize, u64, Exported);

/// The lines of export file `path` that are not blank, parsed, each numbered and hashed with
/// `seal`; a line over [`MAX_EXPORT_LINE`] bytes is refused before it is read whole.
fn exported_lines<'a>(
    path: &'a Path,
    seal: &'a std::hash::RandomState,
) -> Result<impl Iterator<Item = Result<ExportLine, ImportError>> + 'a, ImportError> {
    use std::hash::BuildHasher as _;
    use std::io::Read as _;
    let read = |source| ImportError::Read {
        path: path.to_path_buf(),
        source,
    };
    let bad = move |line: usize, reason: String| ImportError::Bad {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut reader = std::io::BufReader::new(std::fs::File::open(path).map_err(read)?);
    let mut text = Vec::new();
    let mut at = 0;
    Ok(std::iter::from_fn(move || {
        loop {
            text.clear();
            at += 1;
            let limit = MAX_EXPORT_LINE as u64 + 1;
            match (&mut reader).take(limit).read_until(b'\n', &mut text) {
                Err(source) => return Some(Err(read(source))),
                Ok(0) => return None,
                Ok(_) => {}
            }
            if text.len() > MAX_EXPORT_LINE {
                return Some(Err(bad(
                    at,
                    format!("a line of more than {MAX_EXPORT_LINE} bytes"),
                )));
            }
            let Ok(line) = std::str::from_utf8(&text) else {
                return Some(Err(bad(at, "not UTF-8 text".into())));
            };
            let line = line.trim_end_matches(['\n', '\r']);
            if line.trim().is_empty() {
                continue;
            }
            return Some(
                serde_json::from_str(line)
                    .map(|parsed| (at, seal.hash_one(line), parsed))
                    .map_err(|err| bad(at, format!("not a line of `perpetuity export`: {err}"))),
            );
        }
    }))
}

/// Whether `user` has anything in `store`: rows, a clock or an owner link.
fn present(store: &Store, user: UserId) -> Result<bool, StoreError> {
    Ok(store.rows_of(user).next().is_some()
        || store.clock(user)? > 0
        || store.owner_of(user)?.is_some())
}

/// What the first pass of an import found: each line's hash, in order, and the file's users.
struct Checked {
    hashes: Vec<u64>,
    users: Vec<UserId>,
}

/// The first pass of [`import`]: every line is checked before anything is written.
fn check_export(
    store: &Store,
    path: &Path,
    seal: &std::hash::RandomState,
) -> Result<Checked, ImportError> {
    let bad = |line: usize, reason: String| ImportError::Bad {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut hashes = Vec::new();
    // Each user of the file: the newest clock its rows hold, and its user line's number,
    // clock and owner.
    let mut rows_clock: HashMap<String, u64> = HashMap::new();
    let mut user_lines: HashMap<String, (usize, u64, Option<u64>)> = HashMap::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut open: Option<(String, u64, u16, u16)> = None;
    let mut last = 0;
    for line in exported_lines(path, seal)? {
        let (at, hash, line) = line?;
        hashes.push(hash);
        last = at;
        let user = match line {
            Exported::Row(row) => {
                let expected = match &open {
                    Some((user, message, next, chunks))
                        if *user == row.user && *message == row.message =>
                    {
                        (*next, *chunks)
                    }
                    Some(_) => {
                        return Err(bad(at, "a message's rows end before its last chunk".into()));
                    }
                    None => (0, row.chunks),
                };
                if row.chunks == 0 || row.chunk != expected.0 || row.chunks != expected.1 {
                    return Err(bad(
                        at,
                        format!(
                            "chunk {} of {} where chunk {} of {} was due",
                            row.chunk, row.chunks, expected.0, expected.1
                        ),
                    ));
                }
                if !(row.decay.is_finite() && row.decay > 0.0) {
                    return Err(bad(at, format!("decay {} is not above 0", row.decay)));
                }
                if !(row.peak.is_finite() && row.peak >= 0.0) {
                    return Err(bad(at, format!("peak {} is not a heat", row.peak)));
                }
                open = (row.chunk + 1 < row.chunks)
                    .then(|| (row.user.clone(), row.message, row.chunk + 1, row.chunks));
                let newest = rows_clock.entry(row.user.clone()).or_default();
                *newest = (*newest).max(row.birth_clock).max(row.last_clock);
                row.user
            }
            Exported::User(user) if user.kind == "user" => {
                if user.clock > MAX_IMPORTED_CLOCK {
                    return Err(bad(
                        at,
                        format!("clock {} is beyond {MAX_IMPORTED_CLOCK}", user.clock),
                    ));
                }
                if user.owner == Some(UserId::from_key(&user.user).0) {
                    return Err(bad(at, "a user named as its own owner".into()));
                }
                let line = (at, user.clock, user.owner);
                if user_lines.insert(user.user.clone(), line).is_some() {
                    return Err(bad(at, format!("a second line for user {:?}", user.user)));
                }
                user.user
            }
            Exported::User(user) => {
                return Err(bad(at, format!("unknown line kind {:?}", user.kind)));
            }
        };
        if seen.insert(user.clone()) && present(store, UserId::from_key(&user))? {
            return Err(ImportError::Present { user });
        }
    }
    if open.is_some() {
        return Err(bad(last, "the file ends inside a message".into()));
    }
    for (user, newest) in &rows_clock {
        let Some(&(at, clock, _)) = user_lines.get(user) else {
            return Err(bad(
                last,
                format!(
                    "user {user:?} has rows and no user line (an export ends with one per user)"
                ),
            ));
        };
        if clock < *newest {
            return Err(bad(
                at,
                format!("user {user:?}'s clock {clock} is behind its rows' {newest}"),
            ));
        }
    }
    let sub_users: HashSet<u64> = user_lines
        .iter()
        .filter(|(_, (_, _, owner))| owner.is_some())
        .map(|(user, _)| UserId::from_key(user).0)
        .collect();
    for (at, _, owner) in user_lines.values() {
        if let Some(owner) = *owner
            && (sub_users.contains(&owner) || store.owner_of(UserId(owner))?.is_some())
        {
            return Err(bad(
                *at,
                format!("owner {owner} is itself a sub-user: an owner is a credential's own user"),
            ));
        }
    }
    Ok(Checked {
        hashes,
        users: seen.iter().map(|user| UserId::from_key(user)).collect(),
    })
}

/// Capture the users of export file `path` into `store`, each row as it was: its text, role,
/// name, times, conversation, birth clock, decay and activation (never recomputed), its warm
/// listing and exclusion; then each user's clock and owner link. Rows get this store's ids, in
/// the exported order.
///
/// All or nothing: the whole file is checked first ([`check_export`]: every message whole,
/// decay and heat in range, each user new here with a user line whose clock is not behind its
/// rows, no owner that is a sub-user), and it is read again line by line against what was
/// checked; if anything fails while it is written (a message that does not chunk as it was
/// stored, the file changed, the store), what was written is purged again. `progress` is called
/// after every batch.
pub fn import(
    store: &Store,
    dictionary: &Dictionary,
    path: &Path,
    mut progress: impl FnMut(&ImportSummary),
) -> Result<ImportSummary, ImportError> {
    let seal = std::hash::RandomState::new();
    let checked = check_export(store, path, &seal)?;
    match write_export(
        store,
        dictionary,
        path,
        &seal,
        &checked.hashes,
        &mut progress,
    ) {
        Ok(summary) => Ok(summary),
        Err(err) => {
            for &user in &checked.users {
                if present(store, user)? {
                    store.purge_user(user)?;
                }
            }
            Err(ImportError::RolledBack(Box::new(err)))
        }
    }
}

/// The second pass of [`import`]: the messages, a batch at a time, then the users' clocks and
/// owners, each line checked against the first pass's `hashes`.
fn write_export(
    store: &Store,
    dictionary: &Dictionary,
    path: &Path,
    seal: &std::hash::RandomState,
    hashes: &[u64],
    progress: &mut dyn FnMut(&ImportSummary),
) -> Result<ImportSummary, ImportError> {
    let bad = |line: usize, reason: String| ImportError::Bad {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let changed = |line| bad(line, "the file changed while it was imported".into());
    let capturer = Capturer::new(dictionary);
    let mut summary = ImportSummary::default();
    let mut batch: Vec<NewMessage> = Vec::new();
    let mut chunks: Vec<(usize, ExportedRow)> = Vec::new();
    let flush = |batch: &mut Vec<NewMessage>,
                 summary: &mut ImportSummary,
                 progress: &mut dyn FnMut(&ImportSummary)|
     -> Result<(), ImportError> {
        let ids = store.write_captures(batch)?;
        summary.messages += batch.len() as u64;
        summary.rows += ids.iter().map(|r| r.len() as u64).sum::<u64>();
        batch.clear();
        progress(summary);
        Ok(())
    };
    let mut lines = 0;
    for line in exported_lines(path, seal)? {
        let (at, hash, line) = line?;
        if hashes.get(lines) != Some(&hash) {
            return Err(changed(at));
        }
        lines += 1;
        match line {
            Exported::Row(row) => {
                let whole = row.chunk + 1 == row.chunks;
                chunks.push((at, *row));
                if whole {
                    batch.push(
                        moved_message(&capturer, std::mem::take(&mut chunks))
                            .map_err(|(at, reason)| bad(at, reason))?,
                    );
                    if batch.len() == INGEST_BATCH_MESSAGES {
                        flush(&mut batch, &mut summary, progress)?;
                    }
                }
            }
            Exported::User(user) => {
                flush(&mut batch, &mut summary, progress)?;
                let id = UserId::from_key(&user.user);
                store.advance_clock(id, user.clock)?;
                if let Some(owner) = user.owner {
                    store.link_owner(id, UserId(owner))?;
                }
                summary.users += 1;
            }
        }
    }
    if lines != hashes.len() {
        return Err(changed(lines));
    }
    flush(&mut batch, &mut summary, progress)?;
    Ok(summary)
}

/// The message whose exported rows are `chunks` (whole, in order), prepared as a capture of
/// its text that keeps the exported state; refused (with the line) when the text does not
/// chunk as it was stored.
fn moved_message(
    capturer: &Capturer<'_>,
    chunks: Vec<(usize, ExportedRow)>,
) -> Result<NewMessage, (usize, String)> {
    let (at, first) = &chunks[0];
    let message = Message {
        user_key: first.user.clone(),
        conversation: first.conversation.clone(),
        role: first.role,
        name: first.name.clone(),
        timestamp_ms: first.timestamp_ms,
        source_turn: first.source_turn.clone(),
        text: chunks.iter().map(|(_, row)| row.text.as_str()).collect(),
    };
    let mut prepared = capturer
        .prepare(&message)
        .ok_or((*at, "an empty message".to_owned()))?;
    let texts_match = prepared.chunks.len() == chunks.len()
        && prepared
            .chunks
            .iter()
            .zip(&chunks)
            .all(|(new, (_, old))| new.text == old.text);
    if !texts_match {
        return Err((
            *at,
            format!(
                "the message does not chunk as it was stored ({} chunks here, {} exported): an export from another tokenizer?",
                prepared.chunks.len(),
                chunks.len()
            ),
        ));
    }
    prepared.decay = first.decay;
    prepared.moved = Some(Moved {
        birth_clock: first.birth_clock,
        chunks: chunks
            .iter()
            .map(|(_, row)| MovedChunk {
                activation: Activation {
                    last_clock: row.last_clock,
                    peak: row.peak,
                    decay: row.decay,
                },
                warm: row.warm,
                excluded: row.excluded,
            })
            .collect(),
    });
    Ok(prepared)
}
