//! The inspector's reads: users, conversations and turns, each request's log with why each
//! row was shown, and a question probed or searched (nothing written).

use super::*;

/// `GET /perpetuity/api/users`: every user's key and clock, in id order, a page at a time
/// (`?after=KEY` continues after that user, from one seek); a credential's viewer sees itself
/// only, by one point read.
pub(super) fn users(
    state: &State,
    viewer: &Viewer,
    after: Option<&str>,
    limit: usize,
) -> Result<serde_json::Value, Failed> {
    let generation = state.engine.generation();
    let store = &generation.memory.store;
    let listing = |user: UserId, key: &str| -> Result<serde_json::Value, Failed> {
        Ok(json!({
            "user": key,
            // The arena's lock only for this read: a request's catch-up waits on it.
            "rows": generation.arena.read().scope_rows(&[user]),
            "clock": store.clock(user)?,
            "excluded": store.exclusions(user)?.len(),
        }))
    };
    if let Viewer::User(key) = viewer {
        let own = UserId::from_key(key);
        let listed = match store.user_key(own)? {
            Some(stored) => vec![listing(own, &stored)?],
            None => Vec::new(),
        };
        return Ok(json!({"users": listed, "next_after": null}));
    }
    let start = after.map(UserId::from_key);
    let from = start.map_or([0; 8], keys::user);
    let mut listed = Vec::new();
    let mut next = None;
    for entry in store.iter_from(Cf::Users, &from) {
        let (key, value) = entry?;
        let Some(user) = keys::parse_user(&key) else {
            continue;
        };
        if start.is_some_and(|start| user <= start) {
            continue;
        }
        if listed.len() == limit {
            next = listed
                .last()
                .and_then(|last: &serde_json::Value| last["user"].as_str().map(str::to_owned));
            break;
        }
        listed.push(listing(user, &String::from_utf8_lossy(&value))?);
    }
    Ok(json!({"users": listed, "next_after": next}))
}

/// The most conversations one page of `GET /perpetuity/api/conversations` holds, and its
/// default.
pub(super) const MAX_CONVERSATIONS: usize = 200;
pub(super) const DEFAULT_CONVERSATIONS: usize = 50;

/// `GET /perpetuity/api/conversations`: a user's conversations in id order (`?after=ID`
/// continues after that one), each with its key, its row count and its first and last times.
/// Ids are strings: they are 64-bit, beyond what a JavaScript number holds exactly.
pub(super) fn conversations(
    state: &State,
    key: &str,
    after: Option<crate::types::ConversationId>,
    limit: usize,
) -> Result<serde_json::Value, Failed> {
    let store = &state.engine.generation().memory.store;
    let user = UserId::from_key(key);
    let mut listed = Vec::new();
    let mut more = false;
    for entry in store.conversations_of(user, after) {
        let (id, first) = entry?;
        if listed.len() == limit {
            more = true;
            break;
        }
        let Some(first) = store.row(user, first)? else {
            continue;
        };
        let mut rows = 0usize;
        let mut last = None;
        for row in store.conversation_rows_newest_first(user, &first.conversation) {
            let row = row?;
            last.get_or_insert(row);
            rows += 1;
        }
        let last_time = match last {
            Some(last) => store.row(user, last)?.and_then(|row| row.timestamp_ms),
            None => None,
        };
        listed.push(json!({
            "id": id.0.to_string(),
            "conversation": first.conversation,
            "rows": rows,
            "first_time": first.timestamp_ms.and_then(frame::date_label),
            "last_time": last_time.and_then(frame::date_label),
        }));
    }
    let next_after = more
        .then(|| listed.last().map(|last| last["id"].clone()))
        .flatten();
    Ok(json!({"user": key, "conversations": listed, "next_after": next_after}))
}

/// What one page of `GET /perpetuity/api/turns` asks for.
pub(super) struct Page {
    pub(super) conversation: Option<String>,
    /// Rows after this id.
    pub(super) after: u64,
    pub(super) limit: usize,
    /// The logged request whose frame each turn's `why` is told against.
    pub(super) request: Option<u64>,
}

/// How one user's rows are shown: the state every row's view reads.
struct Shown {
    clock: u64,
    excluded: HashSet<RowId>,
    warm: crate::store::WarmIndex,
    names: crate::store::BoundNames,
}

impl Shown {
    fn of(store: &crate::store::Store, user: UserId) -> Result<Self, Failed> {
        Ok(Self {
            clock: store.clock(user)?,
            excluded: store.exclusions(user)?,
            warm: store.warm_of(user)?,
            names: store.bound_names(user)?,
        })
    }

