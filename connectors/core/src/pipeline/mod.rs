//! source → dedup → router → one bounded queue per sink → sink.
//!
//! There is no central pipeline task: a source's [`SourceSender`] deduplicates, routes and
//! queues on the source's own task, so the pressure of a full queue reaches the source directly
//! and there is no extra hop per event.

pub(crate) mod ack;
mod chain;
mod deadline;
pub(crate) mod dedup;
mod gate;
pub(crate) mod queue;
pub mod window;
pub mod wiring;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

pub use ack::{
    Delivery, Outcome, Status, Then, DEAD_LETTER_REASON, DEAD_LETTER_SINK, DEAD_LETTER_STATUS,
};
pub use chain::hand_off;
pub use queue::{SinkInput, SinkItem, WhenFull};
pub use window::{serve_each, SinkWindow, Step};

use crate::event::Event;
use crate::telemetry::SourceTelemetry;
use ack::{RoutingGuard, Unit};
use dedup::{Check, Dedup};
use queue::{Pushed, SinkQueue};
use wiring::{Match, Unrouted};

/// Per source: the routes that start at it; `static_targets` when none of them filters.
pub(crate) struct SourceRoutes {
    pub(crate) routes: Vec<(Vec<Match>, Vec<usize>)>,
    pub(crate) static_targets: Option<Vec<usize>>,
}

pub(crate) struct Pipeline {
    pub(crate) sinks: Vec<SinkQueue>,
    pub(crate) routes: Vec<SourceRoutes>,
    /// Per stage: the queues it may address by name (`send_to`).
    pub(crate) addressed: Vec<Vec<usize>>,
    pub(crate) dedup: Option<Arc<Dedup>>,
    pub(crate) unrouted: Unrouted,
}

/// How one inbound unit is sent.
#[derive(Clone, Copy, Debug, Default)]
pub struct SendOptions {
    /// Give up waiting for queue room after this long ([`Overloaded`]).
    pub timeout: Option<Duration>,
    /// Skip the dedup window: the events' ids were generated just now and cannot repeat (a
    /// fresh UUIDv7), so the window keeps its room for ids that can repeat.
    pub skip_dedup: bool,
    /// When the upstream lease on this unit ends (SQS visibility, Pub/Sub ack deadline), or
    /// how long its sender waits (the webhook's `ack_timeout`): past it the [`Pending`]
    /// resolves as [`Status::Failed`] with the reason [`DEADLINE_PASSED`], without waiting for
    /// the sinks. The deliveries go on; a redelivery that arrives after they succeeded is
    /// answered as a duplicate. Kept by the sender's deadline table, not a timer per unit.
    pub deadline: Option<tokio::time::Instant>,
    /// The same as `deadline`, given as a time from when the unit is handed over (the instant
    /// its latency is counted from: no clock reading of its own). `deadline` wins when both
    /// are set.
    pub within: Option<Duration>,
}

/// The reason of a [`Pending`] whose [`SendOptions::deadline`] passed before its events were
/// settled.
pub const DEADLINE_PASSED: &str = "the deadline passed before the sinks settled the events";

/// The pipeline refused to take the events within the time given (every queue they need is
/// full): answer "retry later" upstream (HTTP 503 with `Retry-After`, broker nack).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the pipeline is full: downstream cannot keep up; retry later")]
pub struct Overloaded;

/// A source's handle into the pipeline. Cheap to clone.
#[derive(Clone)]
pub struct SourceSender {
    pipeline: Arc<Pipeline>,
    source: usize,
    /// The stage's name, carried by each unit it sends ([`Delivery::origin`]).
    name: Arc<str>,
    /// Dedup scope seed (from the source's name); `None` for a processor's output, which is
    /// never deduplicated again: its inputs were, at ingress, and its output keeps their
    /// identity (a second check would find the input's own entry in flight).
    dedup_seed: Option<u64>,
    telemetry: SourceTelemetry,
    /// The deadlines of this stage's units ([`SendOptions::deadline`]).
    deadlines: Arc<deadline::Deadlines>,
    /// Shared by this stage's senders: the last one dropped tells the queues it feeds.
    _stage: Arc<queue::StageToken>,
}

impl SourceSender {
    /// Hands one inbound unit's events to the pipeline, waiting as long as the sink queues need
    /// (that wait is the backpressure). Returns once every event is queued, deduplicated or
    /// settled; the returned [`Pending`] resolves when all of them are delivered or failed.
    pub async fn send(&self, events: Vec<Event>) -> Pending {
        self.send_boxed(boxed(events)).await
    }

    /// [`SourceSender::send`] for events made in their own allocation: each goes into its
    /// sink's queue as it is, without being moved again (an event is about 250 bytes, and the
    /// queue holds it boxed). A source that makes many events per unit makes them this way.
    pub async fn send_boxed(&self, events: Vec<Box<Event>>) -> Pending {
        match self.start(events, SendOptions::default(), None) {
            Ok(p) => p,
            Err(blocked) => blocked.await,
        }
    }

    /// [`SourceSender::send`] with a bound on the wait for queue space. On `Err(Overloaded)`
    /// nothing was acknowledged: events that were already queued for some sinks resolve as
    /// failed, and their dedup entries are forgotten so the sender's retry goes through.
    pub async fn send_timeout(
        &self,
        events: Vec<Event>,
        timeout: Duration,
    ) -> Result<Pending, Overloaded> {
        self.send_with(
            events,
            SendOptions {
                timeout: Some(timeout),
                ..SendOptions::default()
            },
        )
        .await
    }

    /// [`SourceSender::send`] with options.
    pub async fn send_with(
        &self,
        events: Vec<Event>,
        opts: SendOptions,
    ) -> Result<Pending, Overloaded> {
        // With room in the queues everything is queued here, without a future or a timer.
        let blocked = match self.start(boxed(events), opts, None) {
            Ok(p) => return Ok(p),
            Err(b) => b,
        };
        match opts.timeout {
            None => Ok(blocked.await),
            Some(t) => tokio::time::timeout(t, blocked)
                .await
                .map_err(|_| Overloaded),
        }
    }

    /// The queue named `name` (a sink or processor) when this stage may address it
    /// ([`wiring::PipelineSpec::addressed`]); `None` otherwise.
    pub fn target(&self, name: &str) -> Option<Target> {
        let p = &*self.pipeline;
        p.addressed
            .get(self.source)?
            .iter()
            .copied()
            .find(|&q| &*p.sinks[q].shared.name == name)
            .map(|queue| Target {
                stage: self.source,
                queue,
            })
    }

    /// Hands one unit's events to one addressed queue, past the routes (and, as every
    /// processor output, past dedup), waiting for room as [`SourceSender::send`] does.
    pub async fn send_to(&self, target: Target, events: Vec<Event>) -> Pending {
        if target.stage != self.source {
            // A target resolved by another stage's sender: refused, never queued.
            let unit = Unit::new(events.len(), None, self.name.clone());
            let pending = Pending::new(unit.clone());
            let guard = RoutingGuard::new(unit);
            for idx in 0..events.len() {
                guard.unit.settle(
                    idx,
                    Status::Rejected,
                    Some("send_to: a target of another stage".into()),
                    false,
                );
            }
            guard.finish();
            return pending;
        }
        match self.start(boxed(events), SendOptions::default(), Some(target.queue)) {
            Ok(p) => p,
            Err(blocked) => blocked.await,
        }
    }

