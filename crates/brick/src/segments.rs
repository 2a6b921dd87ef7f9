//! A host's claims on the lock segments of a shared volume: the right to write there.
//!
//! A volume is cut into lock segments (`segment_bytes`, in its catalog record). A host writes
//! a segment only while it holds the segment's claim in etcd (`Coord::claim`), one host at a
//! time. The claim is bound to the host's lease, so it goes with the host, and its create
//! revision is its **epoch**: every prepare carries the epochs of the segments it writes, and
//! a brick refuses an epoch older than one it has seen for the segment. A host that paused
//! past its lease and woke up still believing in its claims is refused there.
//!
//! Claims are taken on demand and kept while in use: an interval **pins** the segments it
//! writes from before its prepare until its end, and a lock holder pins the segments of its
//! locks until it unlocks. A host that finds a segment held says it **wants** it
//! (`Coord::want`); the holder watches the volume's wants and gives a wanted claim back as
//! soon as nothing pins it. Other claims are kept until idle for the linger time, so a host
//! that locks and unlocks over and over pays etcd nothing. Nothing is given back while the
//! host owes a brick a decision: until every interval it ran has ended everywhere, the next
//! holder's writes could land before its own.
//!
//! Each claim also carries the volume's version counter as its transaction read it: the host
//! tags what it writes from then on with at least that number (`version_floor`), so a write
//! that follows another host's through a segment never lands before a cut the other's was
//! already after.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strata_coord::claims::Claim;
use strata_coord::session::Session;
use strata_coord::wants::WantEvent;
use strata_coord::{Coord, CoordError};

/// Why segments could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Another host kept the segment for the whole wait.
    #[error("segment {segment} of volume {volume} is held by {holder} (epoch {epoch}); waited {waited:?}")]
    Busy {
        volume: String,
        segment: u32,
        holder: String,
        epoch: i64,
        waited: Duration,
    },
    /// This host's lease ran out, or may have: it holds nothing and must not write.
    #[error("{0}")]
    Fenced(String),
    /// etcd did not answer for the whole wait.
    #[error("{0}")]
    Unavailable(String),
    /// The volume's bricks changed (one was replaced) since this host read them: it must
    /// read the volume again before it claims anything more.
    #[error("the bricks of volume {0} changed since this host read them")]
    CatalogChanged(String),
    #[error("{0}")]
    Invalid(String),
}

struct Held {
    claim: Claim,
    pins: usize,
    idle_since: Instant,
}

pub struct SegmentClaims {
    coord: Coord,
    session: Session,
    volume: String,
    segment_bytes: u64,
    segments: u64,
    linger: Duration,
    held: Mutex<BTreeMap<u32, Held>>,
    /// Serializes claims and releases in etcd: a release racing a re-claim of the same
    /// segment would delete the claim the re-claim just found to be ours.
    etcd: tokio::sync::Mutex<()>,
    /// Set while the host owes a brick a decision: no claim is given back meanwhile.
    keep_all: AtomicBool,
    /// Segments other members want, and who.
    wanted: Mutex<BTreeSet<(u32, String)>>,
    /// Wakes the releaser: a wanted claim lost its last pin, or the host paid what it owed.
    nudge: tokio::sync::Notify,
    counters: ClaimCounters,
    /// The largest version counter any of this host's claims was taken under.
    version_floor: AtomicU64,
    /// The revision of the volume's record the host serves by: a claim under an older one
    /// is refused (`Coord::claim_under`).
    catalog: AtomicI64,
}

/// What claiming cost so far, for `strata status` and the benchmark.
#[derive(Debug, Default)]
pub struct ClaimCounters {
    pub claimed: std::sync::atomic::AtomicU64,
    pub released: std::sync::atomic::AtomicU64,
    pub waited: std::sync::atomic::AtomicU64,
}

/// Segments held for as long as this lives, with their epochs (the fences a prepare carries).
pub struct Pin {
    claims: Arc<SegmentClaims>,
    fences: Vec<(u32, i64)>,
}

