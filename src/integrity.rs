//! The integrity check: recompute every invariant of a store on demand and report each
//! violation with its key. Read-only on the store; the arena, a cache, is opened as serving
//! opens it (cut back to its last commit, or rebuilt when unusable) and caught up.
//!
//! Invariants:
//! - every row decodes, its tokens decode to its text, and it has exactly one retrieval row,
//!   tagged with the serving dictionary version and equal to a fresh derivation from the row's
//!   tokens; every retrieval row has its row;
//! - every row has a log entry naming its user, an activation whose decay equals the row's
//!   birth decay (decay is never rewritten) and whose last clock lies between the row's birth
//!   and the user's clock, a chain entry under its conversation, and a user entry;
//! - no orphans: every activation, exclusion, log, chain, binding, clock and user entry belongs to a row
//!   or a user with rows; every binding matches its row's role and name; every entry of the
//!   warm index equals its row's activation;
//! - every owner link (`owners`) is a user id linked to another user id, one that is not linked
//!   itself (a link may come before its sub-user's first row: it holds no text);
//! - each user's clock equals the tokens of the user's rows, and equals the newest row's birth
//!   clock; every row id is below the recorded next row id;
//! - the stored frequency counts equal a recount from the retrieval rows, key by key;
//! - ([`check_dark`]) with a dark dictionary version installed, every row re-derived so far
//!   (below the progress, or captured since the install) has exactly one dark retrieval row
//!   equal to a fresh derivation under the dark version, no other row has one, and the dark
//!   counts equal their recount; a half-derived dark version is progress, not damage. Without
//!   one, the dark families are empty;
//! - ([`check_arena_files`]) the data directory's arena files pass their own checks;
//!   ([`check_arena`]) a caught-up arena holds exactly the stored rows, with the same facts,
//!   lexical terms and tokens, sketches that hold each row's code, signature, id and length,
//!   and a resident statistic equal to the stored counts.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::arena::signature::signature;
use crate::arena::{Arena, ArenaError, CodeBytes, Opened, Sketch};
use crate::dictionary::Dictionary;
use crate::dictionary::derive::{RetrievalRow, derive};
use crate::dictionary::stats::{Count, FrequencyTable};
use crate::relevance::TermCount;
use crate::store::{Activation, Cf, Row, Store, StoreError, decode_count, hex_key, keys};
use crate::tokens::Tokenizer;
use crate::types::{ConversationId, RowId, UserId};

/// The name violations of the resident arena carry in place of a column family.
pub const ARENA: &str = "arena";

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which invariant.
    pub check: &'static str,
    /// The column family holding the key.
    pub cf: &'static str,
    /// The key, in hex.
    pub key: String,
    pub detail: String,
}

/// What a check found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub rows: u64,
    pub users: u64,
    pub violations: Vec<Violation>,
}

impl Report {
    fn violation(&mut self, check: &'static str, cf: Cf, key: &[u8], detail: impl Into<String>) {
        self.violations.push(Violation {
            check,
            cf: cf.name(),
            key: hex_key(key),
            detail: detail.into(),
        });
    }

    fn arena_violation(&mut self, check: &'static str, key: &[u8], detail: impl Into<String>) {
        self.violations.push(Violation {
            check,
            cf: ARENA,
            key: hex_key(key),
            detail: detail.into(),
        });
    }

