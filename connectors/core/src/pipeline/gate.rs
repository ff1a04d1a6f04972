//! A byte bound (a sink queue's `queue_bytes`, the process's `memory_budget`) that costs two
//! atomic operations per event while nobody waits.
//!
//! tokio's `Semaphore` takes its waiters' lock on every release, and an owned permit keeps a
//! reference count: per event that was two locks and four reference-count updates. Here taking
//! is one compare-and-swap, giving back one subtraction and a load of the waiter count; a
//! notification is sent only when someone waits. Waiters are served in arrival order: they pass
//! one at a time through a fair (FIFO) lock, and while any waits, no newcomer takes bytes
//! without queueing, so a large event is not starved by a stream of small ones.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;

pub(crate) struct Gate {
    used: AtomicU64,
    max: u64,
    /// Takers queued (in `take`, past the fast path).
    waiting: AtomicUsize,
    /// The head of the queue waits here for bytes to be given back.
    freed: Notify,
    /// The queue: one taker at a time is its head.
    turn: tokio::sync::Mutex<()>,
}

impl Gate {
    pub(crate) fn new(max: u64) -> Self {
        Gate {
            used: AtomicU64::new(0),
            max: max.max(1),
            waiting: AtomicUsize::new(0),
            freed: Notify::new(),
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// Bytes taken now (for the gauges).
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    // The waiter (count up, then look at `used`) and the giver (`used` down, then look at the
    // count) each write one atomic and read the other: sequentially consistent order, so that
    // one of them sees the other's write (else the waiter could sleep with bytes free).
    fn grab(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                (used + n <= self.max).then_some(used + n)
            })
            .is_ok()
    }

    /// Takes `n` bytes (at most the bound) if they are free and nobody waits for bytes.
    pub(crate) fn try_take(&self, n: u64) -> bool {
        self.waiting.load(Ordering::SeqCst) == 0 && self.grab(n)
    }

    /// Takes `n` bytes (at most the bound), waiting in line for them. Cancel-safe: a dropped
    /// wait has taken nothing and leaves the line.
    pub(crate) async fn take(&self, n: u64) {
        if self.try_take(n) {
            return;
        }
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        let _turn = self.turn.lock().await;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check: bytes given back after it wake this wait.
            freed.as_mut().enable();
            if self.grab(n) {
                return;
            }
            freed.await;
        }
    }

    /// Gives `n` bytes back.
    pub(crate) fn give(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            // Only the head of the line waits on `freed`.
            self.freed.notify_waiters();
        }
    }
}

// The tests run on a paused clock: the sleeps that order their tasks pass exactly, however
// busy the machine.
#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn takes_within_the_bound_and_waits_past_it() {
        let g = Arc::new(Gate::new(10));
        assert!(g.try_take(6));
        assert!(!g.try_take(6), "6 + 6 > 10");
        let g2 = g.clone();
        let waiter = tokio::spawn(async move { g2.take(6).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        assert!(!g.try_take(1), "a newcomer queues behind the waiter");
        g.give(6);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("bytes given back wake the waiter")
            .unwrap();
        assert_eq!(g.used(), 6);
        g.give(6);
        assert!(g.try_take(10));
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_in_arrival_order_and_a_large_one_is_not_starved() {
        let g = Arc::new(Gate::new(10));
        assert!(g.try_take(10));
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, n) in [(0, 10u64), (1, 1), (2, 1)] {
            let (g, order) = (g.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                g.take(n).await;
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(5)).await;
                g.give(n);
            }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Small gives would satisfy the small waiters first, were the line not fair.
        for _ in 0..10 {
            g.give(1);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(2), t)
                .await
                .unwrap()
                .unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
        assert_eq!(g.used(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_wait_leaves_the_line() {
        let g = Arc::new(Gate::new(4));
        assert!(g.try_take(4));
        let wait = tokio::time::timeout(Duration::from_millis(20), g.take(2)).await;
        assert!(wait.is_err(), "no bytes: the wait is given up");
        g.give(4);
        assert!(
            g.try_take(4),
            "nobody is left waiting: the fast path works again"
        );
    }
}
