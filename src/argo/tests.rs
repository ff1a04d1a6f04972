use super::*;
use serde_json::json;

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
    std::env::set_var(secrets::env_name("db", "pw"), "p@ss:w/rd");
    assert_eq!(secret_url("db/pw").unwrap(), "p%40ss%3Aw%2Frd");
}

/// Argo types Sluice has a connector for (the list): a document of these types is in
/// the corpus goal's denominator whether or not its mapping exists yet.
const HAVE_SOURCES: [&str; 20] = [
    "webhook",
    "calendar",
    "sqs",
    "sns",
    "minio",
    "pubSub",
    "kafka",
    "nats",
    "amqp",
    "mqtt",
    "redis",
    "redisStream",
    "github",
    "gitlab",
    "bitbucket",
    "bitbucketserver",
    "gerrit",
    "slack",
    "stripe",
    "resource",
];
const HAVE_TRIGGERS: [&str; 9] = [
    "http",
    "log",
    "k8s",
    "argoWorkflow",
    "kafka",
    "nats",
    "slack",
    "email",
    "awsLambda",
];

fn corpus_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/argo/corpus"),
        &mut files,
    )
    .unwrap();
    files.sort();
    files
}

/// The types a document uses: EventSource types, or a Sensor's trigger types.
fn types_of(v: &Value) -> Vec<String> {
    match v["kind"].as_str() {
        Some("EventSource") => v["spec"]
            .as_object()
            .map(|m| {
                m.keys()
                    .filter(|k| {
                        !["template", "service", "replicas", "eventBusName"].contains(&k.as_str())
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default(),
        Some("Sensor") => v["spec"]["triggers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|t| {
                t["template"]
                    .as_object()
                    .map(|m| {
                        m.keys()
                            .filter(|k| {
                                !["name", "conditions", "conditionsReset", "policy"]
                                    .contains(&k.as_str())
                            })
                            .cloned()
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A webhook EventSource declaring every event a Sensor depends on, so a Sensor is checked on
/// its own.
fn stand_ins(v: &Value) -> String {
    let mut by_es: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in v["spec"]["dependencies"].as_array().into_iter().flatten() {
        if let (Some(es), Some(ev)) = (d["eventSourceName"].as_str(), d["eventName"].as_str()) {
            by_es.entry(es.into()).or_default().push(ev.into());
        }
    }
    let mut out = String::new();
    for (es, evs) in by_es {
        out.push_str(&format!(
            "---\napiVersion: argoproj.io/v1alpha1\nkind: EventSource\nmetadata: {{name: {es:?}}}\nspec:\n  webhook:\n"
        ));
        let mut seen = std::collections::HashSet::new();
        for (i, ev) in evs.iter().enumerate() {
            if seen.insert(ev.clone()) {
                out.push_str(&format!(
                    "    {ev:?}: {{port: \"{}\", endpoint: /e{i}}}\n",
                    20000 + i
                ));
            }
        }
    }
    out
}

/// Every document of Argo's own manifests (tests/argo/corpus): loaded and valid, or refused
/// with the fields and why; never a crash. Writes the table to target/argo-compat.md.
#[test]
fn argo_corpus_loads() {
    // The corpus's secrets are placeholders: each one named gets a stand-in file.
    let secrets = tempfile::tempdir().unwrap();
    std::env::set_var("SLUICE_SECRETS_DIR", secrets.path());
    std::env::remove_var(EVENTBUS_URL_ENV);
    let mut table = String::from("| file | document | result |\n|---|---|---|\n");
    let (mut counted, mut loaded) = (0, 0);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/argo/corpus");
    for path in corpus_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let rel = path.strip_prefix(&root).unwrap().display().to_string();
        for de in yaml_serde::Deserializer::from_str(&text) {
            let v: Value = match serde::Deserialize::deserialize(de) {
                Ok(v) => v,
                Err(_) => break,
            };
            let kind = v["kind"].as_str().unwrap_or("").to_owned();
            if !matches!(kind.as_str(), "EventSource" | "Sensor" | "EventBus") {
                continue;
            }
            let name = v["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let doc_text = yaml_serde::to_string(&v).unwrap();
            let mut inputs = vec![input(&rel, &doc_text)];
            if kind == "Sensor" {
                inputs.push(input("<stand-ins>", &stand_ins(&v)));
            }
            let t = translate(&inputs);
            let mut problems: Vec<String> = t.refused.iter().map(|e| e.msg.clone()).collect();
            for (.., value, _, _) in &t.generated.entries {
                let text = yaml_serde::to_string(value).unwrap();
                for part in text.split("${secret").skip(1) {
                    let sel = part
                        .trim_start_matches("-file")
                        .trim_start_matches("-url")
                        .trim_start_matches(':');
                    let sel = &sel[..sel.find('}').unwrap()];
                    let f = secrets.path().join(sel);
                    std::fs::create_dir_all(f.parent().unwrap()).unwrap();
                    std::fs::write(f, "stand-in").unwrap();
                }
            }
            if problems.is_empty() {
                if let Err(e) = crate::config::parse_with("<none>", "", t.generated) {
                    problems = e.0.iter().map(|e| e.msg.clone()).collect();
                }
            }
            let types = types_of(&v);
            let have = !types.is_empty()
                && types.iter().all(|t| {
                    HAVE_SOURCES.contains(&t.as_str()) || HAVE_TRIGGERS.contains(&t.as_str())
                });
            if have && kind != "EventBus" {
                counted += 1;
                if problems.is_empty() {
                    loaded += 1;
                }
            }
            let result = if problems.is_empty() {
                "loaded".to_owned()
            } else {
                format!(
                    "refused: {}",
                    problems.join("; ").replace('|', "\\|").replace('\n', " ")
                )
            };
            table.push_str(&format!("| {rel} | {kind} {name} | {result} |\n"));
        }
    }
    let summary = format!(
        "\n{loaded} of {counted} EventSource and Sensor documents whose types Sluice has load and validate ({:.0} %).\n",
        100.0 * loaded as f64 / counted.max(1) as f64
    );
    table.push_str(&summary);
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/argo-compat.md");
    let _ = std::fs::write(&out, &table);
    println!("{table}");
    // docs/argo-compat.md ends with this table: it shows what loads today.
    let docs_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/argo-compat.md");
    let docs = std::fs::read_to_string(&docs_path).unwrap();
    let at = docs
        .find("| file | document | result |")
        .expect("the table in docs/argo-compat.md");
    if docs[at..] != table {
        if std::env::var_os("SLUICE_BLESS").is_some() {
            std::fs::write(&docs_path, format!("{}{table}", &docs[..at])).unwrap();
        } else {
            panic!(
                "docs/argo-compat.md's table is not what the corpus gives today: run \
                 `SLUICE_BLESS=1 cargo nextest run -p sluice --bin sluice argo_corpus` and \
                 commit the result"
            );
        }
    }
    assert!(counted >= 100, "{counted} documents counted");
    // The goal of issue #50: at least 90 %.
    assert!(
        loaded * 100 >= counted * 90,
        "{summary}see {}",
        out.display()
    );
}

const BUS: &str = "\
apiVersion: argoproj.io/v1alpha1
kind: EventBus
metadata:
  name: default
spec:
  jetstreamExotic:
    url: nats://127.0.0.1:4222
    streamConfig: \"\"
";

#[test]
fn with_an_event_bus_sources_publish_to_it_and_sensors_read_it() {
    let t = translate(&[
        input("bus.yaml", BUS),
        input("es.yaml", WEBHOOK_ES),
        input("s.yaml", HTTP_SENSOR),
    ]);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    let sink = &t.native["sinks"]["eventbus.default"];
    assert_eq!(sink["kind"], "nats");
    assert_eq!(sink["format"], "argo-eventbus");
    assert_eq!(sink["url"], "nats://127.0.0.1:4222");
    assert_eq!(
        t.native_routes,
        vec![json!({"from": ["webhook.example"], "to": ["eventbus.default"]})]
    );
    let src = &t.native["sources"]["eventbus.default.webhook"];
    assert_eq!(src["kind"], "jetstream");
    assert_eq!(src["filter_subjects"], json!(["default.webhook.example"]));
    assert_eq!(src["deliver"], "new");
    let dep = &t.native["sensors"]["webhook"]["dependencies"][0];
    assert_eq!(dep["source"], "eventbus.default.webhook");
    assert_eq!(dep["event_source"], "webhook");
    assert_eq!(dep["event_subject"], "example");
    let c = crate::config::parse_with("<none>", "", t.generated).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (c.sources.len(), c.sinks.len(), c.processors.len()),
        (2, 2, 1)
    );
    assert_eq!(c.routes.len(), 2, "the bus route and the sensor's input");

    // A Sensor alone reads the bus for EventSources that run elsewhere (in Argo).
    let t = translate(&[input("bus.yaml", BUS), input("s.yaml", HTTP_SENSOR)]);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    assert!(t.native["sources"].contains_key("eventbus.default.webhook"));
    // A bus of another name is not this Sensor's.
    let other = BUS.replace("name: default", "name: other");
    let t = translate(&[input("bus.yaml", &other), input("s.yaml", HTTP_SENSOR)]);
    assert!(
        t.refused[0]
            .msg
            .contains("no EventSource declares event `example` of `webhook`"),
        "{:?}",
        t.refused
    );
}

#[test]
fn an_event_bus_refuses_what_it_cannot_reach() {
    let managed = "\
apiVersion: argoproj.io/v1alpha1
kind: EventBus
metadata: { name: default }
spec:
  jetstream:
    version: latest
";
    std::env::remove_var(EVENTBUS_URL_ENV);
    let t = translate(&[input("bus.yaml", managed)]);
    let err = t.refused[0].to_string();
    assert!(
        err.starts_with("bus.yaml:5:3: spec.jetstream: Argo's managed bus"),
        "{err}"
    );
    assert!(err.contains("--eventbus-url"), "{err}");
    std::env::set_var(EVENTBUS_URL_ENV, "nats://bus:4222");
    let t = translate(&[input("bus.yaml", managed)]);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    let stan = "\
apiVersion: argoproj.io/v1alpha1
kind: EventBus
metadata: { name: default }
spec:
  nats: { native: {} }
";
    let t = translate(&[input("bus.yaml", stan)]);
    assert!(t.refused[0].msg.contains("deprecated"), "{:?}", t.refused);
}

#[test]
fn the_kafka_event_bus_both_ways() {
    let bus = "\
apiVersion: argoproj.io/v1alpha1
kind: EventBus
metadata: { name: default, namespace: argo-events }
spec:
  kafka: { url: \"k1:9092,k2:9092\", version: \"3.6.0\" }
";
    let sensor = HTTP_SENSOR.replace(
        "  name: webhook\n",
        "  name: webhook\n  namespace: argo-events\n",
    );
    let t = translate(&[
        input("bus.yaml", bus),
        input("es.yaml", WEBHOOK_ES),
        input("s.yaml", &sensor),
    ]);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    let sink = &t.native["sinks"]["eventbus.default"];
    assert_eq!(sink["kind"], "kafka");
    assert_eq!(sink["topic"], "argo-events-default");
    assert_eq!(sink["key"], "{source}.{subject}");
    assert_eq!(sink["mode"], "structured");
    let src = &t.native["sources"]["eventbus.default.webhook"];
    assert_eq!(src["kind"], "kafka");
    assert_eq!(src["format"], "argo-eventbus");
    assert_eq!(src["group"], "argo-events-webhook");
    assert_eq!(src["properties"]["auto.offset.reset"], "latest");
    crate::config::parse_with("<none>", "", t.generated).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn two_event_sources_of_one_name_are_refused_and_dead_letter_triggers_get_their_own_sink() {
    let t = translate(&[input("a.yaml", WEBHOOK_ES), input("b.yaml", WEBHOOK_ES)]);
    let err = t.refused[0].to_string();
    assert!(
        err.starts_with("b.yaml:4:3: metadata.name: two EventSources are named `webhook` (the other one is in a.yaml)"),
        "{err}"
    );
    let sensor = HTTP_SENSOR.replace(
        "      retryStrategy:\n        steps: 3\n",
        "      atLeastOnce: true\n      retryStrategy:\n        steps: 3\n      dlqTrigger:\n        template:\n          name: parked\n          log: {}\n        atLeastOnce: true\n",
    );
    let t = translate(&[input("es.yaml", WEBHOOK_ES), input("s.yaml", &sensor)]);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    let tr = &t.native["sensors"]["webhook"]["triggers"][0];
    assert_eq!(tr["dlqTrigger"]["sink"], "webhook.parked.dlq");
    assert_eq!(tr["atLeastOnce"], true);
    assert_eq!(t.native["sinks"]["webhook.parked.dlq"]["kind"], "log");
    crate::config::parse_with("<none>", "", t.generated).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn every_mapped_type_publishes_to_the_event_bus_with_argo_names() {
    let es = "\
apiVersion: argoproj.io/v1alpha1
kind: EventSource
metadata: { name: queues }
spec:
  sqs:
    orders: { queue: q, region: us-east-1, jsonBody: true }
  nats:
    ticks: { url: nats://n:4222, subject: ticks }
";
    let t = translate(&[input("bus.yaml", BUS), input("es.yaml", es)]);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    assert_eq!(t.native["sources"]["queues.orders"]["subject"], "orders");
    assert_eq!(
        t.native["sources"]["queues.ticks"]["event_subject"],
        "ticks"
    );
    assert_eq!(t.native["sources"]["queues.ticks"]["subject"], "ticks");
    assert_eq!(t.native_routes.len(), 2);
    crate::config::parse_with("<none>", "", t.generated).unwrap_or_else(|e| panic!("{e}"));

    // The git providers carry the names too.
    let gh = "\
apiVersion: argoproj.io/v1alpha1
kind: EventSource
metadata: { name: git }
spec:
  github:
    push: { webhook: { port: \"12000\", endpoint: /push }, webhookSecret: { name: s, key: k } }
";
    let t = translate(&[input("bus.yaml", BUS), input("gh.yaml", gh)]);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    assert_eq!(t.native["sources"]["git.push"]["source"], "git");
    assert_eq!(t.native["sources"]["git.push"]["subject"], "push");
    // So do sns and resource: every mapped type publishes with Argo's names.
    let sns = "\
apiVersion: argoproj.io/v1alpha1
kind: EventSource
metadata: { name: aws }
spec:
  sns:
    alerts: { webhook: { port: \"12001\", endpoint: /sns }, topicArn: \"arn:aws:sns:us-east-1:1:t\" }
  resource:
    pods: { version: v1, resource: pods }
";
    let t = translate(&[input("bus.yaml", BUS), input("sns.yaml", sns)]);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    assert_eq!(t.native["sources"]["aws.alerts"]["subject"], "alerts");
    assert_eq!(t.native["sources"]["aws.pods"]["source"], "aws");
    assert_eq!(t.native_routes.len(), 2);
    crate::config::parse_with("<none>", "", t.generated).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn fields_read_and_found_wanting_are_refused_and_argo_defaults_are_kept() {
    let es = "\
apiVersion: argoproj.io/v1alpha1
kind: EventSource
metadata: { name: mixed }
spec:
  kafka:
    orders: { url: k:9092, topic: orders }
  gitlab:
    mr:
      webhook: { port: \"12000\", endpoint: /mr }
      secretToken: { name: s, key: k }
      events: [ConfidentialIssuesEvents, NoSuchEvents]
";
    let t = translate(&[input("es.yaml", es)]);
    // Argo starts a new group at the newest record.
    assert_eq!(
        t.native["sources"]["mixed.orders"]["properties"]["auto.offset.reset"],
        "latest"
    );
    let errs: Vec<String> = t.refused.iter().map(|e| e.to_string()).collect();
    assert!(
        errs.iter()
            .any(|e| e.contains("spec.gitlab.mr.events.1: GitLab hook option \"NoSuchEvents\"")),
        "{errs:#?}"
    );
    assert_eq!(errs.len(), 1, "{errs:#?}");

    let start = HTTP_SENSOR.find("        http:").unwrap();
    let end =
        HTTP_SENSOR.find("          method: POST\n").unwrap() + "          method: POST\n".len();
    let sensor = format!(
        "{}        nats:\n          url: nats://n:4222\n          subject: \"out.{{x}}\"\n{}",
        &HTTP_SENSOR[..start],
        &HTTP_SENSOR[end..]
    );
    let t = translate(&[input("es.yaml", WEBHOOK_ES), input("s.yaml", &sensor)]);
    assert!(
        t.refused.iter().any(|e| e
            .msg
            .contains("template.nats.subject: a subject with `{` is not supported")),
        "{:?}",
        t.refused
    );
}

#[test]
fn http_basic_auth_becomes_an_authorization_header_from_two_secrets() {
    let sensor = HTTP_SENSOR.replace(
        "          method: POST\n",
        "          method: POST\n          basicAuth:\n            username: { name: creds, key: user }\n            password: { name: creds, key: pass }\n",
    );
    let t = translate(&[input("es.yaml", WEBHOOK_ES), input("s.yaml", &sensor)]);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    assert_eq!(
        t.native["sinks"]["webhook.http-trigger"]["headers"]["authorization"],
        "${secret-basic:creds/user,creds/pass}"
    );
    std::env::set_var(secrets::env_name("creds", "user"), "aladdin");
    std::env::set_var(secrets::env_name("creds", "pass"), "opensesame");
    assert_eq!(
        secret_basic("creds/user,creds/pass").unwrap(),
        "Basic YWxhZGRpbjpvcGVuc2VzYW1l"
    );
    // And the native config reads it.
    std::env::set_var("SLUICE_SECRETS_DIR", "/nonexistent");
    crate::config::parse_with("<none>", "", t.generated).unwrap_or_else(|e| panic!("{e}"));
}
