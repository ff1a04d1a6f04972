//! Argo Events' own example Sensors (tests/data/argo, see its README): each maps onto a Sluice
//! sensor that compiles, and the examples of each filter, transform and parameter feature
//! behave on sample events as their comments say.

use serde_json::{json, Value};
use sluice_core::{Event, ProcessorConfig, Timestamp};
use sluice_sensor::bench::Bench;
use sluice_sensor::SensorConfig;

const TRIGGER_KINDS: [&str; 14] = [
    "argoWorkflow",
    "k8s",
    "http",
    "awsLambda",
    "kafka",
    "nats",
    "slack",
    "log",
    "azureEventHubs",
    "azureServiceBus",
    "pulsar",
    "openWhisk",
    "custom",
    "email",
];

/// An Argo `Sensor` spec as a Sluice sensor: dependencies keep their names, filters and
/// transforms (the same field names); the source is `<eventSourceName>:<eventName>` (one
/// Sluice source per Argo event). A trigger's target
/// becomes the sink `target`; its `payload`, its type's `parameters` and the trigger-level
/// `parameters` all become payload parameters (the same src resolution and dest writing:
/// Argo applies them to the trigger's own JSON, Sluice to the output's data).
fn map(spec: &Value) -> Value {
    let deps: Vec<Value> = spec["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let source = format!(
                "{}:{}",
                d["eventSourceName"].as_str().unwrap_or(""),
                d["eventName"].as_str().unwrap_or("")
            );
            let mut m = json!({"name": d["name"], "source": source});
            for k in ["filters", "filtersLogicalOperator", "transform"] {
                if !d[k].is_null() {
                    m[k] = d[k].clone();
                }
            }
            m
        })
        .collect();
    let triggers: Vec<Value> = spec["triggers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| trigger(t, "target", true))
        .collect();
    json!({"dependencies": deps, "triggers": triggers})
}

/// An Argo trigger as a Sluice trigger sending to `sink`; its `dlqTrigger` (a whole trigger
/// in Argo) becomes a whole `dlqTrigger` sending to the sink `parked`.
fn trigger(t: &Value, sink: &str, top: bool) -> Value {
    let tpl = &t["template"];
    let mut payload = Vec::new();
    for kind in TRIGGER_KINDS {
        for key in ["payload", "parameters"] {
            if let Some(list) = tpl[kind][key].as_array() {
                payload.extend(list.iter().cloned());
            }
        }
    }
    if let Some(list) = t["parameters"].as_array() {
        payload.extend(list.iter().cloned());
    }
    let mut m = json!({"name": tpl["name"], "sink": sink, "payload": payload});
    if top {
        for k in ["conditions", "conditionsReset"] {
            if !tpl[k].is_null() {
                m[k] = tpl[k].clone();
            }
        }
    }
    for k in ["retryStrategy", "rateLimit", "atLeastOnce"] {
        if !t[k].is_null() {
            m[k] = t[k].clone();
        }
    }
    if top && !t["dlqTrigger"].is_null() {
        m["dlqTrigger"] = trigger(&t["dlqTrigger"], "parked", false);
    }
    m
}

fn sensors() -> Vec<(String, Value)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/argo");
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in yaml_serde::Deserializer::from_str(&text) {
            let v: Value =
                serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{name}: {e}"));
            if v["kind"] == "Sensor" {
                out.push((name.clone(), v["spec"].clone()));
            }
        }
    }
    out
}

