//! The contract every Sluice connector and the daemon share: the CloudEvent model and its
//! encodings, the acknowledged pipeline with backpressure and dedup, the connector traits, and
//! the metric names. This crate imports no other crate of ours.

pub mod argo;
pub mod contract;
pub mod event;
pub mod format;
pub mod hint;
pub mod http_binding;
pub mod json;
pub mod kafka_binding;
#[cfg(feature = "params")]
pub mod params;
pub mod pipeline;
pub mod pull;
#[cfg(feature = "cloudevents-sdk")]
pub mod sdk;
pub mod state;
pub mod telemetry;
pub mod template;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod units;

pub use contract::{
    BoxFuture, ConnectorError, Health, NamedStage, ProcessorConfig, ProcessorContext, Running,
    Shared, SinkConfig, SinkContext, SourceConfig, SourceContext, Wiring,
};
pub use event::{Data, Event, EventError, ExtValue, Str, Timestamp};
pub use pipeline::{
    Delivery, Outcome, Overloaded, Pending, SendOptions, SinkInput, SinkItem, SourceSender, Status,
    Target,
};