    /// Queues one event for `target` now, with no future and no task waiting on it: `then` is
    /// called with its outcome once the sink settled it, in the task that settled it, so it
    /// must be short and must not block. That may be the caller's own task before this
    /// returns (a sink that is not running, a `drop_newest` queue that dropped the event, a
    /// sink that settled it at once on another thread): hold no lock `then` takes while
    /// calling this. The event is not deduplicated (a processor's output never is). Hands
    /// both back when `target`'s queue has no room now (`block`) or `target` is not this
    /// stage's: send them with [`SourceSender::send_to`] then, which waits for room or
    /// refuses.
    #[allow(clippy::result_large_err)] // the event itself is handed back, not an error
    pub fn try_send_to_then(
        &self,
        target: Target,
        event: Event,
        then: Then,
    ) -> Result<(), (Event, Then)> {
        if target.stage != self.source {
            return Err((event, then));
        }
        // The continuation is set as the unit is made: no lock taken for it afterwards.
        let unit = Unit::with_then(self.name.clone(), then);
        let guard = RoutingGuard::new(unit);
        let q = &self.pipeline.sinks[target.queue];
        match q.try_push(Box::new(event), &guard.unit, 0) {
            Ok(Pushed::Queued) => {}
            // No delivery holds it: end it here.
            Ok(Pushed::Dropped | Pushed::Failed) => guard.unit.close_event(0),
            // Nothing was queued: the unit ends here, unseen (its continuation taken back
            // first, so that ending it calls nothing).
            Err(event) => {
                let then = guard.unit.take_then().expect("set when the unit was made");
                return Err((*event, then));
            }
        }
        self.telemetry.received.increment(1);
        guard.finish();
        Ok(())
    }

    /// Routes and queues a unit's events as far as the queues have room now. `Ok`: all of them
    /// are queued (or settled); `Err`: a `block` queue was full, and the returned future queues
    /// the rest, waiting for room (dropping it fails what was not queued).
    // Boxed on purpose: each event goes into its queue in the allocation it came in.
    #[allow(clippy::vec_box)]
    fn start(
        &self,
        events: Vec<Box<Event>>,
        opts: SendOptions,
        target: Option<usize>,
    ) -> Result<Pending, Blocked<'_>> {
        let n = events.len();
        let dedup = match (opts.skip_dedup, self.dedup_seed, &self.pipeline.dedup) {
            (false, Some(seed), Some(d)) => Some((d, seed)),
            _ => None,
        };
        let unit = Unit::new(n, dedup.map(|(d, _)| d.clone()), self.name.clone());
        let deadline = opts.deadline.or_else(|| {
            let within = opts.within?;
            Some(tokio::time::Instant::from_std(unit.started) + within)
        });
        let pending = match deadline {
            Some(at) => Pending::watched(unit.clone(), &self.deadlines, at),
            None => Pending::new(unit.clone()),
        };
        // A batch's dedup keys first, so that each check can start the load of the set a few
        // events ahead of it ([`PREFETCH_AHEAD`]): the checks overlap their cache misses
        // instead of waiting for one after the other.
        let keys: Vec<u128> = match dedup {
            Some((d, seed)) if n > 1 => events
                .iter()
                .map(|e| d.key(seed, &e.source, &e.id))
                .collect(),
            _ => Vec::new(),
        };
        if let Some((d, _)) = dedup {
            for &key in keys.iter().take(PREFETCH_AHEAD) {
                d.prefetch(key);
            }
        }
        let r = Routing {
            guard: RoutingGuard::new(unit),
            dedup,
            keys,
            now_ms: None,
            target,
            targets: Vec::new(),
        };
        self.telemetry.received.increment(n as u64);
        continue_start(self, r, pending, events.into_iter().enumerate())
    }

    /// Routing and dedup of event `idx`. Returns true when the event must be queued (the
    /// queues are in `r.list`), false when it was settled here (unrouted, a duplicate).
    fn route(&self, r: &mut Routing<'_>, idx: usize, event: &Event) -> bool {
        let p = &*self.pipeline;
        // Route first: an unrouted event records nothing in the dedup window, so a later copy
        // that a route takes is not mistaken for an already delivered one.
        let routes = &p.routes[self.source];
        let any = match (r.target, &routes.static_targets) {
            (Some(_), _) => true,
            (None, Some(t)) => !t.is_empty(),
            (None, None) => {
                r.targets.clear();
                for (m, to) in &routes.routes {
                    if m.iter().all(|m| m.matches(event)) {
                        r.targets.extend_from_slice(to);
                    }
                }
                r.targets.sort_unstable();
                r.targets.dedup();
                !r.targets.is_empty()
            }
        };
        let unit = &r.guard.unit;
        if !any {
            self.telemetry.unrouted.increment(1);
            if p.unrouted == Unrouted::Reject {
                unit.settle(
                    idx,
                    Status::Rejected,
                    Some("no route takes this event".into()),
                    false,
                );
            }
            return false;
        }
        if let Some((dedup, seed)) = r.dedup {
            if let Some(&ahead) = r.keys.get(idx + PREFETCH_AHEAD) {
                dedup.prefetch(ahead);
            }
            let key = match r.keys.get(idx) {
                Some(&k) => k,
                None => dedup.key(seed, &event.source, &event.id),
            };
            // One clock reading for the events routed together.
            let now = *r.now_ms.get_or_insert_with(dedup::now_ms);
            match dedup.check_at(key, now) {
                Check::New => unit.set_key(idx, key, now),
                Check::Delivered => {
                    self.telemetry.deduplicated.increment(1);
                    unit.settle(idx, Status::Delivered, None, true);
                    return false;
                }
                // A repeat inside this unit (a batch carrying one id twice): the first copy's
                // outcome is this unit's outcome too, so the repeat is a plain duplicate.
                Check::InFlight if unit.recorded(key) => {
                    self.telemetry.deduplicated.increment(1);
                    unit.settle(idx, Status::Delivered, None, true);
                    return false;
                }
                Check::InFlight => {
                    self.telemetry.deduplicated.increment(1);
                    unit.settle(
                        idx,
                        Status::InFlight,
                        Some(format!(
                            "event {:?} from {:?} is still being delivered; retry later",
                            event.id, event.source
                        )),
                        true,
                    );
                    return false;
                }
            }
        }
        true
    }

    /// This source's standard counters.
    pub fn telemetry(&self) -> &SourceTelemetry {
        &self.telemetry
    }
}

/// A queue a stage addresses by name ([`SourceSender::target`]); only that stage's senders
/// can send to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    stage: usize,
    queue: usize,
}

/// A unit's routing state while its events are queued.
struct Routing<'a> {
    guard: RoutingGuard,
    dedup: Option<(&'a Arc<Dedup>, u64)>,
    /// The events' dedup keys, by index, when computed ahead (a batch); else empty.
    keys: Vec<u128>,
    /// The dedup clock of the events routed without waiting in between (read once; cleared
    /// when the unit waits for queue room).
    now_ms: Option<u64>,
    /// An addressed queue ([`SourceSender::send_to`]): every event goes there, past the routes.
    target: Option<usize>,
    /// The queues of the current event when routes filter.
    targets: Vec<usize>,
}

/// The queues the current event goes to (after [`SourceSender::route`] said it goes): the
/// addressed one, the source's static list, or what the filtering routes chose.
fn queues_of<'p>(
    target: &'p Option<usize>,
    targets: &'p [usize],
    p: &'p Pipeline,
    source: usize,
) -> &'p [usize] {
    match (target, &p.routes[source].static_targets) {
        (Some(t), _) => std::slice::from_ref(t),
        (None, Some(t)) => t,
        (None, None) => targets,
    }
}

/// How many events ahead of its check a batch's event has the load of its dedup set started.
/// All of a batch's loads started at once (up to 256 events, two cache lines each) outnumber
/// the loads a core keeps in flight, so the later ones waited for the earlier ones.
const PREFETCH_AHEAD: usize = 8;

type Events = std::iter::Enumerate<std::vec::IntoIter<Box<Event>>>;

/// Each event in its own allocation, as the queues hold it.
#[allow(clippy::vec_box)]
fn boxed(events: Vec<Event>) -> Vec<Box<Event>> {
    events.into_iter().map(Box::new).collect()
}

