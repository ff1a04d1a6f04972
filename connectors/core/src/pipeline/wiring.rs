//! The daemon's side of the pipeline: what it takes to build one from a config (specs,
//! routes, dedup settings) and what building returns. Connectors never need this module: they
//! get a [`super::SourceSender`] or a [`super::SinkInput`] in their context.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use super::dedup::{dedup_key, Check, Dedup, DedupConfig, DedupScope};
pub use super::queue::QueueGauges;
use super::queue::{self, SinkInput, WhenFull};
use super::{Pipeline, SourceRoutes, SourceSender};
use crate::event::Event;
use crate::telemetry::SourceTelemetry;

/// What happens to an event that no route takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unrouted {
    /// Count it and acknowledge it upstream (default).
    #[default]
    Ack,
    /// Count it and refuse it upstream (HTTP 4xx, broker nack).
    Reject,
}

/// An attribute a route can match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attr {
    Type,
    Source,
    Subject,
}

/// An exact or prefix match on one attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Match {
    Exact(Attr, String),
    Prefix(Attr, String),
}

impl Match {
    pub(crate) fn matches(&self, e: &Event) -> bool {
        let get = |a: &Attr| match a {
            Attr::Type => Some(e.ty.as_str()),
            Attr::Source => Some(e.source.as_str()),
            Attr::Subject => e.subject.as_deref(),
        };
        match self {
            Match::Exact(a, v) => get(a) == Some(v.as_str()),
            Match::Prefix(a, v) => get(a).is_some_and(|s| s.starts_with(v.as_str())),
        }
    }
}

/// A route: events from `from` (source indices) matching every matcher go to `to` (sink
/// indices).
#[derive(Clone, Debug)]
pub struct RouteSpec {
    pub from: Vec<usize>,
    pub to: Vec<usize>,
    pub matches: Vec<Match>,
}

/// A sink's queue settings.
#[derive(Clone, Debug)]
pub struct SinkSpec {
    pub name: String,
    pub queue_events: usize,
    pub queue_bytes: u64,
    pub when_full: WhenFull,
    /// Index of the sink that takes this sink's failed events. It must not have one itself.
    pub dead_letter: Option<usize>,
}

/// A processor's input queue settings (it always blocks when full: a processor's input is
/// someone's output, and its acknowledgement chains back).
#[derive(Clone, Debug)]
pub struct ProcessorSpec {
    pub name: String,
    pub queue_events: usize,
    pub queue_bytes: u64,
}

/// Everything needed to build a pipeline.
#[derive(Clone, Debug)]
pub struct PipelineSpec {
    pub sources: Vec<String>,
    pub sinks: Vec<SinkSpec>,
    /// Processors: each is a queue (after the sinks in `RouteSpec::to` and in
    /// [`Built::inputs`]) and a sender (after the sources in `RouteSpec::from` and in
    /// [`Built::senders`]).
    pub processors: Vec<ProcessorSpec>,
    pub routes: Vec<RouteSpec>,
    /// `(stage, queue)` pairs that a stage reaches only by name, through
    /// [`SourceSender::target`] and [`SourceSender::send_to`]: a processor that addresses its
    /// targets itself (the Sensor's triggers name their sinks). They keep the queue open for
    /// the stage as a route does; a plain `send` never uses them.
    pub addressed: Vec<(usize, usize)>,
    pub dedup: Option<DedupConfig>,
    /// Persist the dedup window (the caller runs [`Dedup::persist_until`]).
    pub dedup_persistent: bool,
    /// Process-wide bound on bytes held in all sink queues together.
    pub memory_budget: u64,
    pub unrouted: Unrouted,
}

/// What [`build`] returns: one sender per source, one input per sink (same order as the spec).
pub struct Built {
    pub senders: Vec<SourceSender>,
    pub inputs: Vec<SinkInput>,
    pub dedup: Option<Arc<Dedup>>,
    /// Keeps `sluice_queue_events` and `sluice_queue_bytes` current; run it on the runtime.
    pub gauges: queue::QueueGauges,
}

