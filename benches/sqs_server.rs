//! A minimal in-memory SQS for `benches/sqs.sh`: the SQS JSON protocol (`X-Amz-Target:
//! AmazonSQS.<Operation>`, as the Rust SDK speaks it) for the calls the `sqs` source and the raw
//! loop make, with O(1) work per message, so that the client under test, not the server, is the
//! bottleneck. moto, which the tests use for fidelity, scans the whole queue on every call
//! (measured: `SendMessageBatch` 61 ms at 500 queued messages, 455 ms at 2000; `ReceiveMessage`
//! 1.5 s at 2000), which would make any client look the same.
//!
//! Not a test peer: no signatures checked, one queue per name, no FIFO, no redrive policy.
//!
//!   sqs_server --port 15000

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use md5::{Digest, Md5};
use serde_json::{json, Value};

struct Msg {
    id: String,
    body: String,
    md5: String,
    sent_ms: u128,
    receives: u32,
}

#[derive(Default)]
struct Queue {
    visible: VecDeque<Msg>,
    /// receipt → (message, visible again at).
    hidden: HashMap<String, (Msg, Instant)>,
    /// Receipts in the order they were hidden, to find expired ones without a scan.
    hidden_order: VecDeque<(String, Instant)>,
}

impl Queue {
    fn requeue_expired(&mut self, now: Instant) {
        while let Some((r, _)) = self.hidden_order.front() {
            match self.hidden.get(r) {
                None => {
                    self.hidden_order.pop_front();
                }
                Some((_, until)) if *until <= now => {
                    let (r, _) = self.hidden_order.pop_front().unwrap();
                    let (m, _) = self.hidden.remove(&r).unwrap();
                    self.visible.push_back(m);
                }
                // Extended leases sit later than their place in the order: stop at the first
                // unexpired one (an approximation a benchmark can live with).
                Some(_) => break,
            }
        }
    }
}

#[derive(Default)]
struct State {
    queues: HashMap<String, Queue>,
    seq: u64,
}

struct Server {
    state: Mutex<State>,
    arrived: tokio::sync::Notify,
    port: u16,
}

