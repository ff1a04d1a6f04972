//! The schedule loop on a controlled clock (tokio's paused time: no real waiting).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use sluice_core::state::StateStore;
use sluice_core::testkit::{metric, Collected, SourceRig};
use sluice_core::Status;
use sluice_schedule::{EventMaker, Runner, ScheduleConfig, TokioClock, STATE_TABLE};

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().to_utc()
}

fn config(v: serde_json::Value) -> ScheduleConfig {
    serde_json::from_value(v).unwrap()
}

struct Run {
    rig: SourceRig,
    task: tokio::task::JoinHandle<Result<(), sluice_core::ConnectorError>>,
}

fn start(
    name: &str,
    cfg: &ScheduleConfig,
    at: &str,
    rig: Option<SourceRig>,
) -> (Run, sluice_core::testkit::Capture) {
    let mut rig = rig.unwrap_or_else(|| SourceRig::new(name));
    let ctx = rig.context(name);
    let runner = Runner {
        name: name.into(),
        slots: cfg.slots().unwrap(),
        maker: EventMaker::new(cfg, name),
        catchup: cfg.catchup,
        sender: ctx.sender,
        state: ctx.state,
        shutdown: ctx.shutdown,
        clock: Arc::new(TokioClock {
            base: utc(at),
            start: tokio::time::Instant::now(),
        }),
    };
    let task = tokio::spawn(runner.run());
    let cap = rig.capture();
    (Run { rig, task }, cap)
}

fn ids(c: &Collected) -> Vec<String> {
    c.events().into_iter().map(|e| e.id.into()).collect()
}

