//! Reads: rows, retrieval rows, activations, conversations by their chain, speakers by the
//! binding log, exclusions, owners, the capture log and the frequency statistic.

use super::*;

/// Spans of the capture log this short are read by a lookup a row in
/// [`Store::logged_rows`]: a request's catch-up reads a row or two of a user, most of them still
/// in the memtable, where a range scan's iterators would seek every level of two families.
const POINT_READ_ROWS: usize = 4;

impl Store {
    /// A user's clock: tokens captured so far.
    pub fn clock(&self, user: UserId) -> Result<u64, StoreError> {
        let value = self
            .db
            .get_cf(&self.cf(Cf::Clock), keys::user(user))
            .map_err(|e| self.rocks(e))?;
        Ok(value
            .and_then(|v| v.as_slice().try_into().ok().map(u64::from_le_bytes))
            .unwrap_or(0))
    }

    /// The name most recently bound to `role` in a conversation, if any.
    pub(super) fn latest_binding(
        &self,
        user: UserId,
        conversation: ConversationId,
        role: Role,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let prefix = keys::binding_prefix(user, conversation, role);
        let end = keys::binding(user, conversation, role, RowId(u64::MAX));
        let mut iter = self.db.iterator_cf(
            &self.cf(Cf::Bindings),
            IteratorMode::From(&end, Direction::Reverse),
        );
        match iter.next() {
            Some(Ok((key, value))) if key.starts_with(&prefix) => Ok(Some(value.into_vec())),
            Some(Err(e)) => Err(self.rocks(e)),
            _ => Ok(None),
        }
    }

    /// The name bound to `role` in a conversation now (the latest binding), if any: what a
    /// frame labels the speaker with. Read from memory after the user's first read since open.
    pub fn bound_name(
        &self,
        user: UserId,
        conversation: ConversationId,
        role: Role,
    ) -> Result<Option<Arc<str>>, StoreError> {
        Ok(self.bound_names(user)?.get(&(conversation, role)).cloned())
    }

    /// Every speaker slot of `user` that has a name bound, with the latest one.
    pub fn bound_names(&self, user: UserId) -> Result<BoundNames, StoreError> {
        self.per_user(&self.bound, user, || {
            let mut names = HashMap::new();
            for entry in self.iter_user(Cf::Bindings, user) {
                let (key, value) = entry?;
                let (_, conversation, role, _) =
                    keys::parse_binding(&key).ok_or_else(|| StoreError::Corrupt {
                        cf: Cf::Bindings.name(),
                        key: hex_key(&key),
                        source: CodecError {
                            what: "binding key",
                            reason: "not user ++ conversation ++ role ++ row".into(),
                        },
                    })?;
                // Keys ascend by row within a slot: the last one read is the latest.
                names.insert((conversation, role), bound_name_of(&value));
            }
            Ok(Arc::new(names))
        })
    }

    /// `user`'s entry of the in-memory cache `cache` (`warm`, `bound`), loaded by `load` on
    /// its first read: under the writer lock, so no write slips between the load and the
    /// entry (every writer updates the entry after its batch lands, under the same lock).
    fn per_user<T: Clone>(
        &self,
        cache: &Mutex<HashMap<UserId, T>>,
        user: UserId,
        load: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Some(entry) = cache.lock().get(&user) {
            return Ok(entry.clone());
        }
        let _guard = self.writer.lock();
        if let Some(entry) = cache.lock().get(&user) {
            return Ok(entry.clone());
        }
        let entry = load()?;
        cache.lock().insert(user, entry.clone());
        Ok(entry)
    }

