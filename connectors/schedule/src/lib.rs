//! `kind: schedule` — cron and interval ticks whose event id is the slot.
//!
//! A slot is an instant the schedule names. Its event id is `<source name>:<slot in RFC 3339
//! UTC>`, so a restart, a catch-up replay or a second replica produce the same ids and the
//! dedup window (or the bus's own) drops the repeats. Slots are emitted in order; a slot whose
//! delivery fails is retried, never skipped silently.

pub mod argo;
mod slots;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use sluice_core::event::{Event, ExtValue, Timestamp};
use sluice_core::state::StateStore;
use sluice_core::units::HumanDuration;
use sluice_core::{BoxFuture, ConnectorError, Running, SourceConfig, SourceContext, SourceSender};
use tokio_util::sync::CancellationToken;

pub use slots::{parse_exclusion, Slots, Spec};

/// The state-store table: source name → last delivered slot (RFC 3339 UTC).
pub const STATE_TABLE: &str = "schedule";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Type `schedule`, data = `data`, time = the slot (default).
    #[default]
    Cloudevents,
    /// Argo Events' calendar event: type `calendar`, data `{eventTime, metadata}`.
    Argo,
}

/// `catchup: { enabled, max_duration }`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catchup {
    #[serde(default)]
    pub enabled: bool,
    /// How far back missed slots are replayed. Default 1h.
    #[serde(default = "default_max_duration")]
    pub max_duration: HumanDuration,
}

impl Default for Catchup {
    fn default() -> Self {
        Catchup {
            enabled: false,
            max_duration: default_max_duration(),
        }
    }
}

fn default_max_duration() -> HumanDuration {
    HumanDuration::from_secs(3600)
}

/// `kind: schedule` options.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// 5-field or 6-field (with seconds) cron, or a descriptor (`@hourly`, `@daily`, ...).
    pub cron: Option<String>,
    /// A fixed interval (`30s`, `5m`), aligned to `anchor` (default the Unix epoch).
    pub interval: Option<HumanDuration>,
    /// IANA time zone for `cron` and `exclusion_dates`. Default UTC.
    pub timezone: Option<String>,
    /// RFC 3339 instant interval slots are aligned to. Default 1970-01-01T00:00:00Z.
    pub anchor: Option<String>,
    /// Dates (`2026-12-25`) or Argo's `EXDATE:20261225T000000Z[,...]` on which nothing fires.
    #[serde(default)]
    pub exclusion_dates: Vec<String>,
    /// Static JSON payload of every event.
    pub data: Option<serde_json::Value>,
    /// Static strings: extensions in `cloudevents` format (names must be valid extension
    /// names), `data.metadata` in `argo` format.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub format: Format,
    /// Event `type`. Default `schedule` (`calendar` in `argo` format).
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// Event `source`. Default: the source's name.
    #[serde(rename = "source")]
    pub event_source: Option<String>,
    /// Event `subject`. Default: none (`argo`: the source's name).
    #[serde(rename = "subject")]
    pub event_subject: Option<String>,
    /// Replay missed slots after downtime (needs `state_dir`).
    #[serde(default)]
    pub catchup: Catchup,
}

impl ScheduleConfig {
    pub fn slots(&self) -> Result<Slots, String> {
        let tz: chrono_tz::Tz = match &self.timezone {
            Some(t) => t.parse().map_err(|_| {
                format!("timezone {t:?} is not an IANA time zone name (e.g. Europe/Berlin)")
            })?,
            None => chrono_tz::UTC,
        };
        let spec = match (&self.cron, &self.interval) {
            (Some(_), Some(_)) => return Err("give `cron` or `interval`, not both".into()),
            (None, None) => {
                return Err("give `cron` (e.g. \"0 30 2 * * *\") or `interval` (e.g. 30s)".into())
            }
            (Some(c), None) => Spec::cron(c)?,
            (None, Some(i)) => {
                let anchor = match &self.anchor {
                    Some(a) => DateTime::parse_from_rfc3339(a)
                        .map_err(|e| format!("anchor {a:?}: {e}"))?
                        .to_utc(),
                    None => DateTime::UNIX_EPOCH,
                };
                Spec::interval(i.get(), anchor)?
            }
        };
        let mut excluded = Vec::new();
        for d in &self.exclusion_dates {
            excluded.extend(parse_exclusion(d)?);
        }
        Ok(Slots::new(spec, tz, excluded))
    }
}

