//! Ordered acknowledgements: a commit point over positions settled out of order.

use std::collections::VecDeque;

/// The watermark is at its bound: stop fetching for this partition until it advances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many unsettled positions; stop fetching until the commit point advances")]
pub struct Full;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Pending,
    Done,
    /// Failed `n` times; held until a retry delivers it.
    Failed(u32),
}

/// Positions of one partition (stream, session) in arrival order, settled in any order.
///
/// The commit point is the first unsettled position: everything before it is settled and may
/// be committed upstream (Kafka: commit offset = commit point; MQTT: PUBACK each released
/// packet in order; JetStream: AckAll the last released). Positions may have gaps (compacted
/// topics, filtered subjects). A failed position holds the commit point: the source re-sends it
/// after [`super::Backoff::RETRY`] (dedup makes its already delivered neighbours cheap to resend
/// if it has to replay more than one). Bounded: at `bound` unsettled positions, `push` says
/// [`Full`].
#[derive(Debug)]
pub struct Watermark {
    entries: VecDeque<(u64, State)>,
    bound: usize,
    /// The position after the last one released (the commit point when nothing is pending).
    released: Option<u64>,
}

impl Watermark {
    pub fn new(bound: usize) -> Self {
        Watermark {
            // Grown on demand: a consumer with many partitions keeps one per partition, and
            // most hold far fewer than `bound`.
            entries: VecDeque::with_capacity(bound.clamp(1, 256)),
            bound: bound.max(1),
            released: None,
        }
    }

