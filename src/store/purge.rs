//! A user's memory removed as a unit: its ranges deleted and its counts subtracted in one
//! batch, then flushed and compacted so no byte of it stays on disk.

use super::*;

impl Store {
    /// [`Store::remove_user`] of every sub-user of `owner`, then of `owner` itself: a
    /// credential's whole memory. Each user is removed as a unit; a purge stopped between two
    /// users leaves the rest linked, so asking again completes it.
    pub fn remove_credential(&self, owner: UserId) -> Result<Purged, StoreError> {
        let sub_users = self.sub_users(owner)?;
        let mut rows = 0;
        for &user in sub_users.iter().chain([&owner]) {
            rows += self.remove_user(user)?;
        }
        Ok(Purged { rows, sub_users })
    }

    /// Every user whose purge removed its memory and has not finished compacting it (a purge
    /// killed in between): [`Store::finish_purge`] completes each.
    pub fn unfinished_purges(&self) -> Result<Vec<UserId>, StoreError> {
        let prefix = keys::meta::purging(UserId(0));
        let prefix = &prefix[..prefix.len() - 8];
        let mut users = Vec::new();
        for entry in self.iter_from(Cf::Meta, prefix) {
            let (key, _) = entry?;
            let Some(user) = key.strip_prefix(prefix) else {
                break;
            };
            if let Some(user) = keys::parse_user(user) {
                users.push(user);
            }
        }
        Ok(users)
    }

    /// Remove a user's memory as a unit: rows, retrieval rows, activation, log entries, clock,
    /// chain, bindings, the user entry, and the user's contribution to the frequency counts,
    /// in one batch. Then flush and compact the user's key ranges so the bytes are physically
    /// gone from the data directory. Returns the number of rows removed.
    pub fn purge_user(&self, user: UserId) -> Result<u64, StoreError> {
        let removed = self.remove_user(user)?;
        self.finish_purge(user)?;
        Ok(removed)
    }

    /// The first step of [`Store::purge_user`]: the user's memory removed in one batch under
    /// the writer lock, the purge marked unfinished. Returns the number of rows removed.
    pub fn remove_user(&self, user: UserId) -> Result<u64, StoreError> {
        let removed = {
            let mut writer = self.writer.lock();
            let mut batch = WriteBatch::default();
            let log_cf = self.cf(Cf::Log);
            let deltas = self.user_deltas(Cf::Retrieval, user)?;
            self.merge_counts(&mut batch, Cf::Counts, &deltas);
            let dark_deltas = self.user_deltas(Cf::DarkRetrieval, user)?;
            self.merge_counts(&mut batch, Cf::DarkCounts, &dark_deltas);
            for entry in self.iter_user(Cf::Rows, user) {
                let (key, _) = entry?;
                if let Some((_, row)) = keys::parse_user_row(&key) {
                    batch.delete_cf(&log_cf, keys::log(row));
                }
            }
            for cf in Cf::PER_USER {
                batch.delete_range_cf(&self.cf(cf), keys::user(user), keys::user_end(user));
            }
            batch.put_cf(
                &self.cf(Cf::Meta),
                keys::meta::PURGES,
                (self.purges()? + 1).to_le_bytes(),
            );
            batch.put_cf(&self.cf(Cf::Meta), keys::meta::purging(user), []);
            self.write(batch)?;
            let epoch = self.purge_epoch.load(Ordering::Relaxed) + 1;
            writer.purged.insert(user, epoch);
            writer.clocks.remove(&user);
            self.purge_epoch.store(epoch, Ordering::Release);
            self.warm.lock().remove(&user);
            self.bound.lock().remove(&user);
            crate::failpoint::hit("purge.after_batch");
            (-deltas.totals[0]) as u64
        };
        Ok(removed)
    }

    /// The second step of [`Store::purge_user`]: flush and compact the user's key ranges so
    /// the bytes are physically gone from the data directory, then mark the purge finished.
    /// Captures may go on meanwhile.
    pub fn finish_purge(&self, user: UserId) -> Result<(), StoreError> {
        self.compact_user(user)?;
        self.db
            .delete_cf(&self.cf(Cf::Meta), keys::meta::purging(user))
            .map_err(|e| self.rocks(e))
    }

    /// Whether a purge of `user` stopped before its compaction was done (asking again
    /// completes it).
    pub fn purge_unfinished(&self, user: UserId) -> Result<bool, StoreError> {
        Ok(self.get(Cf::Meta, &keys::meta::purging(user))?.is_some())
    }

    /// The count deltas that remove `user`'s retrieval rows of family `cf` (negated counts).
    fn user_deltas(&self, cf: Cf, user: UserId) -> Result<Deltas, StoreError> {
        let mut deltas = Deltas::default();
        for entry in self.iter_user(cf, user) {
            let (key, value) = entry?;
            let retrieval = RetrievalRow::decode(&value).map_err(|source| StoreError::Corrupt {
                cf: cf.name(),
                key: hex_key(&key),
                source,
            })?;
            deltas.add(&retrieval, -1);
        }
        Ok(deltas)
    }

    /// Flush every family and compact `user`'s ranges (and the log and counts), so deleted
    /// values are dropped from the SST files and the WAL holding them is retired.
    fn compact_user(&self, user: UserId) -> Result<(), StoreError> {
        let families: Vec<_> = Cf::ALL.iter().map(|&cf| self.cf(cf)).collect();
        let refs: Vec<_> = families.iter().collect();
        self.db
            .flush_cfs_opt(&refs, &rocksdb::FlushOptions::default())
            .map_err(|e| self.rocks(e))?;
        crate::failpoint::hit("purge.mid_compaction");
        for cf in Cf::PER_USER {
            self.db.compact_range_cf(
                &self.cf(cf),
                Some(keys::user(user)),
                Some(keys::user_end(user)),
            );
        }
        for cf in [Cf::Log, Cf::Counts, Cf::DarkCounts] {
            self.db
                .compact_range_cf(&self.cf(cf), None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }
}