/// Continues [`SourceSender::start`] after the event before `events` was queued.
fn continue_start<'a>(
    s: &'a SourceSender,
    mut r: Routing<'a>,
    pending: Pending,
    mut events: Events,
) -> Result<Pending, Blocked<'a>> {
    while let Some((idx, event)) = events.next() {
        if !s.route(&mut r, idx, &event) {
            continue;
        }
        let p = &*s.pipeline;
        let list = queues_of(&r.target, &r.targets, p, s.source);
        if let [q] = *list {
            // One queue: nothing to hold while it is pushed, unless it has to wait.
            match p.sinks[q].try_push(event, &r.guard.unit, idx) {
                Ok(Pushed::Queued) => continue,
                // No delivery holds it: end it here (its dedup entry).
                Ok(Pushed::Dropped | Pushed::Failed) => {
                    r.guard.unit.close_event(idx);
                    continue;
                }
                Err(ev) => {
                    r.guard.begin_event(idx);
                    return Err(Blocked::new(s, r, pending, events, idx, ev, vec![q], None));
                }
            }
        }
        // Several: the event is held until every queue has it, so that one sink's quick
        // delivery does not settle it (and its dedup entry) before the others got it.
        r.guard.begin_event(idx);
        let mut original = Some(event);
        for (i, &q) in list.iter().enumerate() {
            let last = i + 1 == list.len();
            let ev = if last {
                original
                    .take()
                    .expect("the original is kept for the last queue")
            } else {
                original
                    .as_ref()
                    .expect("kept until the last queue")
                    .clone()
            };
            if let Err(ev) = p.sinks[q].try_push(ev, &r.guard.unit, idx) {
                let rest = list[i..].to_vec();
                return Err(Blocked::new(s, r, pending, events, idx, ev, rest, original));
            }
        }
        r.guard.end_event();
    }
    r.guard.finish();
    Ok(pending)
}

/// The rest of a unit whose events did not all find room at once: queues them, waiting for
/// room, and resolves to the unit's [`Pending`]. Dropped before it finished (a send timeout),
/// the event being queued fails and the unit resolves with what was queued failing too.
pub(crate) struct Blocked<'a> {
    fut: Pin<Box<dyn Future<Output = Pending> + Send + 'a>>,
}

impl<'a> Blocked<'a> {
    /// `ev` is event `idx`'s copy for `queues[0]`; `original` is the event for the queues after
    /// it (`None` when `queues[0]` is the last).
    #[allow(clippy::too_many_arguments)]
    fn new(
        s: &'a SourceSender,
        mut r: Routing<'a>,
        pending: Pending,
        events: Events,
        idx: usize,
        ev: Box<Event>,
        queues: Vec<usize>,
        original: Option<Box<Event>>,
    ) -> Self {
        // Resolves to the unit's `Pending` (itself a future) once everything is queued.
        #[allow(clippy::async_yields_async)]
        let fut = async move {
            let p = &*s.pipeline;
            p.sinks[queues[0]].push(ev, &r.guard.unit, idx).await;
            push_all(p, &r.guard, idx, &queues[1..], original).await;
            r.guard.end_event();
            for (idx, event) in events {
                // It may have waited: the next check reads the clock again.
                r.now_ms = None;
                if !s.route(&mut r, idx, &event) {
                    continue;
                }
                let list = queues_of(&r.target, &r.targets, p, s.source).to_vec();
                r.guard.begin_event(idx);
                push_all(p, &r.guard, idx, &list, Some(event)).await;
                r.guard.end_event();
            }
            r.guard.finish();
            pending
        };
        Blocked { fut: Box::pin(fut) }
    }
}

/// Queues `event` (when given) to each of `queues`, a copy to all but the last.
async fn push_all(
    p: &Pipeline,
    guard: &RoutingGuard,
    idx: usize,
    queues: &[usize],
    event: Option<Box<Event>>,
) {
    let Some(event) = event else { return };
    if let Some((&last, rest)) = queues.split_last() {
        for &q in rest {
            p.sinks[q].push(event.clone(), &guard.unit, idx).await;
        }
        p.sinks[last].push(event, &guard.unit, idx).await;
    }
}

impl Future for Blocked<'_> {
    type Output = Pending;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Pending> {
        self.fut.as_mut().poll(cx)
    }
}

/// Resolves to the [`Outcome`] of one inbound unit.
pub struct Pending {
    unit: Arc<Unit>,
    /// The deadline table and ticket watching this unit, while it is.
    watch: Option<(Arc<deadline::Deadlines>, deadline::Ticket)>,
}

impl Pending {
    pub(crate) fn new(unit: Arc<Unit>) -> Self {
        Pending { unit, watch: None }
    }

    fn watched(
        unit: Arc<Unit>,
        table: &Arc<deadline::Deadlines>,
        at: tokio::time::Instant,
    ) -> Self {
        let slot = table.insert(at, &unit);
        Pending {
            unit,
            watch: Some((table.clone(), slot)),
        }
    }
}

