//! Duplicate suppression on (source, id), the key the CloudEvents spec defines, scoped per
//! ingress source by default (`pipeline.dedup.scope`).
//!
//! Bounded twice: by a time window and by a capacity (a full set gives up its oldest entry).
//! Keys are 128-bit XXH3 hashes of `source \xff id` (seeded with the ingress source under
//! `scope: source`), so an entry costs the same whatever the id length: 64 bytes of table per
//! key of capacity (see [`Dedup`] and docs/architecture.md). An entry is "in flight"
//! until its event is settled: delivered entries stay for the window, failed ones are forgotten
//! so the sender's retry goes through.
//!
//! Persisted, the window is a ring of `capacity` slots in the state store: each delivered key
//! overwrites the slot of the key `capacity` places older, so the table never holds more rows
//! than the memory does, and loading it at start-up reads at most `capacity` rows.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::{counter, Counter};

use crate::state::{StateError, StateStore};
use crate::telemetry::DEDUP_EVICTIONS;

const SHARDS: usize = 16;
/// The state-store table holding delivered keys: a ring of `capacity` slots (4-byte slot number
/// → 16-byte key, 8-byte ms timestamp, 8-byte sequence number).
pub const DEDUP_TABLE: &str = "dedup_ring";

/// The key of an event's identity, `(source, id)`: the same event has the same key in every
/// process (it is also the JetStream `Nats-Msg-Id`). See [`crate::Event::key`].
pub fn dedup_key(source: &str, id: &str) -> u128 {
    scoped_key(0, source, id)
}

/// The dedup key of `(source, id)` within a scope: 0 for the global scope, otherwise one per
/// ingress source. Scope 0 is [`dedup_key`].
///
/// XXH3-128 (seeded with the scope) of `source`, a `0xff` byte and `id`. Keys are persisted
/// (the dedup table in `state_dir`) and name events to JetStream, so this value must never
/// change. Short inputs, the usual ones, are hashed in one call over a copy on the stack: the
/// streaming hasher gives the same value (a test checks) at several times the cost.
pub fn scoped_key(scope: u64, source: &str, id: &str) -> u128 {
    const SHORT: usize = 240;
    let n = source.len() + 1 + id.len();
    if n <= SHORT {
        let mut buf = [0u8; SHORT];
        buf[..source.len()].copy_from_slice(source.as_bytes());
        buf[source.len()] = 0xff;
        buf[source.len() + 1..n].copy_from_slice(id.as_bytes());
        return xxhash_rust::xxh3::xxh3_128_with_seed(&buf[..n], scope);
    }
    let mut h = xxhash_rust::xxh3::Xxh3::with_seed(scope);
    h.update(source.as_bytes());
    h.update(&[0xff]);
    h.update(id.as_bytes());
    h.digest128()
}

/// The dedup scope seed of an ingress source: derived from its name, not its position, so a
/// persisted window still means the same sources after the config is reordered or grows.
/// Never 0 (the global scope).
pub fn ingress_seed(source_name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(source_name.as_bytes()) | 1
}

/// Which events share a dedup window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DedupScope {
    /// One window per ingress source (default): the same CloudEvent entering through two
    /// Sluice sources is forwarded by each, since their routes may differ.
    #[default]
    Source,
    /// One window for the whole daemon: the same CloudEvent is forwarded once, whichever
    /// source it entered through.
    Global,
}

/// What a lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Not seen in the window: it is now recorded as in flight.
    New,
    /// Seen and delivered: answer success, forward nothing.
    Delivered,
    /// Seen and still being delivered: answer "retry later", forward nothing.
    InFlight,
}

/// Slots per set: a key lives in one set, found by comparing eight tags.
const WAYS: usize = 8;
/// Slots per unit of `capacity`: four, so a set overflows (and gives up an entry younger than
/// `capacity` newer keys) only rarely: at full rate about one key in a thousand, below it
/// almost never (see [`Dedup`]).
const SLOTS_PER_KEY: usize = 4;

/// One set: the tags in the first cache line, their stamps in the second (128-byte aligned, so
/// the pair is one adjacent-line fetch). A tag of 0 is an empty slot; a stamp is
/// `recorded_at_ms << 1 | delivered`.
#[derive(Clone, Copy, Default)]
#[repr(C, align(128))]
struct Set {
    tags: [u64; WAYS],
    stamps: [u64; WAYS],
}

