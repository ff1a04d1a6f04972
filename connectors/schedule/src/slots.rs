//! Which instants a schedule names: cron (in a time zone) or an aligned interval, minus
//! exclusion dates, never twice for one local wall-clock time.

use std::collections::HashSet;

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// Give up looking for the next slot after this many candidates (e.g. every date excluded).
const MAX_CANDIDATES: usize = 1_000_000;

pub enum Spec {
    Cron(Box<Cron>),
    Interval {
        every: chrono::Duration,
        anchor: DateTime<Utc>,
    },
}

impl Spec {
    /// 5 fields (minute first) or 6 (seconds first); descriptors such as `@daily`.
    pub fn cron(expr: &str) -> Result<Spec, String> {
        let parser = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build();
        parser
            .parse(expr)
            .map(|c| Spec::Cron(Box::new(c)))
            .map_err(|e| format!("cron {expr:?}: {e}"))
    }

    pub fn interval(every: std::time::Duration, anchor: DateTime<Utc>) -> Result<Spec, String> {
        if every < std::time::Duration::from_millis(100) {
            return Err("interval must be at least 100ms".into());
        }
        let every = chrono::Duration::from_std(every).map_err(|e| format!("interval: {e}"))?;
        Ok(Spec::Interval { every, anchor })
    }
}

