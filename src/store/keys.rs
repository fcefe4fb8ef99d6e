//! Key encoding, in one place (table in `docs/format.md`). All integers in keys are big-endian so
//! that byte order is numeric order: a user's keys are one contiguous range, and within it rows
//! sort by capture order.

use crate::types::{ConversationId, Role, RowId, UserId};

/// `user`: the prefix of every per-user key.
pub fn user(user: UserId) -> [u8; 8] {
    user.0.to_be_bytes()
}

/// The inverse of [`user`].
pub fn parse_user(key: &[u8]) -> Option<UserId> {
    Some(UserId(u64::from_be_bytes(key.try_into().ok()?)))
}

/// The exclusive end of `user`'s key range. [`UserId`]s never take `u64::MAX`, so it exists.
pub fn user_end(user: UserId) -> [u8; 8] {
    (user.0 + 1).to_be_bytes()
}

/// `user ++ row`: rows, retrieval rows and activation.
pub fn user_row(user: UserId, row: RowId) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&user.0.to_be_bytes());
    key[8..].copy_from_slice(&row.0.to_be_bytes());
    key
}

/// The inverse of [`user_row`].
pub fn parse_user_row(key: &[u8]) -> Option<(UserId, RowId)> {
    let key: &[u8; 16] = key.try_into().ok()?;
    Some((
        UserId(u64::from_be_bytes(key[..8].try_into().ok()?)),
        RowId(u64::from_be_bytes(key[8..].try_into().ok()?)),
    ))
}

/// `row`: the capture log (row → user), in global capture order.
pub fn log(row: RowId) -> [u8; 8] {
    row.0.to_be_bytes()
}

/// The inverse of [`log`].
pub fn parse_log(key: &[u8]) -> Option<RowId> {
    Some(RowId(u64::from_be_bytes(key.try_into().ok()?)))
}

/// `user ++ conversation`: the prefix of one conversation's chain.
pub fn chain_prefix(user: UserId, conversation: ConversationId) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&user.0.to_be_bytes());
    key[8..].copy_from_slice(&conversation.0.to_be_bytes());
    key
}

/// `user ++ conversation ++ row`: the conversation chain (rows of a conversation in order).
pub fn chain(user: UserId, conversation: ConversationId, row: RowId) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..16].copy_from_slice(&chain_prefix(user, conversation));
    key[16..].copy_from_slice(&row.0.to_be_bytes());
    key
}

/// The inverse of [`chain`].
pub fn parse_chain(key: &[u8]) -> Option<(UserId, ConversationId, RowId)> {
    let key: &[u8; 24] = key.try_into().ok()?;
    Some((
        UserId(u64::from_be_bytes(key[..8].try_into().ok()?)),
        ConversationId(u64::from_be_bytes(key[8..16].try_into().ok()?)),
        RowId(u64::from_be_bytes(key[16..].try_into().ok()?)),
    ))
}

/// `user ++ conversation ++ role`: the prefix of one speaker slot's bindings.
pub fn binding_prefix(user: UserId, conversation: ConversationId, role: Role) -> [u8; 17] {
    let mut key = [0u8; 17];
    key[..16].copy_from_slice(&chain_prefix(user, conversation));
    key[16] = role as u8;
    key
}

/// `user ++ conversation ++ role ++ row`: a name bound to a speaker slot from `row` on.
pub fn binding(user: UserId, conversation: ConversationId, role: Role, row: RowId) -> [u8; 25] {
    let mut key = [0u8; 25];
    key[..17].copy_from_slice(&binding_prefix(user, conversation, role));
    key[17..].copy_from_slice(&row.0.to_be_bytes());
    key
}

/// The inverse of [`binding`].
pub fn parse_binding(key: &[u8]) -> Option<(UserId, ConversationId, Role, RowId)> {
    let key: &[u8; 25] = key.try_into().ok()?;
    Some((
        UserId(u64::from_be_bytes(key[..8].try_into().ok()?)),
        ConversationId(u64::from_be_bytes(key[8..16].try_into().ok()?)),
        Role::from_code(key[16])?,
        RowId(u64::from_be_bytes(key[17..].try_into().ok()?)),
    ))
}

/// Frequency-count keys.
pub mod count {
    use crate::dictionary::stats::Count;
    use crate::types::{TermId, TokenId};

    /// The key of one count.
    pub fn key(count: Count) -> Vec<u8> {
        match count {
            Count::Token(t) => token(t).to_vec(),
            Count::TermRows(t) => term(t).to_vec(),
            Count::Rows => ROWS.to_vec(),
            Count::TotalTokens => TOKENS.to_vec(),
            Count::TotalTerms => TERMS.to_vec(),
        }
    }

