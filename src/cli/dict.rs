//! `perpetuity dict`: show, install, flip and list dictionary versions.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use clap::Subcommand;

use perpetuity::dictionary::Dictionary;
use perpetuity::dictionary::derive::{derive, embed};
use perpetuity::dictionary::stats::FrequencyTable;
use perpetuity::engine::Engine;
use perpetuity::scan::kernels::{Ceiling, Kernels};
use perpetuity::tokens::Tokenizer;

use super::*;

pub fn run(command: DictCommand) -> anyhow::Result<()> {
    match command {
        DictCommand::Show { dictionary, text } => show(&dictionary.load()?, text.as_deref()),
        DictCommand::Install {
            data,
            dictionary,
            path,
        } => {
            data.existing()?;
            let (engine, _, _) =
                Engine::open(dictionary.open(&data)?, Kernels::detect(Ceiling::Native))?;
            eprintln!("installed {} dark", engine.install(&path)?);
            prepare_dark(&engine)
        }
        DictCommand::Flip {
            data,
            dictionary,
            version,
        } => {
            data.existing()?;
            let memory = dictionary.open(&data)?;
            memory
                .store
                .dark_dictionary()
                .filter(|d| d.version() == version)
                .with_context(|| format!("{version} is not the installed dark version"))?;
            let (engine, _, _) = Engine::open(memory, Kernels::detect(Ceiling::Native))?;
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
        DictCommand::List {
            data,
            dictionary,
            json,
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
    }
}

#[derive(Subcommand)]
pub enum DictCommand {
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