    /// One row as the inspector shows it: verbatim, with its speaker's name as the frame would
    /// label it, its time, its activation and warmth at the user's clock now, and whether it
    /// is excluded.
    fn row(
        &self,
        store: &crate::store::Store,
        row: &crate::store::Row,
    ) -> Result<serde_json::Value, Failed> {
        let activation = match self.warm.get(&row.id) {
            Some(activation) => *activation,
            None => store
                .activation(row.user, row.id)?
                .unwrap_or_else(|| heat::born(row.birth_clock, row.decay)),
        };
        let speaker = self
            .names
            .get(&(ConversationId::from_key(&row.conversation), row.role))
            .map(|name| name.to_string())
            .or(row.name.clone());
        Ok(json!({
            "row": row.id.0,
            "conversation": row.conversation,
            "message": row.message.0,
            "chunk": row.chunk,
            "chunks": row.chunks,
            "role": row.role,
            "name": row.name,
            "speaker": speaker,
            "time": row.timestamp_ms.and_then(frame::date_label),
            "timestamp_ms": row.timestamp_ms,
            "birth_clock": row.birth_clock,
            "last_clock": activation.last_clock,
            "peak": activation.peak,
            "warmth": heat::warmth(&activation, self.clock),
            "excluded": self.excluded.contains(&row.id),
            "text": row.text,
        }))
    }
}

/// `GET /perpetuity/api/turns`: a user's stored turns after row `after` (in capture order,
/// `limit` of them; one conversation's, read from its chain, with `?conversation=`), each as
/// [`Shown::row`] has it, and with `?request=ID` why each was or was not in that logged
/// request's frame ([`Why`]).
pub(super) fn turns(state: &State, key: &str, page: &Page) -> Result<serde_json::Value, Failed> {
    let store = &state.engine.generation().memory.store;
    let user = UserId::from_key(key);
    let shown = Shown::of(store, user)?;
    let logged = page.request.map(|id| logged(state, user, id)).transpose()?;
    let why = logged
        .as_ref()
        .and_then(|logged| logged.recall.as_ref())
        .map(|recall| Why::new(recall, &state.config.recall));
    let from = RowId(page.after.saturating_add(1));
    // A chain entry whose row a purge removed meanwhile is passed over.
    let rows: Box<dyn Iterator<Item = Result<crate::store::Row, crate::store::StoreError>>> =
        match &page.conversation {
            Some(conversation) => Box::new(
                store
                    .conversation_rows_from(user, conversation, from)
                    .filter_map(|id| id.and_then(|id| store.row(user, id)).transpose()),
            ),
            None => Box::new(store.rows_of_from(user, from)),
        };
    let mut listed = Vec::new();
    let mut more = false;
    for row in rows {
        let row = row?;
        if listed.len() == page.limit {
            more = true;
            break;
        }
        let mut view = shown.row(store, &row)?;
        if let Some(logged) = &logged {
            view["why"] = match &why {
                Some(why) => why.of(row.id, row.birth_clock, shown.excluded.contains(&row.id)),
                None => json!({"fate": "no_recall", "reason": no_recall(logged)}),
            };
        }
        listed.push(view);
    }
    let next_after = more
        .then(|| listed.last().map(|last| last["row"].clone()))
        .flatten();
    Ok(json!({"user": key, "clock": shown.clock, "turns": listed, "next_after": next_after}))
}

/// Why a logged request has no recall of its own.
fn no_recall(logged: &Logged) -> &'static str {
    match (logged.reused, logged.memory) {
        (true, _) => "this continuation of a tool round reused its turn's frame",
        (false, "off") => "recall was off for this request",
        (false, "unavailable") => "the memory was unavailable: the request went through untouched",
        _ => "the request had no question to recall for",
    }
}

/// A logged request of `user` by id; a request that is not (or no longer) in the log is 404.
fn logged(state: &State, user: UserId, id: u64) -> Result<Arc<Logged>, Failed> {
    state
        .recent
        .of(user)
        .into_iter()
        .find(|logged| logged.id == id)
        .ok_or_else(|| {
            Failed::Refused(Refused::new(
                StatusCode::NOT_FOUND,
                "no such request in this user's log (it keeps the last few, in memory only)",
            ))
        })
}

