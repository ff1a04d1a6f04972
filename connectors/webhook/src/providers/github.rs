//! `kind: github` — `X-Hub-Signature-256` (HMAC-SHA256 over the raw body), events named after
//! the CloudEvents GitHub adapter (`cloudevents/spec`, `cloudevents/adapters/github.md` at
//! c5eb14ae13d0559c66221fb55a65c453c20e8cd3), id = `X-GitHub-Delivery` (stable across GitHub's
//! redeliveries).

use bytes::Bytes;
use http::{HeaderMap, HeaderName, StatusCode};

use super::{
    first, header_400, inject_keys, json_event, single, Doc, EventFilter, Keys, Naming, Provider,
    Refusal, Request, Secret, Verdict,
};
use crate::Format;

provider_config! {
    /// `kind: github` options.
    GithubConfig, "github", "/github", "github", 25 {
        /// The webhook's secret(s); any may match (rotation).
        secrets: Vec<Secret>,
        /// `X-GitHub-Event` names to turn into events (`*`, `prefix*`); others are answered 200
        /// and counted as filtered. Default: all.
        #[serde(default)]
        events: Vec<String>,
    }
}
provider_source!(GithubConfig);

impl GithubConfig {
    pub(crate) fn auth_config(&self) -> Option<crate::AuthConfig> {
        None
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        super::check_secrets("secrets", &self.secrets, false)?;
        EventFilter::new(&self.events).map(drop)
    }

    pub(crate) fn provider(&self) -> Result<Github, String> {
        Ok(Github {
            keys: Keys::sha256(&self.secrets),
            events: EventFilter::new(&self.events)?,
        })
    }
}

pub(crate) struct Github {
    keys: Keys,
    events: EventFilter,
}

// Read on every delivery: prebuilt, so a lookup hashes without parsing the name.
static SIG256: HeaderName = HeaderName::from_static("x-hub-signature-256");
static SIG1: HeaderName = HeaderName::from_static("x-hub-signature");
static EVENT: HeaderName = HeaderName::from_static("x-github-event");
static DELIVERY: HeaderName = HeaderName::from_static("x-github-delivery");

/// Checks `sha256=<hex>` over `body`.
pub(crate) fn verify_sha256(
    keys: &Keys,
    header: &'static str,
    value: &str,
    body: &[u8],
) -> Result<(), Refusal> {
    let hex = value.strip_prefix("sha256=").ok_or_else(|| {
        Refusal::unauthorized("bad_signature", format!("{header} must be `sha256=<hex>`"))
    })?;
    let matched = keys
        .verify_any_hex(&[body], hex)
        .ok_or_else(|| Refusal::unauthorized("bad_signature", format!("{header} is not hex")))?;
    if matched {
        Ok(())
    } else {
        Err(Refusal::unauthorized(
            "bad_signature",
            format!("{header} does not match the body under any configured secret"),
        ))
    }
}

