//! Captures and the state recall changes: rows with everything derived from them in one batch,
//! the agent's clock, activations, exclusions, the warm index and owner links.

use super::*;

/// What a capture writes under one row's key, and its chain link: kept until every message of
/// the batch is read, then put in key order.
struct RowPuts {
    key: [u8; 16],
    row: Vec<u8>,
    retrieval: Vec<u8>,
    /// The dark slot's retrieval row, while a dictionary swap is under way.
    dark: Option<Vec<u8>>,
    activation: [u8; 16],
    warm: bool,
    excluded: bool,
    chain: [u8; 24],
}

impl Store {
    /// Store messages: each message's rows, retrieval rows, born-hot activation, chain links,
    /// name binding, frequency-count increments, clock advance and the new `next_row`, all in
    /// ONE write batch, so either everything about every message is stored or nothing is.
    /// Returns each message's row ids.
    ///
    /// The single writer of rows, retrieval rows, birth activation, decay, the log, counts,
    /// clocks, the chain graph and the binding log.
    pub fn write_captures(&self, messages: &[NewMessage]) -> Result<Vec<Vec<RowId>>, StoreError> {
        self.write_captures_since(messages, None)
    }

    /// The purge epoch: how many purges have run since the store was opened. A capture that
    /// began at epoch `e` is written with [`Store::write_captures_since`]`(.., Some(e))`.
    pub fn purge_epoch(&self) -> u64 {
        self.purge_epoch.load(Ordering::Acquire)
    }

    /// [`Store::write_captures`] for a capture that began at purge epoch `since`: the messages
    /// of a user purged after it are dropped (no ids), so a request in flight across a purge
    /// cannot bring the user back. Checked under the writer lock, which the purge holds too.
    pub fn write_captures_since(
        &self,
        messages: &[NewMessage],
        since: Option<u64>,
    ) -> Result<Vec<Vec<RowId>>, StoreError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(message) = messages.iter().find(|m| {
            m.moved
                .as_ref()
                .is_some_and(|moved| moved.chunks.len() != m.chunks.len())
        }) {
            return Err(StoreError::Moved {
                reason: format!(
                    "a moved message of {} chunks carries the state of {}",
                    message.chunks.len(),
                    message.moved.as_ref().map_or(0, |moved| moved.chunks.len())
                ),
            });
        }
        if let Some(message) = messages.iter().find(|m| m.chunks.len() > MAX_CHUNKS) {
            return Err(StoreError::TooLong {
                chunks: message.chunks.len(),
            });
        }
        let mut writer = self.writer.lock();
        let dark = match &writer.dark {
            None => None,
            Some(dark) => Some(dark.dictionary.clone().ok_or_else(|| {
                self.swap_refused(format!(
                    "dark version {} is installed but its table is not attached",
                    dark.version
                ))
            })?),
        };
        let tokenizer = Tokenizer::new();
        let mut batch = WriteBatch::default();
        let mut next_row = self.next_row().0;
        let mut clocks: HashMap<UserId, u64> = HashMap::new();
        let mut bindings: HashMap<(UserId, ConversationId, Role), Option<Vec<u8>>> = HashMap::new();
        let (mut deltas, mut dark_deltas) = (Deltas::default(), Deltas::default());
        let mut ids = Vec::with_capacity(messages.len());
        let mut warmed = Vec::new();
        let mut rows = Vec::with_capacity(messages.len());

        let (users_cf, rows_cf, retrieval_cf, activation_cf) = (
            self.cf(Cf::Users),
            self.cf(Cf::Rows),
            self.cf(Cf::Retrieval),
            self.cf(Cf::Activation),
        );
        let (log_cf, chain_cf, bindings_cf) =
            (self.cf(Cf::Log), self.cf(Cf::Chain), self.cf(Cf::Bindings));

