//! The serving engine: one memory (store and dictionary), the arena generation derived under
//! it, an installed dark version's arena once built, the gate that holds writes back while an
//! operation needs the store still, and the scan kernels chosen for the process.
//!
//! Every operation on a serving memory is written here once: capture, recall, exclude, purge,
//! integrity, backup, the dictionary's install, re-derivation and flip, the storage probe and
//! the figures `/admin/stats` shows. The proxy and the command line both call it; neither opens
//! an arena or catches one up itself.
//!
//! A request takes the writes gate shared and then the serving generation ([`Engine::writing`])
//! and keeps both to its end, so it sees one dictionary version; purge, integrity and the flip
//! take the gate exclusively ([`Engine::quiet`]).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use serde::Serialize;

use crate::arena::{self, Arena, ArenaError, Opened};
use crate::backup;
use crate::capture::{Capturer, Message};
use crate::error::Error;
use crate::integrity;
use crate::memory::Memory;
use crate::recall::{Ask, Recall, RecallConfig, recall};
use crate::scan::kernels::Kernels;
use crate::store::{DarkVersion, Purged, Store, StoreError};
use crate::swap;
use crate::types::{Role, RowId, UserId, now_ms};

/// One serving dictionary version: the memory with its dictionary and the arena generation
/// derived under it. A request takes one generation at its start and uses it to its end, so it
/// sees the old version or the new one, never a mix.
pub struct Generation {
    pub memory: Memory,
    /// The arena the scan reads, caught up before every recall.
    pub arena: RwLock<Arena>,
    /// The store's next row id when [`Generation::caught_up`] last caught the arena up: every
    /// row below it that is still stored is in the arena.
    checked: AtomicU64,
    /// Held by the one request that catches the arena up; the others that find rows to catch
    /// up wait on it, not on the arena, and scans go on meanwhile.
    catching_up: Mutex<()>,
}

/// Whom a capture belongs to: the asker's user key and conversation, the store's purge epoch
/// when its request arrived (what it captures after a purge of the asker is dropped), and the
/// credential's own user when the asker is one of its sub-users (linked to it before it is
/// first written, so a purge of the credential finds it).
#[derive(Debug, Clone, Copy)]
pub struct Author<'a> {
    pub user_key: &'a str,
    pub conversation: &'a str,
    pub since: u64,
    pub owner: Option<UserId>,
}

impl Generation {
    /// Serve `memory` with `arena`, derived under its dictionary.
    fn new(memory: Memory, arena: Arena) -> Self {
        Self {
            memory,
            arena: RwLock::new(arena),
            checked: AtomicU64::new(0),
            catching_up: Mutex::new(()),
        }
    }

