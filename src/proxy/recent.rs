//! The inspector's log of recent requests (`docs/proxy.md`, "Inspector"): for each user, the
//! last few chat requests as they were forwarded, with the recall that framed them, the memory
//! tool rounds run mid-stream and what was captured. In memory only, bounded twice: a number
//! of requests per user, and bytes over all users (the oldest request anywhere goes first).
//! Nothing here is written to disk, and no credential is held: the body forwarded carries none
//! (credentials travel in headers).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use hyper::body::Bytes;
use parking_lot::Mutex;

use crate::recall::Recall;
use crate::types::UserId;

/// How much the log holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests kept per user; 0 keeps none.
    pub per_user: usize,
    /// Bytes kept over all users (the forwarded bodies, mostly).
    pub bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            per_user: 16,
            bytes: 64 * 1024 * 1024,
        }
    }
}

/// One memory tool call run mid-stream.
#[derive(Debug, Clone)]
pub struct ToolRound {
    pub name: String,
    pub arguments: String,
    pub result: String,
}

/// What happened to a logged request after it was forwarded.
#[derive(Debug, Default)]
pub struct After {
    /// The upstream's status (none: it did not answer).
    pub status: Option<u16>,
    /// The memory tool calls run mid-stream, in order.
    pub rounds: Vec<ToolRound>,
    /// Whether the reply was captured, and whether it was cut short.
    pub reply: Option<bool>,
}

/// One logged request.
#[derive(Debug)]
pub struct Logged {
    /// Its number, in arrival order over the server's life.
    pub id: u64,
    pub user: UserId,
    /// Whose rows its frame could show: the asker's, then its group scope's other members'.
    pub scope: Vec<UserId>,
    pub at_ms: i64,
    /// The wire format's name ([`super::wire::Format::name`]).
    pub format: &'static str,
    pub model: String,
    pub conversation: String,
    /// The live question, if the request had one.
    pub question: Option<String>,
    /// `ok`, `off` or `unavailable`, as the `x-perpetuity-memory` header said.
    pub memory: &'static str,
    /// Whether the question was captured before the answer left.
    pub question_stored: bool,
    /// The request body exactly as forwarded upstream.
    pub forwarded: Bytes,
    /// The recall that framed it (none: recall was off, or a tool round's continuation reused
    /// its turn's frame).
    pub recall: Option<Recall>,
    /// Whether a continuation reused its turn's frame.
    pub reused: bool,
    /// Whether the memory tools rode along.
    pub tools: bool,
    pub after: Mutex<After>,
}

impl Logged {
    /// What the entry costs the byte bound.
    fn size(&self) -> usize {
        let frame: usize = self.recall.as_ref().map_or(0, |recall| {
            recall
                .frame
                .messages
                .iter()
                .map(|m| m.content.len())
                .sum::<usize>()
                + (recall.retrieved.len() + recall.offered.len()) * 32
        });
        self.forwarded.len() + frame + self.question.as_ref().map_or(0, String::len) + 256
    }
}

/// The log.
#[derive(Debug)]
pub struct Recent {
    limits: Limits,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    bytes: usize,
    users: HashMap<UserId, VecDeque<Arc<Logged>>>,
    /// Every kept entry's user and size by id (ids grow with arrival: the first is the
    /// oldest).
    order: BTreeMap<u64, (UserId, usize)>,
}

impl Recent {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            inner: Mutex::default(),
        }
    }

    /// Whether anything is kept.
    pub fn enabled(&self) -> bool {
        self.limits.per_user > 0 && self.limits.bytes > 0
    }

    /// The next request's number (the log numbers every request, kept or not).
    pub fn number(&self) -> u64 {
        let mut inner = self.inner.lock();
        inner.next += 1;
        inner.next
    }

    /// Keep `logged` (numbered by [`Recent::number`]), dropping what the bounds no longer
    /// allow: the user's oldest beyond `per_user`, then the oldest anywhere beyond `bytes`.
    /// An entry larger than the byte bound alone is not kept.
    pub fn keep(&self, logged: Arc<Logged>) {
        if !self.enabled() {
            return;
        }
        let size = logged.size();
        if size > self.limits.bytes {
            return;
        }
        let mut inner = self.inner.lock();
        let user = logged.user;
        let list = inner.users.entry(user).or_default();
        list.push_back(Arc::clone(&logged));
        let dropped = (list.len() > self.limits.per_user).then(|| list.pop_front());
        if let Some(Some(old)) = dropped {
            inner.forget(old.id);
        }
        inner.bytes += size;
        inner.order.insert(logged.id, (user, size));
        inner.evict(self.limits.bytes);
    }

    /// Note a memory tool call run for `logged`, its bytes counted against the byte bound like
    /// the entry's own (the oldest entries go when it is passed).
    pub fn add_round(&self, logged: &Logged, round: ToolRound) {
        let size = round.name.len() + round.arguments.len() + round.result.len() + 32;
        logged.after.lock().rounds.push(round);
        let mut inner = self.inner.lock();
        if let Some((_, kept)) = inner.order.get_mut(&logged.id) {
            *kept += size;
            inner.bytes += size;
            inner.evict(self.limits.bytes);
        }
    }

    /// A user's kept requests, newest first.
    pub fn of(&self, user: UserId) -> Vec<Arc<Logged>> {
        let inner = self.inner.lock();
        inner
            .users
            .get(&user)
            .map(|list| list.iter().rev().cloned().collect())
            .unwrap_or_default()
    }

    /// Forget every request of `users` and every request whose scope held one of them (they
    /// were purged: a teammate's frame may quote them).
    pub fn forget_users(&self, users: &[UserId]) {
        let mut inner = self.inner.lock();
        let mut gone = Vec::new();
        inner.users.retain(|_, list| {
            list.retain(|entry| {
                let held = users.contains(&entry.user)
                    || entry.scope.iter().any(|member| users.contains(member));
                if held {
                    gone.push(entry.id);
                }
                !held
            });
            !list.is_empty()
        });
        for id in gone {
            inner.forget(id);
        }
    }
}