        for message in messages {
            let user = message.user;
            if since.is_some_and(|since| writer.purged.get(&user).is_some_and(|&at| at > since)) {
                tracing::info!("a capture begun before its user's purge is dropped");
                ids.push(Vec::new());
                continue;
            }
            let conversation = ConversationId::from_key(&message.conversation);
            // A user's key is written once a batch, with its first message in it.
            let clock = match clocks.get(&user) {
                Some(&c) => c,
                None => {
                    batch.put_cf(&users_cf, keys::user(user), message.user_key.as_bytes());
                    writer.clock(user, || self.clock(user))?
                }
            };
            let message_tokens: u64 = message.chunks.iter().map(|c| c.tokens.len() as u64).sum();
            let (clock, kept) = match &message.moved {
                Some(moved) => (moved.birth_clock, clock.max(moved.birth_clock)),
                None => {
                    // Saturating: a clock near the top stays there rather than wrap to 0,
                    // which would leave every older row hot forever.
                    let next = clock.saturating_add(message_tokens);
                    (next, next)
                }
            };
            clocks.insert(user, kept);

            let first = RowId(next_row);
            if let Some(name) = &message.name {
                let slot = (user, conversation, message.role);
                let latest = match bindings.get(&slot) {
                    Some(latest) => latest.clone(),
                    None => self.latest_binding(user, conversation, message.role)?,
                };
                if latest.as_deref() != Some(name.as_bytes()) {
                    batch.put_cf(
                        &bindings_cf,
                        keys::binding(user, conversation, message.role, first),
                        name.as_bytes(),
                    );
                    bindings.insert(slot, Some(name.as_bytes().to_vec()));
                }
            }

            // At most MAX_CHUNKS (checked before the lock), so it and each index fit.
            let chunks = message.chunks.len() as u16;
            let mut message_ids = Vec::with_capacity(message.chunks.len());
            for (index, chunk) in message.chunks.iter().enumerate() {
                let id = RowId(next_row);
                next_row += 1;
                let row = Row {
                    id,
                    user,
                    conversation: message.conversation.clone(),
                    message: first,
                    chunk: index as u16,
                    chunks,
                    role: message.role,
                    name: message.name.clone(),
                    timestamp_ms: message.timestamp_ms,
                    source_turn: message.source_turn.clone(),
                    birth_clock: clock,
                    decay: message.decay,
                    tokens: chunk.tokens.clone(),
                    text: chunk.text.clone(),
                };
                let dark = dark.as_ref().map(|dictionary| {
                    let retrieval = derive(
                        dictionary,
                        &tokenizer,
                        message.name.as_deref(),
                        &chunk.tokens,
                    );
                    dark_deltas.add(&retrieval, 1);
                    retrieval.encode()
                });
                let moved = message.moved.as_ref().map(|moved| moved.chunks[index]);
                let activation = moved.map_or(
                    Activation {
                        last_clock: clock,
                        peak: message.born_peak,
                        decay: message.decay,
                    },
                    |moved| moved.activation,
                );
                let warm = moved.is_some_and(|moved| moved.warm);
                if warm {
                    warmed.push((user, id, activation));
                }
                rows.push(RowPuts {
                    key: keys::user_row(user, id),
                    row: row.encode(),
                    retrieval: chunk.retrieval.encode(),
                    dark,
                    activation: activation.encode(),
                    warm,
                    excluded: moved.is_some_and(|moved| moved.excluded),
                    chain: keys::chain(user, conversation, id),
                });
                batch.put_cf(&log_cf, keys::log(id), keys::user(user));
                deltas.add(&chunk.retrieval, 1);
                message_ids.push(id);
            }
            ids.push(message_ids);
        }

