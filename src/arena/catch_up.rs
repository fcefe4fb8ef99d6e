//! Catching an arena up with the store: batches of the capture log read, embedded, coded and
//! appended to their users' pages, the codebook recomputed as the rows grow, then the commit.

use super::*;

/// One batch of a catch-up: rows in id order with their retrieval rows.
struct Batch {
    rows: Vec<(Row, RetrievalRow)>,
    /// Whether it holds [`CATCH_UP_BATCH_ROWS`] rows (more may follow).
    full: bool,
    /// The row after its last.
    next: RowId,
}

/// `f` over `items` in order: on the rayon pool for a batch of `rows` at least
/// [`CATCH_UP_PARALLEL_ROWS`], else on the calling thread.
fn map_batch<T: Sync, R: Send>(
    items: &[T],
    rows: usize,
    f: impl Fn(&T) -> R + Sync + Send,
) -> Vec<R> {
    if rows < CATCH_UP_PARALLEL_ROWS {
        items.iter().map(f).collect()
    } else {
        items.par_iter().map(f).collect()
    }
}

/// Read the next [`CATCH_UP_BATCH_ROWS`] rows of the capture log from `from` with their
/// retrieval rows of family `retrieval` (`None` when there are none): the log in order, then
/// each user's rows by range scans of [`CATCH_UP_SPAN_ROWS`] (a few rows by lookups), in
/// parallel ([`map_batch`]).
fn read_batch(store: &Store, retrieval: Cf, from: RowId) -> Result<Option<Batch>, ArenaError> {
    let logged = store
        .log_since(from)
        .take(CATCH_UP_BATCH_ROWS)
        .collect::<Result<Vec<_>, _>>()?;
    let Some(&(last, _)) = logged.last() else {
        return Ok(None);
    };
    let full = logged.len() == CATCH_UP_BATCH_ROWS;
    let mut by_user: HashMap<UserId, Vec<RowId>> = HashMap::new();
    for &(id, user) in &logged {
        by_user.entry(user).or_default().push(id);
    }
    let spans: Vec<(UserId, &[RowId])> = by_user
        .iter()
        .flat_map(|(&user, ids)| ids.chunks(CATCH_UP_SPAN_ROWS).map(move |ids| (user, ids)))
        .collect();
    let parts = map_batch(&spans, logged.len(), |&(user, ids)| {
        store
            .logged_rows(retrieval, user, ids)?
            .into_iter()
            .map(|(row, found)| {
                let found = found.ok_or(ArenaError::MissingRetrieval {
                    user: user.0,
                    row: row.id.0,
                })?;
                Ok((row, found))
            })
            .collect::<Result<Vec<_>, ArenaError>>()
    })
    .into_iter()
    .collect::<Result<Vec<_>, ArenaError>>()?;
    // Back in log order: each row moved once to its place (the log's ids ascend).
    let mut placed: Vec<Option<(Row, RetrievalRow)>> = (0..logged.len()).map(|_| None).collect();
    for (row, found) in parts.into_iter().flatten() {
        let at = logged.partition_point(|&(id, _)| id < row.id);
        placed[at] = Some((row, found));
    }
    let rows = placed.into_iter().flatten().collect();
    Ok(Some(Batch {
        rows,
        full,
        next: RowId(last.0 + 1),
    }))
}

/// Rows whose entries go to `terms.bin` in one write.
const WRITE_ROWS: usize = 1_024;