impl Pin {
    /// `(segment, epoch)` for every segment pinned, in segment order.
    pub fn fences(&self) -> &[(u32, i64)] {
        &self.fences
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut held = self.claims.held.lock().unwrap();
        let now = Instant::now();
        let mut freed = false;
        for (segment, _) in &self.fences {
            if let Some(h) = held.get_mut(segment) {
                h.pins -= 1;
                h.idle_since = now;
                freed |= h.pins == 0;
            }
        }
        drop(held);
        if freed && !self.claims.wanted.lock().unwrap().is_empty() {
            self.claims.nudge.notify_one();
        }
    }
}

impl SegmentClaims {
    pub fn new(
        coord: Coord,
        session: Session,
        volume: &str,
        size_bytes: u64,
        segment_bytes: u64,
        linger: Duration,
        catalog: i64,
    ) -> Arc<SegmentClaims> {
        Arc::new(SegmentClaims {
            coord,
            session,
            volume: volume.to_string(),
            segment_bytes,
            segments: size_bytes.div_ceil(segment_bytes),
            linger,
            held: Mutex::new(BTreeMap::new()),
            etcd: tokio::sync::Mutex::new(()),
            keep_all: AtomicBool::new(false),
            wanted: Mutex::new(BTreeSet::new()),
            nudge: tokio::sync::Notify::new(),
            counters: ClaimCounters::default(),
            version_floor: AtomicU64::new(0),
            catalog: AtomicI64::new(catalog),
        })
    }

    /// The revision of the volume's record the host serves by.
    pub fn catalog(&self) -> i64 {
        self.catalog.load(Ordering::SeqCst)
    }

    /// The host now serves the volume by its record at `revision`.
    pub fn set_catalog(&self, revision: i64) {
        self.catalog.store(revision, Ordering::SeqCst);
    }

    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    pub fn counters(&self) -> &ClaimCounters {
        &self.counters
    }

    /// The segments `[offset, offset + len)` meets.
    pub fn segments_of(&self, offset: u64, len: u64) -> BTreeSet<u32> {
        if len == 0 {
            return BTreeSet::new();
        }
        let first = offset / self.segment_bytes;
        let last = (offset + len - 1) / self.segment_bytes;
        (first..=last).map(|s| s as u32).collect()
    }

    /// The largest version counter a claim of this host was taken under: every interval it
    /// commits from now on is tagged at least this.
    pub fn version_floor(&self) -> u64 {
        self.version_floor.load(Ordering::SeqCst)
    }

    /// The segments held now, with their epochs.
    pub fn held(&self) -> Vec<(u32, i64)> {
        let held = self.held.lock().unwrap();
        held.iter().map(|(&s, h)| (s, h.claim.epoch)).collect()
    }

    /// While set, no claim is given back (the host owes a brick a decision).
    pub fn keep_all(&self, keep: bool) {
        let was = self.keep_all.swap(keep, Ordering::SeqCst);
        if was && !keep {
            self.nudge.notify_one();
        }
    }

    /// Claims every segment of `segments` not yet held, waiting up to `wait` for other hosts
    /// to give theirs back, and pins them all.
    pub async fn acquire(
        self: &Arc<Self>,
        segments: &BTreeSet<u32>,
        wait: Duration,
    ) -> Result<Pin, ClaimError> {
        if let Some(&beyond) = segments.iter().find(|&&s| u64::from(s) >= self.segments) {
            return Err(ClaimError::Invalid(format!(
                "volume {} has {} lock segments; there is no segment {beyond}",
                self.volume, self.segments
            )));
        }
        let started = Instant::now();
        let mut asked = BTreeSet::new();
        let result = self
            .acquire_asking(segments, wait, started, &mut asked)
            .await;
        for segment in asked {
            // Only a hint, and bound to the lease: one left behind misleads nobody for long.
            let _ = self
                .coord
                .unwant(&self.session, &self.volume, segment)
                .await;
        }
        result
    }

