//! A purged user's rows taken out of the arena where they lie, in time proportional to the
//! user's rows: each of its pages is emptied (every column, its sketch and its rows' term and
//! token entries zeroed, so nothing derived from its words stays in the files) and sealed
//! again, its rows leave the slot index, and the resident statistic is read again from the
//! store. An emptied page belongs to no user and is never filled again; the next rebuild
//! drops it.

use super::*;

impl Arena {
    /// Take `users`' rows out of the arena (the store has already removed them: the caller
    /// holds captures back), commit, and return how many rows went. The header then records
    /// the store's purge count, so the next open maps the arena as it is.
    pub fn purge_users(
        &mut self,
        users: &[UserId],
        store: &Store,
        dictionary: &Dictionary,
    ) -> Result<u64, ArenaError> {
        let mut removed = 0u64;
        for user in users {
            let Some(pages) = self.by_user.remove(user) else {
                continue;
            };
            self.rows_by_user.remove(user);
            for p in pages {
                let page = *self.page(p);
                for i in 0..page.rows as usize {
                    let id = page.row_ids[i] as usize;
                    if let Some(slot) = self.slots.get_mut(id) {
                        *slot = Slot::NONE;
                        self.token_lens[id] = NOT_HELD;
                    }
                    let start = TERMS_HEADER_BYTES + page.term_offsets[i] as usize * ENTRY_BYTES;
                    let end = start + page.entries_of(i) * ENTRY_BYTES;
                    self.terms.bytes_mut()[start..end].fill(0);
                }
                removed += u64::from(page.rows);
                let (pages, sketches) = self.slices_mut();
                pages[p as usize] = Page::zeroed();
                sketches[p as usize] = Sketch::zeroed();
                self.dirty.push(p);
            }
        }
        self.header.rows -= removed;
        self.header.purges = store.purges()?;
        let (stats, counted_below) = store.counts_snapshot_in(families(store, dictionary).1)?;
        self.stats = stats;
        self.counted_below = counted_below;
        self.commit()?;
        Ok(removed)
    }
}