    /// Positions tracked (pending, failed or settled but not yet released).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.entries.len() >= self.bound
    }

    /// The first position tracked (pending, failed or settled but not yet released).
    pub fn oldest(&self) -> Option<u64> {
        self.entries.front().map(|e| e.0)
    }

    /// How many more positions `push` takes before it says [`Full`].
    pub fn room(&self) -> usize {
        self.bound.saturating_sub(self.entries.len())
    }

    /// Tracks a newly received position. Positions must increase; one at or below the last
    /// tracked or released position is a redelivery of a known one and is ignored (`Ok(false)`).
    pub fn push(&mut self, pos: u64) -> Result<bool, Full> {
        let last = self
            .entries
            .back()
            .map(|e| e.0 + 1)
            .or(self.released)
            .unwrap_or(0);
        if pos < last {
            return Ok(false);
        }
        if self.is_full() {
            return Err(Full);
        }
        self.entries.push_back((pos, State::Pending));
        Ok(true)
    }

    fn find(&self, pos: u64) -> Option<usize> {
        // Positions are mostly consecutive (a partition's offsets, a stream's sequence): then
        // the entry is where its distance from the front says, and no search is needed.
        let front = self.entries.front()?.0;
        let guess = usize::try_from(pos.checked_sub(front)?).ok();
        match guess.and_then(|g| Some((g, self.entries.get(g)?))) {
            Some((g, e)) if e.0 == pos => Some(g),
            _ => self.entries.binary_search_by_key(&pos, |e| e.0).ok(),
        }
    }

    /// Records `pos` as delivered. Returns false for an unknown position.
    pub fn delivered(&mut self, pos: u64) -> bool {
        match self.find(pos) {
            Some(i) => {
                self.entries[i].1 = State::Done;
                true
            }
            None => false,
        }
    }

    /// Records `pos` as failed: it holds the commit point until a retry delivers it. Returns
    /// how many times it has failed (for [`super::Backoff::after`]), `None` for an unknown position.
    pub fn failed(&mut self, pos: u64) -> Option<u32> {
        let i = self.find(pos)?;
        let n = match self.entries[i].1 {
            State::Failed(n) => n + 1,
            _ => 1,
        };
        self.entries[i].1 = State::Failed(n);
        Some(n)
    }

    /// Releases the settled positions at the front, in order, calling `release` for each (MQTT
    /// sends each PUBACK here), and returns the new commit point if it moved.
    pub fn advance(&mut self, mut release: impl FnMut(u64)) -> Option<u64> {
        let mut moved = false;
        while let Some(&(pos, State::Done)) = self.entries.front() {
            self.entries.pop_front();
            release(pos);
            self.released = Some(pos + 1);
            moved = true;
        }
        moved.then(|| self.commit_point()).flatten()
    }

    /// Where a commit may point now: the first position not yet released (or the one after the
    /// last released when none is tracked); `None` before anything was released.
    pub fn commit_point(&self) -> Option<u64> {
        match self.entries.front() {
            Some(&(pos, _)) if self.released.is_some() => Some(pos),
            Some(_) => None,
            None => self.released,
        }
    }

    /// The partition is taken away (a rebalance): releases what can be, returns the safe commit
    /// point, and forgets the rest (their events may be delivered by this process and again by
    /// the new owner; dedup and the bus's idempotence absorb that).
    pub fn revoke(&mut self) -> Option<u64> {
        self.advance(|_| ());
        let point = self.commit_point();
        self.entries.clear();
        point
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commit_point_is_the_first_unsettled_position() {
        let mut w = Watermark::new(10);
        for p in [10, 11, 13, 20] {
            assert_eq!(w.push(p), Ok(true));
        }
        assert_eq!(w.commit_point(), None);
        w.delivered(11);
        w.delivered(13);
        let mut released = Vec::new();
        assert_eq!(w.advance(|p| released.push(p)), None, "10 still pending");
        assert!(released.is_empty());
        w.delivered(10);
        assert_eq!(w.advance(|p| released.push(p)), Some(20));
        assert_eq!(released, [10, 11, 13], "released in arrival order");
        w.delivered(20);
        assert_eq!(w.advance(|p| released.push(p)), Some(21));
        assert_eq!(w.commit_point(), Some(21));
    }

    #[test]
    fn a_failed_position_holds_the_commit_point_until_its_retry_delivers() {
        let mut w = Watermark::new(10);
        for p in 0..4 {
            w.push(p).unwrap();
        }
        w.delivered(0);
        assert_eq!(w.failed(1), Some(1));
        w.delivered(2);
        w.delivered(3);
        assert_eq!(w.advance(|_| ()), Some(1));
        assert_eq!(w.failed(1), Some(2), "the retry failed too");
        assert_eq!(w.advance(|_| ()), None);
        assert_eq!(w.commit_point(), Some(1));
        assert!(w.delivered(1));
        assert_eq!(w.advance(|_| ()), Some(4));
    }

    #[test]
    fn positions_are_found_with_and_without_gaps() {
        let mut w = Watermark::new(10);
        for p in [5, 6, 7, 9, 12] {
            w.push(p).unwrap();
        }
        // Before, between and after the tracked positions: unknown.
        for unknown in [4, 8, 10, 11, 13, u64::MAX] {
            assert!(!w.delivered(unknown), "{unknown} is not tracked");
        }
        // Where the distance from the front says (7), and past a gap (9, 12).
        for p in [7, 12, 9, 5] {
            assert!(w.delivered(p), "{p} is tracked");
        }
        assert_eq!(w.failed(6), Some(1));
        let mut released = Vec::new();
        assert_eq!(w.advance(|p| released.push(p)), Some(6));
        assert_eq!(released, [5]);
        assert!(w.delivered(6));
        assert_eq!(w.advance(|p| released.push(p)), Some(13));
        assert_eq!(released, [5, 6, 7, 9, 12]);
    }

    #[test]
    fn bounded_and_redeliveries_are_ignored() {
        let mut w = Watermark::new(2);
        assert_eq!(w.room(), 2);
        w.push(5).unwrap();
        w.push(6).unwrap();
        assert_eq!(w.room(), 0);
        assert_eq!(w.push(7), Err(Full));
        assert_eq!(w.push(6), Ok(false), "a redelivery of a tracked position");
        w.delivered(5);
        w.advance(|_| ());
        assert_eq!(w.push(5), Ok(false), "a redelivery of a released position");
        assert_eq!(w.room(), 1);
        assert_eq!(w.push(7), Ok(true));
        assert!(!w.delivered(99));
        assert_eq!(w.failed(99), None);
    }

    #[test]
    fn revoke_returns_the_safe_commit_point() {
        let mut w = Watermark::new(10);
        for p in 0..5 {
            w.push(p).unwrap();
        }
        w.delivered(0);
        w.delivered(1);
        w.delivered(3);
        assert_eq!(w.revoke(), Some(2));
        assert!(w.is_empty());
        let mut fresh = Watermark::new(10);
        fresh.push(7).unwrap();
        assert_eq!(fresh.revoke(), None, "nothing settled: commit nothing");
    }
}
