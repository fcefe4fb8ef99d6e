//! The provider's verdict on each credential (`docs/proxy.md`, "Who may write"): a credential
//! earns the right to be remembered by a success (a 2xx) the provider answered one of its
//! requests with, not by being presented. The verdict is kept by the user's id (the keyed
//! hash of the credential, never the credential), in memory, for [`VERDICT_HOLDS`] after the
//! last success; a refusal (401, 403) ends it at once.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::types::UserId;

/// How long a success vouches for a credential: its requests are captured before they are
/// forwarded while it holds; after it, and after a start, they wait for the provider again.
pub const VERDICT_HOLDS: Duration = Duration::from_secs(24 * 60 * 60);

/// Credentials whose verdicts are kept at once; the oldest is forgotten first (its next
/// request waits for the provider).
pub const VERDICTS_KEPT: usize = 65_536;

/// The last success of each credential the provider accepted.
#[derive(Debug, Default)]
pub struct Verdicts {
    accepted: Mutex<HashMap<UserId, Instant>>,
}

impl Verdicts {
    /// Whether the provider accepted `user`'s credential less than [`VERDICT_HOLDS`] ago.
    pub fn holds(&self, user: UserId) -> bool {
        self.accepted
            .lock()
            .get(&user)
            .is_some_and(|at| at.elapsed() < VERDICT_HOLDS)
    }

    /// Note the provider's answer to a request of `user`'s credential: a success renews its
    /// verdict, a refusal of the credential ends it, anything else leaves it as it was.
    pub fn answered(&self, user: UserId, status: hyper::StatusCode) {
        let mut accepted = self.accepted.lock();
        if status.is_success() {
            if accepted.len() >= VERDICTS_KEPT && !accepted.contains_key(&user) {
                let oldest = accepted.iter().min_by_key(|(_, at)| **at).map(|(u, _)| *u);
                if let Some(oldest) = oldest {
                    accepted.remove(&oldest);
                }
            }
            accepted.insert(user, Instant::now());
        } else if matches!(
            status,
            hyper::StatusCode::UNAUTHORIZED | hyper::StatusCode::FORBIDDEN
        ) {
            accepted.remove(&user);
        }
    }
}