/// Why each row was or was not shown by one recall: its rank in the retrieved set, whether it
/// was offered to the frame (warm enough, or mandatory) and whether the frame shows it.
pub(super) struct Why<'a> {
    recall: &'a Recall,
    depth: usize,
    floor: f32,
    ranks: HashMap<RowId, usize>,
    offered: HashMap<RowId, f32>,
    shown: HashSet<RowId>,
    /// Of `shown`, the rows quoted only in part (a tool message past its preview).
    partial: HashSet<RowId>,
}

impl<'a> Why<'a> {
    fn new(recall: &'a Recall, config: &RecallConfig) -> Self {
        Self {
            recall,
            depth: config.depth,
            floor: config.warm_floor,
            ranks: recall
                .retrieved
                .iter()
                .enumerate()
                .map(|(rank, row)| (RowId(row.row), rank))
                .collect(),
            offered: recall
                .offered
                .iter()
                .map(|pick| (pick.row, pick.warmth))
                .collect(),
            shown: recall.frame.rows.iter().copied().collect(),
            partial: recall.frame.partial_rows(),
        }
    }

    /// `{"fate", "reason"}` of `row` (born at `birth_clock`; `excluded` now): `shown`, `later`
    /// (stored after the request), `trimmed` (offered, left out by the cap), `too_cold`
    /// (retrieved within the depth, under the warmth floor), `not_offered` (retrieved below
    /// the depth: `memory_reopen` returns it), `excluded`, or `not_retrieved` (and too cold to
    /// be offered without it).
    fn of(&self, row: RowId, birth_clock: u64, excluded: bool) -> serde_json::Value {
        let recall = self.recall;
        let rank = self.ranks.get(&row).copied();
        let score = rank.map(|rank| recall.retrieved[rank].score);
        let (fate, reason) = if self.partial.contains(&row) {
            (
                "shown",
                "in the frame in part: a tool message past its preview (memory_chain returns it)"
                    .to_owned(),
            )
        } else if self.shown.contains(&row) {
            ("shown", "in the frame".to_owned())
        } else if birth_clock > recall.clock {
            ("later", "stored after this request".to_owned())
        } else if let Some(warmth) = self.offered.get(&row) {
            (
                "trimmed",
                format!(
                    "offered (warmth {warmth:.3}) but left out by the cap of {} tokens",
                    recall.budget
                ),
            )
        } else if let Some(rank) = rank.filter(|&rank| rank < self.depth) {
            (
                "too_cold",
                format!(
                    "retrieved at rank {} but too cold: warmth {:.3} under the floor of {}",
                    rank + 1,
                    recall.retrieved[rank].warmth.unwrap_or(0.0),
                    self.floor
                ),
            )
        } else if let Some(rank) = rank {
            (
                "not_offered",
                format!(
                    "retrieved at rank {}, below the depth of {}: not offered to the frame (memory_reopen returns it)",
                    rank + 1,
                    self.depth
                ),
            )
        } else if excluded {
            ("excluded", "excluded: never retrieved or shown".to_owned())
        } else {
            let lowest = recall.retrieved.last().map_or(0.0, |r| r.score);
            (
                "not_retrieved",
                format!(
                    "not retrieved (the {} rows retrieved scored {lowest:.3} and above) and too cold (under the floor of {}) to be offered without it",
                    recall.retrieved.len(),
                    self.floor
                ),
            )
        };
        json!({"fate": fate, "reason": reason, "rank": rank.map(|r| r + 1), "score": score})
    }
}

/// A recall as the inspector shows it: its clock, budget and the spread that set it, the
/// frame (each message with its tokens and rows, what the cap left out and the notice given),
/// and the retrieved set in the frame's order, each row with its score, warmth, reheat and
/// [`Why`].
fn recall_json(recall: &Recall, config: &RecallConfig, tools: bool) -> serde_json::Value {
    let why = Why::new(recall, config);
    let retrieved: Vec<serde_json::Value> = recall
        .retrieved
        .iter()
        .enumerate()
        .map(|(rank, row)| {
            let mut view = serde_json::to_value(row).expect("a row serialises");
            view["rank"] = json!(rank + 1);
            view["why"] = why.of(RowId(row.row), 0, false);
            view
        })
        .collect();
    let omitted = recall.frame.omitted;
    json!({
        "clock": recall.clock,
        "budget": recall.budget,
        "spread": recall.spread,
        "depth": config.depth,
        "warm_floor": config.warm_floor,
        "scanned_rows": recall.scanned_rows,
        "scan_us": recall.scan_us,
        "reheated": recall.reheated,
        "offered": recall.offered.len(),
        "frame": recall.frame,
        "notice": (omitted.turns > 0).then(|| frame::omission_line(omitted, tools)),
        "retrieved": retrieved,
    })
}

