//! `perpetuity eval`: retrieval quality on a benchmark file.

use anyhow::Context as _;

use super::*;

#[derive(clap::Args)]
pub struct EvalArgs {
    /// The file's format.
    #[arg(long, value_parser = format_parser())]
    pub format: Format,
    /// The benchmark file.
    pub file: PathBuf,
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
    /// session ranked, ours and BM25, and whether the frame showed it.
    #[arg(long, value_name = "FILE")]
    pub per_question: Option<PathBuf>,
    /// Split the file's users over this many shards, each its own store with its own arena
    /// and frequency statistic, by a jump consistent hash of the user id; every question is
    /// asked of its user's shard only. At 1, one pooled memory; above 1, the data directory
    /// holds the first shard and must be empty (docs/eval.md, "Shards").
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    #[command(flatten)]
    pub dictionary: DictionaryArgs,
}

pub fn eval(args: EvalArgs) -> anyhow::Result<()> {
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
        std::fs::write(path, lines).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render(args.by_category));
    }
    Ok(())
}
