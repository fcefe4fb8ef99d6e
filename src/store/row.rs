//! Stored values: the immutable row and the activation state (grammars in `docs/format.md`).

use crate::codec::{CodecError, Put as _, Reader};
use crate::types::{Role, RowId, TokenId, UserId};

/// Leading byte of an encoded row; bump it when the encoding changes. Rows stored under
/// [`ROW_ENCODING_FIXED`] still decode.
const ROW_ENCODING: u8 = 2;
/// The first encoding: the token count and each token id as a u32, where the current one
/// writes varints (two or three bytes a token instead of four).
const ROW_ENCODING_FIXED: u8 = 1;

/// One immutable stored row: a chunk of a captured message, verbatim.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: RowId,
    pub user: UserId,
    /// The conversation's key as the capturer named it.
    pub conversation: String,
    /// The id of the message's first row (all chunks of a message share it).
    pub message: RowId,
    /// This chunk's index within its message, and the message's chunk count.
    pub chunk: u16,
    pub chunks: u16,
    pub role: Role,
    /// The speaker's name when known (labels are resolved from the binding log at render time).
    pub name: Option<String>,
    /// When the message was said, in Unix milliseconds, when known.
    pub timestamp_ms: Option<i64>,
    /// The source's own id for the turn (a benchmark's dialog id), when there is one.
    pub source_turn: Option<String>,
    /// The user's clock, in tokens, at the row's birth.
    pub birth_clock: u64,
    /// The decay constant fixed at birth (per token of clock).
    pub decay: f32,
    pub tokens: Vec<TokenId>,
    pub text: String,
}

/// The activation state: the only mutable thing about a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Activation {
    /// Clock position of the last activation.
    pub last_clock: u64,
    /// Heat reached at that activation.
    pub peak: f32,
    /// The decay constant, copied from the row at birth and never changed.
    pub decay: f32,
}

fn put_opt_str(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        Some(s) => {
            out.put_u8(1);
            out.put_bytes(s.as_bytes());
        }
        None => out.put_u8(0),
    }
}

fn opt_str(r: &mut Reader<'_>) -> Result<Option<String>, CodecError> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some(r.str()?.to_owned())),
        flag => Err(r.error(format!("bad option flag {flag}"))),
    }
}

impl Row {
    /// The stored value (the key carries user and id; they are not repeated here).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.text.len() + self.tokens.len() * 3);
        out.put_u8(ROW_ENCODING);
        out.put_bytes(self.conversation.as_bytes());
        out.put_u64(self.message.0);
        out.put_u16(self.chunk);
        out.put_u16(self.chunks);
        out.put_u8(self.role as u8);
        put_opt_str(&mut out, self.name.as_deref());
        match self.timestamp_ms {
            Some(ms) => {
                out.put_u8(1);
                out.put_i64(ms);
            }
            None => out.put_u8(0),
        }
        put_opt_str(&mut out, self.source_turn.as_deref());
        out.put_u64(self.birth_clock);
        out.put_f32(self.decay);
        out.put_varint(self.tokens.len() as u64);
        for token in &self.tokens {
            out.put_varint(u64::from(token.0));
        }
        out.put_bytes(self.text.as_bytes());
        out
    }

    /// Decode a stored value under its key's `user` and `id`.
    pub fn decode(user: UserId, id: RowId, bytes: &[u8]) -> Result<Self, CodecError> {
        let mut r = Reader::new("row", bytes);
        let tag = r.u8()?;
        if tag != ROW_ENCODING && tag != ROW_ENCODING_FIXED {
            return Err(r.error(format!("unknown encoding tag {tag}")));
        }
        let conversation = r.str()?.to_owned();
        let message = RowId(r.u64()?);
        let chunk = r.u16()?;
        let chunks = r.u16()?;
        let code = r.u8()?;
        let role = Role::from_code(code).ok_or_else(|| r.error(format!("bad role {code}")))?;
        let name = opt_str(&mut r)?;
        let timestamp_ms = match r.u8()? {
            0 => None,
            1 => Some(r.i64()?),
            flag => return Err(r.error(format!("bad option flag {flag}"))),
        };
        let source_turn = opt_str(&mut r)?;
        let birth_clock = r.u64()?;
        let decay = r.f32()?;
        let varint = tag == ROW_ENCODING;
        let n = if varint {
            r.varint_count(1)?
        } else {
            r.count(4)?
        };
        let tokens = (0..n)
            .map(|_| r.u32_or_varint(varint).map(TokenId))
            .collect::<Result<Vec<_>, _>>()?;
        let text = r.str()?.to_owned();
        r.finish()?;
        Ok(Self {
            id,
            user,
            conversation,
            message,
            chunk,
            chunks,
            role,
            name,
            timestamp_ms,
            source_turn,
            birth_clock,
            decay,
            tokens,
            text,
        })
    }
}

