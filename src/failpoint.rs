//! Crash points and injected I/O errors for the reliability tests (the `failpoints` cargo
//! feature). A named crash point aborts the process, as a crash there would (no destructor
//! runs, nothing is flushed), when `PERPETUITY_FAILPOINT` names it: `NAME` the first time it is
//! passed, `NAME:N` the Nth time. A named error point fails with an I/O error, as a full disk
//! would, while the file `NAME` exists in the folder `PERPETUITY_FAILPOINT_ERRORS` names, so a
//! test turns the fault on and off while the server runs. Without the feature every point
//! compiles to nothing.
//!
//! Points: `store.after_commit` (a capture batch is in the store, its caller not yet told),
//! `arena.mid_append` (a row appended to the arena's mapping, the batch not committed),
//! `arena.mid_recode` (a recomputed codebook has coded a page's first row, not its others),
//! `arena.mid_seal` (a page's sketch sum sealed, its checksum not), `arena.mid_commit` (page
//! checksums and codebook written, the header not), `purge.after_batch`
//! (a purge's deletions committed, nothing compacted), `purge.mid_compaction` (flushed, not
//! compacted), `dict.mid_derive` (a re-derivation batch of a dark dictionary version
//! committed, the next not), `dict.before_flip` (the dark version derived and its arena caught
//! up, the flip not written), `dict.after_flip` (the flip written, the retired slot not
//! cleared).
//!
//! Error points: `store.write` (every write to the store: captures, reheats, the readiness
//! probe, purges), `arena.grow` (an arena file grown to hold more rows).

/// Abort here if `PERPETUITY_FAILPOINT` names this point and its count is reached.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PASSED: AtomicU64 = AtomicU64::new(0);
    let Ok(spec) = std::env::var("PERPETUITY_FAILPOINT") else {
        return;
    };
    let (point, nth) = match spec.split_once(':') {
        Some((point, n)) => (point, n.parse().unwrap_or(1)),
        None => (spec.as_str(), 1),
    };
    if point == name && PASSED.fetch_add(1, Ordering::SeqCst) + 1 >= nth {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
}

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// An injected I/O error while the error point `name` is switched on (its file exists in the
/// folder `PERPETUITY_FAILPOINT_ERRORS` names).
#[cfg(feature = "failpoints")]
pub fn io_error(name: &str) -> std::io::Result<()> {
    let Some(folder) = std::env::var_os("PERPETUITY_FAILPOINT_ERRORS") else {
        return Ok(());
    };
    if std::path::Path::new(&folder).join(name).exists() {
        return Err(std::io::Error::other(format!(
            "failpoint {name}: injected I/O error"
        )));
    }
    Ok(())
}

/// Without the `failpoints` feature: never an error.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn io_error(_name: &str) -> std::io::Result<()> {
    Ok(())
}