/// Parses `2026-12-25` or Argo's `EXDATE:20261225T000000Z[,...]` into dates.
pub fn parse_exclusion(s: &str) -> Result<Vec<NaiveDate>, String> {
    let s = s.trim();
    if let Some(list) = s.strip_prefix("EXDATE:") {
        return list
            .split(',')
            .map(|d| {
                let d = d.trim();
                NaiveDateTime::parse_from_str(d.trim_end_matches('Z'), "%Y%m%dT%H%M%S")
                    .map(|dt| dt.date())
                    .map_err(|_| format!("exclusion date {d:?}: expected yyyyMMddTHHmmssZ"))
            })
            .collect();
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .map(|d| vec![d])
        .map_err(|_| {
            format!("exclusion date {s:?}: expected 2026-12-25 or EXDATE:20261225T000000Z")
        })
}

pub struct Slots {
    spec: Spec,
    tz: Tz,
    excluded: HashSet<NaiveDate>,
}

impl Slots {
    pub fn new(spec: Spec, tz: Tz, excluded: Vec<NaiveDate>) -> Self {
        Slots {
            spec,
            tz,
            excluded: excluded.into_iter().collect(),
        }
    }

    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// The next instant strictly after `t` that the spec names (before exclusions).
    fn raw_next(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.spec {
            Spec::Interval { every, anchor } => {
                let step = every.num_milliseconds();
                let since = (t - *anchor).num_milliseconds();
                let k = since.div_euclid(step) + 1;
                Some(*anchor + chrono::Duration::milliseconds(k * step))
            }
            Spec::Cron(c) => c
                .find_next_occurrence(&t.with_timezone(&self.tz), false)
                .ok()
                .map(|d| d.to_utc()),
        }
    }

    /// Whether the local wall-clock time of `t` names one instant only.
    fn unambiguous(&self, t: DateTime<Utc>) -> bool {
        use chrono::TimeZone;
        matches!(
            self.tz
                .from_local_datetime(&t.with_timezone(&self.tz).naive_local()),
            chrono::LocalResult::Single(_)
        )
    }

    /// The first instant (to the second) after `t` whose local time is unambiguous again,
    /// for a `t` inside a repeated hour.
    fn repeat_end(&self, t: DateTime<Utc>) -> DateTime<Utc> {
        let (mut lo, mut hi) = (t, t + chrono::Duration::hours(1));
        for _ in 0..48 {
            if self.unambiguous(hi) {
                break;
            }
            lo = hi;
            hi += chrono::Duration::hours(1);
        }
        while hi - lo > chrono::Duration::seconds(1) {
            let mid = lo + (hi - lo) / 2;
            if self.unambiguous(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }

    /// Slots strictly after `t`, in order.
    pub fn after(&self, t: DateTime<Utc>) -> SlotIter<'_> {
        SlotIter {
            slots: self,
            cursor: t,
            last_local: match self.spec {
                Spec::Cron(_) => Some(t.with_timezone(&self.tz).naive_local()),
                Spec::Interval { .. } => None,
            },
        }
    }

    /// Slots in `(from, to]`, counting at most `cap`.
    pub fn count_between(&self, from: DateTime<Utc>, to: DateTime<Utc>, cap: u64) -> u64 {
        let mut n = 0;
        for s in self.after(from) {
            if s > to || n >= cap {
                break;
            }
            n += 1;
        }
        n
    }
}

pub struct SlotIter<'a> {
    slots: &'a Slots,
    cursor: DateTime<Utc>,
    /// Cron only: the local wall-clock time of the last slot. A slot whose local time is not
    /// later (the repeated hour when clocks go back) is skipped, so it never fires twice.
    last_local: Option<NaiveDateTime>,
}

impl Iterator for SlotIter<'_> {
    type Item = DateTime<Utc>;

    fn next(&mut self) -> Option<DateTime<Utc>> {
        for _ in 0..MAX_CANDIDATES {
            let mut s = self.slots.raw_next(self.cursor)?;
            if s <= self.cursor {
                // Inside the repeated hour when clocks go back, croner resolves the ambiguous
                // local time it found to its first (earlier) occurrence, before the cursor.
                // Every local time of the repeat has passed once already, so no slot lies in it:
                // go on from where the repeat ends.
                s = self
                    .slots
                    .raw_next(self.slots.repeat_end(self.cursor) - chrono::Duration::seconds(1))?;
                if s <= self.cursor {
                    return None;
                }
            }
            self.cursor = s;
            let local = s.with_timezone(&self.slots.tz).naive_local();
            if let Some(last) = self.last_local {
                if local <= last {
                    continue;
                }
                self.last_local = Some(local);
            }
            if self.slots.excluded.contains(&local.date()) {
                continue;
            }
            return Some(s);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn cron(expr: &str, tz: &str) -> Slots {
        Slots::new(Spec::cron(expr).unwrap(), tz.parse().unwrap(), vec![])
    }

    fn take(s: &Slots, from: &str, n: usize) -> Vec<String> {
        s.after(utc(from))
            .take(n)
            .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .collect()
    }

    #[test]
    fn six_field_cron_in_a_time_zone() {
        let s = cron("0 30 2 * * *", "Europe/Berlin");
        assert_eq!(
            take(&s, "2026-11-30T00:00:00Z", 2),
            ["2026-11-30T01:30:00Z", "2026-12-01T01:30:00Z"]
        );
    }

    #[test]
    fn five_field_cron_and_descriptors() {
        let s = cron("*/15 * * * *", "UTC");
        assert_eq!(
            take(&s, "2026-01-01T00:07:00Z", 2),
            ["2026-01-01T00:15:00Z", "2026-01-01T00:30:00Z"]
        );
        let s = cron("@hourly", "UTC");
        assert_eq!(
            take(&s, "2026-01-01T00:07:00Z", 1),
            ["2026-01-01T01:00:00Z"]
        );
        let s = cron("@daily", "America/New_York");
        assert_eq!(
            take(&s, "2026-01-01T12:00:00Z", 1),
            ["2026-01-02T05:00:00Z"]
        );
        assert!(Spec::cron("61 * * * *").is_err());
        assert!(Spec::cron("not cron").is_err());
    }

    #[test]
    fn spring_forward_skipped_hour_fires_once_at_the_first_valid_instant() {
        // 2026-03-29 02:00 CET → 03:00 CEST in Berlin: 02:30 does not exist that day. Per
        // docs/connectors/schedule.md it fires once, moved to the first valid instant (03:00
        // CEST = 01:00Z); the days around it are untouched.
        let s = cron("0 30 2 * * *", "Europe/Berlin");
        assert_eq!(
            take(&s, "2026-03-27T12:00:00Z", 4),
            [
                "2026-03-28T01:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-30T00:30:00Z",
                "2026-03-31T00:30:00Z"
            ]
        );
        // Starting inside the gap's night, just after the moved slot: the next day's 02:30.
        assert_eq!(
            take(&s, "2026-03-29T01:00:00Z", 1),
            ["2026-03-30T00:30:00Z"]
        );
        // Every 20 minutes across the gap: 01:20, 01:40 CET, then 03:00 CEST on; the
        // nonexistent 02:00-02:40 do not pile up on 03:00.
        let s = cron("0 */20 * * * *", "Europe/Berlin");
        assert_eq!(
            take(&s, "2026-03-29T00:10:00Z", 5),
            [
                "2026-03-29T00:20:00Z",
                "2026-03-29T00:40:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T01:20:00Z",
                "2026-03-29T01:40:00Z"
            ]
        );
    }

    #[test]
    fn fall_back_repeated_hour_does_not_fire_twice() {
        // 2026-10-25 03:00 CEST → 02:00 CET: 02:30 happens twice in Berlin; it fires at the
        // first (CEST) one only.
        let s = cron("0 30 2 * * *", "Europe/Berlin");
        let got = take(&s, "2026-10-24T12:00:00Z", 3);
        assert_eq!(
            got,
            [
                "2026-10-25T00:30:00Z",
                "2026-10-26T01:30:00Z",
                "2026-10-27T01:30:00Z"
            ]
        );
        // Resuming from the slot that fired (as after a restart, from the stored last slot) or
        // from inside the repeated hour: the CET 02:30 is not fired again.
        assert_eq!(
            take(&s, "2026-10-25T00:30:00Z", 1),
            ["2026-10-26T01:30:00Z"]
        );
        assert_eq!(
            take(&s, "2026-10-25T01:10:00Z", 1),
            ["2026-10-26T01:30:00Z"]
        );
        // Every 20 minutes across the repeated hour: each local time once, in order. The CET
        // repeats of 02:00, 02:20 and 02:40 (01:00Z-01:40Z) are skipped; 03:00 CET is 02:00Z.
        let s = cron("0 */20 * * * *", "Europe/Berlin");
        let got: Vec<_> = s
            .after(utc("2026-10-24T23:50:00Z"))
            .take_while(|d| *d < utc("2026-10-25T03:00:00Z"))
            .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .collect();
        assert_eq!(
            got,
            [
                "2026-10-25T00:00:00Z",
                "2026-10-25T00:20:00Z",
                "2026-10-25T00:40:00Z",
                "2026-10-25T02:00:00Z",
                "2026-10-25T02:20:00Z",
                "2026-10-25T02:40:00Z"
            ]
        );
        // Started inside the repeat (02:10 CET): nothing before it, nothing in it.
        assert_eq!(
            take(&s, "2026-10-25T01:10:00Z", 2),
            ["2026-10-25T02:00:00Z", "2026-10-25T02:20:00Z"]
        );
    }

    #[test]
    fn intervals_are_aligned_to_the_epoch_or_an_anchor() {
        let s = Slots::new(
            Spec::interval(std::time::Duration::from_secs(30), DateTime::UNIX_EPOCH).unwrap(),
            chrono_tz::UTC,
            vec![],
        );
        assert_eq!(
            take(&s, "2026-01-01T12:00:07Z", 2),
            ["2026-01-01T12:00:30Z", "2026-01-01T12:01:00Z"]
        );
        assert_eq!(
            take(&s, "2026-01-01T12:00:30Z", 1),
            ["2026-01-01T12:01:00Z"],
            "strictly after"
        );
        // Two instances started at different moments name the same slots.
        let a: Vec<_> = s.after(utc("2026-01-01T12:00:01Z")).take(4).collect();
        let b: Vec<_> = s.after(utc("2026-01-01T12:00:29Z")).take(4).collect();
        assert_eq!(a, b);
        let anchored = Slots::new(
            Spec::interval(
                std::time::Duration::from_secs(60),
                utc("2026-01-01T00:00:10Z"),
            )
            .unwrap(),
            chrono_tz::UTC,
            vec![],
        );
        assert_eq!(
            take(&anchored, "2026-01-01T12:00:00Z", 1),
            ["2026-01-01T12:00:10Z"]
        );
        assert!(Spec::interval(std::time::Duration::from_millis(1), DateTime::UNIX_EPOCH).is_err());
    }

    #[test]
    fn exclusion_dates() {
        let mut ex = parse_exclusion("2026-12-25").unwrap();
        ex.extend(parse_exclusion("EXDATE:20261226T000000Z,20261228T000000Z").unwrap());
        let s = Slots::new(
            Spec::cron("0 0 9 * * *").unwrap(),
            "Europe/Berlin".parse().unwrap(),
            ex,
        );
        assert_eq!(
            take(&s, "2026-12-24T12:00:00Z", 3),
            [
                "2026-12-27T08:00:00Z",
                "2026-12-29T08:00:00Z",
                "2026-12-30T08:00:00Z"
            ]
        );
        assert!(parse_exclusion("25.12.2026").is_err());
        assert!(parse_exclusion("EXDATE:2026-12-25").is_err());
    }

    #[test]
    fn counting_is_bounded() {
        let s = Slots::new(
            Spec::interval(std::time::Duration::from_secs(1), DateTime::UNIX_EPOCH).unwrap(),
            chrono_tz::UTC,
            vec![],
        );
        assert_eq!(
            s.count_between(
                utc("2026-01-01T00:00:00Z"),
                utc("2026-01-01T00:00:10Z"),
                100
            ),
            10
        );
        assert_eq!(
            s.count_between(
                utc("2026-01-01T00:00:00Z"),
                utc("2026-01-02T00:00:00Z"),
                100
            ),
            100
        );
    }
}