#[test]
fn every_example_sensor_maps_and_compiles() {
    let all = sensors();
    assert!(all.len() >= 100, "{} sensors", all.len());
    let mut failures = Vec::new();
    for (name, spec) in &all {
        let cfg = map(spec);
        let parsed: Result<SensorConfig, _> = serde_json::from_value(cfg.clone());
        match parsed {
            Err(e) => failures.push(format!("{name}: {e}")),
            Ok(c) => {
                if let Err(e) = c.validate("argo") {
                    failures.push(format!("{name}: {e}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {}:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

fn example(file: &str) -> Value {
    let (_, spec) = sensors()
        .into_iter()
        .find(|(n, _)| n == file)
        .unwrap_or_else(|| panic!("{file}"));
    map(&spec)
}

/// Outputs the example's sensor builds for `e` arriving from `source`.
fn fire(cfg: &Value, source: &str, e: &Event) -> usize {
    Bench::new(cfg.clone()).event(source, e)
}

fn webhook(body: Value) -> Event {
    // Argo's webhook event shape: {header, body}
    Event::new("1", "webhook", "webhook")
        .with_subject("example")
        .with_json(serde_json::to_vec(&json!({"header": {}, "body": body})).unwrap())
}

fn plain(data: Value) -> Event {
    Event::new("1", "webhook", "webhook").with_json(serde_json::to_vec(&data).unwrap())
}

#[test]
#[allow(clippy::approx_constant)] // 3.14 is the example's own value, not π
fn data_filter_examples() {
    let c = example("filter-with-data-simple-1.yaml");
    assert_eq!(
        fire(
            &c,
            "webhook:example",
            &webhook(json!({"message": "hello there"}))
        ),
        1
    );
    assert_eq!(
        fire(&c, "webhook:example", &webhook(json!({"message": "hey"}))),
        1
    );
    assert_eq!(
        fire(&c, "webhook:example", &webhook(json!({"message": "bye"}))),
        0
    );
    // The comments of filter-with-data-advanced.yaml: a=true, b.c=3.14, b.d "hello, world"
    let c = example("filter-with-data-advanced.yaml");
    assert_eq!(
        fire(
            &c,
            "webhook:example",
            &plain(json!({"a": true, "b": {"c": 3.14, "d": "hello, world"}}))
        ),
        1
    );
    assert_eq!(
        fire(
            &c,
            "webhook:example",
            &plain(json!({"a": true, "b": {"c": 3.15, "d": "hello, world"}}))
        ),
        0
    );
}

#[test]
fn expr_and_mixed_filter_examples() {
    // filter-with-expressions.yaml: `a == "b" || c == 10` and `e == false`: EVENT PASS
    let c = example("filter-with-expressions.yaml");
    let pass =
        json!({"a": "b", "a-longer-name": 10, "nested": {"path": {"can-get": {"longer": false}}}});
    assert_eq!(fire(&c, "webhook:example", &plain(pass)), 1);
    let fail =
        json!({"a": "x", "a-longer-name": 10, "nested": {"path": {"can-get": {"longer": false}}}});
    assert_eq!(
        fire(&c, "webhook:example", &plain(fail)),
        1,
        "c == 10 holds on its own"
    );
    let fail =
        json!({"a": "b", "a-longer-name": 10, "nested": {"path": {"can-get": {"longer": true}}}});
    assert_eq!(fire(&c, "webhook:example", &plain(fail)), 0);
    // filter-with-multiple-filters-mixed.yaml: exprs pass, data does not, operator or: PASS
    let c = example("filter-with-multiple-filters-mixed.yaml");
    assert_eq!(
        fire(
            &c,
            "webhook:example",
            &plain(json!({"a": "b", "c": 10, "d": {"e": false}}))
        ),
        1
    );
    assert_eq!(
        fire(
            &c,
            "webhook:example",
            &plain(json!({"a": "x", "c": 3, "d": {"e": true}}))
        ),
        0
    );
}

#[test]
fn context_time_and_script_filter_examples() {
    let mut e = webhook(json!({}));
    e.datacontenttype = Some("application/json".into());
    let c = example("context-filter-webhook.yaml");
    assert_eq!(fire(&c, "webhook:example", &e), 1);
    e.subject = Some("other".into());
    assert_eq!(fire(&c, "webhook:example", &e), 0);

    let c = example("filter-with-time-timezone.yaml");
    let at = |t: &str| webhook(json!({})).with_time(Timestamp::parse(t).unwrap());
    assert_eq!(
        fire(&c, "webhook:example", &at("2024-07-15T14:00:00Z")),
        1,
        "10:00 in New York"
    );
    assert_eq!(
        fire(&c, "webhook:example", &at("2024-07-15T22:00:00Z")),
        0,
        "18:00 in New York"
    );

    let c = example("filter-script.yaml");
    assert_eq!(
        fire(
            &c,
            "webhook:example",
            &webhook(json!({"a": "b", "d": {"e": "z"}}))
        ),
        1
    );
    assert_eq!(
        fire(
            &c,
            "webhook:example",
            &webhook(json!({"a": "b", "d": {"e": "y"}}))
        ),
        0
    );
}

#[test]
fn transform_and_parameter_examples() {
    // transform.yaml: a Lua script and a jq program, each on its own dependency; the trigger
    // takes `body.message` after the transform.
    let c = example("transform.yaml");
    let mut b = Bench::new(c.clone());
    assert_eq!(
        b.event_with_errors("webhook:example", &webhook(json!({"message": "x"}))),
        (1, 0)
    );
    assert_eq!(
        b.event_with_errors("webhook:example-foo", &webhook(json!({"message": "ab"}))),
        (1, 0)
    );
    // trigger-with-template.yaml: dataTemplate with `title`, `nospace`, `lower`, contextTemplate
    let c = example("trigger-with-template.yaml");
    let e = webhook(json!({"message": "hello world", "name": "Some Name"}));
    assert_eq!(
        Bench::new(c).event_with_errors("webhook:example", &e),
        (1, 0),
        "every parameter resolves"
    );
    // dependencies-conditions.yaml: one trigger per dependency, with conditionsReset
    let c = example("dependencies-conditions.yaml");
    assert_eq!(
        fire(&c, "webhook:example", &webhook(json!({}))),
        1,
        "only the trigger on test-dep"
    );
    assert_eq!(
        fire(&c, "webhook:example-foo", &webhook(json!({}))),
        1,
        "only the trigger on test-dep-foo"
    );
    // multi-dependencies.yaml: no conditions = all dependencies
    let c = example("multi-dependencies.yaml");
    let mut b = Bench::new(c.clone());
    let sources: Vec<String> = c["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["source"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(b.event(&sources[0], &webhook(json!({"message": "a"}))), 0);
    assert_eq!(b.event(&sources[1], &plain(json!({"eventTime": "now"}))), 1);
}