impl Provider for Github {
    fn delivery_id<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        first(headers, &DELIVERY)
    }

    fn verify(&self, req: &Request<'_>) -> Result<(), Refusal> {
        let Some(sig) = single(req.headers, &SIG256)? else {
            return Err(if req.headers.contains_key(&SIG1) {
                Refusal::unauthorized(
                    "missing_header",
                    "X-Hub-Signature-256 header missing; a SHA-1 X-Hub-Signature alone is refused",
                )
            } else {
                Refusal::unauthorized("missing_header", "X-Hub-Signature-256 header missing")
            });
        };
        verify_sha256(&self.keys, "X-Hub-Signature-256", sig, req.body)
    }

    fn event(&self, req: &Request<'_>, naming: &Naming<'_>) -> Result<Verdict, Refusal> {
        let event = header_400(req.headers, &EVENT)?.ok_or_else(|| {
            Refusal::bad_request("missing_header", "X-GitHub-Event header missing")
        })?;
        if event == "ping" {
            return Ok(Verdict::Reply(
                StatusCode::OK,
                Bytes::from_static(b"{\"status\":\"pong\"}"),
            ));
        }
        if !self.events.allows(event) {
            return Ok(Verdict::Filtered);
        }
        let id = header_400(req.headers, &DELIVERY)?
            .ok_or_else(|| {
                Refusal::bad_request("missing_header", "X-GitHub-Delivery header missing")
            })?
            .to_owned();
        // A hook may be set to `application/x-www-form-urlencoded`: the JSON is in `payload`.
        let form_payload;
        let doc = if super::is_form(req.headers) {
            form_payload = super::form_value(req.body, "payload").ok_or_else(|| {
                Refusal::bad_request("invalid_event", "form body without a `payload` field")
            })?;
            Doc::parse(form_payload.as_bytes())?
        } else {
            Doc::parse(req.body)?
        };
        let json = doc.text();
        if naming.format == Format::Argo {
            let body = inject_keys(
                json,
                &[("X-GitHub-Event", event), ("X-GitHub-Delivery", &id)],
            );
            let data = super::argo_headers_body(req.headers, &body, naming.metadata);
            return super::argo_verdict(id, naming, data);
        }
        let (ty, source, subject, time) = name(event, &doc);
        // The body itself when it is the payload (no copy); the decoded form field otherwise.
        let data = if std::ptr::eq(json.as_ptr(), req.body.as_ptr()) {
            req.body.clone()
        } else {
            Bytes::copy_from_slice(json.as_bytes())
        };
        let e = json_event(id, source, ty, subject, time, data)?;
        Ok(Verdict::Event {
            event: e,
            fresh: false,
        })
    }
}

/// How the adapter names one event: the type's suffix, the source, the subject, the time.
struct Rule {
    event: &'static str,
    /// The type's base when it differs from the event name (none does in the current table;
    /// older adapter versions typed `issues` as `issue`).
    base: Option<&'static str>,
    suffix: Suffix,
    source: Src,
    subject: Option<&'static str>,
    time: &'static [&'static str],
}

