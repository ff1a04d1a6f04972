//! `transform.jq`: a jq program (the `jaq` crates) over the event's data; its first output
//! must be a JSON object, which replaces the data (Argo's gojq transform).

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{data, unwrap_valr, Compiler, Ctx, Vars};
use jaq_json::Val;

type Filter = jaq_core::Filter<data::JustLut<Val>>;

pub struct Jq {
    text: String,
    filter: Filter,
}

impl std::fmt::Debug for Jq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Jq").field(&self.text).finish()
    }
}

impl Jq {
    pub fn compile(code: &str) -> Result<Jq, String> {
        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        let funs = jaq_core::funs()
            .chain(jaq_std::funs())
            .chain(jaq_json::funs());
        let loader = Loader::new(defs);
        let arena = Arena::default();
        let modules = loader
            .load(&arena, File { code, path: () })
            .map_err(|errs| {
                format!(
                    "{code:?} does not parse ({} error(s), e.g. {:?})",
                    errs.len(),
                    errs.first().map(|e| format!("{:?}", e.1))
                )
            })?;
        let filter = Compiler::default()
            .with_funs(funs)
            .compile(modules)
            .map_err(|errs| {
                format!(
                    "{code:?} does not compile ({} error(s), e.g. {:?})",
                    errs.len(),
                    errs.first().map(|e| format!("{:?}", e.1))
                )
            })?;
        Ok(Jq {
            text: code.to_owned(),
            filter,
        })
    }

    /// The new data: the program's first output, which must be an object.
    pub fn apply(&self, data: &[u8]) -> Result<Vec<u8>, String> {
        // jaq's reader recurses per level: deeper data would overflow the worker's stack.
        if crate::json::depth(data) > crate::json::MAX_DEPTH {
            return Err(format!(
                "the event's data nests deeper than {} levels",
                crate::json::MAX_DEPTH
            ));
        }
        let input = jaq_json::read::parse_single(data)
            .map_err(|e| format!("the event's data is not JSON: {e}"))?;
        let ctx = Ctx::<data::JustLut<Val>>::new(&self.filter.lut, Vars::new([]));
        let mut out = self.filter.id.run((ctx, input)).map(unwrap_valr);
        match out.next() {
            None => Err(format!("jq {:?} gave no output", self.text)),
            Some(Err(e)) => Err(format!("jq {:?}: {e:?}", self.text)),
            Some(Ok(v)) => {
                if !matches!(v, Val::Obj(_)) {
                    return Err(format!("jq {:?} gave {v}, not an object", self.text));
                }
                Ok(v.to_string().into_bytes())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // pkg/sensors/dependencies/transform_test.go :: TestApplyJQTransform
    #[test]
    fn jq_replaces_the_data_with_an_object() {
        let argo = Jq::compile(".a += 1 | .b *= 2").unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&argo.apply(br#"{"a":1,"b":"2"}"#).unwrap()).unwrap();
        assert_eq!(v, serde_json::json!({"a": 2, "b": "22"}));
        let jq = Jq::compile(".a |= \"bar\"").unwrap();
        let out = jq.apply(br#"{"a": "foo", "b": 1}"#).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v, serde_json::json!({"a": "bar", "b": 1}));
        let pick = Jq::compile("{ref, size}").unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&pick.apply(br#"{"ref":"main","size":3,"x":1}"#).unwrap())
                .unwrap();
        assert_eq!(v, serde_json::json!({"ref": "main", "size": 3}));
        assert!(Jq::compile(".a")
            .unwrap()
            .apply(br#"{"a": 1}"#)
            .unwrap_err()
            .contains("not an object"));
        assert!(Jq::compile(".[").is_err());
        assert!(jq.apply(b"not json").is_err());
    }

    #[test]
    fn data_nested_too_deep_for_the_reader_is_refused_not_read() {
        // jaq's reader recurses per level: 100 000 levels overflowed a 2 MiB stack.
        let n = 100_000;
        let deep = format!(r#"{{"a":{}{}}}"#, "[".repeat(n), "]".repeat(n));
        let jq = Jq::compile("{b: 1}").unwrap();
        let e = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || jq.apply(deep.as_bytes()))
            .unwrap()
            .join()
            .unwrap()
            .unwrap_err();
        assert!(e.contains("nests deeper than 512 levels"), "{e}");
        // At the limit, a program that walks every level runs within a worker's stack.
        let ok = format!(r#"{{"a":{}{}}}"#, "[".repeat(510), "]".repeat(510));
        let out = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let walk = Jq::compile("{n: [..] | length}")
                    .unwrap()
                    .apply(ok.as_bytes());
                let plain = Jq::compile("{b: 1}").unwrap().apply(ok.as_bytes());
                (walk, plain)
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(
            out.0.unwrap(),
            br#"{"n":511}"#,
            "the object and its 510 arrays"
        );
        assert!(out.1.is_ok());
    }
}