#[tokio::test(start_paused = true)]
async fn interval_slots_have_slot_ids_and_times() {
    let cfg = config(json!({"interval": "10s", "data": {"job": "compact"}}));
    let (run, cap) = start("tick", &cfg, "2026-01-01T00:00:03Z", None);
    let got = cap.auto(Status::Delivered);
    tokio::time::sleep(Duration::from_secs(35)).await;
    assert_eq!(
        ids(&got),
        [
            "tick:2026-01-01T00:00:10Z",
            "tick:2026-01-01T00:00:20Z",
            "tick:2026-01-01T00:00:30Z"
        ]
    );
    let e = &got.events()[0];
    assert_eq!(e.ty, "schedule");
    assert_eq!(e.source, "tick");
    assert_eq!(e.time.as_ref().unwrap().as_str(), "2026-01-01T00:00:10Z");
    assert_eq!(&e.data.as_bytes().unwrap()[..], br#"{"job":"compact"}"#);
    run.rig.shutdown.cancel();
    run.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn two_instances_emit_the_same_ids() {
    let cfg = config(json!({"interval": "1m"}));
    let (a, cap_a) = start("twin", &cfg, "2026-01-01T00:00:05Z", None);
    let got_a = cap_a.auto(Status::Delivered);
    let (b, cap_b) = start(
        "twin",
        &cfg,
        "2026-01-01T00:00:50Z",
        Some(SourceRig::new("twin-b")),
    );
    let got_b = cap_b.auto(Status::Delivered);
    tokio::time::sleep(Duration::from_secs(150)).await;
    assert_eq!(ids(&got_a)[..2], ids(&got_b)[..2]);
    assert_eq!(ids(&got_a)[0], "twin:2026-01-01T00:01:00Z");
    a.rig.shutdown.cancel();
    b.rig.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn failed_slots_are_retried_in_order_never_skipped() {
    let cfg = config(json!({"interval": "1s"}));
    let (run, mut cap) = start("retry", &cfg, "2026-01-01T00:00:00.500Z", None);
    let first = cap.next_within(Duration::from_secs(5)).await;
    assert_eq!(first.event.id, "retry:2026-01-01T00:00:01Z");
    first.delivery.failed("sink down");
    let again = cap.next_within(Duration::from_secs(5)).await;
    assert_eq!(
        again.event.id, "retry:2026-01-01T00:00:01Z",
        "the same slot again"
    );
    again.delivery.delivered();
    // The pressure is visible while it lasts, and the next slots follow in order.
    let next = cap.next_within(Duration::from_secs(5)).await;
    assert_eq!(next.event.id, "retry:2026-01-01T00:00:02Z");
    next.delivery.delivered();
    assert!(metric("sluice_schedule_retries_total", &[("source", "retry")]) >= 1.0);
    run.rig.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn catchup_replays_missed_slots_in_order() {
    let cfg = config(json!({"interval": "1m", "catchup": {"enabled": true, "max_duration": "1h"}}));
    let rig = SourceRig::new("nightly");
    rig.state
        .write(STATE_TABLE, &[(b"nightly", b"2026-01-01T00:00:00Z")], &[])
        .unwrap();
    let (run, cap) = start("nightly", &cfg, "2026-01-01T00:05:30Z", Some(rig));
    let got = cap.auto(Status::Delivered);
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert_eq!(
        ids(&got),
        (1..=6)
            .map(|m| format!("nightly:2026-01-01T00:0{m}:00Z"))
            .collect::<Vec<_>>(),
        "five missed slots at once, then the next live one"
    );
    let last = run.rig.state.get(STATE_TABLE, b"nightly").unwrap().unwrap();
    assert_eq!(
        last, b"2026-01-01T00:06:00Z",
        "the last delivered slot is stored"
    );
    run.rig.shutdown.cancel();
}

/// A saved slot later than now (the clock went back) held every slot back until then.
#[tokio::test(start_paused = true)]
async fn a_saved_slot_in_the_future_does_not_silence_the_schedule() {
    for catchup in [true, false] {
        let cfg = config(
            json!({"interval": "1m", "catchup": {"enabled": catchup, "max_duration": "1h"}}),
        );
        let name = format!("ahead-{catchup}");
        let rig = SourceRig::new(&name);
        rig.state
            .write(
                STATE_TABLE,
                &[(name.as_bytes(), b"2026-01-01T05:00:00Z")],
                &[],
            )
            .unwrap();
        let (run, cap) = start(&name, &cfg, "2026-01-01T00:00:30Z", Some(rig));
        let got = cap.auto(Status::Delivered);
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert_eq!(
            ids(&got),
            [
                format!("{name}:2026-01-01T00:01:00Z"),
                format!("{name}:2026-01-01T00:02:00Z")
            ],
            "catchup {catchup}: the slots from now on"
        );
        run.rig.shutdown.cancel();
    }
}

#[tokio::test(start_paused = true)]
async fn catchup_is_bounded_by_max_duration() {
    let cfg =
        config(json!({"interval": "1m", "catchup": {"enabled": true, "max_duration": "10m"}}));
    let rig = SourceRig::new("bounded");
    rig.state
        .write(STATE_TABLE, &[(b"bounded", b"2026-01-01T00:00:00Z")], &[])
        .unwrap();
    let (run, cap) = start("bounded", &cfg, "2026-01-01T02:00:30Z", Some(rig));
    let got = cap.auto(Status::Delivered);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ids = ids(&got);
    assert_eq!(ids.len(), 10, "{ids:?}");
    assert_eq!(ids[0], "bounded:2026-01-01T01:51:00Z");
    assert_eq!(
        metric(
            "sluice_schedule_missed_slots_total",
            &[("source", "bounded")]
        ),
        110.0
    );
    run.rig.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn without_catchup_missed_slots_are_skipped_and_counted() {
    let cfg = config(json!({"interval": "1m"}));
    let rig = SourceRig::new("skip");
    rig.state
        .write(STATE_TABLE, &[(b"skip", b"2026-01-01T00:00:00Z")], &[])
        .unwrap();
    let (run, cap) = start("skip", &cfg, "2026-01-01T00:10:30Z", Some(rig));
    let got = cap.auto(Status::Delivered);
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert_eq!(ids(&got), ["skip:2026-01-01T00:11:00Z"]);
    assert_eq!(
        metric("sluice_schedule_missed_slots_total", &[("source", "skip")]),
        10.0
    );
    run.rig.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn argo_calendar_event_shape() {
    let cfg = config(
        json!({"cron": "0 30 2 * * *", "timezone": "Europe/Berlin", "format": "argo",
        "metadata": {"team": "data"}}),
    );
    let (run, cap) = start("cal", &cfg, "2026-11-30T01:29:59Z", None);
    let got = cap.auto(Status::Delivered);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let e = &got.wait_for(1).await[0];
    assert_eq!(
        (e.ty.as_str(), e.source.as_str(), e.subject.as_deref()),
        ("calendar", "cal", Some("cal"))
    );
    let data: serde_json::Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
    assert_eq!(
        data,
        json!({"eventTime": "2026-11-30 02:30:00 +0100 CET", "metadata": {"team": "data"}})
    );
    run.rig.shutdown.cancel();
}

#[test]
fn config_errors_are_clear() {
    use sluice_core::SourceConfig;
    let bad = |v| config(v).validate("s").unwrap_err();
    assert!(bad(json!({})).contains("give `cron`"));
    assert!(bad(json!({"cron": "* * *"})).contains("cron"));
    assert!(bad(json!({"interval": "1s", "timezone": "Mars/Base"})).contains("IANA"));
    assert!(bad(json!({"interval": "1s", "cron": "@daily"})).contains("not both"));
    assert!(bad(json!({"interval": "1s", "exclusion_dates": ["xmas"]})).contains("exclusion date"));
    assert!(bad(json!({"interval": "1s", "metadata": {"Bad.Key": "x"}})).contains("metadata"));
}

/// The push-source compliance check as it applies to a schedule (its "sender" is the clock):
/// a bad config is refused with a reason; a slot counts only once delivered (no later slot is
/// emitted while one waits, however long); two instances name a slot alike, so the pipeline's
/// dedup takes it once; a slot taken before the shutdown is still settled, and the source
/// returns by itself; the standard telemetry.
#[tokio::test(start_paused = true)]
async fn passes_the_push_source_compliance_check() {
    use sluice_core::SourceConfig;
    // The compliance of ScheduleConfig, step 1: a bad config is refused with a reason.
    let bad: ScheduleConfig = config(json!({"interval": "10s", "cron": "* * * * *"}));
    let msg = bad.validate("c").unwrap_err();
    assert!(!msg.trim().is_empty());

    let cfg = config(json!({"interval": "1s"}));
    let (run, mut cap) = start("comply", &cfg, "2026-01-01T00:00:00.500Z", None);
    let first = cap.next_within(Duration::from_secs(5)).await;
    assert_eq!(first.event.id, "comply:2026-01-01T00:00:01Z");
    // Held for 10 slots' time: nothing after it is emitted meanwhile.
    cap.assert_quiet(
        Duration::from_secs(10),
        "a later slot overtook an unsettled one",
    )
    .await;
    first.delivery.delivered();
    let second = cap.next_within(Duration::from_secs(5)).await;
    assert_eq!(second.event.id, "comply:2026-01-01T00:00:02Z");

    // Taken before the shutdown, settled after it; the source returns by itself.
    run.rig.shutdown.cancel();
    second.delivery.delivered();
    tokio::time::timeout(Duration::from_secs(10), run.task)
        .await
        .expect("the schedule returned after the shutdown")
        .unwrap()
        .unwrap();
    assert!(metric("sluice_events_received_total", &[("source", "comply")]) >= 2.0);
}
