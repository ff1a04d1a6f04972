//! The ceiling for JetStream → Sluice: a raw async-nats durable pull consumer with the source's
//! discipline — explicit `+ACK` per message after it is handled, `max_ack_pending` = the window,
//! the same pull batch. Reads `--count` messages, prints messages per second from the first
//! message to the last.
//!
//! cargo bench --bench jetstream_consume -- --url nats://127.0.0.1:14222 --stream BENCH
//!     --consumer raw1 --count 200000 --window 1000
//! `--preload N` instead publishes N 1 KiB messages to `--subject` (PubAck each, 256 in flight)
//! and exits. Without --url it exits at once, so a plain `cargo bench` needs no server.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let Some(url) = arg("--url") else {
        eprintln!("jetstream_consume: pass --url (see benches/consume.sh)");
        return;
    };
    let stream = arg("--stream").unwrap_or_else(|| "BENCH".into());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let client = async_nats::connect(url.as_str()).await.expect("connect");
        let js = jetstream::new(client.clone());
        if let Some(n) = arg("--preload") {
            let n: u64 = n.parse().unwrap();
            let subject = arg("--subject").unwrap_or_else(|| "bench.in".into());
            let payload = bytes::Bytes::from(vec![b'x'; 1024]);
            let mut acks = VecDeque::with_capacity(256);
            for _ in 0..n {
                if acks.len() == 256 {
                    let a: jetstream::context::PublishAckFuture = acks.pop_front().unwrap();
                    a.await.expect("PubAck");
                }
                acks.push_back(
                    js.publish(subject.clone(), payload.clone())
                        .await
                        .expect("publish"),
                );
            }
            for a in acks {
                a.await.expect("PubAck");
            }
            return;
        }
        let name = arg("--consumer").expect("--consumer");
        let count: u64 = arg("--count").map_or(100_000, |s| s.parse().unwrap());
        let window: usize = arg("--window").map_or(1000, |s| s.parse().unwrap());
        let s = js.get_stream(&stream).await.expect("the stream exists");
        let c: consumer::PullConsumer = s
            .create_consumer(consumer::pull::Config {
                durable_name: Some(name),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: window as i64,
                ..Default::default()
            })
            .await
            .expect("create consumer");
        let mut messages = c
            .stream()
            .max_messages_per_batch(window.min(500))
            .heartbeat(Duration::from_secs(5))
            .expires(Duration::from_secs(30))
            .messages()
            .await
            .unwrap();
        let mut n = 0u64;
        let mut bytes = 0usize;
        let mut started = None;
        while n < count {
            let m = match messages.next().await {
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    eprintln!("pull: {e}");
                    continue;
                }
                None => break,
            };
            started.get_or_insert_with(Instant::now);
            bytes += m.payload.len();
            m.ack().await.expect("ack");
            n += 1;
        }
        client.flush().await.unwrap();
        let secs = started.unwrap().elapsed().as_secs_f64();
        std::hint::black_box(bytes);
        println!("{:.0}", n as f64 / secs);
    });
}
