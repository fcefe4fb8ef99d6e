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
    /// Class: client. A user in the file already has rows here; nothing was imported.
    #[error(
        "user {user:?} already has rows in this store: purge it here first, or import it into another"
    )]
    Present { user: String },
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

/// The lines of export file `path`, parsed, each with its line number.
fn exported_lines(
    path: &Path,
) -> Result<impl Iterator<Item = Result<(usize, Exported), ImportError>> + '_, ImportError> {
    let read = |source| ImportError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    Ok(std::io::BufReader::new(file)
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.as_ref().is_ok_and(|l| l.trim().is_empty()))
        .map(move |(at, line)| {
            let line = line.map_err(read)?;
            let parsed = serde_json::from_str(&line).map_err(|err| ImportError::Bad {
                path: path.to_path_buf(),
                line: at + 1,
                reason: format!("not a line of `perpetuity export`: {err}"),
            })?;
            Ok((at + 1, parsed))
        }))
}

/// Capture the users of export file `path` into `store`, each row as it was: its text, role,
/// name, times, conversation, birth clock, decay and activation (never recomputed), its warm
/// listing and exclusion; then each user's clock and owner link. Rows get this store's ids, in
/// the exported order. The whole file is checked first (every message whole, no user already
/// here), so a bad file imports nothing. `progress` is called after every batch.
pub fn import(
    store: &Store,
    dictionary: &Dictionary,
    path: &Path,
    mut progress: impl FnMut(&ImportSummary),
) -> Result<ImportSummary, ImportError> {
    let bad = |line: usize, reason: String| ImportError::Bad {
        path: path.to_path_buf(),
        line,
        reason,
    };
    // First pass: every message whole and in order, and no user already stored here.
    let mut users = HashSet::new();
    let mut open: Option<(String, u64, u16, u16)> = None;
    let mut last = 0;
    for line in exported_lines(path)? {
        let (at, line) = line?;
        last = at;
        match line {
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
                if row.chunk != expected.0 || row.chunks != expected.1 {
                    return Err(bad(
                        at,
                        format!(
                            "chunk {} of {} where chunk {} of {} was due",
                            row.chunk, row.chunks, expected.0, expected.1
                        ),
                    ));
                }
                open = (row.chunk + 1 < row.chunks)
                    .then(|| (row.user.clone(), row.message, row.chunk + 1, row.chunks));
                if users.insert(row.user.clone())
                    && store.rows_of(UserId::from_key(&row.user)).next().is_some()
                {
                    return Err(ImportError::Present { user: row.user });
                }
            }
            Exported::User(user) if user.kind == "user" => {}
            Exported::User(user) => {
                return Err(bad(at, format!("unknown line kind {:?}", user.kind)));
            }
        }
    }
    if open.is_some() {
        return Err(bad(last, "the file ends inside a message".into()));
    }

    // Second pass: the messages, a batch at a time, then the users' clocks and owners.
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
    for line in exported_lines(path)? {
        let (at, line) = line?;
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
                        flush(&mut batch, &mut summary, &mut progress)?;
                    }
                }
            }
            Exported::User(user) => {
                flush(&mut batch, &mut summary, &mut progress)?;
                let id = UserId::from_key(&user.user);
                store.advance_clock(id, user.clock)?;
                if let Some(owner) = user.owner {
                    store.link_owner(id, UserId(owner))?;
                }
                summary.users += 1;
            }
        }
    }
    flush(&mut batch, &mut summary, &mut progress)?;
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