enum Suffix {
    None,
    /// `.` + the value at this path (when present).
    At(&'static str),
    /// `.` + scope + `.` + action (membership).
    ScopeAction,
}

enum Src {
    At(&'static str),
    /// `comment.url` + `/` + `comment.commit_id`.
    CommentCommit,
    /// `sender.url` without its `/username` part.
    SenderParent,
    Const(&'static str),
}

const ACTION: Suffix = Suffix::At("action");
const REPO: Src = Src::At("repository.url");

macro_rules! rule {
    ($event:literal, $suffix:expr, $source:expr, $subject:expr, [$($time:literal),*]) => {
        Rule { event: $event, base: None, suffix: $suffix, source: $source, subject: $subject, time: &[$($time),*] }
    };
    ($event:literal as $base:literal, $suffix:expr, $source:expr, $subject:expr, [$($time:literal),*]) => {
        Rule { event: $event, base: Some($base), suffix: $suffix, source: $source, subject: $subject, time: &[$($time),*] }
    };
}

/// The adapter's table, event by event, in its order: `cloudevents/spec`,
/// `cloudevents/adapters/github.md` at commit c5eb14ae13d0559c66221fb55a65c453c20e8cd3 (all 71
/// events it lists). Where it says "current time", `[]`: the time of receipt.
static RULES: &[Rule] = &[
    rule!("branch_protection_configuration", ACTION, REPO, None, []),
    rule!(
        "branch_protection_rule",
        ACTION,
        REPO,
        Some("rule.id"),
        ["rule.updated_at"]
    ),
    rule!(
        "check_run",
        ACTION,
        REPO,
        Some("check_run.id"),
        ["check_run.completed_at", "check_run.started_at"]
    ),
    rule!(
        "check_suite",
        ACTION,
        REPO,
        Some("check_suite.id"),
        ["check_suite.updated_at"]
    ),
    rule!(
        "code_scanning_alert",
        ACTION,
        REPO,
        Some("alert.number"),
        []
    ),
    rule!(
        "commit_comment",
        ACTION,
        Src::CommentCommit,
        Some("comment.id"),
        ["comment.updated_at"]
    ),
    rule!(
        "content_reference",
        ACTION,
        REPO,
        Some("content_reference.id"),
        []
    ),
    rule!("create", Suffix::At("ref_type"), REPO, Some("ref"), []),
    rule!(
        "custom_property",
        ACTION,
        REPO,
        Some("definition.property_name"),
        []
    ),
    rule!("custom_property_values", ACTION, REPO, None, []),
    rule!("delete", Suffix::At("ref_type"), REPO, Some("ref"), []),
    rule!("dependabot_alert", ACTION, REPO, Some("alert.id"), []),
    rule!(
        "deploy_key",
        ACTION,
        REPO,
        Some("key.id"),
        ["key.deleted_at", "key.created_at"]
    ),
    rule!(
        "deployment",
        Suffix::None,
        REPO,
        Some("deployment.id"),
        ["deployment.updated_at"]
    ),
    rule!(
        "deployment_protection_rule",
        ACTION,
        Src::At("deployment.url"),
        Some("deployment.id"),
        []
    ),
    rule!(
        "deployment_review",
        ACTION,
        Src::At("deployment.url"),
        Some("workflow_run.id"),
        []
    ),
    rule!(
        "deployment_status",
        Suffix::At("deployment_status.state"),
        Src::At("deployment.url"),
        Some("deployment_status.url"),
        ["deployment_status.updated_at"]
    ),
    rule!("discussion", ACTION, REPO, Some("discussion.id"), []),
    rule!(
        "discussion_comment",
        ACTION,
        REPO,
        Some("discussion.id"),
        ["comment.updated_at"]
    ),
    rule!(
        "fork",
        Suffix::None,
        REPO,
        Some("forkee.url"),
        ["forkee.created_at"]
    ),
    rule!(
        "github_app_authorization",
        Suffix::None,
        Src::At("sender.url"),
        None,
        []
    ),
    rule!("gollum", Suffix::None, REPO, None, []),
    rule!(
        "installation",
        ACTION,
        Src::At("installation.account.url"),
        Some("installation.id"),
        ["installation.updated_at"]
    ),
    rule!(
        "installation_repositories",
        ACTION,
        Src::At("installation.account.url"),
        Some("installation.id"),
        ["installation.updated_at"]
    ),
    rule!(
        "installation_target",
        ACTION,
        Src::At("installation.account.url"),
        Some("installation.id"),
        []
    ),
    rule!(
        "issue_comment",
        ACTION,
        Src::At("issue.url"),
        Some("comment.id"),
        ["comment.updated_at"]
    ),
    rule!(
        "issues",
        ACTION,
        REPO,
        Some("issue.number"),
        ["issue.updated_at"]
    ),
    rule!("label", ACTION, REPO, Some("label.name"), []),
    rule!(
        "marketplace_purchase",
        ACTION,
        Src::SenderParent,
        Some("marketplace_purchase.account.login"),
        ["effective_date"]
    ),
    rule!("member", ACTION, REPO, Some("member.login"), []),
    rule!(
        "membership",
        Suffix::ScopeAction,
        Src::At("team.url"),
        Some("member.login"),
        []
    ),
    rule!(
        "merge_group",
        ACTION,
        REPO,
        Some("merge_group.head_ref"),
        []
    ),
    rule!("meta", ACTION, REPO, Some("hook_id"), ["hook.updated_at"]),
    rule!(
        "milestone",
        ACTION,
        REPO,
        Some("milestone.number"),
        ["milestone.updated_at"]
    ),
    rule!(
        "organization",
        ACTION,
        Src::At("organization.url"),
        Some("membership.user.login"),
        []
    ),
    rule!(
        "org_block",
        ACTION,
        Src::At("organization.url"),
        Some("blocked_user.login"),
        []
    ),
    rule!(
        "package",
        ACTION,
        REPO,
        Some("package.id"),
        ["package.updated_at", "package.created_at"]
    ),
    rule!(
        "page_build",
        Suffix::None,
        REPO,
        Some("build.url"),
        ["pusher.updated_at"]
    ),
    rule!(
        "project_card",
        ACTION,
        REPO,
        Some("project_card.id"),
        ["project_card.updated_at"]
    ),
    rule!(
        "project_column",
        ACTION,
        REPO,
        Some("project_column.id"),
        ["project_column.updated_at"]
    ),
    rule!(
        "project",
        ACTION,
        REPO,
        Some("project.id"),
        ["project.updated_at"]
    ),
    rule!(
        "projects_v2",
        ACTION,
        REPO,
        Some("projects_v2.id"),
        ["projects_v2.updated_at"]
    ),
    rule!(
        "projects_v2_item",
        ACTION,
        REPO,
        Some("projects_v2_item.id"),
        ["projects_v2_item.updated_at"]
    ),
    rule!(
        "projects_v2_status_update",
        ACTION,
        REPO,
        Some("projects_v2_status_update.id"),
        ["projects_v2_status_update.updated_at"]
    ),
    rule!(
        "public",
        Suffix::None,
        Src::At("repository.owner.url"),
        Some("repository.name"),
        ["repository.updated_at"]
    ),
    rule!(
        "pull_request",
        ACTION,
        REPO,
        Some("number"),
        ["pull_request.updated_at"]
    ),
    rule!(
        "pull_request_review",
        ACTION,
        Src::At("pull_request.url"),
        Some("review.id"),
        ["review.submitted_at"]
    ),
    rule!(
        "pull_request_review_comment",
        ACTION,
        Src::At("pull_request.url"),
        Some("comment.id"),
        ["pull_request.updated_at"]
    ),
    rule!(
        "pull_request_review_thread",
        ACTION,
        Src::At("pull_request.url"),
        Some("pull_request.id"),
        []
    ),
    rule!("push", Suffix::None, REPO, Some("ref"), []),
    rule!(
        "registry_package",
        ACTION,
        REPO,
        Some("registry_package.html_url"),
        ["registry_package.updated_at"]
    ),
    // "release.*_at value based on action": the publication, else the creation.
    rule!(
        "release",
        ACTION,
        REPO,
        Some("release.id"),
        ["release.published_at", "release.created_at"]
    ),
    rule!(
        "repository",
        ACTION,
        Src::At("repository.owner.url"),
        Some("repository.name"),
        ["repository.updated_at"]
    ),
    rule!(
        "repository_advisory",
        ACTION,
        REPO,
        Some("repository_advisory.ghsa_id"),
        ["repository_advisory.updated_at"]
    ),
    // The adapter writes `com.github.repository_dispatch` + "action" (no `.`); the `.` is kept
    // as for every other action suffix. Likewise `repository_ruleset`.
    rule!(
        "repository_dispatch",
        ACTION,
        Src::At("repository.owner.url"),
        None,
        []
    ),
    rule!(
        "repository_import",
        Suffix::None,
        Src::At("repository.owner.url"),
        Some("repository.name"),
        ["repository.updated_at"]
    ),
    rule!(
        "repository_ruleset",
        ACTION,
        Src::At("repository.owner.url"),
        Some("repository.name"),
        ["repository.updated_at"]
    ),
    rule!(
        "repository_vulnerability_alert",
        ACTION,
        REPO,
        Some("alert.id"),
        []
    ),
    rule!(
        "secret_scanning_alert",
        ACTION,
        REPO,
        Some("alert.number"),
        ["alert.updated_at", "alert.created_at"]
    ),
    rule!(
        "secret_scanning_alert_location",
        ACTION,
        REPO,
        Some("alert.number"),
        ["alert.updated_at", "alert.created_at"]
    ),
    rule!(
        "security_advisory",
        ACTION,
        Src::Const("github.com"),
        Some("security_advisory.ghsa_id"),
        ["security_advisory.updated_at"]
    ),
    rule!("security_and_analysis", Suffix::None, REPO, None, []),
    rule!(
        "sponsorship",
        ACTION,
        REPO,
        Some("sponsorship.sponsor.login"),
        []
    ),
    rule!("star", ACTION, REPO, None, ["starred_at"]),
    // The adapter: `com.github.status.` # + "state" value ?
    rule!(
        "status",
        Suffix::At("state"),
        REPO,
        Some("sha"),
        ["updated_at"]
    ),
    rule!("team", ACTION, REPO, Some("team.id"), ["updated_at"]),
    rule!("team_add", ACTION, REPO, Some("team.id"), []),
    rule!("watch", ACTION, REPO, None, []),
    rule!(
        "workflow_dispatch",
        Suffix::None,
        REPO,
        Some("workflow"),
        []
    ),
    rule!("workflow_job", ACTION, REPO, Some("workflow_job.name"), []),
    rule!("workflow_run", ACTION, REPO, Some("workflow.name"), []),
];

/// Events the adapter does not list (GitHub adds more: `sub_issues`,
/// `personal_access_token_request`, …): type `com.github.<event>[.<action>]`, source from the
/// first of these that is present.
const FALLBACK_SOURCES: &[&str] = &["repository.url", "organization.url", "sender.url"];

/// The adapter's rule for `event`: a binary search in an index of [`RULES`] sorted by event
/// name, built at first use (the table itself stays in the adapter's order).
fn rule_for(event: &str) -> Option<&'static Rule> {
    static BY_NAME: std::sync::LazyLock<Vec<&'static Rule>> = std::sync::LazyLock::new(|| {
        let mut v: Vec<&Rule> = RULES.iter().collect();
        v.sort_by_key(|r| r.event);
        v
    });
    BY_NAME
        .binary_search_by(|r| r.event.cmp(event))
        .ok()
        .map(|i| BY_NAME[i])
}

