//! One bounded queue per sink: bounded in events (the channel) and in bytes (a [`Gate`]), and
//! every byte also counts against the process-wide memory budget (a second gate).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::ack::{Delivery, Status, Unit};
use super::gate::Gate;
use crate::event::Event;
use crate::telemetry::SinkTelemetry;

/// What a full sink queue does with a new event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenFull {
    /// Wait for room: the pressure reaches the source, which refuses or pauses (default).
    #[default]
    Block,
    /// Drop the new event for this sink and count it (`sluice_events_dropped_total`). The
    /// event does not count as failed: choose this only for sinks that may lose events.
    DropNewest,
}

/// Bytes a waiting push took so far, given back if it is dropped.
struct Held<'a> {
    shared: &'a SinkShared,
    bytes: u32,
    budget: u32,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.shared.give(self.bytes, self.budget);
    }
}

impl SinkShared {
    /// Gives bytes back to this queue and to the budget.
    pub(crate) fn give(&self, bytes: u32, budget: u32) {
        if bytes > 0 {
            self.bytes.give(u64::from(bytes));
        }
        if budget > 0 {
            self.budget.give(u64::from(budget));
        }
    }
}

/// What [`SinkQueue::try_push`] did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// In the queue: its delivery reports it.
    Queued,
    /// Dropped by a full `drop_newest` queue: a policy, not settled.
    Dropped,
    /// Settled as failed: the sink is not running.
    Failed,
}

pub(crate) struct SinkShared {
    pub(crate) name: Arc<str>,
    pub(crate) telemetry: SinkTelemetry,
    /// The queue's bytes: taken by each queued event until its delivery settles.
    pub(crate) bytes: Gate,
    max_bytes: u32,
    /// The process's memory budget, shared by every queue.
    pub(crate) budget: Arc<Gate>,
    budget_max: u32,
}

/// An event and its delivery ticket, as a sink receives it. The event is boxed: an item is
/// moved five times or more between the queue's send and the sink (into the channel's slot,
/// out of it, into the sink's batch, out of that), and an event is about 250 bytes.
#[derive(Debug)]
pub struct SinkItem {
    pub event: Box<Event>,
    pub delivery: Delivery,
}

/// Where a sink's failed events go instead of back upstream (`dead_letter: <sink>`).
pub(crate) struct DeadLetter {
    /// The dead-letter sink's queue. Held by every delivery of the failing sink, so it stays
    /// open until the failing sink has reported its last event.
    pub(crate) target: SinkQueue,
    pub(crate) counter: metrics::Counter,
    /// The runtime the pipeline was built on, for failures reported off the runtime (a client
    /// library's callback thread).
    pub(crate) runtime: Option<tokio::runtime::Handle>,
}

pub(crate) struct SinkQueue {
    tx: mpsc::Sender<SinkItem>,
    when_full: WhenFull,
    pub(crate) shared: Arc<SinkShared>,
    pub(crate) dead_letter: Option<Arc<DeadLetter>>,
}

/// The receiving end of a sink's queue.
pub struct SinkInput {
    rx: mpsc::Receiver<SinkItem>,
    shared: Arc<SinkShared>,
    /// The stages routing into this queue, when it closes by their count (see [`Upstream`]).
    pub(crate) upstream: Option<Arc<Upstream>>,
    closing: bool,
}

/// How many stages (sources, processors) that route into a queue are still running. Every
/// sender keeps every queue's sending half alive (they share the routing table), so with
/// processors — which hold a sender themselves — "every sender gone" never happens upstream of
/// them; instead the queue closes itself when the last stage routing into it is done.
#[derive(Debug)]
pub(crate) struct Upstream {
    left: std::sync::atomic::AtomicUsize,
    done: tokio::sync::Notify,
}

impl Upstream {
    pub(crate) fn new(stages: usize) -> Arc<Self> {
        Arc::new(Upstream {
            left: std::sync::atomic::AtomicUsize::new(stages),
            done: tokio::sync::Notify::new(),
        })
    }

    /// One stage routing here is done.
    pub(crate) fn stage_done(&self) {
        if self.left.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
            // One receiver: the permit is kept if it is not waiting right now.
            self.done.notify_one();
        }
    }

    fn is_done(&self) -> bool {
        self.left.load(std::sync::atomic::Ordering::Acquire) == 0
    }
}

