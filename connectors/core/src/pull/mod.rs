//! The pull-source kit: what every source that pulls from a broker (SQS, Pub/Sub, Kafka,
//! JetStream, AMQP, MQTT, Redis Streams) needs besides its protocol, so each such source stays
//! one protocol file.
//!
//! - [`InFlight`]: a bounded window of upstream messages whose events are in the pipeline, with
//!   their handles (receipt handle, ack id, delivery tag, offset). Outcomes come back in
//!   completion order; a full window means "stop pulling" (that is the backpressure); a lease
//!   deadline per message says which ones need their visibility / ack deadline extended.
//! - [`SettleBatch`]: collects handles to settle upstream in batches (SQS `DeleteMessageBatch`
//!   takes 10), flushed when full or after a short linger.
//! - [`Watermark`]: ordered acknowledgements for positions in arrival order (Kafka offsets,
//!   MQTT QoS 1 packet order, JetStream AckAll, a write-ahead log): the commit point is the
//!   first unsettled position; a failed position holds the commit point until its retry
//!   succeeds; `revoke` (a rebalance) returns the safe commit point.
//!
//! - [`Backoff`]: the one capped exponential backoff (reconnects, retries), and
//!   [`RetryQueue`]: items waiting to be tried again, each until its own time.
//!
//! No broker code lives here. `docs/architecture.md` has a worked example of a source on it.

mod in_flight;
mod retry;
mod watermark;

pub use in_flight::{InFlight, SettleBatch};
pub use retry::{Backoff, RetryQueue};
pub use watermark::{Full, Watermark};