    /// The arena caught up with every committed row, held for reading. The arena is locked for
    /// writing only when a row was committed since the last catch-up (the store's next row id
    /// is read without a lock), and only once for any number of requests that wait on the
    /// same rows. They wait on the catch-up's own lock, not on the arena's: a request that
    /// queued for the arena's write lock would wait for every scan in flight to end and hold up
    /// every scan after it, and one that then found its rows in would have done so for nothing
    /// (at 64 streams, 2,000 requests took the write lock for 42 catch-ups;
    /// `docs/journal/benchmarks.md`, "Requests wait for a catch-up, not for the scans").
    pub fn caught_up(&self) -> Result<RwLockReadGuard<'_, Arena>, ArenaError> {
        let committed = self.memory.store.next_row().0;
        let caught = || self.checked.load(Ordering::Acquire) >= committed;
        if caught() {
            return Ok(self.arena.read());
        }
        let catching_up = self.catching_up.lock();
        if caught() {
            return Ok(self.arena.read());
        }
        let mut arena = self.arena.write();
        // Read before the log is: every row below it is committed and the catch-up sees it.
        let next = self.memory.store.next_row().0;
        arena.catch_up(&self.memory.store, &self.memory.dictionary)?;
        self.checked.fetch_max(next, Ordering::Release);
        drop(catching_up);
        Ok(RwLockWriteGuard::downgrade(arena))
    }

    /// Store `text` as one message of `role` (named `name`) in `author`'s conversation, now;
    /// the row ids of each chunk, none when the author was purged since its request arrived.
    pub fn capture(
        &self,
        author: &Author<'_>,
        role: Role,
        name: Option<String>,
        text: String,
    ) -> Result<Vec<Vec<RowId>>, Error> {
        let memory = &self.memory;
        if let Some(owner) = author.owner {
            memory
                .store
                .link_owner(UserId::from_key(author.user_key), owner)?;
        }
        Ok(Capturer::new(&memory.dictionary).capture_since(
            &memory.store,
            &[Message {
                user_key: author.user_key.to_owned(),
                conversation: author.conversation.to_owned(),
                role,
                name,
                timestamp_ms: Some(now_ms()),
                source_turn: None,
                text,
            }],
            Some(author.since),
        )?)
    }

    /// Catch the arena up and recall for `ask`.
    pub fn recall(
        &self,
        kernels: &Kernels,
        config: &RecallConfig,
        ask: &Ask<'_>,
    ) -> Result<Recall, Error> {
        let arena = self.caught_up()?;
        Ok(recall(&self.memory, &arena, kernels, config, ask)?)
    }
}

/// A request's hold on the engine: the writes gate, shared, and the serving generation taken
/// after it. Derefs to the generation.
pub struct Writing<'a> {
    _gate: RwLockReadGuard<'a, ()>,
    generation: Arc<Generation>,
}

impl std::ops::Deref for Writing<'_> {
    type Target = Generation;

    fn deref(&self) -> &Generation {
        &self.generation
    }
}

/// What `/admin/stats` shows of the serving memory.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub dictionary: String,
    pub next_row: u64,
    pub arena_rows: usize,
    pub arena_bytes: u64,
    pub arena_watermark: u64,
}

/// A dark version made ready to flip: its rows re-derived and its arena generation built.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub version: String,
    /// Rows this call re-derived (a resumed derivation counts only the rest).
    pub derived_rows: u64,
    pub derive_time: Duration,
    pub arena_rows: usize,
    pub build_time: Duration,
}

/// What a flip did.
#[derive(Debug, Clone, Serialize)]
pub struct Flipped {
    pub serving: String,
    pub retired: String,
    /// How long writes were held back, in milliseconds.
    pub flip_ms: f64,
}

/// A user's exclusions after a change: the rows it was asked to change (the ids given and the
/// conversation's), those it changed and every row now excluded, in id order.
#[derive(Debug, Clone, Default)]
pub struct Exclusions {
    pub asked: usize,
    pub changed: Vec<RowId>,
    pub excluded: Vec<RowId>,
}

/// The serving memory and everything that changes it; see the module doc.
pub struct Engine {
    /// The serving generation, swapped whole by a dictionary flip.
    serving: RwLock<Arc<Generation>>,
    /// The dark version's arena generation and the store's purge count it was built at, put
    /// here by [`Engine::prepare_dark`] once it is built and taken by the flip (which rebuilds
    /// it when a purge ran since); locked while a preparation runs.
    dark_arena: Mutex<Option<(Arena, u64)>>,
    /// Held shared by every write of a request (capture, reheat, reply) and exclusively by
    /// integrity, purge and the flip, which need the store still.
    writes: RwLock<()>,
    pub kernels: Kernels,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("memory", &self.generation().memory)
            .field("kernels", &self.kernels.describe())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Serve `memory` with `arena` (already derived under its dictionary).
    pub fn new(memory: Memory, arena: Arena, kernels: Kernels) -> Self {
        Self {
            serving: RwLock::new(Arc::new(Generation::new(memory, arena))),
            dark_arena: Mutex::new(None),
            writes: RwLock::new(()),
            kernels,
        }
    }