impl SourceConfig for ScheduleConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        self.slots()?;
        if self.format == Format::Cloudevents {
            for k in self.metadata.keys() {
                sluice_core::event::check_extension_name(k)
                    .map_err(|e| format!("metadata: {e}"))?;
            }
        }
        if let Some(s) = &self.event_source {
            Event::new("x", s.as_str(), "x")
                .validate()
                .map_err(|e| format!("source: {e}"))?;
        }
        Ok(())
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let slots = self
                .slots()
                .map_err(|e| ConnectorError(format!("schedule {}: {e}", ctx.name)))?;
            if self.catchup.enabled && ctx.state.is_none() {
                tracing::warn!(source = %ctx.name, "schedule: catchup needs state_dir; without it missed slots are skipped");
            }
            let maker = EventMaker::new(&self, &ctx.name);
            let runner = Runner {
                name: ctx.name.clone(),
                slots,
                maker,
                catchup: self.catchup,
                sender: ctx.sender,
                state: ctx.state,
                shutdown: ctx.shutdown,
                clock: Arc::new(SystemClock),
            };
            Ok(Box::pin(runner.run()) as Running)
        })
    }
}

/// Makes the event for a slot.
pub struct EventMaker {
    name: String,
    format: Format,
    ty: String,
    source: String,
    subject: Option<String>,
    data: Option<bytes::Bytes>,
    metadata: BTreeMap<String, String>,
}

impl EventMaker {
    pub fn new(cfg: &ScheduleConfig, name: &str) -> Self {
        EventMaker {
            name: name.to_owned(),
            format: cfg.format,
            ty: cfg.event_type.clone().unwrap_or_else(|| match cfg.format {
                Format::Cloudevents => "schedule".into(),
                Format::Argo => "calendar".into(),
            }),
            source: cfg.event_source.clone().unwrap_or_else(|| name.to_owned()),
            subject: cfg.event_subject.clone().or_else(|| match cfg.format {
                Format::Cloudevents => None,
                Format::Argo => Some(name.to_owned()),
            }),
            data: cfg
                .data
                .as_ref()
                .map(|d| bytes::Bytes::from(serde_json::to_vec(d).unwrap_or_default())),
            metadata: cfg.metadata.clone(),
        }
    }

    /// The id of a slot: `<name>:<slot RFC 3339 UTC>`.
    pub fn id(&self, slot: DateTime<Utc>) -> String {
        format!("{}:{}", self.name, slot_text(slot))
    }

    pub fn event(&self, slot: DateTime<Utc>, tz: chrono_tz::Tz) -> Event {
        let mut e = Event::new(self.id(slot), self.source.clone(), self.ty.clone())
            .with_time(Timestamp::from_utc(slot));
        e.subject = self.subject.as_deref().map(Into::into);
        match self.format {
            Format::Cloudevents => {
                if let Some(d) = &self.data {
                    e = e.with_json(d.clone());
                }
                for (k, v) in &self.metadata {
                    e.set_extension(k.as_str(), ExtValue::String(v.into()));
                }
            }
            Format::Argo => {
                // Go's time.String(): "2006-01-02 15:04:05 -0700 MST" (slots have no fraction).
                let local = slot.with_timezone(&tz);
                let event_time = local.format("%Y-%m-%d %H:%M:%S %z %Z").to_string();
                let data = serde_json::json!({"eventTime": event_time, "metadata": self.metadata});
                e = e.with_json(serde_json::to_vec(&data).unwrap_or_default());
            }
        }
        e
    }
}

fn slot_text(slot: DateTime<Utc>) -> String {
    slot.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// Wall-clock time, replaceable in tests.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves with tokio's (pausable) time, starting at `base`.
pub struct TokioClock {
    pub base: DateTime<Utc>,
    pub start: tokio::time::Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        self.base + (tokio::time::Instant::now() - self.start)
    }
}

/// The loop behind one schedule source.
pub struct Runner {
    pub name: String,
    pub slots: Slots,
    pub maker: EventMaker,
    pub catchup: Catchup,
    pub sender: SourceSender,
    pub state: Option<Arc<dyn StateStore>>,
    pub shutdown: CancellationToken,
    pub clock: Arc<dyn Clock>,
}

