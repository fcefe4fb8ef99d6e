//! `perpetuity serve`: the settings file laid under the command line and the environment, the
//! engine opened, the proxy run until interrupted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::ArgMatches;
use clap::parser::ValueSource;

use perpetuity::config::{self, AdminToken, ServeConfig};
use perpetuity::engine::Engine;
use perpetuity::memory::{self as data_dir, Memory};
use perpetuity::proxy;
use perpetuity::scan::kernels::Kernels;

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

pub fn run(
    ServeArgs {
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
    }: ServeArgs,
    matches: &ArgMatches,
) -> anyhow::Result<()> {
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
