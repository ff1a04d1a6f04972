//! When to try again: exponential backoff with jitter, `Retry-After`, and the bounds.

use std::time::{Duration, SystemTime};

use serde::Deserialize;
use sluice_core::units::HumanDuration as Human;

/// `retry: { max_attempts, initial_backoff, max_backoff, max_elapsed }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts in all, the first one included. 1 means no retry. Default 8.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// The wait before the second attempt; it doubles with each attempt. Default 200ms.
    #[serde(default = "default_initial")]
    pub initial_backoff: Human,
    /// The longest wait between two attempts, and the longest `Retry-After` honoured: a target
    /// asking for more is given up on at once. Default 30s.
    #[serde(default = "default_max")]
    pub max_backoff: Human,
    /// Give up once this much time has passed since the first attempt, whatever
    /// `max_attempts` says. Unset by default.
    #[serde(default)]
    pub max_elapsed: Option<Human>,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: default_attempts(),
            initial_backoff: default_initial(),
            max_backoff: default_max(),
            max_elapsed: None,
        }
    }
}

fn default_attempts() -> u32 {
    8
}
fn default_initial() -> Human {
    Human::from_millis(200)
}
fn default_max() -> Human {
    Human::from_secs(30)
}

impl RetryConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("retry.max_attempts: must be at least 1".into());
        }
        if self.initial_backoff.get() > self.max_backoff.get() {
            return Err(format!(
                "retry.initial_backoff ({}) is above retry.max_backoff ({})",
                self.initial_backoff, self.max_backoff
            ));
        }
        Ok(())
    }

    /// The wait after failed attempt number `attempt` (1-based): `initial × 2^(attempt-1)`,
    /// capped at `max_backoff`, with "equal jitter" (a random point in its upper half), so
    /// many events failing together do not retry in lockstep.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let base = self
            .initial_backoff
            .get()
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
            .min(self.max_backoff.get());
        let half = base / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

/// What to do after a failed attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Wait this long, then try again.
    RetryAfter(Duration),
    /// Stop; the reason says why.
    GiveUp(String),
}

/// Decides the next step after attempt number `attempt` failed transiently. `asked` is the
/// target's `Retry-After`, `elapsed` the time since the first attempt.
pub fn next(cfg: &RetryConfig, attempt: u32, asked: Option<Duration>, elapsed: Duration) -> Next {
    if attempt >= cfg.max_attempts {
        return Next::GiveUp(format!(
            "gave up after {attempt} attempts (retry.max_attempts)"
        ));
    }
    let backoff = cfg.backoff(attempt);
    let wait = match asked {
        Some(asked) if asked > cfg.max_backoff.get() => {
            return Next::GiveUp(format!(
                "the target asked to retry after {}s, beyond retry.max_backoff ({})",
                asked.as_secs(),
                cfg.max_backoff
            ))
        }
        Some(asked) => asked.max(backoff),
        None => backoff,
    };
    if let Some(max) = cfg.max_elapsed {
        if elapsed + wait > max.get() {
            return Next::GiveUp(format!(
                "gave up after {attempt} attempts: the next would start after retry.max_elapsed ({max})"
            ));
        }
    }
    Next::RetryAfter(wait)
}

/// Reads a `Retry-After` value: delay-seconds or an HTTP date (RFC 9110 §10.2.3).
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(attempts: u32, initial_ms: u64, max_ms: u64) -> RetryConfig {
        RetryConfig {
            max_attempts: attempts,
            initial_backoff: Human::from_millis(initial_ms),
            max_backoff: Human::from_millis(max_ms),
            max_elapsed: None,
        }
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let c = cfg(10, 100, 1000);
        for _ in 0..200 {
            let b1 = c.backoff(1);
            assert!(b1 >= Duration::from_millis(50) && b1 <= Duration::from_millis(100));
            let b3 = c.backoff(3);
            assert!(b3 >= Duration::from_millis(200) && b3 <= Duration::from_millis(400));
            let b9 = c.backoff(9);
            assert!(b9 >= Duration::from_millis(500) && b9 <= Duration::from_millis(1000));
        }
        // Jitter: not every value is the same.
        let set: std::collections::HashSet<_> = (0..50).map(|_| c.backoff(4)).collect();
        assert!(set.len() > 10);
        // Huge attempt numbers do not overflow.
        assert!(c.backoff(u32::MAX) <= Duration::from_millis(1000));
    }

    #[test]
    fn attempts_and_elapsed_bound_the_retries() {
        let mut c = cfg(3, 100, 1000);
        assert!(matches!(
            next(&c, 1, None, Duration::ZERO),
            Next::RetryAfter(_)
        ));
        assert!(matches!(
            next(&c, 2, None, Duration::ZERO),
            Next::RetryAfter(_)
        ));
        match next(&c, 3, None, Duration::ZERO) {
            Next::GiveUp(r) => assert!(r.contains("3 attempts"), "{r}"),
            n => panic!("{n:?}"),
        }
        c.max_elapsed = Some(Human::from_millis(500));
        match next(&c, 1, None, Duration::from_millis(480)) {
            Next::GiveUp(r) => assert!(r.contains("max_elapsed"), "{r}"),
            n => panic!("{n:?}"),
        }
    }

    #[test]
    fn retry_after_is_honoured_within_max_backoff() {
        let c = cfg(5, 100, 5000);
        assert_eq!(
            next(&c, 1, Some(Duration::from_secs(3)), Duration::ZERO),
            Next::RetryAfter(Duration::from_secs(3))
        );
        match next(&c, 1, Some(Duration::from_secs(60)), Duration::ZERO) {
            Next::GiveUp(r) => assert!(r.contains("retry after 60s"), "{r}"),
            n => panic!("{n:?}"),
        }
        // A shorter Retry-After than the backoff does not make us retry sooner.
        let c = cfg(5, 2000, 5000);
        match next(&c, 1, Some(Duration::ZERO), Duration::ZERO) {
            Next::RetryAfter(d) => assert!(d >= Duration::from_secs(1)),
            n => panic!("{n:?}"),
        }
    }

    #[test]
    fn retry_after_forms() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        assert_eq!(
            parse_retry_after(b"120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(b" 7 ", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after(b"Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        // A date in the past means now.
        assert_eq!(
            parse_retry_after(b"Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after(b"soon", now), None);
        assert_eq!(parse_retry_after(b"-1", now), None);
    }

    #[test]
    fn validation() {
        assert!(cfg(0, 1, 2).validate().is_err());
        assert!(cfg(1, 3, 2).validate().is_err());
        assert!(cfg(1, 1, 2).validate().is_ok());
    }
}
