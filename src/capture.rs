//! Capture: a message becomes one or more immutable rows, each with exactly one retrieval row,
//! stored with the born-hot activation, the frequency-count increments and the clock advance in
//! one write batch ([`crate::store::Store::write_captures`]).
//!
//! Long messages are chunked at [`MAX_CHUNK_TOKENS`] on sentence boundaries. Chunks partition
//! the message exactly: their texts concatenate to the message text and their tokens to the
//! message's tokens, so nothing is lost or altered.

use crate::dictionary::Dictionary;
use crate::dictionary::derive::derive;
use crate::heat;
use crate::store::{NewChunk, NewMessage, Store, StoreError};
use crate::tokens::Tokenizer;
use crate::types::{Role, RowId, TokenId, UserId};

/// Upper bound of a row's length in tokens: long enough for a whole ordinary chat turn, short
/// enough that one row is about one topic, so retrieval and the frame can pick it precisely.
pub const MAX_CHUNK_TOKENS: usize = 256;

/// A message to capture.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The user's key (the proxy's keyed credential hash, or a benchmark's sample id).
    pub user_key: String,
    /// The conversation's key within the user's memory.
    pub conversation: String,
    pub role: Role,
    pub name: Option<String>,
    pub timestamp_ms: Option<i64>,
    pub source_turn: Option<String>,
    pub text: String,
}

/// Split `tokens` (the encoding of `text`) into runs of at most `max` tokens, cutting after a
/// sentence end (`.`, `!`, `?`, newline) where one lies within reach, else at the last token
/// boundary that is also a character boundary (`max` ≥ 4 guarantees one). Returns `(byte range, token range)` pairs that
/// partition the text and the tokens.
pub fn chunk_bounds(
    tokenizer: &Tokenizer,
    text: &str,
    tokens: &[TokenId],
    max: usize,
) -> Vec<(std::ops::Range<usize>, std::ops::Range<usize>)> {
    assert!(
        max >= 4,
        "chunks hold at least one whole character (up to 4 tokens)"
    );
    if tokens.len() <= max {
        return vec![(0..text.len(), 0..tokens.len())];
    }
    // ends[i]: byte offset where token i ends.
    let mut ends = Vec::with_capacity(tokens.len());
    let mut offset = 0;
    for token in tokens {
        offset += tokenizer.token_bytes(*token).len();
        ends.push(offset);
    }
    let bytes = text.as_bytes();
    let clean_cut = |i: usize| ends[i] < text.len() && text.is_char_boundary(ends[i]);
    let sentence_cut =
        |i: usize| clean_cut(i) && matches!(bytes[ends[i] - 1], b'.' | b'!' | b'?' | b'\n');

    let mut out = Vec::new();
    let (mut token_start, mut byte_start) = (0, 0);
    while tokens.len() - token_start > max {
        let window = token_start..token_start + max;
        let last = window
            .clone()
            .rev()
            .find(|&i| sentence_cut(i))
            .or_else(|| window.clone().rev().find(|&i| clean_cut(i)))
            .expect(
                "a character spans at most 4 tokens, so 4 consecutive token ends hold a clean cut",
            );
        let (token_end, byte_end) = (last + 1, ends[last]);
        out.push((byte_start..byte_end, token_start..token_end));
        token_start = token_end;
        byte_start = byte_end;
    }
    out.push((byte_start..text.len(), token_start..tokens.len()));
    out
}

/// Turns messages into stored rows.
#[derive(Debug, Clone, Copy)]
pub struct Capturer<'a> {
    dictionary: &'a Dictionary,
    tokenizer: Tokenizer,
}

impl<'a> Capturer<'a> {
    pub fn new(dictionary: &'a Dictionary) -> Self {
        Self {
            dictionary,
            tokenizer: Tokenizer::new(),
        }
    }

    /// Tokenize, chunk and derive one message (pure; no I/O). An empty message has no rows and
    /// yields `None`.
    pub fn prepare(&self, message: &Message) -> Option<NewMessage> {
        if message.text.is_empty() {
            return None;
        }
        let tokens = self.tokenizer.encode(&message.text);
        let chunks = chunk_bounds(&self.tokenizer, &message.text, &tokens, MAX_CHUNK_TOKENS)
            .into_iter()
            .map(|(bytes, range)| {
                let tokens = tokens[range].to_vec();
                NewChunk {
                    text: message.text[bytes].to_owned(),
                    retrieval: derive(
                        self.dictionary,
                        &self.tokenizer,
                        message.name.as_deref(),
                        &tokens,
                    ),
                    tokens,
                }
            })
            .collect();
        Some(NewMessage {
            user: UserId::from_key(&message.user_key),
            user_key: message.user_key.clone(),
            conversation: message.conversation.clone(),
            role: message.role,
            name: message.name.clone(),
            timestamp_ms: message.timestamp_ms,
            source_turn: message.source_turn.clone(),
            decay: heat::birth_decay(heat::novelty(self.dictionary, &tokens)),
            born_peak: heat::BORN_PEAK,
            moved: None,
            chunks,
        })
    }

    /// Capture messages in one write batch; returns each message's row ids (empty for an
    /// empty message).
    pub fn capture(
        &self,
        store: &Store,
        messages: &[Message],
    ) -> Result<Vec<Vec<RowId>>, StoreError> {
        self.capture_since(store, messages, None)
    }

    /// [`Capturer::capture`] for a capture that began at purge epoch `since`
    /// ([`Store::write_captures_since`]): a message of a user purged since gets no ids.
    pub fn capture_since(
        &self,
        store: &Store,
        messages: &[Message],
        since: Option<u64>,
    ) -> Result<Vec<Vec<RowId>>, StoreError> {
        let prepared: Vec<Option<NewMessage>> = messages.iter().map(|m| self.prepare(m)).collect();
        let stored: Vec<NewMessage> = prepared.iter().flatten().cloned().collect();
        let mut ids = store.write_captures_since(&stored, since)?.into_iter();
        Ok(prepared
            .iter()
            .map(|p| match p {
                Some(_) => ids.next().unwrap_or_default(),
                None => Vec::new(),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Chunks partition the text and the tokens exactly, never exceed the bound, and
        /// every chunk's tokens decode to exactly its text.
        #[test]
        fn chunks_partition_the_message(
            sentences in proptest::collection::vec("[a-zA-Zé ✓]{0,40}[.!?\n]?", 0..60),
            max in 4usize..40,
        ) {
            let tok = Tokenizer::new();
            let text: String = sentences.concat();
            let tokens = tok.encode(&text);
            let bounds = chunk_bounds(&tok, &text, &tokens, max);
            let mut joined = String::new();
            let mut joined_tokens = Vec::new();
            for (bytes, range) in &bounds {
                prop_assert!(range.len() <= max);
                prop_assert!(!range.is_empty() || tokens.is_empty());
                prop_assert_eq!(tok.decode_bytes(&tokens[range.clone()]), text.as_bytes()[bytes.clone()].to_vec());
                joined.push_str(&text[bytes.clone()]);
                joined_tokens.extend_from_slice(&tokens[range.clone()]);
            }
            prop_assert_eq!(joined, text);
            prop_assert_eq!(joined_tokens, tokens);
        }
    }

    #[test]
    fn cuts_after_sentences_when_it_can() {
        let tok = Tokenizer::new();
        let text = "One two three four five. Six seven eight nine ten. Eleven twelve.";
        let tokens = tok.encode(text);
        let bounds = chunk_bounds(&tok, text, &tokens, 8);
        let first = &text[bounds[0].0.clone()];
        assert_eq!(first, "One two three four five.");
    }
}
