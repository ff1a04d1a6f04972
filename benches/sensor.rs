//! Criterion: the Sensor's per-event work on one core (#16's goal: ≥ 500k events/s for a
//! sensor with two dependencies, a data filter and an expr filter). Run:
//! cargo bench --bench sensor
//!
//! The pipeline around it (queues, acknowledgements) is measured end to end by
//! benches/sensor.sh; here only matching, filtering, state and payload building.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use serde_json::json;
use sluice_core::event::Event;
use sluice_sensor::bench::Bench;

fn config() -> serde_json::Value {
    json!({
        "dependencies": [
            {"name": "push", "source": "gh", "type": "com.github.push",
             "filters": {"data": [{"path": "ref", "type": "string", "value": ["refs/heads/main"]}],
                         "exprs": [{"expr": "size > 10 && kind == 'x'", "fields": [{"name": "size", "path": "size"}, {"name": "kind", "path": "kind"}]}]}},
            {"name": "nightly", "source": "cron"}
        ],
        "triggers": [{
            "name": "submit", "conditions": "push && nightly", "sink": "api",
            "payload": [
                {"src": {"dependencyName": "push", "dataKey": "after"}, "dest": "commit"},
                {"src": {"dependencyName": "nightly", "contextKey": "time"}, "dest": "built_at"}
            ]
        }]
    })
}

fn push(size: u32) -> Event {
    // A push event's data trimmed to what sensors read, plus some bulk (~600 bytes).
    let pad = "x".repeat(500);
    Event::new("d1", "https://github.com/acme/app", "com.github.push").with_json(format!(
        r#"{{"ref":"refs/heads/main","before":"0000","after":"abc123","size":{size},"kind":"x","pusher":{{"name":"dev"}},"pad":"{pad}"}}"#
    ))
}

fn sensor(c: &mut Criterion) {
    let mut g = c.benchmark_group("sensor");
    g.throughput(Throughput::Elements(1));
    let filtered = push(3);
    let kept = push(30);
    let nightly = Event::new("n1", "/nightly", "build.finished").with_json(r#"{"ok":true}"#);
    // Filtered out by the expr (after the data filter passed): the common case on a busy hook.
    let mut b = Bench::new(config());
    g.bench_function("filtered", |x| {
        x.iter(|| black_box(b.event("gh", black_box(&filtered))))
    });
    // Passes both filters and replaces the kept push (Argo keeps the latest per dependency).
    let mut b = Bench::new(config());
    g.bench_function("kept", |x| {
        x.iter(|| black_box(b.event("gh", black_box(&kept))))
    });
    // A push then a nightly: the second completes the condition and builds the payload.
    g.throughput(Throughput::Elements(2));
    let mut b = Bench::new(config());
    g.bench_function("pair_fires", |x| {
        x.iter(|| {
            black_box(b.event("gh", black_box(&kept)));
            black_box(b.event("cron", black_box(&nightly)))
        })
    });
    g.finish();
}

criterion_group!(benches, sensor);
criterion_main!(benches);
