//! Which bricks other hosts found stale, as this host knows it. A host that writes with a
//! brick down records the regions that brick misses in etcd before its interval commits
//! (`Coord::mark_stale`); every other host must then stop reading them from that brick.
//!
//! Reading the records before every interval cost an etcd round trip each (0.9 ms of an
//! interval of about 6.5 ms with one writer). They are read instead:
//! - when the volume's stale mark moves: every marking rewrites it, and a watch follows it,
//!   so reads learn of a mark within a watch's delay, an idle host too;
//! - before the first interval after this host claimed a segment anew: the host it came from
//!   recorded what it missed before it gave the segment up, so the read after the claim sees
//!   it, however late the watch;
//! - before every interval while the watch is not set up (etcd unreachable, say), as before.

use std::sync::atomic::AtomicBool;
use std::sync::Weak;

use super::*;

/// How long a lost watch of the stale mark waits before it is set up again.
const REWATCH: Duration = Duration::from_millis(500);

#[derive(Default)]
pub(super) struct StaleView {
    /// A watch of the stale mark is set up, and the records were read after it was.
    watching: AtomicBool,
    /// The mark moved, or a read failed, since the records were last read.
    moved: AtomicBool,
    /// `SegmentClaims::counters().claimed` when the records were last read.
    claims_seen: AtomicU64,
    /// Reads of the records, for tests.
    reads: AtomicU64,
}

impl SharedVolume {
    /// Test-only: how many times this host has read the stale records.
    #[doc(hidden)]
    pub fn stale_reads(&self) -> u64 {
        self.stale.reads.load(Ordering::SeqCst)
    }

    /// Reads the stale records again if something since the last read may have changed them
    /// for this host (see the module's comment).
    pub(super) async fn refresh_stale_if_needed(&self) {
        let claimed = self.claims.counters().claimed.load(Ordering::SeqCst);
        let view = &self.stale;
        if view.watching.load(Ordering::SeqCst)
            && !view.moved.load(Ordering::SeqCst)
            && view.claims_seen.load(Ordering::SeqCst) == claimed
        {
            return;
        }
        self.refresh_stale().await;
    }

    /// Takes in what other hosts recorded as stale since this host last looked: it must not
    /// read those regions from those bricks either. Whether the records were read.
    pub(super) async fn refresh_stale(&self) -> bool {
        // Taken before the read: a claim or a mark that comes during it is read again later.
        let claimed = self.claims.counters().claimed.load(Ordering::SeqCst);
        self.stale.moved.store(false, Ordering::SeqCst);
        self.stale.reads.fetch_add(1, Ordering::SeqCst);
        let read = self.coord.stale(&self.name);
        match self
            .within_lease("reading which bricks are stale", read)
            .await
        {
            Ok(stale) => {
                let mut rain = self.rain.lock().unwrap();
                for (name, regions) in stale {
                    let Some(brick) = self.brick_names().iter().position(|b| *b == name) else {
                        continue;
                    };
                    if !rain.is_down(brick) && regions.iter().any(|&r| rain.is_current(brick, r)) {
                        tracing::warn!(volume = %self.name, brick = %name, "another host recorded this brick stale");
                        rain.restore(brick, regions);
                    }
                }
                self.stale.claims_seen.store(claimed, Ordering::SeqCst);
                true
            }
            Err(error) => {
                tracing::warn!(volume = %self.name, %error, "cannot read which bricks are stale");
                self.stale.moved.store(true, Ordering::SeqCst);
                false
            }
        }
    }

    /// Follows the volume's stale mark while the volume is open, reading the records each
    /// time it moves. Holds the volume only while it reads, so a volume dropped meanwhile
    /// goes.
    pub(super) fn follow_stale(self: &Arc<Self>) -> AbortOnDrop {
        let volume = Arc::downgrade(self);
        let (coord, name) = (self.coord.clone(), self.name.clone());
        AbortOnDrop(tokio::spawn(async move {
            loop {
                if let Ok(mut watch) = coord.watch_stale(&name).await {
                    // Read after the watch is set up: a mark made before is not missed.
                    if !refresh(&volume).await {
                        return;
                    }
                    while let Ok(Some(())) = watch.changed().await {
                        if !refresh(&volume).await {
                            return;
                        }
                    }
                }
                let Some(shared) = volume.upgrade() else {
                    return;
                };
                // Until the watch is back, every interval reads the records.
                shared.stale.watching.store(false, Ordering::SeqCst);
                drop(shared);
                tracing::debug!(volume = %name, "watch of the stale mark lost");
                tokio::time::sleep(REWATCH).await;
            }
        }))
    }
}

/// The mark moved (or the watch is new): reads the records. Once a read under the watch
/// has succeeded, intervals skip theirs. False once the volume is gone.
async fn refresh(volume: &Weak<SharedVolume>) -> bool {
    let Some(shared) = volume.upgrade() else {
        return false;
    };
    if shared.refresh_stale().await {
        shared.stale.watching.store(true, Ordering::SeqCst);
    }
    true
}
