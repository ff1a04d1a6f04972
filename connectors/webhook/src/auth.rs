//! Bearer and basic auth with constant-time comparison and several secrets at once (rotation).

use base64::Engine as _;
use http::HeaderMap;
use serde::Deserialize;
use subtle::ConstantTimeEq;

/// `auth: { bearer: [..] }` or `auth: { basic: { username, password } }` (or a list of them).
/// Secrets come from `${ENV}` or `${file:/path}` in the config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Accepted bearer tokens; any one matches.
    #[serde(default)]
    pub bearer: Vec<String>,
    /// Accepted basic credentials; any one matches.
    #[serde(default, deserialize_with = "one_or_many")]
    pub basic: Vec<BasicCredentials>,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicCredentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for BasicCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicCredentials")
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<BasicCredentials>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(BasicCredentials),
        Many(Vec<BasicCredentials>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(c) => vec![c],
        OneOrMany::Many(v) => v,
    })
}

impl AuthConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.bearer.is_empty() && self.basic.is_empty() {
            return Err("auth: give `bearer` tokens or `basic` credentials".into());
        }
        if self.bearer.iter().any(String::is_empty) {
            return Err(
                "auth.bearer: a token is empty (is its environment variable or file empty?)".into(),
            );
        }
        if self
            .basic
            .iter()
            .any(|c| c.username.is_empty() || c.password.is_empty())
        {
            return Err("auth.basic: username and password must not be empty".into());
        }
        Ok(())
    }
}

/// The checker built from [`AuthConfig`].
pub struct Auth {
    bearer: Vec<Vec<u8>>,
    /// `username:password` as sent in the basic scheme (before base64).
    basic: Vec<Vec<u8>>,
    pub challenge: http::HeaderValue,
}

fn ct_any(candidates: &[Vec<u8>], given: &[u8]) -> bool {
    // Compare against every candidate, so timing does not reveal which one (or none) matched.
    let mut ok = subtle::Choice::from(0u8);
    for c in candidates {
        ok |= c.as_slice().ct_eq(given);
    }
    ok.into()
}

impl Auth {
    pub fn new(cfg: &AuthConfig) -> Auth {
        let challenge = if cfg.bearer.is_empty() {
            "Basic realm=\"sluice\", charset=\"UTF-8\""
        } else {
            "Bearer realm=\"sluice\""
        };
        Auth {
            bearer: cfg.bearer.iter().map(|t| t.as_bytes().to_vec()).collect(),
            basic: cfg
                .basic
                .iter()
                .map(|c| format!("{}:{}", c.username, c.password).into_bytes())
                .collect(),
            challenge: http::HeaderValue::from_static(challenge),
        }
    }

    /// Ok, or the reason for a 401 (which never includes the presented secret).
    pub fn check(&self, headers: &HeaderMap) -> Result<(), &'static str> {
        let Some(value) = headers.get(http::header::AUTHORIZATION) else {
            return Err("missing Authorization header");
        };
        let value = value.as_bytes();
        let (scheme, rest) = match value.iter().position(|b| *b == b' ') {
            Some(i) => (&value[..i], value[i + 1..].trim_ascii()),
            None => return Err("malformed Authorization header"),
        };
        if scheme.eq_ignore_ascii_case(b"bearer") && !self.bearer.is_empty() {
            return if ct_any(&self.bearer, rest) {
                Ok(())
            } else {
                Err("invalid bearer token")
            };
        }
        if scheme.eq_ignore_ascii_case(b"basic") && !self.basic.is_empty() {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(rest)
                .map_err(|_| "malformed basic credentials")?;
            return if ct_any(&self.basic, &decoded) {
                Ok(())
            } else {
                Err("invalid credentials")
            };
        }
        Err("unsupported Authorization scheme")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, v.parse().unwrap());
        h
    }

    #[test]
    fn bearer_rotation() {
        let a = Auth::new(&AuthConfig {
            bearer: vec!["old".into(), "new".into()],
            basic: vec![],
        });
        assert!(a.check(&headers("Bearer old")).is_ok());
        assert!(a.check(&headers("bearer new")).is_ok());
        assert!(a.check(&headers("Bearer nope")).is_err());
        assert!(a.check(&headers("Basic b2xkOm9sZA==")).is_err());
        assert!(a.check(&HeaderMap::new()).is_err());
    }

    #[test]
    fn basic() {
        let a = Auth::new(&AuthConfig {
            bearer: vec![],
            basic: vec![BasicCredentials {
                username: "u".into(),
                password: "p:w".into(),
            }],
        });
        let ok = base64::engine::general_purpose::STANDARD.encode("u:p:w");
        assert!(a.check(&headers(&format!("Basic {ok}"))).is_ok());
        assert!(a.check(&headers("Basic dTp4")).is_err());
        assert_eq!(a.challenge, "Basic realm=\"sluice\", charset=\"UTF-8\"");
    }
}
