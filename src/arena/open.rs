//! Opening an arena: its files mapped and checked (magic, version, header, codebook, page and
//! sketch checksums, dictionary, purge count, watermark), cut back to the last commit, or
//! started empty to be rebuilt from the store.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

impl Arena {
    /// An empty arena in memory only (watermark 0: the first catch-up reads everything), for
    /// one-off scans: evaluation, benchmarks, checks.
    pub fn new() -> Self {
        let io = |e| panic!("cannot map anonymous memory for the arena: {e}");
        let mut files = ArenaFiles {
            pages: MappedFile::anonymous(PAGES_OFFSET).unwrap_or_else(io),
            sketches: MappedFile::anonymous(SKETCHES_OFFSET).unwrap_or_else(io),
            terms: MappedFile::anonymous(TERMS_HEADER_BYTES).unwrap_or_else(io),
        };
        let header = PagesHeader::empty([0; 32], 0);
        let codebook = Codebook::empty();
        files.write_heads(&header, &codebook);
        Self::with_files(files, header, codebook)
    }

    fn with_files(files: ArenaFiles, header: PagesHeader, codebook: Codebook) -> Self {
        let ArenaFiles {
            pages,
            sketches,
            terms,
        } = files;
        Self {
            pages,
            sketches,
            terms,
            header,
            codebook,
            by_user: HashMap::new(),
            rows_by_user: HashMap::new(),
            slots: Vec::new(),
            token_lens: Vec::new(),
            stats: FrequencyTable::default(),
            counted_below: RowId(0),
            dirty: Vec::new(),
        }
    }

