//! Argo Events' `calendar` EventSource onto `kind: schedule` (`sluice run -f`).

use serde_json::{json, Value};
use sluice_core::argo::map::{argo_source, EventCtx, Fields};

/// Argo's `calendar` EventSource: `schedule` (cron) or `interval`, `timezone`,
/// `exclusionDates`, `metadata`, `persistence.catchup`.
pub fn calendar(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut out = argo_source(ctx, f);
    let schedule = f.str("schedule");
    let interval = f.str("interval");
    match (schedule, interval) {
        (Some(s), other) => {
            if other.is_some() {
                f.note("interval", "`schedule` is given: as in Argo, it wins");
            }
            out.insert("cron".into(), json!(s));
        }
        (None, Some(i)) => {
            f.note(
                "interval",
                "Sluice aligns interval ticks to multiples of the interval since the epoch \
                 (stable ids across restarts and replicas), not to the start time",
            );
            out.insert("interval".into(), json!(i));
        }
        (None, None) => f.refuse_here("one of `schedule` or `interval` is required"),
    }
    if let Some(tz) = f.str("timezone") {
        out.insert("timezone".into(), json!(tz));
    }
    if let Some(d) = f.strings("exclusionDates") {
        out.insert("exclusion_dates".into(), json!(d));
    }
    if let Some(mut p) = f.obj("persistence") {
        if let Some(mut c) = p.obj("catchup") {
            let mut catchup = serde_json::Map::new();
            if let Some(e) = c.bool("enabled") {
                catchup.insert("enabled".into(), json!(e));
            }
            if let Some(d) = c.str("maxDuration") {
                catchup.insert("max_duration".into(), json!(d));
            }
            out.insert("catchup".into(), Value::Object(catchup));
        }
        p.ignore(
            "configMap",
            "Sluice keeps the last fired slot in `state_dir`, not in a ConfigMap",
        );
    }
    f.ignore(
        "userPayload",
        "Argo no longer sends it (the payload is {eventTime, metadata})",
    );
    f.refuse(
        "filter",
        "a source-side filter is not supported yet: move the expression into the Sensor's \
         dependency filters (`filters.exprs`)",
    );
    Value::Object(out)
}
