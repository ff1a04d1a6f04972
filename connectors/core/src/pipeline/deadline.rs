//! Deadlines of [`super::Pending`]s ([`super::SendOptions::deadline`]) without a timer each.
//!
//! A tokio timer per unit registers in the runtime's timer wheel when first polled and
//! deregisters when dropped, under the driver's lock: a large share of what a unit costs. Here
//! the units of one sender share one table and one task: a unit with a deadline takes a slot
//! (one short lock) and gives it back when it resolves; the task sleeps until the earliest
//! deadline it knows, and then ends the waits of the units whose deadline passed. A deadline
//! earlier than the one the task sleeps for wakes it to plan again.

use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::ack::Unit;

struct Slot {
    at: Instant,
    unit: Weak<Unit>,
    /// Which insert took the slot: a unit whose slot was freed when its deadline passed (and
    /// maybe taken by another since) gives back nothing.
    generation: u64,
}

/// A unit's place in the table: its slot and the insert that took it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    slot: usize,
    generation: u64,
}

/// The sweeper does not wake more often than this: a burst of deadlines passing at different
/// milliseconds is ended in batches, each a scan of the table.
const GRAIN: std::time::Duration = std::time::Duration::from_millis(10);

#[derive(Default)]
struct Table {
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    live: usize,
    generation: u64,
    /// When the sweeping task wakes next (`None`: it waits for a first deadline, or it is not
    /// running).
    wake_at: Option<Instant>,
    running: bool,
}

/// The deadlines of one sender's units.
#[derive(Default)]
pub(crate) struct Deadlines {
    table: Mutex<Table>,
    /// Wakes the sweeping task: an earlier deadline, or the table is gone.
    nudge: Arc<Notify>,
}

impl Drop for Deadlines {
    fn drop(&mut self) {
        // The task holds only a weak reference: let it see that the table is gone.
        self.nudge.notify_one();
    }
}

impl Deadlines {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches `unit` until `at`: past it, its wait ends ([`Unit::lapse`]). Returns the ticket
    /// to give back with [`Deadlines::remove`] once the unit resolved. Outside a tokio runtime
    /// nothing sweeps the table (every unit is made on one; the check keeps a stray call from
    /// panicking).
    pub(crate) fn insert(self: &Arc<Self>, at: Instant, unit: &Arc<Unit>) -> Ticket {
        let mut t = self.lock();
        t.generation += 1;
        let generation = t.generation;
        let slot = Slot {
            at,
            unit: Arc::downgrade(unit),
            generation,
        };
        let idx = match t.free.pop() {
            Some(i) => {
                t.slots[i] = Some(slot);
                i
            }
            None => {
                t.slots.push(Some(slot));
                t.slots.len() - 1
            }
        };
        t.live += 1;
        let ticket = Ticket {
            slot: idx,
            generation,
        };
        if !t.running {
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                return ticket;
            };
            t.running = true;
            t.wake_at = Some(at);
            drop(t);
            rt.spawn(sweep(Arc::downgrade(self), self.nudge.clone()));
        } else if t.wake_at.is_none_or(|w| at < w) {
            t.wake_at = Some(at);
            drop(t);
            self.nudge.notify_one();
        }
        ticket
    }

    /// Gives a unit's slot back (once it resolved). A slot freed by its deadline already, and
    /// maybe taken since by another unit, is left alone.
    pub(crate) fn remove(&self, ticket: Ticket) {
        let mut t = self.lock();
        let ours = t
            .slots
            .get(ticket.slot)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.generation == ticket.generation);
        if ours {
            t.slots[ticket.slot] = None;
            t.free.push(ticket.slot);
            t.live -= 1;
        }
    }

    /// Ends the waits whose deadline passed; returns when to look again (`None`: nothing is
    /// watched).
    fn expire(&self, now: Instant) -> Option<Instant> {
        let mut due = Vec::new();
        let next = {
            let mut t = self.lock();
            let mut next: Option<Instant> = None;
            let mut freed = Vec::new();
            for (i, s) in t.slots.iter_mut().enumerate() {
                let Some(slot) = s else { continue };
                if slot.at <= now {
                    due.push(slot.unit.clone());
                    *s = None;
                    freed.push(i);
                } else if next.is_none_or(|n| slot.at < n) {
                    next = Some(slot.at);
                }
            }
            t.live -= freed.len();
            t.free.extend(freed);
            if t.live == 0 {
                // Nothing left: give the memory of a past burst back.
                t.slots.clear();
                t.free.clear();
            }
            t.wake_at = next;
            next
        };
        for unit in due {
            if let Some(unit) = unit.upgrade() {
                unit.lapse();
            }
        }
        next
    }
}

/// The sweeping task of one table: ends when the table is gone. Dropped without ending (the
/// runtime shut down), it lets the next insert start another.
async fn sweep(table: Weak<Deadlines>, nudge: Arc<Notify>) {
    struct Running(Weak<Deadlines>);
    impl Drop for Running {
        fn drop(&mut self) {
            if let Some(t) = self.0.upgrade() {
                t.lock().running = false;
            }
        }
    }
    let _running = Running(table.clone());
    loop {
        let wake_at = {
            let Some(t) = table.upgrade() else { return };
            let now = Instant::now();
            let at = t.lock().wake_at;
            match at {
                Some(at) if at <= now => t.expire(now),
                other => other,
            }
        };
        match wake_at {
            Some(at) => {
                let at = at.max(Instant::now() + GRAIN);
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = nudge.notified() => {}
                }
            }
            None => nudge.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn waits_end_at_their_deadlines_and_resolved_ones_are_left_alone() {
        let d = Arc::new(Deadlines::default());
        let (a, b, c) = (
            Unit::new(1, None, "t".into()),
            Unit::new(1, None, "t".into()),
            Unit::new(1, None, "t".into()),
        );
        let now = Instant::now();
        let sa = d.insert(now + Duration::from_millis(300), &a);
        let _sb = d.insert(now + Duration::from_millis(100), &b);
        let sc = d.insert(now + Duration::from_millis(200), &c);
        d.remove(sc); // c resolved before its deadline
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(b.lapsed() && !a.lapsed() && !c.lapsed());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(a.lapsed() && !c.lapsed());
        d.remove(sa); // already expired: nothing to give back twice
        assert_eq!(d.lock().live, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_unit_gives_back_nothing_of_the_unit_that_took_its_slot_since() {
        let d = Arc::new(Deadlines::default());
        let (old, new) = (
            Unit::new(1, None, "t".into()),
            Unit::new(1, None, "t".into()),
        );
        let now = Instant::now();
        let old_ticket = d.insert(now + Duration::from_millis(50), &old);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(old.lapsed());
        // The freed slot is taken by the next unit.
        let new_ticket = d.insert(Instant::now() + Duration::from_millis(100), &new);
        assert_eq!(new_ticket.slot, old_ticket.slot);
        d.remove(old_ticket); // the lapsed unit's Pending goes away late
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(new.lapsed(), "the new unit's deadline still holds");
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_wakes_the_sweeper_to_plan_again() {
        let d = Arc::new(Deadlines::default());
        let (late, early) = (
            Unit::new(1, None, "t".into()),
            Unit::new(1, None, "t".into()),
        );
        let now = Instant::now();
        d.insert(now + Duration::from_secs(60), &late);
        tokio::task::yield_now().await;
        d.insert(now + Duration::from_millis(50), &early);
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(early.lapsed(), "not held until the later deadline");
        assert!(!late.lapsed());
    }
}
