//! The `log` and `null` sinks.
//!
//! `log` writes one structured-mode JSON CloudEvent per line to standard output (the daemon's
//! own logs go to standard error, so the two never mix). An event counts as delivered once its
//! line was written and flushed. `null` accepts and discards, for benchmarks.

use serde::Deserialize;
use sluice_core::format::encode_event_into;
use sluice_core::{
    BoxFuture, ConnectorError, Delivery, Running, SinkConfig, SinkContext, SinkItem,
};
use tokio::io::AsyncWriteExt;

/// Argo Events' `log` trigger (`sluice run -f`): every event is written, so `intervalSeconds`
/// (Argo's throttle of its log lines) is noted and not applied.
pub fn argo_log(
    _ctx: &mut sluice_core::argo::map::TriggerCtx<'_>,
    f: &mut sluice_core::argo::map::Fields,
) -> serde_json::Value {
    f.ignore(
        "intervalSeconds",
        "Sluice writes every event, one line each, and throttles nothing",
    );
    serde_json::json!({})
}

/// Events taken from the queue per write.
const BATCH: usize = 512;

/// `kind: log` — one JSON CloudEvent per line on stdout.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {}

impl SinkConfig for LogConfig {
    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let out = tokio::io::stdout();
            Ok(Box::pin(run_log(ctx, out)) as Running)
        })
    }
}

/// Writes batches of lines to `out` until the input ends.
pub async fn run_log<W: tokio::io::AsyncWrite + Unpin>(
    mut ctx: SinkContext,
    mut out: W,
) -> Result<(), ConnectorError> {
    let mut items: Vec<SinkItem> = Vec::with_capacity(BATCH);
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        items.clear();
        if ctx.input.recv_many(&mut items, BATCH).await == 0 {
            return Ok(());
        }
        buf.clear();
        for item in &items {
            let start = buf.len();
            encode_event_into(&item.event, &mut buf);
            one_line(&mut buf[start..]);
            buf.push(b'\n');
        }
        let written = async {
            out.write_all(&buf).await?;
            out.flush().await
        };
        let result = tokio::select! {
            r = written => r,
            _ = ctx.grace_over.cancelled() => Err(std::io::Error::other("shutdown grace period over")),
        };
        match result {
            Ok(()) => Delivery::delivered_all(items.drain(..).map(|i| i.delivery)),
            Err(e) => {
                tracing::error!(sink = %ctx.name, error = %e, "log sink: writing to stdout failed; events are reported as failed");
                let reason = format!("writing to stdout failed: {e}");
                items
                    .drain(..)
                    .for_each(|i| i.delivery.failed(reason.clone()));
            }
        }
    }
}

/// Makes an encoded event one line: a JSON `data` embedded as it came may be pretty-printed
/// (Stripe and many senders indent theirs), and its line breaks would split the event across
/// lines for a log shipper or `jq`. In valid JSON a raw CR or LF can only be whitespace between
/// tokens (inside a string it must be escaped), so each becomes a space: the same JSON, on one
/// line. Other sinks keep the original bytes.
fn one_line(encoded: &mut [u8]) {
    let mut from = 0;
    while let Some(i) = memchr::memchr2(b'\n', b'\r', &encoded[from..]) {
        encoded[from + i] = b' ';
        from += i + 1;
    }
}

/// `kind: null` — accepts every event and discards it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NullConfig {}

impl SinkConfig for NullConfig {
    fn build(
        self: Box<Self>,
        mut ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            Ok(Box::pin(async move {
                let mut items = Vec::with_capacity(BATCH);
                while ctx.input.recv_many(&mut items, BATCH).await > 0 {
                    Delivery::delivered_all(items.drain(..).map(|i: SinkItem| i.delivery));
                }
                Ok(())
            }) as Running)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::testkit::{assert_sink_telemetry, SinkRig};
    use sluice_core::{format, Event, Status};

    #[tokio::test]
    async fn log_writes_one_json_line_per_event() {
        let mut rig = SinkRig::new("log-test");
        let ctx = rig.context("log-test");
        let (reader, writer) = tokio::io::duplex(1 << 20);
        let task = tokio::spawn(run_log(ctx, writer));
        let out = rig
            .send(vec![
                Event::new("1", "/s", "t").with_json(&b"{\"a\":1}"[..]),
                Event::new("2", "/s", "t"),
            ])
            .await;
        assert_eq!(out.status, Status::Delivered);
        rig.close();
        task.await.unwrap().unwrap();
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut { reader }, &mut text)
            .await
            .unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        let first = format::decode_event(&bytes::Bytes::from(lines[0].to_owned())).unwrap();
        assert_eq!(first.id, "1");
        assert_sink_telemetry("log-test", 2, 0);
    }

    #[tokio::test]
    async fn a_pretty_printed_json_body_is_still_one_line() {
        let mut rig = SinkRig::new("log");
        let ctx = rig.context("log");
        let (reader, writer) = tokio::io::duplex(1 << 20);
        let task = tokio::spawn(run_log(ctx, writer));
        let pretty = "{\n  \"amount\": 10,\r\n  \"note\": \"a\\nb\"\n}";
        let e = Event::new("p-1", "/stripe", "com.stripe.charge").with_json(pretty);
        assert!(rig.send(vec![e]).await.is_delivered());
        rig.close();
        task.await.unwrap().unwrap();
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut { reader }, &mut text)
            .await
            .unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text:?}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        // The same JSON: the escaped newline inside the string is kept.
        assert_eq!(v["data"], serde_json::json!({"amount": 10, "note": "a\nb"}));
    }

    #[tokio::test]
    async fn log_reports_failure_when_stdout_is_gone() {
        let mut rig = SinkRig::new("log-broken");
        let ctx = rig.context("log-broken");
        let (reader, writer) = tokio::io::duplex(16);
        drop(reader);
        tokio::spawn(run_log(ctx, writer));
        let out = rig.send(vec![Event::new("1", "/s", "t")]).await;
        assert_eq!(out.status, Status::Failed);
        assert_sink_telemetry("log-broken", 0, 1);
    }

    #[tokio::test]
    async fn null_delivers_everything() {
        let mut rig = SinkRig::new("null-test");
        let ctx = rig.context("null-test");
        let running = Box::new(NullConfig {}).build(ctx).await.unwrap();
        tokio::spawn(running);
        let events = (0..100)
            .map(|i| Event::new(i.to_string(), "/s", "t"))
            .collect();
        assert!(rig.send(events).await.is_delivered());
        assert_sink_telemetry("null-test", 100, 0);
    }
}
