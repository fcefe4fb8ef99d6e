//! The command line: one file per command group (`serve`; the data directory's commands in
//! `data`; `dict`; `bench`; `eval`), each command's arguments beside the function that runs it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::builder::TypedValueParser as _;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use perpetuity::config;
use perpetuity::datasets::Format;
use perpetuity::dictionary::{self, Dictionary};
use perpetuity::ingest::IngestSummary;
use perpetuity::memory::Memory;
use perpetuity::store::StoreOptions;

mod bench;
mod data;
mod dict;
mod eval;
mod serve;

#[derive(Parser)]
#[command(name = "perpetuity", version, about = "A memory proxy for LLM agents")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy on embedded defaults (local data dir, the bundled dictionary).
    Serve(serve::ServeArgs),
    /// Bulk-capture a public benchmark file; each conversation or question becomes a user.
    Ingest(data::IngestArgs),
    /// Retrieval quality on a benchmark file: pooled memory against BM25 and isolated memories.
    Eval(eval::EvalArgs),
    /// Render the frame a question would get, in probe mode: nothing is captured, no
    /// activation is written. Prints each message with its token count and what the cap left out.
    Frame(data::FrameArgs),
    /// Write stored rows as JSON lines, in capture order.
    Export(data::ExportArgs),
    /// A consistent backup of a data directory into the new folder DEST (the store, the
    /// dictionaries it names, the server secret; docs/scale-out.md). With `serve` holding the
    /// data directory, the server takes it (`POST /admin/backup`, with the admin token) while
    /// it keeps capturing.
    Backup(data::BackupArgs),
    /// Make the new data directory DIR from a backup, then open it (building its arena) and
    /// check its integrity; exit 0 clean, 1 violations.
    Restore(data::RestoreArgs),
    /// Capture the users of a `perpetuity export` file into a data directory, each row as it
    /// was (activation, warm listing, exclusion, and the user's clock and owner link;
    /// docs/scale-out.md). A user that already has rows here is refused; a bad file imports
    /// nothing.
    Import(data::ImportArgs),
    /// Recompute every invariant of a store; exit 0 clean, 1 violations, 2 could not run.
    Integrity(data::IntegrityArgs),
    /// Remove a user's whole memory, then compact so its bytes are gone from disk.
    Purge(data::PurgeArgs),
    /// Exclude rows from a user's recall: they stay stored, and retrieval, the frame and the
    /// memory tools pass over them (`--undo` includes them again). Prints the user's
    /// exclusions; with no rows and no conversation, only prints them.
    Exclude(data::ExcludeArgs),
    /// Inspect dictionaries.
    #[command(subcommand)]
    Dict(dict::DictCommand),
    /// Benchmarks that print figures.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

/// `--format`'s parser: one of the dataset formats' names.
fn format_parser() -> impl clap::builder::TypedValueParser<Value = Format> {
    clap::builder::PossibleValuesParser::new(Format::ALL.map(Format::name))
        .map(|name| Format::named(&name).expect("a listed format"))
}

/// Parse the command line and run the command it names.
pub fn run() -> anyhow::Result<()> {
    private_files();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let matches = Cli::command().get_matches();
    // `serve --config FILE`: the file's values become the defaults of a second parse, so clap
    // applies the one precedence rule (command line, environment, file, built-in default).
    let (matches, file) = match serve::SettingsFile::read(&matches)? {
        Some(file) => (
            Cli::command()
                .mut_subcommand("serve", |serve| file.defaults(serve))
                .get_matches(),
            Some(file),
        ),
        None => (matches, None),
    };
    serve::warn_of_a_visible_token(&matches);
    match Cli::from_arg_matches(&matches)?.command {
        Command::Serve(args) => serve::run(args, file),
        Command::Ingest(args) => data::ingest(args),
        Command::Eval(args) => eval::eval(args),
        Command::Frame(args) => data::frame(args),
        Command::Export(args) => data::export(args),
        Command::Import(args) => data::import(args),
        Command::Backup(args) => data::backup(args),
        Command::Restore(args) => data::restore(args),
        Command::Integrity(args) => data::integrity(args),
        Command::Purge(args) => data::purge(args),
        Command::Exclude(args) => data::exclude(args),
        Command::Dict(command) => dict::run(command),
        Command::Bench(command) => bench::run(command),
    }
}

