//! A server's block-range locks with client leases and fencing (RIBD's SXM and SLM, §2.7).
//!
//! - A client **joins** and gets a session, which lives while the client renews its lease
//!   (`heartbeat`) before it runs out.
//! - A session **locks** byte ranges of the volume, shared (readers) or exclusive (a writer).
//!   A lock that conflicts with another session's is refused (`trylock`); the caller waits
//!   and retries, or queues (the blocking mode is the server's, above this table).
//! - **Expiry**: once a session's lease has run out (`expire`, called with the time), all its
//!   locks are released and the session is **fenced**: every later lock, heartbeat or I/O
//!   check from it is refused with [`LockError::Fenced`]. A client that was paused past its
//!   lease (SIGSTOP) and wakes up therefore cannot write over what the next lock holder wrote;
//!   it must join again and take its locks anew.
//! - Each grant carries a **fencing token**, strictly increasing over the table's life: a brick
//!   can order writes by it, and a token whose grant is gone authorizes nothing.
//!
//! Time is the caller's (milliseconds on any monotonic clock, virtual in the simulator), so the
//! table is a pure state machine. Locks of one session may overlap each other (a writer may
//! lock a range it already reads). Ranges are `[start, end)` in bytes, never empty.
//!
//! The locked part of the volume is kept as disjoint segments, each with the grants over it
//! (Orchestra kept the free list of unlocked ranges, the same map inverted): a lock or a
//! write check looks only at the segments its range meets, so it costs O(log n + what it
//! meets), not a scan of every grant (`examples/lock_latency.rs` measures it).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// A client's session: its identity for as long as its lease lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Session(pub u64);

/// How a range is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Any number of sessions may read it.
    Shared,
    /// One session writes it, and no other reads it.
    Exclusive,
}

/// A lock granted: its fencing token, who holds it, what and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub token: u64,
    pub session: Session,
    pub range: Range<u64>,
    pub mode: Mode,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// The session's lease ran out (or it never joined): its locks are gone and it is refused
    /// until it joins again.
    #[error("session {0:?} is fenced: its lease ran out; join again")]
    Fenced(Session),
    /// Another session holds a conflicting lock (the first one found).
    #[error("range [{}, {}) is locked by session {:?} (token {})", .0.range.start, .0.range.end, .0.session, .0.token)]
    Conflict(Grant),
    /// No such grant, or not this session's.
    #[error("token {0} is not a lock this session holds")]
    NotHeld(u64),
    #[error("an empty range [{0}, {0}) cannot be locked")]
    Empty(u64),
}

/// The lock table of one volume on one server.
pub struct RangeLocks {
    lease_ms: u64,
    /// Live sessions and when their leases run out.
    leases: BTreeMap<Session, u64>,
    /// Every lock granted, by fencing token.
    grants: BTreeMap<u64, Grant>,
    /// Each session's grants.
    by_session: BTreeMap<Session, BTreeSet<u64>>,
    /// The locked segments, disjoint, by start: their end and the grants over them.
    segments: BTreeMap<u64, (u64, Vec<u64>)>,
    next_session: u64,
    next_token: u64,
}

impl RangeLocks {
    /// A table whose sessions live `lease_ms` after each heartbeat.
    pub fn new(lease_ms: u64) -> Self {
        assert!(lease_ms > 0, "a lease must last");
        RangeLocks {
            lease_ms,
            leases: BTreeMap::new(),
            grants: BTreeMap::new(),
            by_session: BTreeMap::new(),
            segments: BTreeMap::new(),
            next_session: 1,
            next_token: 1,
        }
    }

    /// A new session, with a lease from `now`.
    pub fn join(&mut self, now: u64) -> Session {
        let session = Session(self.next_session);
        self.next_session += 1;
        self.leases.insert(session, now + self.lease_ms);
        session
    }

    /// Renews `session`'s lease from `now`. A session whose lease ran out is fenced even if
    /// `expire` has not run yet: its locks may already be another's.
    pub fn heartbeat(&mut self, session: Session, now: u64) -> Result<(), LockError> {
        self.live(session, now)?;
        self.leases.insert(session, now + self.lease_ms);
        Ok(())
    }

    /// Ends every session whose lease ran out by `now`: their locks are released and they are
    /// fenced. Returns them.
    pub fn expire(&mut self, now: u64) -> Vec<Session> {
        let dead: Vec<Session> = (self.leases.iter())
            .filter(|(_, &until)| until <= now)
            .map(|(&session, _)| session)
            .collect();
        for &session in &dead {
            self.leave(session);
        }
        dead
    }

