//! Acknowledgements, tracked per inbound unit (one HTTP request, one broker message, one slot).
//!
//! A unit holds one small state block behind one mutex. Every (event, sink) pair that was queued
//! holds a [`Delivery`]; when the last one reports, the unit resolves once with the worst status
//! (Rejected > Failed > Delivered). A `Delivery` dropped without a report counts as Failed, so an
//! event can never be acknowledged upstream by accident.
//!
//! The unit is also the channel its source waits on: the outcome is kept in the state block and
//! the source's waker is woken, with no separate oneshot allocation per unit.

use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Instant;

use super::dedup::Dedup;
use super::queue::{DeadLetter, SinkShared};
use crate::event::Event;

/// The extensions a dead-lettered event carries.
pub const DEAD_LETTER_SINK: &str = "deadlettersink";
pub const DEAD_LETTER_REASON: &str = "deadletterreason";
pub const DEAD_LETTER_STATUS: &str = "deadletterstatus";

/// What happened to an event, or to a whole inbound unit (the worst of its events).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    /// Every sink it was routed to confirmed it (or it was a duplicate of a delivered event).
    Delivered,
    /// A copy of this event (same dedup key) is still being delivered: nothing was forwarded.
    /// Not a failure of this copy: a redelivering upstream should let it lapse or back off
    /// (SQS: leave the visibility timeout to run; AMQP: nack after a delay) rather than retry
    /// at once; once the first copy is delivered a retry is answered `Delivered`.
    InFlight,
    /// A transient failure: the sender should retry (HTTP 5xx, broker nack with requeue).
    Failed,
    /// A permanent refusal: retrying the same input will not help (HTTP 4xx, nack to DLQ).
    Rejected,
}

/// The resolution of one inbound unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub status: Status,
    /// The first failure or rejection reason, for the answer to the sender and the logs.
    pub reason: Option<String>,
    /// Events in the unit.
    pub events: usize,
    /// Events answered as duplicates and not forwarded.
    pub duplicates: usize,
    /// Each event's status, in the unit's order, when they may differ: filled for a unit of
    /// more than one event that was not delivered, empty otherwise (then every event has
    /// `status`). Read it with [`Outcome::status_of`].
    pub each: Vec<Status>,
}

impl Outcome {
    pub fn is_delivered(&self) -> bool {
        self.status == Status::Delivered
    }

    /// The status of the unit's event `idx`: a source that sends several upstream messages as
    /// one unit settles each by its own (a delivered neighbour of a failed event is not sent
    /// again).
    pub fn status_of(&self, idx: usize) -> Status {
        self.each.get(idx).copied().unwrap_or(self.status)
    }

    /// The wait ended at the unit's deadline ([`super::SendOptions::deadline`] / `within`)
    /// before its events were settled; the deliveries go on.
    pub fn deadline_passed(&self) -> bool {
        self.status == Status::Failed && self.reason.as_deref() == Some(super::DEADLINE_PASSED)
    }
}

#[derive(Debug, Clone, Copy)]
struct EventState {
    /// The dedup key this event recorded, with the time it was recorded at (duplicates record
    /// nothing).
    key: Option<(u128, u64)>,
    pending: u32,
    status: Status,
}

struct UnitState {
    /// Most units carry one event: keep it inline, without a heap allocation.
    events: smallvec::SmallVec<[EventState; 1]>,
    /// Deliveries outstanding, plus one while the unit is being routed.
    pending: usize,
    reason: Option<String>,
    duplicates: usize,
    /// Set once, when the last report came in; taken by [`super::Pending`].
    outcome: Option<Outcome>,
    fired: bool,
    /// The wait for the outcome ended before it: [`super::SendOptions::deadline`] passed.
    lapsed: bool,
    /// The task waiting for the outcome, if it polled before the unit settled.
    waker: Option<Waker>,
    /// Called with the outcome instead, when a processor handed its output over without a
    /// task to wait on it ([`super::SourceSender::try_send_to_then`]).
    then: Option<Then>,
}

