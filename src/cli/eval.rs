//! `perpetuity eval`: retrieval quality on a benchmark file, or recorded agent sessions replayed
//! through the proxy.

use std::sync::Arc;

use anyhow::Context as _;

use perpetuity::eval::replay::{self, Harness};
use perpetuity::scan::kernels::{Ceiling, Kernels};

use super::*;

/// What `--format` names: a benchmark file's format, or the harness whose recorded sessions
/// are replayed.
#[derive(Debug, Clone, Copy)]
pub enum EvalFormat {
    Dataset(Format),
    Replay(Harness),
}

/// `--format`'s parser: one of the dataset formats' or the harnesses' names.
fn eval_format_parser() -> impl clap::builder::TypedValueParser<Value = EvalFormat> {
    let names: Vec<&'static str> = Format::ALL
        .map(Format::name)
        .into_iter()
        .chain(Harness::ALL.map(Harness::name))
        .collect();
    clap::builder::PossibleValuesParser::new(names).map(|name| {
        Format::named(&name)
            .map(EvalFormat::Dataset)
            .or_else(|| Harness::named(&name).map(EvalFormat::Replay))
            .expect("a listed format")
    })
}

#[derive(clap::Args)]
pub struct EvalArgs {
    /// The file's format, or the harness that recorded the sessions to replay (docs/eval.md,
    /// "Replayed agent sessions").
    #[arg(long, value_parser = eval_format_parser())]
    pub format: EvalFormat,
    /// The benchmark file; for a replay, transcript files or folders of them.
    #[arg(value_name = "PATH", required = true)]
    pub paths: Vec<PathBuf>,
    /// Data directory of the pooled memory: reused as it is when it already holds rows, else
    /// the file is ingested into it [default: a fresh temp folder, removed afterwards].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Depths k at which every ranked metric is reported.
    #[arg(long = "k", value_delimiter = ',', default_values_t = perpetuity::eval::DEFAULT_KS)]
    pub ks: Vec<usize>,
    /// Print one JSON object (names in docs/eval.md).
    #[arg(long)]
    pub json: bool,
    /// Add a table per question category.
    #[arg(long)]
    pub by_category: bool,
    /// After the file, capture in every user's memory the tool rows of a replayed agent
    /// session (`bench prefix`'s: 6 turns of 5 file reads), in a conversation of its own, to
    /// measure what an agent's tool rounds do to the retrieval of the conversations (a fresh
    /// data directory only).
    #[arg(long)]
    pub agent_session: bool,
    /// Also write one JSON line per asked question to this file: where each evidence turn and
    /// session ranked, ours and BM25, and whether the frame showed it. For a replay, one line
    /// per replayed call at each setting: its terms found each way, its bytes and prefixes.
    #[arg(long, value_name = "FILE")]
    pub per_question: Option<PathBuf>,
    /// Split the file's users over this many shards, each its own store with its own arena
    /// and frequency statistic, by a jump consistent hash of the user id; every question is
    /// asked of its user's shard only. At 1, one pooled memory; above 1, the data directory
    /// holds the first shard and must be empty (docs/eval.md, "Shards").
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    /// A replay's settings of the recall's `session_tokens` (the most a working session's
    /// stretch quotes whole of its warm tool messages), one replay each [default: 2000, 4000,
    /// 8000 and the shipped default].
    #[arg(long, value_delimiter = ',')]
    pub session_tokens: Vec<usize>,
    /// A replay also draws support against forwarded size into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub dictionary: DictionaryArgs,
}

pub fn eval(args: EvalArgs) -> anyhow::Result<()> {
    match args.format {
        EvalFormat::Dataset(format) => dataset(format, args),
        EvalFormat::Replay(harness) => replay(harness, &args),
    }
}

/// A benchmark file through the pooled memory.
fn dataset(format: Format, args: EvalArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.session_tokens.is_empty() && args.plot.is_none(),
        "--session-tokens and --plot are a replay's (--format {})",
        Harness::ALL.map(Harness::name).join("|")
    );
    let [file] = &args.paths[..] else {
        anyhow::bail!("--format {} takes one file", format.name());
    };
    let dictionary = &args.dictionary;
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
        format,
        file,
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
        std::fs::write(path, lines).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render(args.by_category));
    }
    Ok(())
}

/// Recorded sessions replayed through the proxy, once per `session_tokens` setting.
fn replay(harness: Harness, args: &EvalArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.data.is_none() && !args.by_category && !args.agent_session && args.shards == 1,
        "a replay makes a fresh memory for each setting and asks no questions: \
         --data, --by-category, --agent-session and --shards are not taken"
    );
    let dictionary = Arc::new(args.dictionary.load()?);
    let (sessions, counts) = replay::read(harness, &args.paths)?;
    eprintln!(
        "eval: {} sessions with {} calls in {} files ({} lines not JSON, skipped)",
        sessions.len(),
        sessions.iter().map(|s| s.calls.len()).sum::<usize>(),
        counts.files,
        counts.not_json
    );
    let setup = replay::Setup {
        session_tokens: if args.session_tokens.is_empty() {
            replay::default_settings()
        } else {
            args.session_tokens.clone()
        },
        dictionary,
        kernels: Kernels::detect(Ceiling::Native),
    };
    let mut lines = String::new();
    let report = replay::run(
        &sessions,
        counts,
        &setup,
        |p| eprintln!("eval: {p}"),
        |session_tokens, measured| {
            if args.per_question.is_none() {
                return;
            }
            for m in measured {
                let file = sessions[m.session].path.display().to_string();
                let line = serde_json::json!({
                    "session_tokens": session_tokens,
                    "file": file,
                    "call": m,
                });
                lines.push_str(&line.to_string());
                lines.push('\n');
            }
        },
    )?;
    if let Some(path) = &args.per_question {
        std::fs::write(path, lines).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, replay::plot(&report))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(())
}