    /// Every activation state of a user's rows, in row order.
    pub fn activations_of(
        &self,
        user: UserId,
    ) -> impl Iterator<Item = Result<(RowId, Activation), StoreError>> + '_ {
        self.activation_entries(Cf::Activation, user)
    }

    /// One row's activation state, `None` for a row that is not stored.
    pub fn activation(&self, user: UserId, row: RowId) -> Result<Option<Activation>, StoreError> {
        let key = keys::user_row(user, row);
        self.get(Cf::Activation, &key)?
            .map(|bytes| {
                Activation::decode(&bytes).map_err(|source| StoreError::Corrupt {
                    cf: Cf::Activation.name(),
                    key: hex_key(&key),
                    source,
                })
            })
            .transpose()
    }

    /// The user's entries of a family holding activation states (`activation`, `warm`).
    fn activation_entries(
        &self,
        cf: Cf,
        user: UserId,
    ) -> impl Iterator<Item = Result<(RowId, Activation), StoreError>> + '_ {
        self.iter_user(cf, user).map(move |entry| {
            let (key, value) = entry?;
            let corrupt = |source| StoreError::Corrupt {
                cf: cf.name(),
                key: hex_key(&key),
                source,
            };
            let (_, row) = user_row_key(cf, &key, "activation key")?;
            Ok((row, Activation::decode(&value).map_err(corrupt)?))
        })
    }

    /// The rows of one conversation, newest first (from its chain).
    pub fn conversation_rows_newest_first(
        &self,
        user: UserId,
        conversation: &str,
    ) -> impl Iterator<Item = Result<RowId, StoreError>> + '_ {
        let conversation = ConversationId::from_key(conversation);
        let prefix = keys::chain_prefix(user, conversation);
        let end = keys::chain(user, conversation, RowId(u64::MAX));
        let mut read = ReadOptions::default();
        read.set_iterate_lower_bound(prefix.to_vec());
        self.db
            .iterator_cf_opt(
                &self.cf(Cf::Chain),
                read,
                IteratorMode::From(&end, Direction::Reverse),
            )
            .map(move |item| self.chain_row(item))
    }

    /// The rows of one conversation from row `from` on, oldest first (from its chain): one
    /// range scan, so a page of a long conversation costs its own rows.
    pub fn conversation_rows_from(
        &self,
        user: UserId,
        conversation: &str,
        from: RowId,
    ) -> impl Iterator<Item = Result<RowId, StoreError>> + '_ {
        self.chain_from(user, ConversationId::from_key(conversation), from)
    }

    /// [`Store::conversation_rows_from`] by the conversation's id.
    fn chain_from(
        &self,
        user: UserId,
        conversation: ConversationId,
        from: RowId,
    ) -> impl Iterator<Item = Result<RowId, StoreError>> + '_ {
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(keys::chain(user, conversation, RowId(u64::MAX)).to_vec());
        self.db
            .iterator_cf_opt(
                &self.cf(Cf::Chain),
                read,
                IteratorMode::From(&keys::chain(user, conversation, from), Direction::Forward),
            )
            .map(move |item| self.chain_row(item))
    }

    /// `user`'s conversations in id order after `after` (all of them without), each with its
    /// first row: one seek a conversation, whatever its length.
    pub fn conversations_of(
        &self,
        user: UserId,
        after: Option<ConversationId>,
    ) -> impl Iterator<Item = Result<(ConversationId, RowId), StoreError>> + '_ {
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(keys::user_end(user).to_vec());
        let mut cursor = self.db.raw_iterator_cf_opt(&self.cf(Cf::Chain), read);
        let mut next = match after {
            None => Some(keys::user(user).to_vec()),
            Some(after) => after
                .0
                .checked_add(1)
                .map(|id| keys::chain_prefix(user, ConversationId(id)).to_vec()),
        };
        std::iter::from_fn(move || {
            cursor.seek(next.take()?);
            if !cursor.valid() {
                return cursor.status().err().map(|e| Err(self.rocks(e)));
            }
            let (_, conversation, row) = match chain_key(cursor.key().unwrap_or_default()) {
                Ok(parsed) => parsed,
                Err(err) => return Some(Err(err)),
            };
            next = conversation
                .0
                .checked_add(1)
                .map(|id| keys::chain_prefix(user, ConversationId(id)).to_vec());
            Some(Ok((conversation, row)))
        })
    }

    /// The first row of each of `conversations` (from their chains; `None` for one without
    /// rows), in the order given: one iterator for all, one seek each, in key order.
    pub fn first_rows_of(
        &self,
        conversations: &[(UserId, ConversationId)],
    ) -> Result<Vec<Option<RowId>>, StoreError> {
        let mut order: Vec<usize> = (0..conversations.len()).collect();
        order.sort_unstable_by_key(|&i| conversations[i]);
        let mut cursor = self.db.raw_iterator_cf(&self.cf(Cf::Chain));
        let mut firsts = vec![None; conversations.len()];
        for i in order {
            let (user, conversation) = conversations[i];
            cursor.seek(keys::chain(user, conversation, RowId(0)));
            if !cursor.valid() {
                if let Err(e) = cursor.status() {
                    return Err(self.rocks(e));
                }
                continue;
            }
            let (at_user, at_conversation, row) = chain_key(cursor.key().unwrap_or_default())?;
            if (at_user, at_conversation) == (user, conversation) {
                firsts[i] = Some(row);
            }
        }
        Ok(firsts)
    }

    /// The row a `chain` entry (as an iterator yields it) names.
    fn chain_row(&self, item: Result<KeyValue, rocksdb::Error>) -> Result<RowId, StoreError> {
        let (key, _) = item.map_err(|e| self.rocks(e))?;
        chain_key(&key).map(|(_, _, row)| row)
    }

    /// The rows of `row`'s conversation around it, in capture order: up to `reach` before it,
    /// the row itself, and up to `reach` after it (from its chain).
    pub fn conversation_rows_around(
        &self,
        user: UserId,
        conversation: &str,
        row: RowId,
        reach: usize,
    ) -> Result<Vec<RowId>, StoreError> {
        let conversation = ConversationId::from_key(conversation);
        let prefix = keys::chain_prefix(user, conversation);
        let walk = |from: [u8; 24], direction: Direction, take: usize| {
            let mut read = ReadOptions::default();
            read.set_iterate_lower_bound(prefix.to_vec());
            read.set_iterate_upper_bound(keys::chain(user, conversation, RowId(u64::MAX)).to_vec());
            self.db
                .iterator_cf_opt(
                    &self.cf(Cf::Chain),
                    read,
                    IteratorMode::From(&from, direction),
                )
                .take(take)
                .map(|item| self.chain_row(item))
                .collect::<Result<Vec<RowId>, StoreError>>()
        };
        let mut rows = walk(
            keys::chain(user, conversation, row),
            Direction::Reverse,
            reach + 1,
        )?;
        rows.reverse();
        rows.extend(walk(
            keys::chain(user, conversation, RowId(row.0.saturating_add(1))),
            Direction::Forward,
            reach,
        )?);
        Ok(rows)
    }

    /// The rows `user` excluded from its recall ([`Store::set_excluded`]).
    pub fn exclusions(&self, user: UserId) -> Result<HashSet<RowId>, StoreError> {
        self.iter_user(Cf::Exclusions, user)
            .map(|entry| {
                let (key, _) = entry?;
                user_row_key(Cf::Exclusions, &key, "exclusion key").map(|(_, row)| row)
            })
            .collect()
    }

    /// The rows any user of `scope` excluded: a group scope's search passes over each
    /// member's exclusions among that member's rows (row ids are unique across users, so one
    /// set holds them all).
    pub fn scope_exclusions(&self, scope: &[UserId]) -> Result<HashSet<RowId>, StoreError> {
        let mut excluded = HashSet::new();
        for &user in scope {
            excluded.extend(self.exclusions(user)?);
        }
        Ok(excluded)
    }

    /// The warm index of a user: every reheated row still listed, with its activation, in row
    /// order. Rows born hot and never reheated are not listed (their state is the birth state).
    /// Read from memory after the user's first read since open.
    pub fn warm_of(&self, user: UserId) -> Result<WarmIndex, StoreError> {
        self.per_user(&self.warm, user, || {
            Ok(Arc::new(
                self.activation_entries(Cf::Warm, user)
                    .collect::<Result<_, _>>()?,
            ))
        })
    }

    /// The credential's own user `user` is a sub-user of ([`Store::link_owner`]), if any.
    pub fn owner_of(&self, user: UserId) -> Result<Option<UserId>, StoreError> {
        let Some(value) = self.get(Cf::Owners, &keys::user(user))? else {
            return Ok(None);
        };
        keys::parse_user(&value)
            .map(Some)
            .ok_or_else(|| StoreError::Corrupt {
                cf: Cf::Owners.name(),
                key: hex_key(&keys::user(user)),
                source: CodecError {
                    what: "owner link",
                    reason: "value is not a user id".into(),
                },
            })
    }

    /// The sub-users linked to `owner` ([`Store::link_owner`]), in id order.
    pub fn sub_users(&self, owner: UserId) -> Result<Vec<UserId>, StoreError> {
        let mut found = Vec::new();
        for entry in self.iter_all(Cf::Owners) {
            let (key, value) = entry?;
            let (Some(user), Some(linked)) = (keys::parse_user(&key), keys::parse_user(&value))
            else {
                return Err(StoreError::Corrupt {
                    cf: Cf::Owners.name(),
                    key: hex_key(&key),
                    source: CodecError {
                        what: "owner link",
                        reason: "key or value is not a user id".into(),
                    },
                });
            };
            if linked == owner {
                found.push(user);
            }
        }
        Ok(found)
    }

    /// The rows the capture log names for `user` (`ids`, ascending), each with its retrieval
    /// row of family `retrieval` (`None` where it has none), read by one range scan of each
    /// family instead of a lookup a row: the arena's catch-up reads its batches this way. A
    /// span of at most [`POINT_READ_ROWS`] is read by lookups.
    pub fn logged_rows(
        &self,
        retrieval: Cf,
        user: UserId,
        ids: &[RowId],
    ) -> Result<Vec<(Row, Option<RetrievalRow>)>, StoreError> {
        if ids.len() <= POINT_READ_ROWS {
            return ids
                .iter()
                .map(|&id| {
                    Ok((
                        self.logged_row(id, user)?,
                        self.retrieval_in(retrieval, user, id)?,
                    ))
                })
                .collect();
        }
        let (Some(&first), Some(&last)) = (ids.first(), ids.last()) else {
            return Ok(Vec::new());
        };
        let corrupt = |cf: Cf, key: &[u8], source| StoreError::Corrupt {
            cf: cf.name(),
            key: hex_key(key),
            source,
        };
        // Each family's entries from `first` to `last`, with their row ids: one range scan.
        let (from, below) = (
            keys::user_row(user, first),
            keys::user_row(user, RowId(last.0 + 1)),
        );
        let span = |cf: Cf| {
            self.iter_range(cf, &from, &below)
                .map(|entry| {
                    let (key, value) = entry?;
                    Ok((user_row_key(cf, &key, "row key")?.1, key, value))
                })
                .collect::<Result<Vec<_>, StoreError>>()
                .map(|entries| entries.into_iter().peekable())
        };
        let (mut rows, mut retrievals) = (span(Cf::Rows)?, span(retrieval)?);
        let mut read = Vec::with_capacity(ids.len());
        for &id in ids {
            while rows.next_if(|(at, ..)| *at < id).is_some() {}
            let (_, key, value) = rows
                .next_if(|(at, ..)| *at == id)
                .ok_or_else(|| log_corrupt(&keys::log(id), "logged row is missing from rows"))?;
            let row =
                Row::decode(user, id, &value).map_err(|source| corrupt(Cf::Rows, &key, source))?;
            let mut found = None;
            while let Some((at, key, value)) = retrievals.next_if(|(at, ..)| *at <= id) {
                if at == id {
                    found = Some(
                        RetrievalRow::decode(&value)
                            .map_err(|source| corrupt(retrieval, &key, source))?,
                    );
                }
            }
            read.push((row, found));
        }
        Ok(read)
    }

    /// Rows in global capture order, starting at `from`.
    pub fn rows_since(&self, from: RowId) -> impl Iterator<Item = Result<Row, StoreError>> + '_ {
        self.log_since(from)
            .map(move |entry| entry.and_then(|(id, user)| self.logged_row(id, user)))
    }

    /// The capture log from `from` on: each row's id and user, in capture order (the arena's
    /// catch-up reads a batch of it, then the rows themselves in parallel).
    pub fn log_since(
        &self,
        from: RowId,
    ) -> impl Iterator<Item = Result<(RowId, UserId), StoreError>> + '_ {
        self.db
            .iterator_cf(
                &self.cf(Cf::Log),
                IteratorMode::From(&keys::log(from), Direction::Forward),
            )
            .map(move |item| {
                let (key, value) = item.map_err(|e| self.rocks(e))?;
                let row = keys::parse_log(&key)
                    .ok_or_else(|| log_corrupt(&key, "key is not a row id"))?;
                let user: [u8; 8] = value[..]
                    .try_into()
                    .map_err(|_| log_corrupt(&key, "value is not a user id"))?;
                Ok((row, UserId(u64::from_be_bytes(user))))
            })
    }

    /// The row the capture log names: `user`'s row `id`, which the rows must hold.
    pub fn logged_row(&self, id: RowId, user: UserId) -> Result<Row, StoreError> {
        self.row(user, id)?
            .ok_or_else(|| log_corrupt(&keys::log(id), "logged row is missing from rows"))
    }

    /// A user's rows in capture order.
    pub fn rows_of(&self, user: UserId) -> impl Iterator<Item = Result<Row, StoreError>> + '_ {
        self.rows_of_from(user, RowId(0))
    }

    /// [`Store::rows_of`] from row `from` on: one range scan that starts there (a page of a
    /// million-row user costs its own rows, not those before it).
    pub fn rows_of_from(
        &self,
        user: UserId,
        from: RowId,
    ) -> impl Iterator<Item = Result<Row, StoreError>> + '_ {
        self.iter_range(Cf::Rows, &keys::user_row(user, from), &keys::user_end(user))
            .map(|entry| {
                let (key, value) = entry?;
                let corrupt = |source| StoreError::Corrupt {
                    cf: Cf::Rows.name(),
                    key: hex_key(&key),
                    source,
                };
                let (user, id) = user_row_key(Cf::Rows, &key, "row key")?;
                Row::decode(user, id, &value).map_err(corrupt)
            })
    }

    /// One row.
    pub fn row(&self, user: UserId, id: RowId) -> Result<Option<Row>, StoreError> {
        let key = keys::user_row(user, id);
        let Some(bytes) = self
            .db
            .get_pinned_cf(&self.cf(Cf::Rows), key)
            .map_err(|e| self.rocks(e))?
        else {
            return Ok(None);
        };
        Row::decode(user, id, &bytes)
            .map(Some)
            .map_err(|source| StoreError::Corrupt {
                cf: Cf::Rows.name(),
                key: hex_key(&key),
                source,
            })
    }

    /// The user a row belongs to, from the capture log.
    pub fn user_of(&self, row: RowId) -> Result<Option<UserId>, StoreError> {
        Ok(self
            .get(Cf::Log, &keys::log(row))?
            .and_then(|v| <[u8; 8]>::try_from(&v[..]).ok())
            .map(|v| UserId(u64::from_be_bytes(v))))
    }

    /// One retrieval row.
    pub fn retrieval(&self, user: UserId, id: RowId) -> Result<Option<RetrievalRow>, StoreError> {
        self.retrieval_in(Cf::Retrieval, user, id)
    }

    /// One retrieval row of family `cf` (`Retrieval` or `DarkRetrieval`).
    pub fn retrieval_in(
        &self,
        cf: Cf,
        user: UserId,
        id: RowId,
    ) -> Result<Option<RetrievalRow>, StoreError> {
        let key = keys::user_row(user, id);
        let Some(bytes) = self
            .db
            .get_pinned_cf(&self.cf(cf), key)
            .map_err(|e| self.rocks(e))?
        else {
            return Ok(None);
        };
        RetrievalRow::decode(&bytes)
            .map(Some)
            .map_err(|source| StoreError::Corrupt {
                cf: cf.name(),
                key: hex_key(&key),
                source,
            })
    }

    /// A user's key as it was captured, if the user has a memory.
    pub fn user_key(&self, user: UserId) -> Result<Option<String>, StoreError> {
        Ok(self
            .db
            .get_cf(&self.cf(Cf::Users), keys::user(user))
            .map_err(|e| self.rocks(e))?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// The stored frequency counts as a table (zero counts are absent). A negative or
    /// malformed count is corruption.
    pub fn frequency_table(&self) -> Result<FrequencyTable, StoreError> {
        self.frequency_table_in(Cf::Counts)
    }

    /// [`Store::frequency_table`] of one family of counts (`Counts` or `DarkCounts`).
    pub fn frequency_table_in(&self, cf: Cf) -> Result<FrequencyTable, StoreError> {
        let mut table = FrequencyTable::default();
        for entry in self.iter_all(cf) {
            let (key, value) = entry?;
            let corrupt = |reason: String| StoreError::Corrupt {
                cf: cf.name(),
                key: hex_key(&key),
                source: CodecError {
                    what: "count",
                    reason,
                },
            };
            let count = keys::count::parse(&key).ok_or_else(|| corrupt("unknown key".into()))?;
            let value = decode_count(&key, &value)?;
            let value = u64::try_from(value).map_err(|_| corrupt(format!("negative: {value}")))?;
            table.set(count, value);
        }
        Ok(table)
    }
}
