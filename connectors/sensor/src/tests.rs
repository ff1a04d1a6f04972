//! Ports of Argo Events' sensor unit tests (argoproj/argo-events, read at 6478ece4; each
//! block names the Go test it mirrors), then the sensor's behaviour through the real pipeline.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sluice_core::state::StateStore;
use sluice_core::testkit::{metric, ProcessorRig};
use sluice_core::{Event, ProcessorConfig, Status, Timestamp};

use crate::filter::{Filters, FiltersConfig, Logic};
use crate::{expr, Retry, SensorConfig};
use sluice_core::params::{ParamConfig, Resolved};

fn filters(cfg: serde_json::Value, logic: Logic) -> Result<Filters, String> {
    let cfg: FiltersConfig = serde_json::from_value(cfg).map_err(|e| e.to_string())?;
    Filters::compile(&cfg, logic)
}

/// (pass, error) as Argo's filter functions return them.
fn eval(f: &Filters, e: &Event) -> (bool, bool) {
    let v = f.eval(&expr::root_context(), e, &crate::run::data_text(e));
    (v.pass, !v.errors.is_empty())
}

fn json_event(data: &str) -> Event {
    let mut e = Event::new("1", "webhook-gateway", "webhook").with_subject("example-1");
    if !data.is_empty() {
        e = e.with_json(data.to_owned());
    }
    e
}