fn md5_hex(s: &str) -> String {
    let d = Md5::digest(s.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

impl Server {
    fn queue_name(v: &Value) -> String {
        v["QueueUrl"]
            .as_str()
            .and_then(|u| u.rsplit('/').next())
            .unwrap_or("")
            .to_owned()
    }

    async fn call(&self, op: &str, v: Value) -> Result<Value, (u16, &'static str, String)> {
        let url = |name: &str| format!("http://127.0.0.1:{}/000000000000/{name}", self.port);
        match op {
            "CreateQueue" | "GetQueueUrl" => {
                let name = v["QueueName"].as_str().unwrap_or("").to_owned();
                let mut st = self.state.lock().unwrap();
                if op == "CreateQueue" {
                    st.queues.entry(name.clone()).or_default();
                } else if !st.queues.contains_key(&name) {
                    return Err((400, "AWS.SimpleQueueService.NonExistentQueue", name));
                }
                Ok(json!({ "QueueUrl": url(&name) }))
            }
            "GetQueueAttributes" => {
                let name = Self::queue_name(&v);
                let st = self.state.lock().unwrap();
                let q = st.queues.get(&name).ok_or((
                    400,
                    "AWS.SimpleQueueService.NonExistentQueue",
                    name.clone(),
                ))?;
                Ok(json!({ "Attributes": {
                    "QueueArn": format!("arn:aws:sqs:us-east-1:000000000000:{name}"),
                    "ApproximateNumberOfMessages": q.visible.len().to_string(),
                    "ApproximateNumberOfMessagesNotVisible": q.hidden.len().to_string(),
                }}))
            }
            "SendMessageBatch" => {
                let name = Self::queue_name(&v);
                let mut ok = Vec::new();
                {
                    let mut st = self.state.lock().unwrap();
                    let st = &mut *st;
                    let q = st.queues.get_mut(&name).ok_or((
                        400,
                        "AWS.SimpleQueueService.NonExistentQueue",
                        name.clone(),
                    ))?;
                    for e in v["Entries"].as_array().into_iter().flatten() {
                        st.seq += 1;
                        let body = e["MessageBody"].as_str().unwrap_or("").to_owned();
                        let md5 = md5_hex(&body);
                        let id = format!("00000000-0000-4000-8000-{:012}", st.seq);
                        ok.push(json!({"Id": e["Id"], "MessageId": id, "MD5OfMessageBody": md5}));
                        q.visible.push_back(Msg {
                            id,
                            body,
                            md5,
                            sent_ms: now_ms(),
                            receives: 0,
                        });
                    }
                }
                self.arrived.notify_waiters();
                Ok(json!({ "Successful": ok, "Failed": [] }))
            }
            "ReceiveMessage" => {
                let name = Self::queue_name(&v);
                let max = v["MaxNumberOfMessages"].as_u64().unwrap_or(1).clamp(1, 10) as usize;
                let wait = Duration::from_secs(v["WaitTimeSeconds"].as_u64().unwrap_or(0));
                let vis = Duration::from_secs(v["VisibilityTimeout"].as_u64().unwrap_or(30));
                let deadline = Instant::now() + wait;
                loop {
                    let arrived = self.arrived.notified();
                    {
                        let mut st = self.state.lock().unwrap();
                        let st = &mut *st;
                        let q = st.queues.get_mut(&name).ok_or((
                            400,
                            "AWS.SimpleQueueService.NonExistentQueue",
                            name.clone(),
                        ))?;
                        let now = Instant::now();
                        q.requeue_expired(now);
                        if !q.visible.is_empty() || now >= deadline {
                            let mut out = Vec::new();
                            while out.len() < max {
                                let Some(mut m) = q.visible.pop_front() else {
                                    break;
                                };
                                m.receives += 1;
                                st.seq += 1;
                                let receipt = format!("r-{}-{}", m.id, st.seq);
                                out.push(json!({
                                    "MessageId": m.id, "ReceiptHandle": receipt, "MD5OfBody": m.md5, "Body": m.body,
                                    "Attributes": {"SentTimestamp": m.sent_ms.to_string(), "ApproximateReceiveCount": m.receives.to_string()},
                                }));
                                q.hidden_order.push_back((receipt.clone(), now + vis));
                                q.hidden.insert(receipt, (m, now + vis));
                            }
                            return Ok(json!({ "Messages": out }));
                        }
                    }
                    let _ = tokio::time::timeout_at(deadline.into(), arrived).await;
                }
            }
            "DeleteMessageBatch" | "ChangeMessageVisibilityBatch" => {
                let name = Self::queue_name(&v);
                let mut st = self.state.lock().unwrap();
                let q = st.queues.get_mut(&name).ok_or((
                    400,
                    "AWS.SimpleQueueService.NonExistentQueue",
                    name.clone(),
                ))?;
                let mut ok = Vec::new();
                let mut failed = Vec::new();
                let now = Instant::now();
                for e in v["Entries"].as_array().into_iter().flatten() {
                    let r = e["ReceiptHandle"].as_str().unwrap_or("");
                    let found = if op == "DeleteMessageBatch" {
                        q.hidden.remove(r).is_some()
                    } else {
                        let secs = e["VisibilityTimeout"].as_u64().unwrap_or(0);
                        match q.hidden.get_mut(r) {
                            Some(entry) => {
                                entry.1 = now + Duration::from_secs(secs);
                                q.hidden_order.push_back((r.to_owned(), entry.1));
                                true
                            }
                            None => false,
                        }
                    };
                    if found {
                        ok.push(json!({"Id": e["Id"]}));
                    } else {
                        failed.push(json!({"Id": e["Id"], "SenderFault": true, "Code": "ReceiptHandleIsInvalid"}));
                    }
                }
                Ok(json!({ "Successful": ok, "Failed": failed }))
            }
            _ => Err((400, "InvalidAction", op.to_owned())),
        }
    }

    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let op = req
            .headers()
            .get("x-amz-target")
            .and_then(|v| v.to_str().ok())
            .and_then(|t| t.strip_prefix("AmazonSQS."))
            .unwrap_or("")
            .to_owned();
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let (status, out) = match self.call(&op, v).await {
            Ok(v) => (200, v),
            Err((status, code, msg)) => (
                status,
                json!({"__type": format!("com.amazonaws.sqs#{code}"), "message": msg}),
            ),
        };
        let mut r = Response::new(Full::new(Bytes::from(serde_json::to_vec(&out).unwrap())));
        *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
        r.headers_mut().insert(
            "content-type",
            "application/x-amz-json-1.0".parse().unwrap(),
        );
        r.headers_mut()
            .insert("x-amzn-requestid", "bench".parse().unwrap());
        Ok(r)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = args
        .iter()
        .position(|a| a == "--port")
        .and_then(|i| args.get(i + 1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(15000);
    let server = Arc::new(Server {
        state: Mutex::new(State::default()),
        arrived: tokio::sync::Notify::new(),
        port,
    });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    loop {
        let (tcp, _) = listener.accept().await.expect("accept");
        let _ = tcp.set_nodelay(true);
        let s = server.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| s.clone().handle(req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
