//! The replay evaluation (`perpetuity eval --format claude-code|codex PATH...`): real recorded
//! coding-agent sessions sent again, model call by model call, through the real HTTP proxy,
//! to measure what the frame keeps of what the agent went on to use.
//!
//! Each transcript is read into the requests its harness sent ([`transcript`], [`request`]).
//! Every session of the paths is replayed under one credential, in time order, through a proxy
//! over a fresh memory, against a local upstream that answers each call with its recorded
//! answer and keeps the body the proxy forwarded ([`drive`]). Each call's answer is read for
//! identifier terms (paths, names, versions: what an agent must copy exactly) that the history
//! the harness sent held, by where they were: the current turn, or only earlier turns; and for
//! terms of no earlier part of the session that an earlier session held ([`plan`]). The share
//! of them the forwarded conversation still holds is its support, beside two baselines cut to
//! the same size ([`baselines`]): the harness's own newest messages, and its history with old
//! tool results cleared. The replay runs once per `session_tokens` setting, giving support
//! against forwarded size; the forwarded bytes, what a prefix cache serves of them and whether
//! each live prompt arrived whole are reported too ([`report`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::dictionary::Dictionary;
use crate::recall::RecallConfig;
use crate::scan::kernels::Kernels;
use crate::store::StoreError;

mod baselines;
mod drive;
mod plan;
mod report;
mod request;
mod terms;
mod transcript;

pub use drive::{Found, Measured};
pub use report::{
    Bytes, Prefix, PrefixShares, Prompts, ReplayReport, SettingReport, Share, Summary, Support,
    plot,
};
pub use transcript::{Call, Harness, ReadCounts, Session, read};

/// The `session_tokens` settings replayed besides the shipped default when none are given: a
/// working session's tool messages quoted whole while warm from a few to a few dozen thousand
/// tokens.
pub const DEFAULT_SESSION_TOKENS: [usize; 3] = [2_000, 4_000, 8_000];

/// A replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Class: client. A transcript or folder could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Class: client. The paths hold no model call to replay.
    #[error("no model call found in the given paths ({files} transcript files read)")]
    Empty { files: usize },
    /// Class: client. No `session_tokens` setting to replay at.
    #[error("--session-tokens needs one or more settings")]
    NoSettings,
    /// Class: internal. The scratch memory could not be made.
    #[error(transparent)]
    Eval(#[from] super::EvalError),
    /// Class: internal or corruption (see [`StoreError`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Class: internal (the engine over the scratch memory).
    #[error(transparent)]
    Memory(#[from] crate::error::Error),
    /// Class: internal. The local proxy or upstream could not start, or a call to it failed.
    #[error("the local proxy or upstream: {0}")]
    Local(#[from] std::io::Error),
    /// Class: internal. A request could not be made or its answer read.
    #[error("a replayed call: {0}")]
    Proxy(String),
}

/// What every replay of a run shares.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The `session_tokens` settings, one replay each, in order.
    pub session_tokens: Vec<usize>,
    /// The dictionary each scratch memory serves.
    pub dictionary: Arc<Dictionary>,
    pub kernels: Kernels,
}

/// Where a run stands; the binary prints these on stderr.
#[derive(Debug, Clone, Copy)]
pub enum Progress {
    /// The calls' terms are being found (before any replay).
    Planning { sessions: usize, calls: usize },
    /// A replay at one setting has sent `calls.0` of `calls.1` calls, in session `sessions.0`
    /// of `sessions.1`.
    Calls {
        session_tokens: usize,
        sessions: (usize, usize),
        calls: (usize, usize),
    },
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Planning { sessions, calls } => {
                write!(
                    f,
                    "reading {calls} calls of {sessions} sessions for their terms"
                )
            }
            Self::Calls {
                session_tokens,
                sessions,
                calls,
            } => write!(
                f,
                "session_tokens {session_tokens}: session {}/{}, calls {}/{}",
                sessions.0, sessions.1, calls.0, calls.1
            ),
        }
    }
}

/// Replay `sessions` (as [`read`] gives them, with its `counts`) once per setting of `setup`;
/// each setting's calls, as measured, are handed to `each` with the setting.
pub fn run(
    sessions: &[Session],
    counts: ReadCounts,
    setup: &Setup,
    mut progress: impl FnMut(Progress),
    mut each: impl FnMut(usize, &[Measured]),
) -> Result<ReplayReport, ReplayError> {
    if setup.session_tokens.is_empty() {
        return Err(ReplayError::NoSettings);
    }
    let calls: usize = sessions.iter().map(|s| s.calls.len()).sum();
    if calls == 0 {
        return Err(ReplayError::Empty {
            files: counts.files,
        });
    }
    progress(Progress::Planning {
        sessions: sessions.len(),
        calls,
    });
    let plans = plan::plans(sessions);
    let shipped = RecallConfig::default().session_tokens;
    let mut settings = Vec::with_capacity(setup.session_tokens.len());
    for &session_tokens in &setup.session_tokens {
        let started = Instant::now();
        let replayed = drive::replay(sessions, &plans, setup, session_tokens, &mut progress)?;
        each(session_tokens, &replayed.measured);
        settings.push(report::setting(
            session_tokens,
            session_tokens == shipped,
            &replayed.measured,
            (replayed.failed, replayed.first_failure),
            started.elapsed().as_secs_f64(),
        ));
    }
    let mut harnesses: Vec<Harness> = sessions.iter().map(|s| s.harness).collect();
    harnesses.sort();
    harnesses.dedup();
    Ok(ReplayReport {
        harnesses: harnesses.into_iter().map(Harness::name).collect(),
        sessions: sessions.len(),
        calls,
        read: counts,
        settings,
    })
}

/// The settings replayed when none are given: the shipped default and
/// [`DEFAULT_SESSION_TOKENS`], smallest first.
pub fn default_settings() -> Vec<usize> {
    let mut settings = vec![RecallConfig::default().session_tokens];
    settings.extend(DEFAULT_SESSION_TOKENS);
    settings.sort_unstable();
    settings.dedup();
    settings
}