/// Held (shared) by every sender of one stage; when the last one goes, the stage is done for
/// the queues it routes to.
pub(crate) struct StageToken(pub(crate) Vec<Arc<Upstream>>);

impl Drop for StageToken {
    fn drop(&mut self) {
        for u in &self.0 {
            u.stage_done();
        }
    }
}

impl Drop for SinkInput {
    /// A sink that stops (or dies) fails what is left in its queue at once, including an event
    /// a source is putting in at this very moment (its slot was reserved before the close):
    /// closing refuses new events, and the remaining items are received and dropped (a dropped
    /// delivery reports failed), waiting for the reserved slots on the runtime if any are out.
    fn drop(&mut self) {
        self.rx.close();
        loop {
            match self.rx.try_recv() {
                Ok(item) => drop(item),
                Err(mpsc::error::TryRecvError::Disconnected) => return,
                Err(mpsc::error::TryRecvError::Empty) => break,
            }
        }
        // Empty but not disconnected: senders exist, and one may hold a reserved slot.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (_, dummy) = mpsc::channel(1);
            let mut rx = std::mem::replace(&mut self.rx, dummy);
            rt.spawn(async move { while rx.recv().await.is_some() {} });
        }
    }
}

pub(crate) fn sink_queue(
    role: &'static str,
    name: &str,
    events: usize,
    bytes: u64,
    when_full: WhenFull,
    budget: Arc<Gate>,
    budget_max: u32,
) -> (SinkQueue, SinkInput) {
    let (tx, rx) = mpsc::channel(events.max(1));
    let max_bytes = bytes.clamp(1, u32::MAX as u64) as u32;
    let shared = Arc::new(SinkShared {
        name: name.into(),
        telemetry: SinkTelemetry::labelled(role, name),
        bytes: Gate::new(u64::from(max_bytes)),
        max_bytes,
        budget,
        budget_max,
    });
    (
        SinkQueue {
            tx,
            when_full,
            shared: shared.clone(),
            dead_letter: None,
        },
        SinkInput {
            rx,
            shared,
            upstream: None,
            closing: false,
        },
    )
}

impl SinkQueue {
    /// Makes failed events of this queue's sink go to `target` (which must not dead-letter
    /// itself: chains are refused by the config).
    pub(crate) fn set_dead_letter(&mut self, target: &SinkQueue) {
        self.dead_letter = Some(Arc::new(DeadLetter {
            target: SinkQueue {
                tx: target.tx.clone(),
                when_full: target.when_full,
                shared: target.shared.clone(),
                dead_letter: None,
            },
            counter: metrics::counter!(
                crate::telemetry::EVENTS_DEAD_LETTERED,
                "sink" => self.shared.name.to_string(),
                "dead_letter" => target.shared.name.to_string()
            ),
            runtime: tokio::runtime::Handle::try_current().ok(),
        }));
    }

    /// The bytes `event` takes in this queue and in the memory budget. An event larger than a
    /// bound still passes, alone, when the queue is empty.
    fn sizes(&self, event: &Event) -> (u32, u32) {
        let sh = &self.shared;
        let size = (event.approx_size().min(u32::MAX as usize) as u32).min(sh.max_bytes);
        (size, size.min(sh.budget_max))
    }

    /// Queues `event` without waiting: the common case, with no future to set up. `Err` hands
    /// the event back when a `block` queue has no room right now (then [`SinkQueue::push`]
    /// waits for it).
    #[allow(clippy::result_large_err)] // the event itself is handed back, not an error
    pub(crate) fn try_push(
        &self,
        event: Box<Event>,
        unit: &Arc<Unit>,
        idx: usize,
    ) -> Result<Pushed, Box<Event>> {
        let (size, gsize) = self.sizes(&event);
        let sh = &self.shared;
        let t = &sh.telemetry;
        if !sh.bytes.try_take(u64::from(size)) {
            return self.no_room(event, unit, idx);
        }
        if !sh.budget.try_take(u64::from(gsize)) {
            sh.bytes.give(u64::from(size));
            return self.no_room(event, unit, idx);
        }
        match self.tx.try_reserve() {
            Ok(slot) => {
                self.enqueue(slot, (size, gsize), event, unit, idx);
                Ok(Pushed::Queued)
            }
            Err(e) => {
                sh.bytes.give(u64::from(size));
                sh.budget.give(u64::from(gsize));
                match e {
                    mpsc::error::TrySendError::Closed(()) => {
                        self.not_running(unit, idx);
                        Ok(Pushed::Failed)
                    }
                    mpsc::error::TrySendError::Full(()) if self.when_full == WhenFull::Block => {
                        Err(event)
                    }
                    mpsc::error::TrySendError::Full(()) => {
                        t.dropped_full.increment(1);
                        Ok(Pushed::Dropped)
                    }
                }
            }
        }
    }