    /// Ends `session` now, as its lease's expiry would: its locks are released, and it is
    /// fenced from then on. A holder that is done leaves, so the table does not keep it.
    pub fn leave(&mut self, session: Session) {
        self.leases.remove(&session);
        for token in self.by_session.remove(&session).unwrap_or_default() {
            let grant = self
                .grants
                .remove(&token)
                .expect("a session's grant exists");
            self.release(&grant);
        }
    }

    /// Sessions live in the table.
    pub fn sessions(&self) -> usize {
        self.leases.len()
    }

    /// Locks `range` for `session` if no other session holds a conflicting lock.
    pub fn trylock(
        &mut self,
        session: Session,
        range: Range<u64>,
        mode: Mode,
        now: u64,
    ) -> Result<Grant, LockError> {
        if range.is_empty() {
            return Err(LockError::Empty(range.start));
        }
        self.live(session, now)?;
        // Sessions whose lease ran out hold nothing any more, whether or not `expire` ran.
        let conflict = (self.meeting(&range))
            .flat_map(|(_, tokens)| tokens)
            .map(|token| &self.grants[token])
            .find(|g| {
                g.session != session
                    && (mode == Mode::Exclusive || g.mode == Mode::Exclusive)
                    && self.lease_holds(g.session, now)
            });
        if let Some(holder) = conflict {
            return Err(LockError::Conflict(holder.clone()));
        }
        let grant = Grant {
            token: self.next_token,
            session,
            range,
            mode,
        };
        self.next_token += 1;
        self.hold(&grant);
        self.grants.insert(grant.token, grant.clone());
        self.by_session
            .entry(session)
            .or_default()
            .insert(grant.token);
        Ok(grant)
    }

    /// Releases the lock `token` of `session`.
    pub fn unlock(&mut self, session: Session, token: u64, now: u64) -> Result<(), LockError> {
        self.live(session, now)?;
        match self.grants.get(&token) {
            Some(grant) if grant.session == session => {
                let grant = self.grants.remove(&token).expect("just found");
                self.release(&grant);
                if let Some(tokens) = self.by_session.get_mut(&session) {
                    tokens.remove(&token);
                }
                Ok(())
            }
            _ => Err(LockError::NotHeld(token)),
        }
    }

    /// Whether `session` may write `range` now: its lease lives and its exclusive locks cover
    /// the range whole. What a brick checks before it applies a client's write.
    pub fn may_write(
        &self,
        session: Session,
        range: Range<u64>,
        now: u64,
    ) -> Result<bool, LockError> {
        self.live(session, now)?;
        if range.is_empty() {
            return Ok(true);
        }
        // The segments the range meets, in order: no gap, and each held exclusively by it.
        let mut segments: Vec<(Range<u64>, &Vec<u64>)> = self.meeting(&range).collect();
        segments.reverse();
        let mut covered = range.start;
        for (segment, tokens) in segments {
            let mine = tokens.iter().any(|t| {
                let g = &self.grants[t];
                g.session == session && g.mode == Mode::Exclusive
            });
            if segment.start > covered || !mine {
                return Ok(false);
            }
            covered = segment.end;
        }
        Ok(covered >= range.end)
    }

    /// The locks `session` holds.
    pub fn held(&self, session: Session) -> Vec<Grant> {
        (self.by_session.get(&session).into_iter().flatten())
            .map(|token| self.grants[token].clone())
            .collect()
    }

    /// Every lock granted and not released (a lapsed session's included until `expire`).
    pub fn grants(&self) -> impl Iterator<Item = &Grant> {
        self.grants.values()
    }

