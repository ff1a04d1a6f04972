//! Criterion benchmarks: event encode/decode (ours and the CloudEvents SDK's) and dedup.
//! Run: cargo bench --bench core

use std::time::Duration;

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use http::HeaderMap;
use sluice_core::event::{Event, Timestamp};
use sluice_core::pipeline::wiring::{dedup_key, Dedup, DedupConfig, DedupScope};
use sluice_core::{format, http_binding};

fn sample() -> Event {
    // ~1 KiB of JSON data, as in the webhook benchmark.
    let mut data = String::from("{\"items\":[");
    while data.len() < 1000 {
        data.push_str("{\"sku\":\"A-1234\",\"qty\":3},");
    }
    data.pop();
    data.push_str("]}");
    let mut e = Event::new(
        "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
        "https://orders.example.com/api",
        "com.example.order.created",
    )
    .with_subject("orders/42")
    .with_time(Timestamp::parse("2026-11-30T12:00:00.123456Z").unwrap())
    .with_json(Bytes::from(data));
    e.set_extension(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    e
}

fn codec(c: &mut Criterion) {
    let e = sample();
    let structured = Bytes::from(format::encode_event(&e));
    let mut headers = HeaderMap::new();
    http_binding::encode_binary_headers(&e, &mut headers);
    let body = http_binding::binary_body(&e);

    let mut g = c.benchmark_group("event");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode_structured_1k", |b| {
        let mut out = Vec::with_capacity(2048);
        b.iter(|| {
            out.clear();
            format::encode_event_into(black_box(&e), &mut out);
        })
    });
    g.bench_function("decode_structured_1k", |b| {
        b.iter(|| format::decode_event(black_box(&structured)).unwrap())
    });
    // A batch of ten such events (as `benches/nats.sh BATCH=10` sends), per event.
    let batch = Bytes::from(format::encode_batch(&vec![e.clone(); 10]));
    g.bench_function("decode_batch_10x1k_per_event", |b| {
        b.iter_custom(|iters| {
            let start = std::time::Instant::now();
            for _ in 0..iters.div_ceil(10) {
                black_box(format::decode_batch(black_box(&batch)).unwrap());
            }
            start.elapsed()
        })
    });
    g.bench_function("encode_binary_headers", |b| {
        b.iter(|| {
            let mut h = HeaderMap::new();
            http_binding::encode_binary_headers(black_box(&e), &mut h);
            h
        })
    });
    g.bench_function("decode_binary_1k", |b| {
        b.iter(|| http_binding::decode_binary(black_box(&headers), body.clone()).unwrap())
    });
    g.finish();

    let mut g = c.benchmark_group("sdk");
    g.throughput(Throughput::Elements(1));
    g.bench_function("decode_structured_1k", |b| {
        b.iter(|| serde_json::from_slice::<cloudevents::Event>(black_box(&structured)).unwrap())
    });
    let theirs: cloudevents::Event = serde_json::from_slice(&structured).unwrap();
    g.bench_function("encode_structured_1k", |b| {
        b.iter(|| serde_json::to_vec(black_box(&theirs)).unwrap())
    });
    g.finish();
}

fn dedup(c: &mut Criterion) {
    let mut g = c.benchmark_group("dedup");
    g.throughput(Throughput::Elements(1));
    g.bench_function("key_xxh3_128", |b| {
        b.iter(|| {
            dedup_key(
                black_box("https://orders.example.com/api"),
                black_box("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
            )
        })
    });
    let cfg = DedupConfig {
        window: Duration::from_secs(600),
        capacity: 100_000,
        scope: DedupScope::Source,
    };
    // The steady state under load: a new key recorded into a full window (evicting the oldest
    // of its set) and confirmed, as one event's dedup work. Keys are hashes, as in the
    // pipeline; the table (6.4 MB) is larger than a core's own caches.
    g.bench_function("new_then_confirm_full_100k", |b| {
        let d = Dedup::new(cfg, false);
        for i in 0..400_000u64 {
            let k = dedup_key("s", &i.to_string());
            d.check_at(k, 1);
            d.confirm(k, 1);
        }
        let keys: Vec<u128> = (0..1_000_000u64)
            .map(|i| dedup_key("t", &i.to_string()))
            .collect();
        let mut i = 0;
        let mut at = 2;
        b.iter(|| {
            i += 1;
            if i == keys.len() {
                // Every key was recorded: the same keys again, a window later (new again).
                i = 0;
                at += 600_000;
            }
            let k = black_box(keys[i]);
            let c = d.check_at(k, at);
            d.confirm(k, at);
            c
        })
    });
    g.bench_function("lookup_hit_100k", |b| {
        let d = Dedup::new(cfg, false);
        let keys: Vec<u128> = (0..100_000u64)
            .map(|i| dedup_key("s", &i.to_string()))
            .collect();
        for k in &keys {
            d.check_at(*k, 1);
            d.confirm(*k, 1);
        }
        let mut i = 0;
        b.iter(|| {
            i = (i + 7919) % keys.len();
            d.check_at(black_box(keys[i]), 2)
        })
    });
    g.bench_function("insert_then_forget", |b| {
        let d = Dedup::new(cfg, false);
        b.iter_batched(
            || dedup_key("s", &uuid_like()),
            |k| {
                d.check_at(k, 1);
                d.forget(k, 1);
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("id-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// The pull-source kit: settle operations per second (goal: >= 1M/s on one core each).
fn pull_kit(c: &mut Criterion) {
    use futures_util::FutureExt;
    use sluice_core::pipeline::{Outcome, Status};
    use sluice_core::pull::{InFlight, Watermark};
    const OPS: u64 = 1024;
    let ready = || {
        std::future::ready(Outcome {
            status: Status::Delivered,
            reason: None,
            events: 1,
            duplicates: 0,
            each: Vec::new(),
        })
    };
    let mut g = c.benchmark_group("pull");
    g.throughput(Throughput::Elements(OPS));
    // One op: a message pushed into a window of 256 and its outcome taken back.
    g.bench_function("inflight_push_and_settle", |b| {
        let mut w: InFlight<u64, std::future::Ready<Outcome>> =
            InFlight::new(256, Duration::from_secs(30));
        b.iter(|| {
            let mut handle = 0u64;
            for _ in 0..OPS / 256 {
                for _ in 0..256 {
                    handle += 1;
                    w.push(handle, ready());
                }
                while let Some(Some((h, o))) = w.next().now_or_never() {
                    black_box((h, o.status));
                }
            }
        })
    });
    // One op: a position tracked, settled out of order (reversed in runs of 64) and released.
    g.bench_function("watermark_push_settle_advance", |b| {
        let mut w = Watermark::new(4096);
        let mut pos = 0u64;
        b.iter(|| {
            for _ in 0..OPS / 64 {
                let first = pos;
                for _ in 0..64 {
                    w.push(pos).unwrap();
                    pos += 1;
                }
                for p in (first..pos).rev() {
                    w.delivered(p);
                }
                black_box(w.advance(|p| {
                    black_box(p);
                }));
            }
        })
    });
    g.finish();
}

criterion_group!(benches, codec, dedup, pull_kit);
criterion_main!(benches);
