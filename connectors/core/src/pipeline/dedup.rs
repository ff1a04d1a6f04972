//! Duplicate suppression on (source, id), the key the CloudEvents spec defines, scoped per
//! ingress source by default (`pipeline.dedup.scope`).
//!
//! Bounded twice: by a time window and by a capacity (the oldest entries go first when full).
//! Keys are 128-bit XXH3 hashes of `source \xff id` (seeded with the ingress source under
//! `scope: source`), so an entry costs the same whatever the id length: about 100 bytes with the
//! map's and the expiry queue's overhead (see docs/architecture.md). An entry is "in flight"
//! until its event is settled: delivered entries stay for the window, failed ones are forgotten
//! so the sender's retry goes through.
//!
//! Persisted, the window is a ring of `capacity` slots in the state store: each delivered key
//! overwrites the slot of the key `capacity` places older, so the table never holds more rows
//! than the memory does, and loading it at start-up reads at most `capacity` rows.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
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
pub fn scoped_key(scope: u64, source: &str, id: &str) -> u128 {
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

#[derive(Clone, Copy)]
struct Entry {
    at_ms: u64,
    done: bool,
}

/// The keys are already uniform hashes: use their low bits directly.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

#[derive(Default)]
struct Shard {
    map: HashMap<u128, Entry, BuildHasherDefault<KeyHasher>>,
    /// Insertion order for expiry and eviction; may hold stale pairs of forgotten keys.
    order: VecDeque<(u64, u128)>,
}

impl Shard {
    fn expire(&mut self, now_ms: u64, window_ms: u64) {
        while let Some(&(at, key)) = self.order.front() {
            if at + window_ms > now_ms {
                break;
            }
            self.order.pop_front();
            if self.map.get(&key).is_some_and(|e| e.at_ms == at) {
                self.map.remove(&key);
            }
        }
    }

    /// Removes the oldest live entry. Returns false when the shard is empty.
    fn evict_oldest(&mut self) -> bool {
        while let Some((at, key)) = self.order.pop_front() {
            if self.map.get(&key).is_some_and(|e| e.at_ms == at) {
                self.map.remove(&key);
                return true;
            }
        }
        false
    }

    fn compact_if_stale(&mut self) {
        if self.order.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.order
                .retain(|(at, key)| map.get(key).is_some_and(|e| e.at_ms == *at));
        }
    }
}

/// Dedup settings.
#[derive(Clone, Copy, Debug)]
pub struct DedupConfig {
    pub window: Duration,
    pub capacity: usize,
    pub scope: DedupScope,
}

pub struct Dedup {
    shards: Box<[Mutex<Shard>]>,
    window_ms: u64,
    cap_per_shard: usize,
    scope: DedupScope,
    /// Delivered keys not yet written to the state store.
    unsaved: Mutex<VecDeque<(u128, u64)>>,
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
        Dedup {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            window_ms: config.window.as_millis() as u64,
            cap_per_shard: config.capacity.div_ceil(SHARDS).max(1),
            scope: config.scope,
            unsaved: Mutex::new(VecDeque::new()),
            persistent,
            ring_slots: config.capacity.max(1) as u64,
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
        self.shards[(key >> 124) as usize % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Looks `key` up and records it as in flight when it is new.
    pub fn check(&self, key: u128) -> Check {
        self.check_at(key, now_ms())
    }

    pub fn check_at(&self, key: u128, now: u64) -> Check {
        let mut shard = self.shard(key);
        shard.expire(now, self.window_ms);
        if let Some(e) = shard.map.get(&key) {
            return if e.done {
                Check::Delivered
            } else {
                Check::InFlight
            };
        }
        if shard.map.len() >= self.cap_per_shard && shard.evict_oldest() {
            self.evictions.increment(1);
        }
        shard.map.insert(
            key,
            Entry {
                at_ms: now,
                done: false,
            },
        );
        shard.order.push_back((now, key));
        Check::New
    }

    /// The event recorded at `at` (by [`Dedup::check_at`]) under `key` was delivered: keep it
    /// for the window. An entry recorded at another time (the first was evicted and a retry
    /// recorded anew) is not this event's and is left alone.
    pub fn confirm(&self, key: u128, at: u64) {
        {
            let mut shard = self.shard(key);
            match shard.map.get_mut(&key) {
                Some(e) if e.at_ms == at => e.done = true,
                _ => return,
            }
        }
        if self.persistent {
            let mut unsaved = self.unsaved.lock().unwrap_or_else(|p| p.into_inner());
            // Bounded: while the store keeps failing, the oldest unsaved keys are given up
            // (they stay in memory; only their survival across a restart is lost).
            if unsaved.len() >= self.cap_per_shard * SHARDS {
                unsaved.pop_front();
            }
            unsaved.push_back((key, at));
        }
    }

    /// The event recorded at `at` under `key` was not delivered: forget it so a retry is
    /// accepted (and, as with `confirm`, only if the entry is still this event's).
    pub fn forget(&self, key: u128, at: u64) {
        let mut shard = self.shard(key);
        if shard.map.get(&key).is_some_and(|e| e.at_ms == at) {
            shard.map.remove(&key);
        }
        shard.compact_if_stale();
    }

    /// Live entries (sampled into `sluice_dedup_entries`).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).map.len())
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
        // In the order they were recorded, as the expiry queue expects (confirm order, the
        // ring's sequence, may differ).
        rows.sort_unstable_by_key(|r| r.2);
        let mut loaded = 0;
        for (_, key, at) in rows {
            if at + self.window_ms <= now {
                continue;
            }
            let mut shard = self.shard(key);
            if shard.map.len() >= self.cap_per_shard {
                shard.evict_oldest();
            }
            shard.map.insert(
                key,
                Entry {
                    at_ms: at,
                    done: true,
                },
            );
            shard.order.push_back((at, key));
            loaded += 1;
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
            let room = (self.cap_per_shard * SHARDS).saturating_sub(unsaved.len());
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

    #[test]
    fn capacity_evicts_oldest() {
        let d = dedup(1_000_000, SHARDS); // one entry per shard
        let keys: Vec<u128> = (0..200).map(|i| dedup_key("s", &i.to_string())).collect();
        for (i, k) in keys.iter().enumerate() {
            d.check_at(*k, i as u64);
        }
        assert!(d.len() <= SHARDS, "bounded: {}", d.len());
        // The newest key is still known.
        assert_eq!(d.check_at(keys[199], 500), Check::InFlight);
    }

    #[test]
    fn stale_order_entries_are_compacted() {
        let d = dedup(1_000_000, 1_000_000);
        for i in 0..50_000u64 {
            let k = dedup_key("s", &i.to_string());
            d.check_at(k, i);
            d.forget(k, i);
        }
        assert!(d.is_empty());
        // Every entry was forgotten: compaction keeps at most its slack (1024 + 1) per shard.
        for (i, s) in d.shards.iter().enumerate() {
            let stale = s.lock().unwrap().order.len();
            assert!(
                stale <= 1025,
                "shard {i}: the order queue keeps {stale} forgotten keys"
            );
        }
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
