//! Builds sources, pipeline and sinks from a config; starts them; drains and stops them.
//!
//! Stop order: sources stop taking input and finish what they accepted (answering each sender);
//! once the last source is gone the sink queues close; sinks deliver what is queued and return.
//! All of it within `shutdown_grace`; whatever is still unsettled then is reported as failed.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use metrics_exporter_prometheus::PrometheusHandle;
use sluice_core::pipeline::wiring::{self, DedupConfig, PipelineSpec, ProcessorSpec, SinkSpec};
use sluice_core::state::StateStore;
use sluice_core::{
    BoxFuture, ConnectorError, ProcessorContext, Running, Shared, SinkContext, SourceContext,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Component, Readiness};
use crate::config::Config;
use crate::state::RedbStore;

fn supervise(what: String, running: Running, up: Arc<Component>) -> JoinHandle<()> {
    metrics::gauge!(sluice_core::telemetry::COMPONENT_UP, "component" => what.clone()).set(1.0);
    tokio::spawn(async move {
        // A panic in a component ends its task; caught here, it is reported like an error
        // (before, the task ended without a word and /readyz and /healthz went on reporting
        // the component as running).
        let why = match std::panic::AssertUnwindSafe(running).catch_unwind().await {
            Ok(Ok(())) => {
                tracing::info!(component = %what, "stopped");
                "stopped".to_string()
            }
            Ok(Err(e)) => {
                tracing::error!(component = %what, error = %e, "stopped with an error; /readyz now reports it, /healthz after admin.liveness_grace");
                e.to_string()
            }
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".to_string());
                tracing::error!(component = %what, panic = %msg, "stopped by a panic (a bug: please report it); /readyz now reports it, /healthz after admin.liveness_grace");
                format!("panicked: {msg}")
            }
        };
        up.stopped(why);
        metrics::gauge!(sluice_core::telemetry::COMPONENT_UP, "component" => what).set(0.0);
    })
}

/// Builds one component (`what` is "sink NAME" and the like) and supervises it once running.
async fn start(
    what: String,
    kind: &str,
    build: BoxFuture<'static, Result<Running, ConnectorError>>,
    up: Arc<Component>,
) -> Result<JoinHandle<()>, String> {
    let running = build
        .await
        .map_err(|e| format!("{what} (kind {kind}): {e}"))?;
    up.running();
    Ok(supervise(what, running, up))
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// Every source and sink finished within `shutdown_grace`: whatever was accepted was
    /// settled (delivered, or answered as failed to its sender).
    Complete,
    /// Something was still running when the grace was over and was stopped: its unsettled
    /// events were reported failed to their senders where that was still possible.
    Incomplete,
}

