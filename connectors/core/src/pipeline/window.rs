//! The loop every pipelining sink runs: keep up to N deliveries in flight, take more input only
//! while there is room, settle each as it finishes, stop taking input when the grace is over.

use std::future::Future;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio_util::sync::CancellationToken;

/// What one [`SinkWindow::step`] did.
#[derive(Debug)]
pub enum Step<T> {
    /// A delivery in flight finished (it settled its events itself).
    Settled,
    /// The input future finished with this value: start deliveries for it with
    /// [`SinkWindow::push`].
    Input(T),
    /// The shutdown grace period is over: return now; deliveries still in flight are dropped
    /// with the window, and each dropped delivery reports its events as failed.
    GraceOver,
    /// Nothing is in flight and the caller took no input: nothing can happen.
    Idle,
}

/// Deliveries in flight, bounded. Each one is a future that reports its own events
/// ([`super::Delivery`]) and yields `()`.
///
/// ```ignore
/// let mut window = SinkWindow::new(self.window);
/// loop {
///     match window.step(&ctx.grace_over, true, |room| ctx.input.recv_many(&mut batch, room)).await {
///         Step::Input(0) => break window.drain().await, // input done: finish what is in flight
///         Step::Input(_) => for item in batch.drain(..) { window.push(self.deliver(item)) },
///         Step::Settled | Step::Idle => {}
///         Step::GraceOver => break,
///     }
/// }
/// ```
pub struct SinkWindow<F> {
    limit: usize,
    running: FuturesUnordered<F>,
}

impl<F: Future<Output = ()>> SinkWindow<F> {
    pub fn new(limit: usize) -> Self {
        SinkWindow {
            limit: limit.max(1),
            running: FuturesUnordered::new(),
        }
    }

    /// Deliveries in flight.
    pub fn len(&self) -> usize {
        self.running.len()
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// How many more deliveries may start.
    pub fn room(&self) -> usize {
        self.limit.saturating_sub(self.running.len())
    }

    /// Starts a delivery. May go past the limit (a batch taken with room for it may fan out);
    /// [`SinkWindow::step`] takes no input until it is back under.
    pub fn push(&mut self, delivery: F) {
        self.running.push(delivery);
    }

    /// Waits for one delivery to finish (`false`: none in flight). For a sink whose client
    /// pushes back (a full local queue) while it starts a delivery.
    pub async fn settle_one(&mut self) -> bool {
        self.running.next().await.is_some()
    }

    /// Waits, in this order of priority, for the grace to be over, a delivery to finish, or
    /// (when `take_input` and there is room) `input(room)` to finish.
    ///
    /// The grace is checked first, then waited for only when nothing else is ready: polling
    /// its future on every step registered and removed a waiter under the token's locks, three
    /// lock round trips per step (a sensor steps once or twice per event). So when the grace
    /// ends in the same wake-up as input arrives, that input is taken, and the next step says
    /// `GraceOver` (what the input started is dropped with the window and reported failed).
    pub async fn step<T, I: Future<Output = T>>(
        &mut self,
        grace_over: &CancellationToken,
        take_input: bool,
        input: impl FnOnce(usize) -> I,
    ) -> Step<T> {
        if grace_over.is_cancelled() {
            return Step::GraceOver;
        }
        let room = self.room();
        let take = take_input && room > 0;
        if !take && self.running.is_empty() {
            return Step::Idle;
        }
        let input = async move {
            if take {
                input(room).await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            biased;
            Some(()) = self.running.next(), if !self.running.is_empty() => Step::Settled,
            v = input => Step::Input(v),
            _ = grace_over.cancelled() => Step::GraceOver,
        }
    }

    /// Waits for every delivery in flight (each bounded by the sink's own timeouts).
    pub async fn drain(&mut self) {
        while self.running.next().await.is_some() {}
    }

    /// [`SinkWindow::drain`], given up when the grace is over (what is left is dropped and
    /// reported failed).
    pub async fn drain_until(&mut self, grace_over: &CancellationToken) {
        tokio::select! {
            biased;
            _ = grace_over.cancelled() => {}
            _ = self.drain() => {}
        }
    }
}

/// The whole loop of a sink that delivers each event on its own: takes events while fewer
/// than `limit` deliveries are in flight, runs `deliver(item)` for each (the future reports the
/// item's delivery), and returns once the input ended and every delivery settled, or when the
/// grace period is over (what is in flight is dropped, and so reported failed).
pub async fn serve_each<F: Future<Output = ()>>(
    mut input: crate::pipeline::SinkInput,
    grace_over: CancellationToken,
    limit: usize,
    mut deliver: impl FnMut(crate::pipeline::SinkItem) -> F,
) {
    let mut window = SinkWindow::new(limit);
    let mut batch = Vec::new();
    loop {
        let step = window
            .step(&grace_over, true, |room| input.recv_many(&mut batch, room))
            .await;
        match step {
            Step::GraceOver => return,
            Step::Settled | Step::Idle => {}
            Step::Input(0) => return window.drain_until(&grace_over).await,
            Step::Input(_) => batch.drain(..).for_each(|item| window.push(deliver(item))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_step_waiting_on_nothing_ready_ends_when_the_grace_is_over() {
        let mut w: SinkWindow<std::future::Pending<()>> = SinkWindow::new(2);
        w.push(std::future::pending());
        let grace = CancellationToken::new();
        let cancel = grace.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            cancel.cancel();
        });
        let s = tokio::time::timeout(
            Duration::from_secs(5),
            w.step(&grace, true, |_| std::future::pending::<usize>()),
        )
        .await
        .expect("the step ends when the grace is over");
        assert!(matches!(s, Step::GraceOver));
    }

    #[tokio::test]
    async fn input_is_taken_only_with_room_and_settles_come_first() {
        let mut w = SinkWindow::new(2);
        let grace = CancellationToken::new();
        let done = Arc::new(AtomicUsize::new(0));
        let mk = |ms: u64| {
            let done = done.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                done.fetch_add(1, Ordering::SeqCst);
            })
        };
        match w.step(&grace, true, |room| async move { room }).await {
            Step::Input(room) => assert_eq!(room, 2),
            s => panic!("{s:?}"),
        }
        w.push(mk(10));
        w.push(mk(20));
        // Full: the input closure must not even be called.
        let s = w
            .step(&grace, true, |_| -> std::future::Ready<usize> {
                panic!("no room: no input")
            })
            .await;
        assert!(matches!(s, Step::Settled));
        assert_eq!(w.room(), 1);
        w.drain().await;
        assert_eq!(done.load(Ordering::SeqCst), 2);
        let s = w.step(&grace, false, |_| async { 0usize }).await;
        assert!(matches!(s, Step::Idle));
        grace.cancel();
        w.push(mk(10_000));
        let s = w.step(&grace, true, |_| async { 0usize }).await;
        assert!(matches!(s, Step::GraceOver));
        w.drain_until(&grace).await;
        assert_eq!(w.len(), 1, "given up, not waited for");
    }
}
