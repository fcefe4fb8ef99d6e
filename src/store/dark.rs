//! The dictionary's two slots (`docs/format.md`, "Dictionary swap"): a dark version installed
//! beside the serving one, its rows re-derived a batch at a time, the flip that makes it serve
//! and the retired slot cleared.

use super::*;

impl Store {
    /// The installed dark dictionary version and its progress, if one is installed.
    pub fn dark(&self) -> Result<Option<DarkVersion>, StoreError> {
        let Some(version) = self.meta(keys::meta::DARK_VERSION)? else {
            return Ok(None);
        };
        let number = |key, what| self.meta_u64(key, what).map(Option::unwrap_or_default);
        Ok(Some(DarkVersion {
            version: String::from_utf8_lossy(&version).into_owned(),
            from: number(keys::meta::DARK_FROM, "dark_from")?,
            next: number(keys::meta::DARK_NEXT, "dark_next")?,
            done: number(keys::meta::DARK_DONE, "dark_done")?,
            total: number(keys::meta::DARK_TOTAL, "dark_total")?,
        }))
    }

    pub(super) fn swap_refused(&self, reason: String) -> StoreError {
        StoreError::Swap {
            path: self.path.clone(),
            reason,
        }
    }

    /// Install `dictionary` as the dark version: its slot is cleared, and from the next row on
    /// every capture is derived under it too, in the same batch. The rows stored before are
    /// re-derived by [`Store::rederive_step`]. Refused while another dark version is
    /// installed, and for the serving version.
    pub fn install_dark(&self, dictionary: Arc<Dictionary>) -> Result<DarkVersion, StoreError> {
        let mut writer = self.writer.lock();
        let version = dictionary.version().to_owned();
        if let Some(dark) = &writer.dark {
            return Err(self.swap_refused(format!(
                "dark version {} is installed already (flip to it first)",
                dark.version
            )));
        }
        if self.dictionary_version()?.as_deref() == Some(version.as_str()) {
            return Err(self.swap_refused(format!("{version} is the serving version")));
        }
        let total = self
            .get(Cf::Counts, keys::count::ROWS)?
            .map(|value| decode_count(keys::count::ROWS, &value))
            .transpose()?
            .unwrap_or(0)
            .max(0) as u64;
        let state = DarkVersion {
            version: version.clone(),
            from: self.next_row().0,
            next: 1,
            done: 0,
            total,
        };
        let mut batch = WriteBatch::default();
        for cf in [Cf::DarkRetrieval, Cf::DarkCounts] {
            batch.delete_range_cf(&self.cf(cf), &[][..], &ALL_KEYS_END[..]);
        }
        let meta = self.cf(Cf::Meta);
        batch.put_cf(&meta, keys::meta::DARK_VERSION, version.as_bytes());
        batch.put_cf(&meta, keys::meta::DARK_FROM, state.from.to_le_bytes());
        batch.put_cf(&meta, keys::meta::DARK_NEXT, state.next.to_le_bytes());
        batch.put_cf(&meta, keys::meta::DARK_DONE, 0u64.to_le_bytes());
        batch.put_cf(&meta, keys::meta::DARK_TOTAL, total.to_le_bytes());
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|e| self.rocks(e))?;
        writer.dark = Some(Dark {
            version,
            dictionary: Some(dictionary),
        });
        Ok(state)
    }

    /// Give the store the table of its installed dark version (after it was opened again):
    /// captures are refused until it is attached, since they must derive under it too.
    pub fn attach_dark(&self, dictionary: Arc<Dictionary>) -> Result<(), StoreError> {
        let mut writer = self.writer.lock();
        match writer.dark.as_mut() {
            Some(dark) if dark.version == dictionary.version() => {
                dark.dictionary = Some(dictionary);
                Ok(())
            }
            other => Err(self.swap_refused(format!(
                "{} is not the installed dark version ({:?})",
                dictionary.version(),
                other.map(|d| &d.version)
            ))),
        }
    }

    /// The attached dark table, if any.
    pub fn dark_dictionary(&self) -> Option<Arc<Dictionary>> {
        let writer = self.writer.lock();
        writer.dark.as_ref().and_then(|d| d.dictionary.clone())
    }

    /// Whether `version` is the installed dark version (its rows and counts are the `Dark`
    /// families); any other version reads the serving ones.
    pub fn is_dark(&self, version: &str) -> bool {
        let writer = self.writer.lock();
        writer.dark.as_ref().is_some_and(|d| d.version == version)
    }

    /// Re-derive up to `max_rows` more of the rows stored before the install under the dark
    /// version (on the rayon pool, outside the write lock), then write their dark retrieval
    /// rows, their counts and the progress in one batch. Heat, decay and novelty are not
    /// touched. A purge meanwhile discards the step (it is redone). Returns the progress.
    pub fn rederive_step(&self, max_rows: usize) -> Result<DarkVersion, StoreError> {
        let (dictionary, purges) = {
            let writer = self.writer.lock();
            let dark = writer
                .dark
                .as_ref()
                .ok_or_else(|| self.swap_refused("no dark version is installed".into()))?;
            let dictionary = dark.dictionary.clone().ok_or_else(|| {
                self.swap_refused(format!("the table of {} is not attached", dark.version))
            })?;
            (dictionary, self.purges()?)
        };
        let state = self.dark()?.expect("a dark version is installed");
        if state.is_derived() {
            return Ok(state);
        }
        let rows = self
            .rows_since(RowId(state.next))
            .take_while(|row| row.as_ref().map_or(true, |row| row.id.0 < state.from))
            .take(max_rows)
            .collect::<Result<Vec<Row>, StoreError>>()?;
        let next = match rows.last() {
            Some(last) if rows.len() == max_rows => last.id.0 + 1,
            _ => state.from,
        };
        let tokenizer = Tokenizer::new();
        let derived: Vec<RetrievalRow> = rows
            .par_iter()
            .map(|row| derive(&dictionary, &tokenizer, row.name.as_deref(), &row.tokens))
            .collect();

        let _writer = self.writer.lock();
        if self.purges()? != purges {
            return Ok(state);
        }
        let mut batch = WriteBatch::default();
        let mut deltas = Deltas::default();
        let dark_cf = self.cf(Cf::DarkRetrieval);
        for (row, retrieval) in rows.iter().zip(&derived) {
            batch.put_cf(
                &dark_cf,
                keys::user_row(row.user, row.id),
                retrieval.encode(),
            );
            deltas.add(retrieval, 1);
        }
        self.merge_counts(&mut batch, Cf::DarkCounts, &deltas);
        let state = DarkVersion {
            next,
            done: state.done + rows.len() as u64,
            ..state
        };
        let meta = self.cf(Cf::Meta);
        batch.put_cf(&meta, keys::meta::DARK_NEXT, state.next.to_le_bytes());
        batch.put_cf(&meta, keys::meta::DARK_DONE, state.done.to_le_bytes());
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|e| self.rocks(e))?;
        crate::failpoint::hit("dict.mid_derive");
        Ok(state)
    }

    /// The flip: the dark version serves from now on, in ONE write (the serving version and
    /// slot); the retired version's slot is cleared after it. Refused unless every row has
    /// been re-derived. Returns the retired version.
    pub fn flip(&self) -> Result<String, StoreError> {
        let mut writer = self.writer.lock();
        let state = self
            .dark()?
            .ok_or_else(|| self.swap_refused("no dark version is installed".into()))?;
        if !state.is_derived() {
            return Err(self.swap_refused(format!(
                "{} is not derived yet: {}/{} rows",
                state.version, state.done, state.total
            )));
        }
        let retired = self.dictionary_version()?.unwrap_or_default();
        let slot = 1 - self.serving_slot.load(Ordering::Acquire);
        let mut batch = WriteBatch::default();
        let meta = self.cf(Cf::Meta);
        let mut earlier = self.retired_versions()?;
        earlier.retain(|v| *v != retired && *v != state.version);
        earlier.push(retired.clone());
        batch.put_cf(&meta, keys::meta::RETIRED, earlier.join("\n").as_bytes());
        batch.put_cf(
            &meta,
            keys::meta::DICTIONARY_VERSION,
            state.version.as_bytes(),
        );
        batch.put_cf(&meta, keys::meta::SERVING_SLOT, [slot as u8]);
        for key in keys::meta::DARK {
            batch.delete_cf(&meta, key);
        }
        crate::failpoint::hit("dict.before_flip");
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|e| self.rocks(e))?;
        crate::failpoint::hit("dict.after_flip");
        self.serving_slot.store(slot, Ordering::Release);
        writer.dark = None;
        drop(writer);
        self.clear_dark()?;
        Ok(retired)
    }

    /// The versions that served before the serving one, oldest first.
    pub fn retired_versions(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .meta(keys::meta::RETIRED)?
            .map(|v| {
                String::from_utf8_lossy(&v)
                    .lines()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Empty the dark slot when it holds anything (what a retired version left behind).
    pub(super) fn clear_dark(&self) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        for cf in [Cf::DarkRetrieval, Cf::DarkCounts] {
            if self.iter_all(cf).next().is_some() {
                batch.delete_range_cf(&self.cf(cf), &[][..], &ALL_KEYS_END[..]);
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|e| self.rocks(e))
    }
}
