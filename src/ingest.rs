//! Bulk capture and export: many messages in, a user's rows out.

use std::io::Write;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::Serialize;

use crate::capture::{Capturer, Message};
use crate::dictionary::Dictionary;
use crate::store::{NewMessage, Row, Store, StoreError};
use crate::types::{Role, RowId, UserId};

/// Messages per write batch in bulk ingest. Each message is still all-or-nothing (a batch is
/// atomic); batching amortises the WAL write. Large enough to keep both cores busy preparing.
pub const INGEST_BATCH_MESSAGES: usize = 2048;

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

/// One exported row.
#[derive(Debug, Serialize)]
struct ExportedRow<'a> {
    row: u64,
    user: &'a str,
    conversation: &'a str,
    message: u64,
    chunk: u16,
    chunks: u16,
    role: Role,
    name: Option<&'a str>,
    timestamp_ms: Option<i64>,
    source_turn: Option<&'a str>,
    birth_clock: u64,
    text: &'a str,
}

fn write_row(out: &mut impl Write, user_key: &str, row: &Row) -> std::io::Result<()> {
    let exported = ExportedRow {
        row: row.id.0,
        user: user_key,
        conversation: &row.conversation,
        message: row.message.0,
        chunk: row.chunk,
        chunks: row.chunks,
        role: row.role,
        name: row.name.as_deref(),
        timestamp_ms: row.timestamp_ms,
        source_turn: row.source_turn.as_deref(),
        birth_clock: row.birth_clock,
        text: &row.text,
    };
    serde_json::to_writer(&mut *out, &exported)?;
    out.write_all(b"\n")
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

/// Write rows as JSON lines in capture order: one user's (by key), or everyone's. Returns the
/// number of rows written.
pub fn export(
    store: &Store,
    user_key: Option<&str>,
    out: &mut impl Write,
) -> Result<u64, ExportError> {
    let mut written = 0;
    match user_key {
        Some(key) => {
            for row in store.rows_of(UserId::from_key(key)) {
                write_row(out, key, &row?)?;
                written += 1;
            }
        }
        None => {
            let mut keys = std::collections::HashMap::new();
            for row in store.rows_since(RowId(0)) {
                let row = row?;
                let key = match keys.entry(row.user) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(store.user_key(row.user)?.unwrap_or_default())
                    }
                };
                write_row(out, key, &row)?;
                written += 1;
            }
        }
    }
    out.flush()?;
    Ok(written)
}
