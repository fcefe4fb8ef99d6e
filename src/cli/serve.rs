//! `perpetuity serve`: the settings file laid under the command line and the environment, the
//! engine opened, the proxy run until interrupted.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::{ArgMatches, Command};

use perpetuity::config::{self, AdminToken, FileConfig, ServeConfig};
use perpetuity::engine::Engine;
use perpetuity::memory::{self as data_dir, Memory};
use perpetuity::proxy;
use perpetuity::scan::kernels::{Ceiling, Kernels};

use super::*;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "PERPETUITY_LISTEN", default_value = config::DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Run every scan kernel in its scalar form (for diagnosis; slower).
    #[arg(long, env = "PERPETUITY_SCALAR_KERNELS")]
    pub scalar_kernels: bool,
    /// A provider's API base URL, `NAME=URL` with NAME one of openai, anthropic, gemini
    /// (repeatable; defaults: the real providers).
    #[arg(long, env = "PERPETUITY_UPSTREAMS", value_delimiter = ',', value_parser = parse_upstream)]
    pub upstream: Vec<(perpetuity::proxy::provider::Provider, String)>,
    /// The token the admin endpoints (`/admin/stats`, `/admin/integrity`, `/admin/purge`)
    /// require; without one they are disabled.
    #[arg(long, env = "PERPETUITY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<AdminToken>,
    /// Requests to the providers (chat and passed through) served at once; more are refused with 503.
    #[arg(long, env = "PERPETUITY_MAX_CONCURRENT", default_value_t = 256)]
    pub max_concurrent: usize,
    /// A TOML settings file (README.md, "Configuration"); the command line and the environment
    /// override what it sets.
    #[arg(long, env = "PERPETUITY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Offer the memory tools with chat requests (`--memory-tools false` turns them off).
    #[arg(long, env = "PERPETUITY_MEMORY_TOOLS", default_value_t = true, action = clap::ArgAction::Set)]
    pub memory_tools: bool,
    /// Upstream calls per reply when the model calls the memory tools; the last one has no
    /// tools, so the model must answer.
    #[arg(long, env = "PERPETUITY_TOOL_ROUNDS", default_value_t = proxy::rounds::DEFAULT_ROUNDS)]
    pub tool_rounds: usize,
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub dictionary: DictionaryArgs,
}

/// The shortest admin token `serve` takes without a warning.
const SHORTEST_QUIET_TOKEN: usize = 16;

/// Warn when `serve`'s admin token was given on the command line (any local user reads it in
/// `/proc/PID/cmdline`; `PERPETUITY_ADMIN_TOKEN` or the config file keep it private) or is
/// short enough to guess.
pub fn warn_of_a_visible_token(matches: &ArgMatches) {
    let Some(serve) = matches.subcommand_matches("serve") else {
        return;
    };
    if serve.value_source("admin_token") == Some(clap::parser::ValueSource::CommandLine) {
        tracing::warn!(
            "--admin-token on the command line is readable by any local user (/proc/PID/cmdline): set PERPETUITY_ADMIN_TOKEN or the config file's admin_token instead"
        );
    }
    if let Some(token) = serve.get_one::<AdminToken>("admin_token")
        && !token.is_empty()
        && token.reveal().chars().count() < SHORTEST_QUIET_TOKEN
    {
        tracing::warn!(
            "the admin token is shorter than {SHORTEST_QUIET_TOKEN} characters: one that long or longer, random, is much harder to guess"
        );
    }
}

/// The settings file `serve` was given (`--config`, `PERPETUITY_CONFIG`), read and checked.
pub struct SettingsFile {
    path: PathBuf,
    file: FileConfig,
}

impl SettingsFile {
    /// The file named by `serve`'s matches; `None` for another command or without one.
    pub fn read(matches: &ArgMatches) -> anyhow::Result<Option<Self>> {
        let Some(path) = matches
            .subcommand_matches("serve")
            .and_then(|serve| serve.get_one::<PathBuf>("config"))
        else {
            return Ok(None);
        };
        let file = FileConfig::load(path)?;
        Ok(Some(Self {
            path: path.clone(),
            file,
        }))
    }