    /// The inverse of [`key`].
    pub fn parse(key: &[u8]) -> Option<Count> {
        match key {
            [b'T', rest @ ..] if rest.len() == 4 => Some(Count::Token(TokenId(
                u32::from_be_bytes(rest.try_into().ok()?),
            ))),
            [b'W', rest @ ..] if rest.len() == 8 => Some(Count::TermRows(TermId(
                u64::from_be_bytes(rest.try_into().ok()?),
            ))),
            _ if key == ROWS => Some(Count::Rows),
            _ if key == TOKENS => Some(Count::TotalTokens),
            _ if key == TERMS => Some(Count::TotalTerms),
            _ => None,
        }
    }

    /// Occurrences of a token across all rows: `"T" ++ token`.
    pub fn token(token: TokenId) -> [u8; 5] {
        let mut key = [b'T'; 5];
        key[1..].copy_from_slice(&token.0.to_be_bytes());
        key
    }

    /// Rows containing a term: `"W" ++ term`.
    pub fn term(term: TermId) -> [u8; 9] {
        let mut key = [b'W'; 9];
        key[1..].copy_from_slice(&term.0.to_be_bytes());
        key
    }

    /// Total rows.
    pub const ROWS: &[u8] = b"#rows";
    /// Total tokens over all rows.
    pub const TOKENS: &[u8] = b"#tokens";
    /// Total terms over all rows.
    pub const TERMS: &[u8] = b"#terms";
}

/// Meta keys.
pub mod meta {
    /// The store's format version (u32).
    pub const FORMAT_VERSION: &[u8] = b"format_version";
    /// The serving dictionary version (UTF-8).
    pub const DICTIONARY_VERSION: &[u8] = b"dictionary_version";
    /// The next row id to assign (u64); only grows, even across purges.
    pub const NEXT_ROW: &[u8] = b"next_row";
    /// How many purges the store has seen (u64): an arena written before a purge is stale.
    pub const PURGES: &[u8] = b"purges";
    /// The time (ms since the epoch, i64) of the serving process's last write probe, the small
    /// write that tells whether the store takes writes again after a failure.
    pub const PROBE: &[u8] = b"probe";
    /// Which slot of retrieval rows and counts serves (u8: 0 or absent, 1).
    pub const SERVING_SLOT: &[u8] = b"serving_slot";
    /// The dark dictionary version, while one is installed (UTF-8).
    pub const DARK_VERSION: &[u8] = b"dark_version";
    /// Rows from this id on are derived under the dark version by their capture (u64).
    pub const DARK_FROM: &[u8] = b"dark_from";
    /// Rows below this id are re-derived under the dark version (u64).
    pub const DARK_NEXT: &[u8] = b"dark_next";
    /// Rows re-derived so far (u64).
    pub const DARK_DONE: &[u8] = b"dark_done";
    /// Rows stored when the dark version was installed (u64).
    pub const DARK_TOTAL: &[u8] = b"dark_total";
    /// The versions that served before, oldest first (UTF-8, one a line).
    pub const RETIRED: &[u8] = b"retired";
    /// Every key of an installed dark version, removed together by the flip.
    pub const DARK: [&[u8]; 5] = [DARK_VERSION, DARK_FROM, DARK_NEXT, DARK_DONE, DARK_TOTAL];

    /// Written with a purge's batch, removed once its compaction is done: a purge killed in
    /// between is known unfinished, so asking again completes it.
    pub fn purging(user: super::UserId) -> [u8; 15] {
        let mut key = [0u8; 15];
        key[..7].copy_from_slice(b"purging");
        key[7..].copy_from_slice(&super::user(user));
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_sort_numerically() {
        let (u, r) = (UserId(0x0102), RowId(0x0a0b));
        assert_eq!(parse_user_row(&user_row(u, r)), Some((u, r)));
        assert!(user_row(u, RowId(255)) < user_row(u, RowId(256)));
        assert!(user_row(u, RowId(u64::MAX - 1)).as_slice() < user_end(u).as_slice());
        let c = ConversationId(7);
        assert_eq!(parse_chain(&chain(u, c, r)), Some((u, c, r)));
        assert_eq!(
            parse_binding(&binding(u, c, Role::Tool, r)),
            Some((u, c, Role::Tool, r))
        );
        assert_eq!(parse_log(&log(r)), Some(r));
        assert_eq!(parse_user(&user(u)), Some(u));
    }
}