impl Arena {
    /// Read every row newer than the watermark from the store, count its retrieval row into
    /// the resident statistic, embed it, append it to its user's last page, and commit, in
    /// batches of [`CATCH_UP_BATCH_ROWS`] (progress logged after each full batch). Returns the
    /// number of rows read. Row ids are committed in increasing order (the store's
    /// write mutex), so after reading row `n` no row below `n` can appear later.
    ///
    /// A batch's log entries are read in order; its rows and retrieval rows by range scans
    /// ([`Store::logged_rows`]; a span of a few rows by lookups), a user's span of
    /// [`CATCH_UP_SPAN_ROWS`] at a time, in parallel (on the rayon pool); each row's embedding,
    /// code and signature in parallel too: only the count and the copy into the pages are
    /// serial. A batch under [`CATCH_UP_PARALLEL_ROWS`] (a request's) stays on the calling
    /// thread.
    pub fn catch_up(
        &mut self,
        store: &Store,
        dictionary: &Dictionary,
    ) -> Result<usize, ArenaError> {
        if dictionary.dims() > DIMS {
            return Err(ArenaError::Dimensions {
                found: dictionary.dims(),
            });
        }
        let retrieval_cf = families(store, dictionary).0;
        let mut caught = 0;
        let mut next = read_batch(store, retrieval_cf, self.watermark())?;
        while let Some(batch) = next.take() {
            for (row, retrieval) in &batch.rows {
                if row.id >= self.counted_below {
                    retrieval.count_into(&mut self.stats);
                    self.counted_below = RowId(row.id.0 + 1);
                }
            }
            // The next batch, where there is one, is read while this one is placed.
            let (appended, following) = if batch.full {
                rayon::join(
                    || self.append_batch(dictionary, &batch.rows),
                    || read_batch(store, retrieval_cf, batch.next),
                )
            } else {
                (self.append_batch(dictionary, &batch.rows), Ok(None))
            };
            caught += appended?;
            next = following?;
            if next.is_some() {
                tracing::info!(rows = caught, "arena catch-up in progress");
            }
        }
        Ok(caught)
    }

    /// Embed a batch of rows and encode their codes and signatures (on the rayon pool, under
    /// the statistic and the codebook as they stand), append them in row id order and
    /// commit. Returns how many rows it held.
    fn append_batch(
        &mut self,
        dictionary: &Dictionary,
        batch: &[(Row, RetrievalRow)],
    ) -> Result<usize, ArenaError> {
        if batch.is_empty() {
            return Ok(0);
        }
        let (stats, codebook) = (&self.stats, self.codebook);
        let sketched: Vec<Sketched> = map_batch(batch, batch.len(), |(_, retrieval)| {
            let embedding = embed_row(dictionary, stats, retrieval.tokens.iter().copied());
            let quantized = embedding.quantize();
            Sketched {
                code: CodeBytes::from(&codebook.encode(&quantized.values, quantized.scale)),
                quantized,
                signature: signature::signature(retrieval.terms.iter().map(|&(term, _)| term)),
            }
        });
        // Entries first, past the committed ones: each row's terms, then its tokens, in row
        // order, written a stretch of rows at a time.
        let mut at = TERMS_HEADER_BYTES + self.header.terms as usize * ENTRY_BYTES;
        let mut entries: Vec<Entry> = Vec::new();
        for stretch in batch.chunks(WRITE_ROWS) {
            entries.clear();
            for (_, retrieval) in stretch {
                entries.extend(
                    retrieval
                        .terms
                        .iter()
                        .map(|&(term, count)| Entry { key: term.0, count }),
                );
                entries.extend(retrieval.tokens.iter().map(|&(token, count)| Entry {
                    key: u64::from(token.0),
                    count,
                }));
            }
            let bytes: &[u8] = bytemuck::cast_slice(&entries);
            self.terms
                .write_at(at, bytes)
                .map_err(|e| io_error(&self.terms, e))?;
            at += bytes.len();
        }
        for ((row, retrieval), sketched) in batch.iter().zip(&sketched) {
            self.append(row, retrieval, sketched)?;
            self.header.watermark = row.id.0 + 1;
            crate::failpoint::hit("arena.mid_append");
        }
        if self.header.rows >= CODEBOOK_GROWTH * self.codebook.rows {
            self.recompute_codebook();
        }
        self.commit()?;
        Ok(batch.len())
    }

