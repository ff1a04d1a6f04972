//! `kind: redis-streams` source: a consumer group over streams, acknowledged after delivery
//! (the sink is `streams_sink.rs`).

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use futures_util::future::BoxFuture as FutBox;
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::{RedisResult, Value};
use serde::Deserialize;
use sluice_core::pipeline::SendOptions;
use sluice_core::pull::{InFlight, RetryQueue};
use sluice_core::telemetry::{PullTelemetry, Settled};
use sluice_core::units::HumanDuration;
use sluice_core::{
    BoxFuture, ConnectorError, Outcome, Running, SourceConfig, SourceContext, Status,
};
use tokio::time::Instant;

use crate::entry::{self, Fields, Naming};
use crate::{check_url, client, connect, reconnect_delay, redact, Format, TlsConfig};

/// Where a group created by the source starts reading (`start:`; an existing group keeps its
/// position).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// Every entry the stream holds (`XGROUP CREATE ... 0`, default).
    #[default]
    All,
    /// Only entries added after the group was created (`$`).
    New,
}

/// `kind: redis-streams` source options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamsSourceConfig {
    /// `redis://[user:password@]host:port[/db]`, or `rediss://` for TLS. Default
    /// `redis://127.0.0.1:6379`.
    #[serde(default = "crate::default_url")]
    pub url: String,
    /// The streams to read (one consumer group on each).
    pub streams: Vec<String>,
    /// The consumer group. Default: the source's name.
    pub group: Option<String>,
    /// This reader's consumer name within the group: keep it stable across restarts (its pending
    /// entries are replayed on start) and distinct per replica (`${HOSTNAME}`). Default: the
    /// source's name.
    pub consumer: Option<String>,
    /// Pending entries idle this long in any consumer of the group (a crashed replica) are taken
    /// over with `XAUTOCLAIM`; this source keeps its own in-flight entries fresher than that.
    /// Default 60s.
    #[serde(default = "sixty_seconds")]
    pub claim_idle: HumanDuration,
    /// Entries held at once (in the pipeline, waiting to enter it, or waiting for a retry); each
    /// `XREADGROUP` asks for the room left, at most half of this, split across the streams.
    /// Default 1000.
    #[serde(default = "default_window")]
    pub max_in_flight: usize,
    /// Create the streams (`MKSTREAM`) and the group when missing (default true). With false, a
    /// missing group is an error at start.
    #[serde(default = "yes")]
    pub create: bool,
    /// Where a created group starts: `all` (default) or `new`.
    #[serde(default)]
    pub start: Start,
    /// `cloudevents` (default) or `argo` (Argo Events' `redisStream` event shape).
    #[serde(default)]
    pub format: Format,
    /// `argo`: `data.metadata`.
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// `type` of events made from plain entries. Default `redis.stream` (`argo`:
    /// `redisStream`).
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// `source` of events made from plain entries. Default: the source's name.
    #[serde(rename = "source")]
    pub event_source: Option<String>,
    /// `argo`: the events' `subject` (Argo's event name). Default: the source's name.
    #[serde(rename = "subject")]
    pub event_subject: Option<String>,
    pub tls: Option<TlsConfig>,
}

fn sixty_seconds() -> HumanDuration {
    HumanDuration::from_secs(60)
}
fn default_window() -> usize {
    1000
}
fn yes() -> bool {
    true
}

/// How long one `XREADGROUP` blocks waiting for new entries.
const BLOCK: Duration = Duration::from_secs(1);
/// Bound on a control command (XACK, XCLAIM, XAUTOCLAIM, XINFO).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

fn check_key(what: &str, k: &str) -> Result<(), String> {
    if k.is_empty() || k.contains(char::is_whitespace) {
        return Err(format!(
            "{what} {k:?} is not a usable name (empty or has spaces)"
        ));
    }
    Ok(())
}

impl StreamsSourceConfig {
    fn default_type(&self) -> &'static str {
        match self.format {
            Format::Argo => "redisStream",
            Format::Cloudevents => "redis.stream",
        }
    }
}