impl Inner {
    /// Drop the oldest entries anywhere while the kept bytes are beyond `bytes`.
    fn evict(&mut self, bytes: usize) {
        while self.bytes > bytes {
            let Some((id, (user, size))) = self.order.pop_first() else {
                break;
            };
            self.bytes -= size;
            if let Some(list) = self.users.get_mut(&user) {
                list.retain(|entry| entry.id != id);
                if list.is_empty() {
                    self.users.remove(&user);
                }
            }
        }
    }

    /// Drop entry `id` from the byte account.
    fn forget(&mut self, id: u64) {
        if let Some((_, size)) = self.order.remove(&id) {
            self.bytes -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logged(recent: &Recent, user: u64, body: usize) -> Arc<Logged> {
        logged_in(recent, user, &[user], body)
    }

    fn logged_in(recent: &Recent, user: u64, scope: &[u64], body: usize) -> Arc<Logged> {
        Arc::new(Logged {
            id: recent.number(),
            user: UserId(user),
            scope: scope.iter().map(|&member| UserId(member)).collect(),
            at_ms: 0,
            format: "chat",
            model: "m".into(),
            conversation: "c".into(),
            question: None,
            memory: "ok",
            question_stored: false,
            forwarded: Bytes::from(vec![b'x'; body]),
            recall: None,
            reused: false,
            tools: false,
            after: Mutex::default(),
        })
    }

    #[test]
    fn each_user_keeps_its_newest_and_the_byte_bound_drops_the_oldest_anywhere() {
        let recent = Recent::new(Limits {
            per_user: 2,
            bytes: 4 * (1_000 + 256),
        });
        for _ in 0..3 {
            recent.keep(logged(&recent, 1, 1_000));
        }
        let ids: Vec<u64> = recent.of(UserId(1)).iter().map(|l| l.id).collect();
        assert_eq!(ids, [3, 2], "newest first, two per user");
        recent.keep(logged(&recent, 2, 1_000));
        recent.keep(logged(&recent, 2, 1_000));
        recent.keep(logged(&recent, 3, 1_000));
        // Five entries would pass the bound of four: user 1's oldest (2) went.
        let ids: Vec<u64> = recent.of(UserId(1)).iter().map(|l| l.id).collect();
        assert_eq!(ids, [3]);
        assert_eq!(recent.of(UserId(2)).len(), 2);
        recent.keep(logged(&recent, 4, 10_000));
        assert!(
            recent.of(UserId(4)).is_empty(),
            "larger than the bound alone"
        );
        recent.forget_users(&[UserId(2)]);
        assert!(recent.of(UserId(2)).is_empty());
        assert_eq!(recent.inner.lock().bytes, 2 * (1_000 + 256));
    }

    #[test]
    fn a_purge_forgets_the_teammates_requests_whose_scope_held_the_purged_user() {
        let recent = Recent::new(Limits {
            per_user: 4,
            bytes: 1 << 20,
        });
        recent.keep(logged_in(&recent, 1, &[1, 2], 10));
        recent.keep(logged_in(&recent, 1, &[1], 10));
        recent.keep(logged_in(&recent, 3, &[3, 1], 10));
        recent.forget_users(&[UserId(2)]);
        let ids: Vec<u64> = recent.of(UserId(1)).iter().map(|l| l.id).collect();
        assert_eq!(ids, [2], "the request whose scope held user 2 is gone");
        assert_eq!(recent.of(UserId(3)).len(), 1);
        recent.forget_users(&[UserId(1)]);
        assert!(recent.of(UserId(1)).is_empty());
        assert!(
            recent.of(UserId(3)).is_empty(),
            "a teammate's request whose scope held user 1"
        );
        assert_eq!(recent.inner.lock().bytes, 0);
    }

    #[test]
    fn tool_rounds_noted_after_an_entry_is_kept_count_against_the_byte_bound() {
        let recent = Recent::new(Limits {
            per_user: 4,
            bytes: 2 * (1_000 + 256) + 100,
        });
        let first = logged(&recent, 1, 1_000);
        recent.keep(Arc::clone(&first));
        recent.keep(logged(&recent, 1, 1_000));
        let round = |result: usize| ToolRound {
            name: "memory_search".into(),
            arguments: "{}".into(),
            result: "r".repeat(result),
        };
        recent.add_round(&first, round(10));
        assert_eq!(recent.of(UserId(1)).len(), 2, "within the bound");
        assert_eq!(first.after.lock().rounds.len(), 1);
        recent.add_round(&first, round(500));
        let ids: Vec<u64> = recent.of(UserId(1)).iter().map(|l| l.id).collect();
        assert_eq!(ids, [2], "the rounds pass the bound: the oldest entry goes");
        assert_eq!(recent.inner.lock().bytes, 1_000 + 256);
    }

    #[test]
    fn a_log_with_no_room_keeps_nothing() {
        let recent = Recent::new(Limits {
            per_user: 0,
            bytes: 1 << 20,
        });
        recent.keep(logged(&recent, 1, 10));
        assert!(recent.of(UserId(1)).is_empty());
    }
}
