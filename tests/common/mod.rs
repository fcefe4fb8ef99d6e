//! Helpers shared by the integration tests.

#![allow(dead_code)] // each test binary uses its own subset of these helpers

pub mod server;
pub mod upstream;
pub mod wire;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use perpetuity::config::default_dictionaries_root;
use perpetuity::dictionary::{DEFAULT_VERSION, Dictionary};
use perpetuity::memory::Memory;
use perpetuity::store::{Store, StoreOptions};
use perpetuity::types::{Role, UserId};

/// Run the `perpetuity` binary with `args` (warnings only in its log) to its end.
pub fn perpetuity(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_perpetuity"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the binary runs")
}

/// The shipped default dictionary, loaded once per test binary.
pub fn dictionary() -> &'static Dictionary {
    static DICT: OnceLock<Dictionary> = OnceLock::new();
    DICT.get_or_init(|| {
        Dictionary::load_version(&default_dictionaries_root(), DEFAULT_VERSION)
            .expect("the shipped dictionary loads")
    })
}

/// A memory (store + shipped default dictionary) in `dir`, default store options.
pub fn memory(dir: &Path) -> Memory {
    Memory::open(
        dir,
        &default_dictionaries_root(),
        Some(DEFAULT_VERSION),
        &StoreOptions::default(),
    )
    .unwrap()
}

/// The folder of the shipped default dictionary.
pub fn dictionary_dir() -> PathBuf {
    default_dictionaries_root().join(DEFAULT_VERSION)
}

/// `locomo10.json` from the shared data folder, or `None` with a SKIP line naming the test.
pub fn locomo_file(test: &str) -> Option<PathBuf> {
    shared_data(test, "data/locomo/locomo10.json")
}

/// The five RealMem personas' folder in the shared data folder, or `None` (with a SKIP line
/// naming `test`) when it is absent.
pub fn realmem_dir(test: &str) -> Option<PathBuf> {
    shared_data(test, "data/realmem/dataset")
}

/// `relative` in the shared data folder, or `None` (with a SKIP line naming `test`).
fn shared_data(test: &str, relative: &str) -> Option<PathBuf> {
    let path = shared_dir()?.join(relative);
    if path.exists() {
        Some(path)
    } else {
        eprintln!("SKIP {test}: {} is absent", path.display());
        None
    }
}

/// The shared data folder beside the repository (`$PERPETUITY_SHARED` overrides), if present.
pub fn shared_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("PERPETUITY_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("SKIP: the shared data folder {} is absent", dir.display());
        None
    }
}

/// The official SDKs' Python: `$PERPETUITY_SDK_PYTHON`, else the virtual environment
/// `tools/install-deps.sh` makes; `None` with a SKIP line when it is absent.
pub fn sdk_python() -> Option<PathBuf> {
    let python = std::env::var_os("PERPETUITY_SDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/perpetuity-sdk-venv/bin/python"));
    if python.is_file() {
        Some(python)
    } else {
        eprintln!(
            "SKIP official SDK tests: {} is absent (tools/install-deps.sh makes it)",
            python.display()
        );
        None
    }
}

/// The older Anthropic SDK (1.17.0, which sends `x-api-key` where 2.x sends a Bearer token),
/// installed by `tools/install-deps.sh` as a package folder beside the environment of
/// `python`, to put first on `PYTHONPATH`; `None` with a SKIP line when it is absent.
pub fn legacy_anthropic(python: &Path) -> Option<PathBuf> {
    let dir = python.parent()?.parent()?.join("anthropic-1.17.0");
    if dir.join("anthropic").is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "SKIP older Anthropic SDK test: {} is absent (tools/install-deps.sh makes it)",
            dir.display()
        );
        None
    }
}

/// Run `tests/sdk/<script>` with the SDKs' `python` against the proxy at `proxy` (base URL),
/// the recorded provider streams under `fixtures`, and `env` besides; panics with its output
/// unless it exits 0 and prints `done_line`.
pub async fn run_sdk_script(
    python: PathBuf,
    script: &str,
    proxy: String,
    fixtures: PathBuf,
    env: &[(&str, &OsStr)],
    done_line: &str,
) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sdk")
        .join(script);
    let mut command = std::process::Command::new(python);
    command
        .arg(script)
        .env("PROXY", proxy)
        .env("FIXTURES", fixtures)
        .envs(env.iter().copied());
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK checks failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains(done_line), "{stdout}");
}

/// A randomised test's seed: `$PERPETUITY_SEED`, else one from the clock (odd, never zero);
/// printed so a failing run can be replayed.
pub fn test_seed() -> u64 {
    let seed = std::env::var("PERPETUITY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("PERPETUITY_SEED={seed}");
    seed
}

/// `numbers` (ascending) as runs of consecutive numbers: 1, 2, 3, 7, 8 as `[1..=3, 7..=8]`.
pub fn runs(numbers: impl IntoIterator<Item = usize>) -> Vec<std::ops::RangeInclusive<usize>> {
    let mut runs: Vec<std::ops::RangeInclusive<usize>> = Vec::new();
    for number in numbers {
        match runs.last_mut() {
            Some(run) if *run.end() + 1 == number => *run = *run.start()..=number,
            _ => runs.push(number..=number),
        }
    }
    runs
}

/// The files under `dir` (recursively) whose bytes contain `needle`.
pub fn files_containing(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            hits.extend(files_containing(&path, needle));
        } else if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            if bytes.windows(needle.len()).any(|w| w == needle) {
                hits.push(path.display().to_string());
            }
        }
    }
    hits
}

/// Every stored message of `user`, reassembled from its rows: role and text, in row order.
/// Panics on a message stored in part or with its chunks out of order.
pub fn stored_messages(store: &Store, user: UserId) -> Vec<(Role, String)> {
    let mut messages: std::collections::BTreeMap<u64, (Role, u16, Vec<String>)> =
        Default::default();
    for row in store.rows_of(user) {
        let row = row.unwrap();
        let entry = messages
            .entry(row.message.0)
            .or_insert_with(|| (row.role, row.chunks, Vec::new()));
        assert_eq!(
            row.chunk as usize,
            entry.2.len(),
            "message {}: chunk {} out of order",
            row.message.0,
            row.chunk
        );
        entry.2.push(row.text);
    }
    messages
        .into_iter()
        .map(|(id, (role, chunks, parts))| {
            assert_eq!(
                parts.len(),
                chunks as usize,
                "message {id} is stored in part: {} of {chunks} chunks",
                parts.len()
            );
            (role, parts.concat())
        })
        .collect()
}