    /// Place one row, whose entries are written past the committed ones: its columns in its
    /// user's last page (a new page where that one is full), its code and signature in the
    /// page's sketch.
    fn append(
        &mut self,
        row: &Row,
        retrieval: &RetrievalRow,
        sketched: &Sketched,
    ) -> Result<(), ArenaError> {
        let offset = self.header.terms;
        self.header.terms += (retrieval.terms.len() + retrieval.tokens.len()) as u64;

        let last = self
            .by_user
            .get(&row.user)
            .and_then(|pages| pages.last().copied());
        let page_index = match last {
            Some(p) if (self.page_slice()[p as usize].rows as usize) < PAGE_ROWS => p,
            _ => {
                let p = self.header.pages as u32;
                self.pages
                    .reserve(PAGES_OFFSET + (p as usize + 1) * PAGE_BYTES)
                    .map_err(|e| io_error(&self.pages, e))?;
                self.sketches
                    .reserve(SKETCHES_OFFSET + (p as usize + 1) * SKETCH_BYTES)
                    .map_err(|e| io_error(&self.sketches, e))?;
                self.header.pages += 1;
                let (pages, sketches) = self.slices_mut();
                let page = &mut pages[p as usize];
                *page = Page::zeroed();
                page.user = row.user.0;
                sketches[p as usize] = Sketch::zeroed();
                self.by_user.entry(row.user).or_default().push(p);
                p
            }
        };
        let quantized = &sketched.quantized;
        let codebook = self.codebook;
        let (pages, sketches) = self.slices_mut();
        let (page, sketch) = (
            &mut pages[page_index as usize],
            &mut sketches[page_index as usize],
        );
        let i = page.rows as usize;
        page.row_ids[i] = row.id.0;
        page.roles[i] = row.role as u8;
        page.conversations[i] = ConversationId::from_key(&row.conversation).0;
        page.birth_clocks[i] = row.birth_clock;
        page.term_offsets[i] = offset;
        page.decays[i] = row.decay;
        page.token_lens[i] = row.tokens.len() as u32;
        page.scales[i] = quantized.scale;
        page.term_lens[i] = retrieval.term_len() as u32;
        page.term_counts[i] = retrieval.terms.len() as u32;
        page.token_counts[i] = retrieval.tokens.len() as u32;
        page.codebook = codebook.checksum;
        page.vectors[i * DIMS..(i + 1) * DIMS].copy_from_slice(&quantized.values);
        // A killed process leaves the row's columns written wherever it counts them.
        in_order();
        page.rows += 1;
        sketch.set_row(
            i,
            row.id.0,
            page.term_lens[i],
            &sketched.code,
            &sketched.signature,
        );
        sketch.rows = page.rows;
        self.header.rows += 1;
        *self.rows_by_user.entry(row.user).or_default() += 1;
        self.dirty.push(page_index);
        let id = row.id.0 as usize;
        if self.slots.len() <= id {
            self.slots.resize(id + 1, Slot::NONE);
            self.token_lens.resize(id + 1, NOT_HELD);
        }
        self.token_lens[id] = row.tokens.len() as u32;
        self.slots[id] = Slot {
            page: page_index,
            index: i as u32,
        };
        Ok(())
    }

    /// The committed pages and their sketches, to write.
    pub(super) fn slices_mut(&mut self) -> (&mut [Page], &mut [Sketch]) {
        let (pages_end, sketches_end) = (needed_pages(&self.header), needed_sketches(&self.header));
        (
            bytemuck::cast_slice_mut(&mut self.pages.bytes_mut()[PAGES_OFFSET..pages_end]),
            bytemuck::cast_slice_mut(&mut self.sketches.bytes_mut()[SKETCHES_OFFSET..sketches_end]),
        )
    }

    /// Compute the codebook over every held row and re-encode every row with it; every page is
    /// then due a new checksum.
    fn recompute_codebook(&mut self) {
        self.codebook = Codebook::compute(self.page_slice());
        let codebook = self.codebook;
        let (pages, sketches) = self.slices_mut();
        codebook.encode_all(pages, sketches);
        self.dirty = (0..self.header.pages as u32).collect();
    }

    /// Seal the pages written since the last commit with their checksums, then write the
    /// header: the one step that makes the new rows count.
    pub(super) fn commit(&mut self) -> Result<(), ArenaError> {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for p in dirty {
            let sketch = self.sketch(p).checksum();
            self.slices_mut().0[p as usize].sketch = sketch;
            let checksum = page_checksum(self.page(p), self.entries());
            crate::failpoint::hit("arena.mid_seal");
            self.slices_mut().0[p as usize].checksum = checksum;
        }
        let codebook = self.codebook;
        if codebook.checksum != self.header.codebook_checksum {
            let slot = 1 - self.header.codebook_slot;
            self.pages.bytes_mut()[codebook_range(slot as usize)]
                .copy_from_slice(bytemuck::bytes_of(&codebook));
            self.header.codebook_slot = slot;
            self.header.codebook_checksum = codebook.checksum;
        }
        self.header.commits += 1;
        self.header.checksum = self.header.compute_checksum();
        crate::failpoint::hit("arena.mid_commit");
        in_order();
        write_header(self.pages.bytes_mut(), &self.header);
        self.terms
            .flush_async()
            .map_err(|e| io_error(&self.terms, e))?;
        self.sketches
            .flush_async()
            .map_err(|e| io_error(&self.sketches, e))?;
        self.pages
            .flush_async()
            .map_err(|e| io_error(&self.pages, e))
    }
}