impl Future for Pending {
    type Output = Outcome;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        match self.unit.poll_outcome(cx) {
            Some(o) => {
                if let Some((table, slot)) = self.watch.take() {
                    table.remove(slot);
                }
                Poll::Ready(o)
            }
            None => Poll::Pending,
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some((table, slot)) = self.watch.take() {
            table.remove(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::wiring::*;
    use super::*;

    fn spec(sinks: &[(&str, usize, WhenFull)], routes: Vec<RouteSpec>) -> PipelineSpec {
        PipelineSpec {
            sources: vec!["src".into()],
            sinks: sinks
                .iter()
                .map(|(n, q, w)| SinkSpec {
                    name: (*n).into(),
                    queue_events: *q,
                    queue_bytes: 1 << 20,
                    when_full: *w,
                    dead_letter: None,
                })
                .collect(),
            processors: Vec::new(),
            routes,
            addressed: Vec::new(),
            dedup: Some(DedupConfig {
                window: Duration::from_secs(60),
                capacity: 1000,
                scope: DedupScope::Source,
            }),
            dedup_persistent: false,
            memory_budget: 1 << 30,
            unrouted: Unrouted::Ack,
        }
    }

    fn all_to(sinks: Vec<usize>) -> Vec<RouteSpec> {
        vec![RouteSpec {
            from: vec![0],
            to: sinks,
            matches: vec![],
        }]
    }

    fn ev(id: &str) -> Event {
        Event::new(id, "/s", "t")
    }

    #[tokio::test]
    async fn delivered_only_when_every_sink_delivered() {
        let mut b = build(&spec(
            &[("a", 10, WhenFull::Block), ("b", 10, WhenFull::Block)],
            all_to(vec![0, 1]),
        ));
        let pending = b.senders[0].send(vec![ev("1")]).await;
        let a = b.inputs[0].recv().await.unwrap();
        let bb = b.inputs[1].recv().await.unwrap();
        a.delivery.delivered();
        let mut pending = Box::pin(pending);
        assert!(futures_util::poll!(pending.as_mut()).is_pending());
        bb.delivery.failed("boom");
        let out = pending.await;
        assert_eq!(out.status, Status::Failed);
        assert!(out.reason.unwrap().contains("sink b: boom"));
    }

    #[tokio::test]
    async fn a_unit_of_several_events_reports_each_ones_status() {
        let mut b = build(&spec(&[("a", 10, WhenFull::Block)], all_to(vec![0])));
        let s = b.senders[0].clone();
        // "1" is delivered earlier, so its copy here is a duplicate.
        let first = s.send(vec![ev("1")]).await;
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        assert!(first.await.is_delivered());
        let pending = s
            .send(vec![ev("1"), ev("2"), ev("3"), ev("4"), ev("5")])
            .await;
        for (id, how) in [("2", 'd'), ("3", 'f'), ("4", 'r'), ("5", 'd')] {
            let item = b.inputs[0].recv().await.unwrap();
            assert_eq!(item.event.id, id);
            match how {
                'd' => item.delivery.delivered(),
                'f' => item.delivery.failed("boom"),
                _ => item.delivery.rejected("bad"),
            }
        }
        let out = pending.await;
        assert_eq!(out.status, Status::Rejected, "the worst");
        assert_eq!(
            (0..5).map(|i| out.status_of(i)).collect::<Vec<_>>(),
            [
                Status::Delivered,
                Status::Delivered,
                Status::Failed,
                Status::Rejected,
                Status::Delivered
            ]
        );
        assert_eq!(out.duplicates, 1);
        // A unit that was delivered, or of one event, carries no list: every event has `status`.
        let p = s.send(vec![ev("6"), ev("7")]).await;
        for _ in 0..2 {
            b.inputs[0].recv().await.unwrap().delivery.delivered();
        }
        let out = p.await;
        assert!(out.each.is_empty() && out.status_of(1) == Status::Delivered);
        let p = s.send(vec![ev("8")]).await;
        b.inputs[0].recv().await.unwrap().delivery.failed("x");
        let out = p.await;
        assert!(out.each.is_empty() && out.status_of(0) == Status::Failed);
    }

    fn with_dead_letter() -> Built {
        let mut sp = spec(
            &[("a", 10, WhenFull::Block), ("dl", 10, WhenFull::Block)],
            all_to(vec![0]),
        );
        sp.sinks[0].dead_letter = Some(1);
        build(&sp)
    }

    #[tokio::test]
    async fn failed_event_goes_to_the_dead_letter_sink_and_counts_as_handled() {
        let mut b = with_dead_letter();
        let pending = b.senders[0].send(vec![ev("1")]).await;
        let a = b.inputs[0].recv().await.unwrap();
        assert!(a.delivery.has_dead_letter());
        a.delivery.rejected("HTTP 400: bad field");
        let dl = b.inputs[1].recv().await.unwrap();
        assert_eq!(dl.event.id, "1");
        let ext = |n: &str| dl.event.extension(n).map(|v| v.to_canonical().into_owned());
        assert_eq!(ext(ack::DEAD_LETTER_SINK).as_deref(), Some("a"));
        assert_eq!(ext(ack::DEAD_LETTER_STATUS).as_deref(), Some("rejected"));
        assert_eq!(
            ext(ack::DEAD_LETTER_REASON).as_deref(),
            Some("HTTP 400: bad field")
        );
        let mut pending = Box::pin(pending);
        tokio::task::yield_now().await;
        assert!(
            futures_util::poll!(pending.as_mut()).is_pending(),
            "not settled before the dead-letter sink reports"
        );
        dl.delivery.delivered();
        assert!(pending.await.is_delivered());
    }

    #[tokio::test]
    async fn dead_letter_failure_goes_back_upstream() {
        let mut b = with_dead_letter();
        let pending = b.senders[0].send(vec![ev("1"), ev("2")]).await;
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        b.inputs[0].recv().await.unwrap().delivery.failed("timeout");
        let dl = b.inputs[1].recv().await.unwrap();
        assert_eq!(dl.event.id, "2");
        dl.delivery.failed("also down");
        let out = pending.await;
        assert_eq!(out.status, Status::Failed);
        assert!(out.reason.unwrap().contains("sink dl: also down"));
        // Not delivered anywhere: the retry is not a duplicate.
        let again = b.senders[0].send(vec![ev("2")]).await;
        let a = b.inputs[0].recv().await.unwrap();
        a.delivery.delivered();
        assert!(again.await.is_delivered());
    }

    #[tokio::test]
    async fn dead_letter_sink_that_is_gone_fails_the_event() {
        let mut b = with_dead_letter();
        let dl_input = b.inputs.pop().unwrap();
        drop(dl_input);
        let pending = b.senders[0].send(vec![ev("1")]).await;
        b.inputs[0].recv().await.unwrap().delivery.failed("boom");
        let out = pending.await;
        assert_eq!(out.status, Status::Failed);
        assert!(out.reason.unwrap().contains("sink dl is not running"));
    }

    #[tokio::test]
    async fn a_full_drop_newest_dead_letter_sink_fails_the_event_upstream() {
        let mut sp = spec(
            &[("a", 10, WhenFull::Block), ("dl", 1, WhenFull::DropNewest)],
            all_to(vec![0]),
        );
        sp.sinks[0].dead_letter = Some(1);
        let mut b = build(&sp);
        let pending = b.senders[0].send(vec![ev("1"), ev("2")]).await;
        b.inputs[0].recv().await.unwrap().delivery.failed("boom 1");
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        // The dead-letter queue holds one event: the second failure finds it full.
        b.inputs[0].recv().await.unwrap().delivery.failed("boom 2");
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        let mut pending = Box::pin(pending);
        assert!(futures_util::poll!(pending.as_mut()).is_pending());
        let dl = b.inputs[1].recv().await.unwrap();
        assert_eq!(dl.event.id, "1");
        dl.delivery.delivered();
        let out = pending.await;
        assert_eq!(out.status, Status::Failed, "a dropped event is not handled");
        let reason = out.reason.unwrap();
        assert!(
            reason.contains("sink a: boom 2") && reason.contains("dead-letter sink dl is full"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn events_waiting_for_the_dead_letter_sink_keep_the_failing_sinks_queue_taken() {
        let mut sp = spec(
            &[("a", 10, WhenFull::Block), ("dl", 10, WhenFull::Block)],
            all_to(vec![0]),
        );
        sp.sinks[0].queue_bytes = 1000;
        sp.sinks[1].queue_bytes = 1000;
        sp.sinks[0].dead_letter = Some(1);
        let mut b = build(&sp);
        let big = |id: &str| ev(id).with_json(bytes::Bytes::from(vec![b'1'; 900]));
        // The first event fills the dead-letter queue; the second waits for room there.
        let first = b.senders[0].send(vec![big("1")]).await;
        b.inputs[0].recv().await.unwrap().delivery.failed("boom");
        let second = b.senders[0].send(vec![big("2")]).await;
        b.inputs[0].recv().await.unwrap().delivery.failed("boom");
        tokio::task::yield_now().await;
        // While "2" waits for the dead-letter sink, it still holds sink a's queue bytes: a
        // third event cannot enter a's queue (the pressure reaches the source).
        let third = b.senders[0].send(vec![big("3")]);
        let mut third = Box::pin(third);
        for _ in 0..10 {
            assert!(futures_util::poll!(third.as_mut()).is_pending());
            tokio::task::yield_now().await;
        }
        let dl1 = b.inputs[1].recv().await.unwrap();
        assert_eq!(dl1.event.id, "1");
        dl1.delivery.delivered();
        let third = third.await;
        let dl2 = b.inputs[1].recv().await.unwrap();
        assert_eq!(dl2.event.id, "2");
        dl2.delivery.delivered();
        assert!(first.await.is_delivered());
        assert!(second.await.is_delivered());
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        assert!(third.await.is_delivered());
    }

    #[tokio::test]
    async fn dead_letter_queue_closes_after_the_failing_sink_is_done() {
        let mut b = with_dead_letter();
        let pending = b.senders[0].send(vec![ev("1")]).await;
        b.senders.clear();
        let a = b.inputs[0].recv().await.unwrap();
        assert!(b.inputs[0].recv().await.is_none());
        a.delivery.failed("boom");
        // The dead-letter sink still gets the event, then sees its input end.
        let dl = b.inputs[1].recv().await.unwrap();
        dl.delivery.delivered();
        assert!(b.inputs[1].recv().await.is_none());
        assert!(pending.await.is_delivered());
    }

    #[tokio::test]
    async fn dropped_delivery_counts_as_failed() {
        let mut b = build(&spec(&[("a", 10, WhenFull::Block)], all_to(vec![0])));
        let pending = b.senders[0].send(vec![ev("1")]).await;
        drop(b.inputs[0].recv().await.unwrap());
        assert_eq!(pending.await.status, Status::Failed);
    }

    #[tokio::test]
    async fn duplicates_are_answered_and_not_forwarded() {
        let mut b = build(&spec(&[("a", 10, WhenFull::Block)], all_to(vec![0])));
        let s = &b.senders[0];
        let p1 = s.send(vec![ev("1")]).await;
        // Still in flight: the duplicate is refused for now, not forwarded.
        let p2 = s.send(vec![ev("1")]).await;
        let out2 = p2.await;
        assert_eq!((out2.status, out2.duplicates), (Status::InFlight, 1));
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        assert!(p1.await.is_delivered());
        let out3 = s.send(vec![ev("1")]).await.await;
        assert_eq!((out3.status, out3.duplicates), (Status::Delivered, 1));
        assert!(b.inputs[0].try_recv().is_none(), "nothing forwarded twice");
    }

    #[tokio::test]
    async fn skip_dedup_skips_the_dedup_window() {
        let mut b = build(&spec(&[("a", 10, WhenFull::Block)], all_to(vec![0])));
        let fresh = SendOptions {
            skip_dedup: true,
            ..SendOptions::default()
        };
        let p = b.senders[0]
            .send_with(vec![ev("u-1")], fresh)
            .await
            .unwrap();
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        assert!(p.await.is_delivered());
        assert!(b.dedup.as_ref().unwrap().is_empty(), "nothing recorded");
    }

    #[tokio::test]
    async fn failed_events_can_be_retried() {
        let mut b = build(&spec(&[("a", 10, WhenFull::Block)], all_to(vec![0])));
        let s = &b.senders[0];
        let p = s.send(vec![ev("1")]).await;
        b.inputs[0].recv().await.unwrap().delivery.failed("x");
        assert_eq!(p.await.status, Status::Failed);
        let p = s.send(vec![ev("1")]).await;
        let item = b.inputs[0].recv().await.expect("the retry is forwarded");
        item.delivery.delivered();
        assert!(p.await.is_delivered());
    }

    #[tokio::test]
    async fn full_queue_blocks_and_times_out_then_retry_works() {
        let mut b = build(&spec(&[("a", 1, WhenFull::Block)], all_to(vec![0])));
        let s = b.senders[0].clone();
        let p1 = s.send(vec![ev("1")]).await;
        let r = s
            .send_timeout(vec![ev("2")], Duration::from_millis(50))
            .await;
        assert!(r.is_err(), "queue of one is full");
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        assert!(p1.await.is_delivered());
        // The timed-out event was forgotten by dedup: the retry goes through.
        let p2 = s
            .send_timeout(vec![ev("2")], Duration::from_millis(500))
            .await
            .unwrap();
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        assert!(p2.await.is_delivered());
    }

    #[tokio::test]
    async fn a_batch_that_meets_a_full_queue_midway_waits_and_keeps_its_order() {
        // a holds one event, b ten: the second event of the batch finds a full.
        let mut b = build(&spec(
            &[("a", 1, WhenFull::Block), ("b", 10, WhenFull::Block)],
            all_to(vec![0, 1]),
        ));
        let s = b.senders[0].clone();
        // The send waits for room on its own task; its result is the unit's `Pending`.
        #[allow(clippy::async_yields_async)]
        let send = tokio::spawn(async move { s.send(vec![ev("1"), ev("2"), ev("3")]).await });
        let mut got = Vec::new();
        let mut items = Vec::new();
        for _ in 0..3 {
            let item = tokio::time::timeout(Duration::from_secs(2), b.inputs[0].recv())
                .await
                .expect("a gets each event once room appears")
                .unwrap();
            got.push(item.event.id.clone());
            items.push(item.delivery);
        }
        assert_eq!(got, ["1", "2", "3"]);
        let pending = send.await.unwrap();
        let mut ids = Vec::new();
        while let Some(item) = b.inputs[1].try_recv() {
            ids.push(item.event.id.clone());
            item.delivery.delivered();
        }
        assert_eq!(ids, ["1", "2", "3"], "b got a copy of each, in order");
        let mut pending = Box::pin(pending);
        assert!(futures_util::poll!(pending.as_mut()).is_pending());
        items.into_iter().for_each(Delivery::delivered);
        let out = pending.await;
        assert_eq!((out.status, out.events), (Status::Delivered, 3));
    }

    #[tokio::test]
    async fn deliveries_reported_together_settle_each_unit_and_give_their_bytes_back() {
        let mut b = build(&spec(
            &[("a", 10, WhenFull::Block), ("b", 10, WhenFull::Block)],
            all_to(vec![0, 1]),
        ));
        let s = b.senders[0].clone();
        let p1 = s.send(vec![ev("1"), ev("2")]).await;
        let p2 = s.send(vec![ev("3")]).await;
        let mut items: Vec<SinkItem> = std::iter::from_fn(|| b.inputs[0].try_recv()).collect();
        assert_eq!(items.len(), 3);
        assert!(b.inputs[0].held().0 > 0, "queued events hold bytes");
        // Out of queue order, so that one unit's deliveries form two runs.
        items.swap(1, 2);
        let ids: Vec<String> = items.iter().map(|i| i.event.id.to_string()).collect();
        assert_eq!(ids, ["1", "3", "2"]);
        Delivery::delivered_all(items.into_iter().map(|i| i.delivery));
        assert_eq!(b.inputs[0].held().0, 0, "every event's bytes are back");
        let (mut p1, mut p2) = (Box::pin(p1), Box::pin(p2));
        assert!(
            futures_util::poll!(p1.as_mut()).is_pending(),
            "b holds them"
        );
        assert!(
            futures_util::poll!(p2.as_mut()).is_pending(),
            "b holds them"
        );
        let copies: Vec<Delivery> = std::iter::from_fn(|| b.inputs[1].try_recv())
            .map(|i| i.delivery)
            .collect();
        Delivery::delivered_all(copies);
        assert_eq!(b.inputs[1].held(), (0, 0));
        let (o1, o2) = (p1.await, p2.await);
        assert_eq!((o1.status, o1.events), (Status::Delivered, 2));
        assert_eq!((o2.status, o2.events), (Status::Delivered, 1));
        // Each event's dedup entry was confirmed as delivered: the same events again are
        // duplicates, answered delivered without reaching a sink.
        let again = s.send(vec![ev("1"), ev("2"), ev("3")]).await.await;
        assert_eq!((again.status, again.duplicates), (Status::Delivered, 3));
        assert!(b.inputs[0].try_recv().is_none());
    }

    #[tokio::test]
    async fn a_batch_report_cut_short_by_a_panic_fails_what_it_had_not_reported() {
        let mut b = build(&spec(&[("a", 10, WhenFull::Block)], all_to(vec![0])));
        let s = b.senders[0].clone();
        let p = s.send(vec![ev("1"), ev("2"), ev("3")]).await;
        let items: Vec<SinkItem> = std::iter::from_fn(|| b.inputs[0].try_recv()).collect();
        assert_eq!(items.len(), 3);
        let mut deliveries = items.into_iter().map(|i| i.delivery);
        let taken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut n = 0;
            Delivery::delivered_all(std::iter::from_fn(|| {
                n += 1;
                assert!(n < 3, "the sink's iterator panics at its third item");
                deliveries.next()
            }))
        }));
        assert!(taken.is_err());
        drop(deliveries);
        let out = tokio::time::timeout(Duration::from_secs(2), p)
            .await
            .expect("every event was reported");
        assert_eq!(out.status, Status::Failed, "nothing was reported delivered");
        assert_eq!(b.inputs[0].held(), (0, 0), "every event's bytes are back");
    }

    #[tokio::test]
    async fn a_unit_given_up_while_blocked_fails_although_some_copies_were_queued() {
        // The copy for a is queued, b (one slot, taken) has no room for the original.
        let mut b = build(&spec(
            &[("a", 10, WhenFull::Block), ("b", 1, WhenFull::Block)],
            all_to(vec![0, 1]),
        ));
        let s = b.senders[0].clone();
        let p1 = s.send(vec![ev("1")]).await;
        let r = s
            .send_timeout(vec![ev("2")], Duration::from_millis(50))
            .await;
        assert!(r.is_err(), "b is full");
        for input in &mut b.inputs {
            while let Some(item) = input.try_recv() {
                item.delivery.delivered();
            }
        }
        assert!(p1.await.is_delivered());
        // The copy a got was delivered, but the unit was given up: its dedup entry is gone,
        // so the retry is forwarded to both sinks again.
        let p2 = s.send(vec![ev("2")]).await;
        for input in &mut b.inputs {
            let item = input.try_recv().expect("the retry reaches every sink");
            assert_eq!(item.event.id, "2");
            item.delivery.delivered();
        }
        let out = p2.await;
        assert_eq!((out.status, out.duplicates), (Status::Delivered, 0));
    }

    #[tokio::test]
    async fn an_event_dropped_or_failed_without_a_delivery_ends_its_dedup_entry() {
        // One drop_newest queue of one slot: "2" is dropped by policy (answered delivered), so a
        // copy of it is a duplicate, not "still being delivered".
        let mut b = build(&spec(&[("a", 1, WhenFull::DropNewest)], all_to(vec![0])));
        let s = b.senders[0].clone();
        let p1 = s.send(vec![ev("1")]).await;
        assert!(s.send(vec![ev("2")]).await.await.is_delivered());
        let again = s.send(vec![ev("2")]).await.await;
        assert_eq!((again.status, again.duplicates), (Status::Delivered, 1));
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        assert!(p1.await.is_delivered());
        // A sink that is gone fails the event, and its retry is tried again (not a duplicate).
        drop(b.inputs.remove(0));
        for _ in 0..2 {
            let out = s.send(vec![ev("3")]).await.await;
            assert_eq!((out.status, out.duplicates), (Status::Failed, 0));
        }
    }

    #[tokio::test]
    async fn drop_newest_sheds_without_blocking_others() {
        let mut b = build(&spec(
            &[
                ("slow", 1, WhenFull::DropNewest),
                ("fast", 10, WhenFull::Block),
            ],
            all_to(vec![0, 1]),
        ));
        let s = b.senders[0].clone();
        let p1 = s.send(vec![ev("1")]).await;
        let p2 = s
            .send_timeout(vec![ev("2")], Duration::from_millis(200))
            .await
            .unwrap();
        // "fast" gets both; "slow" got only the first.
        for _ in 0..2 {
            b.inputs[1].recv().await.unwrap().delivery.delivered();
        }
        assert!(p2.await.is_delivered(), "a drop by policy is not a failure");
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        assert!(p1.await.is_delivered());
        assert!(b.inputs[0].try_recv().is_none());
    }

    #[tokio::test]
    async fn a_dead_sink_fails_fast() {
        let mut b = build(&spec(
            &[("dead", 1, WhenFull::Block), ("ok", 10, WhenFull::Block)],
            all_to(vec![0, 1]),
        ));
        let dead = b.inputs.remove(0);
        drop(dead);
        let p = b.senders[0]
            .send_timeout(vec![ev("1")], Duration::from_millis(200))
            .await
            .unwrap();
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        let out = p.await;
        assert_eq!(out.status, Status::Failed);
        assert!(out.reason.unwrap().contains("dead"));
    }

    #[tokio::test]
    async fn routes_filter_on_type_and_unrouted_policy() {
        let routes = vec![
            RouteSpec {
                from: vec![0],
                to: vec![0],
                matches: vec![Match::Prefix(Attr::Type, "com.a.".into())],
            },
            RouteSpec {
                from: vec![0],
                to: vec![1],
                matches: vec![Match::Exact(Attr::Subject, "x".into())],
            },
        ];
        let mut sp = spec(
            &[("a", 10, WhenFull::Block), ("b", 10, WhenFull::Block)],
            routes,
        );
        sp.unrouted = Unrouted::Reject;
        let mut b = build(&sp);
        let s = &b.senders[0];
        let p = s
            .send(vec![
                Event::new("1", "/s", "com.a.created").with_subject("x")
            ])
            .await;
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        b.inputs[1].recv().await.unwrap().delivery.delivered();
        assert!(p.await.is_delivered());
        let out = s
            .send(vec![Event::new("2", "/s", "com.b.created")])
            .await
            .await;
        assert_eq!(out.status, Status::Rejected);
    }

    #[tokio::test]
    async fn memory_budget_bounds_all_queues_together() {
        let mut sp = spec(
            &[("a", 1000, WhenFull::Block), ("b", 1000, WhenFull::Block)],
            vec![],
        );
        sp.sources = vec!["x".into(), "y".into()];
        sp.routes = vec![
            RouteSpec {
                from: vec![0],
                to: vec![0],
                matches: vec![],
            },
            RouteSpec {
                from: vec![1],
                to: vec![1],
                matches: vec![],
            },
        ];
        let big = || {
            Event::new(uuid::Uuid::new_v4().to_string(), "/s", "t")
                .with_json(bytes::Bytes::from(vec![b'1'; 3000]))
        };
        sp.memory_budget = 8000;
        let mut b = build(&sp);
        let p1 = b.senders[0].send(vec![big()]).await;
        let p2 = b.senders[1].send(vec![big()]).await;
        // Two ~3 KB events fit in 8 KB; a third, in either queue, must wait.
        assert!(b.senders[1]
            .send_timeout(vec![big()], Duration::from_millis(50))
            .await
            .is_err());
        let third = b.senders[1].send(vec![big()]);
        let mut third = Box::pin(third);
        for _ in 0..10 {
            assert!(futures_util::poll!(third.as_mut()).is_pending());
            tokio::task::yield_now().await;
        }
        // Delivering the event in the *other* queue frees budget: the waiting send goes on.
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        assert!(p1.await.is_delivered());
        let p3 = tokio::time::timeout(Duration::from_secs(5), third)
            .await
            .expect("freeing budget unblocks the waiting send");
        b.inputs[1].recv().await.unwrap().delivery.delivered();
        b.inputs[1].recv().await.unwrap().delivery.delivered();
        assert!(p2.await.is_delivered());
        assert!(p3.await.is_delivered());
    }

    fn two_sources(scope: DedupScope, routes: Vec<RouteSpec>) -> Built {
        let mut sp = spec(
            &[("a", 10, WhenFull::Block), ("b", 10, WhenFull::Block)],
            routes,
        );
        sp.sources = vec!["x".into(), "y".into()];
        sp.dedup.as_mut().unwrap().scope = scope;
        build(&sp)
    }

    fn route(from: usize, to: usize) -> RouteSpec {
        RouteSpec {
            from: vec![from],
            to: vec![to],
            matches: vec![],
        }
    }

    #[tokio::test]
    async fn the_same_event_through_two_sources_reaches_each_sources_sinks() {
        let mut b = two_sources(DedupScope::Source, vec![route(0, 0), route(1, 1)]);
        let px = b.senders[0].send(vec![ev("1")]).await;
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        assert!(px.await.is_delivered());
        // Same (source, id) through the other ingress source, whose route goes elsewhere.
        let py = b.senders[1].send(vec![ev("1")]).await;
        let item = tokio::time::timeout(Duration::from_secs(1), b.inputs[1].recv())
            .await
            .expect("sink b must see the event: it never got it")
            .unwrap();
        item.delivery.delivered();
        let out = py.await;
        assert_eq!((out.status, out.duplicates), (Status::Delivered, 0));
    }

    #[tokio::test]
    async fn global_scope_forwards_the_same_event_once() {
        let mut b = two_sources(DedupScope::Global, vec![route(0, 0), route(1, 0)]);
        let px = b.senders[0].send(vec![ev("1")]).await;
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        assert!(px.await.is_delivered());
        let out = b.senders[1].send(vec![ev("1")]).await.await;
        assert_eq!((out.status, out.duplicates), (Status::Delivered, 1));
        assert!(b.inputs[0].try_recv().is_none());
    }

    #[tokio::test]
    async fn an_unrouted_copy_does_not_make_a_routed_copy_look_delivered() {
        // Source x has no route; y routes to a. One window for both.
        let mut b = two_sources(DedupScope::Global, vec![route(1, 0)]);
        let out = b.senders[0].send(vec![ev("1")]).await.await;
        assert!(out.is_delivered(), "unrouted: ack");
        let py = b.senders[1].send(vec![ev("1")]).await;
        let item = tokio::time::timeout(Duration::from_secs(1), b.inputs[0].recv())
            .await
            .expect("the routed copy must be forwarded")
            .unwrap();
        item.delivery.delivered();
        let out = py.await;
        assert_eq!((out.status, out.duplicates), (Status::Delivered, 0));
    }

    #[tokio::test]
    async fn a_batch_with_one_id_twice_delivers_once_and_counts_a_duplicate() {
        let mut b = build(&spec(&[("a", 10, WhenFull::Block)], all_to(vec![0])));
        let p = b.senders[0].send(vec![ev("1"), ev("2"), ev("1")]).await;
        let first = b.inputs[0].recv().await.unwrap();
        let second = b.inputs[0].recv().await.unwrap();
        assert_eq!(
            (first.event.id.as_str(), second.event.id.as_str()),
            ("1", "2")
        );
        assert!(
            b.inputs[0].try_recv().is_none(),
            "the repeat is not forwarded"
        );
        first.delivery.delivered();
        second.delivery.delivered();
        let out = p.await;
        assert_eq!(
            (out.status, out.events, out.duplicates),
            (Status::Delivered, 3, 1)
        );
    }

    #[tokio::test]
    async fn a_batch_whose_repeated_event_fails_fails() {
        let mut b = build(&spec(&[("a", 10, WhenFull::Block)], all_to(vec![0])));
        let p = b.senders[0].send(vec![ev("1"), ev("1")]).await;
        b.inputs[0].recv().await.unwrap().delivery.failed("down");
        assert_eq!(p.await.status, Status::Failed);
    }

    #[tokio::test]
    async fn dead_lettering_works_when_reported_off_the_runtime() {
        let mut b = with_dead_letter();
        let pending = b.senders[0].send(vec![ev("1")]).await;
        let a = b.inputs[0].recv().await.unwrap();
        // A client library's callback thread: no tokio runtime there.
        std::thread::spawn(move || {
            assert!(tokio::runtime::Handle::try_current().is_err());
            a.delivery.failed("broker said no");
        })
        .join()
        .unwrap();
        let dl = tokio::time::timeout(Duration::from_secs(2), b.inputs[1].recv())
            .await
            .expect("the event reaches the dead-letter sink")
            .unwrap();
        assert_eq!(dl.event.id, "1");
        dl.delivery.delivered();
        assert!(pending.await.is_delivered());
    }

    #[tokio::test]
    async fn a_deadline_abandons_the_wait_but_not_the_delivery() {
        let mut b = build(&spec(&[("a", 10, WhenFull::Block)], all_to(vec![0])));
        let opts = SendOptions {
            deadline: Some(tokio::time::Instant::now() + Duration::from_millis(100)),
            ..SendOptions::default()
        };
        let p = b.senders[0].send_with(vec![ev("1")], opts).await.unwrap();
        let item = b.inputs[0].recv().await.unwrap();
        let out = p.await;
        assert_eq!(out.status, Status::Failed);
        assert_eq!(out.reason.as_deref(), Some(DEADLINE_PASSED));
        // The delivery goes on: once it succeeds, the upstream's redelivery is a duplicate.
        item.delivery.delivered();
        let again = b.senders[0].send(vec![ev("1")]).await.await;
        assert_eq!((again.status, again.duplicates), (Status::Delivered, 1));
    }

    // A paused clock: the deadlines pass exactly when due, however busy the machine.
    #[tokio::test(start_paused = true)]
    async fn a_relative_deadline_counts_from_the_hand_over_and_settled_units_leave_the_table() {
        let mut b = build(&spec(&[("a", 10, WhenFull::Block)], all_to(vec![0])));
        let within = |ms| SendOptions {
            within: Some(Duration::from_millis(ms)),
            ..SendOptions::default()
        };
        let started = tokio::time::Instant::now();
        let late = b.senders[0]
            .send_with(vec![ev("1")], within(150))
            .await
            .unwrap();
        // Settled before its deadline: the outcome is the sinks', and its slot is given back.
        let quick = b.senders[0]
            .send_with(vec![ev("2")], within(50))
            .await
            .unwrap();
        let first = b.inputs[0].recv().await.unwrap();
        let second = b.inputs[0].recv().await.unwrap();
        second.delivery.delivered();
        assert!(quick.await.is_delivered());
        let out = late.await;
        let waited = started.elapsed();
        assert_eq!(out.reason.as_deref(), Some(DEADLINE_PASSED));
        assert!(
            waited >= Duration::from_millis(150) && waited < Duration::from_millis(200),
            "{waited:?}"
        );
        first.delivery.delivered();
    }

    #[tokio::test]
    async fn a_sink_that_stops_fails_its_queued_events_at_once() {
        let mut b = build(&spec(&[("a", 10, WhenFull::Block)], all_to(vec![0])));
        let p = b.senders[0].send(vec![ev("1")]).await;
        drop(b.inputs.remove(0));
        let out = tokio::time::timeout(Duration::from_secs(1), p)
            .await
            .expect("settled when the sink's input is dropped, not at shutdown");
        assert_eq!(out.status, Status::Failed);
    }

    /// A processor that passes every event on, settling its input with the output's outcome.
    async fn pass_through(mut input: SinkInput, sender: SourceSender) {
        let grace = tokio_util::sync::CancellationToken::new();
        let mut window = SinkWindow::new(64);
        let mut batch = Vec::new();
        loop {
            let inp = &mut input;
            match window
                .step(&grace, true, |room| inp.recv_many(&mut batch, room))
                .await
            {
                Step::Input(0) => break window.drain().await,
                Step::Input(_) => {
                    for SinkItem { event, delivery } in batch.drain(..) {
                        window.push(hand_off(&sender, vec![delivery], vec![*event]).await);
                    }
                }
                _ => {}
            }
        }
    }

    /// source → p (a pass-through processor, running) → out; returns the source's sender and
    /// out's input in `senders[0]` and `inputs[0]`.
    fn one_processor(scope: DedupScope) -> Built {
        let mut sp = spec(&[("out", 10, WhenFull::Block)], vec![]);
        sp.dedup.as_mut().unwrap().scope = scope;
        sp.processors = vec![ProcessorSpec {
            name: "p".into(),
            queue_events: 10,
            queue_bytes: 1 << 20,
        }];
        sp.routes = vec![route(0, 1), route(1, 0)];
        let mut b = build(&sp);
        let p_input = b.inputs.pop().unwrap();
        let p_sender = b.senders.pop().unwrap();
        tokio::spawn(pass_through(p_input, p_sender));
        b
    }

    #[tokio::test]
    async fn a_chain_of_processors_whose_queues_sum_past_the_budget_does_not_deadlock() {
        // source → p0 → p1 → p2 → p3 → sink: five queues of 4 KB each under a 10 KB budget.
        let n = 4;
        let mut sp = spec(&[("out", 1000, WhenFull::Block)], vec![]);
        sp.sinks[0].queue_bytes = 4000;
        sp.memory_budget = 10_000;
        sp.processors = (0..n)
            .map(|i| ProcessorSpec {
                name: format!("p{i}"),
                queue_events: 1000,
                queue_bytes: 4000,
            })
            .collect();
        // Senders: 0 = source, 1 + i = p{i}. Queues: 0 = out, 1 + i = p{i}.
        sp.routes = (0..=n)
            .map(|i| RouteSpec {
                from: vec![i],
                to: vec![if i == n { 0 } else { i + 1 }],
                matches: vec![],
            })
            .collect();
        let mut b = build(&sp);
        let mut inputs = b.inputs.drain(..);
        let mut sink = inputs.next().unwrap();
        let mut senders = b.senders.drain(..);
        let source = senders.next().unwrap();
        for (input, sender) in inputs.zip(senders) {
            tokio::spawn(pass_through(input, sender));
        }
        let delivered = tokio::spawn(async move {
            let mut ids = Vec::new();
            while let Some(item) = sink.recv().await {
                ids.push(item.event.id.clone());
                item.delivery.delivered();
            }
            ids
        });
        let big = |i: usize| ev(&i.to_string()).with_json(bytes::Bytes::from(vec![b'1'; 1500]));
        let all = async move {
            let mut pending = Vec::new();
            for i in 0..200 {
                pending.push(source.send(vec![big(i)]).await);
            }
            drop(source);
            for p in pending {
                assert!(p.await.is_delivered());
            }
        };
        tokio::time::timeout(Duration::from_secs(10), all)
            .await
            .expect("every event gets through the chain: no stage waits on another's budget");
        let ids = tokio::time::timeout(Duration::from_secs(5), delivered)
            .await
            .expect("the chain closes stage by stage once the source is gone")
            .unwrap();
        assert_eq!(ids.len(), 200);
    }

    #[tokio::test]
    async fn a_processor_input_settles_with_its_outputs_outcome() {
        let mut b = one_processor(DedupScope::Source);
        let first = b.senders[0].send(vec![ev("1")]).await;
        let second = b.senders[0].send(vec![ev("2")]).await;
        let a = b.inputs[0].recv().await.unwrap();
        let mut first = Box::pin(first);
        tokio::task::yield_now().await;
        assert!(
            futures_util::poll!(first.as_mut()).is_pending(),
            "not acknowledged before the output is delivered"
        );
        a.delivery.failed("target down");
        let out = first.await;
        assert_eq!(out.status, Status::Failed);
        assert!(out.reason.unwrap().contains("target down"));
        b.inputs[0].recv().await.unwrap().delivery.delivered();
        assert!(second.await.is_delivered());
    }

    #[tokio::test]
    async fn a_processors_output_is_not_deduplicated_again_in_either_scope() {
        for scope in [DedupScope::Source, DedupScope::Global] {
            let mut b = one_processor(scope);
            // Same (source, id) as the input, which is in flight while the output is.
            let pending = b.senders[0].send(vec![ev("same")]).await;
            let item = tokio::time::timeout(Duration::from_secs(2), b.inputs[0].recv())
                .await
                .unwrap_or_else(|_| panic!("{scope:?}: the output must be forwarded"))
                .unwrap();
            item.delivery.delivered();
            let out = pending.await;
            assert_eq!(
                (out.status, out.duplicates),
                (Status::Delivered, 0),
                "{scope:?}"
            );
            // A retry of the input is a duplicate at ingress.
            let again = b.senders[0].send(vec![ev("same")]).await.await;
            assert_eq!((again.status, again.duplicates), (Status::Delivered, 1));
        }
    }
}

#[cfg(test)]
mod addressed_tests {
    use super::wiring::*;
    use super::*;

    /// Stages `a` and `b`; the sink `out` (a `block` queue of `queue_events`) is addressed by
    /// `a` only, and no route leads anywhere.
    fn addressed_spec(queue_events: usize) -> PipelineSpec {
        PipelineSpec {
            sources: vec!["a".into(), "b".into()],
            sinks: vec![SinkSpec {
                name: "out".into(),
                queue_events,
                queue_bytes: 1 << 20,
                when_full: WhenFull::Block,
                dead_letter: None,
            }],
            processors: Vec::new(),
            routes: Vec::new(),
            addressed: vec![(0, 0)],
            dedup: None,
            dedup_persistent: false,
            memory_budget: 1 << 20,
            unrouted: Unrouted::Ack,
        }
    }

    #[tokio::test]
    async fn addressed_targets_are_reached_only_by_send_to_and_only_by_their_stage() {
        let built = build(&addressed_spec(16));
        let (a, b) = (&built.senders[0], &built.senders[1]);
        let mut out = built.inputs.into_iter().next().unwrap();
        assert!(b.target("out").is_none(), "b does not address `out`");
        let t = a.target("out").expect("a addresses `out`");
        // A plain send uses no route: unrouted (acknowledged), nothing queued.
        assert!(a
            .send(vec![Event::new("1", "/s", "t")])
            .await
            .await
            .is_delivered());
        assert!(out.try_recv().is_none());
        // send_to queues it, and the delivery carries the sender's name.
        let p = a.send_to(t, vec![Event::new("2", "/s", "t")]).await;
        let item = out.try_recv().expect("queued");
        assert_eq!((item.event.id.as_str(), item.delivery.origin()), ("2", "a"));
        item.delivery.delivered();
        assert!(p.await.is_delivered());
        // Another stage's sender cannot use a's target.
        let o = b.send_to(t, vec![Event::new("3", "/s", "t")]).await.await;
        assert_eq!(o.status, Status::Rejected);
        assert!(out.try_recv().is_none());
    }

    #[tokio::test]
    async fn an_output_handed_over_with_a_continuation_settles_it_once_settled() {
        let built = build(&addressed_spec(2));
        let (a, b) = (&built.senders[0], &built.senders[1]);
        let mut out = built.inputs.into_iter().next().unwrap();
        let t = a.target("out").expect("a addresses `out`");
        let (tx, rx) = std::sync::mpsc::channel::<(u32, Outcome)>();
        let then = |n: u32| -> Then {
            let tx = tx.clone();
            Box::new(move |o| tx.send((n, o)).unwrap())
        };
        for n in [1, 2] {
            let e = Event::new(n.to_string(), "/s", "t");
            assert!(a.try_send_to_then(t, e, then(n)).is_ok(), "room for {n}");
        }
        // The queue holds two: the third is handed back, with its continuation, never called.
        let (back, then3) = a
            .try_send_to_then(t, Event::new("3", "/s", "t"), then(3))
            .expect_err("no room");
        assert_eq!(back.id, "3");
        assert!(rx.try_recv().is_err(), "nothing settled yet");
        // The sink settles them: each continuation is called once, with its outcome.
        let first = out.try_recv().expect("queued");
        assert_eq!(first.delivery.origin(), "a");
        first.delivery.delivered();
        let (n, o) = rx.try_recv().expect("called when delivered");
        assert_eq!((n, o.status), (1, Status::Delivered));
        out.try_recv().expect("queued").delivery.failed("down");
        let (n, o) = rx.try_recv().expect("called when failed");
        assert_eq!(
            (n, o.status, o.reason.as_deref()),
            (2, Status::Failed, Some("sink out: down"))
        );
        // Room again: the handed-back pair goes through.
        assert!(a.try_send_to_then(t, back, then3).is_ok());
        // A delivery dropped unreported (a sink stopped half-way) fails it.
        drop(out.try_recv().expect("queued"));
        let (n, o) = rx.try_recv().expect("called when dropped");
        assert_eq!((n, o.status), (3, Status::Failed));
        assert!(rx.try_recv().is_err(), "each continuation is called once");
        // Another stage's sender gets its pair back.
        let e = Event::new("4", "/s", "t");
        assert!(b.try_send_to_then(t, e, then(4)).is_err());
        assert!(out.try_recv().is_none());
    }
}
