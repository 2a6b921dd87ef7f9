//! The intervals a host has in flight at once. Streams commit concurrently (each NBD
//! connection is one), but two intervals of one host that share a brick unit must reach the
//! bricks one after the other: their commits would otherwise land in one order on one replica
//! and the other order on the other, and the replicas would differ. The bricks do not keep
//! one client's intervals apart (only different clients'), so the host does, here: an
//! interval waits until nothing in flight shares a 4 KiB unit with it.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::space::UNIT;

/// The byte ranges of the volume that `writes` touch, each widened to whole brick units,
/// sorted and merged. A volume's stripe unit is a power of two of at least 4 KiB, so ranges
/// apart here are apart on every brick too.
pub(super) fn footprint(writes: &[(u64, Bytes)]) -> Vec<Range<u64>> {
    let mut ranges: Vec<Range<u64>> = writes
        .iter()
        .filter(|(_, data)| !data.is_empty())
        .map(|(offset, data)| {
            let start = offset / UNIT * UNIT;
            let end = (offset + data.len() as u64).div_ceil(UNIT) * UNIT;
            start..end
        })
        .collect();
    ranges.sort_by_key(|range| range.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => merged.push(range),
        }
    }
    merged
}

/// Whether two sorted, merged footprints share a byte.
pub(super) fn overlap(a: &[Range<u64>], b: &[Range<u64>]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i].start < b[j].end && b[j].start < a[i].end {
            return true;
        }
        if a[i].end <= b[j].end {
            i += 1;
        } else {
            j += 1;
        }
    }
    false
}

/// The footprints of the intervals in flight, each under a ticket.
#[derive(Default)]
pub(super) struct Flights {
    flying: Mutex<Vec<(u64, Vec<Range<u64>>)>>,
    next_ticket: AtomicU64,
    landed: tokio::sync::Notify,
    /// How many wait for intervals in flight to land (`Waiting`).
    waiters: AtomicUsize,
    /// Told when one starts to wait: commits lingering for a prepare to carry them
    /// (`carry`) then go at once.
    waited_on: tokio::sync::Notify,
}

/// One waiting for intervals in flight to land, until dropped.
pub(super) struct Waiting<'a> {
    flights: &'a Flights,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.flights.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An interval's place among the ones in flight, given up when dropped (by the task that
/// lands its commits, after the flush that reported it returned).
pub(super) struct Boarding {
    flights: Arc<Flights>,
    ticket: u64,
}

impl Flights {
    /// Marks the caller waiting for intervals in flight to land, until the guard drops.
    pub(super) fn waiting(&self) -> Waiting<'_> {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        self.waited_on.notify_waiters();
        Waiting { flights: self }
    }

    /// Waits until someone waits for intervals in flight to land (at once if one does).
    pub(super) async fn waited_for(&self) {
        let told = self.waited_on.notified();
        tokio::pin!(told);
        // Registered before the look: a waiter that comes after it is told.
        told.as_mut().enable();
        if self.waiters.load(Ordering::SeqCst) > 0 {
            return;
        }
        told.await;
    }

    /// Waits until nothing in flight overlaps `footprint`, then takes off with it. Every
    /// waiter looks again at each landing; of two waiting on one unit, either may go first,
    /// as NBD leaves the order of two connections' unflushed writes open.
    pub(super) async fn board(self: &Arc<Self>, footprint: Vec<Range<u64>>) -> Boarding {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        loop {
            let landed = self.landed.notified();
            {
                let mut flying = self.flying.lock().unwrap();
                if !flying.iter().any(|(_, other)| overlap(other, &footprint)) {
                    flying.push((ticket, footprint));
                    return Boarding {
                        flights: self.clone(),
                        ticket,
                    };
                }
            }
            let _waiting = self.waiting();
            landed.await;
        }
    }

    /// Waits until nothing in flight overlaps `range`: an interval reported ended whose
    /// commits are still on their way is not readable from the bricks yet. Later intervals
    /// may take off meanwhile; what was in flight when this looked is all it waits for.
    pub(super) async fn clear_of(&self, range: Range<u64>) {
        let footprint = std::slice::from_ref(&range);
        loop {
            let landed = self.landed.notified();
            let waiting: Vec<u64> = (self.flying.lock().unwrap().iter())
                .filter(|(_, other)| overlap(other, footprint))
                .map(|(ticket, _)| *ticket)
                .collect();
            if waiting.is_empty() {
                return;
            }
            let _waiting = self.waiting();
            landed.await;
            let flying = self.flying.lock().unwrap();
            if !flying.iter().any(|(ticket, _)| waiting.contains(ticket)) {
                return;
            }
        }
    }

    /// How many intervals are in flight now.
    pub(super) fn count(&self) -> usize {
        self.flying.lock().unwrap().len()
    }
}

impl Drop for Boarding {
    fn drop(&mut self) {
        self.flights
            .flying
            .lock()
            .unwrap()
            .retain(|(ticket, _)| *ticket != self.ticket);
        self.flights.landed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn write(offset: u64, len: usize) -> (u64, Bytes) {
        (offset, Bytes::from(vec![0u8; len]))
    }

    #[test]
    fn a_footprint_is_whole_units_merged() {
        let writes = [write(512, 512), write(4096 * 3, 4096), write(4096, 100)];
        assert_eq!(footprint(&writes), vec![0..8192, 12288..16384]);
        assert_eq!(footprint(&[write(4095, 2)]), vec![0..8192]);
        assert!(footprint(&[]).is_empty());
    }

    #[test]
    fn footprints_overlap_when_they_share_a_unit() {
        // Different sectors of one 4 KiB unit: their commits fill each other in on a brick.
        let a = footprint(&[write(0, 512)]);
        let b = footprint(&[write(1024, 512)]);
        assert!(overlap(&a, &b));
        let c = footprint(&[write(4096, 4096), write(1 << 20, 512)]);
        assert!(!overlap(&a, &c));
        assert!(overlap(&c, &footprint(&[write((1 << 20) + 4000, 8)])));
        assert!(!overlap(&c, &footprint(&[write(8192, 8192)])));
    }

    #[tokio::test]
    async fn an_overlapping_interval_waits_for_the_one_in_flight() {
        let flights = Arc::new(Flights::default());
        let first = flights.board(footprint(&[write(0, 8192)])).await;
        // Apart: boards at once.
        let apart = flights.board(footprint(&[write(8192, 4096)])).await;
        assert_eq!(flights.count(), 2);
        let waiter = {
            let flights = flights.clone();
            tokio::spawn(async move {
                let _boarded = flights.board(footprint(&[write(4096, 512)])).await;
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "boarded over an interval in flight");
        drop(apart);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "boarded over an interval in flight");
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("boards once the overlapping interval landed")
            .unwrap();
        assert_eq!(flights.count(), 0);
    }

    #[tokio::test]
    async fn a_read_waits_for_the_intervals_over_it_in_flight_when_it_came() {
        let flights = Arc::new(Flights::default());
        let first = flights.board(footprint(&[write(0, 8192)])).await;
        // Apart: does not wait.
        flights.clear_of(8192..16384).await;
        let reader = {
            let flights = flights.clone();
            tokio::spawn(async move { flights.clear_of(4096..4097).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!reader.is_finished(), "read over an interval in flight");
        drop(first);
        // One that takes off over the same bytes after the read came is not waited for.
        let _later = flights.board(footprint(&[write(0, 8192)])).await;
        tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("reads once the interval it came after landed")
            .unwrap();
    }
}
