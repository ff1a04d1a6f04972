//! Durable key-value state for connectors and the pipeline (dedup window, schedule slots).
//!
//! The daemon backs this with an embedded store when `state_dir` is set; tests use
//! [`MemoryStateStore`]. Keys and values are bytes; `table` groups keys by owner.

use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
#[error("state store: {0}")]
pub struct StateError(pub String);

pub trait StateStore: Send + Sync + 'static {
    fn get(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError>;
    /// Applies every put and delete in one atomic, durable write.
    fn write(
        &self,
        table: &str,
        puts: &[(&[u8], &[u8])],
        deletes: &[&[u8]],
    ) -> Result<(), StateError>;
    /// Calls `f` for every entry of `table`, in key order.
    fn scan(&self, table: &str, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StateError>;
}

/// An in-memory [`StateStore`] (tests, and runs without `state_dir` that still want the API).
type Table = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Default)]
pub struct MemoryStateStore {
    tables: Mutex<BTreeMap<String, Table>>,
}

impl StateStore for MemoryStateStore {
    fn get(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        let t = self.tables.lock().unwrap();
        Ok(t.get(table).and_then(|m| m.get(key).cloned()))
    }

    fn write(
        &self,
        table: &str,
        puts: &[(&[u8], &[u8])],
        deletes: &[&[u8]],
    ) -> Result<(), StateError> {
        let mut t = self.tables.lock().unwrap();
        let m = t.entry(table.to_owned()).or_default();
        for (k, v) in puts {
            m.insert(k.to_vec(), v.to_vec());
        }
        for k in deletes {
            m.remove(*k);
        }
        Ok(())
    }

    fn scan(&self, table: &str, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StateError> {
        let t = self.tables.lock().unwrap();
        if let Some(m) = t.get(table) {
            for (k, v) in m {
                f(k, v);
            }
        }
        Ok(())
    }
}
