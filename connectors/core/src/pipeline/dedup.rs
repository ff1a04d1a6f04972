//! Duplicate suppression on (source, id), the key the CloudEvents spec defines.
//!
//! Bounded twice: by a time window and by a capacity (the oldest entries go first when full).
//! Keys are 128-bit XXH3 hashes of `source \xff id`, so an entry costs the same whatever the id
//! length: about 100 bytes with the map's and the expiry queue's overhead (see
//! docs/architecture.md). An entry is "in flight" until its event is settled: delivered entries
//! stay for the window, failed ones are forgotten so the sender's retry goes through.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::{counter, Counter};

use crate::state::{StateError, StateStore};
use crate::telemetry::DEDUP_EVICTIONS;

const SHARDS: usize = 16;
/// The state-store table holding delivered keys (16-byte key → 8-byte ms timestamp).
pub const DEDUP_TABLE: &str = "dedup";

/// The dedup key of an event.
pub fn dedup_key(source: &str, id: &str) -> u128 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(source.as_bytes());
    h.update(&[0xff]);
    h.update(id.as_bytes());
    h.digest128()
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
}

pub struct Dedup {
    shards: Box<[Mutex<Shard>]>,
    window_ms: u64,
    cap_per_shard: usize,
    /// Delivered keys not yet written to the state store.
    unsaved: Mutex<VecDeque<(u128, u64)>>,
    persistent: bool,
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
            unsaved: Mutex::new(VecDeque::new()),
            persistent,
            evictions: counter!(DEDUP_EVICTIONS),
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

    /// Loads delivered keys younger than the window from `store`.
    pub fn load(&self, store: &dyn StateStore) -> Result<usize, StateError> {
        let now = now_ms();
        let mut rows = Vec::new();
        store.scan(DEDUP_TABLE, &mut |k, v| {
            if let (Ok(k), Ok(v)) = (<[u8; 16]>::try_from(k), <[u8; 8]>::try_from(v)) {
                rows.push((u128::from_be_bytes(k), u64::from_be_bytes(v)));
            }
        })?;
        rows.sort_by_key(|r| r.1);
        let mut loaded = 0;
        for (key, at) in rows {
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

    /// Writes delivered keys to `store` and deletes the expired ones. Returns keys written.
    pub fn flush(&self, store: &dyn StateStore, purge_expired: bool) -> Result<usize, StateError> {
        let batch = std::mem::take(&mut *self.unsaved.lock().unwrap_or_else(|p| p.into_inner()));
        let mut expired = Vec::new();
        if purge_expired {
            let now = now_ms();
            store.scan(DEDUP_TABLE, &mut |k, v| {
                if let Ok(v) = <[u8; 8]>::try_from(v) {
                    if u64::from_be_bytes(v) + self.window_ms <= now {
                        expired.push(k.to_vec());
                    }
                }
            })?;
        }
        if batch.is_empty() && expired.is_empty() {
            return Ok(0);
        }
        let encoded: Vec<([u8; 16], [u8; 8])> = batch
            .iter()
            .map(|(k, at)| (k.to_be_bytes(), at.to_be_bytes()))
            .collect();
        let puts: Vec<(&[u8], &[u8])> = encoded.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        let deletes: Vec<&[u8]> = expired.iter().map(Vec::as_slice).collect();
        if let Err(e) = store.write(DEDUP_TABLE, &puts, &deletes) {
            // Put the batch back so the next flush retries it, within the same bound.
            let mut unsaved = self.unsaved.lock().unwrap_or_else(|p| p.into_inner());
            let room = (self.cap_per_shard * SHARDS).saturating_sub(unsaved.len());
            let keep = batch.len().min(room);
            for item in batch.iter().rev().take(keep) {
                unsaved.push_front(*item);
            }
            return Err(e);
        }
        Ok(batch.len())
    }

    /// Flushes every 250 ms (purging expired keys every minute) until `shutdown`, then once more.
    pub async fn persist_until(
        self: Arc<Self>,
        store: Arc<dyn StateStore>,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let mut n: u64 = 0;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => break,
            }
            n += 1;
            let (this, store) = (self.clone(), store.clone());
            let res =
                tokio::task::spawn_blocking(move || this.flush(&*store, n.is_multiple_of(240)))
                    .await;
            if let Ok(Err(e)) = res {
                tracing::warn!(error = %e, "dedup: could not save the window to state_dir; will retry");
            }
        }
        if let Err(e) = self.flush(&*store, false) {
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
        let total: usize = d.shards.iter().map(|s| s.lock().unwrap().order.len()).sum();
        assert!(
            total < 50_000,
            "order queue must not keep every forgotten key: {total}"
        );
    }

    #[test]
    fn survives_a_restart_through_the_store() {
        let store = MemoryStateStore::default();
        let a = Dedup::new(
            DedupConfig {
                window: Duration::from_secs(600),
                capacity: 1000,
            },
            true,
        );
        let k = dedup_key("s", "1");
        let k2 = dedup_key("s", "2");
        let now = now_ms();
        assert_eq!(a.check_at(k, now), Check::New);
        assert_eq!(a.check_at(k2, now), Check::New);
        a.confirm(k, now);
        a.forget(k2, now);
        assert_eq!(a.flush(&store, true).unwrap(), 1);
        let b = dedup(600_000, 1000);
        assert_eq!(b.load(&store).unwrap(), 1);
        assert_eq!(b.check(k), Check::Delivered);
        assert_eq!(b.check(k2), Check::New);
    }
}