    /// The segments `range` meets, from the last to the first.
    fn meeting<'a>(
        &'a self,
        range: &Range<u64>,
    ) -> impl Iterator<Item = (Range<u64>, &'a Vec<u64>)> + 'a {
        let start = range.start;
        (self.segments.range(..range.end).rev())
            .take_while(move |(_, (end, _))| *end > start)
            .map(|(&at, (end, tokens))| (at..*end, tokens))
    }

    /// Cuts the segment that holds `at` inside it in two there.
    fn split(&mut self, at: u64) {
        let Some((&start, (end, tokens))) = self.segments.range(..at).next_back() else {
            return;
        };
        if *end > at {
            let (end, tokens) = (*end, tokens.clone());
            self.segments.insert(start, (at, tokens.clone()));
            self.segments.insert(at, (end, tokens));
        }
    }

    /// Adds `grant` to the segments over its range, making segments for the gaps.
    fn hold(&mut self, grant: &Grant) {
        let Range { start, end } = grant.range;
        self.split(start);
        self.split(end);
        let mut at = start;
        let inside: Vec<(u64, u64)> = (self.segments.range(start..end))
            .map(|(&s, (e, _))| (s, *e))
            .collect();
        for (s, e) in inside {
            if s > at {
                self.segments.insert(at, (s, vec![grant.token]));
            }
            self.segments
                .get_mut(&s)
                .expect("listed")
                .1
                .push(grant.token);
            at = e;
        }
        if at < end {
            self.segments.insert(at, (end, vec![grant.token]));
        }
    }

    /// Takes `grant` off the segments over its range; a segment left with none goes.
    fn release(&mut self, grant: &Grant) {
        let Range { start, end } = grant.range;
        let inside: Vec<u64> = self.segments.range(start..end).map(|(&s, _)| s).collect();
        for s in inside {
            let tokens = &mut self.segments.get_mut(&s).expect("listed").1;
            tokens.retain(|&t| t != grant.token);
            if tokens.is_empty() {
                self.segments.remove(&s);
            }
        }
    }

    fn lease_holds(&self, session: Session, now: u64) -> bool {
        self.leases.get(&session).is_some_and(|&until| now < until)
    }

    fn live(&self, session: Session, now: u64) -> Result<(), LockError> {
        if self.lease_holds(session, now) {
            Ok(())
        } else {
            Err(LockError::Fenced(session))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: u64 = 1000;

    #[test]
    fn a_session_that_leaves_releases_its_locks_and_is_fenced() {
        let mut t = RangeLocks::new(LEASE);
        let (done, next) = (t.join(0), t.join(0));
        t.trylock(done, 0..4096, Mode::Exclusive, 1).unwrap();
        assert!(t.trylock(next, 0..512, Mode::Shared, 1).is_err());
        t.leave(done);
        assert_eq!(t.sessions(), 1);
        t.trylock(next, 0..512, Mode::Shared, 1).unwrap();
        assert!(matches!(
            t.trylock(done, 8192..8704, Mode::Shared, 1),
            Err(LockError::Fenced(_))
        ));
    }

    #[test]
    fn readers_share_a_writer_excludes() {
        let mut t = RangeLocks::new(LEASE);
        let (a, b) = (t.join(0), t.join(0));
        t.trylock(a, 0..4096, Mode::Shared, 1).unwrap();
        t.trylock(b, 1024..2048, Mode::Shared, 1).unwrap();
        let refused = t.trylock(b, 4000..8192, Mode::Exclusive, 1).unwrap_err();
        assert!(
            matches!(refused, LockError::Conflict(ref g) if g.session == a),
            "{refused}"
        );
        // Adjacent is not overlapping.
        t.trylock(b, 4096..8192, Mode::Exclusive, 1).unwrap();
    }

    #[test]
    fn a_paused_client_past_its_lease_is_fenced_and_its_locks_go_to_the_next() {
        let mut t = RangeLocks::new(LEASE);
        let (paused, next) = (t.join(0), t.join(0));
        let old = t.trylock(paused, 0..4096, Mode::Exclusive, 10).unwrap();
        t.heartbeat(next, 900).unwrap();
        // The paused client missed its heartbeat: at 1000 its lease is out, even before
        // `expire` runs, and the next client gets the range.
        let new = t.trylock(next, 0..4096, Mode::Exclusive, 1000).unwrap();
        assert!(new.token > old.token, "tokens only grow");
        assert_eq!(t.expire(1000), vec![paused]);
        // It wakes up: its write, heartbeat and locks are refused.
        assert_eq!(
            t.may_write(paused, 0..4096, 1001),
            Err(LockError::Fenced(paused))
        );
        assert_eq!(t.heartbeat(paused, 1001), Err(LockError::Fenced(paused)));
        assert!(t.trylock(paused, 8192..9000, Mode::Shared, 1001).is_err());
        assert_eq!(t.may_write(next, 0..4096, 1001), Ok(true));
        // Joining again is a new session, which holds nothing.
        let again = t.join(1002);
        assert_ne!(again, paused);
        assert!(t.held(again).is_empty());
    }

    #[test]
    fn a_write_needs_its_range_covered_by_exclusive_locks() {
        let mut t = RangeLocks::new(LEASE);
        let s = t.join(0);
        t.trylock(s, 0..4096, Mode::Exclusive, 1).unwrap();
        t.trylock(s, 4096..8192, Mode::Exclusive, 1).unwrap();
        let shared = t.trylock(s, 8192..12288, Mode::Shared, 1).unwrap();
        assert_eq!(
            t.may_write(s, 100..8000, 2),
            Ok(true),
            "two adjacent locks cover it"
        );
        assert_eq!(
            t.may_write(s, 100..9000, 2),
            Ok(false),
            "a shared lock does not"
        );
        t.unlock(s, shared.token, 2).unwrap();
        assert_eq!(
            t.unlock(s, shared.token, 2),
            Err(LockError::NotHeld(shared.token))
        );
    }
}
