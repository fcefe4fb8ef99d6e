//! The users of a file split over shards by a jump consistent hash, and the questions asked of
//! each shard's own memory (one shard: the pooled replay).

use super::*;

/// The bucket of 64-bit `key` among `buckets` by jump consistent hash: a seeded linear
/// congruential walk over the bucket counts at which the key would move, stopping past
/// `buckets`. Stable (the same key, the same bucket, on every machine and run) and monotone:
/// going from `n` to `n + 1` buckets moves a key only into the new bucket, about `1 / (n + 1)`
/// of the keys. `buckets` is at least 1.
pub fn jump_hash(mut key: u64, buckets: usize) -> usize {
    let (mut bucket, mut next) = (0_i64, 0_i64);
    while next < buckets as i64 {
        bucket = next;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        next = ((bucket + 1) as f64 * ((1_i64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    bucket as usize
}

/// The shard (from 0) of the user named `key` among `shards`: [`jump_hash`] of its user id
/// ([`UserId::from_key`], the first 8 bytes of a SHA-256 of the key), the stable assignment
/// a load balancer over `shards` nodes would make. `shards` is at least 1.
pub fn shard_of(key: &str, shards: usize) -> usize {
    jump_hash(UserId::from_key(key).0, shards)
}

/// What the memories of a run left: the answers (in the order asked), each user's stored
/// turns, the rows held, the ingest (`None` when nothing was captured) and, per shard, its
/// users and size.
pub(super) struct Asked {
    pub answers: Vec<Answers>,
    pub stored_turns: HashSet<(UserId, String)>,
    pub rows: usize,
    pub ingested: Option<IngestSummary>,
    pub per_shard: Vec<Shard>,
}

/// Ask `asked` (indexes into the file's questions) of the memories holding `shards` (each
/// shard's users, in file order), one shard after the other, each question of its user's
/// shard: the shard's users' messages replayed into its own store, arena and statistic, in
/// the file's order. `memory` holds the first shard; every other one that has users is a
/// fresh scratch store, removed once asked. With `reused`, nothing is captured (one shard
/// only); with `agent_session`, the agent session's tool rows of the shard's users are
/// captured before its first question. With one shard this is the pooled replay. Answers
/// come back in the order of `asked`.
#[allow(clippy::too_many_arguments)]
pub(super) fn ask_shards(
    memory: &Memory,
    kernels: &Kernels,
    recall_config: &RecallConfig,
    dataset: &Dataset,
    shards: &[Vec<&str>],
    (asked, depth): (&[usize], usize),
    (reused, agent_session): (bool, bool),
    progress: &mut impl FnMut(&Progress),
) -> Result<Asked, EvalError> {
    let runs = user_runs(&dataset.messages);
    let mut answers: HashMap<usize, Answers> = HashMap::with_capacity(asked.len());
    let mut done = Asked {
        answers: Vec::with_capacity(asked.len()),
        stored_turns: HashSet::new(),
        rows: 0,
        ingested: None,
        per_shard: Vec::with_capacity(shards.len()),
    };
    for (s, users) in shards.iter().enumerate() {
        let of_shard: Vec<usize> = asked
            .iter()
            .copied()
            .filter(|&q| users.contains(&dataset.questions[q].user_key.as_str()))
            .collect();
        let mut shard = Shard {
            users: users.iter().map(|&u| u.to_owned()).collect(),
            rows: 0,
            asked: of_shard.len(),
        };
        if shards.len() > 1 {
            progress(&Progress::Shard {
                shard: s,
                total: shards.len(),
                users: users.len(),
            });
        }
        if users.is_empty() {
            done.per_shard.push(shard);
            continue;
        }
        // Declared before the memory that opens it, so the store is closed before the
        // folder is removed.
        let scratch;
        let opened;
        let shard_memory = if s == 0 {
            memory
        } else {
            scratch = ScratchDir::new(&format!("shard-{s}"))?;
            let store = Store::open(scratch.path(), &StoreOptions::default())?;
            store.bind_dictionary(memory.dictionary.version())?;
            opened = Memory {
                store: std::sync::Arc::new(store),
                dictionary: std::sync::Arc::clone(&memory.dictionary),
            };
            &opened
        };
        let mut ranges: Vec<std::ops::Range<usize>> = if reused {
            Vec::new()
        } else {
            users
                .iter()
                .flat_map(|u| runs.get(u).into_iter().flatten().cloned())
                .collect()
        };
        ranges.sort_by_key(|range| range.start);
        // Adjacent runs merged: one shard holding every user replays the file in one range.
        let ranges = ranges.into_iter().fold(
            Vec::new(),
            |mut merged: Vec<std::ops::Range<usize>>, range| {
                match merged.last_mut() {
                    Some(last) if last.end == range.start => last.end = range.end,
                    _ => merged.push(range),
                }
                merged
            },
        );
        let history = History {
            all: &dataset.messages,
            ranges,
            before_questions: if agent_session && !reused {
                self::agent_session(users)
            } else {
                Vec::new()
            },
        };
        let replayed = replay(
            &shard_memory.store,
            &shard_memory.dictionary,
            kernels,
            Some((shard_memory, recall_config)),
            history,
            (&dataset.questions, &of_shard),
            depth,
            progress,
        )?;
        answers.extend(of_shard.into_iter().zip(replayed.answers));
        done.stored_turns.extend(replayed.corpus.stored_turns);
        shard.rows = replayed.arena.rows();
        done.rows += shard.rows;
        if let Some(summary) = replayed.ingested {
            done.ingested = Some(done.ingested.unwrap_or_default().plus(&summary));
        }
        done.per_shard.push(shard);
    }
    done.answers = asked
        .iter()
        .map(|q| {
            answers
                .remove(q)
                .expect("every asked question's user is in a shard")
        })
        .collect();
    Ok(done)
}