/// Runs `config` until `stop` resolves, then drains. Errors are for the operator (exit 1).
pub async fn run(
    config: Config,
    metrics: PrometheusHandle,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Drain, String> {
    // Register every component before the admin server starts, so /readyz is 503 until all of
    // them are built and running.
    let ready = Arc::new(Readiness::new(config.admin.liveness_grace.get()));
    let sink_flags: Vec<_> = config
        .sinks
        .iter()
        .map(|s| ready.register(format!("sink {}", s.name)))
        .collect();
    let source_flags: Vec<_> = config
        .sources
        .iter()
        .map(|s| ready.register(format!("source {}", s.name)))
        .collect();
    let processor_flags: Vec<_> = config
        .processors
        .iter()
        .map(|p| ready.register(format!("processor {}", p.name)))
        .collect();
    let admin_stop = CancellationToken::new();
    // The exporter buffers histogram samples until drained. It holds none now (the delivery
    // latency is `telemetry::LatencyHistogram`), but one added later would grow without bound in
    // a daemon nobody scrapes: drain on a timer.
    let upkeep = metrics.clone();
    let upkeep_stop = admin_stop.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = tick.tick() => upkeep.run_upkeep(),
                _ = upkeep_stop.cancelled() => return,
            }
        }
    });
    if config.admin.enabled {
        let serve = admin::bind(
            config.admin.listen,
            metrics,
            ready.clone(),
            admin_stop.clone(),
        )
        .await?;
        tokio::spawn(serve);
        tracing::info!(listen = %config.admin.listen, "admin server: /metrics /healthz /readyz");
    }

    let store: Option<Arc<dyn StateStore>> = match &config.state_dir {
        Some(dir) => Some(Arc::new(RedbStore::open(dir)?) as Arc<dyn StateStore>),
        None => None,
    };
    let p = &config.pipeline;
    let spec = PipelineSpec {
        sources: config.sources.iter().map(|s| s.name.clone()).collect(),
        sinks: config
            .sinks
            .iter()
            .map(|s| SinkSpec {
                name: s.name.clone(),
                queue_events: s.common.queue_events.unwrap_or(p.queue_events),
                queue_bytes: s.common.queue_bytes.unwrap_or(p.queue_bytes).bytes(),
                when_full: s.common.when_full,
                dead_letter: s.dead_letter,
            })
            .collect(),
        processors: config
            .processors
            .iter()
            .map(|pr| ProcessorSpec {
                name: pr.name.clone(),
                queue_events: pr.common.queue_events.unwrap_or(p.queue_events),
                queue_bytes: pr.common.queue_bytes.unwrap_or(p.queue_bytes).bytes(),
            })
            .collect(),
        routes: config.routes.clone(),
        addressed: config.addressed.clone(),
        dedup: Some(DedupConfig {
            window: p.dedup_window.get(),
            capacity: p.dedup_capacity,
            scope: p.dedup.scope,
        }),
        dedup_persistent: store.is_some(),
        memory_budget: p.memory_budget.bytes(),
        unrouted: p.unrouted,
    };
    if config.routes.is_empty() && !config.sources.is_empty() {
        tracing::warn!("no routes: every event will be counted as unrouted and go nowhere");
    }
    let built = wiring::build(&spec);
    tokio::spawn(built.gauges.run(Duration::from_secs(1)));
    // Senders: the sources', then the processors'; inputs: the sinks', then the processors'.
    let (n_sources, n_sinks) = (config.sources.len(), config.sinks.len());
    let mut senders = built.senders.into_iter();
    let source_senders: Vec<_> = senders.by_ref().take(n_sources).collect();
    let processor_senders: Vec<_> = senders.collect();
    let mut inputs = built.inputs.into_iter();
    let sink_inputs: Vec<_> = inputs.by_ref().take(n_sinks).collect();
    let processor_inputs: Vec<_> = inputs.collect();

    let dedup_stop = CancellationToken::new();
    let mut dedup_task = None;
    if let (Some(dedup), Some(store)) = (&built.dedup, &store) {
        let (d, s) = (dedup.clone(), store.clone());
        let loaded = tokio::task::spawn_blocking(move || d.load(&*s))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("state_dir: cannot load the dedup window: {e}"))?;
        tracing::info!(entries = loaded, "dedup window restored from state_dir");
        dedup_task = Some(tokio::spawn(
            dedup
                .clone()
                .persist_until(store.clone(), dedup_stop.clone()),
        ));
    }

    let shared = Shared::default();
    let source_stop = CancellationToken::new();
    let sink_stop = CancellationToken::new();
    let mut sink_tasks = Vec::new();
    for ((entry, input), up) in config.sinks.into_iter().zip(sink_inputs).zip(sink_flags) {
        let ctx = SinkContext {
            name: entry.name.clone(),
            input,
            grace_over: sink_stop.clone(),
            state: store.clone(),
            shared: shared.clone(),
            health: up.health(),
        };
        let what = format!("sink {}", entry.name);
        sink_tasks.push(start(what, entry.kind, entry.config.build(ctx), up).await?);
    }
    // Processors downstream first, so each one's outputs run before it does.
    let mut processors: Vec<_> = config
        .processors
        .into_iter()
        .zip(processor_flags)
        .zip(processor_inputs.into_iter().zip(processor_senders))
        .map(Some)
        .collect();
    let mut processor_tasks = Vec::new();
    for &i in config.processor_order.iter().rev() {
        let ((entry, up), (input, sender)) = processors[i]
            .take()
            .expect("each processor once in the order");
        let ctx = ProcessorContext {
            name: entry.name.clone(),
            input,
            sender,
            grace_over: sink_stop.clone(),
            state: store.clone(),
            shared: shared.clone(),
            health: up.health(),
        };
        let what = format!("processor {}", entry.name);
        processor_tasks.push(start(what, entry.kind, entry.config.build(ctx), up).await?);
    }
    // Drained upstream first: the reverse of the build order.
    processor_tasks.reverse();
    let mut source_tasks = Vec::new();
    for ((entry, sender), up) in config
        .sources
        .into_iter()
        .zip(source_senders)
        .zip(source_flags)
    {
        let ctx = SourceContext {
            name: entry.name.clone(),
            shutdown: source_stop.clone(),
            sender,
            state: store.clone(),
            shared: shared.clone(),
            health: up.health(),
        };
        let what = format!("source {}", entry.name);
        source_tasks.push(start(what, entry.kind, entry.config.build(ctx), up).await?);
    }
    tracing::info!(file = %config.file, "sluice is running");

    stop.await;
    let grace = config.shutdown_grace;
    tracing::info!(grace = ?grace, "stopping: no new input; draining accepted events");
    let deadline = tokio::time::Instant::now() + grace;
    ready.draining();
    source_stop.cancel();
    let mut drain = Drain::Complete;
    for t in source_tasks {
        if tokio::time::timeout_at(deadline, t).await.is_err() {
            tracing::warn!("a source did not finish within shutdown_grace");
            drain = Drain::Incomplete;
        }
    }
    drop(shared);
    let mut unfinished = Vec::new();
    // Each processor's input ends once everything upstream of it is done; its output closes
    // when it returns.
    for mut t in processor_tasks {
        if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
            unfinished.push(t);
        }
    }
    for mut t in sink_tasks {
        if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
            unfinished.push(t);
        }
    }
    if !unfinished.is_empty() {
        drain = Drain::Incomplete;
        // Grace is over: sinks stop waiting on slow peers; unsettled events count as failed.
        tracing::warn!(
            sinks = unfinished.len(),
            "shutdown_grace is over; stopping sinks that are still delivering"
        );
        sink_stop.cancel();
        // One hard bound for all of them together, not 2 s each in turn.
        let hard = tokio::time::Instant::now() + Duration::from_secs(2);
        for t in unfinished {
            let abort = t.abort_handle();
            if tokio::time::timeout_at(hard, t).await.is_err() {
                tracing::warn!("a stage did not stop after the grace period; aborting it");
                abort.abort();
            }
        }
    }
    dedup_stop.cancel();
    if let Some(t) = dedup_task {
        // The final save runs on a blocking thread: a stuck state store must not hold the exit.
        if tokio::time::timeout(Duration::from_secs(2), t)
            .await
            .is_err()
        {
            tracing::warn!("dedup: the final save of the window did not finish in 2 s; skipped");
            drain = Drain::Incomplete;
        }
    }
    admin_stop.cancel();
    match drain {
        Drain::Complete => tracing::info!("stopped"),
        Drain::Incomplete => tracing::warn!(
            "stopped; the drain was incomplete (shutdown_grace was over): exit code 3"
        ),
    }
    Ok(drain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_component_that_panics_is_reported_stopped_with_the_panic() {
        let ready = Readiness::new(Duration::ZERO);
        let up = ready.register("source boom".into());
        up.running();
        let running: Running = Box::pin(async {
            if std::hint::black_box(true) {
                panic!("boom at offset 7");
            }
            Ok(())
        });
        supervise("source boom".into(), running, up)
            .await
            .expect("the supervising task ends normally");
        let dead = ready.dead();
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert!(dead[0].contains("panicked: boom at offset 7"), "{dead:?}");
        assert_eq!(ready.not_ready(), ["source boom"]);
    }
}
