//! Identifier newtypes shared by every layer.

use serde::{Deserialize, Serialize};

/// A token id under the fixed tokenizer (o200k_base). Every stored row keeps its text as these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[repr(transparent)]
pub struct TokenId(pub u32);

/// A lexical term: a 64-bit FNV-1a hash of the folded word's UTF-8 bytes (see `docs/format.md`).
/// Hashing keeps terms vocabulary-free: any word ever seen has an id without a lookup table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[repr(transparent)]
pub struct TermId(pub u64);

/// A user's memory: a keyed hash of the user's key (see [`UserId::from_key`]). Every stored
/// structure of a user sits under this prefix, so a user can be purged as a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[repr(transparent)]
pub struct UserId(pub u64);

impl UserId {
    /// The id of the user named `key` (a benchmark's sample id, or the proxy's keyed hash of a
    /// credential): the first 8 bytes of SHA-256 over a domain tag and the key.
    pub fn from_key(key: &str) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(b"perpetuity/user\0")
            .chain_update(key.as_bytes())
            .finalize();
        // u64::MAX is never used, so every user's key range has an exclusive end.
        Self(u64::from_be_bytes(digest[..8].try_into().expect("8 bytes")).min(u64::MAX - 1))
    }
}

/// A stored row: its position in the global capture sequence. Row ids only grow, so the
/// largest one seen is the watermark the resident arena catches up from.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[repr(transparent)]
pub struct RowId(pub u64);

/// A conversation within a user's memory: a hash of its key (see [`ConversationId::from_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[repr(transparent)]
pub struct ConversationId(pub u64);

impl ConversationId {
    /// The id of the conversation named `key`: the first 8 bytes of SHA-256 over a domain tag
    /// and the key.
    pub fn from_key(key: &str) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(b"perpetuity/conversation\0")
            .chain_update(key.as_bytes())
            .finalize();
        Self(u64::from_be_bytes(digest[..8].try_into().expect("8 bytes")))
    }
}

/// Who spoke a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Role {
    User = 1,
    Assistant = 2,
    System = 3,
    Tool = 4,
}

impl Role {
    /// The role stored as `code`, if any.
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::User,
            2 => Self::Assistant,
            3 => Self::System,
            4 => Self::Tool,
            _ => return None,
        })
    }
}

/// The wall clock now, in Unix milliseconds (0 for a clock set before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
