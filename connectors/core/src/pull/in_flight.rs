//! The in-flight window and settle batching.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, Stream};
use tokio::time::Instant;

use crate::pipeline::{Outcome, Pending};

struct Slot<H> {
    handle: Option<H>,
    /// When the upstream lease on this message ends (visibility timeout, ack deadline); `None`
    /// in an unleased window.
    lease_until: Option<Instant>,
}

/// A future in the window, tagged with its slot.
struct Tagged<F> {
    slot: usize,
    fut: F,
}

impl<F: Future<Output = Outcome> + Unpin> Future for Tagged<F> {
    type Output = (usize, Outcome);
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let slot = self.slot;
        Pin::new(&mut self.fut).poll(cx).map(|o| (slot, o))
    }
}

/// A bounded window of upstream messages whose events are in the pipeline.
///
/// A source pulls only while [`InFlight::room`] is above zero, pushes each message's handle with
/// the [`Pending`] its send returned, and settles upstream what [`InFlight::next`] hands back
/// (in completion order, not arrival order). [`InFlight::extend_leases`] names the messages
/// whose lease ends soon, so the source can extend them before the broker redelivers.
pub struct InFlight<H, F = Pending> {
    limit: usize,
    /// `None`: the broker lends nothing for a time (Kafka offsets, AMQP delivery tags, MQTT
    /// packets), so there is nothing to extend.
    lease: Option<Duration>,
    slots: Vec<Slot<H>>,
    free: Vec<usize>,
    running: FuturesUnordered<Tagged<F>>,
}

impl<H, F: Future<Output = Outcome> + Unpin> InFlight<H, F> {
    /// A window of at most `limit` messages, each leased for `lease` when pushed or extended.
    pub fn new(limit: usize, lease: Duration) -> Self {
        Self::with_lease(limit, Some(lease))
    }

    /// A window of at most `limit` messages on which the broker sets no time limit: nothing is
    /// ever due for an extension.
    pub fn unleased(limit: usize) -> Self {
        Self::with_lease(limit, None)
    }

    fn with_lease(limit: usize, lease: Option<Duration>) -> Self {
        let limit = limit.max(1);
        InFlight {
            limit,
            lease,
            slots: Vec::with_capacity(limit),
            free: Vec::with_capacity(limit),
            running: FuturesUnordered::new(),
        }
    }

