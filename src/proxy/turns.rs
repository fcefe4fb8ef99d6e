//! One frame per turn: the frame computed when a turn's question is captured, reused byte for
//! byte by every tool-round continuation of that turn, so the forwarded prefix of a tool loop
//! stays the same from request to request and the provider's prefix cache covers it.
//!
//! A turn is keyed by a hash of who asks, the conversation, the live question's place in the
//! request and the question's item: a continuation resends them unchanged; a later turn sits
//! further on (its history has grown) or holds other words, and another user or conversation
//! cannot match. Only that item is hashed, not the history before it, so a long history costs
//! nothing here; a new turn always recalls and replaces what its key held. The table
//! lives in memory only: after a restart a continuation finds nothing and its frame is
//! recalled again (`docs/proxy.md`).

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::recall::Pin;
use crate::types::{RowId, UserId};

use super::wire::Request;

/// Turns remembered at once; the oldest is forgotten first. A frame is at most a few tens of
/// kilobytes, so this holds the tool loops of thousands of agents in well under a gigabyte.
pub const TURNS_KEPT: usize = 4096;

/// A turn's key: see the module's doc.
pub type TurnKey = [u8; 32];

/// What a turn's continuations reuse.
#[derive(Debug)]
pub struct TurnFrame {
    /// Whose rows the frame may show: the asker's, then its group scope's other members'. A
    /// purge of any of them forgets the frame, so no purged text is forwarded again.
    pub scope: Vec<UserId>,
    /// The frame's items in the request's wire format, the last one ending with the question.
    pub items: Vec<Value>,
    /// The retrieved set (for the memory tools), best first.
    pub retrieved: Vec<RowId>,
    /// The rows shown in the frame.
    pub shown: Vec<RowId>,
    /// Tokens of the frame, and the turns its cap left out (the response's headers).
    pub tokens: usize,
    pub trimmed: usize,
    /// How many items after the question have been captured as the turn's tool rows.
    pub captured: Mutex<usize>,
}

/// The turns whose frames are remembered, newest last.
#[derive(Debug, Default)]
pub struct Turns {
    inner: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    frames: HashMap<TurnKey, Arc<TurnFrame>>,
    order: VecDeque<TurnKey>,
    /// When each turn's question was captured, whose it is, oldest first (at most
    /// [`TURNS_KEPT`]).
    captured: VecDeque<(Instant, TurnKey, UserId)>,
    /// The kept part of each working session's last frame, by user and conversation, with the
    /// scope whose rows it shows; the oldest is forgotten first beyond [`TURNS_KEPT`].
    pins: HashMap<(UserId, String), (Vec<UserId>, Arc<Pin>)>,
    pinned: VecDeque<(UserId, String)>,
}

impl Turns {
    /// The key of `request`'s turn for `user_key` in `conversation` (`None` without a question).
    pub fn key(user_key: &str, conversation: &str, request: &Request) -> Option<TurnKey> {
        let at = request.question_at?;
        let mut hash = Sha256::new();
        for part in [user_key, conversation, request.format.list()] {
            hash.update(part.as_bytes());
            hash.update([0]);
        }
        hash.update(at.to_le_bytes());
        hash.update(serde_json::to_vec(&request.messages[at]).expect("a JSON value serialises"));
        Some(hash.finalize().into())
    }

    /// The frame of the turn `key`, if it is remembered.
    pub fn get(&self, key: &TurnKey) -> Option<Arc<TurnFrame>> {
        self.inner.lock().frames.get(key).cloned()
    }

    /// Remember `frame` as the turn `key`'s, forgetting the oldest beyond [`TURNS_KEPT`].
    pub fn insert(&self, key: TurnKey, frame: Arc<TurnFrame>) {
        let mut table = self.inner.lock();
        if table.frames.insert(key, frame).is_none() {
            table.order.push_back(key);
        }
        while table.order.len() > TURNS_KEPT {
            if let Some(old) = table.order.pop_front() {
                table.frames.remove(&old);
            }
        }
    }

    /// Note that the question of the turn `key`, `user`'s, was captured now.
    pub fn note_captured(&self, key: TurnKey, user: UserId) {
        let mut table = self.inner.lock();
        table.captured.push_back((Instant::now(), key, user));
        if table.captured.len() > TURNS_KEPT {
            table.captured.pop_front();
        }
    }

    /// Whether the question of the turn `key` was captured less than `window` ago.
    pub fn captured_within(&self, key: &TurnKey, window: Duration) -> bool {
        let mut table = self.inner.lock();
        while table
            .captured
            .front()
            .is_some_and(|(at, _, _)| at.elapsed() >= window)
        {
            table.captured.pop_front();
        }
        table
            .captured
            .iter()
            .any(|(_, captured, _)| captured == key)
    }

    /// The kept part of `user`'s last frame in the working session `conversation`.
    pub fn pin(&self, user: UserId, conversation: &str) -> Option<Arc<Pin>> {
        let table = self.inner.lock();
        let key = (user, conversation.to_owned());
        table.pins.get(&key).map(|(_, pin)| Arc::clone(pin))
    }

    /// Keep `pin` as the kept part of `user`'s frame in `conversation`, showing rows of
    /// `scope`.
    pub fn keep_pin(&self, user: UserId, conversation: &str, scope: &[UserId], pin: Pin) {
        let mut table = self.inner.lock();
        let key = (user, conversation.to_owned());
        if table
            .pins
            .insert(key.clone(), (scope.to_vec(), Arc::new(pin)))
            .is_none()
        {
            table.pinned.push_back(key);
        }
        while table.pinned.len() > TURNS_KEPT {
            if let Some(old) = table.pinned.pop_front() {
                table.pins.remove(&old);
            }
        }
    }

    /// Forget every frame and kept part that may show `user`'s rows (its own turns' and its
    /// group scope teammates'), and its captures (its memory was purged).
    pub fn forget(&self, user: UserId) {
        let mut table = self.inner.lock();
        table.frames.retain(|_, frame| !frame.scope.contains(&user));
        table.pins.retain(|_, (scope, _)| !scope.contains(&user));
        let Table {
            frames,
            order,
            captured,
            pins,
            pinned,
        } = &mut *table;
        order.retain(|key| frames.contains_key(key));
        pinned.retain(|key| pins.contains_key(key));
        captured.retain(|(_, _, whose)| *whose != user);
    }
}