    async fn acquire_asking(
        self: &Arc<Self>,
        segments: &BTreeSet<u32>,
        wait: Duration,
        started: Instant,
        asked: &mut BTreeSet<u32>,
    ) -> Result<Pin, ClaimError> {
        let mut pause = Duration::from_millis(2);
        loop {
            if !self.session.is_live() {
                return Err(ClaimError::Fenced(format!(
                    "volume {}: this host's lease ran out or could not be renewed in time; \
                     it holds no segment and must not write",
                    self.volume
                )));
            }
            if let Some(pin) = self.pin_if_held(segments) {
                return Ok(pin);
            }
            let blocked = {
                let _etcd = self.etcd.lock().await;
                self.claim_missing(segments).await?
            };
            match blocked {
                None => continue,
                Some(why) => {
                    if started.elapsed() >= wait {
                        return Err(why.into_error(self, started.elapsed()));
                    }
                    if let Blocked::Held { segment, .. } = why {
                        if asked.insert(segment) {
                            if let Err(error) =
                                self.coord.want(&self.session, &self.volume, segment).await
                            {
                                tracing::debug!(volume = %self.volume, segment, %error, "want not recorded");
                            }
                        }
                    }
                    self.counters.waited.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
            }
        }
    }

    fn pin_if_held(self: &Arc<Self>, segments: &BTreeSet<u32>) -> Option<Pin> {
        let mut held = self.held.lock().unwrap();
        if !segments.iter().all(|s| held.contains_key(s)) {
            return None;
        }
        let fences = segments
            .iter()
            .map(|s| {
                let h = held.get_mut(s).expect("checked");
                h.pins += 1;
                (*s, h.claim.epoch)
            })
            .collect();
        Some(Pin {
            claims: self.clone(),
            fences,
        })
    }

    /// Claims what is missing, in segment order; stops at the first segment another host
    /// holds (or etcd does not answer for), and says which.
    async fn claim_missing(&self, segments: &BTreeSet<u32>) -> Result<Option<Blocked>, ClaimError> {
        let missing: Vec<u32> = {
            let held = self.held.lock().unwrap();
            segments
                .iter()
                .copied()
                .filter(|s| !held.contains_key(s))
                .collect()
        };
        for segment in missing {
            let catalog = Some(self.catalog.load(Ordering::SeqCst));
            match (self.coord)
                .claim_under(&self.session, &self.volume, segment, catalog)
                .await
            {
                Ok(claim) => {
                    self.counters.claimed.fetch_add(1, Ordering::Relaxed);
                    // Before the claim can be pinned: the interval it carries reads the floor.
                    self.version_floor
                        .fetch_max(claim.version_at_claim, Ordering::SeqCst);
                    self.held.lock().unwrap().insert(
                        segment,
                        Held {
                            claim,
                            pins: 0,
                            idle_since: Instant::now(),
                        },
                    );
                }
                Err(CoordError::Held { holder, epoch, .. }) => {
                    return Ok(Some(Blocked::Held {
                        segment,
                        holder,
                        epoch,
                    }))
                }
                Err(CoordError::Unavailable { what, why }) => {
                    return Ok(Some(Blocked::Unavailable(format!(
                        "etcd unavailable while {what}: {why}"
                    ))))
                }
                Err(CoordError::Fenced(why)) => return Err(ClaimError::Fenced(why)),
                Err(CoordError::CatalogChanged { volume }) => {
                    return Err(ClaimError::CatalogChanged(volume))
                }
                Err(other) => return Err(ClaimError::Invalid(other.to_string())),
            }
        }
        Ok(None)
    }

    /// Gives back every claim unpinned and idle for the linger time (none while the host owes
    /// a decision). Returns how many went.
    pub async fn release_idle(&self) -> usize {
        self.release_where(|_, h| h.idle_since.elapsed() >= self.linger)
            .await
    }

    /// Gives back, at once, the claims other members want that nothing pins.
    pub async fn release_wanted(&self) -> usize {
        let wanted: BTreeSet<u32> = (self.wanted.lock().unwrap().iter())
            .map(|(segment, _)| *segment)
            .collect();
        if wanted.is_empty() {
            return 0;
        }
        self.release_where(|s, _| wanted.contains(&s)).await
    }

    fn take_in(&self, events: Vec<WantEvent>) {
        let mut wanted = self.wanted.lock().unwrap();
        for event in events {
            match event {
                WantEvent::Wanted { segment, member } if member != self.session.name() => {
                    wanted.insert((segment, member));
                }
                WantEvent::Withdrawn { segment, member } => {
                    wanted.remove(&(segment, member));
                }
                WantEvent::Wanted { .. } => {}
            }
        }
    }

    /// Follows the volume's wants until etcd closes the watch or fails.
    async fn follow_wants(&self) -> Result<(), CoordError> {
        let mut watch = self.coord.watch_wants(&self.volume).await?;
        let standing = self.coord.wanted(&self.volume).await?;
        self.wanted.lock().unwrap().clear();
        self.take_in(
            (standing.into_iter())
                .map(|(segment, member)| WantEvent::Wanted { segment, member })
                .collect(),
        );
        self.release_wanted().await;
        while let Some(events) = watch.next().await? {
            self.take_in(events);
            self.release_wanted().await;
        }
        Ok(())
    }

    async fn release_where(&self, wanted: impl Fn(u32, &Held) -> bool) -> usize {
        if self.keep_all.load(Ordering::SeqCst) {
            return 0;
        }
        let _etcd = self.etcd.lock().await;
        let idle: Vec<Claim> = {
            let mut held = self.held.lock().unwrap();
            let idle: Vec<u32> = held
                .iter()
                .filter(|(&s, h)| h.pins == 0 && wanted(s, h))
                .map(|(&s, _)| s)
                .collect();
            // Out of the map before the release: nothing pins a claim being given back.
            idle.iter()
                .map(|s| held.remove(s).expect("listed").claim)
                .collect()
        };
        let mut released = 0;
        for claim in idle {
            match self.coord.release(&claim).await {
                Ok(()) | Err(CoordError::Fenced(_)) => released += 1,
                // Maybe released, maybe not: forgotten here all the same. If it still stands,
                // the next claim of it by this session finds it and gets the same epoch; if it
                // went, believing in it would only get this host's prepares fenced.
                Err(error) => {
                    tracing::warn!(volume = %self.volume, segment = claim.segment, %error, "claim release unanswered");
                }
            }
        }
        self.counters
            .released
            .fetch_add(released as u64, Ordering::Relaxed);
        released
    }

    /// Gives back idle claims every half linger, and wanted ones as soon as nothing pins
    /// them, until the returned task is dropped.
    pub fn spawn_releaser(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let claims = Arc::downgrade(self);
        let period = (self.linger / 2).max(Duration::from_millis(10));
        tokio::spawn(async move {
            let Some(first) = claims.upgrade() else {
                return;
            };
            let watcher = {
                let claims = Arc::downgrade(&first);
                tokio::spawn(async move {
                    loop {
                        let Some(claims) = claims.upgrade() else {
                            return;
                        };
                        if let Err(error) = claims.follow_wants().await {
                            tracing::debug!(volume = %claims.volume, %error, "watch of wants lost");
                        }
                        drop(claims);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                })
            };
            drop(first);
            let _watcher = AbortOnDrop(watcher);
            loop {
                let Some(claims) = claims.upgrade() else {
                    return;
                };
                tokio::select! {
                    _ = tokio::time::sleep(period) => {
                        claims.release_idle().await;
                    }
                    _ = claims.nudge.notified() => {
                        claims.release_wanted().await;
                    }
                }
            }
        })
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

enum Blocked {
    Held {
        segment: u32,
        holder: String,
        epoch: i64,
    },
    Unavailable(String),
}

impl Blocked {
    fn into_error(self, claims: &SegmentClaims, waited: Duration) -> ClaimError {
        match self {
            Blocked::Held {
                segment,
                holder,
                epoch,
            } => ClaimError::Busy {
                volume: claims.volume.clone(),
                segment,
                holder,
                epoch,
                waited,
            },
            Blocked::Unavailable(why) => ClaimError::Unavailable(why),
        }
    }
}
