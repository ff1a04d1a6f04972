//! The raw SQS loops of `benches/sqs.sh`, on the same SDK and client settings as the `sqs`
//! source:
//!
//! - `fill --url U --queue Q --count N`: sends N messages of 1 KiB with `SendMessageBatch`
//!   (8 calls in flight);
//! - `drain --url U --queue Q --count N --concurrency C`: C loops of `ReceiveMessage` (10,
//!   long poll), each receive's `DeleteMessageBatch` sent without waiting for it (the next
//!   receive goes out at once), until N messages were deleted; prints messages/s (from the first
//!   received message to the last delete) and the API calls made per message.
//!
//! Credentials: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` from the environment (moto takes
//! any).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, SendMessageBatchRequestEntry};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).cloned().unwrap_or_default();
    let url = arg(&args, "--url").expect("--url");
    let queue = arg(&args, "--queue").expect("--queue");
    let count: u64 = arg(&args, "--count").expect("--count").parse().unwrap();
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(&url)
        .load()
        .await;
    let client = aws_sdk_sqs::Client::new(&sdk);
    let qurl = client
        .create_queue()
        .queue_name(&queue)
        .send()
        .await
        .expect("CreateQueue")
        .queue_url
        .unwrap();
    match mode.as_str() {
        "fill" => fill(client, qurl, count).await,
        "drain" => {
            let c: usize = arg(&args, "--concurrency")
                .unwrap_or_else(|| "4".into())
                .parse()
                .unwrap();
            drain(client, qurl, count, c).await
        }
        _ => panic!("usage: sqs_loop fill|drain --url U --queue Q --count N [--concurrency C]"),
    }
}

async fn fill(client: aws_sdk_sqs::Client, qurl: String, count: u64) {
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(1010));
    let mut tasks = tokio::task::JoinSet::new();
    let mut sent = 0u64;
    let mut batch_no = 0u64;
    while sent < count {
        let n = (count - sent).min(10);
        let entries: Vec<_> = (0..n)
            .map(|i| {
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(&body)
                    .build()
                    .unwrap()
            })
            .collect();
        let call = client
            .send_message_batch()
            .queue_url(&qurl)
            .set_entries(Some(entries));
        tasks.spawn(async move { call.send().await.expect("SendMessageBatch") });
        sent += n;
        batch_no += 1;
        if tasks.len() >= 8 {
            tasks.join_next().await;
        }
    }
    while tasks.join_next().await.is_some() {}
    eprintln!("filled {count} messages in {batch_no} calls");
}

async fn drain(client: aws_sdk_sqs::Client, qurl: String, count: u64, concurrency: usize) {
    let deleted = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let first = Arc::new(std::sync::OnceLock::<Instant>::new());
    let last = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, qurl, deleted, calls, first, last) = (
            client.clone(),
            qurl.clone(),
            deleted.clone(),
            calls.clone(),
            first.clone(),
            last.clone(),
        );
        tasks.spawn(async move {
            while deleted.load(Ordering::Relaxed) < count {
                let out = client
                    .receive_message()
                    .queue_url(&qurl)
                    .max_number_of_messages(10)
                    .wait_time_seconds(1)
                    .visibility_timeout(120)
                    .send()
                    .await
                    .expect("ReceiveMessage");
                calls.fetch_add(1, Ordering::Relaxed);
                let msgs = out.messages.unwrap_or_default();
                if msgs.is_empty() {
                    continue;
                }
                first.get_or_init(Instant::now);
                let entries: Vec<_> = msgs
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        DeleteMessageBatchRequestEntry::builder()
                            .id(i.to_string())
                            .receipt_handle(m.receipt_handle.clone().unwrap())
                            .build()
                            .unwrap()
                    })
                    .collect();
                // The delete goes on while this loop receives again (as the source's do).
                let delete = client
                    .delete_message_batch()
                    .queue_url(&qurl)
                    .set_entries(Some(entries));
                let (calls, deleted, last, n) = (
                    calls.clone(),
                    deleted.clone(),
                    last.clone(),
                    msgs.len() as u64,
                );
                tokio::spawn(async move {
                    delete.send().await.expect("DeleteMessageBatch");
                    calls.fetch_add(1, Ordering::Relaxed);
                    if deleted.fetch_add(n, Ordering::Relaxed) + n >= count {
                        last.get_or_init(Instant::now);
                    }
                });
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    // The last deletes may still be on their way.
    while deleted.load(Ordering::Relaxed) < count {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let secs = last
        .get()
        .unwrap()
        .duration_since(*first.get().unwrap())
        .as_secs_f64();
    let n = deleted.load(Ordering::Relaxed);
    println!(
        "{:.0} {:.3}",
        n as f64 / secs,
        calls.load(Ordering::Relaxed) as f64 / n as f64
    );
}
