//! A dependency's filters, with Argo's rules (`../shared/reference/argo-events.md` §5.3):
//! families `exprs`, `data`, `context`, `time` (and `script`, not yet), evaluated against the
//! event after its transform; `filtersLogicalOperator: and` (default) needs every defined family
//! to pass and fails on any error, `or` needs one defined family to pass and only logs errors.

use chrono::{DateTime, FixedOffset, NaiveTime, TimeZone, Utc};
use regex::Regex;
use serde::Deserialize;
use sluice_core::Event;

use crate::expr::Expr;
use crate::json::{Doc, Found};
use crate::script::Script;
use sluice_core::params::tmpl::Tmpl;

/// `and` or `or`, lower case (Argo refuses other spellings too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Logic {
    #[default]
    And,
    Or,
}

/// `bool`, `number` or `string`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JsonType {
    Bool,
    Number,
    String,
}

/// One `filters.data` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataFilterConfig {
    /// gjson path into the event's data (`body.action`, `header.X-Foo.0`).
    pub path: String,
    #[serde(rename = "type")]
    pub ty: JsonType,
    /// Any one that matches passes. Strings are regular expressions, unanchored.
    #[serde(default)]
    pub value: Vec<String>,
    /// `=` (default), `!=`, `<`, `<=`, `>`, `>=` (numbers; strings only `=` and `!=`).
    #[serde(default)]
    pub comparator: Option<String>,
    /// A Go template applied to the value at `path` (as `.Input`) before comparing.
    #[serde(default)]
    pub template: Option<String>,
}

/// One `filters.exprs` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExprFilterConfig {
    /// A govaluate expression (`a == "b" || c > 10`, `name =~ "^pr-"`).
    pub expr: String,
    /// Variables of the expression, each bound to a gjson path into the event's data.
    #[serde(default)]
    pub fields: Vec<FieldConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldConfig {
    pub name: String,
    pub path: String,
}

/// `filters.context`: every attribute given must equal the event's exactly.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextFilterConfig {
    #[serde(rename = "type")]
    pub ty: Option<String>,
    pub subject: Option<String>,
    pub source: Option<String>,
    pub datacontenttype: Option<String>,
}

/// `filters.time`: the event's `time` in `[start, stop)` of its day in `timezone` (UTC by
/// default); `stop` before `start` means the window wraps midnight.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeFilterConfig {
    /// `hh:mm:ss`
    pub start: String,
    /// `hh:mm:ss`
    pub stop: String,
    /// An IANA time zone name (`Europe/Berlin`).
    #[serde(default)]
    pub timezone: Option<String>,
}

/// A dependency's `filters`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FiltersConfig {
    #[serde(default)]
    pub data: Vec<DataFilterConfig>,
    #[serde(default, rename = "dataLogicalOperator")]
    pub data_logical_operator: Logic,
    #[serde(default)]
    pub exprs: Vec<ExprFilterConfig>,
    #[serde(default, rename = "exprLogicalOperator")]
    pub expr_logical_operator: Logic,
    #[serde(default)]
    pub context: Option<ContextFilterConfig>,
    #[serde(default)]
    pub time: Option<TimeFilterConfig>,
    /// Lua (5.1): the global `event` is the data; passes when the script returns `true`.
    #[serde(default)]
    pub script: Option<String>,
}

/// The filter families, in Argo's order of evaluation.
pub const FAMILIES: [&str; 5] = ["exprs", "data", "context", "time", "script"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug)]
enum Values {
    Bool(Vec<bool>),
    Number(Vec<f64>),
    String(Vec<Regex>),
}

#[derive(Debug)]
struct DataFilter {
    path: String,
    cmp: Cmp,
    values: Values,
    template: Option<Tmpl>,
}

#[derive(Debug)]
struct TimeFilter {
    start: NaiveTime,
    stop: NaiveTime,
    tz: Option<chrono_tz::Tz>,
}

/// A dependency's compiled filters.
#[derive(Debug, Default)]
pub struct Filters {
    data: Vec<DataFilter>,
    data_logic: Logic,
    exprs: Vec<Expr>,
    expr_logic: Logic,
    context: Option<ContextFilterConfig>,
    time: Option<TimeFilter>,
    script: Option<Script>,
    logic: Logic,
}