        // In key order, so each family's memtable inserts each row next to the one before
        // instead of searching from its top, as the counts are ([`Store::merge_counts`]).
        rows.sort_unstable_by_key(|puts| puts.key);
        for puts in rows {
            let key = puts.key;
            batch.put_cf(&rows_cf, key, puts.row);
            batch.put_cf(&retrieval_cf, key, puts.retrieval);
            if let Some(dark) = puts.dark {
                batch.put_cf(&self.cf(Cf::DarkRetrieval), key, dark);
            }
            batch.put_cf(&activation_cf, key, puts.activation);
            if puts.warm {
                batch.put_cf(&self.cf(Cf::Warm), key, puts.activation);
            }
            if puts.excluded {
                batch.put_cf(&self.cf(Cf::Exclusions), key, []);
            }
            batch.put_cf(&chain_cf, puts.chain, []);
        }
        let clock_cf = self.cf(Cf::Clock);
        for (user, clock) in &clocks {
            batch.put_cf(&clock_cf, keys::user(*user), clock.to_le_bytes());
        }
        self.merge_counts(&mut batch, Cf::Counts, &deltas);
        if dark.is_some() {
            self.merge_counts(&mut batch, Cf::DarkCounts, &dark_deltas);
        }
        batch.put_cf(
            &self.cf(Cf::Meta),
            keys::meta::NEXT_ROW,
            next_row.to_le_bytes(),
        );
        self.write(batch)?;
        for (&user, &clock) in &clocks {
            writer.keep_clock(user, clock);
        }
        crate::failpoint::hit("store.after_commit");
        self.next_row.store(next_row, Ordering::Release);
        let mut cached = self.bound.lock();
        for ((user, conversation, role), name) in bindings {
            if let (Some(names), Some(name)) = (cached.get_mut(&user), name) {
                Arc::make_mut(names).insert((conversation, role), bound_name_of(&name));
            }
        }
        let mut cached = self.warm.lock();
        for (user, row, activation) in warmed {
            if let Some(index) = cached.get_mut(&user) {
                Arc::make_mut(index).insert(row, activation);
            }
        }
        Ok(ids)
    }

    /// Move `user`'s clock on to `clock` when it is behind (a moved user's clock, which counts
    /// every token the user's requests brought, not only those of its stored rows).
    pub fn advance_clock(&self, user: UserId, clock: u64) -> Result<(), StoreError> {
        let mut writer = self.writer.lock();
        if writer.clock(user, || self.clock(user))? >= clock {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        batch.put_cf(&self.cf(Cf::Clock), keys::user(user), clock.to_le_bytes());
        self.write(batch)?;
        writer.keep_clock(user, clock);
        Ok(())
    }

    /// Add count deltas to the batch as merge operands of family `cf` (`Counts` or
    /// `DarkCounts`), in key order: the memtable then inserts each next to the one before
    /// instead of searching from its top (a bulk ingest ran 1.15 times as fast as in hash
    /// order, `docs/journal/benchmarks.md`).
    pub(super) fn merge_counts(&self, batch: &mut WriteBatch, cf: Cf, deltas: &Deltas) {
        let counts_cf = self.cf(cf);
        let mut tokens: Vec<(&TokenId, &i64)> = deltas.tokens.iter().collect();
        tokens.sort_unstable();
        for (token, delta) in tokens {
            batch.merge_cf(&counts_cf, keys::count::token(*token), delta.to_le_bytes());
        }
        let mut terms: Vec<(&TermId, &i64)> = deltas.terms.iter().collect();
        terms.sort_unstable();
        for (term, delta) in terms {
            batch.merge_cf(&counts_cf, keys::count::term(*term), delta.to_le_bytes());
        }
        // A zero total (no rows of this family) writes nothing: an empty family stays empty.
        for (key, delta) in [keys::count::ROWS, keys::count::TOKENS, keys::count::TERMS]
            .into_iter()
            .zip(deltas.totals)
            .filter(|&(_, delta)| delta != 0)
        {
            batch.merge_cf(&counts_cf, key, delta.to_le_bytes());
        }
    }

    /// Replace the activation of rows with new states. The single patcher of activation: only
    /// retrieval's reheat calls it. A row that no longer exists (purged meanwhile) is skipped;
    /// the decay is always the stored one, whatever the caller passed.
    pub fn patch_activation(
        &self,
        updates: &[(UserId, RowId, u64, f32)],
    ) -> Result<(), StoreError> {
        let _guard = self.writer.lock();
        let cf = self.cf(Cf::Activation);
        let warm = self.cf(Cf::Warm);
        let mut batch = WriteBatch::default();
        let mut written = Vec::with_capacity(updates.len());
        for &(user, row, last_clock, peak) in updates {
            let key = keys::user_row(user, row);
            let Some(bytes) = self.db.get_cf(&cf, key).map_err(|e| self.rocks(e))? else {
                continue;
            };
            let current = Activation::decode(&bytes).map_err(|source| StoreError::Corrupt {
                cf: Cf::Activation.name(),
                key: format!("{}/{}", user.0, row.0),
                source,
            })?;
            let next = Activation {
                last_clock,
                peak,
                decay: current.decay,
            };
            batch.put_cf(&cf, key, next.encode());
            batch.put_cf(&warm, key, next.encode());
            written.push((user, row, next));
        }
        self.write(batch)?;
        let mut cached = self.warm.lock();
        for (user, row, next) in written {
            if let Some(index) = cached.get_mut(&user) {
                Arc::make_mut(index).insert(row, next);
            }
        }
        Ok(())
    }

    /// Exclude `rows` of `user` from the user's recall (or, with `excluded` false, include them
    /// again): the rows stay stored, and retrieval, the frame and the memory tools pass over
    /// them. The single writer of the exclusions. Rows that are not the user's are left alone;
    /// returns the rows whose state changed, each once. The rows are read outside the writer
    /// lock (two batched reads, in key order), which is held only for the write.
    pub fn set_excluded(
        &self,
        user: UserId,
        rows: &[RowId],
        excluded: bool,
    ) -> Result<Vec<RowId>, StoreError> {
        let mut rows = rows.to_vec();
        rows.sort_unstable();
        rows.dedup();
        let keys: Vec<[u8; 16]> = rows.iter().map(|&row| keys::user_row(user, row)).collect();
        let (rows_cf, exclusions) = (self.cf(Cf::Rows), self.cf(Cf::Exclusions));
        let stored = self.db.batched_multi_get_cf(&rows_cf, &keys, true);
        let listed = self.db.batched_multi_get_cf(&exclusions, &keys, true);
        let mut batch = WriteBatch::default();
        let mut changed = Vec::new();
        for (((row, key), stored), listed) in rows.iter().zip(&keys).zip(stored).zip(listed) {
            let stored = stored.map_err(|e| self.rocks(e))?;
            let listed = listed.map_err(|e| self.rocks(e))?;
            if stored.is_none() || listed.is_some() == excluded {
                continue;
            }
            if excluded {
                batch.put_cf(&exclusions, key, []);
            } else {
                batch.delete_cf(&exclusions, key);
            }
            changed.push(*row);
        }
        let _guard = self.writer.lock();
        self.write(batch)?;
        Ok(changed)
    }

    /// Drop rows that have cooled below the frame's floor from the warm index (their
    /// activation stays). Called by retrieval's recall, the writer of activation.
    pub fn forget_cold(&self, user: UserId, rows: &[RowId]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let _guard = self.writer.lock();
        let warm = self.cf(Cf::Warm);
        let mut batch = WriteBatch::default();
        for &row in rows {
            batch.delete_cf(&warm, keys::user_row(user, row));
        }
        self.write(batch)?;
        if let Some(index) = self.warm.lock().get_mut(&user) {
            let index = Arc::make_mut(index);
            for row in rows {
                index.remove(row);
            }
        }
        Ok(())
    }

    /// Record that `user` is a sub-user of the credential whose own user is `owner`, unless it
    /// is recorded already: the single writer of the `owners` family. Written before the
    /// sub-user's first capture, so every sub-user with rows can be found by
    /// [`Store::sub_users`]; a link alone holds no text.
    pub fn link_owner(&self, user: UserId, owner: UserId) -> Result<(), StoreError> {
        let linked = keys::user(owner);
        if self.get(Cf::Owners, &keys::user(user))?.as_deref() == Some(&linked[..]) {
            return Ok(());
        }
        let _guard = self.writer.lock();
        let mut batch = WriteBatch::default();
        batch.put_cf(&self.cf(Cf::Owners), keys::user(user), linked);
        self.write(batch)
    }
}
