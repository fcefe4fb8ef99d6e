//! What a chat request remembers before it is forwarded: its turn captured (or deferred until
//! the reply), the tool round's items as tool rows, and the frame recalled or reused.

use super::*;
use held::History;

/// What [`remember`] did: whether the question was committed, and the turn's frame (`Ok(None)`
/// when recall is off or there is no question to recall for).
pub(super) struct Remembered {
    /// The conversation the request continues and what of its history the memory does not
    /// hold.
    pub(super) history: History,
    pub(super) question_stored: bool,
    pub(super) recall: Result<Option<Recalled>, Error>,
    /// What waits for the provider to accept the credential.
    pub(super) deferred: Deferred,
}

/// The captures of a request whose credential owns no memory yet, or has no fresh verdict
/// ([`super::verdict`]): written once the provider has answered it with a success (a 2xx),
/// dropped otherwise, so a credential the provider does not accept leaves nothing behind
/// (`docs/proxy.md`, "Who may write").
#[derive(Default)]
pub(super) struct Deferred {
    /// Role and text of each message, in order.
    pub(super) messages: Vec<(Role, String)>,
    /// The first message is the turn's question, whose words as the harness sent them are
    /// these.
    pub(super) question: Option<String>,
    /// The turn's key, noted as captured once the question is.
    pub(super) key: Option<TurnKey>,
}

/// How long a question stays known as captured: the same question at the same place of the
/// same conversation within it is a client's retry (after a 429, a 5xx, a dropped
/// connection) and is not stored again.
const RETRY_WINDOW: Duration = Duration::from_secs(120);

/// The frame a request is forwarded with.
pub(super) struct Recalled {
    pub(super) turn: Arc<TurnFrame>,
    /// The recall that made it (none: a continuation reused its turn's frame), for the
    /// inspector's log.
    pub(super) recall: Option<Recall>,
    /// Rows scanned and the scan's time (µs), when this request scanned (a continuation that
    /// reuses its turn's frame does not).
    pub(super) scanned: Option<(usize, u64)>,
}

/// Read which conversation the request continues and what of its history the memory holds
/// ([`super::held`]; `named`: the conversation a header or the harness named), then capture
/// the new user turn and recall for the live question, as the switches allow, under one
/// serving generation; returns what it did with that generation's dictionary version.
pub(super) fn remember(
    state: &State,
    request: &wire::Request,
    identity: &Identity,
    named: Option<String>,
    switches: Switches,
) -> (Remembered, String) {
    let generation = state.engine.writing();
    let user = UserId::from_key(&identity.user_key);
    if let (true, true, Some(words)) = (
        switches.writes(),
        request.question_is_new(),
        request.question.as_deref(),
    ) {
        state.held.learn_template(user, words);
    }
    let remembered = match state
        .held
        .read(&generation.memory.store, user, request, named)
    {
        Ok(history) => {
            let identity = Identity {
                conversation: history.conversation.clone(),
                ..identity.clone()
            };
            remember_in(state, &generation, request, &identity, switches, history)
        }
        Err(err) => Remembered {
            history: History {
                conversation: identity.conversation.clone(),
                context: Vec::new(),
            },
            question_stored: false,
            recall: Err(err.into()),
            deferred: Deferred::default(),
        },
    };
    (
        remembered,
        generation.memory.dictionary.version().to_owned(),
    )
}

/// A new turn is captured and its frame recalled and kept for the turn; a continuation of a
/// tool round reuses its turn's frame (recalled again, its own question and round hidden, when
/// the turn is not remembered) and captures what the agent did since the last request. A
/// question captured moments ago at the same place is a retry and is not captured again; the
/// captures of a credential that owns no memory yet wait for the provider ([`Deferred`]).
fn remember_in(
    state: &State,
    generation: &Generation,
    request: &wire::Request,
    identity: &Identity,
    switches: Switches,
    history: History,
) -> Remembered {
    let memory = &generation.memory;
    let user = UserId::from_key(&identity.user_key);
    let key = Turns::key(&identity.user_key, &identity.conversation, request);
    let new = request.question_is_new();
    let retry = new && key.is_some_and(|key| state.turns.captured_within(&key, RETRY_WINDOW));
    let failed = |question_stored, err| Remembered {
        history: history.clone(),
        question_stored,
        recall: Err(err),
        deferred: Deferred::default(),
    };
    // Captured before it is forwarded only for a credential that owns memory and that the
    // provider accepted lately; any other waits for the provider's success.
    let owned = if switches.writes() && state.verdicts.holds(identity.credential()) {
        match memory.store.user_key(user) {
            Ok(owned) => owned.is_some(),
            Err(err) => return failed(false, err.into()),
        }
    } else {
        false
    };
    let mut deferred = Deferred {
        key,
        ..Deferred::default()
    };
    let mut stored = retry;
    if switches.writes() && new && !retry {
        let words = request.question.clone().unwrap_or_default();
        let text = state.held.untemplated(user, &identity.conversation, &words);
        if owned {
            match generation.capture(&identity.author(), Role::User, None, text.clone()) {
                Ok(ids) => {
                    stored = ids.first().is_some_and(|ids| !ids.is_empty());
                    if stored {
                        state
                            .held
                            .note(user, &identity.conversation, &[&words, &text]);
                    }
                    if let (true, Some(key)) = (stored, key) {
                        state.turns.note_captured(key, user);
                    }
                }
                Err(err) => return failed(false, err),
            }
        } else {
            deferred.messages.push((Role::User, text));
            deferred.question = Some(words);
        }
    }
    let known = key.filter(|_| !new).and_then(|key| state.turns.get(&key));
    let recalled = match known {
        Some(turn) => Ok(Some(Recalled {
            turn,
            recall: None,
            scanned: None,
        })),
        None => {
            let hidden = if new || !switches.recall {
                Ok(Vec::new())
            } else {
                own_turn(memory, user, &identity.conversation)
            };
            hidden.and_then(|hidden| {
                let recalled = recall_for(
                    state, generation, request, identity, switches, stored, &hidden,
                )?;
                Ok(recalled.inspect(|recalled| {
                    if !new {
                        // What came before the round's last step was stored before the turn
                        // was forgotten.
                        *recalled.turn.captured.lock() = wire::last_step(request);
                    }
                    if let Some(key) = key {
                        state.turns.insert(key, Arc::clone(&recalled.turn));
                    }
                }))
            })
        }
    };
    if let (true, false, Ok(Some(recalled))) = (switches.writes(), new, &recalled) {
        let rows = round_rows(request, &recalled.turn);
        if owned {
            for text in rows {
                if let Err(err) = generation.capture(&identity.author(), Role::Tool, None, text) {
                    return failed(stored, err);
                }
            }
        } else {
            deferred
                .messages
                .extend(rows.into_iter().map(|text| (Role::Tool, text)));
        }
    }
    Remembered {
        history,
        question_stored: stored,
        recall: recalled,
        deferred,
    }
}