/// What a processor's output settles once it is settled: called once with the outcome, in
/// the task that settled it.
pub type Then = Box<dyn FnOnce(Outcome) + Send + 'static>;

pub(crate) struct Unit {
    state: Mutex<UnitState>,
    pub(crate) started: Instant,
    dedup: Option<Arc<Dedup>>,
    /// The stage (source or processor) that sent the unit.
    origin: Arc<str>,
}

impl Unit {
    pub(crate) fn new(events: usize, dedup: Option<Arc<Dedup>>, origin: Arc<str>) -> Arc<Unit> {
        Unit::build(events, dedup, origin, None)
    }

    /// A unit of one processor output, settled by `then`
    /// ([`super::SourceSender::try_send_to_then`]).
    pub(crate) fn with_then(origin: Arc<str>, then: Then) -> Arc<Unit> {
        Unit::build(1, None, origin, Some(then))
    }

    fn build(
        events: usize,
        dedup: Option<Arc<Dedup>>,
        origin: Arc<str>,
        then: Option<Then>,
    ) -> Arc<Unit> {
        let fresh = EventState {
            key: None,
            pending: 0,
            status: Status::Delivered,
        };
        let states = smallvec::SmallVec::from_elem(fresh, events);
        Arc::new(Unit {
            state: Mutex::new(UnitState {
                events: states,
                pending: 1,
                reason: None,
                duplicates: 0,
                outcome: None,
                fired: false,
                lapsed: false,
                waker: None,
                then,
            }),
            started: Instant::now(),
            dedup,
            origin,
        })
    }

