//! Byte-range locks through a stack of layers (Orchestra's locks, RIBD's lock layer): a lock
//! asked of the top device (`Control::Lock`) is carried down through each layer's map of
//! the range to the devices that hold locks (a shared volume), and comes back as one
//! [`HeldLock`] made of their parts.
//!
//! Which layers pass a lock: filters (the range is the child's), `slice` (shifted), `concat`
//! and `stripe` (cut over their children), `mirror` (every leg), `crypt` (its data area).
//! Layers whose map changes as they write (a thin pool, raid5's parity, a staging log, a
//! migrating device) refuse: a range above them is not a fixed range below.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use crate::{BlockDevice, Control, ControlReply, Result};

/// Who holds locks: two holders conflict where their ranges overlap and either is
/// exclusive; one holder's own locks never conflict with each other. A lock session (a
/// client of the admin socket, a program linked with Strata) is one holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockHolder(pub u64);

impl LockHolder {
    /// A holder no other in this process is.
    pub fn new() -> LockHolder {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        LockHolder(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl Default for LockHolder {
    fn default() -> Self {
        LockHolder::new()
    }
}

/// What `Control::Lock` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRequest {
    pub holder: LockHolder,
    pub offset: u64,
    pub len: u64,
    /// Exclusive (a writer) or shared (readers).
    pub exclusive: bool,
}

impl LockRequest {
    /// The same lock over `range` of a child.
    pub fn moved_to(&self, range: Range<u64>) -> LockRequest {
        LockRequest {
            offset: range.start,
            len: range.end - range.start,
            ..self.clone()
        }
    }
}

/// One device's lock, as the device that holds it gives it back.
#[async_trait]
pub trait LockPart: Send + Sync {
    /// Releases the lock. The device may first make what the lock covered durable and
    /// visible to the next holder (a shared volume commits what its host has pending).
    async fn unlock(self: Box<Self>) -> Result<()>;

    /// Where it is held, for messages ("volume v: [0, 4096) exclusive").
    fn describe(&self) -> String;
}

/// A lock held through a stack: the parts its layers' maps cut it into, in the order they
/// were taken. It must be given back with [`HeldLock::unlock`]: dropped, its parts stay held
/// until their devices end (a lock session unlocks what it holds when its client goes).
#[must_use = "a lock is held until unlocked"]
pub struct HeldLock {
    parts: Vec<Box<dyn LockPart>>,
}

impl HeldLock {
    pub fn new(part: Box<dyn LockPart>) -> HeldLock {
        HeldLock { parts: vec![part] }
    }

    /// The locks of several children as one.
    pub fn combine(locks: Vec<HeldLock>) -> HeldLock {
        HeldLock {
            parts: locks.into_iter().flat_map(|lock| lock.parts).collect(),
        }
    }

    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    pub fn describe(&self) -> Vec<String> {
        self.parts.iter().map(|part| part.describe()).collect()
    }

    /// Releases every part, last taken first. Every part is released even if one fails; the
    /// first failure is returned.
    pub async fn unlock(self) -> Result<()> {
        let mut first = Ok(());
        for part in self.parts.into_iter().rev() {
            let released = part.unlock().await;
            if first.is_ok() {
                first = released;
            }
        }
        first
    }
}

impl std::fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.describe()).finish()
    }
}

/// Takes `request` on `device` (`Control::Lock`).
pub async fn lock<D: BlockDevice + ?Sized>(device: &D, request: LockRequest) -> Result<HeldLock> {
    match device.control(Control::Lock(request)).await? {
        ControlReply::Lock(held) => Ok(held),
        other => Err(crate::BlockError::InvalidArgument(format!(
            "a lock was answered with {other:?}"
        ))),
    }
}

/// Takes the lock on each `(child, range)` in order, as one lock: on the first refusal the
/// parts already taken are released and the refusal returned. Layers cut a lock with this,
/// always in their children's order, so two holders locking through the same stack take
/// the parts in the same order and cannot deadlock on each other.
pub async fn lock_children<'a>(
    request: &LockRequest,
    pieces: impl IntoIterator<Item = (&'a crate::DeviceRef, Range<u64>)>,
) -> Result<HeldLock> {
    let mut held = Vec::new();
    for (child, range) in pieces {
        match lock(child.as_ref(), request.moved_to(range)).await {
            Ok(lock) => held.push(lock),
            Err(error) => {
                // The refusal is what the caller must see; a part that fails to release
                // (a shared volume whose commit failed) has logged why itself.
                let _ = HeldLock::combine(held).unlock().await;
                return Err(error);
            }
        }
    }
    Ok(HeldLock::combine(held))
}

/// Merges the pieces a map cut a range into to one covering range per child, in child
/// order: a child is locked once, over the smallest range holding all its pieces (a stripe
/// cuts a range into many small pieces per member; locking their hull locks a little more
/// than written, never less).
pub fn hull_per_child(
    pieces: impl IntoIterator<Item = (usize, Range<u64>)>,
) -> Vec<(usize, Range<u64>)> {
    let mut hulls: std::collections::BTreeMap<usize, Range<u64>> = Default::default();
    for (child, range) in pieces {
        if range.is_empty() {
            continue;
        }
        hulls
            .entry(child)
            .and_modify(|hull| {
                hull.start = hull.start.min(range.start);
                hull.end = hull.end.max(range.end);
            })
            .or_insert(range);
    }
    hulls.into_iter().collect()
}

/// What a [`LockRecorder`] saw: a lock taken or released over `range`.
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockEvent {
    pub device: String,
    pub taken: bool,
    pub holder: LockHolder,
    pub range: Range<u64>,
    pub exclusive: bool,
}

/// Test support: a device over `next` that holds locks by recording them, so the tests of
/// each layer see the ranges its map sends down. With `refuse`, it refuses every lock.
#[doc(hidden)]
pub struct LockRecorder {
    pub name: String,
    pub next: crate::DeviceRef,
    pub log: std::sync::Arc<std::sync::Mutex<Vec<LockEvent>>>,
    pub refuse: bool,
}

struct RecordedLock {
    log: std::sync::Arc<std::sync::Mutex<Vec<LockEvent>>>,
    event: LockEvent,
}

#[async_trait]
impl LockPart for RecordedLock {
    async fn unlock(self: Box<Self>) -> Result<()> {
        let event = LockEvent {
            taken: false,
            ..self.event.clone()
        };
        self.log.lock().unwrap().push(event);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("{}: {:?}", self.event.device, self.event.range)
    }
}

#[async_trait]
impl crate::Filter for LockRecorder {
    fn next(&self) -> &crate::DeviceRef {
        &self.next
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        let Control::Lock(request) = request else {
            return self.next.control(request).await;
        };
        if self.refuse {
            return Err(crate::BlockError::InvalidArgument(format!(
                "{} refuses locks",
                self.name
            )));
        }
        let event = LockEvent {
            device: self.name.clone(),
            taken: true,
            holder: request.holder,
            range: request.offset..request.offset + request.len,
            exclusive: request.exclusive,
        };
        self.log.lock().unwrap().push(event.clone());
        Ok(ControlReply::Lock(HeldLock::new(Box::new(RecordedLock {
            log: self.log.clone(),
            event,
        }))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_child_is_locked_once_over_the_hull_of_its_pieces() {
        let pieces = vec![(1, 10..20), (0, 0..5), (1, 40..50), (0, 8..9), (2, 7..7)];
        assert_eq!(hull_per_child(pieces), vec![(0, 0..9), (1, 10..50)]);
    }

    #[test]
    fn holders_are_distinct() {
        assert_ne!(LockHolder::new(), LockHolder::new());
    }
}