impl Activation {
    /// `last_clock:u64 peak:f32 decay:f32`.
    pub fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.last_clock.to_le_bytes());
        out[8..12].copy_from_slice(&self.peak.to_le_bytes());
        out[12..].copy_from_slice(&self.decay.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        let mut r = Reader::new("activation", bytes);
        let out = Self {
            last_clock: r.u64()?,
            peak: r.f32()?,
            decay: r.f32()?,
        };
        r.finish()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn rows_round_trip(
            text in ".{0,80}",
            name in proptest::option::of("[a-zA-Z]{1,12}"),
            ts in proptest::option::of(any::<i64>()),
            tokens in proptest::collection::vec(any::<u32>(), 0..50),
            chunk in any::<u16>(),
            decay in any::<f32>().prop_filter("finite", |d| d.is_finite()),
        ) {
            let row = Row {
                id: RowId(9),
                user: UserId(3),
                conversation: "session_1".into(),
                message: RowId(8),
                chunk,
                chunks: chunk.saturating_add(1),
                role: Role::Assistant,
                name,
                timestamp_ms: ts,
                source_turn: Some("D1:3".into()),
                birth_clock: 77,
                decay,
                tokens: tokens.into_iter().map(TokenId).collect(),
                text,
            };
            let bytes = row.encode();
            prop_assert_eq!(Row::decode(UserId(3), RowId(9), &bytes).unwrap(), row);
            for cut in 0..bytes.len() {
                prop_assert!(Row::decode(UserId(3), RowId(9), &bytes[..cut]).is_err());
            }
        }
    }

    /// A row written under the first encoding (each token id a u32), as a store of an earlier
    /// release holds it, still decodes.
    #[test]
    fn a_row_of_the_first_encoding_decodes() {
        let mut bytes = vec![ROW_ENCODING_FIXED];
        bytes.put_bytes(b"session_1");
        bytes.put_u64(8);
        bytes.put_u16(0);
        bytes.put_u16(1);
        bytes.put_u8(Role::User as u8);
        bytes.put_u8(0);
        bytes.put_u8(1);
        bytes.put_i64(1_700_000_000_000);
        bytes.put_u8(0);
        bytes.put_u64(77);
        bytes.put_f32(0.5);
        bytes.put_u32(3);
        for token in [9u32, 200_000, 0] {
            bytes.put_u32(token);
        }
        bytes.put_bytes("hi there".as_bytes());
        let row = Row::decode(UserId(3), RowId(9), &bytes).unwrap();
        assert_eq!(row.tokens, [TokenId(9), TokenId(200_000), TokenId(0)]);
        assert_eq!(row.text, "hi there");
        assert_eq!(row.timestamp_ms, Some(1_700_000_000_000));
        assert_eq!((row.birth_clock, row.decay), (77, 0.5));
        // The same row written now: smaller, and decoding to the same row.
        let again = row.encode();
        assert_eq!(again[0], ROW_ENCODING);
        assert_eq!(again.len(), bytes.len() - 16 + 6);
        assert_eq!(Row::decode(UserId(3), RowId(9), &again).unwrap(), row);
    }
}
