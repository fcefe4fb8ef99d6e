//! The dictionary hot swap: a new dictionary version is uploaded into the data directory and
//! installed dark ([`install`]); every row stored before the install is re-derived from its
//! tokens under it into the store's dark families ([`rederive`]; rows captured after the
//! install are derived under both versions by their capture); its arena generation is built
//! beside the serving one ([`build_arena`]); and [`flip`] makes it serve in one store write.
//! No step writes a row, an activation or the warm index: heat, decay and novelty stay as they
//! are. Every step is a store batch, so a crash leaves the old version serving (with the dark
//! one installed, its derivation resumed from its last batch) or the new one.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::arena::{self, Arena};
use crate::dictionary::{Dictionary, DictionaryError};
use crate::error::Error;
use crate::memory::{upload_dir, uploads_dir};
use crate::store::{DarkVersion, Store, StoreError};

/// Rows re-derived and committed per store batch: a crash loses at most this much work, and a
/// batch takes a few milliseconds on one core, so a query that arrives while one runs waits
/// on little of it (the next batch waits for the query: [`rederive`]).
pub const REDERIVE_BATCH_ROWS: usize = 256;

/// The longest a re-derivation batch waits for running searches to end: under constant query
/// load the work still advances, a batch at least this often.
pub const YIELD_AT_MOST: std::time::Duration = std::time::Duration::from_millis(50);

/// A dictionary version of a data directory and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listed {
    pub version: String,
    /// `serving`, `dark` (installed, nothing derived yet), `deriving`, `ready` (every row
    /// derived: it can be flipped to) or `retired` (uploaded, not installed or no longer
    /// serving).
    pub state: &'static str,
    /// Rows re-derived and rows to re-derive, for a dark version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<(u64, u64)>,
}

impl std::fmt::Display for Listed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.state, self.progress) {
            ("deriving", Some((done, total))) => {
                write!(f, "{}\tderiving {done}/{total}", self.version)
            }
            (state, _) => write!(f, "{}\t{state}", self.version),
        }
    }
}

/// The state of a dark version.
fn dark_state(dark: &DarkVersion) -> &'static str {
    if dark.is_derived() {
        "ready"
    } else if dark.done == 0 {
        "dark"
    } else {
        "deriving"
    }
}

/// Every version of the data directory: the serving one, the dark one, and every uploaded one.
pub fn list(store: &Store) -> Result<Vec<Listed>, Error> {
    let serving = store.dictionary_version()?;
    let dark = store.dark()?;
    let mut versions: BTreeSet<String> = serving.iter().cloned().collect();
    versions.extend(store.retired_versions()?);
    versions.extend(dark.iter().map(|d| d.version.clone()));
    if let Ok(entries) = std::fs::read_dir(uploads_dir(store.path())) {
        versions.extend(
            entries
                .flatten()
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|name| !name.starts_with('.')),
        );
    }
    Ok(versions
        .into_iter()
        .map(|version| {
            let (state, progress) = match &dark {
                Some(d) if d.version == version => (dark_state(d), Some((d.done, d.total))),
                _ if serving.as_deref() == Some(version.as_str()) => ("serving", None),
                _ => ("retired", None),
            };
            Listed {
                version,
                state,
                progress,
            }
        })
        .collect())
}

/// Upload the dictionary in folder `source` into the store's data directory (checked whole
/// first; copied beside, synced, then renamed into `<data>/dictionaries/<version>/`) and
/// install it dark. Refused while a dark version is installed and for the serving version.
pub fn install(store: &Store, source: &Path) -> Result<Arc<Dictionary>, Error> {
    let checked = Dictionary::load(source)?;
    let version = checked.version().to_owned();
    let refused = |reason: String| StoreError::Swap {
        path: store.path().to_path_buf(),
        reason,
    };
    if let Some(dark) = store.dark()? {
        return Err(refused(format!(
            "dark version {} is installed already (flip to it first)",
            dark.version
        ))
        .into());
    }
    if store.dictionary_version()?.as_deref() == Some(version.as_str()) {
        return Err(refused(format!("{version} is the serving version")).into());
    }
    let target = upload(source, store.path(), &version)?;
    let dictionary = Arc::new(Dictionary::load(&target)?);
    store.install_dark(Arc::clone(&dictionary))?;
    Ok(dictionary)
}

