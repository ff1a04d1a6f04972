//! Raw client loops for `benches/brokers.sh`: the ceilings Sluice's broker connectors are held
//! against, each with the connector's acknowledgement discipline, and the preloads.
//!
//! ```text
//! broker_loops redis-preload  --url U --stream S --count N
//! broker_loops redis-consume  --url U --stream S --group G --count N --window W   XREADGROUP + XACK
//! broker_loops redis-publish  --url U --stream S --seconds T --batch B [--ce]     pipelined XADD
//! broker_loops amqp-preload   --url U --queue Q --count N
//! broker_loops amqp-consume   --url U --queue Q --count N --prefetch P             ack after each
//! broker_loops amqp-publish   --url U --exchange X --key K --seconds T --window W [--ce]  confirms
//! broker_loops amqp-delete    --url U --queue Q
//! broker_loops mqtt-session   --port P --topic T --client-id C                     persistent session
//! broker_loops mqtt-clear     --port P --client-id C                               ends that session
//! broker_loops mqtt-preload   --port P --topic T --count N
//! broker_loops mqtt-consume   --port P --topic T --client-id C --count N           QoS 1, PUBACK after each
//! broker_loops mqtt-publish   --port P --topic T --seconds T --inflight I          QoS 1, PUBACK = done
//! ```
//! Consumers print messages per second from the first message to the last; publishers print
//! confirmed messages per second. Without a subcommand it exits at once (plain `cargo bench`).
//!
//! `--ce`: the publishers write each message as the sink writes the benchmark's events, a
//! binary-mode CloudEvent (Redis: the `ce_*` fields and `content-type` before `data`; AMQP: the
//! `cloudEvents:*` headers, `message-id` and `content-type`), each with an id of its own, so
//! that the broker has the same work per message on both sides. Without it the message is the
//! bare payload.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