/// `(type, source, subject, time)` for `event` with payload `doc`.
fn name(
    event: &str,
    doc: &Doc<'_>,
) -> (
    String,
    String,
    Option<String>,
    Option<sluice_core::event::Timestamp>,
) {
    let rule = rule_for(event);
    let mut ty = format!("com.github.{}", rule.and_then(|r| r.base).unwrap_or(event));
    let suffix = match rule.map(|r| &r.suffix).unwrap_or(&ACTION) {
        Suffix::None => None,
        Suffix::At(p) => doc.get(p),
        Suffix::ScopeAction => match (doc.get("scope"), doc.get("action")) {
            (Some(s), Some(a)) => Some(format!("{s}.{a}")),
            (s, a) => s.or(a),
        },
    };
    if let Some(s) = suffix {
        ty.push('.');
        ty.push_str(&s);
    }
    let source = rule
        .and_then(|r| match &r.source {
            Src::At(p) => doc.get(p),
            Src::CommentCommit => match (doc.get("comment.url"), doc.get("comment.commit_id")) {
                (Some(u), Some(c)) => Some(format!("{u}/{c}")),
                _ => None,
            },
            Src::SenderParent => doc
                .get("sender.url")
                .map(|u| u.rsplit_once('/').map(|(p, _)| p.to_owned()).unwrap_or(u)),
            Src::Const(c) => Some((*c).to_owned()),
        })
        .or_else(|| FALLBACK_SOURCES.iter().find_map(|p| doc.get(p)))
        .unwrap_or_else(|| "https://github.com".to_owned());
    let subject = rule.and_then(|r| r.subject).and_then(|p| doc.get(p));
    let time = rule.and_then(|r| doc.time(r.time));
    (ty, source, subject, time)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_of(
        event: &str,
        json: &str,
    ) -> (
        String,
        String,
        Option<String>,
        Option<sluice_core::event::Timestamp>,
    ) {
        name(event, &Doc::parse(json.as_bytes()).unwrap())
    }

    #[test]
    fn the_rule_index_finds_what_a_scan_of_the_table_finds() {
        for r in RULES {
            let scanned = RULES.iter().find(|x| x.event == r.event).unwrap();
            assert!(
                std::ptr::eq(rule_for(r.event).unwrap(), scanned),
                "{}",
                r.event
            );
        }
        for missing in ["", "pus", "pushx", "zzz", "aaa", "sub_issues"] {
            assert!(rule_for(missing).is_none(), "{missing}");
        }
    }

    #[test]
    fn names_follow_the_adapter() {
        let push =
            r#"{"ref":"refs/heads/main","repository":{"url":"https://github.com/octo/hello"}}"#;
        let (ty, source, subject, _) = name_of("push", push);
        assert_eq!(ty, "com.github.push");
        assert_eq!(source, "https://github.com/octo/hello");
        assert_eq!(subject.as_deref(), Some("refs/heads/main"));

        let pr = r#"{"action":"opened","number":42,"pull_request":{"updated_at":"2019-05-15T15:20:33Z"},"repository":{"url":"https://api.github.com/repos/octo/hello"}}"#;
        let (ty, source, subject, time) = name_of("pull_request", pr);
        assert_eq!(ty, "com.github.pull_request.opened");
        assert_eq!(source, "https://api.github.com/repos/octo/hello");
        assert_eq!(subject.as_deref(), Some("42"));
        assert_eq!(time.unwrap().as_str(), "2019-05-15T15:20:33Z");

        let issues = r#"{"action":"closed","issue":{"number":7},"repository":{"url":"u:r"}}"#;
        assert_eq!(name_of("issues", issues).0, "com.github.issues.closed");
        let ir = r#"{"action":"added","installation":{"id":3,"account":{"url":"u:a"}}}"#;
        let (ty, source, subject, _) = name_of("installation_repositories", ir);
        assert_eq!(ty, "com.github.installation_repositories.added");
        assert_eq!((source.as_str(), subject.as_deref()), ("u:a", Some("3")));
        let create = r#"{"ref":"v1","ref_type":"tag","repository":{"url":"u:r"}}"#;
        assert_eq!(name_of("create", create).0, "com.github.create.tag");
        let m = r#"{"action":"added","scope":"team","team":{"url":"u:t"},"member":{"login":"x"}}"#;
        let (ty, source, ..) = name_of("membership", m);
        assert_eq!(
            (ty.as_str(), source.as_str()),
            ("com.github.membership.team.added", "u:t")
        );
        let cc = r#"{"action":"created","comment":{"url":"https://api.github.com/c/1","commit_id":"abc","id":1}}"#;
        assert_eq!(
            name_of("commit_comment", cc).1,
            "https://api.github.com/c/1/abc"
        );
        let mp =
            r#"{"action":"purchased","sender":{"url":"https://api.github.com/users/octocat"}}"#;
        assert_eq!(
            name_of("marketplace_purchase", mp).1,
            "https://api.github.com/users"
        );
        // Listed since: the subject and time the adapter names.
        let wr = r#"{"action":"completed","workflow":{"name":"CI"},"repository":{"url":"u:r"}}"#;
        let (ty, source, subject, time) = name_of("workflow_run", wr);
        assert_eq!(ty, "com.github.workflow_run.completed");
        assert_eq!((source.as_str(), subject.as_deref()), ("u:r", Some("CI")));
        assert!(time.is_none(), "current time: set at receipt");
        let rt = r#"{"action":"resolved","pull_request":{"id":9,"url":"u:p"},"repository":{"url":"u:r"}}"#;
        let (ty, source, subject, _) = name_of("pull_request_review_thread", rt);
        assert_eq!(ty, "com.github.pull_request_review_thread.resolved");
        assert_eq!((source.as_str(), subject.as_deref()), ("u:p", Some("9")));
        let sa = r#"{"alert":{"number":5,"updated_at":null,"created_at":"2024-01-02T03:04:05Z"},"action":"created","repository":{"url":"u:r"}}"#;
        let (ty, _, subject, time) = name_of("secret_scanning_alert", sa);
        assert_eq!(
            (ty.as_str(), subject.as_deref()),
            ("com.github.secret_scanning_alert.created", Some("5"))
        );
        assert_eq!(time.unwrap().as_str(), "2024-01-02T03:04:05Z");
        let saa = r#"{"action":"x","repository":{"url":"u:r"}}"#;
        assert_eq!(
            name_of("security_and_analysis", saa).0,
            "com.github.security_and_analysis"
        );
        // Not in the adapter's table: named by the same pattern.
        let si = r#"{"action":"sub_issue_added","repository":{"url":"u:r"}}"#;
        assert_eq!(
            name_of("sub_issues", si).0,
            "com.github.sub_issues.sub_issue_added"
        );
        assert_eq!(name_of("sub_issues", si).1, "u:r");
        assert_eq!(name_of("sub_issues", "{}").1, "https://github.com");
    }
}
