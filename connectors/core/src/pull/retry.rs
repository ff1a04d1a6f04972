//! The timed parts every pull source needs: one backoff, and a queue of items to try again
//! when their wait is over.

use std::time::Duration;

use tokio::time::Instant;

/// A capped exponential backoff: `first`, doubling per attempt, at most `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Backoff {
    /// Between attempts to reach a broker again: 100 ms doubling, at most 5 s.
    pub const RECONNECT: Backoff = Backoff {
        first: Duration::from_millis(100),
        max: Duration::from_secs(5),
    };

    /// Before a failed delivery is tried again: 100 ms doubling, at most 30 s.
    pub const RETRY: Backoff = Backoff {
        first: Duration::from_millis(100),
        max: Duration::from_secs(30),
    };

    /// The wait after `n` earlier waits (0: the first one, `first`).
    pub fn nth(&self, n: u32) -> Duration {
        self.first.saturating_mul(1u32 << n.min(20)).min(self.max)
    }

    /// The wait before trying again something that failed `attempts` times (1: the first
    /// retry, `first`).
    pub fn after(&self, attempts: u32) -> Duration {
        self.nth(attempts.saturating_sub(1))
    }
}

/// Items waiting to be tried again, each until its own time. Taken in the order they fall due
/// (ties in the order they were put in).
#[derive(Debug)]
pub struct RetryQueue<H> {
    items: Vec<(Instant, u64, H)>,
    seq: u64,
}

impl<H> Default for RetryQueue<H> {
    fn default() -> Self {
        RetryQueue {
            items: Vec::new(),
            seq: 0,
        }
    }
}

impl<H> RetryQueue<H> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits `h` until `at`.
    pub fn push_at(&mut self, at: Instant, h: H) {
        self.seq += 1;
        self.items.push((at, self.seq, h));
    }

    /// Waits `h`, which failed `attempts` times, for its [`Backoff::RETRY`] wait.
    pub fn push_failed(&mut self, attempts: u32, h: H) {
        self.push_at(Instant::now() + Backoff::RETRY.after(attempts), h);
    }

    /// When the next item falls due.
    pub fn next_due(&self) -> Option<Instant> {
        self.items.iter().map(|i| i.0).min()
    }

    /// Up to `max` items due at `now`, in the order they fell due; the rest keep waiting.
    pub fn take_due(&mut self, now: Instant, max: usize) -> Vec<H> {
        self.items.sort_by_key(|i| (i.0, i.1));
        let n = self
            .items
            .iter()
            .take_while(|i| i.0 <= now)
            .count()
            .min(max);
        self.items.drain(..n).map(|i| i.2).collect()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Every item, in the order they fall due (a shutdown gives them all back at once).
    pub fn drain(&mut self) -> Vec<H> {
        self.items.sort_by_key(|i| (i.0, i.1));
        self.items.drain(..).map(|i| i.2).collect()
    }

    /// Forgets every item (a reconnect after which the broker sends them again).
    pub fn clear(&mut self) {
        self.items.clear();
    }

    /// The waiting items, in no order.
    pub fn iter(&self) -> impl Iterator<Item = &H> {
        self.items.iter().map(|i| &i.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoffs_double_up_to_their_cap() {
        assert_eq!(Backoff::RECONNECT.nth(0), Duration::from_millis(100));
        assert_eq!(Backoff::RECONNECT.nth(3), Duration::from_millis(800));
        assert_eq!(Backoff::RECONNECT.nth(6), Duration::from_secs(5));
        assert_eq!(Backoff::RECONNECT.nth(u32::MAX), Duration::from_secs(5));
        assert_eq!(Backoff::RETRY.after(0), Duration::from_millis(100));
        assert_eq!(Backoff::RETRY.after(1), Duration::from_millis(100));
        assert_eq!(Backoff::RETRY.after(2), Duration::from_millis(200));
        assert_eq!(Backoff::RETRY.after(40), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn items_are_taken_when_due_in_due_order_within_the_room() {
        let mut q = RetryQueue::new();
        let t0 = Instant::now();
        q.push_at(t0 + Duration::from_millis(300), "c");
        q.push_at(t0 + Duration::from_millis(100), "a");
        q.push_at(t0 + Duration::from_millis(100), "b");
        q.push_failed(1, "d"); // 100 ms
        assert_eq!(q.next_due(), Some(t0 + Duration::from_millis(100)));
        assert!(q.take_due(t0, usize::MAX).is_empty());
        // Room for two: the first two due, in the order they were put in.
        assert_eq!(q.take_due(t0 + Duration::from_millis(150), 2), ["a", "b"]);
        assert_eq!(q.take_due(t0 + Duration::from_millis(150), 9), ["d"]);
        assert_eq!(q.len(), 1);
        q.push_at(t0 + Duration::from_secs(9), "e");
        assert_eq!(q.drain(), ["c", "e"]);
        assert!(q.is_empty() && q.next_due().is_none());
    }
}