    /// The outcome once the unit settled (taken: the first call gets it); otherwise `cx`'s
    /// waker is kept and woken when it settles.
    pub(crate) fn poll_outcome(&self, cx: &std::task::Context<'_>) -> Option<Outcome> {
        let mut st = self.lock();
        if st.fired {
            return Some(st.outcome.take().unwrap_or_else(|| Outcome {
                status: Status::Failed,
                reason: Some("the outcome was already taken".into()),
                events: 0,
                duplicates: 0,
                each: Vec::new(),
            }));
        }
        if st.lapsed {
            return Some(Outcome {
                status: Status::Failed,
                reason: Some(super::DEADLINE_PASSED.into()),
                events: 0,
                duplicates: 0,
                each: Vec::new(),
            });
        }
        match &st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        None
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, UnitState> {
        // A panic while holding this lock cannot leave the counts half-updated in a way that
        // matters more than losing the answer; keep going with the data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_key(&self, idx: usize, key: u128, at: u64) {
        self.lock().events[idx].key = Some((key, at));
    }

    /// Whether an event of this unit recorded `key` in the dedup window.
    pub(crate) fn recorded(&self, key: u128) -> bool {
        self.lock()
            .events
            .iter()
            .any(|e| e.key.is_some_and(|(k, _)| k == key))
    }

    /// Settles an event without a delivery (duplicate, unrouted, dead sink).
    pub(crate) fn settle(
        &self,
        idx: usize,
        status: Status,
        reason: Option<String>,
        duplicate: bool,
    ) {
        let mut st = self.lock();
        let ev = &mut st.events[idx];
        ev.status = ev.status.max(status);
        if duplicate {
            st.duplicates += 1;
        }
        if status != Status::Delivered && st.reason.is_none() {
            st.reason = reason;
        }
    }

    /// Ends the wait for the outcome: the unit's deadline passed (the deliveries go on).
    pub(crate) fn lapse(&self) {
        let waker = {
            let mut st = self.lock();
            st.lapsed = !st.fired;
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    #[cfg(test)]
    pub(crate) fn lapsed(&self) -> bool {
        self.lock().lapsed
    }

    /// Ends event `idx` when no delivery holds it (a full `drop_newest` queue dropped it, or its
    /// sink is not running): its dedup entry is kept (delivered) or forgotten, as a last report
    /// would.
    pub(crate) fn close_event(&self, idx: usize) {
        let st = self.lock();
        let ev = &st.events[idx];
        if ev.pending != 0 {
            return;
        }
        if let (Some((key, at)), Some(dedup)) = (ev.key, &self.dedup) {
            match ev.status {
                Status::Delivered => dedup.confirm(key, at),
                _ => dedup.forget(key, at),
            }
        }
    }

    /// Adds one outstanding report for event `idx` (a delivery, or the routing hold).
    pub(crate) fn hold(&self, idx: usize) {
        let mut st = self.lock();
        st.events[idx].pending += 1;
        st.pending += 1;
    }

    /// Reports one outstanding item of event `idx`.
    pub(crate) fn report(&self, idx: usize, status: Status, reason: Option<String>) {
        let mut st = self.lock();
        let ev = &mut st.events[idx];
        ev.status = ev.status.max(status);
        ev.pending -= 1;
        let finished = ev.pending == 0;
        let (key, ev_status) = (ev.key, ev.status);
        if status != Status::Delivered && st.reason.is_none() {
            st.reason = reason;
        }
        if finished {
            if let (Some((key, at)), Some(dedup)) = (key, &self.dedup) {
                if ev_status == Status::Delivered {
                    dedup.confirm(key, at);
                } else {
                    // Not delivered: forget it, so the sender's retry is not taken for a duplicate.
                    dedup.forget(key, at);
                }
            }
        }
        Self::release(st);
    }

    /// Reports one outstanding item of each event in `idxs` as delivered, as [`Unit::report`]
    /// does for one, under one lock. `idxs` is not empty.
    pub(crate) fn report_delivered(&self, idxs: &[usize]) {
        let mut st = self.lock();
        for &idx in idxs {
            let ev = &mut st.events[idx];
            ev.status = ev.status.max(Status::Delivered);
            ev.pending -= 1;
            if ev.pending == 0 {
                if let (Some((key, at)), Some(dedup)) = (ev.key, &self.dedup) {
                    if ev.status == Status::Delivered {
                        dedup.confirm(key, at);
                    } else {
                        dedup.forget(key, at);
                    }
                }
            }
        }
        // `release` takes the last one off.
        st.pending -= idxs.len() - 1;
        Self::release(st);
    }

    /// Ends routing. Called exactly once, by [`RoutingGuard`].
    fn end_routing(&self) {
        Self::release(self.lock());
    }

    /// Takes back the continuation of a unit that was never queued.
    pub(crate) fn take_then(&self) -> Option<Then> {
        self.lock().then.take()
    }

    /// One outstanding report fewer; the last one settles the unit and wakes its source, or
    /// calls its continuation (after the lock is given up).
    fn release(mut st: std::sync::MutexGuard<'_, UnitState>) {
        st.pending -= 1;
        let (waker, then) = if st.pending == 0 {
            let waker = Self::fire(&mut st);
            let then = match st.then.take() {
                Some(then) => st.outcome.take().map(|o| (then, o)),
                None => None,
            };
            (waker, then)
        } else {
            (None, None)
        };
        drop(st);
        if let Some(w) = waker {
            w.wake();
        }
        if let Some((then, outcome)) = then {
            then(outcome);
        }
    }

    /// Records the unit's outcome; returns the waker to wake once the lock is released.
    fn fire(st: &mut UnitState) -> Option<Waker> {
        if st.fired {
            return None;
        }
        let status = st
            .events
            .iter()
            .map(|e| e.status)
            .max()
            .unwrap_or(Status::Delivered);
        st.outcome = Some(Outcome {
            status,
            reason: if status == Status::Delivered {
                None
            } else {
                st.reason.take()
            },
            events: st.events.len(),
            duplicates: st.duplicates,
            each: if status != Status::Delivered && st.events.len() > 1 {
                st.events.iter().map(|e| e.status).collect()
            } else {
                Vec::new()
            },
        });
        st.fired = true;
        st.waker.take()
    }
}

/// Holds a unit open while its events are routed. If the routing future is dropped half-way
/// (a send timeout), the event being routed is failed, so a partial fan-out is never reported
/// as delivered and its dedup entry is forgotten.
pub(crate) struct RoutingGuard {
    pub(crate) unit: Arc<Unit>,
    /// The event currently held, if any.
    pub(crate) holding: Option<usize>,
    finished: bool,
}

impl RoutingGuard {
    pub(crate) fn new(unit: Arc<Unit>) -> Self {
        RoutingGuard {
            unit,
            holding: None,
            finished: false,
        }
    }

    pub(crate) fn begin_event(&mut self, idx: usize) {
        self.unit.hold(idx);
        self.holding = Some(idx);
    }

    pub(crate) fn end_event(&mut self) {
        if let Some(idx) = self.holding.take() {
            self.unit.report(idx, Status::Delivered, None);
        }
    }

    pub(crate) fn finish(mut self) {
        self.end_event();
        self.finished = true;
        self.unit.end_routing();
    }
}

impl Drop for RoutingGuard {
    fn drop(&mut self) {
        if !self.finished {
            if let Some(idx) = self.holding.take() {
                self.unit.report(
                    idx,
                    Status::Failed,
                    Some("the pipeline did not accept the event in time".into()),
                );
            }
            // A continuation is never called for a unit whose routing did not finish (a panic
            // while it was queued): dropped uncalled, what it would settle counts as failed.
            drop(self.unit.take_then());
            self.unit.end_routing();
        }
    }
}

/// One event's delivery to one sink. Report it with [`Delivery::delivered`],
/// [`Delivery::failed`] or [`Delivery::rejected`]; dropping it unreported counts as failed.
/// Holding it holds the event's share of the sink's queue bytes and the memory budget.
pub struct Delivery {
    unit: Arc<Unit>,
    idx: usize,
    sink: Arc<SinkShared>,
    /// The bytes this event holds in the sink's queue and in the memory budget, given back
    /// when the delivery ends (or the processor took the event, [`Delivery::release_memory`]).
    held: (u32, u32),
    /// The dead-letter target and a copy of the event, when the sink has one.
    dead_letter: Option<Box<(Arc<DeadLetter>, Event)>>,
    done: bool,
}

impl Delivery {
    pub(crate) fn new(
        unit: Arc<Unit>,
        idx: usize,
        sink: Arc<SinkShared>,
        held: (u32, u32),
        dead_letter: Option<Box<(Arc<DeadLetter>, Event)>>,
    ) -> Self {
        unit.hold(idx);
        Delivery {
            unit,
            idx,
            sink,
            held,
            dead_letter,
            done: false,
        }
    }

    pub fn delivered(self) {
        self.complete(Status::Delivered, None)
    }

    /// Reports every delivery of `deliveries` as delivered, as [`Delivery::delivered`] does
    /// one by one, for a sink that finished a batch: one clock reading for the batch and, per
    /// run of deliveries of one unit to one sink (the events a source sent together), one lock
    /// of the unit and one return of their queue bytes and budget. Until its run is reported
    /// each delivery is whole, so a panic on the way (in the iterator) drops it as a failure
    /// with its bytes given back, as for any delivery dropped unreported.
    pub fn delivered_all(deliveries: impl IntoIterator<Item = Delivery>) {
        let now = Instant::now();
        let mut run: Vec<Delivery> = Vec::new();
        let mut idxs: Vec<usize> = Vec::new();
        for d in deliveries {
            if d.done {
                continue;
            }
            if let Some(first) = run.first() {
                if !(Arc::ptr_eq(&first.unit, &d.unit) && Arc::ptr_eq(&first.sink, &d.sink)) {
                    Self::settle_run(&mut run, &mut idxs, now);
                }
            }
            run.push(d);
        }
        if !run.is_empty() {
            Self::settle_run(&mut run, &mut idxs, now);
        }
    }

    /// Reports one run of [`Delivery::delivered_all`] (deliveries of one unit to one sink, none
    /// done) and empties it: each is dropped as done after the report, as `delivered` drops
    /// it. The bytes go back before the unit hears: a panic in what its outcome wakes or calls
    /// cannot keep them.
    fn settle_run(run: &mut Vec<Delivery>, idxs: &mut Vec<usize>, now: Instant) {
        let (unit, sink) = (run[0].unit.clone(), run[0].sink.clone());
        let (mut bytes, mut budget) = (0u32, 0u32);
        idxs.clear();
        for d in run.iter_mut() {
            // Reported below, not by its own drop.
            d.done = true;
            let (b, g) = std::mem::take(&mut d.held);
            bytes += b;
            budget += g;
            idxs.push(d.idx);
        }
        let t = &sink.telemetry;
        t.delivered.increment(idxs.len() as u64);
        let latency = now.saturating_duration_since(unit.started);
        t.latency.record_many(latency, idxs.len() as u64);
        sink.give(bytes, budget);
        unit.report_delivered(idxs);
        run.clear();
    }

    /// The sink gave up on the event (after its own retries, if any): a transient failure.
    /// With a dead-letter sink configured, the event goes there instead of failing upstream.
    pub fn failed(self, reason: impl Into<String>) {
        self.complete(Status::Failed, Some(reason.into()))
    }

    /// The target refused the event for good. With a dead-letter sink configured, the event
    /// goes there instead of being refused upstream.
    pub fn rejected(self, reason: impl Into<String>) {
        self.complete(Status::Rejected, Some(reason.into()))
    }

    /// Reports the outcome of the downstream unit this event was turned into (a processor's
    /// output): delivered when it was delivered, otherwise its status and reason.
    pub fn settle_with(self, outcome: &Outcome) {
        match outcome.status {
            Status::Delivered => self.delivered(),
            s => self.complete(s, outcome.reason.clone()),
        }
    }

    /// Gives the event's share of its queue's bytes and of the memory budget back, keeping the
    /// delivery open. A processor does this when it takes an event from its queue: what it
    /// emits takes its own share downstream, so stages in a chain never wait on each other for
    /// budget (the processor's own concurrency bounds what it holds meanwhile).
    pub fn release_memory(&mut self) {
        let (bytes, budget) = std::mem::take(&mut self.held);
        self.sink.give(bytes, budget);
    }

    /// Whether a failure report sends the event to a dead-letter sink.
    pub fn has_dead_letter(&self) -> bool {
        self.dead_letter.is_some()
    }

    /// When the event entered Sluice (for latency).
    pub fn received_at(&self) -> Instant {
        self.unit.started
    }

    /// The name of the stage that sent the event: the source (key under `sources:`), or the
    /// processor whose output it is. A processor that treats its inputs by where they came
    /// from (the Sensor's dependencies) reads it.
    pub fn origin(&self) -> &str {
        &self.unit.origin
    }

    /// Reports the event's outcome. Callable from any thread, including a client library's
    /// callback thread outside the runtime (dead-lettering then runs on the runtime the
    /// pipeline was built on).
    pub fn complete(mut self, status: Status, reason: Option<String>) {
        if status != Status::Delivered {
            if let Some(dl) = self.dead_letter.take() {
                let rt = tokio::runtime::Handle::try_current()
                    .ok()
                    .or_else(|| dl.0.runtime.clone());
                match rt {
                    Some(rt) => return self.dead_letter(rt, *dl, status, reason),
                    None => tracing::error!(
                        sink = %self.sink.name,
                        "no tokio runtime to dead-letter on; the event fails upstream instead"
                    ),
                }
            }
        }
        self.report(status, reason);
    }

    /// Queues the event on the dead-letter sink, which then decides the event's outcome. The
    /// failing sink's hold on the event is released only after the dead-letter delivery holds
    /// it, so the unit cannot resolve in between.
    fn dead_letter(
        mut self,
        rt: tokio::runtime::Handle,
        (dl, mut event): (Arc<DeadLetter>, Event),
        status: Status,
        reason: Option<String>,
    ) {
        self.done = true;
        self.sink.telemetry.failures.increment(1);
        dl.counter.increment(1);
        let reason = reason.unwrap_or_else(|| "no reason given".into());
        tracing::warn!(
            sink = %self.sink.name,
            dead_letter = %dl.target.shared.name,
            event_id = %event.id,
            event_source = %event.source,
            reason = %reason,
            "delivery failed; sending the event to the dead-letter sink"
        );
        event.set_extension(DEAD_LETTER_SINK, &*self.sink.name);
        event.set_extension(DEAD_LETTER_REASON, reason.as_str());
        event.set_extension(
            DEAD_LETTER_STATUS,
            if status == Status::Rejected {
                "rejected"
            } else {
                "failed"
            },
        );
        // This sink's queue-bytes permit stays taken until the dead-letter sink holds the
        // event: failures waiting on a slow dead-letter sink keep counting against this sink's
        // queue, so the pressure reaches the sources instead of piling up in tasks. The budget
        // permit goes now (the dead-letter push takes its own; holding both could deadlock).
        let (bytes, budget) = std::mem::take(&mut self.held);
        self.sink.give(0, budget);
        let bytes_held = BytesHeld {
            sink: self.sink.clone(),
            bytes,
        };
        let guard = DeadLetterGuard {
            unit: self.unit.clone(),
            idx: self.idx,
            armed: true,
        };
        let sink = self.sink.name.clone();
        rt.spawn(async move {
            let mut guard = guard;
            let held = dl
                .target
                .push(Box::new(event), &guard.unit, guard.idx)
                .await;
            drop(bytes_held);
            guard.armed = false;
            if held {
                // The dead-letter delivery now decides the event's outcome.
                guard.unit.report(guard.idx, Status::Delivered, None);
            } else {
                guard.unit.report(
                    guard.idx,
                    status,
                    Some(format!(
                        "sink {sink}: {reason}; the dead-letter sink {} is full \
                         (when_full: drop_newest) and dropped it",
                        dl.target.shared.name
                    )),
                );
            }
        });
    }

    fn report(&mut self, status: Status, reason: Option<String>) {
        if self.done {
            return;
        }
        self.done = true;
        let t = &self.sink.telemetry;
        match status {
            Status::Delivered => {
                t.delivered.increment(1);
                t.latency.record(self.unit.started.elapsed());
            }
            Status::InFlight | Status::Failed | Status::Rejected => t.failures.increment(1),
        }
        let reason = reason.map(|r| format!("sink {}: {r}", self.sink.name));
        self.unit.report(self.idx, status, reason);
    }
}

/// A failing sink's queue bytes, held until the dead-letter sink holds the event.
struct BytesHeld {
    sink: Arc<SinkShared>,
    bytes: u32,
}

impl Drop for BytesHeld {
    fn drop(&mut self) {
        self.sink.give(self.bytes, 0);
    }
}

/// Fails the event if the dead-letter task is dropped (runtime shutdown) before it reported.
struct DeadLetterGuard {
    unit: Arc<Unit>,
    idx: usize,
    armed: bool,
}

impl Drop for DeadLetterGuard {
    fn drop(&mut self) {
        if self.armed {
            self.unit.report(
                self.idx,
                Status::Failed,
                Some("the pipeline stopped while the event was being dead-lettered".into()),
            );
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if !self.done {
            self.report(
                Status::Failed,
                Some("the sink stopped before reporting the event".into()),
            );
        }
        let (bytes, budget) = std::mem::take(&mut self.held);
        self.sink.give(bytes, budget);
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("sink", &self.sink.name)
            .field("event", &self.idx)
            .finish()
    }
}
