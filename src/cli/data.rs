//! The commands over a data directory: ingest, frame, export, import, backup, restore,
//! integrity, purge and exclude.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;

use perpetuity::backup;
use perpetuity::config::AdminToken;
use perpetuity::datasets::{self, Format};
use perpetuity::engine::Engine;
use perpetuity::ingest::{self};
use perpetuity::integrity;
use perpetuity::memory::Memory;
use perpetuity::scan::kernels::{Ceiling, Kernels};
use perpetuity::store::Store;
use perpetuity::types::{RowId, UserId};

use super::*;

#[derive(clap::Args)]
pub struct IngestArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub dictionary: DictionaryArgs,
    /// The file's format.
    #[arg(long, value_parser = format_parser())]
    pub format: Format,
    /// The file.
    pub file: PathBuf,
}

pub fn ingest(
    IngestArgs {
        data,
        dictionary,
        format,
        file,
    }: IngestArgs,
) -> anyhow::Result<()> {
    ingest_file(&dictionary.open(&data)?, format, &file)
}

#[derive(clap::Args)]
pub struct FrameArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub dictionary: DictionaryArgs,
    /// The user's key (e.g. a LoCoMo sample id).
    #[arg(long)]
    pub user: String,
    /// The conversation being continued: rendered last, its recent stretch kept.
    #[arg(long)]
    pub conversation: Option<String>,
    /// Render time for the labels' ages, RFC 3339 (default: now).
    #[arg(long)]
    pub now: Option<String>,
    /// The budget's ceiling in tokens (the cap of the broadest question).
    #[arg(long, default_value_t = perpetuity::budget::Budget::default().ceiling)]
    pub ceiling: usize,
    /// Render as if the memory tools rode along.
    #[arg(long)]
    pub tools: bool,
    /// Print the frame as JSON.
    #[arg(long)]
    pub json: bool,
    /// The live question.
    pub question: String,
}

pub fn frame(
    FrameArgs {
        data,
        dictionary,
        user,
        conversation,
        now,
        ceiling,
        tools,
        json,
        question,
    }: FrameArgs,
) -> anyhow::Result<()> {
    let now_ms = match now {
        Some(text) => chrono::DateTime::parse_from_rfc3339(&text)
            .with_context(|| format!("--now {text:?} is not an RFC 3339 time"))?
            .timestamp_millis(),
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .context("the system clock is before 1970")?
            .as_millis() as i64,
    };
    data.existing()?;
    let memory = dictionary.open(&data)?;
    let config = perpetuity::recall::RecallConfig {
        budget: perpetuity::budget::Budget {
            ceiling,
            ..Default::default()
        },
        tools,
        ..Default::default()
    };
    print_frame(
        memory,
        &config,
        &user,
        conversation.as_deref(),
        now_ms,
        &question,
        json,
    )
}

#[derive(clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// Only this user's rows (the user's key, e.g. a LoCoMo sample id).
    #[arg(long)]
    pub user: Option<String>,
}

pub fn export(ExportArgs { data, user }: ExportArgs) -> anyhow::Result<()> {
    let store = Store::open(data.existing()?, &data.options())?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let rows = ingest::export(&store, user.as_deref(), &mut out)?;
    tracing::info!(rows, "exported");
    Ok(())
}

#[derive(clap::Args)]
pub struct ImportArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub dictionary: DictionaryArgs,
    /// The export file (JSON lines).
    pub file: PathBuf,
}

pub fn import(
    ImportArgs {
        data,
        dictionary,
        file,
    }: ImportArgs,
) -> anyhow::Result<()> {
    let memory = dictionary.open(&data)?;
    let started = Instant::now();
    let summary = ingest::import(&memory.store, &memory.dictionary, &file, |done| {
        eprintln!("imported {} messages, {} rows", done.messages, done.rows);
    })?;
    println!(
        "imported {} users: {} messages, {} rows in {:.2?}",
        summary.users,
        summary.messages,
        summary.rows,
        started.elapsed()
    );
    Ok(())
}

#[derive(clap::Args)]
pub struct BackupArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// The new folder the backup is written to.
    #[arg(long, value_name = "DEST")]
    pub to: PathBuf,
    /// The admin token of the server holding the data directory, when one does.
    #[arg(long, env = "PERPETUITY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<AdminToken>,
    #[command(flatten)]
    pub dictionary: DictionaryArgs,
}