    /// No bytes free in this queue or the budget now.
    #[allow(clippy::result_large_err)] // the event itself is handed back, not an error
    fn no_room(
        &self,
        event: Box<Event>,
        unit: &Arc<Unit>,
        idx: usize,
    ) -> Result<Pushed, Box<Event>> {
        match self.when_full {
            WhenFull::Block => Err(event),
            _ if self.tx.is_closed() => {
                self.not_running(unit, idx);
                Ok(Pushed::Failed)
            }
            WhenFull::DropNewest => {
                self.shared.telemetry.dropped_full.increment(1);
                Ok(Pushed::Dropped)
            }
        }
    }

    /// Queues `event` for this sink on behalf of event `idx` of `unit`, waiting for room in a
    /// `block` queue. Cancel-safe: permits taken before a cancellation are returned, and the
    /// delivery ticket exists only once the event is in the queue. Returns false when a full
    /// `drop_newest` queue dropped the event (a policy, not settled); true when the event is
    /// queued or settled as failed.
    pub(crate) async fn push(&self, event: Box<Event>, unit: &Arc<Unit>, idx: usize) -> bool {
        let event = match self.try_push(event, unit, idx) {
            Ok(pushed) => return pushed != Pushed::Dropped,
            Err(event) => event,
        };
        // Only a `block` queue without room gets here.
        let (size, gsize) = self.sizes(&event);
        let sh = &self.shared;
        // Bytes taken are given back if this wait is dropped before the event is queued.
        let mut held = Held {
            shared: sh,
            bytes: 0,
            budget: 0,
        };
        sh.bytes.take(u64::from(size)).await;
        held.bytes = size;
        sh.budget.take(u64::from(gsize)).await;
        held.budget = gsize;
        match self.tx.reserve().await {
            Ok(slot) => {
                held.bytes = 0;
                held.budget = 0;
                self.enqueue(slot, (size, gsize), event, unit, idx)
            }
            Err(_) => self.not_running(unit, idx),
        }
        true
    }

    /// Queues the event; its delivery holds `held` (queue bytes, budget bytes).
    fn enqueue(
        &self,
        slot: mpsc::Permit<'_, SinkItem>,
        held: (u32, u32),
        event: Box<Event>,
        unit: &Arc<Unit>,
        idx: usize,
    ) {
        // Only a sink with a dead-letter target pays for a copy of the event (its data is
        // shared, not copied).
        let dead_letter = self
            .dead_letter
            .as_ref()
            .map(|d| Box::new((d.clone(), (*event).clone())));
        let delivery = Delivery::new(unit.clone(), idx, self.shared.clone(), held, dead_letter);
        slot.send(SinkItem { event, delivery });
    }

    fn not_running(&self, unit: &Arc<Unit>, idx: usize) {
        self.shared.telemetry.failures.increment(1);
        unit.settle(
            idx,
            Status::Failed,
            Some(format!(
                "sink {} is not running; check its log lines and /readyz",
                self.shared.name
            )),
            false,
        );
    }
}

impl SinkInput {
    /// The sink's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The next item; `None` once every source is gone and the queue is drained.
    pub async fn recv(&mut self) -> Option<SinkItem> {
        if let Some(up) = self.watch_upstream() {
            tokio::select! {
                biased;
                item = self.rx.recv() => return item,
                _ = up.done.notified() => self.close_input(),
            }
        }
        self.rx.recv().await
    }

    /// The upstream counter to wait on, unless the queue is closing already (then it drains
    /// like any closed channel).
    fn watch_upstream(&mut self) -> Option<Arc<Upstream>> {
        let up = self.upstream.as_ref().filter(|_| !self.closing)?.clone();
        if up.is_done() {
            self.close_input();
            return None;
        }
        Some(up)
    }

