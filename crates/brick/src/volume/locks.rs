//! Byte-range locks for lock-aware programs on this host: a lock first claims its segments
//! for the host (`crate::segments`), then waits for the host's own conflicting locks; an
//! unlock commits what is pending first, so a range passes on only with its writes in place.

use super::*;

/// A holder of byte-range locks on this host: a thread, a connection, a test client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockOwner(strata_cluster::locks::Session);

/// A byte-range lock held; give it back with [`SharedVolume::unlock`].
pub struct RangeLock {
    owner: LockOwner,
    token: u64,
    range: Range<u64>,
    pin: Pin,
}

impl RangeLock {
    pub fn range(&self) -> Range<u64> {
        self.range.clone()
    }

    /// The fencing token of the local grant.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// `(segment, epoch)` of the segment claims the lock stands on.
    pub fn fences(&self) -> &[(u32, i64)] {
        self.pin.fences()
    }
}

impl SharedVolume {
    /// A new holder of byte-range locks on this host.
    pub fn lock_owner(&self) -> LockOwner {
        LockOwner(self.locks.lock().unwrap().join(0))
    }

    /// Locks `[offset, offset + len)` for `owner`: first the segments it meets are claimed
    /// for this host (waiting for other hosts to give them back), then this host's own
    /// conflicting locks are waited for. Fails with a message naming the holder after the
    /// volume's timeout. Shared locks share only within a host: across hosts a segment has
    /// one holder at a time.
    pub async fn lock(
        &self,
        owner: LockOwner,
        offset: u64,
        len: u64,
        mode: Mode,
    ) -> Result<RangeLock> {
        self.check(offset, len)?;
        let deadline = Instant::now() + self.timeout;
        let segments = self.claims.segments_of(offset, len);
        let pin = self.pin(&segments, self.timeout).await?;
        let range = offset..offset + len;
        loop {
            // Registered before the attempt, so an unlock between the two is not missed.
            let notified = self.unlocked.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let attempt = self
                .locks
                .lock()
                .unwrap()
                .trylock(owner.0, range.clone(), mode, 0);
            match attempt {
                Ok(grant) => {
                    return Ok(RangeLock {
                        owner,
                        token: grant.token,
                        range,
                        pin,
                    })
                }
                Err(strata_cluster::locks::LockError::Conflict(holder)) => {
                    if Instant::now() >= deadline {
                        return Err(io_error(format!(
                            "volume {}: [{}, {}) is locked on this host by {:?} (token {}); \
                             waited {:?}",
                            self.name,
                            holder.range.start,
                            holder.range.end,
                            holder.session,
                            holder.token,
                            self.timeout
                        )));
                    }
                }
                Err(other) => return Err(BlockError::InvalidArgument(other.to_string())),
            }
            let _ = tokio::time::timeout_at(deadline.into(), notified).await;
        }
    }

    /// Gives a lock back. What this host has pending is committed first, and the commits of
    /// its intervals over the range land: a range passes to the next holder, here or on
    /// another host, only with its writes in place. If that
    /// commit fails, its error is returned and the lock is released all the same; the
    /// segments under the uncommitted writes stay this host's until they are committed.
    pub async fn unlock(&self, lock: RangeLock) -> Result<()> {
        let committed = self.flush().await;
        // A range passes on only once the commits of the intervals over it have landed.
        self.flights.clear_of(lock.range()).await;
        let RangeLock {
            owner, token, pin, ..
        } = lock;
        let released = self.locks.lock().unwrap().unlock(owner.0, token, 0);
        self.unlocked.notify_waiters();
        // A segment another host wants goes back once this was its last pin; the others stay
        // this host's, so the next lock here costs no etcd round trip.
        drop(pin);
        released.map_err(|e| BlockError::InvalidArgument(e.to_string()))?;
        committed
    }
}

/// A lock a holder took through a stack (`Control::Lock`): given back by its `unlock`.
struct StackLock {
    volume: Arc<SharedVolume>,
    holder: LockHolder,
    lock: RangeLock,
    exclusive: bool,
}

#[strata_core::async_trait]
impl LockPart for StackLock {
    async fn unlock(self: Box<Self>) -> Result<()> {
        let StackLock {
            volume,
            holder,
            lock,
            ..
        } = *self;
        let released = volume.unlock(lock).await;
        volume.holder_done(holder);
        released
    }

    fn describe(&self) -> String {
        let range = self.lock.range();
        format!(
            "volume {}: [{}, {}) {}",
            self.volume.name,
            range.start,
            range.end,
            if self.exclusive {
                "exclusive"
            } else {
                "shared"
            }
        )
    }
}

impl SharedVolume {
    /// Takes `request` for its holder: each holder is one owner in this host's lock table,
    /// so two holders exclude each other and one holder's locks may overlap.
    pub(super) async fn lock_for(self: Arc<Self>, request: LockRequest) -> Result<HeldLock> {
        let owner = {
            let mut holders = self.holders.lock().unwrap();
            let entry = holders
                .entry(request.holder)
                .or_insert_with(|| (self.lock_owner(), 0));
            entry.1 += 1;
            entry.0
        };
        let mode = if request.exclusive {
            Mode::Exclusive
        } else {
            Mode::Shared
        };
        match self.lock(owner, request.offset, request.len, mode).await {
            Ok(lock) => Ok(HeldLock::new(Box::new(StackLock {
                volume: self,
                holder: request.holder,
                lock,
                exclusive: request.exclusive,
            }))),
            Err(error) => {
                self.holder_done(request.holder);
                Err(error)
            }
        }
    }

    /// One lock fewer for `holder`: at its last, it leaves this host's lock table, so lock
    /// sessions that come and go (one per `strata lock`) leave nothing behind.
    fn holder_done(&self, holder: LockHolder) {
        let mut holders = self.holders.lock().unwrap();
        let Some((owner, held)) = holders.get_mut(&holder) else {
            return;
        };
        *held -= 1;
        if *held == 0 {
            let owner = *owner;
            holders.remove(&holder);
            self.locks.lock().unwrap().leave(owner.0);
        }
    }

    /// Lock holders this host's table keeps (sessions of `lock_owner` and of holders
    /// locking through a stack).
    pub fn lock_sessions(&self) -> usize {
        self.locks.lock().unwrap().sessions()
    }
}