impl SourceConfig for StreamsSourceConfig {
    fn validate(&self, name: &str) -> Result<(), String> {
        check_url(&self.url, self.tls.as_ref())?;
        if self.streams.is_empty() {
            return Err("streams is empty: name at least one stream to read".into());
        }
        let mut seen = HashSet::new();
        for s in &self.streams {
            check_key("stream", s)?;
            // The name is the events' subject and the start of their ids: checked here, once.
            sluice_core::event::check_string("stream", s, true).map_err(|e| e.0)?;
            if !seen.insert(s) {
                return Err(format!("stream {s:?} is listed twice"));
            }
        }
        check_key("group", self.group.as_deref().unwrap_or(name))?;
        check_key("consumer", self.consumer.as_deref().unwrap_or(name))?;
        if self.max_in_flight == 0 || self.max_in_flight > 100_000 {
            return Err("max_in_flight must be between 1 and 100000".into());
        }
        if self.claim_idle.get() < Duration::from_secs(1) {
            return Err("claim_idle must be at least 1s".into());
        }
        sluice_core::event::check_source_and_type(
            self.event_source.as_deref().unwrap_or(name),
            self.event_type.as_deref().unwrap_or(self.default_type()),
        )
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("redis-streams source {name}: {m}"));
            let client = client(&self.url, self.tls.as_ref()).map_err(err)?;
            let reader = connect(&client, None).await.map_err(|e| {
                err(format!(
                    "cannot connect to {} ({e}); is Redis up?",
                    redact(&self.url)
                ))
            })?;
            let ctl = crate::managed(&self.url, self.tls.as_ref(), COMMAND_TIMEOUT)
                .await
                .map_err(err)?;
            let group = self.group.clone().unwrap_or_else(|| name.clone());
            let source = StreamsSource {
                ty: self
                    .event_type
                    .clone()
                    .unwrap_or_else(|| self.default_type().into()),
                source: self.event_source.clone().unwrap_or_else(|| name.clone()),
                argo_subject: self.event_subject.clone().unwrap_or_else(|| name.clone()),
                argo: self.format == Format::Argo,
                metadata: serde_json::to_vec(&self.metadata).unwrap_or_else(|_| b"{}".to_vec()),
                streams: self.streams.clone(),
                consumer: self.consumer.clone().unwrap_or_else(|| name.clone()),
                group,
                claim_idle: self.claim_idle.get(),
                window: self.max_in_flight,
                create: self.create,
                start: self.start,
                telemetry: PullTelemetry::new(&name),
                name: name.clone(),
                client,
            };
            let mut ctl = ctl;
            source.ensure_groups(&mut ctl).await.map_err(err)?;
            Ok(Box::pin(source.run(reader, ctl, ctx)) as Running)
        })
    }
}

/// What settling one entry needs.
#[derive(Debug, Clone)]
struct Handle {
    stream: usize,
    id: String,
    /// Failed deliveries so far.
    attempts: u32,
}

/// An entry read but not yet in the pipeline.
struct Stalled {
    h: Handle,
    fields: Fields,
}

type Read = FutBox<'static, RedisResult<Value>>;

struct StreamsSource {
    name: String,
    client: redis::Client,
    streams: Vec<String>,
    group: String,
    consumer: String,
    claim_idle: Duration,
    window: usize,
    create: bool,
    start: Start,
    ty: String,
    source: String,
    /// `argo`: the events' subject.
    argo_subject: String,
    argo: bool,
    metadata: Vec<u8>,
    telemetry: PullTelemetry,
}

