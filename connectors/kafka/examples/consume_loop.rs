//! The ceiling for Kafka → Sluice: a raw rdkafka consumer-group loop with the source's
//! discipline — offsets stored after each record is handled and committed asynchronously every
//! second, no auto-commit, cooperative-sticky assignment, the same prefetch bounds. Reads
//! `--count` records, prints records per second from the first record to the last.
//!
//! cargo run --release -p sluice-kafka --example consume_loop -- --brokers HOST:PORT --topic bench --group g1 --count 200000

use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

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
    let group = arg("--group").expect("--group");
    let count: u64 = arg("--count").map_or(100_000, |s| s.parse().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("queued.min.messages", "10000")
            .set("queued.max.messages.kbytes", "16384")
            // As the source sets it: with the default (1000 ms) a partition whose queue met
            // the bounds above waits a second for its next fetch, and this loop idles.
            .set("fetch.queue.backoff.ms", "10")
            .create()
            .unwrap();
        consumer.subscribe(&[&topic]).unwrap();
        let mut n = 0u64;
        let mut bytes = 0usize;
        let mut started = None;
        let mut last_commit = Instant::now();
        while n < count {
            // No record for 10 s once started (or 60 s before): fewer records than --count.
            let idle = if started.is_some() { 10 } else { 60 };
            let m = match tokio::time::timeout(Duration::from_secs(idle), consumer.recv()).await {
                Ok(m) => m.expect("consume"),
                Err(_) => {
                    eprintln!("consume_loop: only {n} of {count} records arrived");
                    std::process::exit(1);
                }
            };
            started.get_or_insert_with(Instant::now);
            bytes += m.payload().map_or(0, <[u8]>::len);
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(m.topic(), m.partition(), Offset::Offset(m.offset() + 1))
                .unwrap();
            consumer.store_offsets(&tpl).unwrap();
            n += 1;
            if last_commit.elapsed() >= Duration::from_secs(1) {
                let _ = consumer.commit_consumer_state(CommitMode::Async);
                last_commit = Instant::now();
            }
        }
        let _ = consumer.commit_consumer_state(CommitMode::Sync);
        let secs = started.unwrap().elapsed().as_secs_f64();
        std::hint::black_box(bytes);
        println!("{:.0}", n as f64 / secs);
    });
}