/// Argo's `strconv.ParseBool`.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn parse_time(what: &str, s: &str) -> Result<NaiveTime, String> {
    let strict = s.len() == 8 && s.as_bytes()[2] == b':' && s.as_bytes()[5] == b':';
    strict
        .then(|| NaiveTime::parse_from_str(s, "%H:%M:%S").ok())
        .flatten()
        .ok_or_else(|| format!("{what}: {s:?} is not a time of day (hh:mm:ss)"))
}

impl Filters {
    pub fn compile(cfg: &FiltersConfig, logic: Logic) -> Result<Filters, String> {
        let mut data = Vec::new();
        for (i, f) in cfg.data.iter().enumerate() {
            let what = format!("filters.data.{i}");
            if f.value.is_empty() {
                return Err(format!("{what}.value: give at least one value"));
            }
            let cmp = match f.comparator.as_deref().unwrap_or("=") {
                "" | "=" => Cmp::Eq,
                "!=" => Cmp::Ne,
                "<" => Cmp::Lt,
                "<=" => Cmp::Le,
                ">" => Cmp::Gt,
                ">=" => Cmp::Ge,
                other => {
                    return Err(format!(
                        "{what}.comparator: `{other}` is not one of =, !=, <, <=, >, >="
                    ))
                }
            };
            let bad = |v: &str, t: &str| format!("{what}.value: {v:?} is not a {t}");
            let values = match f.ty {
                JsonType::Bool => Values::Bool(
                    f.value
                        .iter()
                        .map(|v| parse_bool(v).ok_or_else(|| bad(v, "boolean")))
                        .collect::<Result<_, _>>()?,
                ),
                JsonType::Number => Values::Number(
                    f.value
                        .iter()
                        .map(|v| v.trim().parse().map_err(|_| bad(v, "number")))
                        .collect::<Result<_, _>>()?,
                ),
                JsonType::String => {
                    if !matches!(cmp, Cmp::Eq | Cmp::Ne) {
                        return Err(format!(
                            "{what}.comparator: strings compare with `=` or `!=` only"
                        ));
                    }
                    let mut rs = Vec::new();
                    for v in &f.value {
                        rs.push(Regex::new(v).map_err(|e| {
                            format!("{what}.value: {v:?} is not a regular expression: {e}")
                        })?);
                    }
                    Values::String(rs)
                }
            };
            let template = f
                .template
                .as_deref()
                .map(|t| Tmpl::parse(t).map_err(|e| format!("{what}.template: {e}")))
                .transpose()?;
            data.push(DataFilter {
                path: f.path.clone(),
                cmp,
                values,
                template,
            });
        }
        let mut exprs = Vec::new();
        for (i, e) in cfg.exprs.iter().enumerate() {
            let fields: Vec<(String, String)> = e
                .fields
                .iter()
                .map(|f| (f.name.clone(), f.path.clone()))
                .collect();
            exprs.push(
                Expr::compile(&e.expr, &fields).map_err(|m| format!("filters.exprs.{i}: {m}"))?,
            );
        }
        let time = match &cfg.time {
            None => None,
            Some(t) if t.start == t.stop => {
                return Err(
                    "filters.time: start and stop are the same time; the window would be empty"
                        .into(),
                )
            }
            Some(t) => Some(TimeFilter {
                start: parse_time("filters.time.start", &t.start)?,
                stop: parse_time("filters.time.stop", &t.stop)?,
                tz: t
                    .timezone
                    .as_deref()
                    .filter(|z| !z.is_empty())
                    .map(|z| {
                        z.parse::<chrono_tz::Tz>().map_err(|_| {
                            format!("filters.time.timezone: {z:?} is not an IANA time zone")
                        })
                    })
                    .transpose()?,
            }),
        };
        let script = cfg
            .script
            .as_deref()
            .filter(|s| !s.trim().is_empty())
            .map(|s| Script::compile(s).map_err(|e| format!("filters.script: {e}")))
            .transpose()?;
        Ok(Filters {
            script,
            data,
            data_logic: cfg.data_logical_operator,
            exprs,
            expr_logic: cfg.expr_logical_operator,
            context: cfg.context.clone(),
            time,
            logic,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
            && self.exprs.is_empty()
            && self.context.is_none()
            && self.time.is_none()
            && self.script.is_none()
    }

    /// Whether a filter reads the event's data (`data`, `exprs`, `script`).
    pub(crate) fn reads_data(&self) -> bool {
        !self.data.is_empty() || !self.exprs.is_empty() || self.script.is_some()
    }

    /// The gjson paths into the data that the data and expr filters read.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &str> {
        self.data
            .iter()
            .map(|f| f.path.as_str())
            .chain(self.exprs.iter().flat_map(Expr::paths))
    }

    /// Whether the event passes; `Err` carries the family and the reason for a failure that is
    /// an error (a missing path, data that is not JSON), which fails the event under `and`.
    /// `text` is the event's data checked as JSON (`crate::run::data_text`), done once for all
    /// the dependencies that read the same event.
    pub fn eval(
        &self,
        cel_root: &cel::Context<'_, '_>,
        e: &Event,
        text: &Result<Option<Doc<'_>>, String>,
    ) -> Verdict {
        let mut errors = Vec::new();
        // Argo: an event without data passes the data, exprs and script filters.
        let data = || text.as_ref().map(Option::as_ref).map_err(Clone::clone);
        // A path read by several filters (a data filter and an expr field) is looked up once.
        let memo = Lookups::default();
        // Whether each family is defined, in `FAMILIES` order (Argo's): dispatched by
        // position, not by comparing the names.
        let defined = [
            !self.exprs.is_empty(),
            !self.data.is_empty(),
            self.context.is_some(),
            self.time.is_some(),
            self.script.is_some(),
        ];
        let mut first_fail = None;
        let mut any_pass = false;
        for (i, family) in FAMILIES.into_iter().enumerate() {
            if !defined[i] {
                continue;
            }
            let r = match i {
                0 => data().and_then(|d| match d {
                    None => Ok(true),
                    Some(d) => combine(
                        self.expr_logic,
                        self.exprs.iter().map(|x| x.eval(cel_root, &memo.on(d))),
                    ),
                }),
                1 => data().and_then(|d| match d {
                    None => Ok(true),
                    Some(d) => combine(
                        self.data_logic,
                        self.data.iter().map(|f| f.eval(&memo.on(d))),
                    ),
                }),
                2 => Ok(self.context.as_ref().is_none_or(|c| context_matches(c, e))),
                3 => self.time.as_ref().map_or(Ok(true), |t| t.eval(e)),
                // 4: `script` (the test `families_are_argos_in_argos_order` holds the order).
                _ => data().and_then(|d| match (d, &self.script) {
                    (Some(d), Some(s)) => s.filter(d.text.as_bytes()),
                    _ => Ok(true),
                }),
            };
            match r {
                Ok(true) => any_pass = true,
                Ok(false) => {
                    first_fail.get_or_insert(family);
                }
                Err(m) => {
                    first_fail.get_or_insert(family);
                    errors.push(format!("{family}: {m}"));
                }
            }
        }
        let pass = match self.logic {
            Logic::And => first_fail.is_none(),
            Logic::Or => any_pass || self.is_empty(),
        };
        Verdict {
            pass,
            family: if pass { None } else { first_fail },
            errors,
        }
    }
}

/// What the filters said of one event.
#[derive(Debug, PartialEq)]
pub struct Verdict {
    pub pass: bool,
    /// The first family that did not pass, when the event is filtered out.
    pub family: Option<&'static str>,
    /// Errors met (a missing path, data that is not JSON).
    pub errors: Vec<String>,
}

/// Combines the results of one family's entries: `and` stops at the first error or false,
/// `or` passes on the first true and reports an error only when nothing passed.
fn combine(
    logic: Logic,
    results: impl Iterator<Item = Result<bool, String>>,
) -> Result<bool, String> {
    let mut err = None;
    for r in results {
        match (logic, r) {
            (Logic::And, Ok(true)) => {}
            (Logic::And, Ok(false)) => return Ok(false),
            (Logic::And, Err(e)) => return Err(e),
            (Logic::Or, Ok(true)) => return Ok(true),
            (Logic::Or, Ok(false)) => {}
            (Logic::Or, Err(e)) => {
                err.get_or_insert(e);
            }
        }
    }
    match (logic, err) {
        (Logic::And, _) => Ok(true),
        (Logic::Or, Some(e)) => Err(e),
        (Logic::Or, None) => Ok(false),
    }
}

fn context_matches(c: &ContextFilterConfig, e: &Event) -> bool {
    let eq = |want: &Option<String>, have: Option<&str>| match want.as_deref() {
        None | Some("") => true,
        Some(w) => have == Some(w),
    };
    eq(&c.ty, Some(&e.ty))
        && eq(&c.source, Some(&e.source))
        && eq(&c.subject, e.subject.as_deref())
        && eq(&c.datacontenttype, e.datacontenttype.as_deref())
}

/// gjson lookups into one event's data, each path once.
#[derive(Default)]
pub(crate) struct Lookups<'a> {
    done: std::cell::RefCell<smallvec::SmallVec<[(&'a str, Found<'a>); 4]>>,
}

