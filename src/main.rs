//! The `perpetuity` binary: subcommands over the library.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};

use perpetuity::backup;
use perpetuity::bench;
use perpetuity::config::{self, AdminToken, ServeConfig};
use perpetuity::datasets::{self, Format};
use perpetuity::dictionary::derive::{derive, embed};
use perpetuity::dictionary::stats::FrequencyTable;
use perpetuity::dictionary::{self, Dictionary};
use perpetuity::engine::Engine;
use perpetuity::ingest::{self, IngestSummary};
use perpetuity::integrity;
use perpetuity::memory::{self as data_dir, Memory};
use perpetuity::proxy;
use perpetuity::scan::kernels::Kernels;
use perpetuity::store::{Store, StoreOptions};
use perpetuity::tokens::Tokenizer;
use perpetuity::types::{RowId, UserId};

/// A turn allocates and frees many small buffers (decoded rows, embeddings, frame text) on
/// every thread at once; mimalloc's per-thread heaps serve that with less work than the system
/// allocator (`docs/benchmarks.md`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "perpetuity", version, about = "A memory proxy for LLM agents")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy on embedded defaults (local data dir, the bundled dictionary).
    Serve {
        /// Address to listen on.
        #[arg(long, env = "PERPETUITY_LISTEN", default_value = config::DEFAULT_LISTEN)]
        listen: SocketAddr,
        /// Run every scan kernel in its scalar form (for diagnosis; slower).
        #[arg(long, env = "PERPETUITY_SCALAR_KERNELS")]
        scalar_kernels: bool,
        /// A provider's API base URL, `NAME=URL` with NAME one of openai, anthropic, gemini
        /// (repeatable; defaults: the real providers).
        #[arg(long, env = "PERPETUITY_UPSTREAMS", value_delimiter = ',', value_parser = parse_upstream)]
        upstream: Vec<(perpetuity::proxy::provider::Provider, String)>,
        /// The token the admin endpoints (`/admin/stats`, `/admin/integrity`, `/admin/purge`)
        /// require; without one they are disabled.
        #[arg(long, env = "PERPETUITY_ADMIN_TOKEN", hide_env_values = true)]
        admin_token: Option<AdminToken>,
        /// Requests to the providers (chat and passed through) served at once; more are refused with 503.
        #[arg(long, env = "PERPETUITY_MAX_CONCURRENT", default_value_t = 256)]
        max_concurrent: usize,
        /// A TOML settings file (README.md, "Configuration"); the command line and the environment
        /// override what it sets.
        #[arg(long, env = "PERPETUITY_CONFIG")]
        config: Option<PathBuf>,
        /// Offer the memory tools with chat requests (`--memory-tools false` turns them off).
        #[arg(long, env = "PERPETUITY_MEMORY_TOOLS", default_value_t = true, action = clap::ArgAction::Set)]
        memory_tools: bool,
        /// Upstream calls per reply when the model calls the memory tools; the last one has no
        /// tools, so the model must answer.
        #[arg(long, env = "PERPETUITY_TOOL_ROUNDS", default_value_t = proxy::rounds::DEFAULT_ROUNDS)]
        tool_rounds: usize,
        #[command(flatten)]
        data: DataArgs,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// Bulk-capture a public benchmark file; each conversation or question becomes a user.
    Ingest {
        #[command(flatten)]
        data: DataArgs,
        #[command(flatten)]
        dictionary: DictionaryArgs,
        /// The file's format.
        #[arg(long, value_enum)]
        format: Format,
        /// The file.
        file: PathBuf,
    },
    /// Retrieval quality on a benchmark file: pooled memory against BM25 and isolated memories.
    Eval {
        #[command(flatten)]
        args: perpetuity::eval::EvalArgs,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// Render the frame a question would get, in probe mode: nothing is captured, no
    /// activation is written. Prints each message with its token count and what the cap left out.
    Frame {
        #[command(flatten)]
        data: DataArgs,
        #[command(flatten)]
        dictionary: DictionaryArgs,
        /// The user's key (e.g. a LoCoMo sample id).
        #[arg(long)]
        user: String,
        /// The conversation being continued: rendered last, its recent stretch kept.
        #[arg(long)]
        conversation: Option<String>,
        /// Render time for the labels' ages, RFC 3339 (default: now).
        #[arg(long)]
        now: Option<String>,
        /// The budget's ceiling in tokens (the cap of the broadest question).
        #[arg(long, default_value_t = perpetuity::budget::Budget::default().ceiling)]
        ceiling: usize,
        /// Render as if the memory tools rode along.
        #[arg(long)]
        tools: bool,
        /// Print the frame as JSON.
        #[arg(long)]
        json: bool,
        /// The live question.
        question: String,
    },
    /// Write stored rows as JSON lines, in capture order.
    Export {
        #[command(flatten)]
        data: DataArgs,
        /// Only this user's rows (the user's key, e.g. a LoCoMo sample id).
        #[arg(long)]
        user: Option<String>,
    },
    /// A consistent backup of a data directory into the new folder DEST (the store, the
    /// dictionaries it names, the server secret; docs/scale-out.md). With `serve` holding the
    /// data directory, the server takes it (`POST /admin/backup`, with the admin token) while
    /// it keeps capturing.
    Backup {
        #[command(flatten)]
        data: DataArgs,
        /// The new folder the backup is written to.
        #[arg(long, value_name = "DEST")]
        to: PathBuf,
        /// The admin token of the server holding the data directory, when one does.
        #[arg(long, env = "PERPETUITY_ADMIN_TOKEN", hide_env_values = true)]
        admin_token: Option<AdminToken>,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// Make the new data directory DIR from a backup, then open it (building its arena) and
    /// check its integrity; exit 0 clean, 1 violations.
    Restore {
        /// The backup's folder.
        #[arg(long, value_name = "DEST")]
        from: PathBuf,
        #[command(flatten)]
        data: DataArgs,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// Capture the users of a `perpetuity export` file into a data directory, each row as it
    /// was (activation, warm listing, exclusion, and the user's clock and owner link;
    /// docs/scale-out.md). A user that already has rows here is refused; a bad file imports
    /// nothing.
    Import {
        #[command(flatten)]
        data: DataArgs,
        #[command(flatten)]
        dictionary: DictionaryArgs,
        /// The export file (JSON lines).
        file: PathBuf,
    },
    /// Recompute every invariant of a store; exit 0 clean, 1 violations, 2 could not run.
    Integrity {
        #[command(flatten)]
        data: DataArgs,
        #[command(flatten)]
        dictionary: DictionaryArgs,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a user's whole memory, then compact so its bytes are gone from disk.
    Purge {
        #[command(flatten)]
        data: DataArgs,
        #[command(flatten)]
        dictionary: DictionaryArgs,
        /// The user's key.
        #[arg(long)]
        user: String,
        /// The user is a credential's own (no `x-perpetuity-user`): purge every sub-user the
        /// proxy linked to it too.
        #[arg(long)]
        all_subusers: bool,
    },
    /// Exclude rows from a user's recall: they stay stored, and retrieval, the frame and the
    /// memory tools pass over them (`--undo` includes them again). Prints the user's
    /// exclusions; with no rows and no conversation, only prints them.
    Exclude {
        #[command(flatten)]
        data: DataArgs,
        #[command(flatten)]
        dictionary: DictionaryArgs,
        /// The user's key.
        #[arg(long)]
        user: String,
        /// Every row of this conversation, besides the ids given.
        #[arg(long)]
        conversation: Option<String>,
        /// Include the rows again.
        #[arg(long)]
        undo: bool,
        /// Row ids (a memory tool's item `#N` is row N).
        rows: Vec<u64>,
    },
    /// Inspect dictionaries.
    Dict {
        #[command(subcommand)]
        command: DictCommand,
    },
    /// Benchmarks that print figures.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

#[derive(Subcommand)]
enum DictCommand {
    /// Print the serving dictionary's header and, for a text, its tokens, terms and vector.
    Show {
        #[command(flatten)]
        dictionary: DictionaryArgs,
        /// A text to derive.
        #[arg(long)]
        text: Option<String>,
    },
    /// Upload the dictionary in PATH into the data directory and install it dark, then
    /// re-derive every stored row under it and build its arena (progress on stderr). With a
    /// server holding the data directory, use its `POST /admin/dictionary/install` instead.
    Install {
        #[command(flatten)]
        data: DataArgs,
        #[command(flatten)]
        dictionary: DictionaryArgs,
        /// The dictionary folder (dictionary.json, vectors.bin).
        path: PathBuf,
    },
    /// Make the installed, fully derived dark VERSION serve, in one atomic step; the retired
    /// version's arena is dropped. A half-derived version resumes its derivation first.
    Flip {
        #[command(flatten)]
        data: DataArgs,
        #[command(flatten)]
        dictionary: DictionaryArgs,
        /// The dark version to serve.
        version: String,
    },
    /// The data directory's dictionary versions and their states (serving, dark, deriving
    /// n/N, ready, retired).
    List {
        #[command(flatten)]
        data: DataArgs,
        #[command(flatten)]
        dictionary: DictionaryArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Scan throughput, query latency and two-stage fidelity over a synthetic pooled memory.
    Scan {
        /// Rows in the memory.
        #[arg(long, default_value_t = 100_000)]
        rows: usize,
        /// Users they are spread over (1: one scope holds every row, the worst case).
        #[arg(long, default_value_t = 1)]
        users: usize,
        /// Threads a query is spread over.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Queries timed.
        #[arg(long, default_value_t = 200)]
        queries: usize,
        /// Queries also answered by brute force to measure fidelity.
        #[arg(long, default_value_t = 20)]
        fidelity_queries: usize,
        /// Re-derive the store's installed dark dictionary version on a thread of its own
        /// while the benchmark runs (the queries' latency during a hot swap); its rate on
        /// stderr.
        #[arg(long)]
        during_rederive: bool,
        /// Print one JSON object (names in docs/benchmarks.md).
        #[arg(long)]
        json: bool,
        /// Where to put the store (default: a fresh temp folder, removed afterwards); a store
        /// that already holds rows is reused as it is.
        #[arg(long)]
        data: Option<PathBuf>,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// Top-10 agreement of the two-stage search with brute force (the same exact scorer over
    /// every row): LoCoMo questions, each in its user's scope and in the scope of every
    /// conversation pooled, and seeded synthetic queries over a synthetic pool.
    Fidelity {
        /// A LoCoMo file (e.g. locomo10.json) whose questions are asked; none: skipped.
        #[arg(long)]
        locomo: Option<PathBuf>,
        /// Rows of the synthetic pool (0: skipped).
        #[arg(long, default_value_t = 1_000_000)]
        rows: usize,
        /// Users the synthetic rows are spread over (1: one scope holds every row).
        #[arg(long, default_value_t = 1)]
        users: usize,
        /// Synthetic queries asked.
        #[arg(long, default_value_t = 200)]
        queries: usize,
        /// Where to put the synthetic store (default: a fresh temp folder, removed afterwards);
        /// a store that already holds rows is reused as it is.
        #[arg(long)]
        data: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// A backup taken while threads keep capturing: its time, the capture latency before and
    /// during it, and the time to restore it (files only).
    Backup {
        /// Rows in the memory (made once, then reused with `--data`).
        #[arg(long, default_value_t = 100_000)]
        rows: usize,
        /// Users they are spread over.
        #[arg(long, default_value_t = 1_000)]
        users: usize,
        /// Threads capturing one message at a time meanwhile.
        #[arg(long, default_value_t = 2)]
        writers: usize,
        /// Capture this long before the backup, and at least this long from its start.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Where to put the store (default: a fresh temp folder, removed afterwards); a store
        /// that already holds rows is reused (it grows by the captures). The backup and the
        /// restored folder are made beside it and removed afterwards.
        #[arg(long)]
        data: Option<PathBuf>,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// Capture rate (rows/s) into a fresh store with the WAL on.
    Ingest {
        /// Messages to capture.
        #[arg(long, default_value_t = 200_000)]
        messages: usize,
        /// Users they are spread over.
        #[arg(long, default_value_t = 100)]
        users: usize,
        /// Where to put the store (default: a fresh folder under the system temp dir, removed
        /// afterwards).
        #[arg(long)]
        data: Option<PathBuf>,
        /// fsync the WAL on every batch.
        #[arg(long)]
        sync: bool,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// What the proxy adds to a streamed call against a local upstream: time to first byte and
    /// total, direct, through the proxy, and with recall off.
    Proxy {
        /// Rows the store holds, pooled over `--users` (one user, one scope: the worst case).
        #[arg(long, default_value_t = 0)]
        rows: usize,
        /// Users (credentials) the rows are spread over; the requests take turns among them.
        #[arg(long, default_value_t = 1)]
        users: usize,
        /// Requests in flight at once.
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// Requests per way of calling.
        #[arg(long, default_value_t = 500)]
        requests: usize,
        /// Where to put the store (reused when it already holds the benchmark user's rows).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// Peak resident memory while large request bodies (many tiny messages, the worst case
    /// for a parsed JSON tree) pass through the proxy at once, against the bodies' size.
    Bodies {
        /// Bodies in flight at once.
        #[arg(long, default_value_t = 8)]
        concurrent: usize,
        /// Size of each body, in MiB.
        #[arg(long, default_value_t = 30)]
        mib: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// The share of each forwarded request that is a common prefix with the conversation's
    /// previous one (what a provider's prompt cache can serve), over a scripted agent session
    /// in Claude Code's shape: as the client sent it (a direct call) and through the proxy.
    Prefix {
        /// Turns of the session.
        #[arg(long, default_value_t = 6)]
        turns: usize,
        /// Tool steps per turn (each one more request).
        #[arg(long, default_value_t = 5)]
        steps: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
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
    /// Folder holding dictionaries/<version>/ [default: $PERPETUITY_DICTIONARIES, else the
    /// source tree's dictionaries/].
    #[arg(long)]
    dictionaries: Option<PathBuf>,
    /// Dictionary version of a new store [default: v3]; a store serves the version it
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
        let memory = Memory::open(
            &data.dir,
            &self.root(),
            self.dictionary_version.as_deref(),
            &data.options(),
        )?;
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

fn main() -> anyhow::Result<()> {
    private_files();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let matches = Cli::command().get_matches();
    match Cli::from_arg_matches(&matches)?.command {
        Command::Serve {
            mut listen,
            mut scalar_kernels,
            upstream,
            mut admin_token,
            mut max_concurrent,
            mut memory_tools,
            mut tool_rounds,
            config,
            mut data,
            mut dictionary,
        } => {
            let descriptors = proxy::raise_descriptor_limit();
            tracing::info!(?descriptors, "open-descriptor limit");
            let mut proxy_config = proxy::ProxyConfig::default();
            if let Some(path) = config {
                let file = config::FileConfig::load(&path)?;
                let given = matches
                    .subcommand_matches("serve")
                    .expect("the serve command's own matches");
                let given = |id: &str| given_explicitly(given, id);
                overlay(&mut listen, file.listen, given("listen"));
                overlay(
                    &mut max_concurrent,
                    file.max_concurrent,
                    given("max_concurrent"),
                );
                overlay(
                    &mut scalar_kernels,
                    file.scalar_kernels,
                    given("scalar_kernels"),
                );
                overlay(&mut data.dir, file.data.clone(), given("dir"));
                overlay(
                    &mut data.sync_writes,
                    file.sync_writes,
                    given("sync_writes"),
                );
                overlay(
                    &mut data.uncompressed,
                    file.uncompressed,
                    given("uncompressed"),
                );
                overlay(
                    &mut dictionary.dictionary_version,
                    file.dictionary_version.clone().map(Some),
                    given("dictionary_version"),
                );
                dictionary.dictionaries = dictionary.dictionaries.or(file.dictionaries.clone());
                overlay(&mut memory_tools, file.memory_tools, given("memory_tools"));
                overlay(&mut tool_rounds, file.tool_rounds, given("tool_rounds"));
                admin_token = admin_token.or(file.admin_token.clone());
                proxy_config
                    .overlay(&file)
                    .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
            }
            let kernels = Kernels::detect(scalar_kernels);
            tracing::info!(kernels = %kernels.describe(), forced_scalar = scalar_kernels, "scan kernels chosen");
            let config = ServeConfig {
                listen,
                data_dir: data.dir.clone(),
                dictionaries_root: dictionary.root(),
            };
            proxy_config.admin_token = admin_token.filter(|t| !t.is_empty());
            proxy_config.max_concurrent = max_concurrent;
            proxy_config.tools = memory_tools;
            proxy_config.tool_rounds = tool_rounds;
            for (provider, url) in upstream {
                proxy_config.set_upstream(provider, url);
            }
            let memory = dictionary.open(&data)?;
            serve(config, proxy_config, kernels, memory)
        }
        Command::Ingest {
            data,
            dictionary,
            format,
            file,
        } => ingest_file(&dictionary.open(&data)?, format, &file),
        Command::Eval { args, dictionary } => {
            let scratch;
            let dir = match &args.data {
                Some(dir) => dir.clone(),
                None => {
                    scratch = perpetuity::eval::ScratchDir::new("pooled")?;
                    scratch.path().to_path_buf()
                }
            };
            let memory = dictionary.open(&DataArgs {
                dir,
                sync_writes: false,
                uncompressed: false,
            })?;
            let report = perpetuity::eval::run_sharded(
                &memory,
                args.format,
                &args.file,
                &args.ks,
                args.agent_session,
                args.shards,
                |p| eprintln!("eval: {p}"),
            )?;
            if let Some(path) = &args.per_question {
                let mut lines = String::new();
                for ranks in &report.per_question {
                    lines.push_str(&serde_json::to_string(ranks)?);
                    lines.push('\n');
                }
                std::fs::write(path, lines)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render(args.by_category));
            }
            Ok(())
        }
        Command::Frame {
            data,
            dictionary,
            user,
            conversation,
            now,
            ceiling,
            tools,
            json,
            question,
        } => {
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
        Command::Export { data, user } => {
            let store = Store::open(data.existing()?, &data.options())?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let rows = ingest::export(&store, user.as_deref(), &mut out)?;
            tracing::info!(rows, "exported");
            Ok(())
        }
        Command::Import {
            data,
            dictionary,
            file,
        } => {
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
        Command::Backup {
            data,
            to,
            admin_token,
            dictionary,
        } => {
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
        Command::Restore {
            from,
            data,
            dictionary,
        } => {
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
        Command::Integrity {
            data,
            dictionary,
            json,
        } => {
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
        Command::Purge {
            data,
            dictionary,
            user,
            all_subusers,
        } => {
            data.existing()?;
            let (engine, _, _) = Engine::open(dictionary.open(&data)?, Kernels::detect(false))?;
            let started = Instant::now();
            let purged = engine.purge(UserId::from_key(&user), all_subusers)?;
            println!(
                "purged user {user:?} and {} sub-users: {} rows removed, compacted in {:.2?}",
                purged.sub_users.len(),
                purged.rows,
                started.elapsed()
            );
            Ok(())
        }
        Command::Exclude {
            data,
            dictionary,
            user,
            conversation,
            undo,
            rows,
        } => {
            data.existing()?;
            let memory = dictionary.open(&data)?;
            let user_id = UserId::from_key(&user);
            if memory.store.user_key(user_id)?.is_none() {
                anyhow::bail!(
                    "no memory for user {user:?} in {}",
                    memory.store.path().display()
                );
            }
            let (engine, _, _) = Engine::open(memory, Kernels::detect(false))?;
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
        Command::Dict {
            command: DictCommand::Show { dictionary, text },
        } => show(&dictionary.load()?, text.as_deref()),
        Command::Dict {
            command:
                DictCommand::Install {
                    data,
                    dictionary,
                    path,
                },
        } => {
            data.existing()?;
            let (engine, _, _) = Engine::open(dictionary.open(&data)?, Kernels::detect(false))?;
            eprintln!("installed {} dark", engine.install(&path)?);
            prepare_dark(&engine)
        }
        Command::Dict {
            command:
                DictCommand::Flip {
                    data,
                    dictionary,
                    version,
                },
        } => {
            data.existing()?;
            let memory = dictionary.open(&data)?;
            memory
                .store
                .dark_dictionary()
                .filter(|d| d.version() == version)
                .with_context(|| format!("{version} is not the installed dark version"))?;
            let (engine, _, _) = Engine::open(memory, Kernels::detect(false))?;
            prepare_dark(&engine)?;
            let started = Instant::now();
            let flipped = engine.flip(&version)?;
            println!(
                "serving {version} (retired {}), flipped in {:.2?}",
                flipped.retired,
                started.elapsed()
            );
            Ok(())
        }
        Command::Dict {
            command:
                DictCommand::List {
                    data,
                    dictionary,
                    json,
                },
        } => {
            data.existing()?;
            let listed = perpetuity::swap::list(&dictionary.open(&data)?.store)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&listed)?);
            } else {
                for version in listed {
                    println!("{version}");
                }
            }
            Ok(())
        }
        Command::Bench {
            command:
                BenchCommand::Scan {
                    rows,
                    users,
                    threads,
                    queries,
                    fidelity_queries,
                    during_rederive,
                    json,
                    data,
                    dictionary,
                },
        } => bench_scan(
            bench::ScanSettings {
                rows,
                users,
                threads,
                queries,
                fidelity_queries,
            },
            data,
            json,
            during_rederive,
            &dictionary,
        ),
        Command::Bench {
            command:
                BenchCommand::Fidelity {
                    locomo,
                    rows,
                    users,
                    queries,
                    data,
                    json,
                    dictionary,
                },
        } => bench_fidelity(
            locomo.as_deref(),
            bench::ScanSettings {
                rows,
                users,
                threads: rayon::current_num_threads(),
                queries,
                fidelity_queries: queries,
            },
            data,
            json,
            &dictionary,
        ),
        Command::Bench {
            command:
                BenchCommand::Ingest {
                    messages,
                    users,
                    data,
                    sync,
                    dictionary,
                },
        } => bench_ingest(messages, users, data, sync, &dictionary),
        Command::Bench {
            command:
                BenchCommand::Backup {
                    rows,
                    users,
                    writers,
                    seconds,
                    json,
                    data,
                    dictionary,
                },
        } => bench_backup(rows, users, writers, seconds, json, data, &dictionary),
        Command::Bench {
            command:
                BenchCommand::Proxy {
                    rows,
                    users,
                    concurrency,
                    requests,
                    data,
                    json,
                    dictionary,
                },
        } => bench_proxy(
            rows,
            proxy::bench::Calls {
                users,
                concurrency,
                requests,
            },
            data,
            json,
            &dictionary,
        ),
        Command::Bench {
            command:
                BenchCommand::Prefix {
                    turns,
                    steps,
                    json,
                    dictionary,
                },
        } => bench_prefix(turns, steps, json, &dictionary),
        Command::Bench {
            command:
                BenchCommand::Bodies {
                    concurrent,
                    mib,
                    json,
                    dictionary,
                },
        } => bench_bodies(concurrent, mib, json, &dictionary),
    }
}

/// A proxy's state over the fresh store in `place`.
fn fresh_state(
    place: &BenchDir,
    dictionary: &DictionaryArgs,
    config: proxy::ProxyConfig,
) -> anyhow::Result<Arc<proxy::State>> {
    let memory = dictionary.open(&DataArgs {
        dir: place.dir.clone(),
        sync_writes: false,
        uncompressed: false,
    })?;
    let secret = proxy::identity::Secret::load_or_create(&place.dir)?;
    let (engine, _, _) = Engine::open(memory, Kernels::detect(false))?;
    Ok(Arc::new(proxy::State::new(engine, secret, config)))
}

/// `perpetuity bench bodies`: peak resident memory while large bodies pass through a proxy
/// over a fresh store (`proxy::bench::bodies`).
fn bench_bodies(
    concurrent: usize,
    mib: usize,
    json: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        concurrent >= 1 && mib >= 1,
        "--concurrent and --mib must be at least 1"
    );
    let place = BenchDir::new(None, "bodies", Existing::Refuse)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let report = runtime.block_on(async {
        let upstream = proxy::bench::local_upstream().await?;
        let config = proxy::ProxyConfig {
            openai: format!("http://{upstream}"),
            body_limit: (mib + 1) << 20,
            ..proxy::ProxyConfig::default()
        };
        let state = fresh_state(&place, dictionary, config)?;
        anyhow::Ok(proxy::bench::bodies(state, concurrent, mib << 20).await?)
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "bench bodies: {} concurrent bodies of {:.1} MiB ({} messages each), answered {:?}",
            report.concurrent,
            report.body_bytes as f64 / f64::from(1 << 20),
            report.messages,
            report.statuses
        );
        println!(
            "  resident before {:.0} MiB, peak {:.0} MiB: {:.0} MiB per body in flight ({:.1}x its size); {:.2} s",
            report.resident_before_mib,
            report.resident_peak_mib,
            report.per_body_mib,
            report.per_body_ratio,
            report.seconds
        );
    }
    Ok(())
}

/// `perpetuity bench prefix`: the session through a proxy over a fresh store
/// (`proxy::prefix`).
fn bench_prefix(
    turns: usize,
    steps: usize,
    json: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        turns >= 2 && steps >= 1,
        "--turns must be at least 2 and --steps at least 1"
    );
    let place = BenchDir::new(None, "prefix", Existing::Refuse)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let report = runtime.block_on(async {
        let (upstream, received) = proxy::prefix::recording_upstream().await?;
        let config = proxy::ProxyConfig {
            anthropic: format!("http://{upstream}"),
            ..proxy::ProxyConfig::default()
        };
        let state = fresh_state(&place, dictionary, config)?;
        anyhow::Ok(proxy::prefix::measure(state, received, turns, steps).await?)
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "bench prefix: {} turns of {} tool steps, {} requests",
            report.turns, report.steps, report.requests
        );
        for (label, shares) in [("direct", &report.direct), ("proxy", &report.proxy)] {
            println!(
                "  {label:<7} prefix share in tool loops {:.3}, across turns {:.3}; mean input {:.0} bytes",
                shares.in_loop, shares.across_turns, shares.mean_input_bytes
            );
        }
        println!(
            "  in tool loops, proxy / direct: {:.3}",
            report.in_loop_ratio
        );
    }
    Ok(())
}

/// `NAME=URL` of `--upstream`.
fn parse_upstream(text: &str) -> Result<(perpetuity::proxy::provider::Provider, String), String> {
    let (name, url) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=URL"))?;
    let provider = perpetuity::proxy::provider::Provider::from_name(name.trim())
        .ok_or_else(|| format!("unknown provider {name:?} (openai, anthropic or gemini)"))?;
    let url = url.trim();
    config::check_upstream_url(url)?;
    Ok((provider, url.to_owned()))
}

/// Whether argument `id` was given on the command line or by the environment (not left at its
/// default), so it wins over the config file.
fn given_explicitly(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// Take the config file's `value` for `target` unless the argument was `given` explicitly.
fn overlay<T>(target: &mut T, value: Option<T>, given: bool) {
    if let (Some(value), false) = (value, given) {
        *target = value;
    }
}

fn serve(
    config: ServeConfig,
    proxy_config: proxy::ProxyConfig,
    kernels: Kernels,
    memory: Memory,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        tracing::info!(
            listen = %config.listen,
            data = %config.data_dir.display(),
            dictionaries = %config.dictionaries_root.display(),
            version = memory.dictionary.version(),
            "serving"
        );
        let started = Instant::now();
        let (engine, opened, caught) = Engine::open(memory, kernels)?;
        tracing::info!(
            opened = ?opened,
            rows = engine.stats().arena_rows,
            caught_up = caught,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "arena ready"
        );
        let secret = proxy::identity::Secret::load_or_create(&config.data_dir)
            .context("loading the server secret")?;
        tracing::info!(
            openai = proxy_config.openai,
            anthropic = proxy_config.anthropic,
            gemini = proxy_config.gemini,
            "upstreams"
        );
        let state = Arc::new(proxy::State::new(engine, secret, proxy_config));
        // Where this server listens, for `perpetuity backup` run beside it.
        let listening = config.data_dir.join(data_dir::LISTENING_FILE);
        let address = listener.local_addr().context("the listening address")?;
        std::fs::write(&listening, format!("{address}\n"))
            .with_context(|| format!("writing {}", listening.display()))?;
        tokio::select! {
            never = proxy::serve(listener, state) => match never {},
            _ = tokio::signal::ctrl_c() => {
                tracing::info!("shutting down");
                if let Err(err) = std::fs::remove_file(&listening) {
                    tracing::warn!(%err, path = %listening.display(), "could not remove the listening file");
                }
                Ok(())
            }
        }
    })
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
    let (engine, _, _) = Engine::open(memory, Kernels::detect(false))?;
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

/// Re-derive the installed dark version's rows (resuming, progress on stderr) and build its
/// arena generation.
/// Re-derive the installed dark version's rows on every core and build its arena, with
/// progress on stderr.
fn prepare_dark(engine: &Engine) -> anyhow::Result<()> {
    let prepared = engine
        .prepare_dark(false, |p| {
            eprint!("\rderiving {}: {}/{} rows", p.version, p.done, p.total);
        })?
        .context("no dark dictionary version is installed")?;
    eprintln!(
        "\n{} ready: {} rows re-derived in {:.2?} ({:.0} rows/s), arena of {} rows built in {:.2?}",
        prepared.version,
        prepared.derived_rows,
        prepared.derive_time,
        prepared.derived_rows as f64 / prepared.derive_time.as_secs_f64().max(1e-9),
        prepared.arena_rows,
        prepared.build_time
    );
    Ok(())
}

/// Whether opening a data directory failed because another process holds it.
fn is_held_elsewhere(err: &anyhow::Error) -> bool {
    matches!(
        err.downcast_ref::<perpetuity::error::Error>(),
        Some(perpetuity::error::Error::Store(store)) if store.is_held_elsewhere()
    )
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

fn show(dict: &Dictionary, text: Option<&str>) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(dict.manifest())?);
    let Some(text) = text else {
        return Ok(());
    };
    let tokenizer = Tokenizer::new();
    let tokens = tokenizer.encode(text);
    println!("\ntokens ({}):", tokens.len());
    for token in &tokens {
        let piece = tokenizer.decode_lossy(std::slice::from_ref(token));
        let marker = if dict.vector(*token).is_some() {
            ""
        } else {
            "  (no vector)"
        };
        println!("  {:>6}  {piece:?}{marker}", token.0);
    }
    let words = dict.lexical().words(&tokenizer.decode_lossy(&tokens));
    println!("\nterms ({}): {}", words.len(), words.join(" "));
    let row = derive(dict, &tokenizer, None, &tokens);
    // No memory is attached here, so the weights are the dictionary's prior alone.
    let embedding = embed(dict, &FrequencyTable::default(), &row);
    let covered = row
        .tokens
        .iter()
        .filter(|(t, _)| dict.vector(*t).is_some())
        .count();
    let head: Vec<String> = embedding
        .unit
        .iter()
        .take(8)
        .map(|x| format!("{x:+.4}"))
        .collect();
    println!(
        "\nvector: {} dims, {covered} of {} distinct tokens have a table row, weights from the prior only\n  first 8: [{}]\n  retrieval row: {} bytes",
        embedding.unit.len(),
        row.tokens.len(),
        head.join(", "),
        row.encode().len()
    );
    Ok(())
}

/// A store for a benchmark: `data`, or a fresh folder under the system temp dir that is
/// removed when the returned guard drops.
struct BenchDir {
    dir: PathBuf,
    temporary: bool,
}

/// Whether a benchmark may run on a store that already exists.
#[derive(PartialEq)]
enum Existing {
    Refuse,
    Reuse,
}

impl BenchDir {
    fn new(data: Option<PathBuf>, name: &str, existing: Existing) -> anyhow::Result<Self> {
        let (dir, temporary) = match data {
            Some(dir) => (dir, false),
            None => (
                std::env::temp_dir()
                    .join(format!("perpetuity-bench-{name}-{}", std::process::id())),
                true,
            ),
        };
        anyhow::ensure!(
            existing == Existing::Reuse || !dir.exists(),
            "{} exists; the benchmark writes a fresh store",
            dir.display()
        );
        Ok(Self { dir, temporary })
    }
}

impl Drop for BenchDir {
    fn drop(&mut self) {
        if self.temporary
            && let Err(err) = std::fs::remove_dir_all(&self.dir)
        {
            eprintln!("could not remove {}: {err}", self.dir.display());
        }
    }
}

fn bench_ingest(
    messages: usize,
    users: usize,
    data: Option<PathBuf>,
    sync: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(users > 0, "--users must be at least 1");
    let place = BenchDir::new(data, "ingest", Existing::Refuse)?;
    let data = DataArgs {
        dir: place.dir.clone(),
        sync_writes: sync,
        uncompressed: false,
    };
    let memory = dictionary.open(&data)?;
    let input = bench::synthetic_messages(messages, users, bench::MESSAGE_SEED);
    let summary = ingest::ingest(
        &memory.store,
        &memory.dictionary,
        &input,
        progress_printer("bench ingest"),
    )?;
    let threads = rayon::current_num_threads();
    println!(
        "bench ingest: {} messages, {} rows, {} tokens, {} users, WAL on, sync {}, {threads} threads: {:.2?}, {:.0} rows/s",
        summary.messages,
        summary.rows,
        summary.tokens,
        users,
        if sync { "every batch" } else { "off" },
        summary.elapsed,
        summary.rows_per_second()
    );
    std::io::stdout().flush()?;
    Ok(())
}

fn bench_backup(
    rows: usize,
    users: usize,
    writers: usize,
    seconds: f64,
    json: bool,
    data: Option<PathBuf>,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        users > 0 && writers > 0,
        "--users and --writers must be at least 1"
    );
    let settings = bench::ScanSettings {
        rows,
        users,
        threads: 1,
        queries: 0,
        fidelity_queries: 0,
    };
    let (place, memory) = synthetic_memory(data, settings, dictionary, "backup")?;
    let beside = |what: &str| {
        let mut name = place.dir.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".bench-{what}-{}", std::process::id()));
        place.dir.with_file_name(name)
    };
    let (to, restored) = (beside("backup"), beside("restored"));
    let warmup = std::time::Duration::from_secs_f64(seconds);
    let report = bench::backup_under_load(&memory, &to, &restored, writers, warmup);
    for dir in [&to, &restored] {
        if let Err(err) = std::fs::remove_dir_all(dir) {
            eprintln!("could not remove {}: {err}", dir.display());
        }
    }
    let report = report?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "bench backup: {} rows, {writers} writers: backup {:.1} ms ({} files, {} of them table files, {:.0} MiB), restore {:.1} ms; \
             capture p50/p99 before {:.2}/{:.2} ms ({} captures), during {:.2}/{:.2} ms, max {:.2} ms ({} captures)",
            report.rows,
            report.backup_ms,
            report.files,
            report.table_files,
            report.bytes as f64 / (1 << 20) as f64,
            report.restore_ms,
            report.capture_before_p50_ms,
            report.capture_before_p99_ms,
            report.captures_before,
            report.capture_during_p50_ms,
            report.capture_during_p99_ms,
            report.capture_during_max_ms,
            report.captures_during
        );
    }
    Ok(())
}

/// A store holding the seeded synthetic pool of `settings` (ingested unless `data` already
/// holds rows), with the guard that removes a temporary one.
fn synthetic_memory(
    data: Option<PathBuf>,
    settings: bench::ScanSettings,
    dictionary: &DictionaryArgs,
    name: &'static str,
) -> anyhow::Result<(BenchDir, Memory)> {
    let place = BenchDir::new(data, name, Existing::Reuse)?;
    let memory = dictionary.open(&DataArgs {
        dir: place.dir.clone(),
        sync_writes: false,
        uncompressed: false,
    })?;
    if memory.store.rows_since(RowId(0)).next().is_none() {
        let input = bench::synthetic_messages(settings.rows, settings.users, bench::MESSAGE_SEED);
        ingest::ingest(
            &memory.store,
            &memory.dictionary,
            &input,
            progress_printer(name),
        )?;
    } else {
        eprintln!(
            "bench {name}: {} already holds rows; reusing them (--rows is ignored; --users must match the store)",
            place.dir.display()
        );
    }
    Ok((place, memory))
}

/// `bench proxy`: the benchmark users' memory (`rows` spread over `calls.users`, made once per
/// data directory), then the measurement over loopback.
fn bench_proxy(
    rows: usize,
    calls: proxy::bench::Calls,
    data: Option<PathBuf>,
    json: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    let proxy::bench::Calls {
        users,
        concurrency,
        requests,
    } = calls;
    anyhow::ensure!(
        concurrency > 0 && requests > 0 && users > 0,
        "--users, --concurrency and --requests must be at least 1"
    );
    let place = BenchDir::new(data, "proxy", Existing::Reuse)?;
    let memory = dictionary.open(&DataArgs {
        dir: place.dir.clone(),
        sync_writes: false,
        uncompressed: false,
    })?;
    let secret = proxy::identity::Secret::load_or_create(&place.dir)?;
    let user_keys: Vec<String> = (0..users)
        .map(|u| secret.user_key(&proxy::bench::credential(u), None))
        .collect();
    let holds = |key: &String| -> anyhow::Result<bool> {
        Ok(memory.store.user_key(UserId::from_key(key))?.is_some())
    };
    let (first, last) = (holds(&user_keys[0])?, holds(&user_keys[users - 1])?);
    anyhow::ensure!(
        first == last,
        "{} holds a proxy benchmark of another number of users: give a fresh --data",
        place.dir.display()
    );
    if !first && rows > 0 {
        let mut messages = bench::synthetic_messages(rows, users, bench::MESSAGE_SEED);
        for (i, message) in messages.iter_mut().enumerate() {
            message.user_key.clone_from(&user_keys[i % users]);
        }
        ingest::ingest(
            &memory.store,
            &memory.dictionary,
            &messages,
            progress_printer("proxy"),
        )?;
    }
    let (engine, _, _) = Engine::open(memory, Kernels::detect(false))?;
    let (held, scope_rows) = {
        let generation = engine.generation();
        let arena = generation.arena.read();
        (
            arena.rows(),
            arena.scope_rows(&[UserId::from_key(&user_keys[0])]),
        )
    };
    let questions: Vec<String> = bench::synthetic_queries(requests.min(1_000), 1)
        .into_iter()
        .map(|(_, text)| text)
        .collect();
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let report = runtime.block_on(async {
        let upstream = proxy::bench::local_upstream().await?;
        let config = proxy::ProxyConfig {
            openai: format!("http://{upstream}"),
            max_concurrent: concurrency.max(256),
            ..proxy::ProxyConfig::default()
        };
        let state = Arc::new(proxy::State::new(engine, secret, config));
        proxy::bench::measure(state, upstream, (held, scope_rows), calls, &questions).await
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let line = |label: &str, t: &proxy::bench::Timing| {
            println!(
                "  {label:<18} first byte p50 {:.2} ms, p99 {:.2} ms; total p50 {:.2} ms, p99 {:.2} ms",
                t.first_byte_p50_ms, t.first_byte_p99_ms, t.total_p50_ms, t.total_p99_ms
            )
        };
        println!(
            "bench proxy: {} rows over {} users ({} in the first user's scope), {} in flight, {} requests each way",
            report.rows,
            report.calls.users,
            report.scope_rows,
            report.calls.concurrency,
            report.calls.requests
        );
        line("direct", &report.direct);
        line("proxy", &report.proxy);
        line("proxy, recall off", &report.proxy_recall_off);
        println!(
            "  added p99 time to first byte: {:.2} ms with memory, {:.2} ms with recall off",
            report.added_first_byte_p99_ms, report.added_first_byte_p99_recall_off_ms
        );
    }
    Ok(())
}

/// The fidelity report: one entry per part that ran.
#[derive(serde::Serialize)]
struct FidelityReport {
    locomo_own_scope: Option<bench::Fidelity>,
    locomo_pooled_scope: Option<bench::Fidelity>,
    synthetic: Option<SyntheticFidelity>,
}

#[derive(serde::Serialize)]
struct SyntheticFidelity {
    rows: usize,
    users: usize,
    #[serde(flatten)]
    fidelity: bench::Fidelity,
}

fn bench_fidelity(
    locomo: Option<&Path>,
    settings: bench::ScanSettings,
    data: Option<PathBuf>,
    json: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    let kernels = Kernels::detect(false);
    eprintln!("bench fidelity: kernels {}", kernels.describe());
    let mut report = FidelityReport {
        locomo_own_scope: None,
        locomo_pooled_scope: None,
        synthetic: None,
    };
    if let Some(file) = locomo {
        let dataset = datasets::load(Format::Locomo, file)?;
        let scratch = BenchDir::new(None, "fidelity-locomo", Existing::Refuse)?;
        let memory = dictionary.open(&DataArgs {
            dir: scratch.dir.clone(),
            sync_writes: false,
            uncompressed: false,
        })?;
        ingest::ingest(
            &memory.store,
            &memory.dictionary,
            &dataset.messages,
            progress_printer("fidelity-locomo"),
        )?;
        let (engine, _, _) = Engine::open(memory, kernels)?;
        let generation = engine.generation();
        let (dictionary, arena) = (&generation.memory.dictionary, generation.arena.read());
        let mut everyone: Vec<UserId> = dataset
            .questions
            .iter()
            .map(|q| UserId::from_key(&q.user_key))
            .collect();
        everyone.sort_unstable();
        everyone.dedup();
        let own: Vec<(Vec<UserId>, String)> = dataset
            .questions
            .iter()
            .map(|q| (vec![UserId::from_key(&q.user_key)], q.question.clone()))
            .collect();
        let pooled: Vec<(Vec<UserId>, String)> = dataset
            .questions
            .iter()
            .map(|q| (everyone.clone(), q.question.clone()))
            .collect();
        eprintln!(
            "bench fidelity: {} LoCoMo questions, own and pooled scope",
            own.len()
        );
        report.locomo_own_scope = Some(bench::fidelity(dictionary, &arena, &kernels, &own));
        report.locomo_pooled_scope = Some(bench::fidelity(dictionary, &arena, &kernels, &pooled));
    }
    if settings.rows > 0 {
        anyhow::ensure!(settings.users > 0, "--users must be at least 1");
        let (_place, memory) = synthetic_memory(data, settings, dictionary, "fidelity")?;
        let started = Instant::now();
        let (engine, _, _) = Engine::open(memory, kernels)?;
        let generation = engine.generation();
        let arena = generation.arena.read();
        eprintln!(
            "bench fidelity: arena of {} rows ready in {:.1?}; {} synthetic queries",
            arena.rows(),
            started.elapsed(),
            settings.queries
        );
        let asked: Vec<(Vec<UserId>, String)> =
            bench::synthetic_queries(settings.queries, settings.users)
                .into_iter()
                .map(|(user, text)| (vec![user], text))
                .collect();
        report.synthetic = Some(SyntheticFidelity {
            rows: arena.rows(),
            users: settings.users,
            fidelity: bench::fidelity(&generation.memory.dictionary, &arena, &kernels, &asked),
        });
    }
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let line = |name: &str, f: &bench::Fidelity| {
            let [eighth, quarter, half] = f.agree_shallower;
            println!(
                "  {name}: {} of {} top-10 sets equal brute force's = {:.4} \
                 (with stage one keeping 1/8, 1/4, 1/2 of its candidates: {eighth}, {quarter}, {half})",
                f.agree, f.queries, f.share
            );
        };
        println!("bench fidelity (target >= 0.995):");
        if let Some(f) = &report.locomo_own_scope {
            line("LoCoMo, each question in its user's scope", f);
        }
        if let Some(f) = &report.locomo_pooled_scope {
            line("LoCoMo, every conversation pooled in one scope", f);
        }
        if let Some(s) = &report.synthetic {
            line(
                &format!("synthetic, {} rows over {} users", s.rows, s.users),
                &s.fidelity,
            );
        }
    }
    Ok(())
}

fn bench_scan(
    settings: bench::ScanSettings,
    data: Option<PathBuf>,
    json: bool,
    during_rederive: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        settings.users > 0 && settings.rows > 0,
        "--rows and --users must be at least 1"
    );
    anyhow::ensure!(settings.threads > 0, "--threads must be at least 1");
    let (_place, memory) = synthetic_memory(data, settings, dictionary, "scan")?;
    let kernels = Kernels::detect(false);
    eprintln!("bench scan: kernels {}", kernels.describe());
    let done = |store: &Store| store.dark().map(|dark| dark.map_or(0, |d| d.done));
    let done_before = done(&memory.store)?;
    let rederiving = during_rederive.then(|| {
        let store = Arc::clone(&memory.store);
        std::thread::spawn(move || {
            let started = Instant::now();
            let before = store.dark()?.map_or(0, |dark| dark.done);
            perpetuity::swap::background_pool()
                .install(|| perpetuity::swap::rederive(&store, |_| {}))
                .map(|state| (state.done - before, state.version, started.elapsed()))
        })
    });
    let report = bench::scan(&memory, &kernels, settings)?;
    if let Some(thread) = rederiving {
        let during = done(&memory.store)? - done_before;
        let (rows, version, elapsed) = thread.join().expect("the re-derivation thread")?;
        eprintln!(
            "bench scan: re-derived {rows} rows under {version} in {elapsed:.2?} ({:.0} rows/s, half the cores), {during} of them before the benchmark ended",
            rows as f64 / elapsed.as_secs_f64()
        );
    }
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "bench scan: {} rows over {} users, {} threads, {} bytes/row resident\n  first pass (one core, largest scope): {:.0}M rows/s, {:.2} GB/s = {:.0}% of read bandwidth {:.2} GB/s\n  first pass (all {} threads, its top-k included): {:.2} GB/s = {:.0}% of their read bandwidth {:.2} GB/s\n  second pass (one core, its candidates): {:.2}M rows/s\n  query (catch-up + prepare + search, top 10): p50 {:.2} ms, p99 {:.2} ms\n  fidelity (two-stage top 10 = brute force): {:.4}\n  arena {} and caught up in {:.0} ms ({:.0} rows/s caught up)\n  stage one on {} simulated cores (replayed on one): {:.2}x one ({:.2} ms alone, slowest worker {:.2} ms + merge {:.2} ms; needs {:.1} GB/s)",
            report.rows,
            report.users,
            report.threads,
            report.bytes_per_row,
            report.first_pass_rows_per_s_per_core / 1e6,
            report.first_pass_bytes_per_s / 1e9,
            100.0 * report.bandwidth_ratio,
            report.memory_read_bytes_per_s / 1e9,
            report.threads,
            report.first_pass_all_threads_bytes_per_s / 1e9,
            100.0 * report.bandwidth_ratio_all_threads,
            report.memory_read_all_threads_bytes_per_s / 1e9,
            report.second_pass_rows_per_s_per_core / 1e6,
            report.query_p50_ms,
            report.query_p99_ms,
            report.fidelity_top10,
            if report.arena_mapped {
                "mapped"
            } else {
                "rebuilt"
            },
            report.arena_open_ms,
            report.catch_up_rows_per_s,
            report.simulated_workers,
            report.simulated_speedup,
            report.simulated_one_worker_ms,
            report.simulated_slowest_worker_ms,
            report.simulated_merge_ms,
            report.simulated_read_bytes_per_s / 1e9,
        );
    }
    Ok(())
}