    fn close_input(&mut self) {
        self.closing = true;
        // Refuses new events; what is queued (and slots already reserved) is still received.
        self.rx.close();
    }

    /// Up to `limit` items appended to `buf`, waiting for at least one. Returns 0 once every
    /// source is gone and the queue is drained.
    pub async fn recv_many(&mut self, buf: &mut Vec<SinkItem>, limit: usize) -> usize {
        if let Some(up) = self.watch_upstream() {
            tokio::select! {
                biased;
                n = self.rx.recv_many(buf, limit.max(1)) => return n,
                _ = up.done.notified() => self.close_input(),
            }
        }
        self.rx.recv_many(buf, limit.max(1)).await
    }

    /// Whatever is queued now, without waiting.
    pub fn try_recv(&mut self) -> Option<SinkItem> {
        self.rx.try_recv().ok()
    }

    /// The queue's bytes and the memory budget's held now (queued and in-delivery events).
    #[cfg(test)]
    pub(crate) fn held(&self) -> (u64, u64) {
        (self.shared.bytes.used(), self.shared.budget.used())
    }

    /// Events waiting in the queue.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}

/// Samples every sink queue into `sluice_queue_events` and `sluice_queue_bytes` (events waiting
/// in the queue; bytes held by queued and in-delivery events). Sampling keeps the per-event path
/// free of gauge updates.
/// What the sampler reads of one queue: its sender (weak: sampling must not keep it open), its
/// byte semaphore and bound, and its gauges.
type QueueView = (mpsc::WeakSender<SinkItem>, Arc<SinkShared>);

pub struct QueueGauges {
    queues: Vec<QueueView>,
    dedup: Option<(std::sync::Weak<super::Dedup>, metrics::Gauge)>,
}

impl QueueGauges {
    pub(crate) fn new(queues: &[SinkQueue], dedup: Option<&Arc<super::Dedup>>) -> Self {
        QueueGauges {
            dedup: dedup.map(|d| {
                (
                    Arc::downgrade(d),
                    metrics::gauge!(crate::telemetry::DEDUP_ENTRIES),
                )
            }),
            queues: queues
                .iter()
                .map(|q| (q.tx.downgrade(), q.shared.clone()))
                .collect(),
        }
    }

    /// Updates the gauges once. Returns false when every queue is closed.
    pub fn sample(&self) -> bool {
        if let Some((d, g)) = &self.dedup {
            if let Some(d) = d.upgrade() {
                g.set(d.len() as f64);
            }
        }
        let mut open = false;
        for (tx, shared) in &self.queues {
            let t = &shared.telemetry;
            t.queue_bytes.set(shared.bytes.used() as f64);
            match tx.upgrade() {
                Some(tx) => {
                    open = true;
                    t.queue_events
                        .set((tx.max_capacity() - tx.capacity()) as f64);
                }
                None => t.queue_events.set(0.0),
            }
        }
        open
    }

    /// Samples every `every` until every queue is closed.
    pub async fn run(self, every: std::time::Duration) {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            if !self.sample() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The race a sink dying mid-send used to lose: a source reserved a slot, the sink's input
    /// was dropped, then the source sent into the slot. The event must still settle promptly.
    #[tokio::test]
    async fn an_event_sent_into_a_slot_reserved_before_the_sink_stopped_settles() {
        let budget = Arc::new(Gate::new(1 << 20));
        let (q, input) = sink_queue(
            "sink",
            "race",
            4,
            1 << 20,
            WhenFull::Block,
            budget.clone(),
            1 << 20,
        );
        let slot = q.tx.reserve().await.unwrap();
        drop(input);
        let unit = Unit::new(1, None, "test".into());
        let pending = crate::pipeline::Pending::new(unit.clone());
        assert!(q.shared.bytes.try_take(10) && budget.try_take(10));
        let delivery = Delivery::new(unit.clone(), 0, q.shared.clone(), (10, 10), None);
        slot.send(SinkItem {
            event: Box::new(Event::new("1", "/s", "t")),
            delivery,
        });
        super::super::ack::RoutingGuard::new(unit).finish();
        let out = tokio::time::timeout(std::time::Duration::from_secs(1), pending)
            .await
            .expect("settled at once, not when the last sender goes");
        assert_eq!(out.status, Status::Failed);
        drop(q);
    }
}