/// The loop's state besides the window.
struct State {
    /// Per stream: `0`/an id while replaying this consumer's pending entries, `>` once live.
    cursors: Vec<String>,
    /// Per stream: where the next `XAUTOCLAIM` scan continues.
    claim_cursors: Vec<String>,
    /// Entries this source holds (in the window, stalled or waiting for a retry): a replay or a
    /// claim that returns one of them again is ignored.
    known: foldhash::HashSet<(usize, String)>,
    stalled: VecDeque<Stalled>,
    /// Failed entries and when to claim them back for another attempt.
    retries: RetryQueue<Handle>,
    /// Entries to `XACK`, flushed when [`ACK_BATCH`] wait or the oldest has waited
    /// [`ACK_LINGER`].
    acks: Vec<(usize, String)>,
    acks_since: Option<Instant>,
    /// After an `XACK` failed: its entries wait with the next ones until then.
    ack_hold: Option<Instant>,
}

const ACK_BATCH: usize = 512;
const ACK_LINGER: Duration = Duration::from_millis(5);
/// How long the entries of a failed `XACK` wait before they are sent again.
const ACK_RETRY: Duration = Duration::from_millis(500);
/// At most this many entries wait for their `XACK` after failures; older ones are given up
/// (they stay pending and come back after `claim_idle`, dedup drops the repeat).
const ACKS_KEPT: usize = 100_000;

impl StreamsSource {
    async fn ensure_groups(&self, ctl: &mut ConnectionManager) -> Result<(), String> {
        for s in &self.streams {
            if self.create {
                let mut cmd = redis::cmd("XGROUP");
                cmd.arg("CREATE")
                    .arg(s)
                    .arg(&self.group)
                    .arg(match self.start {
                        Start::All => "0",
                        Start::New => "$",
                    })
                    .arg("MKSTREAM");
                match cmd.query_async::<Value>(ctl).await {
                    Ok(_) => {
                        tracing::info!(source = %self.name, stream = %s, group = %self.group, "redis-streams: consumer group created")
                    }
                    Err(e) if e.code() == Some("BUSYGROUP") => {}
                    Err(e) => {
                        return Err(format!(
                            "cannot create group {} on stream {s}: {e}",
                            self.group
                        ))
                    }
                }
            } else {
                let groups: RedisResult<Value> = redis::cmd("XINFO")
                    .arg("GROUPS")
                    .arg(s)
                    .query_async(ctl)
                    .await;
                let found = match &groups {
                    Ok(v) => group_info(v, &self.group).is_some(),
                    Err(_) => false,
                };
                if !found {
                    return Err(format!(
                        "stream {s} has no consumer group {} ({}); create it (XGROUP CREATE {s} {} 0 MKSTREAM) or set create: true",
                        self.group,
                        groups.err().map(|e| e.to_string()).unwrap_or_else(|| "not listed".into()),
                        self.group
                    ));
                }
            }
        }
        Ok(())
    }

