//! Raw access by family and key: the integrity check's scans, and the tests that damage a
//! stored value on purpose.

use super::*;

impl Store {
    /// One raw value.
    pub fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.get_cf(&self.cf(cf), key).map_err(|e| self.rocks(e))
    }

    /// Write one raw value, bypassing every invariant: for repair tools and for the tests
    /// that seed corruption to prove the integrity check finds it. Never used when serving.
    pub fn raw_put(&self, cf: Cf, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.forget_clocks(cf);
        self.db
            .put_cf_opt(&self.cf(cf), key, value, &self.write_options)
            .map_err(|e| self.rocks(e))
    }

    /// Delete one raw value, bypassing every invariant (see [`Store::raw_put`]).
    pub fn raw_delete(&self, cf: Cf, key: &[u8]) -> Result<(), StoreError> {
        self.forget_clocks(cf);
        self.db
            .delete_cf_opt(&self.cf(cf), key, &self.write_options)
            .map_err(|e| self.rocks(e))
    }

    /// Before a raw write of the clock family, the writer forgets the clocks it keeps, so the
    /// next capture reads them from the store again.
    fn forget_clocks(&self, cf: Cf) {
        if cf == Cf::Clock {
            self.writer.lock().clocks.clear();
        }
    }

    /// Every entry of one family, in key order.
    pub fn iter_all(&self, cf: Cf) -> impl Iterator<Item = Result<RawEntry, StoreError>> + '_ {
        self.db
            .iterator_cf(&self.cf(cf), IteratorMode::Start)
            .map(move |item| item.map_err(|e| self.rocks(e)))
    }

    /// The entries of family `cf` from key `from` on, in key order: one seek, then a scan.
    pub fn iter_from<'s>(
        &'s self,
        cf: Cf,
        from: &[u8],
    ) -> impl Iterator<Item = Result<RawEntry, StoreError>> + 's {
        self.db
            .iterator_cf(
                &self.cf(cf),
                IteratorMode::From(from, rocksdb::Direction::Forward),
            )
            .map(move |item| item.map_err(|e| self.rocks(e)))
    }

    /// Every entry of one per-user family under `user`, in key order.
    pub fn iter_user(
        &self,
        cf: Cf,
        user: UserId,
    ) -> impl Iterator<Item = Result<RawEntry, StoreError>> + '_ {
        self.iter_range(cf, &keys::user(user), &keys::user_end(user))
    }

    /// The entries of family `cf` from key `from` up to, not including, key `below`, in key
    /// order: one range scan.
    pub(super) fn iter_range<'s>(
        &'s self,
        cf: Cf,
        from: &[u8],
        below: &[u8],
    ) -> impl Iterator<Item = Result<RawEntry, StoreError>> + use<'s> {
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(below.to_vec());
        self.db
            .iterator_cf_opt(
                &self.cf(cf),
                read,
                IteratorMode::From(from, Direction::Forward),
            )
            .map(move |item| item.map_err(|e| self.rocks(e)))
    }
}