#[derive(clap::Args)]
struct DataArgs {
    /// Data directory.
    #[arg(long = "data", env = "PERPETUITY_DATA", default_value = config::DEFAULT_DATA_DIR)]
    dir: PathBuf,
    /// fsync the write-ahead log on every write (survives power loss, slower).
    #[arg(long, env = "PERPETUITY_SYNC_WRITES")]
    sync_writes: bool,
    /// Store blocks uncompressed, so a search of the data directory's bytes finds stored text
    /// (the purge and secrets tests).
    #[arg(long, env = "PERPETUITY_UNCOMPRESSED")]
    uncompressed: bool,
}

impl DataArgs {
    fn options(&self) -> StoreOptions {
        StoreOptions {
            sync_writes: self.sync_writes,
            compression: !self.uncompressed,
        }
    }

    /// Refuse a data directory that does not exist (for commands that only read or remove).
    fn existing(&self) -> anyhow::Result<&Path> {
        anyhow::ensure!(
            self.dir.join("CURRENT").is_file(),
            "no store in {} (expected a data directory made by `perpetuity serve` or `ingest`)",
            self.dir.display()
        );
        Ok(&self.dir)
    }
}

#[derive(clap::Args)]
struct DictionaryArgs {
    /// Folder holding dictionaries/<version>/ [default: the source tree's dictionaries/].
    #[arg(long, env = "PERPETUITY_DICTIONARIES")]
    dictionaries: Option<PathBuf>,
    /// Dictionary version of a new store [default: v4]; a store serves the version it
    /// records (set by `dict flip`), and another one given here is refused.
    #[arg(long, env = "PERPETUITY_DICTIONARY_VERSION")]
    dictionary_version: Option<String>,
}

impl DictionaryArgs {
    fn root(&self) -> PathBuf {
        self.dictionaries
            .clone()
            .unwrap_or_else(config::default_dictionaries_root)
    }

    fn load(&self) -> anyhow::Result<Dictionary> {
        let started = Instant::now();
        let version = self
            .dictionary_version
            .as_deref()
            .unwrap_or(dictionary::DEFAULT_VERSION);
        let dict = Dictionary::load_version(&self.root(), version)?;
        log_dictionary(&dict, started);
        Ok(dict)
    }

    fn open(&self, data: &DataArgs) -> anyhow::Result<Memory> {
        let started = Instant::now();
        // As the crate's error, which `is_held_elsewhere` reads.
        let memory = Memory::open(
            &data.dir,
            &self.root(),
            self.dictionary_version.as_deref(),
            &data.options(),
        )
        .map_err(perpetuity::error::Error::from)?;
        log_dictionary(&memory.dictionary, started);
        Ok(memory)
    }
}

fn log_dictionary(dict: &Dictionary, started: Instant) {
    tracing::info!(
        version = dict.version(),
        rows = dict.rows(),
        dims = dict.dims(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "dictionary loaded"
    );
}

/// Make every file and folder this process creates its owner's alone, whatever umask it
/// inherited: the store's files (RocksDB creates them with the process's umask) and the arena
/// hold turns verbatim, and nearly every command opens or makes a data directory.
fn private_files() {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
}

/// Print progress about once a second on stderr.
fn progress_printer(label: &'static str) -> impl FnMut(&IngestSummary, usize) {
    let mut last = Instant::now();
    move |summary, total| {
        if last.elapsed().as_secs_f64() >= 1.0 || summary.messages as usize == total {
            last = Instant::now();
            eprintln!(
                "{label}: {}/{} messages, {} rows, {:.0} rows/s",
                summary.messages,
                total,
                summary.rows,
                summary.rows_per_second()
            );
        }
    }
}

/// Whether opening a data directory failed because another process holds it.
fn is_held_elsewhere(err: &anyhow::Error) -> bool {
    matches!(
        err.downcast_ref::<perpetuity::error::Error>(),
        Some(perpetuity::error::Error::Store(store)) if store.is_held_elsewhere()
    )
}