    fn naming(&self) -> Naming<'_> {
        Naming {
            source: &self.source,
            ty: &self.ty,
            argo: self.argo.then_some(entry::ArgoShape {
                subject: &self.argo_subject,
                metadata: &self.metadata,
            }),
        }
    }

    fn read(&self, conn: &MultiplexedConnection, cursors: &[String], count: usize) -> Read {
        let live = cursors.iter().all(|c| c == ">");
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(count);
        if live {
            cmd.arg("BLOCK").arg(BLOCK.as_millis() as u64);
        }
        cmd.arg("STREAMS").arg(&self.streams).arg(cursors);
        let mut conn = conn.clone();
        Box::pin(async move {
            match tokio::time::timeout(BLOCK + COMMAND_TIMEOUT, cmd.query_async(&mut conn)).await {
                Ok(r) => r,
                Err(_) => Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "XREADGROUP timed out",
                ))),
            }
        })
    }

    async fn run(
        self,
        reader: MultiplexedConnection,
        mut ctl: ConnectionManager,
        ctx: SourceContext,
    ) -> Result<(), ConnectorError> {
        let n = self.streams.len();
        let mut st = State {
            cursors: vec!["0".to_owned(); n],
            claim_cursors: vec!["0-0".to_owned(); n],
            known: foldhash::HashSet::default(),
            stalled: VecDeque::new(),
            retries: RetryQueue::new(),
            acks: Vec::new(),
            acks_since: None,
            ack_hold: None,
        };
        let mut window: InFlight<Handle> = InFlight::new(self.window, self.claim_idle);
        let mut reader = Some(reader);
        let mut reading: Option<Read> = None;
        let mut reading_count = 0usize;
        let mut reconnect_at = Instant::now();
        let mut reconnects = 0u32;
        let mut stopping = false;
        let every = (self.claim_idle / 4).max(Duration::from_millis(250));
        let mut tick = tokio::time::interval_at(Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!(source = %self.name, streams = ?self.streams, group = %self.group, consumer = %self.consumer, "redis-streams: consuming");
        loop {
            if ctx.shutdown.is_cancelled() && !stopping {
                stopping = true;
                tracing::debug!(source = %self.name, in_flight = window.len(), "redis-streams: stopping; entries not yet sent stay pending for the next start");
            }
            if stopping && reading.is_none() && window.is_empty() {
                break;
            }
            let held = window.len() + st.stalled.len() + st.retries.len();
            let room = self.window.saturating_sub(held);
            // COUNT applies per stream: split the room, and leave half of the window for the
            // entries XAUTOCLAIM takes over while a read blocks.
            let per_stream = (room.min(self.window.div_ceil(2)) / n).max(1);
            // The room counts what is stalled too, so the next read overlaps handing the last one
            // to the pipeline.
            if !stopping && reading.is_none() && room > 0 {
                if let Some(conn) = &reader {
                    reading_count = per_stream * n;
                    let mut read = self.read(conn, &st.cursors, per_stream);
                    // Polled once and the thread yielded once, so that the connection's task
                    // writes the command now and Redis serves it while the last read's entries
                    // are handed to the pipeline below, not after.
                    if let std::task::Poll::Ready(r) = futures_util::poll!(read.as_mut()) {
                        read = Box::pin(std::future::ready(r));
                    }
                    reading = Some(read);
                    tokio::task::yield_now().await;
                }
            }
            if !stopping {
                self.offer(&ctx, &mut st, &mut window).await;
            }
            if st.acks.len() >= ACK_BATCH && st.ack_hold.is_none_or(|t| t <= Instant::now()) {
                self.flush_acks(&mut ctl, &mut st).await;
            }
            let ack_due = st
                .acks_since
                .map(|t| (t + ACK_LINGER).max(st.ack_hold.unwrap_or(t)));
            let retry_due = st.retries.next_due();
            tokio::select! {
                biased;
                Some((h, outcome)) = window.next(), if !window.is_empty() => {
                    self.settle(h, outcome, &mut st);
                    self.telemetry.in_flight.set(window.len() as f64);
                }
                r = async { reading.as_mut().expect("reading").await }, if reading.is_some() => {
                    reading = None;
                    reading_count = 0;
                    match r.and_then(|v| entry::read_reply(v).map_err(|e| redis::RedisError::from((redis::ErrorKind::Parse, "XREADGROUP", e)))) {
                        Ok(per_stream) => {
                            reconnects = 0;
                            self.take_read(per_stream, &mut st);
                        }
                        Err(e) => {
                            if e.code() == Some("NOGROUP") {
                                tracing::warn!(source = %self.name, error = %e, "redis-streams: the group or stream is gone");
                                if let Err(m) = self.ensure_groups(&mut ctl).await {
                                    return Err(ConnectorError(format!("redis-streams source {}: {m}", self.name)));
                                }
                            } else {
                                tracing::warn!(source = %self.name, error = %e, "redis-streams: read failed; reconnecting (pending entries are replayed)");
                                reader = None;
                                reconnect_at = Instant::now() + reconnect_delay(reconnects);
                                reconnects += 1;
                            }
                            // Whatever that read may have handed to this consumer is in its
                            // pending list: replay it.
                            st.cursors.iter_mut().for_each(|c| *c = "0".into());
                        }
                    }
                }
                _ = tokio::time::sleep_until(ack_due.unwrap_or_else(Instant::now)), if ack_due.is_some() => {
                    self.flush_acks(&mut ctl, &mut st).await;
                }
                _ = tokio::time::sleep_until(retry_due.unwrap_or_else(Instant::now)), if retry_due.is_some() && !stopping => {
                    self.claim_retries(&mut ctl, &mut st).await;
                }
                _ = tick.tick() => {
                    self.keep_alive(&mut ctl, &mut st, &mut window).await;
                    let claim_room = room.saturating_sub(reading_count);
                    if !stopping && claim_room > 0 && st.stalled.is_empty() {
                        self.autoclaim(&mut ctl, &mut st, claim_room).await;
                    }
                    self.update_lag(&mut ctl).await;
                }
                _ = tokio::time::sleep_until(reconnect_at), if reader.is_none() && !stopping => {
                    match connect(&self.client, None).await {
                        Ok(c) => {
                            tracing::info!(source = %self.name, "redis-streams: reconnected");
                            self.telemetry.reconnects.increment(1);
                            reader = Some(c);
                        }
                        Err(e) => {
                            tracing::warn!(source = %self.name, error = %e, "redis-streams: reconnect failed");
                            reconnect_at = Instant::now() + reconnect_delay(reconnects);
                            reconnects += 1;
                        }
                    }
                }
                _ = ctx.shutdown.cancelled(), if !stopping => {}
            }
        }
        let batch = st.take_acks();
        if let Err((failed, e)) = self.xack(&mut ctl, batch).await {
            tracing::warn!(source = %self.name, entries = failed.len(), error = %e, "redis-streams: the last XACK failed; those entries stay pending and are delivered again after claim_idle (dedup drops the repeats)");
        }
        tracing::debug!(source = %self.name, "redis-streams: stopped");
        Ok(())
    }

    fn take_read(&self, per_stream: Vec<(String, Vec<entry::Entry>)>, st: &mut State) {
        for (key, entries) in per_stream {
            let Some(i) = self.streams.iter().position(|s| *s == key) else {
                continue;
            };
            if st.cursors[i] != ">" {
                // Replaying this consumer's pending entries: continue after the last one, or go
                // live when none are left.
                match entries.last() {
                    Some(last) => st.cursors[i] = last.id.clone(),
                    None => st.cursors[i] = ">".into(),
                }
            }
            for e in entries {
                self.take_entry(i, e, 0, st);
            }
        }
    }

    /// Queues an entry for the pipeline unless this source already holds it.
    fn take_entry(&self, stream: usize, e: entry::Entry, attempts: u32, st: &mut State) {
        let key = (stream, e.id.clone());
        if st.known.contains(&key) {
            return;
        }
        match e.fields {
            // Deleted while pending: nothing to deliver; clear it from the pending list.
            None => st.ack(key),
            Some(fields) => {
                st.known.insert(key);
                st.stalled.push_back(Stalled {
                    h: Handle {
                        stream,
                        id: e.id,
                        attempts,
                    },
                    fields,
                });
            }
        }
    }

    /// Sends stalled entries into the pipeline while it takes them.
    async fn offer(&self, ctx: &SourceContext, st: &mut State, window: &mut InFlight<Handle>) {
        let naming = self.naming();
        while window.room() > 0 {
            let Some(s) = st.stalled.front() else { break };
            let stream = &self.streams[s.h.stream];
            let event = match entry::to_event(stream, &s.h.id, &s.fields, &naming) {
                Ok(e) => e,
                Err(e) => {
                    let s = st.stalled.pop_front().expect("front");
                    tracing::warn!(source = %self.name, stream = %stream, id = %s.h.id, error = %e, "redis-streams: not a valid CloudEvent; acknowledged without delivery (fix the producer)");
                    ctx.sender.telemetry().rejected("invalid_event", 1);
                    self.telemetry.settled(Settled::Reject, 1);
                    st.known.remove(&(s.h.stream, s.h.id.clone()));
                    st.ack((s.h.stream, s.h.id));
                    continue;
                }
            };
            let opts = SendOptions {
                timeout: Some((self.claim_idle / 4).min(Duration::from_secs(1))),
                ..SendOptions::default()
            };
            match ctx.sender.send_with(vec![event], opts).await {
                Ok(pending) => {
                    let s = st.stalled.pop_front().expect("front");
                    window.push(s.h, pending);
                    self.telemetry.in_flight.set(window.len() as f64);
                }
                // The pipeline is full: keep it, settle what finishes, try again.
                Err(_) => break,
            }
        }
    }

    fn settle(&self, mut h: Handle, outcome: Outcome, st: &mut State) {
        match outcome.status {
            Status::Delivered | Status::Rejected => {
                if outcome.status == Status::Rejected {
                    tracing::warn!(source = %self.name, stream = %self.streams[h.stream], id = %h.id, reason = outcome.reason.as_deref().unwrap_or(""), "redis-streams: event rejected by a sink; acknowledged");
                    self.telemetry.settled(Settled::Reject, 1);
                } else {
                    self.telemetry.settled(Settled::Ack, 1);
                }
                st.known.remove(&(h.stream, h.id.clone()));
                st.ack((h.stream, h.id));
            }
            Status::Failed | Status::InFlight => {
                h.attempts += 1;
                self.telemetry.settled(Settled::Retry, 1);
                st.retries.push_failed(h.attempts, h);
            }
        }
    }

    /// Sends the waiting acknowledgements; when that fails they wait [`ACK_RETRY`] with the
    /// next ones (a broken connection is reopened by the manager at the failed command).
    async fn flush_acks(&self, ctl: &mut ConnectionManager, st: &mut State) {
        let batch = st.take_acks();
        match self.xack(ctl, batch).await {
            Ok(()) => st.ack_hold = None,
            Err((failed, e)) => {
                tracing::warn!(source = %self.name, entries = failed.len(), error = %e, retry_in = ?ACK_RETRY, "redis-streams: XACK failed; the entries stay pending until it is sent again");
                let dropped = st.ack_failed(failed);
                if dropped > 0 {
                    tracing::warn!(source = %self.name, entries = dropped, kept = ACKS_KEPT, "redis-streams: too many acknowledgements waiting; the oldest were given up (those entries are delivered again after claim_idle, and dedup drops the repeats)");
                }
            }
        }
    }

    /// Acknowledges delivered entries, one `XACK` per stream, pipelined. Hands the batch back
    /// when the command failed.
    async fn xack(
        &self,
        ctl: &mut ConnectionManager,
        batch: Vec<(usize, String)>,
    ) -> Result<(), (Vec<(usize, String)>, redis::RedisError)> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut per: Vec<Vec<&str>> = vec![Vec::new(); self.streams.len()];
        for (s, id) in &batch {
            per[*s].push(id);
        }
        let mut pipe = redis::pipe();
        for (i, ids) in per.iter().enumerate().filter(|(_, ids)| !ids.is_empty()) {
            pipe.cmd("XACK")
                .arg(&self.streams[i])
                .arg(&self.group)
                .arg(ids)
                .ignore();
        }
        match pipe.query_async::<()>(ctl).await {
            Ok(()) => Ok(()),
            Err(e) => Err((batch, e)),
        }
    }

    /// Claims back the failed entries whose backoff is over (`XCLAIM` with min-idle 0 returns
    /// the entry and counts a delivery) and queues them again.
    async fn claim_retries(&self, ctl: &mut ConnectionManager, st: &mut State) {
        let due = st.retries.take_due(Instant::now(), usize::MAX);
        for h in due {
            let key = (h.stream, h.id.clone());
            st.known.remove(&key);
            let r: RedisResult<Value> = redis::cmd("XCLAIM")
                .arg(&self.streams[h.stream])
                .arg(&self.group)
                .arg(&self.consumer)
                .arg(0)
                .arg(&h.id)
                .query_async(ctl)
                .await;
            match r.map(entry::entries) {
                Ok(Ok(mut es)) if !es.is_empty() => {
                    self.telemetry.redeliveries.increment(1);
                    self.take_entry(h.stream, es.remove(0), h.attempts, st);
                }
                Ok(Ok(_)) => {
                    tracing::warn!(source = %self.name, stream = %self.streams[h.stream], id = %h.id, "redis-streams: a failed entry is gone from the stream (trimmed or deleted) before its retry");
                }
                Ok(Err(e)) => {
                    tracing::warn!(source = %self.name, error = %e, "redis-streams: XCLAIM reply not understood; retrying later");
                    st.known.insert(key);
                    st.retries.push_failed(h.attempts, h);
                }
                Err(e) => {
                    tracing::warn!(source = %self.name, error = %e, "redis-streams: XCLAIM failed; retrying later");
                    st.known.insert(key);
                    st.retries.push_failed(h.attempts, h);
                }
            }
        }
    }

    /// Resets the idle time of entries this source holds (`XCLAIM ... JUSTID`), so that no other
    /// consumer's `XAUTOCLAIM` takes them while they are in the pipeline.
    async fn keep_alive(
        &self,
        ctl: &mut ConnectionManager,
        st: &mut State,
        window: &mut InFlight<Handle>,
    ) {
        let mut per: Vec<Vec<String>> = vec![Vec::new(); self.streams.len()];
        window.extend_leases(self.claim_idle / 2, |h| per[h.stream].push(h.id.clone()));
        for s in &st.stalled {
            per[s.h.stream].push(s.h.id.clone());
        }
        for h in st.retries.iter() {
            per[h.stream].push(h.id.clone());
        }
        let total: usize = per.iter().map(Vec::len).sum();
        if total == 0 {
            return;
        }
        let mut pipe = redis::pipe();
        for (i, ids) in per.iter().enumerate().filter(|(_, ids)| !ids.is_empty()) {
            pipe.cmd("XCLAIM")
                .arg(&self.streams[i])
                .arg(&self.group)
                .arg(&self.consumer)
                .arg(0)
                .arg(ids)
                .arg("JUSTID")
                .ignore();
        }
        match pipe.query_async::<()>(ctl).await {
            Ok(()) => self.telemetry.lease_extensions.increment(total as u64),
            Err(e) => {
                tracing::warn!(source = %self.name, error = %e, "redis-streams: could not refresh in-flight entries; another consumer may claim them after claim_idle (dedup drops the repeats)")
            }
        }
    }

    /// Takes over entries idle longer than `claim_idle` in any consumer of the group.
    async fn autoclaim(&self, ctl: &mut ConnectionManager, st: &mut State, room: usize) {
        let mut left = room;
        for i in 0..self.streams.len() {
            if left == 0 {
                break;
            }
            let r: RedisResult<Value> = redis::cmd("XAUTOCLAIM")
                .arg(&self.streams[i])
                .arg(&self.group)
                .arg(&self.consumer)
                .arg(self.claim_idle.as_millis() as u64)
                .arg(&st.claim_cursors[i])
                .arg("COUNT")
                .arg(left)
                .query_async(ctl)
                .await;
            match r.map(entry::autoclaim_reply) {
                Ok(Ok((cursor, claimed, deleted))) => {
                    st.claim_cursors[i] = cursor;
                    if !claimed.is_empty() {
                        tracing::info!(source = %self.name, stream = %self.streams[i], entries = claimed.len(), "redis-streams: claimed entries idle longer than claim_idle (a consumer stopped)");
                    }
                    if !deleted.is_empty() {
                        tracing::warn!(source = %self.name, stream = %self.streams[i], entries = deleted.len(), "redis-streams: pending entries of another consumer were deleted before delivery");
                    }
                    for e in claimed {
                        left = left.saturating_sub(1);
                        self.telemetry.redeliveries.increment(1);
                        self.take_entry(i, e, 0, st);
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(source = %self.name, error = %e, "redis-streams: XAUTOCLAIM reply not understood")
                }
                Err(e) => {
                    tracing::warn!(source = %self.name, error = %e, "redis-streams: XAUTOCLAIM failed")
                }
            }
        }
    }

    /// `sluice_source_lag`: entries of the streams not yet delivered to the group (Redis 7).
    async fn update_lag(&self, ctl: &mut ConnectionManager) {
        let mut lag = 0i64;
        for s in &self.streams {
            let Ok(v) = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(s)
                .query_async::<Value>(ctl)
                .await
            else {
                return;
            };
            match group_info(&v, &self.group).and_then(|g| g.lag) {
                Some(l) => lag += l,
                None => return,
            }
        }
        self.telemetry.lag.set(lag as f64);
    }
}

