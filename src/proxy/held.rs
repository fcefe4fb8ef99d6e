//! What of a request's history the memory holds (`docs/proxy.md`, "What the frame replaces").
//!
//! The frame stands in for the past turns the proxy itself captured: a user's turn it stored
//! when it was live, and what followed it (the agent's replies, calls and results, captured as
//! they passed). Anything else a harness resends before the live turn (its example exchanges,
//! files it put in the chat with the assistant's "Ok", a repository map, a summary) was never
//! a live turn here, is not in the memory, and is forwarded where the harness put it.
//!
//! Questions are known by a fingerprint of their words: per conversation (read back from the
//! store's rows of the conversation the first time it is asked about after a start), and per
//! user with the conversation each was asked in. A request costs one hash of each of its user
//! turns' words and a table lookup each; the first request of a conversation after a start
//! reads its user rows once (at most [`LOAD_ROWS`] rows).
//!
//! Beside them: each user's last question (a harness's template around the user's words is
//! stored once, [`Held::untemplated`]), and which harness sessions' turns offer tools (a
//! request of such a session without tools is a helper's side call).

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::store::{Store, StoreError};
use crate::types::{Role, RowId, UserId};

use super::harness::{self, Kind};
use super::identity;
use super::wire::{self, Request};

/// Conversations (and users, and sessions) whose state is kept at once; the oldest is
/// forgotten first (a conversation's questions are read from the store again when it returns).
pub const CONVERSATIONS_KEPT: usize = 16_384;

/// Questions whose conversation is kept at once, for all users.
pub const QUESTIONS_KEPT: usize = 262_144;

/// The longest question kept as a user's last one, in bytes: a template is a few kilobytes,
/// and a pasted log of megabytes is compared with nothing (thousands of users' last questions
/// stay within a few hundred megabytes).
pub const LAST_QUESTION_BYTES: usize = 64 * 1024;

/// The newest rows of a conversation read for its questions after a start.
pub const LOAD_ROWS: usize = 16_384;

/// How many of a request's user turns are tried, oldest first, for the conversation it
/// continues when no header names it.
const OPENINGS_TRIED: usize = 64;

/// The questions each conversation holds, and the rest of this module's state.
#[derive(Debug, Default)]
pub struct Held {
    inner: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    /// Each conversation's questions, by user and conversation, oldest first.
    questions: HashMap<(UserId, String), HashSet<u64>>,
    order: VecDeque<(UserId, String)>,
    /// The conversation each question was asked in, by user and question, oldest first.
    asked_in: HashMap<(UserId, u64), String>,
    asked_order: VecDeque<(UserId, u64)>,
    /// Harness sessions whose turns offer tools, oldest first.
    tool_sessions: HashSet<(UserId, String)>,
    tool_order: VecDeque<(UserId, String)>,
    /// Each user's last question as its harness sent it, and its conversation, oldest first.
    last_questions: HashMap<UserId, (String, String)>,
    asked: VecDeque<UserId>,
}

/// What [`Held::read`] found: the conversation a request continues and the items of its
/// history the memory does not hold (their indices, in order): forwarded as the harness sent
/// them, never stored.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub conversation: String,
    pub context: Vec<usize>,
}

fn fingerprint(words: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    words.hash(&mut hasher);
    hasher.finish()
}

/// Insert `key` into a table kept in `order`, forgetting the oldest beyond `kept`.
fn keep<K: Clone + Eq + Hash, V>(
    map: &mut HashMap<K, V>,
    order: &mut VecDeque<K>,
    kept: usize,
    key: K,
    value: V,
) {
    if map.insert(key.clone(), value).is_none() {
        order.push_back(key);
    }
    while order.len() > kept {
        if let Some(old) = order.pop_front() {
            map.remove(&old);
        }
    }
}

impl Held {
    /// Whether `user`'s `conversation` holds a question of these `words`.
    pub fn holds(
        &self,
        store: &Store,
        user: UserId,
        conversation: &str,
        words: &str,
    ) -> Result<bool, StoreError> {
        let print = fingerprint(words);
        let key = (user, conversation.to_owned());
        if let Some(questions) = self.inner.lock().questions.get(&key) {
            return Ok(questions.contains(&print));
        }
        let loaded = questions_of(store, user, conversation)?;
        let holds = loaded.contains(&print);
        let mut table = self.inner.lock();
        if !table.questions.contains_key(&key) {
            let Table {
                questions, order, ..
            } = &mut *table;
            keep(questions, order, CONVERSATIONS_KEPT, key, loaded);
        }
        Ok(holds)
    }

