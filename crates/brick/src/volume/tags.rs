//! A host's side of the volume's versions (docs/shared-volumes.md, "Versions"): the tag each
//! of its intervals carries, and its acknowledgement of each version announced.
//!
//! Version `n` holds exactly the intervals tagged below `n`. A host tags an interval with the
//! newest number it has seen announced, or more if one of its claims was taken under a newer
//! counter (`SegmentClaims::version_floor`). Seeing `n` announced, it raises its tag first,
//! then takes the state lock to look: every interval that read the old tag was put in flight
//! under that lock, every later one reads the new. Once nothing it tagged below `n` is in
//! flight or owed to a brick, it says so in etcd. Writers never wait for any of this.

use std::sync::atomic::AtomicBool;
use std::sync::Weak;

use strata_coord::CoordError;

use super::*;

/// How often an acknowledgement held up by an owed decision looks again.
const RECHECK: Duration = Duration::from_millis(100);

/// How long a lost watch of the counter waits before it is set up again.
const REWATCH: Duration = Duration::from_millis(500);

pub(super) struct Tags {
    /// The newest version number this host has seen announced.
    announced: AtomicU64,
    /// The number this host last acknowledged in etcd.
    acked: Mutex<Option<u64>>,
    /// Test-only: acknowledge nothing, as a host that never finishes its older intervals.
    held: AtomicBool,
}

impl Tags {
    pub(super) fn new(announced: u64) -> Tags {
        Tags {
            announced: AtomicU64::new(announced),
            acked: Mutex::new(None),
            held: AtomicBool::new(false),
        }
    }
}

/// Whether `state` still owes a brick the decision of an interval tagged below `number`.
fn owes_before(state: &State, number: u64) -> bool {
    (state.owed.values().flatten()).any(|&(_, _, tag)| tag < number)
}

/// Whether an interval tagged below `number` is still in flight: its outcome is not known.
fn flying_before(state: &State, number: u64) -> bool {
    state.in_flight.values().any(|&tag| tag < number)
}

impl SharedVolume {
    /// The tag of an interval this host commits now.
    pub(super) fn tag(&self) -> u64 {
        (self.tags.announced.load(Ordering::SeqCst)).max(self.claims.version_floor())
    }

    /// The number this host last acknowledged, if any.
    pub fn acked_version(&self) -> Option<u64> {
        *self.tags.acked.lock().unwrap()
    }

    /// The tag of the last interval of this host's writes that committed: the versions
    /// numbered above it hold that interval, the others do not.
    pub async fn last_tag(&self) -> u64 {
        self.state.lock().await.last_tag
    }

    /// Test-only: stops (or resumes) acknowledging versions.
    #[doc(hidden)]
    pub fn hold_version_acks(&self, hold: bool) {
        self.tags.held.store(hold, Ordering::SeqCst);
    }

    /// Follows the volume's version counter, acknowledging each announcement, until the
    /// returned task is dropped (with the volume).
    pub(super) fn follow_versions(self: &Arc<Self>) -> AbortOnDrop {
        let volume = Arc::downgrade(self);
        let (coord, name) = (self.coord.clone(), self.name.clone());
        AbortOnDrop(tokio::spawn(async move {
            loop {
                if let Err(error) = follow(&volume, &coord, &name).await {
                    tracing::debug!(volume = %name, %error, "watch of the version counter lost");
                }
                if volume.strong_count() == 0 {
                    return;
                }
                tokio::time::sleep(REWATCH).await;
            }
        }))
    }
}

/// Takes in announcement `number`: new intervals are tagged with it, and once no interval
/// tagged below it is owed to a brick, the host acknowledges it. Holds the volume only while
/// it looks, so a volume dropped meanwhile goes.
async fn acknowledge(volume: &Weak<SharedVolume>, number: u64) {
    {
        let Some(shared) = volume.upgrade() else {
            return;
        };
        shared.tags.announced.fetch_max(number, Ordering::SeqCst);
        // 0 is no version: nothing to acknowledge.
        if number == 0 || shared.acked_version().is_some_and(|acked| acked >= number) {
            return;
        }
    }
    loop {
        let Some(shared) = volume.upgrade() else {
            return;
        };
        if !shared.session.is_live() {
            return;
        }
        if !shared.tags.held.load(Ordering::SeqCst) {
            if owes_before(&*shared.state.lock().await, number) {
                // An idle host has no flush to deliver what it owes: this does, with no
                // interval in flight (the gate is taken before the state lock).
                let _alone = shared.alone().await;
                let mut state = shared.state.lock().await;
                shared.settle(&mut state).await;
                shared.claims.keep_all(!state.owed.is_empty());
            }
            let state = shared.state.lock().await;
            if !owes_before(&state, number) && !flying_before(&state, number) {
                break;
            }
        }
        drop(shared);
        tokio::time::sleep(RECHECK).await;
    }
    loop {
        let Some(shared) = volume.upgrade() else {
            return;
        };
        let previous = shared.acked_version();
        match (shared.coord)
            .ack_version(&shared.session, &shared.name, number, previous)
            .await
        {
            Ok(()) => {
                let mut acked = shared.tags.acked.lock().unwrap();
                *acked = Some(acked.unwrap_or(0).max(number));
                tracing::info!(volume = %shared.name, number, "version acknowledged");
                return;
            }
            Err(CoordError::Fenced(why)) => {
                tracing::warn!(volume = %shared.name, number, %why, "version not acknowledged");
                return;
            }
            Err(error) => {
                tracing::warn!(volume = %shared.name, number, %error, "acknowledging a version failed; trying again");
            }
        }
        drop(shared);
        tokio::time::sleep(RECHECK).await;
    }
}

/// Watches the counter, reads where it stands (it may have moved before the watch), and takes
/// in each value, newest first, until the watch ends or the volume is gone.
async fn follow(
    volume: &Weak<SharedVolume>,
    coord: &Coord,
    name: &str,
) -> std::result::Result<(), CoordError> {
    let mut watch = coord.watch_version(name).await?;
    let mut newest = coord.version(name).await?;
    loop {
        if volume.strong_count() == 0 {
            return Ok(());
        }
        acknowledge(volume, newest).await;
        match watch.next().await? {
            Some(number) => newest = newest.max(number),
            None => return Ok(()),
        }
    }
}