impl State {
    fn ack(&mut self, h: (usize, String)) {
        if self.acks.is_empty() {
            self.acks_since = Some(Instant::now());
        }
        self.acks.push(h);
    }

    fn take_acks(&mut self) -> Vec<(usize, String)> {
        self.acks_since = None;
        std::mem::take(&mut self.acks)
    }

    /// Puts back the entries of a failed `XACK`, ahead of any newer ones, to be sent after
    /// [`ACK_RETRY`]; past [`ACKS_KEPT`] the oldest are given up. Returns how many were.
    fn ack_failed(&mut self, mut failed: Vec<(usize, String)>) -> usize {
        failed.append(&mut self.acks);
        let dropped = failed.len().saturating_sub(ACKS_KEPT);
        failed.drain(..dropped);
        self.acks = failed;
        let now = Instant::now();
        self.acks_since = Some(now);
        self.ack_hold = Some(now + ACK_RETRY);
        dropped
    }
}

struct GroupInfo {
    lag: Option<i64>,
}

/// Our group's entry in an `XINFO GROUPS` reply.
fn group_info(v: &Value, group: &str) -> Option<GroupInfo> {
    let groups = match v {
        Value::Array(a) => a,
        _ => return None,
    };
    for g in groups {
        let kv: Vec<(&Value, &Value)> = match g {
            Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
            Value::Array(a) => a
                .chunks(2)
                .filter_map(|c| Some((c.first()?, c.get(1)?)))
                .collect(),
            _ => continue,
        };
        let get = |name: &str| {
            kv.iter().find_map(|(k, v)| match k {
                Value::BulkString(b) if b == name.as_bytes() => Some(*v),
                Value::SimpleString(s) if s == name => Some(*v),
                _ => None,
            })
        };
        let is_ours = matches!(get("name"), Some(Value::BulkString(b)) if b == group.as_bytes())
            || matches!(get("name"), Some(Value::SimpleString(s)) if s == group);
        if is_ours {
            let lag = match get("lag") {
                Some(Value::Int(i)) => Some(*i),
                _ => None,
            };
            return Some(GroupInfo { lag });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_acknowledgements_go_first_and_stay_bounded() {
        let mut st = State {
            cursors: Vec::new(),
            claim_cursors: Vec::new(),
            known: foldhash::HashSet::default(),
            stalled: VecDeque::new(),
            retries: RetryQueue::new(),
            acks: vec![(0, "new-1".into()), (0, "new-2".into())],
            acks_since: None,
            ack_hold: None,
        };
        assert_eq!(st.ack_failed(vec![(0, "old-1".into())]), 0);
        let ids: Vec<&str> = st.acks.iter().map(|a| a.1.as_str()).collect();
        assert_eq!(ids, ["old-1", "new-1", "new-2"]);
        assert!(st.ack_hold.is_some() && st.acks_since.is_some());
        // Past ACKS_KEPT the oldest are given up, and counted.
        let many: Vec<(usize, String)> = (0..ACKS_KEPT).map(|i| (0, i.to_string())).collect();
        assert_eq!(st.ack_failed(many), 3);
        assert_eq!(st.acks.len(), ACKS_KEPT);
        assert_eq!(st.acks[0].1, "3");
        assert_eq!(st.acks.last().unwrap().1, "new-2");
    }
}
