//! What every connector's tests use: a real pipeline around one connector, a capture sink or a
//! feeding source, and checks of the standard telemetry every connector must emit.

pub mod peers;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use crate::contract::{Shared, SinkContext, SourceContext};
use crate::event::Event;
use crate::pipeline::wiring::{
    self as pipeline, DedupConfig, DedupScope, PipelineSpec, RouteSpec, SinkSpec, Unrouted,
};
use crate::pipeline::{Outcome, SinkInput, SinkItem, SourceSender, Status, WhenFull};
use crate::state::{MemoryStateStore, StateStore};

/// A TCP port that was free a moment ago on 127.0.0.1 (for servers a test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("testkit: no free port on 127.0.0.1")
}

/// The process-wide Prometheus recorder for tests (installed once).
pub fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("testkit: another metrics recorder is already installed")
    })
}

/// The sum of every sample of `name` whose labels include all of `labels`.
pub fn metric(name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut text = metrics().render();
    text.push_str(&crate::telemetry::render_latency());
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            if metric != name {
                return None;
            }
            let ok = labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
            ok.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

fn spec(source: &str, sink: &str, queue_events: usize, when_full: WhenFull) -> PipelineSpec {
    PipelineSpec {
        sources: vec![source.into()],
        sinks: vec![SinkSpec {
            name: sink.into(),
            queue_events,
            queue_bytes: 64 << 20,
            when_full,
            dead_letter: None,
        }],
        processors: Vec::new(),
        routes: vec![RouteSpec {
            from: vec![0],
            to: vec![0],
            matches: vec![],
        }],
        addressed: Vec::new(),
        dedup: Some(DedupConfig {
            window: Duration::from_secs(600),
            capacity: 100_000,
            scope: DedupScope::Source,
        }),
        dedup_persistent: false,
        memory_budget: 256 << 20,
        unrouted: Unrouted::Ack,
    }
}

/// A source under test, wired through the real pipeline into a [`Capture`] sink.
pub struct SourceRig {
    pub shutdown: CancellationToken,
    pub state: Arc<MemoryStateStore>,
    sender: Option<SourceSender>,
    capture: Option<Capture>,
    /// The health handle the component's context carries (what `/readyz` would show).
    pub health: crate::Health,
}

impl SourceRig {
    pub fn new(source: &str) -> Self {
        Self::with_queue(source, 10_000, WhenFull::Block)
    }

    /// With a capture queue of `queue_events` (a small one makes backpressure easy to test).
    pub fn with_queue(source: &str, queue_events: usize, when_full: WhenFull) -> Self {
        metrics();
        let mut built = pipeline::build(&spec(
            source,
            &format!("{source}-capture"),
            queue_events,
            when_full,
        ));
        SourceRig {
            shutdown: CancellationToken::new(),
            state: Arc::new(MemoryStateStore::default()),
            health: crate::Health::default(),
            sender: built.senders.pop(),
            capture: built.inputs.pop().map(|input| Capture { input }),
        }
    }

    /// The context to pass to the source's `build` (once).
    pub fn context(&mut self, name: &str) -> SourceContext {
        SourceContext {
            name: name.into(),
            shutdown: self.shutdown.clone(),
            sender: self
                .sender
                .take()
                .expect("testkit: context() is taken once"),
            state: Some(self.state.clone() as Arc<dyn StateStore>),
            shared: Shared::default(),
            health: self.health.clone(),
        }
    }

    /// The capture sink (once).
    pub fn capture(&mut self) -> Capture {
        self.capture
            .take()
            .expect("testkit: capture() is taken once")
    }
}

/// The receiving end of a [`SourceRig`].
pub struct Capture {
    input: SinkInput,
}

impl Capture {
    /// The next queued item, or a panic after `timeout`.
    pub async fn next_within(&mut self, timeout: Duration) -> SinkItem {
        tokio::time::timeout(timeout, self.input.recv())
            .await
            .expect("testkit: no event arrived in time")
            .expect("testkit: the pipeline closed")
    }

    /// [`Capture::next_within`], whose panic names `step` (what the test waited for).
    pub async fn next_for(&mut self, step: &str, timeout: Duration) -> SinkItem {
        match tokio::time::timeout(timeout, self.input.recv()).await {
            Ok(Some(item)) => item,
            Ok(None) => panic!("testkit: {step}: the pipeline closed"),
            Err(_) => panic!("testkit: {step}: no event arrived within {timeout:?}"),
        }
    }

    /// The next item, or `None` once the input has ended.
    pub async fn next_or_end(&mut self) -> Option<SinkItem> {
        self.input.recv().await
    }

    pub async fn deliver_next(&mut self) -> Event {
        let item = self.next_within(Duration::from_secs(10)).await;
        item.delivery.delivered();
        *item.event
    }

    /// Whatever is queued right now (not acknowledged).
    /// A negative check, named: waits `wait` (what the system would need to send something
    /// more: a redelivery, a lease, a poll), then asserts that nothing more arrived.
    pub async fn assert_quiet(&mut self, wait: Duration, why: &str) {
        tokio::time::sleep(wait).await;
        if let Some(item) = self.try_next() {
            panic!(
                "{why}: an event arrived within {wait:?} after the check began (id {})",
                item.event.id
            );
        }
    }

    pub fn try_next(&mut self) -> Option<SinkItem> {
        self.input.try_recv()
    }

    pub fn queued(&self) -> usize {
        self.input.len()
    }

    /// Settles every event with `status` in the background and collects them.
    pub fn auto(mut self, status: Status) -> Collected {
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        tokio::spawn(async move {
            while let Some(item) = self.input.recv().await {
                sink.lock().unwrap().push(*item.event);
                match status {
                    Status::Delivered => item.delivery.delivered(),
                    Status::InFlight | Status::Failed => {
                        item.delivery.failed("testkit: told to fail")
                    }
                    Status::Rejected => item.delivery.rejected("testkit: told to reject"),
                }
            }
        });
        Collected(events)
    }
}

/// Events collected by [`Capture::auto`].
#[derive(Clone)]
pub struct Collected(Arc<Mutex<Vec<Event>>>);

impl Collected {
    pub fn events(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until at least `n` events arrived (panics after 10 s).
    pub async fn wait_for(&self, n: usize) -> Vec<Event> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if self.len() >= n {
                return self.events();
            }
            if tokio::time::Instant::now() > deadline {
                panic!("testkit: expected {n} events, got {}", self.len());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A sink under test, fed by a test source through the real pipeline.
pub struct SinkRig {
    pub grace_over: CancellationToken,
    pub state: Arc<MemoryStateStore>,
    sender: Option<SourceSender>,
    input: Option<SinkInput>,
    /// The health handle the component's context carries (what `/readyz` would show).
    pub health: crate::Health,
}

impl SinkRig {
    pub fn new(sink: &str) -> Self {
        metrics();
        let mut built = pipeline::build(&spec(
            &format!("{sink}-feed"),
            sink,
            10_000,
            WhenFull::Block,
        ));
        SinkRig {
            grace_over: CancellationToken::new(),
            state: Arc::new(MemoryStateStore::default()),
            health: crate::Health::default(),
            sender: built.senders.pop(),
            input: built.inputs.pop(),
        }
    }

    /// A rig whose sink sends failed events to a dead-letter sink, returned as a [`Capture`].
    pub fn with_dead_letter(sink: &str) -> (Self, Capture) {
        metrics();
        let mut spec = spec(&format!("{sink}-feed"), sink, 10_000, WhenFull::Block);
        spec.sinks[0].dead_letter = Some(1);
        spec.sinks.push(SinkSpec {
            name: format!("{sink}-dead-letter"),
            queue_events: 10_000,
            queue_bytes: 64 << 20,
            when_full: WhenFull::Block,
            dead_letter: None,
        });
        let mut built = pipeline::build(&spec);
        let dead = built.inputs.pop().map(|input| Capture { input });
        (
            SinkRig {
                grace_over: CancellationToken::new(),
                state: Arc::new(MemoryStateStore::default()),
                health: crate::Health::default(),
                sender: built.senders.pop(),
                input: built.inputs.pop(),
            },
            dead.expect("two sinks"),
        )
    }

    /// The context to pass to the sink's `build` (once).
    pub fn context(&mut self, name: &str) -> SinkContext {
        SinkContext {
            name: name.into(),
            input: self.input.take().expect("testkit: context() is taken once"),
            grace_over: self.grace_over.clone(),
            state: Some(self.state.clone() as Arc<dyn StateStore>),
            shared: Shared::default(),
            health: self.health.clone(),
        }
    }

    /// Sends one unit and waits for its outcome.
    pub async fn send(&self, events: Vec<Event>) -> Outcome {
        self.sender().send(events).await.await
    }

    pub fn sender(&self) -> &SourceSender {
        self.sender.as_ref().expect("testkit: the feed was closed")
    }

    /// Drops the feed: the sink sees the end of its input and should return.
    pub fn close(&mut self) {
        self.sender = None;
    }
}

/// A processor under test: feeding sources → the processor's queue → the processor → sinks
/// that capture what it emits, all through the real pipeline (ack chaining, budget, closing
/// included).
pub struct ProcessorRig {
    pub grace_over: CancellationToken,
    pub state: Arc<MemoryStateStore>,
    feeds: Vec<(String, SourceSender)>,
    context: Option<(SinkInput, SourceSender)>,
    captures: Vec<(String, Option<Capture>)>,
    /// The health handle the component's context carries (what `/readyz` would show).
    pub health: crate::Health,
}

impl ProcessorRig {
    /// One feed (`<processor>-feed`) and one capture (`<processor>-capture`) that a route
    /// from the processor fills.
    pub fn new(processor: &str) -> Self {
        let feed = format!("{processor}-feed");
        let capture = format!("{processor}-capture");
        Self::build(processor, &[&feed], &[&capture], false, 10_000)
    }

    /// Feeds named `feeds` routed into the processor, and capture sinks named `targets` that
    /// the processor addresses by name ([`SourceSender::target`]; no route from it).
    pub fn addressing(processor: &str, feeds: &[&str], targets: &[&str]) -> Self {
        Self::build(processor, feeds, targets, true, 10_000)
    }

    /// [`ProcessorRig::addressing`] with target queues of `queue_events` events (`block`).
    pub fn addressing_with_queue(
        processor: &str,
        feeds: &[&str],
        targets: &[&str],
        queue_events: usize,
    ) -> Self {
        Self::build(processor, feeds, targets, true, queue_events)
    }

    fn build(
        processor: &str,
        feeds: &[&str],
        targets: &[&str],
        addressed: bool,
        queue_events: usize,
    ) -> Self {
        metrics();
        let mut spec = spec(feeds[0], targets[0], 10_000, WhenFull::Block);
        spec.sources = feeds.iter().map(|s| s.to_string()).collect();
        spec.sinks = targets
            .iter()
            .map(|t| pipeline::SinkSpec {
                name: t.to_string(),
                queue_events,
                queue_bytes: 64 << 20,
                when_full: WhenFull::Block,
                dead_letter: None,
            })
            .collect();
        spec.processors = vec![pipeline::ProcessorSpec {
            name: processor.into(),
            queue_events: 10_000,
            queue_bytes: 64 << 20,
        }];
        // Senders: feeds, then the processor. Queues: targets, then the processor.
        let (nf, nt) = (feeds.len(), targets.len());
        spec.routes = vec![RouteSpec {
            from: (0..nf).collect(),
            to: vec![nt],
            matches: vec![],
        }];
        if addressed {
            spec.addressed = (0..nt).map(|t| (nf, t)).collect();
        } else {
            spec.routes.push(RouteSpec {
                from: vec![nf],
                to: (0..nt).collect(),
                matches: vec![],
            });
        }
        let built = pipeline::build(&spec);
        let mut senders = built.senders;
        let mut inputs = built.inputs;
        let out = senders.pop();
        let input = inputs.pop();
        ProcessorRig {
            grace_over: CancellationToken::new(),
            state: Arc::new(MemoryStateStore::default()),
            health: crate::Health::default(),
            feeds: feeds.iter().map(|f| f.to_string()).zip(senders).collect(),
            context: input.zip(out),
            captures: targets
                .iter()
                .map(|t| t.to_string())
                .zip(inputs.into_iter().map(|input| Some(Capture { input })))
                .collect(),
        }
    }

    /// The context to pass to the processor's `build` (once).
    pub fn context(&mut self, name: &str) -> crate::ProcessorContext {
        let (input, sender) = self
            .context
            .take()
            .expect("testkit: context() is taken once");
        crate::ProcessorContext {
            name: name.into(),
            input,
            sender,
            grace_over: self.grace_over.clone(),
            state: Some(self.state.clone() as Arc<dyn StateStore>),
            shared: Shared::default(),
            health: self.health.clone(),
        }
    }

    /// The (first) sink after the processor (once).
    pub fn capture(&mut self) -> Capture {
        let name = self.captures[0].0.clone();
        self.capture_of(&name)
    }

    /// The capture sink named `name` (once).
    pub fn capture_of(&mut self, name: &str) -> Capture {
        self.captures
            .iter_mut()
            .find(|(n, _)| n == name)
            .and_then(|(_, c)| c.take())
            .unwrap_or_else(|| panic!("testkit: no capture `{name}`, or it was taken"))
    }

    /// The (first) feed.
    pub fn sender(&self) -> &SourceSender {
        &self
            .feeds
            .first()
            .expect("testkit: the feeds were closed")
            .1
    }

    /// The feed named `name`.
    pub fn sender_of(&self, name: &str) -> &SourceSender {
        self.feeds
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s)
            .unwrap_or_else(|| panic!("testkit: no feed `{name}`, or the feeds were closed"))
    }

    /// Drops the feeds: the processor sees the end of its input, finishes and returns, and the
    /// captures see the end of their own.
    pub fn close(&mut self) {
        self.feeds.clear();
    }
}

/// A running connector's task, as a test holds it.
pub type Task = tokio::task::JoinHandle<Result<(), crate::ConnectorError>>;

/// A source of kind `C` from `cfg` (JSON, as a config file gives it), validated and built in a
/// new [`SourceRig`] named `name`, and running.
pub async fn start_source<C: crate::SourceConfig>(
    name: &str,
    cfg: serde_json::Value,
) -> (SourceRig, Task) {
    let cfg: C = serde_json::from_value(cfg).expect("testkit: the config deserializes");
    cfg.validate(name).expect("testkit: the config validates");
    let mut rig = SourceRig::new(name);
    let running = Box::new(cfg)
        .build(rig.context(name))
        .await
        .expect("testkit: the source builds");
    (rig, tokio::spawn(running))
}

/// A sink of kind `C` from `cfg`, validated and built in a new [`SinkRig`], and running.
pub async fn start_sink<C: crate::SinkConfig>(name: &str, cfg: serde_json::Value) -> SinkRig {
    start_sink_joined::<C>(name, cfg).await.0
}

/// A sink of kind `C` from `cfg`, validated, built and running, with its task's handle (to
/// check that it returns, and how).
pub async fn start_sink_joined<C: crate::SinkConfig>(
    name: &str,
    cfg: serde_json::Value,
) -> (
    SinkRig,
    tokio::task::JoinHandle<Result<(), crate::ConnectorError>>,
) {
    let cfg: C = serde_json::from_value(cfg).expect("testkit: the config deserializes");
    cfg.validate(name).expect("testkit: the config validates");
    let mut rig = SinkRig::new(name);
    let running = Box::new(cfg)
        .build(rig.context(name))
        .await
        .expect("testkit: the sink builds");
    (rig, tokio::spawn(running))
}

/// The compliance check every sink passes, against its real peer, observed from outside:
///
/// 1. a bad config is refused by `validate` with a message;
/// 2. delivered means the peer has it: once a unit's outcome says delivered, `held()` (what the
///    peer holds, one byte string per message: the body, or the whole record) shows every event
///    of it, for a unit of one event and a unit of five (read again for up to 5 s, for peers
///    that show what they took only a moment later);
/// 3. the standard telemetry: `sluice_events_delivered_total{sink}` counts them;
/// 4. drain: events handed over, then the input closed while they are in flight: each is
///    still delivered, and the sink's task returns `Ok` by itself;
/// 5. with its peer gone (`unreachable`: the same sink pointed at a closed port), a unit of
///    three is not reported delivered, each event has its own status (not one for the batch),
///    and once the grace period is over (`grace_over`) the sink gives up and returns.
///
/// Every event's data is a JSON object holding a marker unique to this run, which is also the
/// event's id, so `held` may return records in any encoding that keeps the data's bytes or the
/// id (binary or structured mode, a message built from a template over `{id}`).
pub async fn sink_compliance<C: crate::SinkConfig>(
    name: &str,
    cfg: serde_json::Value,
    bad: serde_json::Value,
    unreachable: serde_json::Value,
    mut held: impl FnMut() -> crate::BoxFuture<'static, Vec<Vec<u8>>>,
) {
    let refused = serde_json::from_value::<C>(bad.clone())
        .map_err(|e| e.to_string())
        .and_then(|c| c.validate(name));
    match refused {
        Err(msg) => assert!(!msg.trim().is_empty(), "{name}: a refusal must say why"),
        Ok(()) => panic!("{name}: the bad config {bad} was accepted"),
    }
    let run = uuid::Uuid::new_v4().simple().to_string();
    let event = |i: usize| {
        Event::new(format!("{run}-{i}-x"), "/compliance", "compliance.check")
            .with_json(format!("{{\"marker\":\"{run}-{i}-x\",\"n\":{i}}}").into_bytes())
    };
    let marker = |i: usize| format!("{run}-{i}-x");
    let has = |records: &[Vec<u8>], m: &str| {
        records
            .iter()
            .any(|r| memchr::memmem::find(r, m.as_bytes()).is_some())
    };
    let timeout = Duration::from_secs(30);

    // 2. and 3.
    let (mut rig, task) = start_sink_joined::<C>(name, cfg.clone()).await;
    let mut next = 0;
    for size in [1, 5] {
        let unit: Vec<Event> = (next..next + size).map(event).collect();
        let outcome = tokio::time::timeout(timeout, rig.send(unit))
            .await
            .unwrap_or_else(|_| panic!("{name}: a unit of {size} got no outcome in 30 s"));
        assert!(
            outcome.is_delivered(),
            "{name}: a unit of {size} was not delivered: {outcome:?}"
        );
        let records = read_back(
            &mut held,
            &(next..next + size).map(marker).collect::<Vec<_>>(),
        )
        .await;
        for i in next..next + size {
            assert!(
                has(&records, &marker(i)),
                "{name}: event {i} was reported delivered but the peer does not have it"
            );
        }
        next += size;
    }
    assert!(
        metric(crate::telemetry::EVENTS_DELIVERED, &[("sink", name)]) >= 6.0,
        "{name}: sluice_events_delivered_total{{sink}}"
    );

    // 4. Drain.
    let pending: Vec<_> = {
        let mut v = Vec::new();
        for i in next..next + 4 {
            v.push(rig.sender().send(vec![event(i)]).await);
        }
        v
    };
    rig.close();
    for p in pending {
        let o = tokio::time::timeout(timeout, p)
            .await
            .unwrap_or_else(|_| panic!("{name}: an event in flight at the close got no outcome"));
        assert!(
            o.is_delivered(),
            "{name}: in flight at the close, then {o:?}"
        );
    }
    tokio::time::timeout(timeout, task)
        .await
        .unwrap_or_else(|_| panic!("{name}: the sink did not return once its input ended"))
        .expect("the task ran")
        .unwrap_or_else(|e| panic!("{name}: the sink returned an error after its drain: {e}"));
    let records = read_back(&mut held, &(next..next + 4).map(marker).collect::<Vec<_>>()).await;
    for i in next..next + 4 {
        assert!(
            has(&records, &marker(i)),
            "{name}: drained event {i} is not at the peer"
        );
    }
    next += 4;

    // 5. The peer is gone: per-event statuses, and the grace period ends the wait.
    let dead_name = format!("{name}-unreachable");
    let cfg: C = serde_json::from_value(unreachable).expect("testkit: the config deserializes");
    let mut rig = SinkRig::new(&dead_name);
    let grace = rig.grace_over.clone();
    // A sink may fail to start when its peer is gone (it checks the peer at start): that is a
    // clear refusal too.
    let running = match Box::new(cfg).build(rig.context(&dead_name)).await {
        Ok(r) => r,
        Err(e) => {
            assert!(
                !e.to_string().trim().is_empty(),
                "{name}: a start failure must say why"
            );
            return;
        }
    };
    let task = tokio::spawn(running);
    let unit: Vec<Event> = (next..next + 3).map(event).collect();
    let pending = rig.sender().send(unit).await;
    rig.close();
    tokio::time::sleep(Duration::from_millis(500)).await;
    grace.cancel();
    let o = tokio::time::timeout(Duration::from_secs(15), pending)
        .await
        .unwrap_or_else(|_| panic!("{name}: no outcome within 15 s of the end of the grace"));
    assert!(
        !o.is_delivered(),
        "{name}: delivered to a peer that is gone: {o:?}"
    );
    for i in 0..3 {
        assert!(
            o.status_of(i) != Status::Delivered,
            "{name}: event {i} of the unit counted delivered"
        );
    }
    tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .unwrap_or_else(|_| panic!("{name}: the sink did not return after its grace"))
        .expect("the task ran")
        .ok();
}

/// One HTTP/1.1 request over a fresh connection; the answer's status, or `None` when the
/// connection closed without one.
pub async fn http_post(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    tcp.write_all(req.as_bytes()).await.ok()?;
    tcp.write_all(body).await.ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(2).any(|w| w == b"\r\n") {
        let n = tcp.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&got);
    line.split(' ').nth(1)?.trim().parse().ok()
}

/// What the peer holds, read until every marker is there or 5 s passed: some peers can only be
/// read back a moment later (a Pub/Sub pull may return part of what is there, a subscriber gets
/// what the broker forwards after its acknowledgement).
async fn read_back(
    held: &mut impl FnMut() -> crate::BoxFuture<'static, Vec<Vec<u8>>>,
    markers: &[String],
) -> Vec<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let records = held().await;
        let all = markers.iter().all(|m| {
            records
                .iter()
                .any(|r| memchr::memmem::find(r, m.as_bytes()).is_some())
        });
        if all || tokio::time::Instant::now() >= deadline {
            return records;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The compliance check every HTTP push source (the webhook family, `sns`) passes, observed
/// from outside as a sender sees it. `cfg` listens on `addr`; `request(i)` is a valid request
/// (headers and body) for the `i`th distinct delivery, the same `i` giving the same delivery:
///
/// 1. a bad config is refused by `validate` with a message;
/// 2. the answer comes only after delivery: while the event waits unsettled the sender has no
///    answer; once delivered, a 2xx;
/// 3. a failed delivery is answered with a 5xx, so the sender retries;
/// 4. a duplicate (the same delivery sent again) is answered 2xx and reaches the sinks once;
/// 5. shutdown: a request taken before it still gets its answer after delivery, and the source
///    returns by itself;
/// 6. the standard telemetry (`sluice_events_received_total{source}`).
pub async fn http_push_source_compliance<C: crate::SourceConfig>(
    name: &str,
    cfg: serde_json::Value,
    bad: serde_json::Value,
    addr: std::net::SocketAddr,
    path: &str,
    request: impl Fn(usize) -> (Vec<(String, String)>, Vec<u8>),
) {
    let refused = serde_json::from_value::<C>(bad.clone())
        .map_err(|e| e.to_string())
        .and_then(|c| c.validate(name));
    match refused {
        Err(msg) => assert!(!msg.trim().is_empty(), "{name}: a refusal must say why"),
        Ok(()) => panic!("{name}: the bad config {bad} was accepted"),
    }
    let timeout = Duration::from_secs(10);
    let (mut rig, task) = start_source::<C>(name, cfg).await;
    let mut cap = rig.capture();
    let send = |i: usize| {
        let (h, b) = request(i);
        let path = path.to_owned();
        tokio::spawn(async move {
            // The listener may still be starting.
            for _ in 0..100 {
                if let Some(s) = http_post(addr, &path, &h, &b).await {
                    return Some(s);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            None
        })
    };
    let ok = |s: Option<u16>| s.is_some_and(|s| (200..300).contains(&s));

    // 2.
    let answer = send(0);
    let item = cap.next_for("2. the event of a request", timeout).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !answer.is_finished(),
        "{name}: the sender was answered before the event was delivered"
    );
    item.delivery.delivered();
    let s = tokio::time::timeout(timeout, answer)
        .await
        .expect("an answer")
        .unwrap();
    assert!(ok(s), "{name}: delivered, answered {s:?}");

    // 3.
    let answer = send(1);
    let item = cap.next_for("3. the event of a request", timeout).await;
    item.delivery.failed("compliance: the sink failed");
    let s = tokio::time::timeout(timeout, answer)
        .await
        .expect("an answer")
        .unwrap();
    assert!(
        s.is_some_and(|s| s >= 500),
        "{name}: a failed delivery must be answered 5xx so the sender retries, got {s:?}"
    );

    // 4.
    let answer = send(2);
    cap.next_for("4. the event of a request", timeout)
        .await
        .delivery
        .delivered();
    assert!(ok(tokio::time::timeout(timeout, answer)
        .await
        .expect("an answer")
        .unwrap()));
    let again = send(2);
    let s = tokio::time::timeout(timeout, again)
        .await
        .expect("an answer")
        .unwrap();
    assert!(ok(s), "{name}: a duplicate is answered 2xx, got {s:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        cap.try_next().is_none(),
        "{name}: a duplicate delivery reached the sinks again"
    );

    // 5.
    let answer = send(3);
    let item = cap.next_for("5. taken before the shutdown", timeout).await;
    rig.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    item.delivery.delivered();
    let s = tokio::time::timeout(timeout, answer)
        .await
        .expect("an answer")
        .unwrap();
    assert!(ok(s), "{name}: taken before the shutdown, answered {s:?}");
    drop(cap);
    tokio::time::timeout(timeout, task)
        .await
        .unwrap_or_else(|_| panic!("{name}: the source did not return after the shutdown"))
        .expect("the task ran")
        .unwrap_or_else(|e| panic!("{name}: the source failed: {e}"));

    // 6.
    assert!(
        metric(crate::telemetry::EVENTS_RECEIVED, &[("source", name)]) >= 4.0,
        "{name}: sluice_events_received_total"
    );
}

/// The compliance check every pull source (a broker consumer that acknowledges upstream) passes,
/// observed from outside through the broker, with nothing but a way to publish:
///
/// 1. a bad config is refused by `validate` with a message;
/// 2. nothing is acknowledged before delivery: a source that received messages and dies (its
///    task aborted, as in a crash) leaves them to the broker, which hands every one of them to
///    the next instance;
/// 3. delivered messages are acknowledged: the next instance after that gets none of them again;
/// 4. drain on shutdown: messages taken before the shutdown are still settled and acknowledged,
///    and the source returns by itself;
/// 5. the standard source telemetry (`received`, `settled{result="ack"}`).
///
/// `cfg` must name a stable consumer identity (consumer name, queue, client id) so that the
/// instances share it; `put(n)` publishes `n` new messages with distinct payloads.
pub async fn pull_source_compliance<C: crate::SourceConfig>(
    name: &str,
    cfg: serde_json::Value,
    bad: serde_json::Value,
    mut put: impl FnMut(usize) -> crate::BoxFuture<'static, ()>,
) {
    let refused = serde_json::from_value::<C>(bad.clone())
        .map_err(|e| e.to_string())
        .and_then(|c| c.validate(name));
    match refused {
        Err(msg) => assert!(!msg.trim().is_empty(), "{name}: a refusal must say why"),
        Ok(()) => panic!("{name}: the bad config {bad} was accepted"),
    }
    let data = |e: &Event| e.data.as_bytes().cloned().unwrap_or_default();
    // A bound, not a wait: a broker that redelivers only when a lease runs out (Pub/Sub's
    // shortest ack deadline is 10 s) needs more than that after a crash.
    let timeout = Duration::from_secs(30);

    // 2. Received, never settled, crashed.
    let (mut a, task) = start_source::<C>(&format!("{name}-a"), cfg.clone()).await;
    let mut cap = a.capture();
    put(3).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            cap.next_for("2. received by the first instance", timeout)
                .await,
        );
    }
    let first: std::collections::BTreeSet<Bytes> = held.iter().map(|i| data(&i.event)).collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    task.abort();
    let _ = task.await;
    drop(held);

    // 3. The next instance gets them again, delivers them, and they stay acknowledged.
    let b_name = format!("{name}-b");
    let (mut b, task) = start_source::<C>(&b_name, cfg.clone()).await;
    let mut cap = b.capture();
    let mut again = std::collections::BTreeSet::new();
    while again.len() < first.len() {
        let item = cap.next_for("3. handed on after the crash", timeout).await;
        again.insert(data(&item.event));
        item.delivery.delivered();
    }
    assert_eq!(
        again, first,
        "{name}: what the crashed instance held was handed on, all of it"
    );

    // 4. Drain: taken before the shutdown, settled after it, acknowledged, and the task ends.
    put(2).await;
    let mut held = Vec::new();
    while held.len() < 2 {
        let item = cap.next_for("4. taken before the shutdown", timeout).await;
        if first.contains(&data(&item.event)) {
            // A repeat of an earlier one (allowed: at-least-once); settle it too.
            item.delivery.delivered();
            continue;
        }
        held.push(item);
    }
    let drained: std::collections::BTreeSet<Bytes> = held.iter().map(|i| data(&i.event)).collect();
    b.shutdown.cancel();
    for i in held {
        i.delivery.delivered();
    }
    tokio::time::timeout(timeout, task)
        .await
        .unwrap_or_else(|_| panic!("{name}: the source did not return after its drain"))
        .expect("the task ran")
        .unwrap_or_else(|e| panic!("{name}: the source failed: {e}"));
    assert!(
        metric(crate::telemetry::EVENTS_RECEIVED, &[("source", &b_name)]) >= 5.0,
        "{name}: sluice_events_received_total"
    );
    assert!(
        metric(
            crate::telemetry::SOURCE_SETTLED,
            &[("source", &b_name), ("result", "ack")]
        ) >= 5.0,
        "{name}: sluice_source_settled_total{{result=\"ack\"}}"
    );

    // 3 and 4 seen from the next instance: only the new message arrives.
    let (mut c, task) = start_source::<C>(&format!("{name}-c"), cfg).await;
    let mut cap = c.capture();
    put(1).await;
    let item = cap.next_for("5. the one new message", timeout).await;
    let got = data(&item.event);
    assert!(
        !first.contains(&got) && !drained.contains(&got),
        "{name}: a message acknowledged before was handed out again"
    );
    item.delivery.delivered();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        cap.try_next().is_none(),
        "{name}: nothing else is left upstream"
    );
    c.shutdown.cancel();
    let _ = tokio::time::timeout(timeout, task).await;
}

/// For a source reading a backlog of `n` events on this runtime (a one-thread test runtime):
/// asserts that it gives the thread up at least every 1 000 events, so other tasks on it (the
/// admin server, the sinks) are not starved. Counted, not timed: between two turns of this
/// task, how many events the source took (`sluice_events_received_total`). A source whose input
/// is not a tokio resource (librdkafka's queue, lapin's deliveries) must spend tokio's budget
/// itself (`tokio::task::consume_budget`) to pass.
pub async fn assert_yields_while_reading(source: &str, n: usize) {
    let received = || metric(crate::telemetry::EVENTS_RECEIVED, &[("source", source)]) as usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (mut last, mut widest, mut turns) = (0, 0, 0);
    while received() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{source}: took {} of {n} within 60 s",
            received()
        );
        tokio::task::yield_now().await;
        let now = received();
        widest = widest.max(now - last);
        last = now;
        turns += 1;
    }
    assert!(
        widest <= 1_000,
        "{source}: {widest} events taken between two turns of another task ({turns} turns)"
    );
}

