//! `${VAR}`, `${VAR:-default}`, `${file:PATH}` and Argo's `${secret:NAME/KEY}` in config
//! strings.

use yaml_serde::Value;

/// Replaces `${VAR}`, `${VAR:-default}` and `${file:PATH}` in every string; `$${` is a
/// literal `${`.
pub(super) fn substitute_all(
    value: &mut Value,
    path: &mut Vec<String>,
    errors: &mut Vec<(Vec<String>, String)>,
) {
    match value {
        Value::String(s) if s.contains('$') => match substitute(s) {
            Ok(new) => *s = new,
            Err(e) => errors.push((path.clone(), e)),
        },
        Value::Sequence(seq) => {
            for (i, v) in seq.iter_mut().enumerate() {
                path.push(i.to_string());
                substitute_all(v, path, errors);
                path.pop();
            }
        }
        Value::Mapping(map) => {
            for (k, v) in map.iter_mut() {
                path.push(k.as_str().unwrap_or("?").to_owned());
                substitute_all(v, path, errors);
                path.pop();
            }
        }
        Value::Tagged(t) => substitute_all(&mut t.value, path, errors),
        _ => {}
    }
}

pub fn substitute(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix("${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| format!("unterminated `${{` in {s:?}"))?;
            out.push_str(&resolve_token(&body[..end])?);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

pub(super) fn resolve_token(token: &str) -> Result<String, String> {
    if let Some(sel) = token.strip_prefix("secret:") {
        return crate::argo::secret(sel);
    }
    if let Some(sels) = token.strip_prefix("secret-basic:") {
        return crate::argo::secret_basic(sels);
    }
    if let Some(sel) = token.strip_prefix("secret-url:") {
        return crate::argo::secret_url(sel);
    }
    if let Some(sel) = token.strip_prefix("secret-file:") {
        return crate::argo::secret_file(sel);
    }
    if let Some(path) = token.strip_prefix("file:") {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read secret file {path:?}: {e}"))?;
        return Ok(text
            .strip_suffix('\n')
            .map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t))
            .to_owned());
    }
    let (name, default) = match token.split_once(":-") {
        Some((n, d)) => (n, Some(d)),
        None => (token, None),
    };
    match (std::env::var(name), default) {
        (Ok(v), _) => Ok(v),
        (Err(_), Some(d)) => Ok(d.to_owned()),
        (Err(_), None) => Err(format!(
            "environment variable {name} is not set (set it, or write ${{{name}:-default}})"
        )),
    }
}
