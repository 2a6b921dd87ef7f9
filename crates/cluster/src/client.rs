//! A client's open consistency intervals (RIBD's CCM, §2.5 and requirement R1): one stream
//! of intervals per client thread, with monotone ids and no nesting. While an interval is
//! open its writes are buffered (reads of them see them: read-your-writes) and so are its
//! unlocks: a range the interval wrote must not be handed to another client before the
//! interval commits, or that client could read what may still be aborted. At `end` the
//! writes are grouped by brick for the prepare ([`crate::interval::Coordinator`]) and the
//! unlocks handed back, to be sent once the commit is.

use std::collections::BTreeMap;

use crate::interval::{Brick, IntervalId, Write};

/// A client thread, by the client's own numbering.
pub type Thread = u64;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    #[error("thread {0} already has an open interval: intervals do not nest")]
    Nested(Thread),
    #[error("thread {0} has no open interval")]
    NotOpen(Thread),
}

/// What `end` hands back: the interval, its writes by brick, and the unlocks to send after
/// the commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    pub id: IntervalId,
    pub writes: BTreeMap<Brick, Vec<Write>>,
    pub unlocks: Vec<u64>,
}

#[derive(Default)]
struct Open {
    seq: u64,
    /// The last value written to each block in the interval.
    writes: BTreeMap<u64, u64>,
    unlocks: Vec<u64>,
}

/// The open intervals of one client.
pub struct ClientIntervals {
    client: u64,
    /// The next sequence number of each thread's stream.
    next: BTreeMap<Thread, u64>,
    open: BTreeMap<Thread, Open>,
}

impl ClientIntervals {
    pub fn new(client: u64) -> Self {
        ClientIntervals {
            client,
            next: BTreeMap::new(),
            open: BTreeMap::new(),
        }
    }

    /// Opens the thread's next interval.
    pub fn begin(&mut self, thread: Thread) -> Result<IntervalId, IntervalError> {
        if self.open.contains_key(&thread) {
            return Err(IntervalError::Nested(thread));
        }
        let next = self.next.entry(thread).or_insert(1);
        let seq = *next;
        *next += 1;
        self.open.insert(
            thread,
            Open {
                seq,
                ..Open::default()
            },
        );
        Ok(self.id(thread, seq))
    }

    /// Buffers a write in the thread's open interval (a later write of the block replaces it).
    pub fn write(&mut self, thread: Thread, block: u64, value: u64) -> Result<(), IntervalError> {
        let open = self.open_mut(thread)?;
        open.writes.insert(block, value);
        Ok(())
    }

    /// What the thread's open interval wrote to `block`, if it did (read-your-writes); None
    /// means the read goes to the bricks.
    pub fn read(&self, thread: Thread, block: u64) -> Option<u64> {
        self.open.get(&thread)?.writes.get(&block).copied()
    }

    /// Defers an unlock to after the interval's commit.
    pub fn unlock(&mut self, thread: Thread, token: u64) -> Result<(), IntervalError> {
        self.open_mut(thread)?.unlocks.push(token);
        Ok(())
    }

    /// Closes the thread's interval: its writes by brick (`place` says which bricks hold a
    /// block: a replicated block goes to each) and its deferred unlocks.
    pub fn end(
        &mut self,
        thread: Thread,
        place: impl Fn(u64) -> Vec<Brick>,
    ) -> Result<Ended, IntervalError> {
        let open = self
            .open
            .remove(&thread)
            .ok_or(IntervalError::NotOpen(thread))?;
        let mut writes: BTreeMap<Brick, Vec<Write>> = BTreeMap::new();
        for (block, value) in open.writes {
            for brick in place(block) {
                writes
                    .entry(brick)
                    .or_default()
                    .push(Write { block, value });
            }
        }
        Ok(Ended {
            id: self.id(thread, open.seq),
            writes,
            unlocks: open.unlocks,
        })
    }

    fn id(&self, thread: Thread, seq: u64) -> IntervalId {
        // One stream per thread: the thread in the high half keeps ids of two threads apart
        // and each thread's monotone.
        IntervalId {
            client: self.client,
            seq: (thread << 32) | seq,
        }
    }

    fn open_mut(&mut self, thread: Thread) -> Result<&mut Open, IntervalError> {
        self.open
            .get_mut(&thread)
            .ok_or(IntervalError::NotOpen(thread))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_do_not_nest_and_each_threads_ids_grow() {
        let mut c = ClientIntervals::new(7);
        let a = c.begin(1).unwrap();
        assert_eq!(c.begin(1), Err(IntervalError::Nested(1)));
        let other = c.begin(2).unwrap();
        assert_ne!(a, other, "two threads' intervals are two intervals");
        c.end(1, |_| vec![0]).unwrap();
        let b = c.begin(1).unwrap();
        assert!(b.seq > a.seq && b.client == 7);
        assert_eq!(c.end(3, |_| vec![0]), Err(IntervalError::NotOpen(3)));
    }

    #[test]
    fn an_interval_reads_its_own_writes_and_defers_its_unlocks_to_the_end() {
        let mut c = ClientIntervals::new(1);
        c.begin(1).unwrap();
        c.write(1, 10, 100).unwrap();
        c.write(1, 10, 101).unwrap();
        c.write(1, 21, 200).unwrap();
        assert_eq!(c.read(1, 10), Some(101), "the latest write of the interval");
        assert_eq!(c.read(1, 11), None, "not written: read from the bricks");
        assert_eq!(c.read(2, 10), None, "another thread does not see it");
        c.unlock(1, 55).unwrap();
        // Blocks even on brick 0, odd on brick 1, and block 21 mirrored on both.
        let ended = c
            .end(1, |b| {
                if b == 21 {
                    vec![0, 1]
                } else {
                    vec![(b % 2) as usize]
                }
            })
            .unwrap();
        assert_eq!(ended.unlocks, vec![55]);
        assert_eq!(
            ended.writes[&0],
            vec![
                Write {
                    block: 10,
                    value: 101
                },
                Write {
                    block: 21,
                    value: 200
                }
            ]
        );
        assert_eq!(
            ended.writes[&1],
            vec![Write {
                block: 21,
                value: 200
            }]
        );
        assert_eq!(c.read(1, 10), None, "ended: no longer buffered");
    }
}