impl Runner {
    fn load_last(&self) -> Option<DateTime<Utc>> {
        let store = self.state.as_ref()?;
        match store.get(STATE_TABLE, self.name.as_bytes()) {
            Ok(Some(v)) => std::str::from_utf8(&v)
                .ok()
                .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                .map(|d| d.to_utc()),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(source = %self.name, error = %e, "schedule: cannot read the last slot; starting from now");
                None
            }
        }
    }

    fn store_last(&self, slot: DateTime<Utc>) {
        if let Some(store) = &self.state {
            let text = slot_text(slot);
            if let Err(e) =
                store.write(STATE_TABLE, &[(self.name.as_bytes(), text.as_bytes())], &[])
            {
                tracing::warn!(source = %self.name, error = %e, "schedule: cannot save the last slot; a restart may replay it (dedup drops the repeat)");
            }
        }
    }

    /// Sleeps until `t` on the clock, waking early on shutdown (false).
    async fn sleep_until(&self, t: DateTime<Utc>) -> bool {
        loop {
            let left = t - self.clock.now();
            let Ok(left) = left.to_std() else { return true };
            if left.is_zero() {
                return true;
            }
            // Re-check at least every minute, so wall-clock jumps are noticed.
            tokio::select! {
                _ = tokio::time::sleep(left.min(StdDuration::from_secs(60))) => {}
                _ = self.shutdown.cancelled() => return false,
            }
        }
    }

    pub async fn run(self) -> Result<(), ConnectorError> {
        let label = self.name.clone();
        let emitted = metrics::counter!("sluice_schedule_slots_total", "source" => label.clone());
        let missed =
            metrics::counter!("sluice_schedule_missed_slots_total", "source" => label.clone());
        let retries = metrics::counter!("sluice_schedule_retries_total", "source" => label.clone());
        let lag = metrics::gauge!("sluice_schedule_lag_seconds", "source" => label);

        let now = self.clock.now();
        let mut cursor = now;
        if let Some(saved) = self.load_last() {
            // A saved slot later than now (the clock went back, or the state file came from
            // another host) would hold every slot back until then: resume from now. A slot
            // emitted again keeps its id, so dedup drops the repeat.
            if saved > now {
                tracing::warn!(source = %self.name, saved = %slot_text(saved), now = %slot_text(now), "schedule: the saved last slot is later than now; resuming from now");
            }
            let last = saved.min(now);
            if self.catchup.enabled {
                let floor = now
                    - chrono::Duration::from_std(self.catchup.max_duration.get())
                        .unwrap_or_default();
                if last < floor {
                    let skipped = self.slots.count_between(last, floor, 1_000_000);
                    missed.increment(skipped);
                    tracing::warn!(source = %self.name, skipped, "schedule: slots older than catchup.max_duration are skipped");
                }
                cursor = last.max(floor);
                tracing::info!(source = %self.name, from = %slot_text(cursor), "schedule: catching up");
            } else {
                let skipped = self.slots.count_between(last, now, 1_000_000);
                if skipped > 0 {
                    missed.increment(skipped);
                    tracing::info!(source = %self.name, skipped, "schedule: slots missed while down are skipped (catchup is off)");
                }
            }
        }
        let mut iter = self.slots.after(cursor);
        let mut backoff = StdDuration::from_millis(200);
        let mut slot = match iter.next() {
            Some(s) => s,
            None => return Ok(()),
        };
        loop {
            if !self.sleep_until(slot).await {
                return Ok(());
            }
            lag.set((self.clock.now() - slot).num_milliseconds() as f64 / 1000.0);
            let event = self.maker.event(slot, self.slots.tz());
            let outcome = self.sender.send(vec![event]).await.await;
            if outcome.is_delivered() {
                emitted.increment(1);
                self.store_last(slot);
                backoff = StdDuration::from_millis(200);
                slot = match iter.next() {
                    Some(s) => s,
                    None => return Ok(()),
                };
            } else {
                retries.increment(1);
                tracing::warn!(source = %self.name, slot = %slot_text(slot),
                    reason = outcome.reason.as_deref().unwrap_or("unknown"),
                    retry_in = ?backoff, "schedule: slot not delivered; retrying the same slot");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = self.shutdown.cancelled() => return Ok(()),
                }
                backoff = (backoff * 2).min(StdDuration::from_secs(30));
            }
            if self.shutdown.is_cancelled() {
                return Ok(());
            }
        }
    }
}
