//! A nats-server process for the tests of this crate, optionally behind a relay so it can be
//! restarted at the same address.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use sluice_core::testkit::peers::{spawn_nats, NatsProcess, Relay};

pub struct Server {
    pub proc: NatsProcess,
    dir: PathBuf,
    relay: Option<Relay>,
}

impl Server {
    pub fn start(dir: &Path) -> Server {
        Server {
            proc: spawn_nats(dir),
            dir: dir.to_path_buf(),
            relay: None,
        }
    }

    /// Reached through a [`Relay`], so that it can be restarted behind the same address.
    pub fn start_relayed(dir: &Path) -> Server {
        let mut s = Server::start(dir);
        let relay = Relay::new();
        relay.point_at(Some(s.proc.port));
        s.relay = Some(relay);
        s
    }

    /// What a client is configured with: the relay's address, if any.
    pub fn url(&self) -> String {
        let port = self.relay.as_ref().map_or(self.proc.port, |r| r.port);
        format!("nats://127.0.0.1:{port}")
    }

    /// The server itself.
    pub fn direct_url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.proc.port)
    }

    pub fn stop(&mut self) {
        if let Some(r) = &self.relay {
            r.point_at(None);
        }
        let _ = self.proc.child.kill();
        let _ = self.proc.child.wait();
    }

    /// Stops it and starts it again on the same store (behind the same relay).
    pub fn restart(&mut self) {
        self.stop();
        self.proc = spawn_nats(&self.dir);
        if let Some(r) = &self.relay {
            r.point_at(Some(self.proc.port));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}
