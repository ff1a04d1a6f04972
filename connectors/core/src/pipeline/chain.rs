//! Ack chaining for processors: an input is settled with the outcome of the output it became.

use std::future::Future;

use super::{Delivery, SourceSender};
use crate::event::Event;

/// Hands `events`, made from the inputs `inputs` (one or many: a correlation of several
/// dependencies fires one output), to the pipeline through `sender`, waiting for queue room
/// (the backpressure), and returns a future that settles every input with the output's outcome
/// once it is known. Push that future into the processor's [`super::SinkWindow`].
///
/// The inputs' memory is given back first ([`Delivery::release_memory`]), so a chain of stages
/// cannot deadlock on the shared memory budget. No events (the processor dropped the input on
/// purpose, a filter): the inputs count as delivered.
pub async fn hand_off(
    sender: &SourceSender,
    mut inputs: Vec<Delivery>,
    events: Vec<Event>,
) -> impl Future<Output = ()> + Send + 'static {
    for d in &mut inputs {
        d.release_memory();
    }
    let pending = if events.is_empty() {
        None
    } else {
        Some(sender.send(events).await)
    };
    async move {
        match pending {
            None => inputs.into_iter().for_each(Delivery::delivered),
            Some(p) => {
                let outcome = p.await;
                for d in inputs {
                    d.settle_with(&outcome);
                }
            }
        }
    }
}
