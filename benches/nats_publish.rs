//! The ceiling for webhook → JetStream: a raw async-nats JetStream publish loop with a bounded
//! window of outstanding PubAcks, 1 KiB payloads, each with a unique Nats-Msg-Id.
//!
//! cargo bench --bench nats_publish -- --url nats://127.0.0.1:14222 --stream BENCH
//!     --subject bench.raw --seconds 8 --window 256
//! (Without --url it exits at once, so a plain `cargo bench` does not need a server.)

use std::collections::VecDeque;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let Some(url) = arg("--url") else {
        eprintln!(
            "nats_publish: pass --url to run the JetStream publish ceiling (see benches/nats.sh)"
        );
        return;
    };
    let stream = arg("--stream").unwrap_or_else(|| "BENCH".into());
    let subject = arg("--subject").unwrap_or_else(|| "bench.raw".into());
    let seconds: u64 = arg("--seconds").map_or(8, |s| s.parse().unwrap());
    let window: usize = arg("--window").map_or(256, |s| s.parse().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let client = async_nats::connect(url.as_str()).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        js.get_stream(&stream)
            .await
            .expect("the stream exists (benches/nats.sh creates it)");
        let payload = bytes::Bytes::from(vec![b'x'; 1024]);
        // Ids unique to this run: a repeat of an earlier round's id would be dropped by the
        // stream's duplicate window (a cheap PubAck, no write) and inflate the ceiling.
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let mut acks = VecDeque::with_capacity(window);
        let started = Instant::now();
        let deadline = started + Duration::from_secs(seconds);
        let mut sent: u64 = 0;
        let mut ok: u64 = 0;
        while Instant::now() < deadline {
            if acks.len() == window {
                let ack: async_nats::jetstream::context::PublishAckFuture =
                    acks.pop_front().unwrap();
                if ack.await.is_ok() {
                    ok += 1;
                }
            }
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", format!("raw-{run}-{sent}").as_str());
            acks.push_back(
                js.publish_with_headers(subject.clone(), headers, payload.clone())
                    .await
                    .expect("publish"),
            );
            sent += 1;
        }
        for ack in acks {
            if ack.await.is_ok() {
                ok += 1;
            }
        }
        let secs = started.elapsed().as_secs_f64();
        println!("{:.0}", ok as f64 / secs);
    });
}