impl<'a> Lookups<'a> {
    /// The lookups into `data` (the same data for every call on one memo).
    pub(crate) fn on<'m>(&'m self, data: &'m Doc<'a>) -> Lookup<'m, 'a> {
        Lookup { memo: self, data }
    }
}

/// [`Lookups`] bound to the data.
pub(crate) struct Lookup<'m, 'a> {
    memo: &'m Lookups<'a>,
    data: &'m Doc<'a>,
}

impl<'a> Lookup<'_, 'a> {
    /// `f(gjson::get(data, path))`, each path looked up once. `f` must not look up again.
    pub(crate) fn with<R>(&self, path: &'a str, f: impl FnOnce(&Found<'a>) -> R) -> R {
        let mut done = self.memo.done.borrow_mut();
        let i = match done.iter().position(|(p, _)| *p == path) {
            Some(i) => i,
            None => {
                done.push((path, self.data.find(path)));
                done.len() - 1
            }
        };
        f(&done[i].1)
    }
}

impl DataFilter {
    fn eval<'a>(&'a self, data: &Lookup<'_, 'a>) -> Result<bool, String> {
        data.with(&self.path, |res| self.check(res))
    }

    fn check(&self, res: &Found<'_>) -> Result<bool, String> {
        if !res.exists() {
            return Err(format!(
                "path {:?} does not exist in the event's data",
                self.path
            ));
        }
        let templated;
        let text: &str = match &self.template {
            Some(t) => {
                templated = t.render_input(&serde_json::Value::String(res.str().to_owned()))?;
                if templated.is_empty() || templated == "<no value>" {
                    return Err(format!(
                        "the template of {:?} gave an empty value",
                        self.path
                    ));
                }
                &templated
            }
            None => res.str(),
        };
        Ok(match &self.values {
            Values::Bool(vs) => {
                let have = match &self.template {
                    Some(_) => parse_bool(text).unwrap_or(false),
                    None => res.bool(),
                };
                vs.contains(&have)
            }
            Values::Number(vs) => {
                let Ok(have) = text.trim().parse::<f64>() else {
                    return Err(format!("{:?}: {text:?} is not a number", self.path));
                };
                vs.iter().any(|&want| match self.cmp {
                    Cmp::Eq => have == want,
                    Cmp::Ne => have != want,
                    Cmp::Lt => have < want,
                    Cmp::Le => have <= want,
                    Cmp::Gt => have > want,
                    Cmp::Ge => have >= want,
                })
            }
            Values::String(rs) => match self.cmp {
                Cmp::Ne => rs.iter().any(|r| !r.is_match(text)),
                _ => rs.iter().any(|r| r.is_match(text)),
            },
        })
    }
}

impl TimeFilter {
    fn eval(&self, e: &Event) -> Result<bool, String> {
        let at: DateTime<FixedOffset> = match &e.time {
            Some(t) => t.instant(),
            None => Utc::now().fixed_offset(),
        };
        let t = match self.tz {
            Some(tz) => tz.from_utc_datetime(&at.naive_utc()).time(),
            None => at.naive_utc().time(),
        };
        Ok(if self.start <= self.stop {
            self.start <= t && t < self.stop
        } else {
            t >= self.start || t < self.stop
        })
    }
}