/// A logged request's summary line.
fn summary(logged: &Logged) -> serde_json::Value {
    let after = logged.after.lock();
    json!({
        "id": logged.id,
        "time": frame::date_label(logged.at_ms),
        "at_ms": logged.at_ms,
        "format": logged.format,
        "model": logged.model,
        "conversation": logged.conversation,
        "question": logged.question,
        "memory": logged.memory,
        "status": after.status,
        "question_stored": logged.question_stored,
        "reply_stored": after.reply.is_some(),
        "reply_complete": after.reply,
        "reused_frame": logged.reused,
        "retrieved": logged.recall.as_ref().map(|r| r.retrieved.len()),
        "frame_tokens": logged.recall.as_ref().map(|r| r.frame.tokens),
        "trimmed": logged.recall.as_ref().map(|r| r.frame.omitted.turns),
        "tool_calls": after.rounds.len(),
        "forwarded_bytes": logged.forwarded.len(),
    })
}

/// `GET /perpetuity/api/requests`: the user's logged requests, newest first, in summary.
pub(super) fn requests(state: &State, key: &str) -> Result<serde_json::Value, Failed> {
    let listed: Vec<serde_json::Value> = state
        .recent
        .of(UserId::from_key(key))
        .iter()
        .map(|logged| summary(logged))
        .collect();
    Ok(json!({"user": key, "requests": listed}))
}

/// `GET /perpetuity/api/request?id=ID`: one logged request whole: its summary, the body
/// exactly as forwarded, the recall that framed it ([`recall_json`]) and each memory tool
/// call run mid-stream with what it returned.
pub(super) fn request(state: &State, key: &str, id: u64) -> Result<serde_json::Value, Failed> {
    let logged = logged(state, UserId::from_key(key), id)?;
    let mut view = summary(&logged);
    view["forwarded"] = json!(String::from_utf8_lossy(&logged.forwarded));
    view["recall"] = match &logged.recall {
        Some(recall) => recall_json(recall, &state.config.recall, logged.tools),
        None => json!(null),
    };
    view["no_recall"] = json!(logged.recall.is_none().then(|| no_recall(&logged)));
    view["tool_rounds"] = logged
        .after
        .lock()
        .rounds
        .iter()
        .map(|round| json!({"name": round.name, "arguments": round.arguments, "result": round.result}))
        .collect();
    Ok(view)
}

/// One probe recall of `key`'s own memory for `question`, the arena caught up first.
pub(super) fn probe(
    state: &State,
    key: &str,
    conversation: Option<&str>,
    question: &str,
) -> Result<(Recall, Arc<Generation>), Failed> {
    let generation = state.engine.generation();
    let scope = [UserId::from_key(key)];
    let ask = Ask::probe(&scope, conversation, question, now_ms());
    let config = RecallConfig {
        tools: false,
        ..state.config.recall
    };
    let recalled = generation.recall(&state.engine.kernels, &config, &ask)?;
    Ok((recalled, generation))
}

/// `POST /perpetuity/api/frame`: the frame a question would get, in probe mode (what
/// `perpetuity frame` prints), as [`recall_json`] shows a logged request's.
pub(super) fn probe_frame(
    state: &State,
    key: &str,
    conversation: Option<&str>,
    question: &str,
) -> Result<serde_json::Value, Failed> {
    let (recalled, _) = probe(state, key, conversation, question)?;
    Ok(recall_json(&recalled, &state.config.recall, false))
}

/// `POST /perpetuity/api/search`: the user's rows the exact scan ranks best for `query`, in
/// probe mode (nothing written), in the frame's order, each with its score and as
/// [`Shown::row`] has it.
pub(super) fn search(
    state: &State,
    key: &str,
    query: &str,
    limit: usize,
) -> Result<serde_json::Value, Failed> {
    let (recalled, generation) = probe(state, key, None, query)?;
    let store = &generation.memory.store;
    let user = UserId::from_key(key);
    let shown = Shown::of(store, user)?;
    let mut found = Vec::new();
    for hit in recalled.retrieved.iter().take(limit) {
        if let Some(row) = store.row(user, RowId(hit.row))? {
            let mut view = shown.row(store, &row)?;
            view["score"] = json!(hit.score);
            found.push(view);
        }
    }
    Ok(
        json!({"user": key, "scanned_rows": recalled.scanned_rows, "scan_us": recalled.scan_us, "found": found}),
    )
}