/// The slot of `tag` in a set: its position and stamp.
fn find(set: &Set, tag: u64) -> Option<(usize, u64)> {
    set.tags
        .iter()
        .position(|&t| t == tag)
        .map(|i| (i, set.stamps[i]))
}

/// A set-associative table of keys: no per-key allocation, and an entry that expires or is
/// pushed out is never touched again until its slot is reused. The previous design (a hash
/// map plus an insertion-order queue) paid two cache misses per new key to evict the oldest
/// one; here a check is one set (two adjacent cache lines).
struct Shard {
    sets: Box<[Set]>,
}

/// Sets per shard the entries gauge reads at most (see [`Dedup::len`]).
const GAUGE_SETS: usize = 512;

impl Shard {
    fn new(sets: usize) -> Self {
        Shard {
            sets: vec![Set::default(); sets.max(1)].into_boxed_slice(),
        }
    }

    /// The set of `key` and its tag. The set comes from the low 64 bits (Lemire's
    /// multiply-shift range reduction: no power-of-two rounding of the table), the tag from the
    /// high 64 bits, never 0.
    fn locate(&mut self, key: u128) -> (&mut Set, u64) {
        let idx = set_index(key, self.sets.len());
        (&mut self.sets[idx], (key >> 64) as u64 | 1)
    }
}

/// The shard of `key`: its top four bits.
fn shard_of(key: u128) -> usize {
    (key >> 124) as usize % SHARDS
}

/// The set of `key` among `n` (Lemire's multiply-shift on the low 64 bits).
fn set_index(key: u128, n: usize) -> usize {
    ((key as u64 as u128 * n as u128) >> 64) as usize
}

/// Dedup settings.
#[derive(Clone, Copy, Debug)]
pub struct DedupConfig {
    pub window: Duration,
    pub capacity: usize,
    pub scope: DedupScope,
}