pub fn backup(
    BackupArgs {
        data,
        to,
        admin_token,
        dictionary,
    }: BackupArgs,
) -> anyhow::Result<()> {
    data.existing()?;
    let manifest = match dictionary.open(&data) {
        Ok(memory) => backup::backup(&memory, &to)?,
        Err(err) if is_held_elsewhere(&err) => {
            let token = admin_token.filter(|t| !t.is_empty()).with_context(|| {
                format!(
                    "{} is held by a running server: give its admin token \
                     (--admin-token or PERPETUITY_ADMIN_TOKEN) to take the backup through it",
                    data.dir.display()
                )
            })?;
            backup::backup_through_server(&data.dir, &to, token.reveal())?
        }
        Err(err) => return Err(err),
    };
    println!(
        "backup in {}: every row below {} (dictionary {}{}), taken in {} ms",
        to.display(),
        manifest.rows_below,
        manifest.serving,
        manifest
            .dark
            .map(|dark| format!(", dark {dark}"))
            .unwrap_or_default(),
        manifest.elapsed_ms
    );
    Ok(())
}

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The backup's folder.
    #[arg(long, value_name = "DEST")]
    pub from: PathBuf,
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub dictionary: DictionaryArgs,
}

pub fn restore(
    RestoreArgs {
        from,
        data,
        dictionary,
    }: RestoreArgs,
) -> anyhow::Result<()> {
    let manifest = backup::restore(&from, &data.dir)?;
    println!(
        "restored {} into {} (every row below {}); checking it",
        from.display(),
        data.dir.display(),
        manifest.rows_below
    );
    let clean = check_integrity(&data, &dictionary, false)?;
    std::process::exit(if clean { 0 } else { 1 })
}

#[derive(clap::Args)]
pub struct IntegrityArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub dictionary: DictionaryArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn integrity(
    IntegrityArgs {
        data,
        dictionary,
        json,
    }: IntegrityArgs,
) -> anyhow::Result<()> {
    let code = match check_integrity(&data, &dictionary, json) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(err) => {
            eprintln!("integrity: could not run: {err:#}");
            2
        }
    };
    std::process::exit(code)
}

#[derive(clap::Args)]
pub struct PurgeArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub dictionary: DictionaryArgs,
    /// The user's key.
    #[arg(long)]
    pub user: String,
    /// The user is a credential's own (no `x-perpetuity-user`): purge every sub-user the
    /// proxy linked to it too.
    #[arg(long)]
    pub all_subusers: bool,
}

pub fn purge(
    PurgeArgs {
        data,
        dictionary,
        user,
        all_subusers,
    }: PurgeArgs,
) -> anyhow::Result<()> {
    data.existing()?;
    let (engine, _, _) = Engine::open(dictionary.open(&data)?, Kernels::detect(Ceiling::Native))?;
    let started = Instant::now();
    let purged = engine.purge(UserId::from_key(&user), all_subusers, |_| {})?;
    println!(
        "purged user {user:?} and {} sub-users: {} rows removed, compacted in {:.2?}",
        purged.sub_users.len(),
        purged.rows,
        started.elapsed()
    );
    Ok(())
}

#[derive(clap::Args)]
pub struct ExcludeArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub dictionary: DictionaryArgs,
    /// The user's key.
    #[arg(long)]
    pub user: String,
    /// Every row of this conversation, besides the ids given.
    #[arg(long)]
    pub conversation: Option<String>,
    /// Include the rows again.
    #[arg(long)]
    pub undo: bool,
    /// Row ids (a memory tool's item `#N` is row N).
    pub rows: Vec<u64>,
}

pub fn exclude(
    ExcludeArgs {
        data,
        dictionary,
        user,
        conversation,
        undo,
        rows,
    }: ExcludeArgs,
) -> anyhow::Result<()> {
    data.existing()?;
    let memory = dictionary.open(&data)?;
    let user_id = UserId::from_key(&user);
    if memory.store.user_key(user_id)?.is_none() {
        anyhow::bail!(
            "no memory for user {user:?} in {}",
            memory.store.path().display()
        );
    }
    let (engine, _, _) = Engine::open(memory, Kernels::detect(Ceiling::Native))?;
    let excluded = if rows.is_empty() && conversation.is_none() {
        engine.exclusions(user_id)?
    } else {
        let rows = rows.into_iter().map(RowId).collect();
        let done = engine.exclude(user_id, rows, conversation.as_deref(), !undo)?;
        println!(
            "{} {} of {} rows ({} were not the user's or already so)",
            if undo { "included" } else { "excluded" },
            done.changed.len(),
            done.asked,
            done.asked - done.changed.len()
        );
        done.excluded
    };
    let excluded: Vec<u64> = excluded.into_iter().map(|r| r.0).collect();
    println!(
        "user {user:?} excludes {} rows: {excluded:?}",
        excluded.len()
    );
    Ok(())
}