    /// Open the arena of `dictionary` in the store's data directory, or start an empty one
    /// there when the files are missing or fail a check (the reason is returned and
    /// logged; catch-up then rebuilds it from the store). The resident statistic is the
    /// store's counts, read in one consistent step with the store's next row.
    pub fn open(store: &Store, dictionary: &Dictionary) -> Result<(Self, Opened), ArenaError> {
        if dictionary.dims() > DIMS {
            return Err(ArenaError::Dimensions {
                found: dictionary.dims(),
            });
        }
        let dir = arena_dir(store.path(), dictionary.version())?;
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ArenaError::Io { path, source }
        };
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let paths = ArenaFiles::NAMES.map(|name| dir.join(name));
        let id = dictionary_id(dictionary);
        let purges = store.purges()?;
        let (stats, counted_below) = store.counts_snapshot_in(families(store, dictionary).1)?;
        let open_all = || -> Result<ArenaFiles, ArenaError> {
            let [pages, sketches, terms] = &paths;
            Ok(ArenaFiles {
                pages: MappedFile::open(pages).map_err(io(pages))?,
                sketches: MappedFile::open(sketches).map_err(io(sketches))?,
                terms: MappedFile::open(terms).map_err(io(terms))?,
            })
        };
        let found = if paths.iter().all(|path| path.exists()) {
            Self::map_existing(open_all()?, id, purges, counted_below)
        } else {
            Err(Unusable::Missing)
        };
        let (mut arena, opened) = match found {
            Ok(arena) => {
                let rows = arena.header.rows;
                (arena, Opened::Mapped { rows })
            }
            Err(reason) => {
                if reason.is_damage() {
                    tracing::warn!(dir = %dir.display(), %reason, "arena damaged; rebuilding it from the store");
                } else if reason != Unusable::Missing {
                    tracing::info!(dir = %dir.display(), %reason, "arena stale; rebuilding it from the store");
                }
                for path in &paths {
                    match std::fs::remove_file(path) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => {
                            return Err(io(path)(e));
                        }
                        _ => {}
                    }
                }
                let mut files = open_all()?;
                let header = PagesHeader::empty(id, purges);
                let codebook = Codebook::empty();
                files.write_heads(&header, &codebook);
                (
                    Self::with_files(files, header, codebook),
                    Opened::Rebuilt { reason },
                )
            }
        };
        arena.stats = stats;
        arena.counted_below = counted_below;
        Ok((arena, opened))
    }

    /// Check mapped files and index their pages, cutting away what the header does not count:
    /// the reader of [`Arena::open`], given the files' mappings, the serving dictionary's id,
    /// the store's purge count and its next row. Public for the fuzz targets (`fuzz/`), which
    /// hand it arbitrary bytes: whatever they hold, the answer is an arena or a typed reason.
    pub fn map_existing(
        files: ArenaFiles,
        dictionary: [u8; 32],
        purges: u64,
        store_next: RowId,
    ) -> Result<Self, Unusable> {
        let ArenaFiles {
            mut pages,
            mut sketches,
            terms,
        } = files;
        let header = read_header(pages.bytes())?;
        if header.page_bytes as usize != PAGE_BYTES
            || header.dims as usize != DIMS
            || header.page_rows as usize != PAGE_ROWS
        {
            return Err(Unusable::Layout);
        }
        for (file, magic, bytes) in [
            ("terms.bin", TERMS_MAGIC, terms.bytes()),
            ("sketches.bin", SKETCHES_MAGIC, sketches.bytes()),
        ] {
            let head: FileHeader = bytemuck::pod_read_unaligned(&bytes[..TERMS_HEADER_BYTES]);
            if head.magic != magic {
                return Err(Unusable::Magic { file });
            }
            if head.format_version != FORMAT_VERSION {
                return Err(Unusable::Version {
                    file,
                    found: head.format_version,
                });
            }
        }
        if header.dictionary != dictionary {
            return Err(Unusable::Dictionary);
        }
        if header.purges != purges {
            return Err(Unusable::Purged);
        }
        if header.watermark > store_next.0 {
            return Err(Unusable::Ahead {
                watermark: header.watermark,
                next: store_next.0,
            });
        }
        let terms_needed = (header.terms as usize)
            .saturating_mul(ENTRY_BYTES)
            .saturating_add(TERMS_HEADER_BYTES);
        for (file, bytes, needed) in [
            ("pages.bin", pages.bytes().len(), needed_pages(&header)),
            (
                "sketches.bin",
                sketches.bytes().len(),
                needed_sketches(&header),
            ),
            ("terms.bin", terms.bytes().len(), terms_needed),
        ] {
            if bytes < needed {
                return Err(Unusable::Truncated {
                    file,
                    bytes,
                    needed,
                });
            }
        }
        let slot = header.codebook_slot as usize;
        if slot >= SLOTS {
            return Err(Unusable::CodebookChecksum);
        }
        let codebook: Codebook = bytemuck::pod_read_unaligned(&pages.bytes()[codebook_range(slot)]);
        if codebook.checksum != codebook.compute_checksum()
            || codebook.checksum != header.codebook_checksum
        {
            return Err(Unusable::CodebookChecksum);
        }
        // Cut rows appended after the last commit, then check every page, while a thread asks
        // for `terms.bin` in file order: the checks read each page's entries where they lie.
        let stop = AtomicBool::new(false);
        let rows = std::thread::scope(|scope| {
            scope.spawn(|| terms.read_ahead(terms_needed, &stop));
            let checked = check_pages(&header, &codebook, &mut pages, &mut sketches, &terms);
            stop.store(true, Ordering::Relaxed);
            checked
        })?;
        if rows != header.rows {
            return Err(Unusable::RowCount {
                found: rows,
                expected: header.rows,
            });
        }
        let files = ArenaFiles {
            pages,
            sketches,
            terms,
        };
        let mut arena = Self::with_files(files, header, codebook);
        arena.index_pages();
        Ok(arena)
    }

    /// Rebuild the per-user page lists and the row slots from the committed pages.
    fn index_pages(&mut self) {
        let mut by_user: HashMap<UserId, Vec<u32>> = HashMap::new();
        let mut rows_by_user: HashMap<UserId, usize> = HashMap::new();
        let mut slots = vec![Slot::NONE; self.header.watermark as usize];
        let mut token_lens = vec![NOT_HELD; self.header.watermark as usize];
        for (p, page) in self.page_slice().iter().enumerate() {
            if page.rows == 0 {
                continue;
            }
            by_user.entry(UserId(page.user)).or_default().push(p as u32);
            *rows_by_user.entry(UserId(page.user)).or_default() += page.rows as usize;
            for (i, &id) in page.row_ids[..page.rows as usize].iter().enumerate() {
                slots[id as usize] = Slot {
                    page: p as u32,
                    index: i as u32,
                };
                token_lens[id as usize] = page.token_lens[i];
            }
        }
        self.by_user = by_user;
        self.rows_by_user = rows_by_user;
        self.slots = slots;
        self.token_lens = token_lens;
    }
}