/// The dedup window.
///
/// Sized by `capacity`: the table has [`SLOTS_PER_KEY`] slots per key of capacity, in sets of
/// [`WAYS`]. A new key takes a free slot of its set (empty, forgotten or past the window);
/// with none, it takes the oldest entry's slot (`sluice_dedup_evictions_total`). So every key
/// stays for the window unless its set fills, which needs more than `WAYS` live keys in one
/// set: with up to `capacity` keys in the window (two per set on average), about one set in
/// four thousand. Past that rate the table keeps the newest keys of each set: a key
/// outlives at least `capacity` newer keys with a probability of about 0.999.
pub struct Dedup {
    shards: Box<[Mutex<Shard>]>,
    /// Where each shard's sets are (address, count), for [`Dedup::prefetch`] without the
    /// lock. A shard's table is allocated once and never moves or resizes.
    tables: Box<[(usize, usize)]>,
    window_ms: u64,
    scope: DedupScope,
    /// Delivered keys not yet written to the state store.
    unsaved: Mutex<VecDeque<(u128, u64)>>,
    unsaved_max: usize,
    persistent: bool,
    /// Slots in the persisted ring, and the sequence number of the next write.
    ring_slots: u64,
    ring_next: Mutex<u64>,
    evictions: Counter,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Dedup {
    pub fn new(config: DedupConfig, persistent: bool) -> Self {
        let capacity = config.capacity.max(1);
        let sets_per_shard = (capacity * SLOTS_PER_KEY).div_ceil(WAYS * SHARDS);
        let shards: Box<[Mutex<Shard>]> = (0..SHARDS)
            .map(|_| Mutex::new(Shard::new(sets_per_shard)))
            .collect();
        let tables = shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|p| p.into_inner());
                (s.sets.as_ptr() as usize, s.sets.len())
            })
            .collect();
        Dedup {
            shards,
            tables,
            window_ms: config.window.as_millis() as u64,
            scope: config.scope,
            unsaved: Mutex::new(VecDeque::new()),
            unsaved_max: capacity,
            persistent,
            ring_slots: capacity as u64,
            ring_next: Mutex::new(0),
            evictions: counter!(DEDUP_EVICTIONS),
        }
    }

    /// The key of `(source, id)` arriving through the ingress source whose [`ingress_seed`] is
    /// `seed`.
    pub fn key(&self, seed: u64, source: &str, id: &str) -> u128 {
        match self.scope {
            DedupScope::Global => dedup_key(source, id),
            DedupScope::Source => scoped_key(seed, source, id),
        }
    }

    fn shard(&self, key: u128) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[shard_of(key)]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the CPU to start loading the set of `key`, so that a check of it soon after does
    /// not wait for memory. A sender calls it for each event of a batch a few events before
    /// checking it: the table is larger than the caches, and a check that misses them stalls
    /// for the whole load (most of a check's time, measured with perf). No effect on the table.
    #[inline]
    pub fn prefetch(&self, key: u128) {
        let (base, n) = self.tables[shard_of(key)];
        // Always inside the shard's table; the set is two adjacent lines.
        let at = (base + set_index(key, n) * std::mem::size_of::<Set>()) as *const u8;
        crate::hint::prefetch(at);
        crate::hint::prefetch(at.wrapping_add(64));
    }

    /// Looks `key` up and records it as in flight when it is new.
    pub fn check(&self, key: u128) -> Check {
        self.check_at(key, now_ms())
    }

    pub fn check_at(&self, key: u128, now: u64) -> Check {
        self.record(key, now, false)
    }

    /// Looks `key` up at `now`; when it is not live, records it (in flight, or delivered when
    /// loading) at `now` and returns [`Check::New`].
    fn record(&self, key: u128, now: u64, delivered: bool) -> Check {
        let window = self.window_ms;
        let live = |stamp: u64| (stamp >> 1).saturating_add(window) > now;
        let mut shard = self.shard(key);
        let (set, tag) = shard.locate(key);
        let slot = match find(set, tag) {
            // Loading: a later delivery of the same key (rows come oldest first) moves it on.
            Some((i, stamp)) if live(stamp) && delivered => {
                set.stamps[i] = now << 1 | 1;
                return Check::Delivered;
            }
            Some((_, stamp)) if live(stamp) => {
                return if stamp & 1 == 1 {
                    Check::Delivered
                } else {
                    Check::InFlight
                };
            }
            // Its own slot, past the window: reused, so a tag is never in a set twice.
            Some((i, _)) => i,
            None => {
                // A free slot, else the oldest entry's.
                let mut oldest = (0, u64::MAX);
                let mut free = None;
                for i in 0..WAYS {
                    let stamp = set.stamps[i];
                    if set.tags[i] == 0 || !live(stamp) {
                        free = Some(i);
                        break;
                    }
                    if stamp < oldest.1 {
                        oldest = (i, stamp);
                    }
                }
                free.unwrap_or_else(|| {
                    self.evictions.increment(1);
                    oldest.0
                })
            }
        };
        set.tags[slot] = tag;
        set.stamps[slot] = now << 1 | u64::from(delivered);
        Check::New
    }

    /// The event recorded at `at` (by [`Dedup::check_at`]) under `key` was delivered: keep it
    /// for the window. An entry recorded at another time (the first was evicted and a retry
    /// recorded anew) is not this event's and is left alone.
    pub fn confirm(&self, key: u128, at: u64) {
        {
            let mut shard = self.shard(key);
            let (set, tag) = shard.locate(key);
            match find(set, tag) {
                Some((i, stamp)) if stamp >> 1 == at => set.stamps[i] = stamp | 1,
                _ => return,
            }
        }
        if self.persistent {
            let mut unsaved = self.unsaved.lock().unwrap_or_else(|p| p.into_inner());
            // Bounded: while the store keeps failing, the oldest unsaved keys are given up
            // (they stay in memory; only their survival across a restart is lost).
            if unsaved.len() >= self.unsaved_max {
                unsaved.pop_front();
            }
            unsaved.push_back((key, at));
        }
    }

    /// The event recorded at `at` under `key` was not delivered: forget it so a retry is
    /// accepted (and, as with `confirm`, only if the entry is still this event's).
    pub fn forget(&self, key: u128, at: u64) {
        let mut shard = self.shard(key);
        let (set, tag) = shard.locate(key);
        if let Some((i, stamp)) = find(set, tag) {
            if stamp >> 1 == at {
                set.tags[i] = 0;
            }
        }
    }

    /// Live entries, for the `sluice_dedup_entries` gauge (sampled every second): counted in
    /// every set of a small table; in a large one estimated from [`GAUGE_SETS`] evenly spaced
    /// sets per shard (keys spread uniformly over the sets), so a sample neither walks a large
    /// table (6.4 MB at the default capacity) nor holds a shard's lock for long.
    pub fn len(&self) -> usize {
        self.len_sampled(now_ms(), GAUGE_SETS)
    }

    /// Live entries, counted in every set.
    #[cfg(test)]
    fn len_at(&self, now: u64) -> usize {
        self.len_sampled(now, usize::MAX)
    }

    fn len_sampled(&self, now: u64, max_sets: usize) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|p| p.into_inner());
                let n = s.sets.len();
                let step = if n <= max_sets { 1 } else { n / max_sets };
                let (mut sampled, mut live) = (0usize, 0usize);
                for set in s.sets.iter().step_by(step) {
                    sampled += 1;
                    live += set
                        .tags
                        .iter()
                        .zip(&set.stamps)
                        .filter(|(&t, &st)| {
                            t != 0 && (st >> 1).saturating_add(self.window_ms) > now
                        })
                        .count();
                }
                if sampled == n {
                    live
                } else {
                    (live as u128 * n as u128 / sampled as u128) as usize
                }
            })
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Loads delivered keys younger than the window from `store`: at most `capacity` of them
    /// (the rows of the ring; rows past it, left by a larger capacity before, are skipped).
    pub fn load(&self, store: &dyn StateStore) -> Result<usize, StateError> {
        let now = now_ms();
        let mut rows = Vec::new();
        let slots = self.ring_slots;
        store.scan(DEDUP_TABLE, &mut |slot, v| {
            // Slots past the ring (a smaller dedup_capacity than before) are never read again.
            let in_ring =
                <[u8; 4]>::try_from(slot).is_ok_and(|s| u64::from(u32::from_be_bytes(s)) < slots);
            if in_ring && v.len() == 32 {
                let key = u128::from_be_bytes(v[..16].try_into().unwrap());
                let at = u64::from_be_bytes(v[16..24].try_into().unwrap());
                let seq = u64::from_be_bytes(v[24..].try_into().unwrap());
                rows.push((seq, key, at));
            }
        })?;
        *self.ring_next.lock().unwrap_or_else(|p| p.into_inner()) =
            rows.iter().map(|r| r.0 + 1).max().unwrap_or(0);
        // In the order they were recorded (confirm order, the ring's sequence, may differ), so
        // that a full set keeps the newest.
        rows.sort_unstable_by_key(|r| r.2);
        let mut loaded = 0;
        for (_, key, at) in rows {
            if at + self.window_ms <= now {
                continue;
            }
            if self.record(key, at, true) == Check::New {
                loaded += 1;
            }
        }
        Ok(loaded)
    }

    /// Writes the delivered keys not yet saved into the ring (each overwrites the slot of the
    /// key `capacity` writes older). Returns keys written.
    pub fn flush(&self, store: &dyn StateStore) -> Result<usize, StateError> {
        let batch = std::mem::take(&mut *self.unsaved.lock().unwrap_or_else(|p| p.into_inner()));
        if batch.is_empty() {
            return Ok(0);
        }
        let mut next = self.ring_next.lock().unwrap_or_else(|p| p.into_inner());
        // Only the newest `ring_slots` of a large batch can survive in the ring anyway.
        let skip = batch.len().saturating_sub(self.ring_slots as usize);
        let encoded: Vec<([u8; 4], [u8; 32])> = batch
            .iter()
            .skip(skip)
            .enumerate()
            .map(|(i, (k, at))| {
                let seq = *next + i as u64;
                let mut v = [0u8; 32];
                v[..16].copy_from_slice(&k.to_be_bytes());
                v[16..24].copy_from_slice(&at.to_be_bytes());
                v[24..].copy_from_slice(&seq.to_be_bytes());
                (((seq % self.ring_slots) as u32).to_be_bytes(), v)
            })
            .collect();
        let puts: Vec<(&[u8], &[u8])> = encoded.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        if let Err(e) = store.write(DEDUP_TABLE, &puts, &[]) {
            // Put the batch back so the next flush retries it, within the same bound.
            let mut unsaved = self.unsaved.lock().unwrap_or_else(|p| p.into_inner());
            let room = self.unsaved_max.saturating_sub(unsaved.len());
            let keep = batch.len().min(room);
            for item in batch.iter().rev().take(keep) {
                unsaved.push_front(*item);
            }
            return Err(e);
        }
        *next += encoded.len() as u64;
        Ok(batch.len())
    }

    /// Flushes every 250 ms until `shutdown`, then once more.
    pub async fn persist_until(
        self: Arc<Self>,
        store: Arc<dyn StateStore>,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => break,
            }
            let (this, store) = (self.clone(), store.clone());
            let res = tokio::task::spawn_blocking(move || this.flush(&*store)).await;
            if let Ok(Err(e)) = res {
                tracing::warn!(error = %e, "dedup: could not save the window to state_dir; will retry");
            }
        }
        if let Err(e) = self.flush(&*store) {
            tracing::error!(error = %e, "dedup: final save of the window failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::MemoryStateStore;

    #[test]
    fn a_prefetch_addresses_the_set_a_check_locks_and_changes_nothing() {
        let d = dedup(10_000, 1_000);
        // The table's first and last sets, and keys as senders make them.
        let mut keys = vec![0u128, u128::MAX];
        keys.extend((0..6).map(|i| scoped_key(7, "/src", &i.to_string())));
        for &key in &keys {
            // The address computed without the lock is the one `locate` takes under it.
            let (base, n) = d.tables[shard_of(key)];
            let mut shard = d.shard(key);
            let set = shard.locate(key).0 as *const Set as usize;
            drop(shard);
            assert_eq!(set, base + set_index(key, n) * std::mem::size_of::<Set>());
            d.prefetch(key);
        }
        // Nothing was recorded by the prefetches.
        assert_eq!(d.len_at(1), 0);
        for &key in &keys {
            assert_eq!(d.check_at(key, 1), Check::New);
            d.prefetch(key);
            assert_eq!(d.check_at(key, 2), Check::InFlight);
        }
    }

    fn dedup(window_ms: u64, capacity: usize) -> Dedup {
        Dedup::new(
            DedupConfig {
                window: Duration::from_millis(window_ms),
                capacity,
                scope: DedupScope::Source,
            },
            true,
        )
    }

    #[test]
    fn key_separates_source_and_id() {
        assert_ne!(dedup_key("ab", "c"), dedup_key("a", "bc"));
        // The one-call path for short input gives the streaming hasher's value, at every length
        // around its bound.
        for len in [
            0usize, 1, 16, 17, 128, 129, 200, 238, 239, 240, 241, 300, 5000,
        ] {
            let id = "x".repeat(len);
            let mut h = xxhash_rust::xxh3::Xxh3::with_seed(9);
            h.update(b"/src");
            h.update(&[0xff]);
            h.update(id.as_bytes());
            assert_eq!(
                scoped_key(9, "/src", &id),
                h.digest128(),
                "id of {len} bytes"
            );
        }
        // Pinned: the reference C library (Python's `xxhash`, `xxh3_128_intdigest`) over the
        // same bytes.
        assert_eq!(
            dedup_key(
                "https://github.com/octo/hello",
                "72d3162e-cc78-11e3-81ab-4c9367dc0958"
            ),
            0x6e211de80881f80b6bf1275ab659ee47
        );
        assert_eq!(
            scoped_key(9, "/src", &"x".repeat(300)),
            0x95aea3f46ed76f221d22112a73e58509
        );
        assert_eq!(dedup_key("a", "b"), dedup_key("a", "b"));
    }

    #[test]
    fn in_flight_then_delivered_then_expired() {
        let d = dedup(1000, 100);
        let k = dedup_key("s", "1");
        assert_eq!(d.check_at(k, 0), Check::New);
        assert_eq!(d.check_at(k, 10), Check::InFlight);
        d.confirm(k, 0);
        assert_eq!(d.check_at(k, 999), Check::Delivered);
        assert_eq!(d.check_at(k, 1000), Check::New, "window over");
    }

    #[test]
    fn forgotten_keys_are_new_again() {
        let d = dedup(1000, 100);
        let k = dedup_key("s", "1");
        assert_eq!(d.check_at(k, 0), Check::New);
        d.forget(k, 0);
        assert_eq!(d.check_at(k, 1), Check::New);
    }

    #[test]
    fn an_old_event_does_not_settle_a_newer_entry() {
        let d = dedup(1_000_000, SHARDS); // one entry per shard
        let k = dedup_key("s", "retry");
        assert_eq!(d.check_at(k, 0), Check::New);
        // Pushed out by newer keys in its shard, then recorded again by a retry.
        let mut i = 0;
        while d.check_at(k, 5) != Check::New {
            let other = loop {
                i += 1;
                let o = dedup_key("s", &i.to_string());
                if (o >> 124) == (k >> 124) {
                    break o;
                }
            };
            d.check_at(other, 1);
        }
        // The first attempt's late failure must not forget the retry's entry.
        d.forget(k, 0);
        assert_eq!(d.check_at(k, 6), Check::InFlight);
        d.confirm(k, 0);
        assert_eq!(d.check_at(k, 7), Check::InFlight, "nor confirm it");
        d.confirm(k, 5);
        assert_eq!(d.check_at(k, 8), Check::Delivered);
    }

    /// A key of the same shard and set as `k`, the `n`-th found.
    fn neighbour(d: &Dedup, k: u128, n: usize) -> u128 {
        let set = |d: &Dedup, key: u128| {
            let mut shard = d.shard(key);
            let (set, _) = shard.locate(key);
            set as *const Set as usize
        };
        let target = set(d, k);
        (0..)
            .map(|i| dedup_key("neighbour", &i.to_string()))
            .filter(|&o| o != k && (o >> 124) == (k >> 124) && set(d, o) == target)
            .nth(n)
            .unwrap()
    }

    #[test]
    fn a_full_set_gives_up_its_oldest_entry() {
        let d = dedup(1_000_000, 1000);
        let first = dedup_key("s", "first");
        assert_eq!(d.check_at(first, 10), Check::New);
        d.confirm(first, 10);
        // Seven newer keys fill the set; the first is still known.
        let others: Vec<u128> = (0..WAYS).map(|n| neighbour(&d, first, n)).collect();
        for (t, k) in others.iter().take(WAYS - 1).enumerate() {
            assert_eq!(d.check_at(*k, 20 + t as u64), Check::New);
        }
        assert_eq!(d.check_at(first, 100), Check::Delivered);
        // An eighth newer key takes the oldest slot: the first's.
        assert_eq!(d.check_at(others[WAYS - 1], 50), Check::New);
        assert_eq!(
            d.check_at(first, 101),
            Check::New,
            "evicted, recorded again"
        );
        // ... which pushed out the next oldest, the second key.
        assert_eq!(d.check_at(others[0], 102), Check::New);
        for k in &others[2..] {
            assert_eq!(d.check_at(*k, 103), Check::InFlight);
        }
    }

    #[test]
    fn memory_is_bounded_by_capacity() {
        let d = dedup(1_000_000, 1000);
        for i in 0..100_000u64 {
            d.check_at(dedup_key("s", &i.to_string()), i);
        }
        let live = d.len_at(100_000);
        // The slots: four per key of capacity, rounded up to whole sets per shard.
        assert!(
            live <= 1000 * SLOTS_PER_KEY + WAYS * SHARDS,
            "bounded: {live}"
        );
        assert!(live >= 1000, "at least capacity kept: {live}");
        // The newest 1000 keys are all still known (a set overflows far less often than this).
        for i in 99_000..100_000u64 {
            assert_eq!(
                d.check_at(dedup_key("s", &i.to_string()), 200_000),
                Check::InFlight,
                "key {i}"
            );
        }
    }

    #[test]
    fn the_gauge_estimates_a_large_table_from_a_sample() {
        // 100 000 keys of capacity: 3 125 sets per shard, of which the gauge reads 521.
        let d = dedup(1_000_000, 100_000);
        for (n, at) in [(0u64, 1u64), (30_000, 2), (80_000, 3)] {
            for i in 0..n {
                d.check_at(dedup_key("s", &format!("{at}-{i}")), at);
            }
            let exact = d.len_at(10);
            let estimate = d.len_sampled(10, GAUGE_SETS);
            let total: u64 = [(0u64, 1u64), (30_000, 2), (80_000, 3)]
                .iter()
                .take_while(|(_, a)| *a <= at)
                .map(|(k, _)| k)
                .sum();
            assert!(
                exact as u64 <= total && exact as u64 >= total * 99 / 100,
                "{exact} of {total}"
            );
            let off = (estimate as f64 - exact as f64).abs();
            assert!(
                off <= exact as f64 * 0.1,
                "estimate {estimate}, exact {exact}"
            );
        }
        // Past the window nothing is live, sampled or not.
        assert_eq!(d.len_sampled(10_000_000, GAUGE_SETS), 0);
    }

    #[test]
    fn forgotten_and_expired_slots_are_reused_without_evicting() {
        let before = metrics_evictions(|| {
            let d = dedup(1000, 100);
            for i in 0..50_000u64 {
                let k = dedup_key("s", &i.to_string());
                assert_eq!(d.check_at(k, i), Check::New);
                d.forget(k, i);
            }
            assert_eq!(d.len_at(50_000), 0);
            // Past the window every slot is free again: 50 000 keys over 50 s, 10 per window.
            for i in 0..50_000u64 {
                let k = dedup_key("t", &i.to_string());
                assert_eq!(d.check_at(k, 100_000 + i * 100), Check::New);
                d.confirm(k, 100_000 + i * 100);
            }
        });
        assert_eq!(before, 0, "no live entry was evicted");
    }

    /// The evictions counted while `f` runs (a local metrics recorder).
    fn metrics_evictions(f: impl FnOnce()) -> u64 {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, f);
        let text = handle.render();
        let line = text
            .lines()
            .find(|l| l.starts_with(DEDUP_EVICTIONS))
            .expect("the evictions counter is registered");
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn survives_a_restart_through_the_store() {
        let store = MemoryStateStore::default();
        let a = dedup(600_000, 1000);
        let k = dedup_key("s", "1");
        let k2 = dedup_key("s", "2");
        let now = now_ms();
        assert_eq!(a.check_at(k, now), Check::New);
        assert_eq!(a.check_at(k2, now), Check::New);
        a.confirm(k, now);
        a.forget(k2, now);
        assert_eq!(a.flush(&store).unwrap(), 1);
        let b = dedup(600_000, 1000);
        assert_eq!(b.load(&store).unwrap(), 1);
        assert_eq!(b.check(k), Check::Delivered);
        assert_eq!(b.check(k2), Check::New);
    }

    fn rows(store: &MemoryStateStore) -> usize {
        let mut n = 0;
        store.scan(DEDUP_TABLE, &mut |_, _| n += 1).unwrap();
        n
    }

    #[test]
    fn the_persisted_window_is_bounded_by_capacity_and_keeps_the_newest() {
        let store = MemoryStateStore::default();
        let a = dedup(600_000, 100);
        let now = now_ms();
        let keys: Vec<u128> = (0..1000).map(|i| dedup_key("s", &i.to_string())).collect();
        for (i, k) in keys.iter().enumerate() {
            let at = now + i as u64;
            assert_eq!(a.check_at(*k, at), Check::New);
            a.confirm(*k, at);
            if i % 64 == 0 {
                a.flush(&store).unwrap();
            }
        }
        a.flush(&store).unwrap();
        assert_eq!(rows(&store), 100, "the table holds at most capacity rows");
        // A restart loads the newest 100 (a second restart, appending, keeps the ring order).
        let b = dedup(600_000, 100);
        assert_eq!(b.load(&store).unwrap(), 100);
        assert_eq!(b.check_at(keys[999], now + 2000), Check::Delivered);
        assert_eq!(b.check_at(keys[900], now + 2000), Check::Delivered);
        assert_eq!(b.check_at(keys[899], now + 2000), Check::New);
        let k = dedup_key("s", "after-restart");
        b.check_at(k, now + 2001);
        b.confirm(k, now + 2001);
        b.flush(&store).unwrap();
        assert_eq!(rows(&store), 100);
        let c = dedup(600_000, 100);
        assert_eq!(c.load(&store).unwrap(), 100);
        assert_eq!(c.check_at(k, now + 2002), Check::Delivered);
        assert_eq!(c.check_at(keys[900], now + 2002), Check::New, "overwritten");
    }

    #[test]
    fn scope_source_separates_ingress_sources_and_global_does_not() {
        let by_source = dedup(1000, 100);
        let (a, b) = (ingress_seed("a"), ingress_seed("b"));
        assert_ne!(by_source.key(a, "s", "1"), by_source.key(b, "s", "1"));
        assert_eq!(by_source.key(a, "s", "1"), by_source.key(a, "s", "1"));
        let global = Dedup::new(
            DedupConfig {
                window: Duration::from_secs(1),
                capacity: 100,
                scope: DedupScope::Global,
            },
            false,
        );
        assert_eq!(global.key(a, "s", "1"), global.key(b, "s", "1"));
        assert_eq!(global.key(a, "s", "1"), dedup_key("s", "1"));
    }
}
