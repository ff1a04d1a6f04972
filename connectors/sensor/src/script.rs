//! Lua for `filters.script` and `transform.script` (mlua with a vendored Lua 5.1: the
//! semantics of Argo's gopher-lua). The global `event` is the event's data as a Lua table; a
//! filter script must return `true` to pass; a transform script returns the new data as a
//! table.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use mlua::{Function, HookTriggers, Lua, LuaSerdeExt, Value, VmState};

/// Instructions one evaluation may run (in steps of 1000) before it is stopped as an error:
/// a script that loops for ever must not hold the sensor.
const BUDGET_STEPS: u32 = 10_000;

pub struct Script {
    text: String,
    /// One Lua state per script; evaluations take turns (a state is not re-entrant). Each gets
    /// fresh globals (a new environment over the standard library), as Argo's new gopher-lua
    /// state per event does.
    lua: Mutex<(Lua, Function)>,
    steps: Arc<AtomicU32>,
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Script").field(&self.text).finish()
    }
}

impl Script {
    pub fn compile(code: &str) -> Result<Script, String> {
        let lua = Lua::new();
        let f = lua
            .load(code)
            .set_name("script")
            .into_function()
            .map_err(|e| format!("does not compile: {e}"))?;
        let steps = Arc::new(AtomicU32::new(0));
        let counter = steps.clone();
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(1000),
            move |_, _| {
                if counter.fetch_add(1, Ordering::Relaxed) >= BUDGET_STEPS {
                    Err(mlua::Error::runtime(
                        "the script ran out of its instruction budget (10 million)",
                    ))
                } else {
                    Ok(VmState::Continue)
                }
            },
        )
        .map_err(|e| e.to_string())?;
        Ok(Script {
            text: code.to_owned(),
            lua: Mutex::new((lua, f)),
            steps,
        })
    }

    fn run<T>(
        &self,
        data: &[u8],
        then: impl FnOnce(&Lua, Value) -> Result<T, String>,
    ) -> Result<T, String> {
        let json: serde_json::Value = serde_json::from_slice(data)
            .map_err(|e| format!("the event's data is not JSON: {e}"))?;
        if !json.is_object() {
            return Err("the event's data is not a JSON object".into());
        }
        let guard = self.lua.lock().unwrap_or_else(|p| p.into_inner());
        let (lua, f) = &*guard;
        let err = |e: mlua::Error| e.to_string();
        let table = lua.to_value(&json).map_err(err)?;
        let env = lua.create_table().map_err(err)?;
        let meta = lua.create_table().map_err(err)?;
        meta.set("__index", lua.globals()).map_err(err)?;
        env.set_metatable(Some(meta)).map_err(err)?;
        env.set("event", table).map_err(err)?;
        f.set_environment(env).map_err(err)?;
        self.steps.store(0, Ordering::Relaxed);
        let out: Value = f.call(()).map_err(|e| format!("script failed: {e}"))?;
        then(lua, out)
    }

    /// A filter: passes only when the script returns `true`.
    pub fn filter(&self, data: &[u8]) -> Result<bool, String> {
        self.run(data, |_, v| Ok(matches!(v, Value::Boolean(true))))
    }

    /// A transform: the table the script returns, as the new JSON data.
    pub fn transform(&self, data: &[u8]) -> Result<Vec<u8>, String> {
        self.run(data, |lua, v| {
            if !matches!(v, Value::Table(_)) {
                return Err(format!(
                    "the transform script returned {}, not a table",
                    v.type_name()
                ));
            }
            let json: serde_json::Value = lua.from_value(v).map_err(|e| e.to_string())?;
            serde_json::to_vec(&whole_numbers(json)).map_err(|e| e.to_string())
        })
    }
}

/// Lua 5.1 has only doubles: a whole number goes back to JSON as an integer (`1`, not `1.0`),
/// as gopher-lua's float64 does through Go's JSON encoder.
fn whole_numbers(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        J::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => J::from(f as i64),
            _ => J::Number(n),
        },
        J::Array(a) => J::Array(a.into_iter().map(whole_numbers).collect()),
        J::Object(o) => J::Object(o.into_iter().map(|(k, v)| (k, whole_numbers(v))).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // pkg/sensors/dependencies/filter_script_test.go :: TestScriptFilter
    #[test]
    fn argo_script_filter() {
        let s = Script::compile(r#"if event.a == "hello" then return true else return false end"#)
            .unwrap();
        assert!(s.filter(br#"{"a":"hello"}"#).unwrap());
        let s = Script::compile(r#"if event.a == "hello" and event.b == "world" then return false else return true end"#).unwrap();
        assert!(!s.filter(br#"{"a":"hello","b":"world"}"#).unwrap());
        assert!(
            Script::compile(r#"if event.a == "hello" return false else return true end"#).is_err()
        );
        let s =
            Script::compile(r#"if a.a == "hello" then return true else return false end"#).unwrap();
        assert!(s.filter(br#"{"a":"hello"}"#).is_err());
        assert!(s.filter(b"[1]").is_err());
    }

    // pkg/sensors/dependencies/transform_test.go :: TestApplyScriptTransform
    #[test]
    fn argo_script_transform() {
        let s = Script::compile(r#"event.a = "bar"; return event"#).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&s.transform(br#"{"a":"foo","n":2}"#).unwrap()).unwrap();
        assert_eq!(v, serde_json::json!({"a": "bar", "n": 2}));
        let s = Script::compile("event.c.d[1]=4\nreturn event").unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&s.transform(br#"{"a":1,"b":"2","c":{"d":[3]}}"#).unwrap())
                .unwrap();
        assert_eq!(v, serde_json::json!({"a": 1, "b": "2", "c": {"d": [4]}}));
        let s = Script::compile("return 1").unwrap();
        assert!(s
            .transform(br#"{"a":1}"#)
            .unwrap_err()
            .contains("not a table"));
        // Lua 5.1: no integer division operator
        assert!(Script::compile("return 7 // 2").is_err());
    }

    #[test]
    fn globals_do_not_leak_between_events_and_loops_are_stopped() {
        let s = Script::compile("count = (count or 0) + 1\nreturn count == 1").unwrap();
        assert!(s.filter(b"{}").unwrap());
        assert!(
            s.filter(b"{}").unwrap(),
            "a global from the last event leaked"
        );
        let spin = Script::compile("while true do end").unwrap();
        assert!(spin
            .filter(b"{}")
            .unwrap_err()
            .contains("instruction budget"));
        // The state is usable after a stopped script.
        assert!(s.filter(b"{}").unwrap());
    }
}