    /// Note that `user`'s `conversation` now holds a question, as each of `forms` (the words
    /// as the harness sent them, and as stored). A conversation whose questions are not in the
    /// table is read whole from the store when next asked about, so only the question's
    /// conversation is noted for it.
    pub fn note(&self, user: UserId, conversation: &str, forms: &[&str]) {
        let mut table = self.inner.lock();
        let Table {
            questions,
            asked_in,
            asked_order,
            ..
        } = &mut *table;
        for form in forms {
            let print = fingerprint(form);
            if let Some(held) = questions.get_mut(&(user, conversation.to_owned())) {
                held.insert(print);
            }
            keep(
                asked_in,
                asked_order,
                QUESTIONS_KEPT,
                (user, print),
                conversation.to_owned(),
            );
        }
    }

    /// Note that a turn of `user`'s harness session `session` offered the model tools.
    pub fn note_tools(&self, user: UserId, session: &str) {
        let mut table = self.inner.lock();
        let key = (user, session.to_owned());
        if table.tool_sessions.insert(key.clone()) {
            table.tool_order.push_back(key);
        }
        while table.tool_order.len() > CONVERSATIONS_KEPT {
            if let Some(old) = table.tool_order.pop_front() {
                table.tool_sessions.remove(&old);
            }
        }
    }

    /// Whether a turn of `user`'s harness session `session` offered tools.
    pub fn offers_tools(&self, user: UserId, session: &str) -> bool {
        self.inner
            .lock()
            .tool_sessions
            .contains(&(user, session.to_owned()))
    }

    /// Learn from `user`'s new question `words` the template its harness puts around the
    /// user's words, if it shares one with the last question ([`harness::without_template`]):
    /// the last question is then also known by its words without it, as a harness that adds
    /// the template to the live turn only resends it in its history (Aider).
    pub fn learn_template(&self, user: UserId, words: &str) {
        let last = self.inner.lock().last_questions.get(&user).cloned();
        if let Some((previous, conversation)) = last {
            let bare = harness::without_template(&previous, words);
            if bare != previous.as_str() {
                self.note(user, &conversation, &[&bare]);
            }
        }
    }

    /// What of `user`'s new question `words`, asked in `conversation`, is stored: the words
    /// without the template they share with the user's last question, which is stored once,
    /// with the question that brought it first (after a start, once more). Compared outside
    /// the table's lock; a question longer than [`LAST_QUESTION_BYTES`] is not kept.
    pub fn untemplated(&self, user: UserId, conversation: &str, words: &str) -> String {
        let previous = self.inner.lock().last_questions.get(&user).cloned();
        let stored = match &previous {
            Some((previous, _)) => harness::without_template(words, previous).into_owned(),
            None => words.to_owned(),
        };
        let mut table = self.inner.lock();
        let Table {
            last_questions,
            asked,
            ..
        } = &mut *table;
        if words.len() > LAST_QUESTION_BYTES {
            if last_questions.remove(&user).is_some() {
                asked.retain(|whose| *whose != user);
            }
        } else {
            keep(
                last_questions,
                asked,
                CONVERSATIONS_KEPT,
                user,
                (words.to_owned(), conversation.to_owned()),
            );
        }
        stored
    }

    /// Forget `user`'s conversations (its memory was purged).
    pub fn forget(&self, user: UserId) {
        let mut table = self.inner.lock();
        let Table {
            questions,
            order,
            asked_in,
            asked_order,
            tool_sessions,
            tool_order,
            last_questions,
            asked,
        } = &mut *table;
        questions.retain(|(whose, _), _| *whose != user);
        order.retain(|key| questions.contains_key(key));
        asked_in.retain(|(whose, _), _| *whose != user);
        asked_order.retain(|key| asked_in.contains_key(key));
        tool_sessions.retain(|(whose, _)| *whose != user);
        tool_order.retain(|key| tool_sessions.contains(key));
        last_questions.remove(&user);
        asked.retain(|whose| last_questions.contains_key(whose));
    }

