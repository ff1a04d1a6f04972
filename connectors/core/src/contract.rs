//! The connector contract: config struct (pure data) → `build` (validates, opens resources) →
//! a future that runs until shutdown.
//!
//! A source sends each inbound unit through its [`SourceSender`] and answers upstream from the
//! returned outcome. A sink reads [`SinkItem`]s from its [`SinkInput`] and reports each one's
//! [`Delivery`]. Everything else a connector needs arrives in its context struct, so the traits
//! do not change when a new need appears.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::pipeline::{SinkInput, SourceSender};
use crate::state::StateStore;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A connector failed to build or stopped with an error. The message names what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConnectorError(pub String);

impl ConnectorError {
    pub fn new(msg: impl Into<String>) -> Self {
        ConnectorError(msg.into())
    }
}

/// A running connector: resolves when it has stopped.
pub type Running = BoxFuture<'static, Result<(), ConnectorError>>;

/// What every source gets.
pub struct SourceContext {
    /// The source's name from the config (the key under `sources:`).
    pub name: String,
    /// Fires when the daemon stops accepting. A source then stops taking new input, finishes
    /// what it accepted (answering each sender), and returns.
    pub shutdown: CancellationToken,
    /// Where events go. Dropping every clone tells the pipeline this source is done.
    pub sender: SourceSender,
    /// Durable state when `state_dir` is set.
    pub state: Option<Arc<dyn StateStore>>,
    /// Resources shared by connectors of one family (e.g. webhook listeners on one port).
    pub shared: Shared,
    /// Problems that keep it from doing its job while it runs (`/readyz` shows them).
    pub health: Health,
}

/// What every sink gets.
pub struct SinkContext {
    pub name: String,
    /// The sink's queue. A sink runs until it returns `None`/0 (every source gone and the
    /// queue drained), so the daemon's drain delivers what was accepted.
    pub input: SinkInput,
    /// Fires when the shutdown grace period is over: stop waiting on slow peers, report what
    /// is still unsettled as failed, and return. (Until then a sink keeps delivering: it stops
    /// on its own once its input ends.)
    pub grace_over: CancellationToken,
    pub state: Option<Arc<dyn StateStore>>,
    pub shared: Shared,
    /// Problems that keep it from doing its job while it runs (`/readyz` shows them).
    pub health: Health,
}

/// What every processor gets: an input queue as a sink has, and a sender as a source has.
///
/// A processor reads [`crate::SinkItem`]s from `input`, emits events through `sender`, and
/// settles each input with the outcome of what it emitted for it
/// ([`crate::pipeline::hand_off`]): an input is acknowledged only once its output was
/// delivered. Its input ends when every upstream stage is done and the queue is drained; it
/// then finishes what it emitted and returns, which closes its output (the daemon drains
/// stages in topological order).
pub struct ProcessorContext {
    pub name: String,
    pub input: SinkInput,
    pub sender: SourceSender,
    /// Fires when the shutdown grace period is over: stop waiting and return.
    pub grace_over: CancellationToken,
    pub state: Option<Arc<dyn StateStore>>,
    pub shared: Shared,
    /// Problems that keep it from doing its job while it runs (`/readyz` shows them).
    pub health: Health,
}

/// A stage named in a processor's own config, with where it is named (config path segments
/// below the processor, for the error position).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedStage {
    pub name: String,
    pub path: Vec<String>,
}

/// The routes a processor's config implies, so that users need not write them again: the
/// stages it reads from (each becomes a route into the processor) and the sinks it addresses
/// by name through [`crate::SourceSender::send_to`] (the Sensor's trigger targets).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wiring {
    pub inputs: Vec<NamedStage>,
    pub targets: Vec<NamedStage>,
}

/// A processor kind's configuration (filters, transforms, the Sensor).
pub trait ProcessorConfig: DeserializeOwned + fmt::Debug + Send + Sync + 'static {
    fn validate(&self, _name: &str) -> Result<(), String> {
        Ok(())
    }
    /// The routes this config implies (none by default: the `routes:` section says).
    fn wiring(&self) -> Wiring {
        Wiring::default()
    }
    /// Checks against the live environment, for `sluice validate --kube`: what the component
    /// would find wrong at start (a Kubernetes permission it lacks), without starting it.
    /// Answers the problems found, each naming what to do (empty: none). Default: nothing to
    /// check.
    fn preflight<'a>(&'a self, _name: &'a str) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn build(
        self: Box<Self>,
        ctx: ProcessorContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>>;
}

/// A source kind's configuration. `Deserialize` is the config reference: doc comments on the
/// fields are what users read.
pub trait SourceConfig: DeserializeOwned + fmt::Debug + Send + Sync + 'static {
    /// Checks that touch nothing outside the process (`sluice validate` runs only these).
    fn validate(&self, _name: &str) -> Result<(), String> {
        Ok(())
    }
    /// Opens resources (binds sockets, connects) and returns the running source.
    /// Checks against the live environment, for `sluice validate --kube`: what the component
    /// would find wrong at start (a Kubernetes permission it lacks), without starting it.
    /// Answers the problems found, each naming what to do (empty: none). Default: nothing to
    /// check.
    fn preflight<'a>(&'a self, _name: &'a str) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>>;
}

/// A sink kind's configuration.
pub trait SinkConfig: DeserializeOwned + fmt::Debug + Send + Sync + 'static {
    fn validate(&self, _name: &str) -> Result<(), String> {
        Ok(())
    }
    /// Checks against the live environment, for `sluice validate --kube`: what the component
    /// would find wrong at start (a Kubernetes permission it lacks), without starting it.
    /// Answers the problems found, each naming what to do (empty: none). Default: nothing to
    /// check.
    fn preflight<'a>(&'a self, _name: &'a str) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>>;
}

/// A type map for resources that connectors of one family share within one daemon (one
/// topology). Keyed by type, so each family owns its own entry and nothing is global.
#[derive(Clone, Default)]
pub struct Shared(Arc<Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>>);

impl Shared {
    /// The shared `T`, created on first use.
    pub fn get_or_default<T: Any + Send + Sync + Default>(&self) -> Arc<T> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()));
        entry
            .clone()
            .downcast::<T>()
            .unwrap_or_else(|_| unreachable!("the map is keyed by TypeId"))
    }
}

/// What a running component knows is wrong with it: a permission it lacks, a peer that refuses
/// it. Each problem has a key (so it can be cleared when fixed) and a text that names what to
/// do. While any is set, the daemon's `/readyz` reports the component not ready, with the
/// texts.
#[derive(Clone, Default)]
pub struct Health(Arc<Mutex<BTreeMap<String, String>>>);

impl Health {
    /// Sets (or replaces) the problem `key`.
    pub fn problem(&self, key: impl Into<String>, what: impl Into<String>) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.insert(key.into(), what.into());
    }

    /// Clears the problem `key`, if set.
    pub fn clear(&self, key: &str) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(key);
    }

    /// The problems' texts, in key order (empty while healthy).
    pub fn problems(&self) -> Vec<String> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.values().cloned().collect()
    }
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Health").field(&self.problems()).finish()
    }
}