/// Rows a continuation's recall hides: the conversation's newest rows back to its newest user
/// message (the turn's question, then its tool rows), which the request forwards itself.
fn own_turn(
    memory: &crate::memory::Memory,
    user: UserId,
    conversation: &str,
) -> Result<Vec<RowId>, Error> {
    let mut hidden = Vec::new();
    for id in memory
        .store
        .conversation_rows_newest_first(user, conversation)
        .take(OWN_TURN_ROWS)
    {
        let id = id?;
        hidden.push(id);
        if memory
            .store
            .row(user, id)?
            .is_some_and(|row| row.role == Role::User && row.chunk == 0)
        {
            return Ok(hidden);
        }
    }
    Ok(Vec::new())
}

/// How far back [`own_turn`] looks for the question (rows); a turn whose tool rows run longer
/// hides nothing.
const OWN_TURN_ROWS: usize = 4096;

/// What the agent did since the turn's last request (its calls and their results after the
/// question), as the texts of the turn's tool rows, each once: the turn counts them as taken.
pub(super) fn round_rows(request: &wire::Request, turn: &TurnFrame) -> Vec<String> {
    let mut captured = turn.captured.lock();
    let (texts, seen) = wire::round_rows(request, *captured);
    *captured = seen.max(*captured);
    texts
}

/// Write the captures that waited for the provider (which accepted the request); the rows of
/// the turn's question, when it is among what was stored (none otherwise).
pub(super) fn capture_deferred(
    state: &State,
    identity: &Identity,
    deferred: Deferred,
) -> Result<Vec<RowId>, Error> {
    let generation = state.engine.writing();
    let user = UserId::from_key(&identity.user_key);
    let mut question_rows = Vec::new();
    for (i, (role, text)) in deferred.messages.into_iter().enumerate() {
        let ids = generation.capture(&identity.author(), role, None, text.clone())?;
        if let (0, Some(words)) = (i, &deferred.question) {
            question_rows = ids.into_iter().next().unwrap_or_default();
            let question = !question_rows.is_empty();
            if question {
                state
                    .held
                    .note(user, &identity.conversation, &[words, &text]);
            }
            if let (true, Some(key)) = (question, deferred.key) {
                state.turns.note_captured(key, user);
            }
        }
    }
    Ok(question_rows)
}

/// Catch the arena up and recall for the live question (`Ok(None)` when recall is off or
/// there is none); `stored`: the question was just captured (otherwise recall is a probe);
/// `hidden`: rows passed over this time.
fn recall_for(
    state: &State,
    generation: &Generation,
    request: &wire::Request,
    identity: &Identity,
    switches: Switches,
    stored: bool,
    hidden: &[RowId],
) -> Result<Option<Recalled>, Error> {
    let (true, false, Some(question)) = (
        switches.recall,
        request.server_history,
        request.question.as_deref(),
    ) else {
        return Ok(None);
    };
    let config = RecallConfig {
        tools: switches.tools(&state.config),
        ..state.config.recall
    };
    let user = UserId::from_key(&identity.user_key);
    let pin = state.turns.pin(user, &identity.conversation);
    let ask = Ask {
        user,
        scope: &identity.scope,
        conversation: Some(&identity.conversation),
        question,
        probe: !stored || !switches.writes(),
        hidden,
        now_ms: Some(now_ms()),
        pin: pin.as_deref(),
        sent_tokens: Some(request.history_bytes() / 4),
    };
    let mut recall = generation.recall(&state.engine.kernels, &config, &ask)?;
    if let Some(pin) = recall.pin.take() {
        state
            .turns
            .keep_pin(user, &identity.conversation, &identity.scope, pin);
    }
    Ok(Some(Recalled {
        scanned: Some((recall.scanned_rows, recall.scan_us)),
        turn: Arc::new(TurnFrame {
            scope: identity.scope.clone(),
            items: wire::frame_items(request.format, &recall.frame),
            retrieved: recall.retrieved.iter().map(|r| RowId(r.row)).collect(),
            shown: recall.frame.whole_rows(),
            tokens: recall.frame.tokens,
            trimmed: recall.frame.omitted.turns,
            captured: Mutex::new(0),
        }),
        recall: Some(recall),
    }))
}