/// Open and catch up the arena, recall for one question in probe mode, print the frame.
fn print_frame(
    memory: Memory,
    config: &perpetuity::recall::RecallConfig,
    user_key: &str,
    conversation: Option<&str>,
    now_ms: i64,
    question: &str,
    json: bool,
) -> anyhow::Result<()> {
    let user = UserId::from_key(user_key);
    if memory.store.user_key(user)?.is_none() {
        anyhow::bail!(
            "no memory for user {user_key:?} in {}",
            memory.store.path().display()
        );
    }
    let (engine, _, _) = Engine::open(memory, Kernels::detect(Ceiling::Native))?;
    let scope = [user];
    let ask = perpetuity::recall::Ask::probe(&scope, conversation, question, now_ms);
    let recall = engine.generation().recall(&engine.kernels, config, &ask)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&recall)?);
        return Ok(());
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for message in &recall.frame.messages {
        let role = match message.role {
            perpetuity::frame::Side::User => "user",
            perpetuity::frame::Side::Assistant => "assistant",
        };
        writeln!(out, "--- {role} · {} tokens ---", message.tokens)?;
        writeln!(out, "{}", message.content)?;
    }
    let frame = &recall.frame;
    writeln!(
        out,
        "--- frame: {} tokens, cap {} (budget from the spread of the best {} of {} retrieved scores); {} turns shown ({} mandatory); left out by the cap: {} turns, {} tokens; {} rows would be reheated (probe: nothing written)",
        frame.tokens,
        frame.cap,
        config.depth.min(recall.retrieved.len()),
        recall.retrieved.len(),
        frame.rows.len(),
        frame.mandatory,
        frame.omitted.turns,
        frame.omitted.tokens,
        recall.reheated,
    )?;
    out.flush()?;
    Ok(())
}

fn ingest_file(memory: &Memory, format: Format, file: &Path) -> anyhow::Result<()> {
    let dataset = datasets::load(format, file)?;
    let mut present: Vec<&str> = dataset
        .messages
        .iter()
        .map(|m| m.user_key.as_str())
        .collect();
    present.sort_unstable();
    present.dedup();
    let mut already = Vec::new();
    for key in &present {
        if memory.store.user_key(UserId::from_key(key))?.is_some() {
            already.push(*key);
        }
    }
    anyhow::ensure!(
        already.is_empty(),
        "{} user(s) of {} are already in {} (first: {}); purge them first or use another data dir",
        already.len(),
        file.display(),
        memory.store.path().display(),
        already[0]
    );
    let summary = ingest::ingest(
        &memory.store,
        &memory.dictionary,
        &dataset.messages,
        progress_printer("ingest"),
    )?;
    println!(
        "ingested {}: {} users, {} messages, {} rows, {} tokens in {:.2?} ({:.0} rows/s)",
        file.display(),
        present.len(),
        summary.messages,
        summary.rows,
        summary.tokens,
        summary.elapsed,
        summary.rows_per_second()
    );
    Ok(())
}

fn check_integrity(
    data: &DataArgs,
    dictionary: &DictionaryArgs,
    json: bool,
) -> anyhow::Result<bool> {
    data.existing()?;
    let memory = dictionary.open(data)?;
    let (store, dict) = (&memory.store, &memory.dictionary);
    let started = Instant::now();
    let mut report = integrity::check(store, dict)?;
    // The arena is derived from the store: it is built and checked once the store is clean
    // (a damaged store is reported above, and an arena built from it would only repeat that).
    if report.is_clean() {
        integrity::check_arena_files(store, dict, &mut report)?;
    }
    let elapsed = started.elapsed();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for v in &report.violations {
            println!("{} [{} {}]: {}", v.check, v.cf, v.key, v.detail);
        }
        println!(
            "integrity: {} rows, {} users, {} violations, checked in {elapsed:.2?}",
            report.rows,
            report.users,
            report.violations.len()
        );
    }
    Ok(report.is_clean())
}