/// Copy every file of `source` into `<data>/dictionaries/.<version>.tmp/`, fsync them, and
/// rename the folder to `<data>/dictionaries/<version>/` (replacing a retired upload of the
/// same name), which it returns. A version that cannot name a folder is refused before any
/// file is touched ([`upload_dir`]).
fn upload(source: &Path, data: &Path, version: &str) -> Result<PathBuf, Error> {
    let target = upload_dir(data, version).map_err(DictionaryError::from)?;
    let uploads = uploads_dir(data);
    let at = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::from(DictionaryError::Upload { path, source })
    };
    let temp = uploads.join(format!(".{version}.tmp"));
    for dir in [&temp, &target] {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(at(dir)(e)),
            _ => {}
        }
    }
    crate::backup::copy_folder(source, &temp, crate::backup::never).map_err(at(&temp))?;
    std::fs::rename(&temp, &target).map_err(at(&target))?;
    std::fs::File::open(&uploads)
        .and_then(|f| f.sync_all())
        .map_err(at(&uploads))?;
    Ok(target)
}

/// The pool a re-derivation running beside serving derives on: half the cores (at least one),
/// each thread at the lowest CPU priority ([`BACKGROUND_NICE`]), so the queries keep the other
/// half and take what they need of this one.
pub fn background_pool() -> rayon::ThreadPool {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    rayon::ThreadPoolBuilder::new()
        .num_threads((cores / 2).max(1))
        .start_handler(|_| yield_to_serving())
        .build()
        .expect("a thread pool")
}

/// The nice value of a background re-derivation thread: the lowest priority, so a query thread
/// (nice 0) wanting the same core gets nearly all of it.
pub const BACKGROUND_NICE: i32 = 19;

/// Lower the calling thread to [`BACKGROUND_NICE`] (Linux sets the nice value per thread).
/// Best effort: a refusal is logged and the work runs at normal priority.
fn yield_to_serving() {
    let thread = rustix::thread::gettid();
    if let Err(err) = rustix::process::setpriority_process(Some(thread), BACKGROUND_NICE) {
        tracing::warn!(%err, "could not lower a background thread's priority");
    }
}

/// Re-derive every row stored before the install under the dark version, a batch at a time
/// (resuming where the last committed batch stopped), calling `progress` after each batch.
/// Each batch first waits for this process's running searches to end (at most
/// [`YIELD_AT_MOST`]), so serving keeps its latency while a swap is prepared.
pub fn rederive(
    store: &Store,
    mut progress: impl FnMut(&DarkVersion),
) -> Result<DarkVersion, Error> {
    loop {
        crate::retrieve::yield_to_searches(YIELD_AT_MOST);
        let state = store.rederive_step(REDERIVE_BATCH_ROWS)?;
        progress(&state);
        if state.is_derived() {
            return Ok(state);
        }
    }
}

/// Open (or build) the dark version's arena generation in `<data>/arena/<version>/` and catch
/// it up from the dark retrieval rows.
pub fn build_arena(store: &Store, dictionary: &Dictionary) -> Result<Arena, Error> {
    let (mut arena, _) = Arena::open(store, dictionary)?;
    arena.catch_up(store, dictionary)?;
    Ok(arena)
}

/// The flip: catch the dark generation `arena` up to the last capture, make the dark version
/// serve (one store write), then remove the retired version's arena. The caller holds
/// captures back meanwhile and swaps its serving generation for `arena`. Returns the retired
/// version.
pub fn flip(store: &Store, dictionary: &Dictionary, arena: &mut Arena) -> Result<String, Error> {
    arena.catch_up(store, dictionary)?;
    let retired = store.flip()?;
    arena::remove_version(store.path(), &retired)?;
    Ok(retired)
}