fn payload() -> Vec<u8> {
    let mut p = br#"{"pad":""#.to_vec();
    p.resize(1010, b'x');
    p.extend_from_slice(br#"","n":1}"#);
    p
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(cmd) = args.get(1).filter(|a| !a.starts_with('-')).cloned() else {
        eprintln!("broker_loops: pass a subcommand (see benches/brokers.sh)");
        return;
    };
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let num = |name: &str, d: u64| arg(name).map_or(d, |s| s.parse().unwrap());
    let ce = args.iter().any(|a| a == "--ce");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        match cmd.as_str() {
            "redis-preload" | "redis-consume" | "redis-publish" => {
                let client = redis::Client::open(arg("--url").expect("--url")).unwrap();
                let mut c = client.get_multiplexed_async_connection().await.unwrap();
                let stream = arg("--stream").expect("--stream");
                let body = payload();
                match cmd.as_str() {
                    "redis-preload" => {
                        let n = num("--count", 100_000);
                        let mut left = n;
                        while left > 0 {
                            let k = left.min(1000);
                            let mut pipe = redis::pipe();
                            for _ in 0..k {
                                pipe.cmd("XADD")
                                    .arg(&stream)
                                    .arg("*")
                                    .arg("data")
                                    .arg(&body)
                                    .ignore();
                            }
                            let _: () = pipe.query_async(&mut c).await.unwrap();
                            left -= k;
                        }
                    }
                    "redis-consume" => {
                        let group = arg("--group").expect("--group");
                        let count = num("--count", 100_000);
                        let window = num("--window", 1000).min(500);
                        let _: redis::RedisResult<()> = redis::cmd("XGROUP")
                            .arg(&["CREATE", &stream, &group, "0", "MKSTREAM"])
                            .query_async(&mut c)
                            .await;
                        let mut n = 0u64;
                        let mut started = None;
                        while n < count {
                            let v: redis::Value = redis::cmd("XREADGROUP")
                                .arg("GROUP")
                                .arg(&group)
                                .arg("raw")
                                .arg("COUNT")
                                .arg(window)
                                .arg("BLOCK")
                                .arg(1000)
                                .arg("STREAMS")
                                .arg(&stream)
                                .arg(">")
                                .query_async(&mut c)
                                .await
                                .unwrap();
                            let ids = entry_ids(&v);
                            if ids.is_empty() {
                                continue;
                            }
                            started.get_or_insert_with(Instant::now);
                            n += ids.len() as u64;
                            let _: () = redis::cmd("XACK")
                                .arg(&stream)
                                .arg(&group)
                                .arg(&ids)
                                .query_async(&mut c)
                                .await
                                .unwrap();
                        }
                        println!("{:.0}", n as f64 / started.unwrap().elapsed().as_secs_f64());
                    }
                    _ => {
                        let secs = num("--seconds", 8);
                        let batch = num("--batch", 500);
                        let t0 = Instant::now();
                        let mut n = 0u64;
                        let mut seq = 0u64;
                        while t0.elapsed() < Duration::from_secs(secs) {
                            let mut pipe = redis::pipe();
                            for _ in 0..batch {
                                let xadd = pipe
                                    .cmd("XADD")
                                    .arg(&stream)
                                    .arg("MAXLEN")
                                    .arg("~")
                                    .arg(1_000_000)
                                    .arg("*");
                                if ce {
                                    xadd.arg("ce_specversion")
                                        .arg("1.0")
                                        .arg("ce_id")
                                        .arg(format!("ID-{seq}"))
                                        .arg("ce_source")
                                        .arg("bench")
                                        .arg("ce_type")
                                        .arg("bench.order")
                                        .arg("content-type")
                                        .arg("application/json");
                                    seq += 1;
                                }
                                xadd.arg("data").arg(&body);
                            }
                            let ids: Vec<String> = pipe.query_async(&mut c).await.unwrap();
                            n += ids.len() as u64;
                        }
                        println!("{:.0}", n as f64 / t0.elapsed().as_secs_f64());
                    }
                }
            }
            "amqp-preload" | "amqp-consume" | "amqp-publish" | "amqp-delete" => {
                use lapin::options::*;
                use lapin::types::FieldTable;
                let conn = lapin::Connection::connect(
                    &arg("--url").expect("--url"),
                    lapin::ConnectionProperties::default(),
                )
                .await
                .unwrap();
                let ch = conn.create_channel().await.unwrap();
                let body = payload();
                match cmd.as_str() {
                    "amqp-delete" => {
                        let queue = arg("--queue").expect("--queue");
                        let _ = ch
                            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                            .await;
                    }
                    "amqp-preload" => {
                        let queue = arg("--queue").expect("--queue");
                        ch.queue_declare(
                            queue.as_str().into(),
                            QueueDeclareOptions {
                                durable: true,
                                ..Default::default()
                            },
                            FieldTable::default(),
                        )
                        .await
                        .unwrap();
                        ch.confirm_select(ConfirmSelectOptions::default())
                            .await
                            .unwrap();
                        let mut pending = VecDeque::new();
                        for _ in 0..num("--count", 100_000) {
                            if pending.len() >= 1000 {
                                let c: lapin::PublisherConfirm = pending.pop_front().unwrap();
                                c.await.unwrap();
                            }
                            pending.push_back(
                                ch.basic_publish(
                                    "".into(),
                                    queue.as_str().into(),
                                    BasicPublishOptions::default(),
                                    &body,
                                    lapin::BasicProperties::default().with_delivery_mode(2),
                                )
                                .await
                                .unwrap(),
                            );
                        }
                        for c in pending {
                            c.await.unwrap();
                        }
                    }
                    "amqp-consume" => {
                        let queue = arg("--queue").expect("--queue");
                        let count = num("--count", 100_000);
                        ch.basic_qos(num("--prefetch", 500) as u16, BasicQosOptions::default())
                            .await
                            .unwrap();
                        let mut consumer = ch
                            .basic_consume(
                                queue.as_str().into(),
                                "".into(),
                                BasicConsumeOptions::default(),
                                FieldTable::default(),
                            )
                            .await
                            .unwrap();
                        let mut n = 0u64;
                        let mut started = None;
                        while n < count {
                            let d = consumer.next().await.unwrap().unwrap();
                            started.get_or_insert_with(Instant::now);
                            std::hint::black_box(&d.data);
                            d.ack(BasicAckOptions::default()).await.unwrap();
                            n += 1;
                        }
                        println!("{:.0}", n as f64 / started.unwrap().elapsed().as_secs_f64());
                    }
                    _ => {
                        let exchange = arg("--exchange").expect("--exchange");
                        let key = arg("--key").unwrap_or_else(|| "bench".into());
                        let window = num("--window", 1000) as usize;
                        ch.confirm_select(ConfirmSelectOptions::default())
                            .await
                            .unwrap();
                        let secs = num("--seconds", 8);
                        let t0 = Instant::now();
                        let mut n = 0u64;
                        let mut pending = VecDeque::new();
                        let mut seq = 0u64;
                        while t0.elapsed() < Duration::from_secs(secs) {
                            if pending.len() >= window {
                                let c: lapin::PublisherConfirm = pending.pop_front().unwrap();
                                assert!(
                                    matches!(c.await.unwrap(), lapin::Confirmation::Ack(None)),
                                    "unroutable or nacked"
                                );
                                n += 1;
                            }
                            pending.push_back(
                                ch.basic_publish(
                                    exchange.as_str().into(),
                                    key.as_str().into(),
                                    BasicPublishOptions {
                                        mandatory: true,
                                        immediate: false,
                                    },
                                    &body,
                                    if ce {
                                        seq += 1;
                                        ce_properties(seq)
                                    } else {
                                        lapin::BasicProperties::default().with_delivery_mode(2)
                                    },
                                )
                                .await
                                .unwrap(),
                            );
                        }
                        for c in pending {
                            c.await.unwrap();
                            n += 1;
                        }
                        println!("{:.0}", n as f64 / t0.elapsed().as_secs_f64());
                    }
                }
            }
            "mqtt-session" | "mqtt-clear" | "mqtt-preload" | "mqtt-consume" | "mqtt-publish" => {
                use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
                let port = num("--port", 1883) as u16;
                let topic = arg("--topic").unwrap_or_default();
                let id =
                    arg("--client-id").unwrap_or_else(|| format!("bench-{}", std::process::id()));
                let mut o = MqttOptions::new(id, "127.0.0.1", port);
                o.set_keep_alive(Duration::from_secs(30));
                o.set_clean_session(matches!(
                    cmd.as_str(),
                    "mqtt-preload" | "mqtt-publish" | "mqtt-clear"
                ));
                o.set_manual_acks(cmd == "mqtt-consume");
                o.set_inflight(num("--inflight", 100) as u16);
                o.set_max_packet_size(1 << 20, 1 << 20);
                let (client, mut el) = AsyncClient::new(o, 10_000);
                let body = payload();
                match cmd.as_str() {
                    "mqtt-clear" => {
                        // A clean-session connect discards the stored session.
                        loop {
                            if let Event::Incoming(Packet::ConnAck(_)) = el.poll().await.unwrap() {
                                break;
                            }
                        }
                        client.disconnect().await.unwrap();
                        while el.poll().await.is_ok() {}
                    }
                    "mqtt-session" => {
                        client.subscribe(&topic, QoS::AtLeastOnce).await.unwrap();
                        loop {
                            if let Event::Incoming(Packet::SubAck(_)) = el.poll().await.unwrap() {
                                break;
                            }
                        }
                        client.disconnect().await.unwrap();
                        while el.poll().await.is_ok() {}
                    }
                    "mqtt-preload" | "mqtt-publish" => {
                        let count = if cmd == "mqtt-preload" {
                            num("--count", 100_000)
                        } else {
                            u64::MAX
                        };
                        let secs = num("--seconds", 8);
                        let c2 = client.clone();
                        let t = topic.clone();
                        let b = body.clone();
                        tokio::spawn(async move {
                            for _ in 0..count {
                                if c2
                                    .publish(t.as_str(), QoS::AtLeastOnce, false, b.clone())
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                            }
                        });
                        let t0 = Instant::now();
                        let mut acked = 0u64;
                        while acked < count
                            && (cmd == "mqtt-preload" || t0.elapsed() < Duration::from_secs(secs))
                        {
                            if let Event::Incoming(Packet::PubAck(_)) = el.poll().await.unwrap() {
                                acked += 1;
                            }
                        }
                        if cmd == "mqtt-publish" {
                            println!("{:.0}", acked as f64 / t0.elapsed().as_secs_f64());
                        }
                    }
                    _ => {
                        let count = num("--count", 100_000);
                        let mut n = 0u64;
                        let mut started = None;
                        // PUBACKs go through the client's request queue, which only the event
                        // loop drains: awaiting room in it here, while the loop is not polled,
                        // deadlocks under a backlog (seen with 200 000 messages). So acks wait
                        // here, in arrival order, for room.
                        let mut unacked = std::collections::VecDeque::new();
                        while n < count {
                            if let Event::Incoming(Packet::Publish(p)) = el.poll().await.unwrap() {
                                started.get_or_insert_with(Instant::now);
                                std::hint::black_box(&p.payload);
                                // Only what the PUBACK needs is kept: a held payload pins
                                // the client's read buffer (the MQTT source does the same).
                                unacked.push_back(rumqttc::Publish {
                                    dup: p.dup,
                                    qos: p.qos,
                                    retain: p.retain,
                                    topic: String::new(),
                                    pkid: p.pkid,
                                    payload: bytes::Bytes::new(),
                                });
                                n += 1;
                            }
                            while let Some(p) = unacked.front() {
                                if client.try_ack(p).is_err() {
                                    break;
                                }
                                unacked.pop_front();
                            }
                        }
                        println!("{:.0}", n as f64 / started.unwrap().elapsed().as_secs_f64());
                        // Not awaited: the request queue may be full of acknowledgements.
                        let _ = client.try_disconnect();
                        let _ = tokio::time::timeout(Duration::from_secs(2), async {
                            while el.poll().await.is_ok() {}
                        })
                        .await;
                    }
                }
            }
            other => eprintln!("broker_loops: unknown subcommand {other}"),
        }
    });
}

