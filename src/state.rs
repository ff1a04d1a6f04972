//! The embedded state store behind `state_dir`: redb (pure Rust, ACID, crash-safe, one file).

use std::path::Path;

use redb::{Database, ReadableTable, TableDefinition, TableError};
use sluice_core::state::{StateError, StateStore};

pub struct RedbStore {
    db: Database,
}

fn err(e: impl std::fmt::Display) -> StateError {
    StateError(e.to_string())
}

impl RedbStore {
    /// Opens (creating) `dir/sluice.redb`. Fails if another process holds it.
    pub fn open(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("state_dir {}: cannot create it: {e}", dir.display()))?;
        let path = dir.join("sluice.redb");
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => format!(
                "state_dir {}: already in use by another sluice process; give each instance its own state_dir",
                dir.display()
            ),
            other => format!("state_dir {}: cannot open {}: {other}", dir.display(), path.display()),
        })?;
        Ok(RedbStore { db })
    }
}

impl StateStore for RedbStore {
    fn get(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(table);
        let txn = self.db.begin_read().map_err(err)?;
        let t = match txn.open_table(def) {
            Ok(t) => t,
            Err(TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        Ok(t.get(key).map_err(err)?.map(|v| v.value().to_vec()))
    }

    fn write(
        &self,
        table: &str,
        puts: &[(&[u8], &[u8])],
        deletes: &[&[u8]],
    ) -> Result<(), StateError> {
        let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(table);
        let txn = self.db.begin_write().map_err(err)?;
        {
            let mut t = txn.open_table(def).map_err(err)?;
            for (k, v) in puts {
                t.insert(*k, *v).map_err(err)?;
            }
            for k in deletes {
                t.remove(*k).map_err(err)?;
            }
        }
        txn.commit().map_err(err)
    }

    fn scan(&self, table: &str, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StateError> {
        let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(table);
        let txn = self.db.begin_read().map_err(err)?;
        let t = match txn.open_table(def) {
            Ok(t) => t,
            Err(TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return Err(err(e)),
        };
        for row in t.iter().map_err(err)? {
            let (k, v) = row.map_err(err)?;
            f(k.value(), v.value());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_exclusive_lock() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbStore::open(dir.path()).unwrap();
        assert_eq!(s.get("t", b"k").unwrap(), None);
        s.write("t", &[(b"k", b"v"), (b"k2", b"v2")], &[]).unwrap();
        s.write("t", &[], &[b"k2"]).unwrap();
        assert_eq!(s.get("t", b"k").unwrap().as_deref(), Some(&b"v"[..]));
        assert_eq!(s.get("t", b"k2").unwrap(), None, "deleted");
        let mut rows = Vec::new();
        s.scan("t", &mut |k, v| rows.push((k.to_vec(), v.to_vec())))
            .unwrap();
        assert_eq!(rows, [(b"k".to_vec(), b"v".to_vec())]);
        // A second store on the same directory while the first is open: refused, clearly.
        let err = RedbStore::open(dir.path())
            .err()
            .expect("a second open of a state_dir in use must fail");
        assert_eq!(
            err,
            format!(
                "state_dir {}: already in use by another sluice process; give each instance its own state_dir",
                dir.path().display()
            )
        );
        assert_eq!(
            s.get("t", b"k").unwrap().as_deref(),
            Some(&b"v"[..]),
            "the first store still works"
        );
        drop(s);
        // Once the first is gone, the directory opens again, with the data.
        let again = RedbStore::open(dir.path()).unwrap();
        assert_eq!(again.get("t", b"k").unwrap().as_deref(), Some(&b"v"[..]));
    }
}
