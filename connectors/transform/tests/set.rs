//! The `set` processor through the real pipeline (feed → processor queue → set → capture):
//! acknowledged only after its output is delivered, failures and rejections carried back,
//! the standard metrics labelled `processor`, and a drain when its input ends.

use std::time::Duration;

use sluice_core::testkit::{metric, ProcessorRig};
use sluice_core::{Event, ProcessorConfig, Status};
use sluice_transform::SetConfig;

fn set(json: &str) -> Box<SetConfig> {
    Box::new(serde_json::from_str(json).unwrap())
}

#[tokio::test]
async fn acknowledged_only_after_the_output_is_delivered_and_drains_on_close() {
    let mut rig = ProcessorRig::new("set-ack");
    let mut capture = rig.capture();
    let running = set(r#"{"type": "x.{type}", "extensions": {"seen": "yes"}}"#)
        .build(rig.context("set-ack"))
        .await
        .unwrap();
    let task = tokio::spawn(running);
    let pending = rig.sender().send(vec![Event::new("1", "/s", "t")]).await;
    let item = capture.next_within(Duration::from_secs(5)).await;
    assert_eq!(item.event.ty, "x.t");
    assert_eq!(
        item.event
            .extension("seen")
            .map(|v| v.to_canonical().into_owned()),
        Some("yes".into())
    );
    let mut pending = Box::pin(pending);
    tokio::task::yield_now().await;
    assert!(
        futures_util::poll!(pending.as_mut()).is_pending(),
        "not acknowledged before the capture delivered"
    );
    item.delivery.failed("downstream down");
    let out = pending.await;
    assert_eq!(out.status, Status::Failed);
    assert!(out.reason.unwrap().contains("downstream down"));
    // The retry goes through (the failed copy was forgotten by dedup) and is delivered.
    let pending = rig.sender().send(vec![Event::new("1", "/s", "t")]).await;
    capture.deliver_next().await;
    assert!(pending.await.is_delivered());
    assert_eq!(
        metric("sluice_events_received_total", &[("processor", "set-ack")]),
        2.0
    );
    assert_eq!(
        metric("sluice_events_delivered_total", &[("processor", "set-ack")]),
        1.0
    );
    // Drain: the feed goes, the processor returns, the capture's input ends.
    rig.close();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the processor returns when its input ends")
        .unwrap()
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(5), capture.next_or_end())
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn an_invalid_result_is_rejected_with_the_reason() {
    let mut rig = ProcessorRig::new("set-bad");
    let mut capture = rig.capture();
    let running = set(r#"{"type": "{nothing}"}"#)
        .build(rig.context("set-bad"))
        .await
        .unwrap();
    tokio::spawn(running);
    let out = rig
        .sender()
        .send(vec![Event::new("1", "/s", "t")])
        .await
        .await;
    assert_eq!(out.status, Status::Rejected);
    assert!(out.reason.unwrap().contains("not a valid CloudEvent"));
    assert!(capture.try_next().is_none(), "nothing forwarded");
}

#[test]
fn bad_config_is_a_clear_error() {
    let err = set(r#"{"extensions": {"Bad": "x"}}"#)
        .validate("p")
        .unwrap_err();
    assert!(err.starts_with("extensions.Bad:"), "{err}");
    let err = serde_json::from_str::<SetConfig>(r#"{"colour": "x"}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `colour`"), "{err}");
}