    /// `serve` with the file's values as its arguments' defaults: the command line and the
    /// environment still win, the built-in default applies only where the file is silent too.
    /// No default shows in `--help` (the admin token is one).
    pub fn defaults(&self, serve: Command) -> Command {
        let file = &self.file;
        let text = |value: &dyn ToString| OsString::from(value.to_string());
        let defaults: [(&str, Option<OsString>); 11] = [
            ("listen", file.listen.as_ref().map(|v| text(v))),
            (
                "dir",
                file.data.as_ref().map(|p| p.clone().into_os_string()),
            ),
            (
                "dictionaries",
                file.dictionaries
                    .as_ref()
                    .map(|p| p.clone().into_os_string()),
            ),
            (
                "dictionary_version",
                file.dictionary_version.as_ref().map(OsString::from),
            ),
            ("sync_writes", file.sync_writes.as_ref().map(|v| text(v))),
            ("uncompressed", file.uncompressed.as_ref().map(|v| text(v))),
            (
                "scalar_kernels",
                file.scalar_kernels.as_ref().map(|v| text(v)),
            ),
            (
                "max_concurrent",
                file.max_concurrent.as_ref().map(|v| text(v)),
            ),
            ("memory_tools", file.memory_tools.as_ref().map(|v| text(v))),
            ("tool_rounds", file.tool_rounds.as_ref().map(|v| text(v))),
            (
                "admin_token",
                file.admin_token
                    .as_ref()
                    .map(|t| OsString::from(t.reveal())),
            ),
        ];
        defaults
            .into_iter()
            .filter_map(|(id, value)| Some((id, value?)))
            .fold(serve, |serve, (id, value)| {
                serve.mut_arg(id, |arg| arg.default_value(value).hide_default_value(true))
            })
    }

    /// The proxy's settings from the file's sections (`[upstreams]`, `[limits]`, `[recall]`,
    /// `[groups]`, `[inspector]`), which no flag sets: the file over the built-in defaults.
    fn proxy_config(&self) -> anyhow::Result<proxy::ProxyConfig> {
        proxy::ProxyConfig::from_file(&self.file)
            .map_err(|e| anyhow::anyhow!("config file {}: {e}", self.path.display()))
    }
}

pub fn run(
    ServeArgs {
        listen,
        scalar_kernels,
        upstream,
        admin_token,
        max_concurrent,
        memory_tools,
        tool_rounds,
        config: _,
        data,
        dictionary,
    }: ServeArgs,
    file: Option<SettingsFile>,
) -> anyhow::Result<()> {
    let descriptors = proxy::raise_descriptor_limit();
    tracing::info!(?descriptors, "open-descriptor limit");
    let mut proxy_config = match &file {
        Some(file) => file.proxy_config()?,
        None => proxy::ProxyConfig::default(),
    };
    let kernels = Kernels::detect(if scalar_kernels {
        Ceiling::Scalar
    } else {
        Ceiling::Native
    });
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
    // `--upstream` names single providers: it replaces the file's URL for those alone.
    for (provider, url) in upstream {
        proxy_config.set_upstream(provider, url);
    }
    let memory = dictionary.open(&data)?;
    serve(config, proxy_config, kernels, memory)
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
        // Written as a new file (a link left in its place is removed, never followed).
        let listening = config.data_dir.join(data_dir::LISTENING_FILE);
        let address = listener.local_addr().context("the listening address")?;
        let _ = std::fs::remove_file(&listening);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&listening)
            .and_then(|mut file| {
                std::io::Write::write_all(&mut file, format!("{address}\n").as_bytes())
            })
            .with_context(|| format!("writing {}", listening.display()))?;
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("listening for SIGTERM")?;
        tokio::select! {
            never = proxy::serve(listener, state) => match never {},
            _ = tokio::signal::ctrl_c() => shut_down(&listening),
            _ = terminate.recv() => shut_down(&listening),
        }
    })
}

/// Stop serving on SIGINT or SIGTERM (`systemctl stop`, `docker stop`): the listening file goes,
/// so `perpetuity backup` no longer takes this server for running.
fn shut_down(listening: &std::path::Path) -> anyhow::Result<()> {
    tracing::info!("shutting down");
    if let Err(err) = std::fs::remove_file(listening) {
        tracing::warn!(%err, path = %listening.display(), "could not remove the listening file");
    }
    Ok(())
}