pub fn build(spec: &PipelineSpec) -> Built {
    let budget_max = spec.memory_budget.clamp(1, u32::MAX as u64) as u32;
    let budget = Arc::new(super::gate::Gate::new(u64::from(budget_max)));
    let (mut queues, inputs): (Vec<_>, Vec<_>) = spec
        .sinks
        .iter()
        .map(|s| ("sink", &s.name, s.queue_events, s.queue_bytes, s.when_full))
        .chain(spec.processors.iter().map(|p| {
            let (n, e, b) = (&p.name, p.queue_events, p.queue_bytes);
            ("processor", n, e, b, WhenFull::Block)
        }))
        .map(|(role, name, events, bytes, when_full)| {
            queue::sink_queue(
                role,
                name,
                events,
                bytes,
                when_full,
                budget.clone(),
                budget_max,
            )
        })
        .unzip();
    for (i, s) in spec.sinks.iter().enumerate() {
        if let Some(j) = s.dead_letter.filter(|&j| j != i && j < queues.len()) {
            assert!(
                spec.sinks[j].dead_letter.is_none(),
                "dead-letter chains are refused by the config"
            );
            let (a, b) = if i < j {
                let (l, r) = queues.split_at_mut(j);
                (&mut l[i], &r[0])
            } else {
                let (l, r) = queues.split_at_mut(i);
                (&mut r[0], &l[j])
            };
            a.set_dead_letter(b);
        }
    }
    let routes = (0..spec.sources.len() + spec.processors.len())
        .map(|src| {
            let mine: Vec<(Vec<Match>, Vec<usize>)> = spec
                .routes
                .iter()
                .filter(|r| r.from.contains(&src))
                .map(|r| (r.matches.clone(), r.to.clone()))
                .collect();
            let static_targets = mine.iter().all(|(m, _)| m.is_empty()).then(|| {
                let mut t: Vec<usize> =
                    mine.iter().flat_map(|(_, to)| to.iter().copied()).collect();
                t.sort_unstable();
                t.dedup();
                t
            });
            SourceRoutes {
                routes: mine,
                static_targets,
            }
        })
        .collect();
    let dedup = spec
        .dedup
        .filter(|d| !d.window.is_zero() && d.capacity > 0)
        .map(|d| Arc::new(Dedup::new(d, spec.dedup_persistent)));
    let gauges = queue::QueueGauges::new(&queues, dedup.as_ref());
    // Each queue closes when the last stage routing into it is done (with processors, "every
    // sender dropped" never happens upstream of a processor: it holds a sender itself). A
    // dead-letter target stays open for its failing sink instead, and a queue no route feeds
    // closes when every sender is gone, as before.
    let stages = spec.sources.len() + spec.processors.len();
    let mut inputs = inputs;
    let mut feeds: Vec<Vec<usize>> = vec![Vec::new(); stages];
    for r in &spec.routes {
        for &from in r.from.iter().filter(|&&f| f < stages) {
            feeds[from].extend(r.to.iter().copied().filter(|&t| t < inputs.len()));
        }
    }
    let mut addressed: Vec<Vec<usize>> = vec![Vec::new(); stages];
    for &(from, to) in spec
        .addressed
        .iter()
        .filter(|&&(f, t)| f < stages && t < inputs.len())
    {
        feeds[from].push(to);
        addressed[from].push(to);
    }
    for f in feeds.iter_mut().chain(addressed.iter_mut()) {
        f.sort_unstable();
        f.dedup();
    }
    let dead_letter_targets: Vec<usize> = spec.sinks.iter().filter_map(|s| s.dead_letter).collect();
    let upstreams: Vec<Option<Arc<queue::Upstream>>> = (0..inputs.len())
        .map(|q| {
            let n = feeds.iter().filter(|f| f.contains(&q)).count();
            // Without processors the last sender going closes every queue: no need to watch
            // (the watch costs a poll per receive on the hot path).
            let watch = !spec.processors.is_empty() && n > 0 && !dead_letter_targets.contains(&q);
            watch.then(|| queue::Upstream::new(n))
        })
        .collect();
    for (input, up) in inputs.iter_mut().zip(&upstreams) {
        input.upstream = up.clone();
    }
    let tokens: Vec<Arc<queue::StageToken>> = feeds
        .iter()
        .map(|f| {
            Arc::new(queue::StageToken(
                f.iter().filter_map(|&q| upstreams[q].clone()).collect(),
            ))
        })
        .collect();
    let pipeline = Arc::new(Pipeline {
        sinks: queues,
        routes,
        addressed,
        dedup: dedup.clone(),
        unrouted: spec.unrouted,
    });
    let senders = spec
        .sources
        .iter()
        .map(|n| ("source", n))
        .chain(spec.processors.iter().map(|p| ("processor", &p.name)))
        .enumerate()
        .map(|(i, (role, name))| SourceSender {
            pipeline: pipeline.clone(),
            source: i,
            name: Arc::from(name.as_str()),
            dedup_seed: (role == "source").then(|| super::dedup::ingress_seed(name)),
            telemetry: SourceTelemetry::labelled(role, name),
            deadlines: Default::default(),
            _stage: tokens[i].clone(),
        })
        .collect();
    Built {
        senders,
        inputs,
        dedup,
        gauges,
    }
}
