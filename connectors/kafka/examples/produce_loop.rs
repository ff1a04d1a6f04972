//! The ceiling for webhook → Kafka: a raw rdkafka produce loop with the sink's producer settings
//! (idempotent, acks=all) and the same window of records awaiting their delivery report, 1 KiB
//! values. Prints delivered records per second.
//!
//! cargo run --release -p sluice-kafka --example produce_loop -- --brokers HOST:PORT --topic bench --seconds 8 --window 10000
//!
//! With `--count N` it stops after N records were sent (to preload a topic for the consumer
//! benchmarks) instead of after `--seconds`; `--partitions P` spreads them evenly.

use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let brokers = arg("--brokers").expect("--brokers");
    let topic = arg("--topic").unwrap_or_else(|| "bench".into());
    let seconds: u64 = arg("--seconds").map_or(8, |s| s.parse().unwrap());
    let window: usize = arg("--window").map_or(10_000, |s| s.parse().unwrap());
    let count: Option<u64> = arg("--count").map(|s| s.parse().unwrap());
    // With --partitions P, record n goes to partition n % P (an even preload).
    let partitions: Option<i32> = arg("--partitions").map(|s| s.parse().unwrap());
    let blocks = args.iter().any(|a| a == "--blocks");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("queue.buffering.max.messages", window.to_string())
            .create()
            .unwrap();
        let payload = vec![b'x'; 1024];
        let mut pending = FuturesUnordered::new();
        let started = Instant::now();
        let deadline = started + Duration::from_secs(seconds);
        let (mut ok, mut n) = (0u64, 0u64);
        while count.map_or(Instant::now() < deadline, |c| n < c) {
            if pending.len() >= window {
                if let Some(Ok(Ok(_))) = pending.next().await {
                    ok += 1;
                }
            }
            let key = format!("k{}", n % 64);
            n += 1;
            // A full librdkafka queue hands the record back: wait for one report, send it again
            // (with --count, exactly that many records are sent).
            let mut record = FutureRecord::to(&topic).key(&key).payload(&payload);
            if let Some(p) = partitions {
                let at = match count {
                    // Partition-major: N/P records to each partition in turn.
                    Some(c) if blocks => (n - 1) * p as u64 / c,
                    _ => (n - 1) % p as u64,
                };
                record = record.partition(at as i32);
            }
            loop {
                match producer.send_result(record) {
                    Ok(f) => {
                        pending.push(f);
                        break;
                    }
                    Err((_, back)) => {
                        record = back;
                        if let Some(Ok(Ok(_))) = pending.next().await {
                            ok += 1;
                        }
                    }
                }
            }
        }
        while let Some(r) = pending.next().await {
            if let Ok(Ok(_)) = r {
                ok += 1;
            }
        }
        if count.is_some() && ok != n {
            eprintln!("produce_loop: {} of {n} records were not delivered", n - ok);
            std::process::exit(1);
        }
        println!("{:.0}", ok as f64 / started.elapsed().as_secs_f64());
    });
}