/// Checks the standard source telemetry.
pub fn assert_source_telemetry(source: &str, received: u64) {
    let got = metric(crate::telemetry::EVENTS_RECEIVED, &[("source", source)]);
    assert_eq!(
        got, received as f64,
        "sluice_events_received_total{{source={source:?}}}"
    );
}

/// Checks the standard sink telemetry.
pub fn assert_sink_telemetry(sink: &str, delivered: u64, failures: u64) {
    let d = metric(crate::telemetry::EVENTS_DELIVERED, &[("sink", sink)]);
    let f = metric(crate::telemetry::DELIVERY_FAILURES, &[("sink", sink)]);
    assert_eq!(
        (d, f),
        (delivered as f64, failures as f64),
        "(sluice_events_delivered_total, sluice_delivery_failures_total) for sink {sink:?}"
    );
    let count = metric(
        &format!("{}_count", crate::telemetry::DELIVERY_LATENCY),
        &[("sink", sink)],
    );
    assert_eq!(
        count, delivered as f64,
        "latency recorded once per delivered event"
    );
}

/// A throwaway PKI for TLS tests: a CA, a server certificate for `localhost` and a client
/// certificate, as PEM strings and as files (`ca.pem`, `server.pem`, `server.key`,
/// `client.pem`, `client.key`) in `dir`.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca_pem: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
}

/// Makes a new [`Pki`] (each call a different CA).
pub fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // A subject name, so that OpenSSL peers (mosquitto, redis) can match it as the issuer.
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "sluice test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let issue = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = issue("localhost");
    let (client_cert, client_key) = issue("client");
    let dir = tempfile::tempdir().unwrap();
    for (file, text) in [
        ("ca.pem", ca.pem()),
        ("server.pem", server_cert.clone()),
        ("server.key", server_key.clone()),
        ("client.pem", client_cert.clone()),
        ("client.key", client_key.clone()),
    ] {
        std::fs::write(dir.path().join(file), text).unwrap();
    }
    Pki {
        dir,
        ca_pem: ca.pem(),
        server_cert,
        server_key,
        client_cert,
        client_key,
    }
}
