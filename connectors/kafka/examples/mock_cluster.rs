//! librdkafka's mock cluster as a process, for benchmarks and manual tests: prints its bootstrap
//! address, then serves until stdin closes (or `--seconds` pass).
//!
//! cargo run --release -p sluice-kafka --example mock_cluster -- --brokers 1 --topic bench --partitions 3

use std::io::Read;
use std::time::Duration;

use rdkafka::mocking::MockCluster;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let brokers: i32 = arg("--brokers").map_or(1, |s| s.parse().unwrap());
    let topic = arg("--topic").unwrap_or_else(|| "bench".into());
    let partitions: i32 = arg("--partitions").map_or(3, |s| s.parse().unwrap());
    let cluster = MockCluster::new(brokers).expect("mock cluster");
    cluster
        .create_topic(&topic, partitions, brokers)
        .expect("create topic");
    println!("{}", cluster.bootstrap_servers());
    match arg("--seconds") {
        Some(s) => std::thread::sleep(Duration::from_secs(s.parse().unwrap())),
        None => {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        }
    }
}
