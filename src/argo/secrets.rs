//! Argo's `secretKeySelector`s (`${secret:NAME/KEY}` and `${secret-file:NAME/KEY}` in the
//! native config the manifests become), looked up in this order:
//! 1. the file `<secrets dir>/<NAME>/<KEY>`, as Argo mounts secrets (`--secrets-dir`, env
//!    `SLUICE_SECRETS_DIR`, default `/argo-events/secrets`);
//! 2. the environment variable `SLUICE_SECRET_<NAME>_<KEY>` (upper case, every character
//!    that is not a letter or digit as `_`).

use std::path::PathBuf;

/// The directory Argo mounts secrets under.
pub const DEFAULT_SECRETS_DIR: &str = "/argo-events/secrets";

fn dir() -> PathBuf {
    std::env::var_os("SLUICE_SECRETS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SECRETS_DIR))
}

fn split(sel: &str) -> Result<(&str, &str), String> {
    sel.split_once('/')
        .filter(|(n, k)| !n.is_empty() && !k.is_empty() && !k.contains('/') && !n.contains(".."))
        .ok_or_else(|| format!("`{sel}` is not a secret selector NAME/KEY"))
}

/// The environment variable that may hold secret `name`'s `key`.
pub fn env_name(name: &str, key: &str) -> String {
    let up = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!("SLUICE_SECRET_{}_{}", up(name), up(key))
}

/// The value of secret `NAME/KEY` (one trailing newline removed from a file).
pub fn secret(sel: &str) -> Result<String, String> {
    let (name, key) = split(sel)?;
    let file = dir().join(name).join(key);
    match std::fs::read_to_string(&file) {
        Ok(text) => {
            return Ok(text
                .strip_suffix('\n')
                .map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t))
                .to_owned())
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!(
                "secret {name} key {key}: cannot read {}: {e}",
                file.display()
            ))
        }
        Err(_) => {}
    }
    let var = env_name(name, key);
    if let Ok(v) = std::env::var(&var) {
        return Ok(v);
    }
    Err(format!(
        "secret {name} key {key} not found: looked for the file {} (set --secrets-dir) and the \
         environment variable {var}",
        file.display()
    ))
}

/// The value of secret `NAME/KEY`, percent-encoded for a URL's user information (every
/// character but letters, digits and `-._~`).
pub fn secret_url(sel: &str) -> Result<String, String> {
    const USERINFO: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    secret(sel).map(|v| percent_encoding::utf8_percent_encode(&v, USERINFO).to_string())
}

/// An HTTP basic `Authorization` value from two secrets, `USER_NAME/USER_KEY,PASS_NAME/PASS_KEY`:
/// `Basic base64(user:password)`.
pub fn secret_basic(sels: &str) -> Result<String, String> {
    use base64::Engine;
    let (u, p) = sels
        .split_once(',')
        .ok_or_else(|| format!("`{sels}` is not two secret selectors NAME/KEY,NAME/KEY"))?;
    let creds = format!("{}:{}", secret(u)?, secret(p)?);
    Ok(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(creds)
    ))
}

/// The path of secret `NAME/KEY`'s file (for options that read a file: certificates, keys).
pub fn secret_file(sel: &str) -> Result<String, String> {
    let (name, key) = split(sel)?;
    let file = dir().join(name).join(key);
    if file.is_file() {
        return Ok(file.display().to_string());
    }
    Err(format!(
        "secret {name} key {key} not found: this option needs it as a file, looked for {} (set \
         --secrets-dir)",
        file.display()
    ))
}