    /// Serve `memory` with its arena opened from the data directory (rebuilt when its files
    /// are unusable) and caught up with the store; with how it was opened and the rows caught
    /// up.
    pub fn open(memory: Memory, kernels: Kernels) -> Result<(Self, Opened, usize), Error> {
        let (mut arena, opened) = Arena::open(&memory.store, &memory.dictionary)?;
        let caught = arena.catch_up(&memory.store, &memory.dictionary)?;
        Ok((Self::new(memory, arena, kernels), opened, caught))
    }

    /// The serving generation, without the writes gate (reads only).
    pub fn generation(&self) -> Arc<Generation> {
        Arc::clone(&self.serving.read())
    }

    /// The writes gate, shared, then the serving generation: what a request holds while it
    /// captures, recalls and reheats.
    pub fn writing(&self) -> Writing<'_> {
        let gate = self.writes.read();
        Writing {
            _gate: gate,
            generation: self.generation(),
        }
    }

    /// The writes gate, exclusively: no request writes while it is held.
    fn quiet(&self) -> RwLockWriteGuard<'_, ()> {
        self.writes.write()
    }

    /// The serving memory's version, rows and arena.
    pub fn stats(&self) -> Stats {
        let generation = self.generation();
        let arena = generation.arena.read();
        Stats {
            dictionary: generation.memory.dictionary.version().to_owned(),
            next_row: generation.memory.store.next_row().0,
            arena_rows: arena.rows(),
            arena_bytes: arena.bytes(),
            arena_watermark: arena.watermark().0,
        }
    }

    /// One small write through the store's write-ahead log, then an arena catch-up (what a
    /// request's capture and recall do; the arena may have failed to grow while the store
    /// took the write).
    pub fn probe(&self) -> Result<(), Error> {
        let generation = self.writing();
        generation.memory.store.probe(now_ms())?;
        drop(generation.caught_up()?);
        Ok(())
    }

    /// Every store invariant, and the serving arena against the store, with writes held back
    /// meanwhile so the check sees one consistent state.
    pub fn integrity(&self) -> Result<integrity::Report, Error> {
        let _quiet = self.quiet();
        let generation = self.generation();
        let memory = &generation.memory;
        let mut report = integrity::check(&memory.store, &memory.dictionary)?;
        if report.is_clean() {
            let arena = generation.caught_up()?;
            integrity::check_arena(&memory.store, &arena, &mut report)?;
        }
        Ok(report)
    }

    /// Remove `user`'s memory (with `sub_users`, `user` a credential's own user, its
    /// sub-users' too), in time proportional to it. With writes held back: the store's batch
    /// for each user, then the arena's pages of those users emptied where they lie
    /// ([`Arena::purge_users`]; a dark arena's too), and `forget` handed every purged user, so
    /// what the caller keeps of them besides the memory (a cached frame, a log) goes before any
    /// request can read it again. Then, with writes going on, the store's flush and compaction
    /// of the users' ranges ([`Store::finish_purge`]), and of any purge a killed process left
    /// unfinished. A user the store knows nothing of costs two reads: nothing is held back.
    /// Returns what was removed.
    pub fn purge(
        &self,
        user: UserId,
        sub_users: bool,
        forget: impl FnOnce(&[UserId]),
    ) -> Result<Purged, Error> {
        // A user the store knows nothing of (a stranger's credential, a purge asked twice)
        // and no purge of it left unfinished: nothing to remove, so nothing is held back,
        // flushed or compacted.
        {
            let generation = self.generation();
            let store = &generation.memory.store;
            let mut touched = if sub_users {
                store.sub_users(user)?
            } else {
                Vec::new()
            };
            touched.push(user);
            let mut known = false;
            for &whom in &touched {
                known |= store.user_key(whom)?.is_some()
                    || store.rows_of(whom).next().is_some()
                    || store.purge_unfinished(whom)?;
            }
            if !known {
                forget(&touched);
                return Ok(Purged {
                    rows: 0,
                    sub_users: Vec::new(),
                });
            }
        }
        let started = std::time::Instant::now();
        let (generation, removed) = {
            let _quiet = self.quiet();
            let generation = self.generation();
            let memory = &generation.memory;
            let purges = memory.store.purges()?;
            let removed = if sub_users {
                memory.store.remove_credential(user)?
            } else {
                Purged {
                    rows: memory.store.remove_user(user)?,
                    sub_users: Vec::new(),
                }
            };
            let users = [&removed.sub_users[..], &[user]].concat();
            generation
                .arena
                .write()
                .purge_users(&users, &memory.store, &memory.dictionary)?;
            // A dark arena built and waiting for its flip loses the users where its rows lie
            // (one that missed an earlier purge is dropped: the flip builds it again); one
            // being built (locked) records the purge count it began at, and the flip builds
            // it again.
            if let Some(mut dark) = self.dark_arena.try_lock() {
                match (dark.as_mut(), memory.store.dark_dictionary()) {
                    (Some((arena, built_at)), Some(dictionary)) if *built_at == purges => {
                        arena.purge_users(&users, &memory.store, &dictionary)?;
                        *built_at = memory.store.purges()?;
                    }
                    _ => *dark = None,
                }
            }
            forget(&users);
            (generation, removed)
        };
        let held = started.elapsed();
        let store = &generation.memory.store;
        for whom in store.unfinished_purges()? {
            store.finish_purge(whom)?;
        }
        tracing::info!(
            rows = removed.rows,
            held_ms = held.as_millis() as u64,
            compacted_ms = (started.elapsed() - held).as_millis() as u64,
            "purged"
        );
        Ok(removed)
    }

    /// Exclude `rows` and every row of `conversation` from `user`'s recall (`excluded`), or
    /// include them again; rows that are not the user's are passed over.
    pub fn exclude(
        &self,
        user: UserId,
        mut rows: Vec<RowId>,
        conversation: Option<&str>,
        excluded: bool,
    ) -> Result<Exclusions, Error> {
        let generation = self.writing();
        let store = &generation.memory.store;
        if let Some(conversation) = conversation {
            for row in store.conversation_rows_newest_first(user, conversation) {
                rows.push(row?);
            }
        }
        let mut changed = store.set_excluded(user, &rows, excluded)?;
        changed.sort_unstable();
        Ok(Exclusions {
            asked: rows.len(),
            changed,
            excluded: Self::excluded(store, user)?,
        })
    }

    /// Every row `user` excludes, in id order.
    pub fn exclusions(&self, user: UserId) -> Result<Vec<RowId>, Error> {
        Self::excluded(&self.writing().memory.store, user)
    }

    fn excluded(store: &Store, user: UserId) -> Result<Vec<RowId>, Error> {
        let mut excluded: Vec<RowId> = store.exclusions(user)?.into_iter().collect();
        excluded.sort_unstable();
        Ok(excluded)
    }

    /// A consistent backup of the serving memory into the new folder `to` while captures go on
    /// ([`crate::backup`]).
    pub fn backup(&self, to: &Path) -> Result<backup::Manifest, Error> {
        let manifest = backup::backup(&self.generation().memory, to)?;
        tracing::info!(
            to = %to.display(),
            rows_below = manifest.rows_below,
            elapsed_ms = manifest.elapsed_ms,
            "backup taken"
        );
        Ok(manifest)
    }

    /// The data directory's dictionary versions and their states.
    pub fn versions(&self) -> Result<Vec<swap::Listed>, Error> {
        swap::list(&self.generation().memory.store)
    }

    /// Upload and install the dictionary in `path` dark; its version.
    pub fn install(&self, path: &Path) -> Result<String, Error> {
        let installed = swap::install(&self.generation().memory.store, path)?;
        Ok(installed.version().to_owned())
    }

    /// Re-derive the installed dark version's rows (resuming where a stopped derivation left
    /// off; `progress` after each batch) and build its arena generation, and keep it for
    /// [`Engine::flip`]. `beside_serving`: on the background pool (half the cores, lowest
    /// priority: [`swap::background_pool`]), else on every core. `Ok(None)` when no dark
    /// version is installed.
    pub fn prepare_dark(
        &self,
        beside_serving: bool,
        mut progress: impl FnMut(&DarkVersion) + Send,
    ) -> Result<Option<Prepared>, Error> {
        let mut slot = self.dark_arena.lock();
        let store = Arc::clone(&self.generation().memory.store);
        let Some(dictionary) = store.dark_dictionary() else {
            return Ok(None);
        };
        let before = store.dark()?.map_or(0, |d| d.done);
        let started = Instant::now();
        let mut work = || {
            let purges = store.purges()?;
            let derived = swap::rederive(&store, &mut progress)?;
            let derive_time = started.elapsed();
            let arena = swap::build_arena(&store, &dictionary)?;
            Ok::<_, Error>((arena, purges, derived, derive_time))
        };
        let (arena, purges, derived, derive_time) = if beside_serving {
            swap::background_pool().install(work)?
        } else {
            work()?
        };
        let prepared = Prepared {
            version: derived.version,
            derived_rows: derived.done - before,
            derive_time,
            arena_rows: arena.rows(),
            build_time: started.elapsed() - derive_time,
        };
        *slot = Some((arena, purges));
        Ok(Some(prepared))
    }

    /// Make the ready dark version `version` serve. Its arena generation is caught up first,
    /// then, with writes held back, caught up to the last capture, the store flipped, and the
    /// serving generation swapped whole; requests in flight finish on the old one.
    pub fn flip(&self, version: &str) -> Result<Flipped, Error> {
        let store = Arc::clone(&self.generation().memory.store);
        let refused = |reason: String| StoreError::Swap {
            path: store.path().to_path_buf(),
            reason,
        };
        let Some(mut slot) = self.dark_arena.try_lock() else {
            return Err(refused(format!("{version} is still being derived")).into());
        };
        let dictionary = store
            .dark_dictionary()
            .filter(|d| d.version() == version)
            .ok_or_else(|| refused(format!("{version} is not the installed dark version")))?;
        let (mut arena, mut built_at) = match slot.take() {
            Some(built) => built,
            // Not built yet: nothing prepared it (or a purge dropped what was built). Only a
            // fully derived version can be built here; otherwise its derivation is still to
            // run.
            None => match store.dark()? {
                Some(dark) if dark.is_derived() => {
                    (swap::build_arena(&store, &dictionary)?, store.purges()?)
                }
                Some(dark) => {
                    return Err(refused(format!(
                        "{version} is still being derived ({}/{} rows)",
                        dark.done, dark.total
                    ))
                    .into());
                }
                None => return Err(refused(format!("{version} is not installed")).into()),
            },
        };
        arena.catch_up(&store, &dictionary)?;
        let started = Instant::now();
        let _quiet = self.quiet();
        // A purge since the build left the purged user's rows in it: build it again from the
        // store (no purge can run now).
        if store.purges()? != built_at {
            arena::remove_version(store.path(), version)?;
            (arena, built_at) = (swap::build_arena(&store, &dictionary)?, store.purges()?);
            tracing::info!(
                version,
                built_at,
                "a purge ran during the build: rebuilt the dark arena"
            );
        }
        let retired = swap::flip(&store, &dictionary, &mut arena)?;
        *self.serving.write() = Arc::new(Generation::new(Memory { store, dictionary }, arena));
        let held = started.elapsed();
        tracing::info!(
            serving = version,
            retired,
            held_ms = held.as_secs_f64() * 1e3,
            "dictionary flipped"
        );
        Ok(Flipped {
            serving: version.to_owned(),
            retired,
            flip_ms: held.as_secs_f64() * 1e3,
        })
    }
}