    /// The conversation `request` continues and what of its history `user`'s memory does not
    /// hold. The conversation is the one `named` by a header or the harness, if any (unless
    /// its history comes from another: [`Held::continued`]); otherwise the conversation of the
    /// oldest of the request's user turns that the user asked here (a harness's example turns
    /// never were), else a new one keyed by the live turn (the first the user's words are in).
    pub fn read(
        &self,
        store: &Store,
        user: UserId,
        request: &Request,
        named: Option<String>,
    ) -> Result<History, StoreError> {
        let at = request.question_at.unwrap_or(request.messages.len());
        let turns: Vec<(usize, String)> = (0..at)
            .filter(|&i| request.kinds[i] == Kind::Turn)
            .filter_map(|i| Some((i, wire::turn_text(&request.messages[i])?)))
            .collect();
        let conversation = match named {
            Some(named) => self.continued(store, user, &turns, named)?,
            None => match self.opened(store, user, &turns)? {
                Some(opened) => opened,
                None => identity::conversation_key(
                    request
                        .question
                        .as_deref()
                        .or(request.first.as_deref())
                        .unwrap_or(""),
                ),
            },
        };
        let mut held_turns = HashSet::new();
        for (i, words) in &turns {
            if self.holds(store, user, &conversation, words)? {
                held_turns.insert(*i);
            }
        }
        let mut context = Vec::new();
        let mut held = false;
        for i in 0..at {
            match request.kinds[i] {
                Kind::Turn => held = held_turns.contains(&i),
                Kind::Agent | Kind::Result => {}
                Kind::Instructions | Kind::Context => continue,
            }
            if !held {
                context.push(i);
            }
        }
        Ok(History {
            conversation,
            context,
        })
    }

    /// The conversation `named` by a header or the harness, unless the oldest of `turns` that
    /// `user` asked here was asked in another conversation: a session resumed or forked under
    /// a new id continues the conversation its history comes from.
    fn continued(
        &self,
        store: &Store,
        user: UserId,
        turns: &[(usize, String)],
        named: String,
    ) -> Result<String, StoreError> {
        for (i, (_, words)) in turns.iter().take(OPENINGS_TRIED).enumerate() {
            if self.holds(store, user, &named, words)? {
                return Ok(named);
            }
            if let Some(asked) = self.opened(store, user, &turns[i..=i])? {
                return Ok(asked);
            }
        }
        Ok(named)
    }

    /// The conversation of the oldest of `turns` (their words) that `user` asked here: by the
    /// questions noted since the start, else by a conversation keyed by the turn's words that
    /// holds it (the store's, after a start).
    fn opened(
        &self,
        store: &Store,
        user: UserId,
        turns: &[(usize, String)],
    ) -> Result<Option<String>, StoreError> {
        for (_, words) in turns.iter().take(OPENINGS_TRIED) {
            let asked = self
                .inner
                .lock()
                .asked_in
                .get(&(user, fingerprint(words)))
                .cloned();
            if asked.is_some() {
                return Ok(asked);
            }
            let key = identity::conversation_key(words);
            if self.holds(store, user, &key, words)? {
                return Ok(Some(key));
            }
        }
        Ok(None)
    }
}

/// The fingerprints of the questions `user`'s `conversation` holds, from its newest
/// [`LOAD_ROWS`] rows: each user message whose chunks were all read, joined.
fn questions_of(
    store: &Store,
    user: UserId,
    conversation: &str,
) -> Result<HashSet<u64>, StoreError> {
    let mut messages: HashMap<RowId, Vec<(u16, u16, String)>> = HashMap::new();
    for id in store
        .conversation_rows_newest_first(user, conversation)
        .take(LOAD_ROWS)
    {
        let Some(row) = store.row(user, id?)? else {
            continue;
        };
        if row.role == Role::User {
            messages
                .entry(row.message)
                .or_default()
                .push((row.chunk, row.chunks, row.text));
        }
    }
    Ok(messages
        .into_values()
        .filter_map(|mut chunks| {
            chunks.sort_unstable_by_key(|(chunk, _, _)| *chunk);
            let whole = chunks.iter().enumerate().all(|(i, (chunk, count, _))| {
                usize::from(*chunk) == i && chunks.len() == usize::from(*count)
            });
            whole.then(|| {
                let words: String = chunks.into_iter().map(|(_, _, text)| text).collect();
                fingerprint(&words)
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_is_known_from_the_last_question_and_a_huge_one_is_not_kept() {
        let held = Held::default();
        let user = UserId(7);
        let rules = "Every block must use this format.\n".repeat(40);
        let ask = |words: &str| format!("{words}\n\n{rules}");
        assert_eq!(held.untemplated(user, "c", &ask("One.")), ask("One."));
        assert_eq!(held.untemplated(user, "c", &ask("Two.")), "Two.");
        let huge = "log line\n".repeat(LAST_QUESTION_BYTES / 8);
        assert!(held.untemplated(user, "c", &huge) == huge, "stored whole");
        assert!(held.inner.lock().last_questions.is_empty(), "not kept");
        assert!(held.inner.lock().asked.is_empty());
        assert_eq!(
            held.untemplated(user, "c", &ask("Three.")),
            ask("Three."),
            "compared with nothing after the huge one"
        );
    }
}
