use super::*;

fn input(name: &str, text: &str) -> Input {
    Input {
        name: name.into(),
        text: text.into(),
    }
}

const WEBHOOK_ES: &str = "\
apiVersion: argoproj.io/v1alpha1
kind: EventSource
metadata:
  name: webhook
spec:
  service:
    ports:
      - port: 12000
        targetPort: 12000
  webhook:
    example:
      port: \"12000\"
      endpoint: /example
      method: POST
";

const HTTP_SENSOR: &str = "\
apiVersion: argoproj.io/v1alpha1
kind: Sensor
metadata:
  name: webhook
spec:
  template:
    serviceAccountName: operate-workflow-sa
  dependencies:
    - name: test-dep
      eventSourceName: webhook
      eventName: example
      filters:
        data:
          - path: body.x
            type: string
            value: ['a$']
  triggers:
    - template:
        name: http-trigger
        http:
          url: http://localhost:9999/hello
          payload:
            - src: { dependencyName: test-dep, dataKey: body.first_name }
              dest: first_name
          method: POST
      retryStrategy:
        steps: 3
";

#[test]
fn an_event_source_and_a_sensor_become_a_source_a_sensor_and_a_sink() {
    let t = translate(&[input("a.yaml", &format!("{WEBHOOK_ES}---\n{HTTP_SENSOR}"))]);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    let src = &t.native["sources"]["webhook.example"];
    assert_eq!(src["kind"], "webhook");
    assert_eq!(src["listen"], "0.0.0.0:12000");
    assert_eq!(src["path"], "/example");
    assert_eq!(src["format"], "argo");
    assert_eq!(src["source"], "webhook");
    assert_eq!(src["subject"], "example");
    let sensor = &t.native["sensors"]["webhook"];
    assert_eq!(sensor["dependencies"][0]["source"], "webhook.example");
    assert_eq!(
        sensor["dependencies"][0]["filters"]["data"][0]["value"][0],
        "a$"
    );
    assert_eq!(sensor["triggers"][0]["sink"], "webhook.http-trigger");
    assert_eq!(sensor["triggers"][0]["retryStrategy"]["steps"], 3);
    assert_eq!(sensor["triggers"][0]["payload"][0]["dest"], "first_name");
    let sink = &t.native["sinks"]["webhook.http-trigger"];
    assert_eq!(sink["kind"], "http");
    assert_eq!(sink["url"], "http://localhost:9999/hello");
    // Kubernetes-only fields are noted with their position in the document.
    let notes: Vec<String> = t.notes.iter().map(|n| n.to_string()).collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("a.yaml:7:5: spec.service.ports:")),
        "{notes:#?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("a.yaml:21:3: spec.template:")),
        "{notes:#?}"
    );
    // And the result is a valid native config.
    let c = crate::config::parse_with("<none>", "", t.generated).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.sources.len(), 1);
    assert_eq!(c.sinks.len(), 1);
    assert_eq!(c.processors.len(), 1);
}

#[test]
fn refusals_point_into_the_document_they_came_from() {
    let sensor = HTTP_SENSOR
        .replace("eventName: example", "eventName: exampel")
        .replace(
            "method: POST\n      retry",
            "method: POST\n          bogus: 1\n      retry",
        );
    let t = translate(&[input("es.yaml", WEBHOOK_ES), input("s.yaml", &sensor)]);
    let errs: Vec<String> = t.refused.iter().map(|e| e.to_string()).collect();
    assert!(
        errs.iter().any(|e| e.starts_with("s.yaml:11:7: spec.dependencies.0.eventName: no EventSource declares event `exampel` of `webhook` (did you mean `webhook/example`?)")),
        "{errs:#?}"
    );
    assert!(
        errs.iter()
            .any(|e| e
                .starts_with("s.yaml:26:11: spec.triggers.0.template.http.bogus: not supported")),
        "{errs:#?}"
    );
}

#[test]
fn other_kinds_are_passed_over_and_unknown_types_are_refused_by_name() {
    let text = "\
apiVersion: v1
kind: ConfigMap
metadata: { name: x }
---
apiVersion: argoproj.io/v1alpha1
kind: EventSource
metadata: { name: e }
spec:
  nsq:
    a: { hostAddress: x }
";
    let t = translate(&[input("m.yaml", text)]);
    assert!(
        t.notes[0]
            .to_string()
            .starts_with("m.yaml:2:1: ConfigMap x: not an Argo Events"),
        "{:?}",
        t.notes
    );
    let err = t.refused[0].to_string();
    assert!(
        err.starts_with(
            "m.yaml:9:3: spec.nsq: EventSource type `nsq` is not supported by Sluice; it runs: "
        ),
        "{err}"
    );
    assert!(err.contains("calendar") && err.contains("webhook"), "{err}");
}

#[test]
fn errors_of_the_native_config_point_into_the_manifest() {
    // `port` is fine for Argo, but the webhook kind refuses a method it does not know.
    let es = WEBHOOK_ES.replace("method: POST", "method: BREW");
    let t = translate(&[input("es.yaml", &es)]);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    let err = match crate::config::parse_with("<none>", "", t.generated) {
        Ok(_) => panic!("BREW was accepted"),
        Err(e) => e.to_string(),
    };
    // At the event the source was made from.
    assert!(
        err.starts_with("es.yaml:11:5: sources.webhook.example.methods"),
        "{err}"
    );
}

#[test]
fn secrets_are_read_from_the_secrets_dir_then_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tok")).unwrap();
    std::fs::write(dir.path().join("tok/t"), "s3cret\n").unwrap();
    std::env::set_var("SLUICE_SECRETS_DIR", dir.path());
    assert_eq!(secret("tok/t").unwrap(), "s3cret");
    std::env::set_var(secrets::env_name("other", "my-key"), "from-env");
    assert_eq!(secret("other/my-key").unwrap(), "from-env");
    let err = secret("nope/k").unwrap_err();
    assert!(
        err.contains("nope/k") && err.contains("SLUICE_SECRET_NOPE_K"),
        "{err}"
    );
    assert!(secret_file("tok/t").unwrap().ends_with("tok/t"));
}