// pkg/sensors/dependencies/filter_data_test.go :: TestFilterData
#[test]
fn argo_filter_data() {
    let one = |data: &str, f: serde_json::Value, op: &str| {
        let logic = if op == "or" { Logic::Or } else { Logic::And };
        let f = filters(
            json!({"data": f, "dataLogicalOperator": if op.is_empty() { "and" } else { op }}),
            Logic::And,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let _ = logic;
        eval(&f, &json_event(data))
    };
    let s = |v: &str| json!([{"path": "k", "type": "string", "value": [v]}]);
    // empty data passes
    assert_eq!(one("", s("v"), ""), (true, false));
    // invalid filter path: an error
    assert_eq!(
        one(
            r#"{"k": "v"}"#,
            json!([{"path": "", "type": "string", "value": ["v"]}]),
            ""
        ),
        (false, true)
    );
    // no values: refused (Argo: "no values specified" at evaluation)
    assert!(filters(
        json!({"data": [{"path": "k", "type": "string", "value": []}]}),
        Logic::And
    )
    .is_err());
    let cases: &[(&str, serde_json::Value, bool)] = &[
        (r#"{"k": "v"}"#, s("v"), true),
        (
            r#"{"k": "v"}"#,
            json!([{"path":"k","type":"string","value":["v"],"comparator":"="}]),
            true,
        ),
        (
            r#"{"k": "v"}"#,
            json!([{"path":"k","type":"string","value":["b"],"comparator":"!="}]),
            true,
        ),
        (
            r#"{"k": "1.0"}"#,
            json!([{"path":"k","type":"number","value":["1.0"]}]),
            true,
        ),
        (
            r#"{"k": "2.0"}"#,
            json!([{"path":"k","type":"number","value":["1.0"],"comparator":">"}]),
            true,
        ),
        (
            r#"{"k": "2.0"}"#,
            json!([{"path":"k","type":"number","value":["1.0"],"comparator":"<="}]),
            false,
        ),
        (
            r#"{"k": "1.0"}"#,
            json!([{"path":"k","type":"number","value":["1.0"],"comparator":"!="}]),
            false,
        ),
        (
            r#"{"k": "5.0"}"#,
            json!([{"path":"k","type":"number","value":["5.0"],"comparator":"="}]),
            true,
        ),
        (
            r#"{"k": "10.0"}"#,
            json!([{"path":"k","type":"number","value":["10.0"]}]),
            true,
        ),
        (
            r#"{"k": 1.0}"#,
            json!([{"path":"k","type":"number","value":["1.0"]}]),
            true,
        ),
        (
            r#"{"k": 2.0}"#,
            json!([{"path":"k","type":"number","value":["1.0"],"comparator":">"}]),
            true,
        ),
        (
            r#"{"k": 2.0}"#,
            json!([{"path":"k","type":"number","value":["1.0"],"comparator":"<="}]),
            false,
        ),
        (
            r#"{"k": 1.0}"#,
            json!([{"path":"k","type":"number","value":["1.0"],"comparator":"!="}]),
            false,
        ),
        (
            r#"{"k": 5.0}"#,
            json!([{"path":"k","type":"number","value":["5.0"],"comparator":"="}]),
            true,
        ),
        (
            r#"{"k": 10.0}"#,
            json!([{"path":"k","type":"number","value":["10.0"]}]),
            true,
        ),
    ];
    for (i, (data, f, want)) in cases.iter().enumerate() {
        assert_eq!(
            one(data, f.clone(), ""),
            (*want, false),
            "case {i}: {data} {f}"
        );
    }
    let nested = r#"{"k": true, "k1": {"k": 3.14, "k2": "hello, world"}}"#;
    // multiple filters, empty operator: `true` is the string "true", which `v` does not match
    assert_eq!(
        one(
            nested,
            json!([{"path":"k","type":"string","value":["v"]},{"path":"k1.k","type":"number","value":["2.14"]},{"path":"k1.k2","type":"string","value":["hello,world","hello there"]}]),
            ""
        ),
        (false, false)
    );
    assert_eq!(
        one(
            nested,
            json!([{"path":"k","type":"bool","value":["true"]},{"path":"k1.k","type":"number","value":["3.14"]},{"path":"k1.k2","type":"string","value":["hello,world","hello, world","hello there"]}]),
            "and"
        ),
        (true, false)
    );
    assert_eq!(
        one(
            nested,
            json!([{"path":"k","type":"bool","value":["false"]},{"path":"k1.k","type":"number","value":["3.14"]},{"path":"k1.k2","type":"string","value":["hello,world","hello there"]}]),
            "or"
        ),
        (true, false)
    );
    // gjson multipaths and regexes
    assert_eq!(
        one(
            r#"{"k": "v", "k1": {"a": [{"k2": "v2"}]}}"#,
            json!([{"path":"[k,k1.a.#(k2==\"v2\").k2]","type":"string","value":["\\bv\\b.*\\bv2\\b"],"comparator":"="}]),
            ""
        ),
        (true, false)
    );
    // templates: .Input is the text at the path
    assert_eq!(
        one(
            r#"{"k": "aGVsbG8gd29ybGQ="}"#,
            json!([{"path":"k","type":"string","value":["HELLO WORLD"],"template":"{{ b64dec .Input | upper }}"}]),
            ""
        ),
        (true, false)
    );
    assert_eq!(
        one(
            r#"{"k": "My4xNA=="}"#,
            json!([{"path":"k","type":"number","value":["3.13"],"comparator":">","template":"{{ b64dec .Input }}"}]),
            ""
        ),
        (true, false)
    );
    // sprig's b64dec gives the decoder's error text, which does not match
    assert_eq!(
        one(
            r#"{"k": "aGVsbG8gd29ybGQ"}"#,
            json!([{"path":"k","type":"string","value":["hello world"],"template":"{{ b64dec .Input }}","comparator":"!="}]),
            ""
        ),
        (true, false)
    );
    assert_eq!(
        one(
            r#"{"k": "aGVsbG8gd29ybGQ="}"#,
            json!([{"path":"k","type":"string","value":["world$"],"template":"{{ b64dec .Input }}"}]),
            ""
        ),
        (true, false)
    );
    // data that is not JSON is an error
    let mut e = Event::new("1", "s", "t");
    e.data = sluice_core::Data::from_bytes(bytes::Bytes::from_static(b"a"), Some("text/plain"));
    let f = filters(json!({"data": s("v")}), Logic::And).unwrap();
    assert_eq!(eval(&f, &e), (false, true));
}

// pkg/sensors/dependencies/filter_expr_test.go :: TestFilterExpr
#[test]
fn argo_filter_expr() {
    let one = |data: &str, exprs: serde_json::Value, op: &str| {
        let f = filters(
            json!({"exprs": exprs, "exprLogicalOperator": if op.is_empty() { "and" } else { op }}),
            Logic::And,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        eval(&f, &json_event(data))
    };
    let x = |e: &str, fields: &[(&str, &str)]| json!({"expr": e, "fields": fields.iter().map(|(n, p)| json!({"name": n, "path": p})).collect::<Vec<_>>()});
    assert_eq!(
        one("", json!([x(r#"a == "b""#, &[("a", "a")])]), ""),
        (true, false)
    );
    let cases: &[(&str, serde_json::Value, &str, (bool, bool))] = &[
        (
            r#"{"a": "b"}"#,
            json!([x(r#"a == "b""#, &[("a", "a")])]),
            "",
            (true, false),
        ),
        (
            r#"{"a": "c"}"#,
            json!([x(r#"a != "b""#, &[("a", "a")])]),
            "",
            (true, false),
        ),
        (
            r#"{"a": {"b": "c"}}"#,
            json!([x(r#"b == "b""#, &[("b", "a.b")])]),
            "",
            (false, false),
        ),
        (
            r#"{"a": {"b": 2}}"#,
            json!([x("b == 2", &[("b", "a.b")])]),
            "",
            (true, false),
        ),
        (
            r#"{"a": {"b": 2}}"#,
            json!([x("b < 1", &[("b", "a.b")])]),
            "",
            (false, false),
        ),
        (
            r#"{"a": {"b": "start long string"}}"#,
            json!([x(r#"b =~ "start""#, &[("b", "a.b")])]),
            "",
            (true, false),
        ),
        (
            r#"{"a": {"b": "long string"}}"#,
            json!([x(r#"b !~ "start""#, &[("b", "a.b")])]),
            "",
            (true, false),
        ),
        (
            r#"{"a": {"b": "x", "d": "y"}}"#,
            json!([
                x(r#"b == "x""#, &[("b", "a.b")]),
                x(r#"d == "y""#, &[("d", "a.d")])
            ]),
            "",
            (true, false),
        ),
        (
            r#"{"a": {"b": "x", "d": "y"}}"#,
            json!([
                x(r#"b == "x""#, &[("b", "a.b")]),
                x(r#"d == "d""#, &[("d", "a.d")])
            ]),
            "and",
            (false, false),
        ),
        (
            r#"{"a": {"b": "x", "d": "y"}}"#,
            json!([
                x(r#"b == "x""#, &[("b", "a.b")]),
                x(r#"d == "d""#, &[("d", "a.d")])
            ]),
            "or",
            (true, false),
        ),
        (
            r#"{"a": {"b": "x", "d": "y"}}"#,
            json!([
                x(r#"b == "b""#, &[("b", "a.b")]),
                x(r#"c == "c""#, &[("c", "a.c")])
            ]),
            "or",
            (false, true),
        ),
        (
            r#"{"a": {"b": "x", "d": {"e": true}}}"#,
            json!([
                x(r#"b == "x""#, &[("b", "a.b")]),
                x(r#"c == "c""#, &[("c", "a.c")]),
                x("e == true", &[("e", "a.d.e")])
            ]),
            "or",
            (true, false),
        ),
        (
            r#"{"a": {"b": "x", "d": "y"}}"#,
            json!([
                x(r#"b == "b""#, &[("b", "a.b")]),
                x(r#"c == "c""#, &[("c", "a.c")])
            ]),
            "",
            (false, false),
        ),
        (
            r#"{"a": {"b": "x", "d": "y"}}"#,
            json!([
                x(r#"b == "x""#, &[("b", "a.b")]),
                x(r#"c == "c""#, &[("c", "a.c")])
            ]),
            "",
            (false, true),
        ),
        (
            r#"{"a": {"b": "x", "c": {"d": true}}}"#,
            json!([x(r#"b != "b" && d == true"#, &[("b", "a.b"), ("d", "a.d")])]),
            "",
            (false, true),
        ),
        (
            r#"{"a": {"b": "x", "c": {"d": true}}}"#,
            json!([x(
                r#"b != "b" && d == true"#,
                &[("b", "a.b"), ("d", "a.c.d")]
            )]),
            "or",
            (true, false),
        ),
        (
            r#"{"a": {"b": "b", "c": {"d": false}}}"#,
            json!([x(
                r#"b == "b" || d == true"#,
                &[("b", "a.b"), ("d", "a.c.d")]
            )]),
            "",
            (true, false),
        ),
        // `e` has no field but is never reached
        (
            r#"{"a": {"b": "b", "c": {"d": false}, "e": 2}}"#,
            json!([x(
                r#"b == "b" || (d == true && e == 2)"#,
                &[("b", "a.b"), ("d", "a.c.d")]
            )]),
            "",
            (true, false),
        ),
    ];
    for (i, (data, exprs, op, want)) in cases.iter().enumerate() {
        assert_eq!(
            one(data, exprs.clone(), op),
            *want,
            "case {i}: {data} {exprs}"
        );
    }
}

fn at(t: &str) -> Event {
    Event::new("1", "webhook-gateway", "webhook").with_time(Timestamp::parse(t).unwrap())
}

// Argo's filterEvent evaluates the families in this order, and `Filters::eval` dispatches on
// the position in `FAMILIES` (its last arm is `script`), so the order is part of the behaviour.
#[test]
fn families_are_argos_in_argos_order() {
    assert_eq!(
        crate::filter::FAMILIES,
        ["exprs", "data", "context", "time", "script"]
    );
}

// filter_ctx_test.go :: TestFilterContext, filter_time_test.go :: TestFilterTime and
// TestFilterTimeWithTimezone
#[test]
fn argo_filter_context_and_time() {
    let ctx = |c: serde_json::Value| filters(json!({"context": c}), Logic::And).unwrap();
    let mut e = Event::new("1", "calendar-gateway", "calendar").with_subject("example-1");
    assert_eq!(eval(&ctx(json!({"type": "webhook"})), &e), (false, false));
    e.ty = "webhook".into();
    e.source = "webhook-gateway".into();
    assert_eq!(
        eval(
            &ctx(json!({"type": "webhook", "source": "webhook-gateway"})),
            &e
        ),
        (true, false)
    );

    let times = [
        "00:00:00", "04:05:06", "08:09:10", "12:13:14", "16:17:18", "20:21:22",
    ];
    let window = |start: &str, stop: &str| {
        let f = filters(json!({"time": {"start": start, "stop": stop}}), Logic::And).unwrap();
        times.map(|t| eval(&f, &at(&format!("2024-07-15T{t}Z"))).0)
    };
    assert_eq!(
        window("08:09:10", "16:17:18"),
        [false, false, true, true, false, false]
    );
    assert_eq!(
        window("16:17:18", "08:09:10"),
        [true, true, false, false, true, true]
    );

    let tz = |t: &str, start: &str, stop: &str, zone: &str| {
        let f = filters(
            json!({"time": {"start": start, "stop": stop, "timezone": zone}}),
            Logic::And,
        )
        .unwrap();
        eval(&f, &at(t)).0
    };
    assert!(tz("2024-07-15T10:00:00Z", "09:00:00", "17:00:00", ""));
    assert!(tz(
        "2024-07-15T14:00:00Z",
        "09:00:00",
        "17:00:00",
        "America/New_York"
    ));
    assert!(!tz(
        "2024-07-15T12:00:00Z",
        "09:00:00",
        "17:00:00",
        "America/New_York"
    ));
    assert!(!tz(
        "2024-07-15T22:00:00Z",
        "09:00:00",
        "17:00:00",
        "America/New_York"
    ));
    assert!(tz(
        "2024-07-15T10:00:00Z",
        "10:00:00",
        "18:00:00",
        "Europe/London"
    ));
    assert!(tz(
        "2024-07-15T01:00:00Z",
        "09:00:00",
        "17:00:00",
        "Asia/Tokyo"
    ));
    assert!(tz(
        "2024-07-15T02:00:00Z",
        "22:00:00",
        "06:00:00",
        "America/New_York"
    ));
    assert!(tz(
        "2024-01-15T15:00:00Z",
        "09:00:00",
        "17:00:00",
        "America/New_York"
    ));
    let bad = filters(
        json!({"time": {"start": "09:00:00", "stop": "17:00:00", "timezone": "Invalid/Timezone"}}),
        Logic::And,
    )
    .unwrap_err();
    assert!(bad.contains("not an IANA time zone"), "{bad}");
    assert!(filters(
        json!({"time": {"start": "09:09:0", "stop": "19:19:19"}}),
        Logic::And
    )
    .is_err());
    assert!(filters(
        json!({"time": {"start": "09:09:09", "stop": "10:10"}}),
        Logic::And
    )
    .is_err());
    assert!(filters(
        json!({"time": {"start": "09:09:09", "stop": "09:09:09"}}),
        Logic::And
    )
    .is_err());
}

// pkg/sensors/dependencies/filter_test.go :: TestFilter (filtersLogicalOperator)
#[test]
fn argo_filters_logical_operator() {
    let e =
        || json_event(r#"{"k": "v"}"#).with_time(Timestamp::parse("2024-07-15T16:36:34Z").unwrap());
    let f = |cfg: serde_json::Value, op: Logic| filters(cfg, op).unwrap();
    let ctx_ok = json!({"type": "webhook", "source": "webhook-gateway"});
    let dz = json!([{"path": "z", "type": "string", "value": ["v"]}]);
    assert_eq!(eval(&f(json!({}), Logic::And), &e()), (true, false));
    assert_eq!(
        eval(
            &f(
                json!({"data": [{"path":"k","type":"string","value":["v"]}]}),
                Logic::And
            ),
            &e()
        ),
        (true, false)
    );
    assert_eq!(
        eval(&f(json!({"data": dz}), Logic::And), &e()),
        (false, true)
    );
    assert_eq!(
        eval(
            &f(
                json!({"context": ctx_ok, "data": [{"path":"k","type":"string","value":["z"]}]}),
                Logic::And
            ),
            &e()
        ),
        (false, false)
    );
    assert_eq!(
        eval(
            &f(
                json!({"context": {"type":"webhook","source":"webhook-fake"}, "data": [{"path":"k","type":"string","value":["v"]}]}),
                Logic::And
            ),
            &e()
        ),
        (false, false)
    );
    assert_eq!(
        eval(&f(json!({"context": ctx_ok, "data": dz}), Logic::And), &e()),
        (false, true)
    );
    // or: passes with an error at the same time
    assert_eq!(
        eval(&f(json!({"context": ctx_ok, "data": dz}), Logic::Or), &e()),
        (true, true)
    );

    let adv = || {
        let mut ev = Event::new("1", "s", "t")
            .with_json(r#"{ "a": "x", "b": 10, "c": { "d": "hello world", "e": false } }"#);
        ev.time = Some(Timestamp::parse("2024-07-15T16:36:34Z").unwrap());
        ev
    };
    let d = |p: &str, t: &str, v: &str| json!({"path": p, "type": t, "value": [v]});
    let x = |e: &str, n: &str, p: &str| json!({"expr": e, "fields": [{"name": n, "path": p}]});
    let cases = [
        // (A && B) && (C && D)
        (
            json!({"data": [d("a","string","x"), d("b","number","10")], "exprs": [x("d == \"hello world\"","d","c.d"), x("e == false","e","c.e")]}),
            Logic::And,
            (true, false),
        ),
        // (A && B) || (C && D)
        (
            json!({"data": [d("a","string","x"), d("b","number","10")], "exprs": [x("d == \"hello world\"","d","c.d"), x("e == true","e","c.e")]}),
            Logic::Or,
            (true, false),
        ),
        // (A || B) && (C || D)
        (
            json!({"data": [d("a","string","x"), d("b","number","11")], "dataLogicalOperator": "or", "exprs": [x("d == \"hello world\"","d","c.d"), x("e == true","e","c.e")], "exprLogicalOperator": "or"}),
            Logic::And,
            (true, false),
        ),
        // (A || B) || (C || D)
        (
            json!({"data": [d("a","string","y"), d("b","number","11")], "dataLogicalOperator": "or", "exprs": [x("d == \"hello world\"","d","c.d"), x("e == false","e","c.e")], "exprLogicalOperator": "or"}),
            Logic::Or,
            (true, false),
        ),
        // (A && B) && (C || D)
        (
            json!({"data": [d("a","string","x"), d("b","number","11")], "exprs": [x("d == \"hello everybody\"","d","c.d"), x("e == true","e","c.e")], "exprLogicalOperator": "or"}),
            Logic::And,
            (false, false),
        ),
        // (A || B) && (C && D) with a missing path
        (
            json!({"data": [d("a","string","x"), d("b","number","10")], "dataLogicalOperator": "or", "exprs": [x("f == \"hello world\"","f","c.f"), x("e == false","e","c.e")]}),
            Logic::And,
            (false, true),
        ),
    ];
    for (i, (cfg, op, want)) in cases.into_iter().enumerate() {
        assert_eq!(eval(&f(cfg.clone(), op), &adv()), want, "case {i}: {cfg}");
    }
    // or with only some families given: the others do not count as passing
    let only = f(
        json!({"exprs": [x("A == \"not-valid\"","A","a.b")], "data": [d("a.d.e.f","string","not-valid")], "dataLogicalOperator": "or"}),
        Logic::Or,
    );
    let ev =
        Event::new("1", "s", "t").with_json(r#"{"a":{"b":"c","d":{"e":{"f":"g"}},"h":{"i":"j"}}}"#);
    assert_eq!(eval(&only, &ev), (false, false));
}

fn param(p: serde_json::Value) -> sluice_core::params::Param {
    let cfg: ParamConfig = serde_json::from_value(p).unwrap();
    sluice_core::params::Param::compile(&cfg, 0, "p").unwrap()
}

fn text(r: Resolved) -> String {
    match r {
        Resolved::Value(serde_json::Value::String(s)) => s,
        Resolved::Value(v) => v.to_string(),
        Resolved::Skip => "<skip>".into(),
    }
}

// pkg/sensors/triggers/params_test.go :: TestResolveParamValue
#[test]
fn argo_resolve_param_value() {
    let e = json_event(
        r#"{"name": {"first": "fake", "last": "user"}, "reviews": 8, "rating": 4.5, "isActive" : true, "isVerified" : false, "countries": ["ca", "us", "mx"]}"#,
    );
    let r = |src: serde_json::Value| {
        let mut src = src;
        src["dependencyName"] = json!("fake-dependency");
        text(
            param(json!({"src": src, "dest": "x"}))
                .resolve(Some(&e))
                .unwrap(),
        )
    };
    assert_eq!(r(json!({"dataKey": "name.first"})), "fake");
    assert_eq!(r(json!({"contextKey": "subject"})), "example-1");
    let whole: serde_json::Value = serde_json::from_str(&r(json!({}))).unwrap();
    assert_eq!(whole["context"]["id"], "1");
    assert_eq!(
        whole["data"]["name"]["first"], "fake",
        "Sluice gives data as JSON, not base64"
    );
    assert_eq!(r(json!({"value": "hello"})), "hello");
    assert_eq!(
        r(json!({"contextKey": "subject", "dataKey": "name.first"})),
        "fake"
    );
    assert_eq!(
        r(json!({"dataTemplate": "{{ .Input.name.first }}"})),
        "fake"
    );
    assert_eq!(
        r(json!({"dataTemplate": "{{ upper .Input.name.first }}"})),
        "FAKE"
    );
    assert_eq!(
        r(json!({"contextTemplate": "{{ .Input.subject }}"})),
        "example-1"
    );
    assert_eq!(
        r(json!({"contextTemplate": "{{ .Input.subject | replace \"-\" \"_\" }}"})),
        "example_1"
    );
    assert_eq!(
        r(
            json!({"contextTemplate": "{{ .Input.subject }}", "dataTemplate": "{{ .Input.name.first }}"})
        ),
        "fake"
    );
    assert_eq!(
        r(json!({"dataTemplate": "{{ .Input.name.non_exist }}", "dataKey": "name.first"})),
        "fake"
    );
    assert_eq!(
        r(json!({"dataKey": "name.first", "useRawData": true})),
        "fake"
    );
    assert_eq!(
        r(json!({"dataKey": "name", "useRawData": true})),
        r#"{"first":"fake","last":"user"}"#
    );
    assert_eq!(
        r(json!({"dataKey": "countries", "useRawData": true})),
        r#"["ca","us","mx"]"#
    );
    // `{{ no }}` does not parse: refused at validation (Argo falls back to the key at run time)
    let bad: ParamConfig = serde_json::from_value(
        json!({"src": {"dependencyName": "d", "dataTemplate": "{{ no }}"}, "dest": "x"}),
    )
    .unwrap();
    assert!(sluice_core::params::Param::compile(&bad, 0, "p").is_err());
}

#[test]
fn data_key_parameters_read_unchecked_data_as_gjson_does_and_fall_back_on_non_json() {
    let cfg: SensorConfig = serde_json::from_value(json!({
        "dependencies": [{"name": "d", "source": "a"}],
        "triggers": [{"name": "t", "sink": "out", "payload": [
            {"src": {"dependencyName": "d", "dataKey": "items.1.sku", "value": "none"}, "dest": "sku"},
            {"src": {"dependencyName": "d", "dataKey": "n", "useRawData": true, "value": "none"}, "dest": "n"},
            {"src": {"dependencyName": "d", "dataKey": "data.id", "value": "none"}, "dest": "nested"},
            {"src": {"dependencyName": "d", "dataKey": "missing", "value": "none"}, "dest": "missing"}
        ]}]
    }))
    .unwrap();
    let s = crate::run::Sensor::compile(&cfg, "s").unwrap();
    let with = |text: &str| {
        // Data as a webhook hands it on: bytes not yet checked as JSON.
        let mut e = Event::new("1", "/a", "t");
        e.datacontenttype = Some("application/json".into());
        e.data = sluice_core::Data::Binary(bytes::Bytes::from(text.to_owned()));
        let out = s.outputs_for_test(0, &[(0, e)]).unwrap();
        serde_json::from_slice::<serde_json::Value>(out[0].data.as_bytes().unwrap()).unwrap()
    };
    let doc =
        r#"{"pad":"xxxxxxxx","items":[{"sku":"A"},{"sku":"B"}],"n":2,"data":{"data":{"id":5}}}"#;
    for (dest, path) in [("sku", "items.1.sku"), ("nested", "data.id")] {
        assert_eq!(with(doc)[dest], gjson::get(doc, path).str(), "{path}");
    }
    assert_eq!(
        with(doc),
        json!({"sku": "B", "n": 2, "nested": "5", "missing": "none"})
    );
    // Not JSON: every data key falls back to its value.
    assert_eq!(
        with(r#"{"items":[{"sku":"A"},{"sku":"B"}],"n":2"#),
        json!({"sku": "none", "n": "none", "nested": "none", "missing": "none"})
    );
}

// params_test.go :: TestConstructPayload and TestApplyParams (compared as parsed JSON: Sluice
// writes a new document, not sjson's in-place edit)
#[test]
fn argo_construct_payload_and_apply_params() {
    let cfg = |payload: serde_json::Value| -> SensorConfig {
        serde_json::from_value(json!({
            "dependencies": [
                {"name": "fake-dependency", "source": "a"},
                {"name": "another-fake-dependency", "source": "b"},
                {"name": "use-event-data-type", "source": "c"}
            ],
            "triggers": [{"name": "t", "sink": "out", "conditions": "fake-dependency || another-fake-dependency || use-event-data-type", "payload": payload}]
        }))
        .unwrap()
    };
    let events = vec![
        (
            0,
            Event::new("1", "webhook-gateway", "webhook").with_json(r#"{"firstName": "fake"}"#),
        ),
        (
            1,
            Event::new("2", "calendar-gateway", "calendar").with_json(r#"{"lastName": "foo"}"#),
        ),
        (
            2,
            Event::new("3", "x", "y")
                .with_json(r#"{"age": 100, "isActive": false, "countries": ["ca", "us", "mx"]}"#),
        ),
    ];
    let p = |dep: &str, key: &str, value: Option<&str>, raw: bool, dest: &str| {
        let mut src = json!({"dependencyName": dep, "dataKey": key, "useRawData": raw});
        if let Some(v) = value {
            src["value"] = json!(v);
        }
        json!({"src": src, "dest": dest})
    };
    let payload = |first: &str, last: &str| {
        json!([
            p("fake-dependency", first, Some("faker"), false, "firstName"),
            p(
                "another-fake-dependency",
                last,
                Some("bar"),
                false,
                "lastName"
            ),
            p("use-event-data-type", "age", None, true, "age"),
            p("use-event-data-type", "isActive", None, true, "isActive"),
            p("use-event-data-type", "age", None, false, "typelessAge"),
            p(
                "use-event-data-type",
                "isActive",
                None,
                false,
                "typelessIsActive"
            ),
        ])
    };
    let build = |payload: serde_json::Value| {
        let s = crate::run::Sensor::compile(&cfg(payload), "s").unwrap();
        let out = s.outputs_for_test(0, &events).unwrap();
        serde_json::from_slice::<serde_json::Value>(out[0].data.as_bytes().unwrap()).unwrap()
    };
    assert_eq!(
        build(payload("firstName", "lastName")),
        json!({"firstName":"fake","lastName":"foo","age":100,"isActive":false,"typelessAge":"100","typelessIsActive":"false"})
    );
    let fallback = build(payload("unknown", "unknown"));
    assert_eq!(
        (
            fallback["firstName"].as_str(),
            fallback["lastName"].as_str()
        ),
        (Some("faker"), Some("bar"))
    );

    // TestApplyParams
    let e = json_event(
        r#"{"name": {"first": "fake", "last": "user"}, "age": 100, "countries": ["ca", "us", "mx"] }"#,
    );
    let apply = |ps: &[serde_json::Value], doc: &str| {
        let mut doc: serde_json::Value = serde_json::from_str(doc).unwrap();
        for pc in ps {
            let pr = param(pc.clone());
            if let Resolved::Value(v) = pr.resolve(Some(&e)).unwrap() {
                pr.apply(&mut doc, v).unwrap();
            }
        }
        doc
    };
    let q = |key: &str, raw: bool, dest: &str, op: &str| json!({"src": {"dependencyName": "d", "dataKey": key, "useRawData": raw}, "dest": dest, "operation": op});
    assert_eq!(
        apply(
            &[q("name.first", false, "name", "overwrite")],
            r#"{"name": "faker"}"#
        ),
        json!({"name": "fake"})
    );
    assert_eq!(
        apply(
            &[q("name.first", false, "name", "prepend")],
            r#"{"name": "faker"}"#
        ),
        json!({"name": "fakefaker"})
    );
    assert_eq!(
        apply(
            &[q("name.first", false, "name", "append")],
            r#"{"name": "faker"}"#
        ),
        json!({"name": "fakerfake"})
    );
    assert_eq!(
        apply(
            &[q("name", false, "name", "overwrite")],
            r#"{"name": "faker"}"#
        ),
        json!({"name": r#"{"first": "fake", "last": "user"}"#})
    );
    assert_eq!(
        apply(
            &[q("name", true, "name", "overwrite")],
            r#"{"name": "faker"}"#
        ),
        json!({"name": {"first": "fake", "last": "user"}})
    );
    assert_eq!(
        apply(
            &[
                q("age", true, "age", "overwrite"),
                q("age", true, "ageWithYears", "append"),
                q("countries", true, "countries", "append")
            ],
            r#"{"age": "this-gets-over-written", "ageWithYears": "Years: "}"#
        ),
        json!({"age": 100, "ageWithYears": "Years: 100", "countries": ["ca", "us", "mx"]})
    );
    // TestConstructPayload_NullValue
    let n = json_event(r#"{"nullable_key": null, "other_key": "value"}"#);
    let pr = param(
        json!({"src": {"dependencyName": "d", "dataKey": "nullable_key", "useRawData": true}, "dest": "nullable_key"}),
    );
    assert_eq!(
        pr.resolve(Some(&n)).unwrap(),
        Resolved::Value(serde_json::Value::Null)
    );
}

// pkg/shared/util/retry_test.go and Convert2WaitBackoff: absent = one attempt, steps 0 = 5
#[test]
fn argo_retry_defaults() {
    let r = |v: serde_json::Value| {
        Retry::from(&serde_json::from_value(v).unwrap(), "retryStrategy").unwrap()
    };
    assert_eq!(Retry::from(&None, "r").unwrap().attempts, 1);
    let d = r(json!({}));
    assert_eq!(
        (d.attempts, d.first, d.factor, d.jitter),
        (5, Duration::from_secs(1), 1.0, 1.0)
    );
    let d = r(json!({"steps": 3, "duration": "200ms", "factor": 2, "jitter": "0.1"}));
    assert_eq!(
        (d.attempts, d.first, d.factor, d.jitter),
        (3, Duration::from_millis(200), 2.0, 0.1)
    );
    assert_eq!(
        r(json!({"duration": 1_000_000})).first,
        Duration::from_millis(1)
    );
    assert_eq!(d.delay(0, 0.0), Duration::from_millis(200));
    assert_eq!(d.delay(2, 0.0), Duration::from_millis(800));
    assert!(d.delay(0, 0.99) < Duration::from_millis(221));
}

// ---- through the pipeline --------------------------------------------------------------

fn sensor(cfg: serde_json::Value) -> Box<SensorConfig> {
    let c: SensorConfig = serde_json::from_value(cfg).unwrap();
    c.validate("s").unwrap_or_else(|e| panic!("{e}"));
    Box::new(c)
}

async fn start(
    rig: &mut ProcessorRig,
    name: &str,
    cfg: serde_json::Value,
) -> tokio::task::JoinHandle<()> {
    let running = sensor(cfg).build(rig.context(name)).await.unwrap();
    tokio::spawn(async move {
        running.await.unwrap();
    })
}

/// Closes the rig's feeds and waits for the sensor to drain and return.
async fn stop(rig: &mut ProcessorRig, task: tokio::task::JoinHandle<()>) {
    rig.close();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}

fn push(id: &str, r: &str, after: &str) -> Event {
    Event::new(id, "https://github.com/acme/app", "com.github.push")
        .with_json(format!(r#"{{"ref":"{r}","after":"{after}","size":12}}"#))
}

fn nightly(id: &str) -> Event {
    Event::new(id, "/nightly", "build.finished")
        .with_time(Timestamp::parse("2026-12-01T02:00:00Z").unwrap())
        .with_json(r#"{"ok":true}"#)
}

fn release_cfg() -> serde_json::Value {
    json!({
        "dependencies": [
            {"name": "push", "source": "gh", "type": "com.github.push",
             "filters": {"data": [{"path": "ref", "type": "string", "value": ["refs/heads/main"]}],
                         "exprs": [{"expr": "size > 10", "fields": [{"name": "size", "path": "size"}]}]}},
            {"name": "nightly", "source": "cron"}
        ],
        "triggers": [{
            "name": "submit", "conditions": "push && nightly", "sink": "api",
            "payload": [
                {"src": {"dependencyName": "push", "dataKey": "after"}, "dest": "commit"},
                {"src": {"dependencyName": "nightly", "contextKey": "time"}, "dest": "built_at"},
                {"src": {"dependencyName": "push", "dataTemplate": "{{ .Input.ref | trimPrefix \"refs/heads/\" }}"}, "dest": "branch"}
            ]
        }]
    })
}

fn data(e: &Event) -> serde_json::Value {
    serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap()
}

#[tokio::test]
async fn fires_once_when_both_dependencies_arrived_with_the_payload_built() {
    let mut rig = ProcessorRig::addressing("rel", &["gh", "cron"], &["api"]);
    let mut api = rig.capture_of("api");
    let task = start(&mut rig, "rel", release_cfg()).await;
    // One dependency alone: kept, acknowledged, nothing fired.
    let o = rig
        .sender_of("gh")
        .send(vec![push("p1", "refs/heads/main", "c1")])
        .await
        .await;
    assert!(o.is_delivered());
    // Filtered out (other branch, too small): acknowledged, not kept.
    assert!(rig
        .sender_of("gh")
        .send(vec![push("p2", "refs/heads/dev", "c2")])
        .await
        .await
        .is_delivered());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(api.try_next().is_none(), "fired on one dependency");
    // The latest push wins (Argo: a10 and b1 fire).
    assert!(rig
        .sender_of("gh")
        .send(vec![push("p3", "refs/heads/main", "c3")])
        .await
        .await
        .is_delivered());
    let fired = rig.sender_of("cron").send(vec![nightly("n1")]).await;
    let item = api.next_within(Duration::from_secs(5)).await;
    assert_eq!(
        data(&item.event),
        json!({"commit": "c3", "built_at": "2026-12-01T02:00:00Z", "branch": "main"})
    );
    assert_eq!(item.event.ty, "sluice.sensor.submit");
    assert_eq!(item.event.source, "/sensors/rel");
    // A built event names its sensor and trigger (the Kubernetes triggers label with them).
    let ext = |k: &str| {
        item.event
            .extensions
            .iter()
            .find(|(n, _)| n.as_str() == k)
            .map(|(_, v)| v.to_canonical().into_owned())
    };
    assert_eq!(ext("sensor").as_deref(), Some("rel"));
    assert_eq!(ext("trigger").as_deref(), Some("submit"));
    let id = item.event.id.clone();
    item.delivery.delivered();
    assert!(fired.await.is_delivered());
    // State was cleared: another nightly alone does not fire.
    assert!(rig
        .sender_of("cron")
        .send(vec![nightly("n2")])
        .await
        .await
        .is_delivered());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(api.try_next().is_none(), "fired again without a new push");
    // (p3 again would be a duplicate at the feed, never reaching the sensor.)
    assert!(rig
        .sender_of("gh")
        .send(vec![push("p4", "refs/heads/main", "c4")])
        .await
        .await
        .is_delivered());
    let again = api.next_within(Duration::from_secs(5)).await;
    assert_eq!(data(&again.event)["commit"], "c4");
    assert_ne!(
        again.event.id, id,
        "the output id is made from other inputs"
    );
    again.delivery.delivered();
    stop(&mut rig, task).await;
    assert!(
        metric(
            "sluice_sensor_dependency_events_total",
            &[
                ("sensor", "rel"),
                ("dependency", "push"),
                ("result", "filtered"),
                ("family", "data")
            ]
        ) >= 1.0
    );
    assert!(
        metric(
            "sluice_sensor_triggers_total",
            &[
                ("sensor", "rel"),
                ("trigger", "submit"),
                ("result", "fired")
            ]
        ) >= 2.0
    );
}

#[tokio::test]
async fn pure_or_fires_per_event_and_without_payload_forwards_the_event() {
    let mut rig = ProcessorRig::addressing("or", &["a", "b"], &["out"]);
    let mut out = rig.capture_of("out");
    let task = start(&mut rig, "or", json!({
        "dependencies": [{"name": "dep-a", "source": "a"}, {"name": "dep-b", "source": "b"}],
        "triggers": [{"name": "t", "conditions": "dep-a || dep-b", "sink": "out",
                      "parameters": [{"src": {"dependencyName": "dep-a", "dataKey": "k", "value": "none"}, "dest": "subject"}]}]
    })).await;
    for (feed, id) in [("a", "1"), ("b", "2"), ("a", "3")] {
        let p = rig
            .sender_of(feed)
            .send(vec![
                Event::new(id, "/s", "t").with_json(format!(r#"{{"k":"v{id}"}}"#))
            ])
            .await;
        let item = out.next_within(Duration::from_secs(5)).await;
        assert_eq!(item.event.id, id, "the event itself is forwarded");
        // dep-b's events have no dep-a event: the parameter's value is the fallback.
        let want = if feed == "a" {
            format!("v{id}")
        } else {
            "none".into()
        };
        assert_eq!(item.event.subject.as_deref(), Some(want.as_str()));
        item.delivery.delivered();
        assert!(p.await.is_delivered());
    }
    stop(&mut rig, task).await;
}

/// A trigger without payload or parameters forwards its events as they are: with two such
/// triggers firing on one input, and with one whose condition completes from a saved partial
/// match, every output is its input event field for field (subject, time, an extension, data).
#[tokio::test]
async fn forwarded_events_are_the_inputs_field_for_field() {
    let mut rig = ProcessorRig::addressing("fwd", &["a", "b"], &["out"]);
    let mut out = rig.capture_of("out");
    let task = start(
        &mut rig,
        "fwd",
        json!({
            "dependencies": [{"name": "dep-a", "source": "a"}, {"name": "dep-b", "source": "b"}],
            "triggers": [
                {"name": "one", "conditions": "dep-a", "sink": "out"},
                {"name": "two", "conditions": "dep-a", "sink": "out"},
                {"name": "both", "conditions": "dep-a && dep-b", "sink": "out"}
            ]
        }),
    )
    .await;
    let mut a = Event::new("a-1", "/a", "t.a")
        .with_subject("s")
        .with_time(Timestamp::parse("2026-12-01T02:00:00Z").unwrap())
        .with_json(r#"{"k":"v"}"#);
    a.set_extension(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    let b = Event::new("b-1", "/b", "t.b").with_json(r#"{"n":1}"#);
    // Sends `e` on `feed` and takes the two outputs it causes, each delivered.
    async fn two_outputs(
        rig: &ProcessorRig,
        out: &mut sluice_core::testkit::Capture,
        feed: &str,
        e: &Event,
    ) -> Vec<Event> {
        let p = rig.sender_of(feed).send(vec![e.clone()]).await;
        let mut got = Vec::new();
        for _ in 0..2 {
            let item = out.next_within(Duration::from_secs(5)).await;
            got.push((*item.event).clone());
            item.delivery.delivered();
        }
        assert!(p.await.is_delivered());
        got.sort_by(|x, y| x.id.cmp(&y.id));
        got
    }
    // `a` fires `one` and `two` and is kept for `both`.
    assert_eq!(
        two_outputs(&rig, &mut out, "a", &a).await,
        vec![a.clone(), a.clone()]
    );
    // `b` completes `both`: its events come from the saved match and the input.
    assert_eq!(two_outputs(&rig, &mut out, "b", &b).await, vec![a, b]);
    assert!(out.try_next().is_none(), "nothing else was sent");
    stop(&mut rig, task).await;
}

#[tokio::test]
async fn partial_state_survives_a_restart() {
    let store = {
        let mut rig = ProcessorRig::addressing("rel", &["gh", "cron"], &["api"]);
        let task = start(&mut rig, "rel", release_cfg()).await;
        assert!(rig
            .sender_of("gh")
            .send(vec![push("p1", "refs/heads/main", "c1")])
            .await
            .await
            .is_delivered());
        stop(&mut rig, task).await;
        rig.state.clone()
    };
    let mut rig = ProcessorRig::addressing("rel", &["gh", "cron"], &["api"]);
    rig.state = store;
    let mut api = rig.capture_of("api");
    let task = start(&mut rig, "rel", release_cfg()).await;
    let p = rig.sender_of("cron").send(vec![nightly("n1")]).await;
    let item = api.next_within(Duration::from_secs(5)).await;
    assert_eq!(
        data(&item.event)["commit"],
        "c1",
        "the push kept across the restart"
    );
    item.delivery.delivered();
    assert!(p.await.is_delivered());
    // Fired: the saved entry is gone.
    let mut left = 0;
    rig.state.scan("sensor.rel", &mut |_, _| left += 1).unwrap();
    assert_eq!(left, 0);
    stop(&mut rig, task).await;
}

#[tokio::test]
async fn entries_older_than_the_last_reset_tick_are_dropped_at_start() {
    let mut cfg = release_cfg();
    cfg["triggers"][0]["conditionsReset"] =
        json!([{"byTime": {"cron": "0 0 * * *", "timezone": "UTC"}}]);
    let store = {
        let mut rig = ProcessorRig::addressing("rel", &["gh", "cron"], &["api"]);
        let task = start(&mut rig, "rel", cfg.clone()).await;
        assert!(rig
            .sender_of("gh")
            .send(vec![push("p1", "refs/heads/main", "c1")])
            .await
            .await
            .is_delivered());
        stop(&mut rig, task).await;
        rig.state.clone()
    };
    // Age the saved entry to before the last midnight.
    let mut rows = Vec::new();
    store
        .scan("sensor.rel", &mut |k, v| {
            rows.push((k.to_vec(), v.to_vec()))
        })
        .unwrap();
    assert_eq!(rows.len(), 1);
    let (k, mut v) = rows.pop().unwrap();
    v[..8].copy_from_slice(&0u64.to_be_bytes());
    store.write("sensor.rel", &[(&k, &v)], &[]).unwrap();
    let mut rig = ProcessorRig::addressing("rel", &["gh", "cron"], &["api"]);
    rig.state = store;
    let mut api = rig.capture_of("api");
    let task = start(&mut rig, "rel", cfg).await;
    assert!(rig
        .sender_of("cron")
        .send(vec![nightly("n1")])
        .await
        .await
        .is_delivered());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        api.try_next().is_none(),
        "a push from before the reset fired the trigger"
    );
    stop(&mut rig, task).await;
}

#[tokio::test]
async fn retries_then_succeeds_and_at_least_once_waits_for_it() {
    let mut rig = ProcessorRig::addressing("r", &["a"], &["out"]);
    let mut out = rig.capture_of("out");
    let task = start(&mut rig, "r", json!({
        "dependencies": [{"name": "a", "source": "a"}],
        "triggers": [{"name": "t", "sink": "out", "atLeastOnce": true,
                      "retryStrategy": {"steps": 3, "duration": "20ms", "factor": 2, "jitter": 0}}]
    })).await;
    let pending = rig
        .sender_of("a")
        .send(vec![Event::new("1", "/s", "t")])
        .await;
    tokio::pin!(pending);
    for attempt in 0..3 {
        let item = out.next_within(Duration::from_secs(5)).await;
        assert_eq!(item.event.id, "1");
        if attempt < 2 {
            item.delivery.failed("503 from the target");
            assert!(
                futures_util::poll!(&mut pending).is_pending(),
                "settled before the trigger finished"
            );
        } else {
            item.delivery.delivered();
        }
    }
    assert!(pending.await.is_delivered());
    assert!(
        metric(
            "sluice_sensor_trigger_retries_total",
            &[("sensor", "r"), ("trigger", "t")]
        ) >= 2.0
    );
    stop(&mut rig, task).await;
}

#[tokio::test]
async fn exhausted_retries_go_to_the_dlq_sink() {
    let mut rig = ProcessorRig::addressing("d", &["a"], &["out", "parked"]);
    let mut out = rig.capture_of("out");
    let mut parked = rig.capture_of("parked");
    let task = start(
        &mut rig,
        "d",
        json!({
            "dependencies": [{"name": "a", "source": "a"}],
            "triggers": [{"name": "t", "sink": "out", "atLeastOnce": true, "dlqTrigger": "parked",
                          "retryStrategy": {"steps": 2, "duration": "10ms", "jitter": 0}}]
        }),
    )
    .await;
    let pending = rig
        .sender_of("a")
        .send(vec![Event::new("1", "/s", "t")])
        .await;
    for _ in 0..2 {
        out.next_within(Duration::from_secs(5))
            .await
            .delivery
            .failed("500");
    }
    let dead = parked.next_within(Duration::from_secs(5)).await;
    assert_eq!(dead.event.id, "1");
    let reason = dead
        .event
        .extension("deadletterreason")
        .map(|v| v.to_canonical().into_owned())
        .unwrap_or_default();
    assert!(reason.ends_with("500"), "{reason}");
    dead.delivery.delivered();
    assert!(
        pending.await.is_delivered(),
        "dead-lettered counts as handled"
    );
    stop(&mut rig, task).await;
}

#[tokio::test]
async fn a_failed_at_least_once_run_fails_upstream_and_keeps_the_partial_match() {
    let mut rig = ProcessorRig::addressing("f", &["gh", "cron"], &["api"]);
    let mut api = rig.capture_of("api");
    let mut cfg = release_cfg();
    cfg["triggers"][0]["atLeastOnce"] = json!(true);
    let task = start(&mut rig, "f", cfg).await;
    assert!(rig
        .sender_of("gh")
        .send(vec![push("p1", "refs/heads/main", "c1")])
        .await
        .await
        .is_delivered());
    let p = rig.sender_of("cron").send(vec![nightly("n1")]).await;
    api.next_within(Duration::from_secs(5))
        .await
        .delivery
        .failed("down");
    let o = p.await;
    assert_eq!(o.status, Status::Failed);
    // The sender retries the nightly event: the push is still kept, so it fires again.
    let p = rig.sender_of("cron").send(vec![nightly("n1")]).await;
    let item = api.next_within(Duration::from_secs(5)).await;
    assert_eq!(data(&item.event)["commit"], "c1");
    item.delivery.delivered();
    assert!(p.await.is_delivered());
    stop(&mut rig, task).await;
}

#[tokio::test]
async fn at_most_once_settles_before_the_trigger_finishes() {
    let mut rig = ProcessorRig::addressing("m", &["a"], &["out"]);
    let mut out = rig.capture_of("out");
    let task = start(
        &mut rig,
        "m",
        json!({
            "dependencies": [{"name": "a", "source": "a"}],
            "triggers": [{"name": "t", "sink": "out"}]
        }),
    )
    .await;
    let o = rig
        .sender_of("a")
        .send(vec![Event::new("1", "/s", "t")])
        .await
        .await;
    assert!(
        o.is_delivered(),
        "Argo's default (atLeastOnce: false) acknowledges at once"
    );
    out.next_within(Duration::from_secs(5))
        .await
        .delivery
        .failed("down");
    stop(&mut rig, task).await;
}

#[tokio::test]
async fn correlate_by_joins_per_key() {
    let mut rig = ProcessorRig::addressing("c", &["orders"], &["out"]);
    let mut out = rig.capture_of("out");
    let task = start(&mut rig, "c", json!({
        "dependencies": [
            {"name": "paid", "source": "orders", "type": "order.paid"},
            {"name": "shipped", "source": "orders", "type": "order.shipped"}
        ],
        "triggers": [{"name": "done", "sink": "out", "correlate_by": "order",
                      "payload": [{"src": {"dependencyName": "paid", "dataKey": "order"}, "dest": "order"},
                                  {"src": {"dependencyName": "shipped", "dataKey": "carrier"}, "dest": "carrier"}]}]
    })).await;
    let ev =
        |id: &str, ty: &str, body: &str| Event::new(id, "/shop", ty).with_json(body.to_owned());
    for e in [
        ev("1", "order.paid", r#"{"order":"A"}"#),
        ev("2", "order.paid", r#"{"order":"B"}"#),
        ev("3", "order.shipped", r#"{"order":"B","carrier":"dhl"}"#),
    ] {
        assert!(rig
            .sender_of("orders")
            .send(vec![e])
            .await
            .await
            .is_delivered());
    }
    let item = out.next_within(Duration::from_secs(5)).await;
    assert_eq!(data(&item.event), json!({"order": "B", "carrier": "dhl"}));
    item.delivery.delivered();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(out.try_next().is_none(), "order A has not shipped");
    assert_eq!(
        metric(
            "sluice_sensor_state_events",
            &[("sensor", "c"), ("trigger", "done")]
        ),
        1.0
    );
    stop(&mut rig, task).await;
}

#[tokio::test]
async fn rate_limit_spaces_the_runs() {
    let mut rig = ProcessorRig::addressing("rl", &["a"], &["out"]);
    let out = rig.capture_of("out").auto(Status::Delivered);
    let task = start(&mut rig, "rl", json!({
        "dependencies": [{"name": "a", "source": "a"}],
        "triggers": [{"name": "t", "sink": "out", "rateLimit": {"unit": "Second", "requestsPerUnit": 20}}]
    })).await;
    let started = std::time::Instant::now();
    for i in 0..6 {
        rig.sender_of("a")
            .send(vec![Event::new(i.to_string(), "/s", "t")])
            .await
            .await;
    }
    out.wait_for(6).await;
    // 6 runs at 20/s: the last starts 5 × 50 ms after the first.
    assert!(
        started.elapsed() >= Duration::from_millis(240),
        "{:?}",
        started.elapsed()
    );
    stop(&mut rig, task).await;
}

#[test]
fn bad_configs_are_refused_with_the_place() {
    let bad = |cfg: serde_json::Value| {
        let c: SensorConfig = serde_json::from_value(cfg).unwrap();
        c.validate("s").unwrap_err()
    };
    let base = |trigger: serde_json::Value| json!({"dependencies": [{"name": "a", "source": "x"}, {"name": "b-1", "source": "x"}], "triggers": [trigger]});
    let e = bad(base(
        json!({"name": "t", "sink": "o", "conditions": "a && nope"}),
    ));
    assert!(
        e.starts_with("triggers.0.conditions: `nope` is not a dependency"),
        "{e}"
    );
    let e = bad(base(
        json!({"name": "t", "sink": "o", "payload": [{"src": {"dependencyName": "zz"}, "dest": "x"}]}),
    ));
    assert!(e.contains("payload.0.src.dependencyName: `zz`"), "{e}");
    let e = bad(base(
        json!({"name": "t", "sink": "o", "payload": [{"src": {"dependencyName": "a", "dataTemplate": "{{ .Input"}, "dest": "x"}]}),
    ));
    assert!(e.contains("payload.0.src.dataTemplate"), "{e}");
    let e = bad(base(
        json!({"name": "t", "sink": "o", "conditionsReset": [{"byTime": {"cron": "61 * * * *"}}]}),
    ));
    assert!(e.contains("conditionsReset.0.byTime.cron"), "{e}");
    let e = bad(base(
        json!({"name": "t", "sink": "o", "parameters": [{"src": {"dependencyName": "a"}, "dest": "id"}]}),
    ));
    assert!(
        e.contains("parameters.0.dest: `id` is not an attribute"),
        "{e}"
    );
    let e = bad(
        json!({"dependencies": [{"name": "a", "source": "x", "filters": {"data": [{"path": "p", "type": "string", "value": ["("]}]}}], "triggers": [{"name": "t", "sink": "o"}]}),
    );
    assert!(e.contains("dependencies.0.filters.data.0.value"), "{e}");
    let e = bad(
        json!({"dependencies": [{"name": "a", "source": "x", "filters": {"data": [{"path": "p", "type": "number", "value": ["ten"]}]}}], "triggers": [{"name": "t", "sink": "o"}]}),
    );
    assert!(e.contains("is not a number"), "{e}");
    let e = bad(base(json!({"name": "t", "sink": "o", "dlqTrigger": "o"})));
    assert!(e.contains("dlqTrigger"), "{e}");
    assert!(
        bad(json!({"dependencies": [], "triggers": [{"name": "t", "sink": "o"}]}))
            .contains("dependencies")
    );
    let e = bad(
        json!({"dependencies": [{"name": "a", "source": "x"}, {"name": "a", "source": "y"}], "triggers": [{"name": "t", "sink": "o"}]}),
    );
    assert!(e.contains("`a` is used twice"), "{e}");
}

#[test]
fn wiring_names_the_sources_and_sinks() {
    let c: SensorConfig = serde_json::from_value(release_cfg()).unwrap();
    let w = c.wiring();
    let names: Vec<&str> = w.inputs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["gh", "cron"]);
    assert_eq!(w.inputs[1].path, ["dependencies", "1", "source"]);
    assert_eq!(w.targets[0].name, "api");
}

#[tokio::test]
async fn transform_runs_before_the_filters_and_its_result_reaches_the_trigger() {
    let mut rig = ProcessorRig::addressing("tr", &["gh"], &["out"]);
    let mut out = rig.capture_of("out");
    let task = start(&mut rig, "tr", json!({
        "dependencies": [{"name": "push", "source": "gh",
            "transform": {"jq": "{ref, size, kind: (if .size > 10 then \"big\" else \"small\" end)}"},
            "filters": {"script": "return event.kind == \"big\" and event.ref == \"main\""}}],
        "triggers": [{"name": "t", "sink": "out"}]
    })).await;
    let ev = |id: &str, size: u32| {
        Event::new(id, "/gh", "push")
            .with_json(format!(r#"{{"ref":"main","size":{size},"secret":"x"}}"#))
    };
    assert!(rig
        .sender_of("gh")
        .send(vec![ev("small", 3)])
        .await
        .await
        .is_delivered());
    let p = rig.sender_of("gh").send(vec![ev("big", 30)]).await;
    let item = out.next_within(Duration::from_secs(5)).await;
    assert_eq!(item.event.id, "big");
    assert_eq!(
        data(&item.event),
        json!({"ref": "main", "size": 30, "kind": "big"}),
        "the transformed data, without `secret`"
    );
    item.delivery.delivered();
    assert!(p.await.is_delivered());
    assert!(out.try_next().is_none());
    stop(&mut rig, task).await;
}

fn saved(store: &Arc<sluice_core::state::MemoryStateStore>, table: &str) -> usize {
    let mut n = 0;
    store.scan(table, &mut |_, _| n += 1).unwrap();
    n
}

#[tokio::test]
async fn a_stop_in_the_middle_of_an_at_least_once_run_keeps_the_saved_events() {
    let mut cfg = release_cfg();
    cfg["triggers"][0]["atLeastOnce"] = json!(true);
    let store = {
        let mut rig = ProcessorRig::addressing("alo", &["gh", "cron"], &["api"]);
        let mut api = rig.capture_of("api");
        let task = start(&mut rig, "alo", cfg.clone()).await;
        assert!(rig
            .sender_of("gh")
            .send(vec![push("p1", "refs/heads/main", "c1")])
            .await
            .await
            .is_delivered());
        let pending = rig.sender_of("cron").send(vec![nightly("n1")]).await;
        // The run is under way (the sink holds it) when the grace period ends.
        let held = api.next_within(Duration::from_secs(5)).await;
        rig.grace_over.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        drop(held);
        assert_eq!(
            pending.await.status,
            Status::Failed,
            "the nightly event is not acknowledged"
        );
        rig.state.clone()
    };
    assert_eq!(
        saved(&store, "sensor.alo"),
        2,
        "both events are still saved"
    );
    // Next start: the sender redelivers the nightly event, which fires with the saved push.
    let mut rig = ProcessorRig::addressing("alo", &["gh", "cron"], &["api"]);
    rig.state = store.clone();
    let mut api = rig.capture_of("api");
    let task = start(&mut rig, "alo", cfg).await;
    let p = rig.sender_of("cron").send(vec![nightly("n1")]).await;
    let item = api.next_within(Duration::from_secs(5)).await;
    assert_eq!(data(&item.event)["commit"], "c1");
    item.delivery.delivered();
    assert!(p.await.is_delivered());
    stop(&mut rig, task).await;
    assert_eq!(saved(&store, "sensor.alo"), 0, "spent once delivered");
}

#[tokio::test]
async fn a_failed_then_retried_run_leaves_nothing_saved() {
    let mut rig = ProcessorRig::addressing("fr", &["gh", "cron"], &["api"]);
    let mut api = rig.capture_of("api");
    let mut cfg = release_cfg();
    cfg["triggers"][0]["atLeastOnce"] = json!(true);
    let task = start(&mut rig, "fr", cfg).await;
    assert!(rig
        .sender_of("gh")
        .send(vec![push("p1", "refs/heads/main", "c1")])
        .await
        .await
        .is_delivered());
    let p = rig.sender_of("cron").send(vec![nightly("n1")]).await;
    api.next_within(Duration::from_secs(5))
        .await
        .delivery
        .failed("down");
    assert_eq!(p.await.status, Status::Failed);
    let p = rig.sender_of("cron").send(vec![nightly("n1")]).await;
    api.next_within(Duration::from_secs(5))
        .await
        .delivery
        .delivered();
    assert!(p.await.is_delivered());
    stop(&mut rig, task).await;
    assert_eq!(
        saved(&rig.state, "sensor.fr"),
        0,
        "a spent event stayed saved"
    );
}

#[tokio::test]
async fn every_trigger_on_a_reset_schedule_is_cleared_even_under_traffic() {
    let mut rig = ProcessorRig::addressing("rs", &["a", "b", "noise", "other"], &["out"]);
    let out = rig.capture_of("out").auto(Status::Delivered);
    let reset = json!([{"byTime": {"cron": "* * * * * *"}}]);
    let task = start(&mut rig, "rs", json!({
        "dependencies": [{"name": "a", "source": "a"}, {"name": "b", "source": "b"}, {"name": "n", "source": "noise"}],
        "triggers": [
            {"name": "one", "sink": "out", "conditions": "a && b", "conditionsReset": reset},
            {"name": "two", "sink": "out", "conditions": "a && n", "conditionsReset": reset}
        ]
    })).await;
    assert!(rig
        .sender_of("a")
        .send(vec![Event::new("a1", "/a", "t")])
        .await
        .await
        .is_delivered());
    // Steady input (from a source no dependency reads) while the ticks pass: the sensor is
    // busy with input at every tick and must still clear both triggers.
    let started = std::time::Instant::now();
    let mut i = 0;
    while started.elapsed() < Duration::from_millis(2100) {
        i += 1;
        let o = rig
            .sender_of("other")
            .send(vec![Event::new(format!("o{i}"), "/o", "t")])
            .await
            .await;
        assert!(o.is_delivered());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(i > 100, "{i} inputs");
    assert_eq!(
        metric(
            "sluice_sensor_state_events",
            &[("sensor", "rs"), ("trigger", "one")]
        ),
        0.0
    );
    assert_eq!(
        metric(
            "sluice_sensor_state_events",
            &[("sensor", "rs"), ("trigger", "two")]
        ),
        0.0
    );
    assert!(
        metric(
            "sluice_sensor_state_evictions_total",
            &[("sensor", "rs"), ("trigger", "one"), ("reason", "reset")]
        ) >= 1.0
    );
    assert!(
        metric(
            "sluice_sensor_state_evictions_total",
            &[("sensor", "rs"), ("trigger", "two"), ("reason", "reset")]
        ) >= 1.0
    );
    // After the reset, b alone does not fire `one`.
    assert!(rig
        .sender_of("b")
        .send(vec![Event::new("b1", "/b", "t")])
        .await
        .await
        .is_delivered());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(out.len(), 0);
    stop(&mut rig, task).await;
}

#[tokio::test]
async fn a_whole_dlq_trigger_runs_with_the_same_events_and_its_own_payload() {
    let mut rig = ProcessorRig::addressing("wd", &["a"], &["out", "alerts"]);
    let mut out = rig.capture_of("out");
    let mut alerts = rig.capture_of("alerts");
    let task = start(&mut rig, "wd", json!({
        "dependencies": [{"name": "a", "source": "a"}],
        "triggers": [{"name": "t", "sink": "out", "atLeastOnce": true,
            "dlqTrigger": {"name": "page", "sink": "alerts", "retryStrategy": {"steps": 2, "duration": "10ms", "jitter": 0},
                           "payload": [{"src": {"dependencyName": "a", "dataKey": "job"}, "dest": "failed_job"},
                                       {"src": {"dependencyName": "a", "value": "page"}, "dest": "action"}]}}]
    })).await;
    let p = rig
        .sender_of("a")
        .send(vec![
            Event::new("1", "/s", "t").with_json(r#"{"job":"deploy-7"}"#)
        ])
        .await;
    out.next_within(Duration::from_secs(5))
        .await
        .delivery
        .failed("500");
    // The dlq trigger's own retries: the first attempt fails, the second is delivered.
    alerts
        .next_within(Duration::from_secs(5))
        .await
        .delivery
        .failed("busy");
    let page = alerts.next_within(Duration::from_secs(5)).await;
    assert_eq!(
        data(&page.event),
        json!({"failed_job": "deploy-7", "action": "page"})
    );
    assert_eq!(page.event.ty, "sluice.sensor.page");
    page.delivery.delivered();
    assert!(p.await.is_delivered(), "handled by the dlq trigger");
    stop(&mut rig, task).await;
    let bad = |dlq: serde_json::Value| {
        let c: SensorConfig = serde_json::from_value(json!({"dependencies": [{"name": "a", "source": "x"}], "triggers": [{"name": "t", "sink": "o", "dlqTrigger": dlq}]})).unwrap();
        c.validate("s").unwrap_err()
    };
    assert!(bad(json!({"name": "d", "sink": "p", "conditions": "a"})).contains("do not apply"));
    assert!(bad(json!({"name": "d", "sink": "p", "dlqTrigger": "q"})).contains("of its own"));
    assert!(bad(json!({"name": "d", "sink": "o"})).contains("another sink"));
}

/// Through the sensor's own matching (where the filter paths are located while the data is
/// checked): data that is not JSON fails only the dependencies whose filters read it, and
/// located values answer as gjson does. (That a dependency without such filters skips the
/// check is not visible here; its answer is the same either way.)
#[test]
fn only_the_dependencies_that_read_the_data_need_it_to_be_json() {
    let mut b = crate::run::Bench::new(json!({
        "dependencies": [
            {"name": "any", "source": "s", "filters": {"context": {"type": "t"}}},
            {"name": "sku", "source": "s", "filters": {
                "data": [{"path": "items.0.sku", "type": "string", "value": ["^A-"]}],
                "exprs": [{"expr": "qty >= 3 && sku != 'B'", "fields": [
                    {"name": "qty", "path": "items.0.qty"}, {"name": "sku", "path": "items.0.sku"}]}]}}
        ],
        "triggers": [
            {"name": "on-any", "conditions": "any", "sink": "out"},
            {"name": "on-sku", "conditions": "sku", "sink": "out"}
        ]
    }));
    let mut text = Event::new("1", "src", "t");
    text.data = sluice_core::Data::from_bytes(bytes::Bytes::from_static(b"{not json"), None);
    assert_eq!(b.event("s", &text), 1, "the context filter alone passes");
    // As a webhook hands a body over: bytes, typed but unchecked.
    let unchecked = |text: String| {
        let mut e = Event::new("1", "src", "t");
        e.datacontenttype = Some("application/json".into());
        e.data = sluice_core::Data::from_bytes(text.into(), Some("application/json"));
        e
    };
    let long = "x".repeat(2000);
    let doc = |sku: &str, qty: u32| {
        unchecked(format!(
            r#"{{"pad":"{long}","items":[{{"sku":"{sku}","qty":{qty}}},{{"sku":"Z","qty":0}}]}}"#
        ))
    };
    assert_eq!(b.event("s", &doc("A-1", 3)), 2);
    assert_eq!(b.event("s", &doc("A-1", 2)), 1, "the expr fails");
    assert_eq!(b.event("s", &doc("C-1", 9)), 1, "the data filter fails");
    // A key with escapes before the plain one on a planned path: gjson reads the escaped key
    // as `items` and takes it (the first of the name), so the event fails the data filter;
    // locating the plain one instead would pass it.
    let text = r#"{"it\u0065ms":[{"sku":"X-9","qty":1}],"items":[{"sku":"A-2","qty":5}]}"#;
    assert_eq!(
        gjson::get(text, "items.0.sku").str(),
        "X-9",
        "gjson's reading"
    );
    assert_eq!(b.event("s", &unchecked(text.to_owned())), 1);
}

/// A run that is one hand-over to the sink (one output, no retry, no dead letter, no rate
/// limit) is settled by its output's continuation, with no task of its own; when the sink's
/// queue is full it waits in the sensor's window instead. Either way the input is settled with
/// the output's outcome and the run is counted once. (What this pins holds for both ways, and
/// held before the continuation: a continuation called never or twice, or a run lost at the
/// full queue, fails it.)
#[tokio::test]
async fn a_run_handed_straight_to_the_sink_settles_its_input_with_the_outcome() {
    let mut rig = ProcessorRig::addressing_with_queue("direct", &["a"], &["out"], 2);
    let mut out = rig.capture_of("out");
    let task = start(
        &mut rig,
        "direct",
        json!({
            "dependencies": [{"name": "d", "source": "a"}],
            "triggers": [{"name": "t", "sink": "out", "atLeastOnce": true}]
        }),
    )
    .await;
    let count = |r: &str| {
        metric(
            "sluice_sensor_triggers_total",
            &[("sensor", "direct"), ("trigger", "t"), ("result", r)],
        )
    };
    let (fired, failed) = (count("fired"), count("failed"));
    // Five inputs, a queue of two: two go straight in, three wait for room.
    let mut pending = Vec::new();
    for i in 0..5 {
        let e = Event::new(format!("e{i}"), "/s", "t").with_json(format!(r#"{{"i":{i}}}"#));
        pending.push(rig.sender_of("a").send(vec![e]).await);
    }
    let mut seen = Vec::new();
    for n in 0..5 {
        let item = out.next_within(Duration::from_secs(5)).await;
        seen.push(item.event.id.clone());
        if n == 0 {
            item.delivery.failed("down");
        } else {
            item.delivery.delivered();
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        ["e0", "e1", "e2", "e3", "e4"],
        "each input forwarded once"
    );
    let mut outcomes = Vec::new();
    for p in pending {
        outcomes.push(
            tokio::time::timeout(Duration::from_secs(5), p)
                .await
                .expect("settled"),
        );
    }
    let failed_inputs: Vec<_> = outcomes.iter().filter(|o| !o.is_delivered()).collect();
    assert_eq!(failed_inputs.len(), 1, "{outcomes:?}");
    assert_eq!(failed_inputs[0].status, Status::Failed);
    assert!(
        failed_inputs[0]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("down")),
        "{:?}",
        failed_inputs[0].reason
    );
    assert_eq!(count("fired") - fired, 4.0);
    assert_eq!(count("failed") - failed, 1.0);
    stop(&mut rig, task).await;
}

/// Hand-overs settled by the sink's answer count against `concurrency` too: with
/// `concurrency: 2` the sensor holds at most two of them and two waiting runs, and takes the
/// next input only when the waiting runs' window has room.
#[tokio::test]
async fn unsettled_hand_overs_are_bounded_by_concurrency() {
    let mut rig = ProcessorRig::addressing("bounded", &["a"], &["out"]);
    let mut out = rig.capture_of("out");
    let task = start(
        &mut rig,
        "bounded",
        json!({
            "dependencies": [{"name": "d", "source": "a"}],
            "triggers": [{"name": "t", "sink": "out", "atLeastOnce": true}],
            "concurrency": 2
        }),
    )
    .await;
    let mut pending = Vec::new();
    for i in 0..6 {
        let e = Event::new(format!("e{i}"), "/s", "t").with_json("{}");
        pending.push(rig.sender_of("a").send(vec![e]).await);
    }
    let mut held = std::collections::BTreeMap::new();
    for _ in 0..4 {
        let item = out.next_within(Duration::from_secs(5)).await;
        held.insert(item.event.id.clone(), item);
    }
    // Two hand-overs (e0, e1) and two waiting runs (e2, e3): no fifth input is taken.
    let ids: Vec<_> = held.keys().cloned().collect();
    assert_eq!(ids, ["e0", "e1", "e2", "e3"]);
    let quiet = |what: &'static str| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        what
    };
    let what = quiet("a fifth run while four are unsettled").await;
    assert!(out.try_next().is_none(), "{what}");
    // A settled hand-over frees its place, but the waiting runs' window is still full.
    held.remove("e0").unwrap().delivery.delivered();
    let what = quiet("a fifth run while the window is full").await;
    assert!(out.try_next().is_none(), "{what}");
    // A waiting run settles: the next input is taken (and waits, since e3 does).
    held.remove("e2").unwrap().delivery.delivered();
    let item = out.next_within(Duration::from_secs(5)).await;
    assert_eq!(item.event.id, "e4");
    held.insert(item.event.id.clone(), item);
    let what = quiet("a sixth run while the window is full").await;
    assert!(out.try_next().is_none(), "{what}");
    for (_, item) in held {
        item.delivery.delivered();
    }
    let last = out.next_within(Duration::from_secs(5)).await;
    assert_eq!(last.event.id, "e5");
    last.delivery.delivered();
    for p in pending {
        assert!(tokio::time::timeout(Duration::from_secs(5), p)
            .await
            .unwrap()
            .is_delivered());
    }
    stop(&mut rig, task).await;
}
