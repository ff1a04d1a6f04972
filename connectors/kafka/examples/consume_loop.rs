//! The ceiling for Kafka → Sluice: a raw rdkafka consumer-group loop with the source's
//! discipline — offsets stored after each record is handled and committed asynchronously every
//! second, no auto-commit, cooperative-sticky assignment, the same prefetch bounds and fetch
//! size. Reads `--count` records, prints records per second from the first record to the last.
//!
//! With `--peer-pid PID` (the broker's process) it prints, after the rate, its own CPU and the
//! peer's over that same span, in per cent of one core: the process's CPU over its whole life
//! (the group join, the final commit and the close included) reads far lower than the loop's
//! while it reads, and would make a loop bound by its CPU look as if it waited.
//!
//! cargo run --release -p sluice-kafka --example consume_loop -- --brokers HOST:PORT --topic bench --group g1 --count 200000

use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// CPU seconds (user + system, all threads) of a process so far, from `/proc/<pid>/stat`.
fn cpu_secs(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    // Fields after the command name (which may hold spaces): utime and stime are the 12th and
    // 13th of them.
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .expect("a stat line")
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf reads a constant of the system.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

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
    let peer = arg("--peer-pid");
    // As the source sets it by default: a quarter of the prefetch bound below.
    let fetch_max = arg("--fetch-max-bytes").unwrap_or_else(|| (4 << 20).to_string());
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
            .set("fetch.max.bytes", &fetch_max)
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
            started.get_or_insert_with(|| {
                let cpu = peer.as_deref().map(|p| (cpu_secs("self"), cpu_secs(p)));
                (Instant::now(), cpu)
            });
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
        let (t0, cpu0) = started.unwrap();
        let secs = t0.elapsed().as_secs_f64();
        if cpu0.is_some() && secs < 1.0 {
            // CPU time is counted in ticks of 10 ms: over a shorter span it is off by percents.
            eprintln!("consume_loop: read everything in {secs:.2} s; raise --count for a CPU figure within a percent");
        }
        let cpu = cpu0.map(|(own, p)| {
            let peer = peer.as_deref().expect("a peer");
            (
                100.0 * (cpu_secs("self") - own) / secs,
                100.0 * (cpu_secs(peer) - p) / secs,
            )
        });
        let _ = consumer.commit_consumer_state(CommitMode::Sync);
        std::hint::black_box(bytes);
        match cpu {
            Some((own, peer)) => println!("{:.0} {own:.0} {peer:.0}", n as f64 / secs),
            None => println!("{:.0}", n as f64 / secs),
        }
    });
}