    /// Messages in flight.
    pub fn len(&self) -> usize {
        self.running.len()
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// How many more messages may be pulled now (0: stop pulling).
    pub fn room(&self) -> usize {
        self.limit - self.running.len()
    }

    /// Adds a message. The caller checks [`InFlight::room`] first: pushing into a full window is
    /// a bug (it would make the bound meaningless) and panics.
    pub fn push(&mut self, handle: H, outcome: F) {
        assert!(self.room() > 0, "InFlight::push on a full window");
        let lease_until = self.lease.map(|l| Instant::now() + l);
        let slot = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Slot {
                    handle: Some(handle),
                    lease_until,
                };
                i
            }
            None => {
                self.slots.push(Slot {
                    handle: Some(handle),
                    lease_until,
                });
                self.slots.len() - 1
            }
        };
        self.running.push(Tagged { slot, fut: outcome });
    }

    /// The next message whose events settled, with their outcome; `None` when the window is
    /// empty. Cancel-safe.
    pub async fn next(&mut self) -> Option<(H, Outcome)> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// [`InFlight::next`] as a poll function.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<(H, Outcome)>> {
        match Pin::new(&mut self.running).poll_next(cx) {
            Poll::Ready(Some((slot, outcome))) => {
                let handle = self.slots[slot]
                    .handle
                    .take()
                    .expect("a running slot holds its handle");
                self.free.push(slot);
                Poll::Ready(Some((handle, outcome)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Calls `extend` with every message whose lease ends within `margin` from now and renews
    /// its lease (now + the lease given to [`InFlight::new`]). The source extends them upstream
    /// (SQS `ChangeMessageVisibilityBatch`, Pub/Sub `ModifyAckDeadline`, JetStream `+WPI`).
    /// Returns how many were due.
    pub fn extend_leases(&mut self, margin: Duration, mut extend: impl FnMut(&H)) -> usize {
        let Some(lease) = self.lease else { return 0 };
        let now = Instant::now();
        let mut due = 0;
        for slot in &mut self.slots {
            if let (Some(h), Some(until)) = (&slot.handle, slot.lease_until) {
                if until <= now + margin {
                    extend(h);
                    slot.lease_until = Some(now + lease);
                    due += 1;
                }
            }
        }
        due
    }

    /// The earliest lease end in the window (when to call [`InFlight::extend_leases`] next).
    pub fn next_lease_end(&self) -> Option<Instant> {
        self.slots
            .iter()
            .filter(|s| s.handle.is_some())
            .filter_map(|s| s.lease_until)
            .min()
    }
}

/// Handles waiting to be settled upstream in one call: flushed when `max` are waiting or when
/// the oldest has waited `linger`.
pub struct SettleBatch<H> {
    max: usize,
    linger: Duration,
    buf: Vec<H>,
    since: Option<Instant>,
}

impl<H> SettleBatch<H> {
    pub fn new(max: usize, linger: Duration) -> Self {
        let max = max.max(1);
        SettleBatch {
            max,
            linger,
            buf: Vec::with_capacity(max),
            since: None,
        }
    }

    /// Adds a handle; returns a full batch to send now.
    pub fn push(&mut self, handle: H) -> Option<Vec<H>> {
        if self.buf.is_empty() {
            self.since = Some(Instant::now());
        }
        self.buf.push(handle);
        (self.buf.len() >= self.max).then(|| self.take())
    }

    /// The batch whose linger is over, if any.
    pub fn due(&mut self, now: Instant) -> Option<Vec<H>> {
        match self.since {
            Some(t) if now >= t + self.linger && !self.buf.is_empty() => Some(self.take()),
            _ => None,
        }
    }

    /// When the waiting batch must go out (`None`: nothing waits).
    pub fn deadline(&self) -> Option<Instant> {
        self.since.map(|t| t + self.linger)
    }

    /// Everything waiting, now (shutdown).
    pub fn take(&mut self) -> Vec<H> {
        self.since = None;
        std::mem::replace(&mut self.buf, Vec::with_capacity(self.max))
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Status;
    use tokio::sync::oneshot;

    /// A stand-in for [`Pending`]: an outcome the test decides.
    struct Manual(oneshot::Receiver<Outcome>);
    impl Future for Manual {
        type Output = Outcome;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
            Pin::new(&mut self.0).poll(cx).map(|r| r.unwrap())
        }
    }

    fn outcome(status: Status) -> Outcome {
        Outcome {
            status,
            reason: None,
            events: 1,
            duplicates: 0,
            each: Vec::new(),
        }
    }

    #[tokio::test]
    async fn outcomes_come_back_in_completion_order_and_the_bound_holds() {
        let mut w: InFlight<&str, Manual> = InFlight::new(2, Duration::from_secs(30));
        let (ta, ra) = oneshot::channel();
        let (tb, rb) = oneshot::channel();
        w.push("a", Manual(ra));
        w.push("b", Manual(rb));
        assert_eq!(w.room(), 0, "full: stop pulling");
        tb.send(outcome(Status::Failed)).unwrap();
        let (h, o) = w.next().await.unwrap();
        assert_eq!((h, o.status), ("b", Status::Failed));
        assert_eq!(w.room(), 1);
        let (tc, rc) = oneshot::channel();
        w.push("c", Manual(rc));
        tc.send(outcome(Status::InFlight)).unwrap();
        ta.send(outcome(Status::Delivered)).unwrap();
        let mut got = [w.next().await.unwrap(), w.next().await.unwrap()];
        got.sort_by_key(|g| g.0);
        assert_eq!(
            got.iter().map(|(h, o)| (*h, o.status)).collect::<Vec<_>>(),
            [("a", Status::Delivered), ("c", Status::InFlight)]
        );
        assert!(w.next().await.is_none());
    }

    #[test]
    #[should_panic(expected = "full window")]
    fn pushing_into_a_full_window_panics() {
        let mut w: InFlight<u8, Manual> = InFlight::new(1, Duration::from_secs(1));
        let (_t1, r1) = oneshot::channel();
        let (_t2, r2) = oneshot::channel();
        w.push(1, Manual(r1));
        w.push(2, Manual(r2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unleased_window_has_nothing_to_extend() {
        let mut w: InFlight<u32, Manual> = InFlight::unleased(2);
        let (t, r) = oneshot::channel();
        w.push(7, Manual(r));
        tokio::time::sleep(Duration::from_secs(86_400)).await;
        assert_eq!(
            w.extend_leases(Duration::from_secs(1), |_| panic!("extended")),
            0
        );
        assert_eq!(w.next_lease_end(), None);
        assert_eq!(w.room(), 1);
        t.send(outcome(Status::Delivered)).unwrap();
        assert_eq!(w.next().await.unwrap().0, 7);
    }

    // A paused clock: the 170 ms waits pass at once and exactly, however busy the machine.
    #[tokio::test(start_paused = true)]
    async fn leases_due_within_the_margin_are_named_and_renewed() {
        let mut w: InFlight<u32, Manual> = InFlight::new(10, Duration::from_millis(200));
        let mut keep = Vec::new();
        for h in 0..3 {
            let (t, r) = oneshot::channel();
            keep.push(t);
            w.push(h, Manual(r));
        }
        let mut due = Vec::new();
        assert_eq!(
            w.extend_leases(Duration::from_millis(50), |h| due.push(*h)),
            0
        );
        tokio::time::sleep(Duration::from_millis(170)).await;
        assert_eq!(
            w.extend_leases(Duration::from_millis(50), |h| due.push(*h)),
            3
        );
        due.sort();
        assert_eq!(due, [0, 1, 2]);
        // Renewed: not due again at once.
        assert_eq!(w.extend_leases(Duration::from_millis(50), |_| ()), 0);
        assert!(w.next_lease_end().unwrap() > Instant::now() + Duration::from_millis(100));
        // A settled message is no longer extended.
        keep.remove(0).send(outcome(Status::Delivered)).unwrap();
        assert_eq!(w.next().await.unwrap().0, 0);
        tokio::time::sleep(Duration::from_millis(170)).await;
        let mut again = Vec::new();
        w.extend_leases(Duration::from_millis(50), |h| again.push(*h));
        again.sort();
        assert_eq!(again, [1, 2]);
    }

    #[tokio::test]
    async fn settle_batches_flush_when_full_or_after_the_linger() {
        let mut b = SettleBatch::new(3, Duration::from_millis(50));
        assert_eq!(b.push(1), None);
        assert_eq!(b.push(2), None);
        assert_eq!(b.push(3), Some(vec![1, 2, 3]));
        assert!(b.deadline().is_none());
        assert_eq!(b.push(4), None);
        assert_eq!(b.due(Instant::now()), None, "linger not over");
        let at = b.deadline().unwrap();
        tokio::time::sleep_until(at).await;
        assert_eq!(b.due(Instant::now()), Some(vec![4]));
        assert!(b.is_empty() && b.deadline().is_none());
    }
}