/// What the AMQP sink writes for one of the benchmark's events in binary mode (persistent).
fn ce_properties(seq: u64) -> lapin::BasicProperties {
    use lapin::types::{AMQPValue, FieldTable, LongString};
    let id = format!("ID-{seq}");
    let mut h = FieldTable::default();
    for (k, v) in [
        ("cloudEvents:specversion", "1.0"),
        ("cloudEvents:id", id.as_str()),
        ("cloudEvents:source", "bench"),
        ("cloudEvents:type", "bench.order"),
    ] {
        h.insert(
            k.into(),
            AMQPValue::LongString(LongString::from(v.as_bytes().to_vec())),
        );
    }
    lapin::BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(id.as_str().into())
        .with_headers(h)
        .with_content_type("application/json".into())
}

/// The entry ids of an XREADGROUP reply (RESP2).
fn entry_ids(v: &redis::Value) -> Vec<String> {
    let mut out = Vec::new();
    if let redis::Value::Array(streams) = v {
        for s in streams {
            if let redis::Value::Array(kv) = s {
                if let Some(redis::Value::Array(entries)) = kv.get(1) {
                    for e in entries {
                        if let redis::Value::Array(parts) = e {
                            if let Some(redis::Value::BulkString(id)) = parts.first() {
                                out.push(String::from_utf8_lossy(id).into_owned());
                            }
                        }
                    }
                }
            }
        }
    }
    out
}