    /// True when no invariant is broken.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Per-user facts gathered from the rows.
#[derive(Default)]
struct UserFacts {
    tokens: u64,
    newest_birth: u64,
}

/// Check every invariant of `store` against the serving `dictionary`.
pub fn check(store: &Store, dictionary: &Dictionary) -> Result<Report, StoreError> {
    let tokenizer = Tokenizer::new();
    let mut report = Report::default();
    let next_row = store.next_row();
    match store.dictionary_version()? {
        Some(v) if v == dictionary.version() => {}
        other => {
            let has_rows = store.iter_all(Cf::Rows).next().is_some();
            if has_rows || other.is_some() {
                report.violation(
                    "serving dictionary",
                    Cf::Meta,
                    keys::meta::DICTIONARY_VERSION,
                    format!("store binds {other:?}, serving {}", dictionary.version()),
                );
            }
        }
    }

    let mut users: HashMap<UserId, UserFacts> = HashMap::new();
    let mut recount = FrequencyTable::default();
    // (user, row) → (conversation, role code, name) for the binding check.
    let mut row_facts: HashMap<(UserId, RowId), (ConversationId, u8, Option<String>)> =
        HashMap::new();

    for entry in store.iter_all(Cf::Rows) {
        let (key, value) = entry?;
        report.rows += 1;
        let Some((user, id)) = keys::parse_user_row(&key) else {
            report.violation("row key", Cf::Rows, &key, "not user ++ row");
            continue;
        };
        let row = match Row::decode(user, id, &value) {
            Ok(row) => row,
            Err(e) => {
                report.violation("row decodes", Cf::Rows, &key, e.to_string());
                continue;
            }
        };
        check_row(
            store,
            dictionary,
            &tokenizer,
            &row,
            next_row,
            &mut report,
            &mut recount,
        )?;
        let facts = users.entry(user).or_default();
        facts.tokens += row.tokens.len() as u64;
        facts.newest_birth = facts.newest_birth.max(row.birth_clock);
        row_facts.insert(
            (user, id),
            (
                ConversationId::from_key(&row.conversation),
                row.role as u8,
                row.name.clone(),
            ),
        );
    }
    report.users = users.len() as u64;

    check_orphans(store, &row_facts, &users, &mut report)?;
    check_owner_links(store, &mut report)?;
    check_clocks(store, &users, &mut report)?;
    check_counts(store, Cf::Counts, &recount, &mut report)?;
    check_dark(store, &tokenizer, &mut report)?;
    Ok(report)
}

/// The dark families against the rows (see the module doc).
fn check_dark(store: &Store, tokenizer: &Tokenizer, report: &mut Report) -> Result<(), StoreError> {
    let Some(dark) = store.dark()? else {
        for cf in [Cf::DarkRetrieval, Cf::DarkCounts] {
            if let Some(entry) = store.iter_all(cf).next() {
                let (key, _) = entry?;
                report.violation(
                    "dark families empty without a dark version",
                    cf,
                    &key,
                    "entry",
                );
            }
        }
        return Ok(());
    };
    let Some(dictionary) = store.dark_dictionary() else {
        report.violation(
            "dark version's table attached",
            Cf::Meta,
            keys::meta::DARK_VERSION,
            format!("{} is installed, its table is not loaded", dark.version),
        );
        return Ok(());
    };
    let cf = Cf::DarkRetrieval;
    let mut recount = FrequencyTable::default();
    let mut rows = HashSet::new();
    for row in store.rows_since(RowId(0)) {
        let row = row?;
        let key = keys::user_row(row.user, row.id);
        rows.insert((row.user, row.id));
        let derived = row.id.0 < dark.next || row.id.0 >= dark.from;
        match store.get(cf, &key)? {
            None if derived => {
                report.violation("row has a dark retrieval row", cf, &key, "missing")
            }
            None => {}
            Some(_) if !derived => report.violation(
                "dark retrieval row within the progress",
                cf,
                &key,
                format!("row {} is at or past the progress {}", row.id.0, dark.next),
            ),
            Some(bytes) => match RetrievalRow::decode(&bytes) {
                Err(e) => report.violation("retrieval row decodes", cf, &key, e.to_string()),
                Ok(retrieval) => {
                    retrieval.count_into(&mut recount);
                    if retrieval != derive(&dictionary, tokenizer, row.name.as_deref(), &row.tokens)
                    {
                        report.violation(
                            "dark retrieval row equals its derivation",
                            cf,
                            &key,
                            "differs from a fresh derivation under the dark version",
                        );
                    }
                }
            },
        }
    }
    for entry in store.iter_all(cf) {
        let (key, _) = entry?;
        match keys::parse_user_row(&key) {
            Some(id) if rows.contains(&id) => {}
            _ => report.violation("no orphan", cf, &key, "no row"),
        }
    }
    check_counts(store, Cf::DarkCounts, &recount, report)
}

fn check_row(
    store: &Store,
    dictionary: &Dictionary,
    tokenizer: &Tokenizer,
    row: &Row,
    next_row: RowId,
    report: &mut Report,
    recount: &mut FrequencyTable,
) -> Result<(), StoreError> {
    let key = keys::user_row(row.user, row.id);
    if tokenizer.decode_bytes(&row.tokens) != row.text.as_bytes() {
        report.violation("row tokens decode to its text", Cf::Rows, &key, "mismatch");
    }
    if row.id >= next_row {
        report.violation(
            "row id below next row",
            Cf::Rows,
            &key,
            format!("row {} ≥ next {}", row.id.0, next_row.0),
        );
    }
    match store.get(Cf::Retrieval, &key)? {
        None => report.violation("row has a retrieval row", Cf::Retrieval, &key, "missing"),
        Some(bytes) => match RetrievalRow::decode(&bytes) {
            Err(e) => report.violation("retrieval row decodes", Cf::Retrieval, &key, e.to_string()),
            Ok(retrieval) => {
                retrieval.count_into(recount);
                if retrieval.dictionary_version != dictionary.version() {
                    report.violation(
                        "retrieval row of the serving version",
                        Cf::Retrieval,
                        &key,
                        format!(
                            "{} instead of {}",
                            retrieval.dictionary_version,
                            dictionary.version()
                        ),
                    );
                } else if retrieval
                    != derive(dictionary, tokenizer, row.name.as_deref(), &row.tokens)
                {
                    report.violation(
                        "retrieval row equals its derivation",
                        Cf::Retrieval,
                        &key,
                        "differs from a fresh derivation of the row's tokens",
                    );
                }
            }
        },
    }
    match store.get(Cf::Log, &keys::log(row.id))? {
        Some(user) if user == keys::user(row.user) => {}
        Some(_) => report.violation(
            "row is logged",
            Cf::Log,
            &keys::log(row.id),
            "names another user",
        ),
        None => report.violation("row is logged", Cf::Log, &keys::log(row.id), "missing"),
    }
    match store.get(Cf::Activation, &key)? {
        None => report.violation("row has an activation", Cf::Activation, &key, "missing"),
        Some(bytes) => match Activation::decode(&bytes) {
            Err(e) => report.violation("activation decodes", Cf::Activation, &key, e.to_string()),
            Ok(state) => {
                if state.decay.to_bits() != row.decay.to_bits() {
                    report.violation(
                        "decay never rewritten",
                        Cf::Activation,
                        &key,
                        format!(
                            "activation decay {} ≠ birth decay {}",
                            state.decay, row.decay
                        ),
                    );
                }
                if state.last_clock < row.birth_clock {
                    report.violation(
                        "activation after birth",
                        Cf::Activation,
                        &key,
                        format!(
                            "last clock {} < birth {}",
                            state.last_clock, row.birth_clock
                        ),
                    );
                }
                if store.clock(row.user)? < state.last_clock {
                    report.violation(
                        "activation within the user's clock",
                        Cf::Activation,
                        &key,
                        format!("last clock {} is in the future", state.last_clock),
                    );
                }
            }
        },
    }
    let chain = keys::chain(
        row.user,
        ConversationId::from_key(&row.conversation),
        row.id,
    );
    if store.get(Cf::Chain, &chain)?.is_none() {
        report.violation("row is chained", Cf::Chain, &chain, "missing");
    }
    if store.get(Cf::Users, &keys::user(row.user))?.is_none() {
        report.violation(
            "row's user is known",
            Cf::Users,
            &keys::user(row.user),
            "missing",
        );
    }
    Ok(())
}

fn check_orphans(
    store: &Store,
    rows: &HashMap<(UserId, RowId), (ConversationId, u8, Option<String>)>,
    users: &HashMap<UserId, UserFacts>,
    report: &mut Report,
) -> Result<(), StoreError> {
    for cf in [Cf::Retrieval, Cf::Activation, Cf::Exclusions] {
        for entry in store.iter_all(cf) {
            let (key, _) = entry?;
            match keys::parse_user_row(&key) {
                Some(id) if rows.contains_key(&id) => {}
                _ => report.violation("no orphan", cf, &key, "no row"),
            }
        }
    }
    for entry in store.iter_all(Cf::Warm) {
        let (key, value) = entry?;
        if store.get(Cf::Activation, &key)?.as_deref() != Some(&value[..]) {
            report.violation(
                "warm entry equals the activation",
                Cf::Warm,
                &key,
                "differs or has no activation",
            );
        }
    }
    for entry in store.iter_all(Cf::Log) {
        let (key, value) = entry?;
        let known = keys::parse_log(&key).zip(<[u8; 8]>::try_from(&value[..]).ok());
        match known {
            Some((row, user)) if rows.contains_key(&(UserId(u64::from_be_bytes(user)), row)) => {}
            _ => report.violation("no orphan", Cf::Log, &key, "no row"),
        }
    }
    for entry in store.iter_all(Cf::Chain) {
        let (key, _) = entry?;
        match keys::parse_chain(&key) {
            Some((user, conversation, row))
                if rows.get(&(user, row)).is_some_and(|f| f.0 == conversation) => {}
            _ => report.violation("no orphan", Cf::Chain, &key, "no row in this conversation"),
        }
    }
    for entry in store.iter_all(Cf::Bindings) {
        let (key, value) = entry?;
        let name = String::from_utf8_lossy(&value);
        match keys::parse_binding(&key) {
            Some((user, conversation, role, row))
                if rows.get(&(user, row)).is_some_and(|f| {
                    f.0 == conversation && f.1 == role as u8 && f.2.as_deref() == Some(&name)
                }) => {}
            _ => report.violation("no orphan", Cf::Bindings, &key, "no row with this speaker"),
        }
    }
    let known: HashSet<UserId> = users.keys().copied().collect();
    for entry in store.iter_all(Cf::Users) {
        let (key, value) = entry?;
        let user = <[u8; 8]>::try_from(&key[..]).map(|k| UserId(u64::from_be_bytes(k)));
        match user {
            Ok(user) if known.contains(&user) => {
                if UserId::from_key(&String::from_utf8_lossy(&value)) != user {
                    report.violation("user key hashes to its id", Cf::Users, &key, "mismatch");
                }
            }
            _ => report.violation("no orphan", Cf::Users, &key, "user has no rows"),
        }
    }
    Ok(())
}

/// Every `owners` entry decodes (a user id to a user id) and links a sub-user to another user,
/// a credential's own: one that is no sub-user itself (a link between two credentials' own
/// users would let one's purge take the other's memory).
fn check_owner_links(store: &Store, report: &mut Report) -> Result<(), StoreError> {
    let mut links: BTreeMap<UserId, UserId> = BTreeMap::new();
    for entry in store.iter_all(Cf::Owners) {
        let (key, value) = entry?;
        match (keys::parse_user(&key), keys::parse_user(&value)) {
            (Some(user), Some(owner)) if user != owner => {
                links.insert(user, owner);
            }
            (Some(_), Some(_)) => {
                report.violation("owner link names another user", Cf::Owners, &key, "itself")
            }
            _ => report.violation("owner link decodes", Cf::Owners, &key, "not a user id pair"),
        }
    }
    for (user, owner) in &links {
        if let Some(above) = links.get(owner) {
            report.violation(
                "owner link names a credential's own user",
                Cf::Owners,
                &keys::user(*user),
                format!("its owner {} is a sub-user of {}", owner.0, above.0),
            );
        }
    }
    Ok(())
}

fn check_clocks(
    store: &Store,
    users: &HashMap<UserId, UserFacts>,
    report: &mut Report,
) -> Result<(), StoreError> {
    let mut clocks: BTreeMap<UserId, u64> = BTreeMap::new();
    for entry in store.iter_all(Cf::Clock) {
        let (key, value) = entry?;
        match (
            <[u8; 8]>::try_from(&key[..]),
            <[u8; 8]>::try_from(&value[..]),
        ) {
            (Ok(user), Ok(clock)) => {
                clocks.insert(UserId(u64::from_be_bytes(user)), u64::from_le_bytes(clock));
            }
            _ => report.violation("clock decodes", Cf::Clock, &key, "bad key or value"),
        }
    }
    for (user, facts) in users {
        let key = keys::user(*user);
        match clocks.remove(user) {
            None => report.violation("user has a clock", Cf::Clock, &key, "missing"),
            Some(clock) => {
                if clock != facts.tokens {
                    report.violation(
                        "clock equals the user's tokens",
                        Cf::Clock,
                        &key,
                        format!("clock {clock}, rows hold {} tokens", facts.tokens),
                    );
                }
                if clock != facts.newest_birth {
                    report.violation(
                        "clock equals the newest birth",
                        Cf::Clock,
                        &key,
                        format!("clock {clock}, newest birth {}", facts.newest_birth),
                    );
                }
            }
        }
    }
    for user in clocks.keys() {
        report.violation(
            "no orphan",
            Cf::Clock,
            &keys::user(*user),
            "user has no rows",
        );
    }
    Ok(())
}

fn check_counts(
    store: &Store,
    cf: Cf,
    recount: &FrequencyTable,
    report: &mut Report,
) -> Result<(), StoreError> {
    let mut expected: HashMap<Count, u64> = recount.entries().into_iter().collect();
    for entry in store.iter_all(cf) {
        let (key, value) = entry?;
        let Some(count) = keys::count::parse(&key) else {
            report.violation("count key", cf, &key, "unknown key");
            continue;
        };
        let stored = match decode_count(&key, &value) {
            Ok(v) => v,
            Err(e) => {
                report.violation("count decodes", cf, &key, e.to_string());
                continue;
            }
        };
        let want = expected.remove(&count).unwrap_or(0);
        if stored != want as i64 {
            report.violation(
                "count equals recount",
                cf,
                &key,
                format!("stored {stored}, recount {want}"),
            );
        }
    }
    let mut missing: Vec<_> = expected.into_iter().collect();
    missing.sort_unstable();
    for (count, want) in missing {
        report.violation(
            "count equals recount",
            cf,
            &keys::count::key(count),
            format!("missing, recount {want}"),
        );
    }
    Ok(())
}

/// Open the data directory's arena as serving does, report files that were damaged (they
/// are rebuilt from the store), catch it up and check it against the store ([`check_arena`]).
pub fn check_arena_files(
    store: &Store,
    dictionary: &Dictionary,
    report: &mut Report,
) -> Result<(), ArenaError> {
    let (mut arena, opened) = Arena::open(store, dictionary)?;
    if let Opened::Rebuilt { reason } = &opened
        && reason.is_damage()
    {
        report.arena_violation("arena files are usable", b"", reason.to_string());
    }
    arena.catch_up(store, dictionary)?;
    check_arena(store, &arena, report)?;
    Ok(())
}

/// Check a caught-up arena against the store: every stored row is in the arena with the same
/// user, conversation, birth clock, decay, length (in its page and in the arena's index by row
/// id), lexical terms and tokens, its sketch holds the row's 2-bit code under the arena's
/// codebook, signature, id and length, the arena holds no other row and counts each user's rows, its
/// watermark does not run ahead of the store, and its resident frequency statistic equals the
/// stored counts. Appends to `report`.
pub fn check_arena(store: &Store, arena: &Arena, report: &mut Report) -> Result<(), StoreError> {
    let mut stored = 0usize;
    let mut by_user: HashMap<UserId, usize> = HashMap::new();
    // What a row's sketch should hold, written afresh for each row.
    let mut sketched: Box<Sketch> = Box::new(bytemuck::Zeroable::zeroed());
    for row in store.rows_since(RowId(0)) {
        let row = row?;
        stored += 1;
        *by_user.entry(row.user).or_default() += 1;
        let key = keys::user_row(row.user, row.id);
        let Some(slot) = arena.slot(row.id) else {
            report.arena_violation("stored row is in the arena", &key, "missing");
            continue;
        };
        let page = arena.page(slot.page);
        let i = slot.index as usize;
        let retrieval = store.retrieval(row.user, row.id)?;
        if let Some(retrieval) = &retrieval {
            sketched.set_row(
                i,
                row.id.0,
                retrieval.term_len() as u32,
                &CodeBytes::from(&arena.codebook().encode(page.vector(i), page.scales[i])),
                &signature(retrieval.terms.iter().map(|&(term, _)| term)),
            );
            let sketch = arena.sketch(slot.page);
            if sketch.rows != page.rows || !sketch.same_row(&sketched, i) {
                report.arena_violation(
                    "arena sketch holds the row's code, signature, id and length",
                    &key,
                    "differs",
                );
            }
        }
        let same = page.user == row.user.0
            && page.row_ids[i] == row.id.0
            && page.roles[i] == row.role as u8
            && page.conversations[i] == ConversationId::from_key(&row.conversation).0
            && page.birth_clocks[i] == row.birth_clock
            && page.decays[i].to_bits() == row.decay.to_bits()
            && page.token_lens[i] as usize == row.tokens.len()
            && arena.token_len(row.id) == Some(row.tokens.len())
            && match &retrieval {
                Some(retrieval) => {
                    let resident = arena.row_entries(slot);
                    resident.len == retrieval.term_len()
                        && resident
                            .terms
                            .iter()
                            .map(|e| (e.term(), e.count()))
                            .eq(retrieval.terms.iter().copied())
                        && resident.token_counts().eq(retrieval.tokens.iter().copied())
                }
                None => false,
            };
        if !same {
            report.arena_violation("arena row equals the stored row", &key, "differs");
        }
    }
    for (user, rows) in by_user {
        let counted = arena.scope_rows(&[user]);
        if counted != rows {
            report.arena_violation(
                "arena counts each user's stored rows",
                &user.0.to_be_bytes(),
                format!("arena {counted} rows, store {rows}"),
            );
        }
    }
    if arena.rows() != stored {
        report.arena_violation(
            "arena holds only stored rows",
            b"",
            format!("arena {} rows, store {stored}", arena.rows()),
        );
    }
    if arena.watermark() > store.next_row() {
        report.arena_violation(
            "watermark within the store",
            &keys::log(arena.watermark()),
            format!(
                "watermark {} > next row {}",
                arena.watermark().0,
                store.next_row().0
            ),
        );
    }
    if arena.stats() != &store.frequency_table()? {
        report.arena_violation(
            "resident statistic equals the stored counts",
            b"",
            "differs",
        );
    }
    Ok(())
}