/// Cut each committed page back to the rows the header commits and check it against its sketch
/// and its rows' term entries (recoding it first where `codebook` is newer than its codes):
/// the committed rows in all, or why the files are unusable.
fn check_pages(
    header: &PagesHeader,
    codebook: &Codebook,
    pages: &mut MappedFile,
    sketches: &mut MappedFile,
    terms: &MappedFile,
) -> Result<u64, Unusable> {
    let mut rows = 0u64;
    let page_bytes = &mut pages.bytes_mut()[PAGES_OFFSET..needed_pages(header)];
    let committed: &mut [Page] = bytemuck::cast_slice_mut(page_bytes);
    let sketch_bytes = &mut sketches.bytes_mut()[SKETCHES_OFFSET..needed_sketches(header)];
    let their_sketches: &mut [Sketch] = bytemuck::cast_slice_mut(sketch_bytes);
    let entries: &[Entry] = bytemuck::cast_slice(
        &terms.bytes()[TERMS_HEADER_BYTES..][..header.terms as usize * ENTRY_BYTES],
    );
    let written = (terms.bytes().len() - TERMS_HEADER_BYTES) / ENTRY_BYTES;
    let all_entries: &[Entry] =
        bytemuck::cast_slice(&terms.bytes()[TERMS_HEADER_BYTES..][..written * ENTRY_BYTES]);
    for (p, (page, sketch)) in committed.iter_mut().zip(their_sketches).enumerate() {
        let bad = |what| Unusable::Page {
            page: p as u64,
            what,
        };
        // A page a purge emptied ([`Arena::purge_users`]): no user, no row, sealed
        // over its emptiness.
        if page.user == 0 && page.rows == 0 {
            if page.checksum != page_checksum(page, entries)
                || page.sketch != sketch.checksum()
                || sketch.rows != 0
            {
                return Err(bad("an emptied page is not empty"));
            }
            continue;
        }
        let held = (page.rows as usize).min(PAGE_ROWS);
        let kept = page.row_ids[..held]
            .iter()
            .take_while(|&&id| id < header.watermark)
            .count();
        if kept == 0 {
            return Err(bad("holds no committed row"));
        }
        if page.row_ids[..kept].windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad("row ids out of order"));
        }
        let cut = kept < held;
        // A commit stopped while the codebook was recomputed leaves the page coded
        // under a codebook the header does not name, sealed or not. Its codes are a
        // function of its vectors: coded again under the committed codebook (below), the
        // page is what was committed (unsealed) or what its newer checksum vouched for.
        let recoded = page.codebook != codebook.checksum;
        // A commit stopped between sealing this page and writing the header leaves the
        // page sealed over rows the header does not count yet; that newer checksum
        // vouches for the counted rows too, so the page is cut and sealed again. A sealed
        // page vouches for the sketch it was sealed with; one that does not match it was
        // torn, and is not sealed again below. Asked only of a page that is cut or coded
        // again: any other is checked once, as it is, below.
        let found = sketch.checksum();
        let newer_seal = (cut || recoded)
            && page.rows as usize == held
            && (0..held).all(|i| {
                page.term_offsets[i].saturating_add(page.entries_of(i) as u64) <= written as u64
            })
            && page.checksum == page_checksum(page, all_entries)
            && found == page.sketch;
        page.truncate(kept);
        sketch.truncate(kept);
        // Every kept row's entries must lie in the committed ones before anything reads
        // them (sealing the page again below does): a page sealed over entries the
        // header does not commit, with a valid checksum or not, is damage.
        for i in 0..kept {
            let end = page.term_offsets[i].saturating_add(page.entries_of(i) as u64);
            if end > header.terms {
                return Err(bad("terms past the committed entries"));
            }
        }
        if recoded {
            codebook.encode_all(std::slice::from_mut(page), std::slice::from_mut(sketch));
        }
        // The sketch changed only where rows were cut or codes made again (a slot past
        // its rows that is not zero is then damage, reported below).
        let sketch_sum = if cut || recoded {
            sketch.checksum()
        } else {
            found
        };
        // The page is now as committed but for its seal: a commit stopped between a
        // page's sketch sum and its checksum leaves the sum newer than the checksum,
        // so the committed checksum is checked against the sum of the sketch as it is.
        let sealed_sketch = std::mem::replace(&mut page.sketch, sketch_sum);
        if newer_seal {
            page.checksum = page_checksum(page, entries);
        }
        if page.checksum != page_checksum(page, entries) {
            return Err(bad(if sealed_sketch == sketch_sum {
                "checksum mismatch"
            } else {
                "sketch checksum mismatch"
            }));
        }
        // A checksum vouches only for the sketch sum it was sealed with: the sketch
        // must also name the page (its row count and first row), or stage one would read
        // another page's.
        if sketch.rows != page.rows || (kept > 0 && sketch.first_row != page.row_ids[0]) {
            return Err(bad("sketch does not name the page's rows"));
        }
        rows += kept as u64;
    }
    Ok(rows)
}
