//! Copying back to a returned brick the regions it missed, each as an interval of its own;
//! and rebuilding a replaced brick whole (`SharedVolume::rebuild`).

use super::*;
use crate::commit::run_interval;
use crate::segments::ClaimError;

/// Regions a flush copies back, at most, before its own interval: a brick that missed much
/// (a replaced one misses everything) is brought back over many flushes, not in one that
/// stalls its writer. `strata cluster rebuild` copies the rest without waiting for writes.
pub(super) const REGIONS_PER_FLUSH: usize = 16;

/// Regions a rebuild copies per round, between which it lets the host's writes in.
const REGIONS_PER_ROUND: usize = 64;

/// How a rebuild went.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// Regions copied by this rebuild.
    pub copied: u64,
    /// Regions copied meanwhile by other hosts (at their flushes).
    pub by_others: u64,
    /// Regions that were to be copied when it began.
    pub missing: u64,
}

impl SharedVolume {
    /// Regions still to be copied to bricks of this volume, as this host knows.
    pub fn missing_regions(&self) -> u64 {
        let rain = self.rain.lock().unwrap();
        (0..self.brick_count())
            .map(|b| rain.missing(b) as u64)
            .sum()
    }

    /// Copies to every brick that answers the regions it misses (a replaced brick: all of
    /// them), until none is left, telling `progress` (copied, of) after each round. A region
    /// whose segment another host holds waits until that host gives it back (it is asked
    /// to). Fails if no copy moves for the whole timeout: a brick that stays down, or a region
    /// no current copy of which answers.
    pub async fn rebuild(&self, progress: impl Fn(u64, u64)) -> Result<Rebuilt> {
        self.refresh_stale().await;
        let missing = self.missing_regions();
        let mut stuck_since = Instant::now();
        let mut last_left = missing;
        let copied_before = self.counters.regions_copied.load(Ordering::Relaxed);
        let mut by_others = 0;
        loop {
            {
                let _alone = self.alone().await;
                let mut state = self.state.lock().await;
                self.settle(&mut state).await;
                by_others += self.adopt_copied().await;
                self.copy_back(
                    &mut state,
                    REGIONS_PER_ROUND,
                    self.timeout.min(Duration::from_secs(2)),
                )
                .await;
            }
            let left = self.missing_regions();
            let copied = self.counters.regions_copied.load(Ordering::Relaxed) - copied_before;
            progress(copied + by_others, missing.max(copied + by_others + left));
            if left == 0 {
                return Ok(Rebuilt {
                    copied,
                    by_others,
                    missing,
                });
            }
            if left < last_left {
                last_left = left;
                stuck_since = Instant::now();
            } else if stuck_since.elapsed() > self.timeout {
                return Err(io_error(format!(
                    "volume {}: rebuild made no progress for {:?}; {left} regions left (is a brick down, or its set's other copy?)",
                    self.name, self.timeout
                )));
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Takes as copied the regions of bricks being copied to that etcd no longer records
    /// stale: another host copied them, under their segment's claim, and cleared them. Only
    /// for a rebuild, whose host writes nothing of its own: a serving host learns of them by
    /// copying them again. Returns how many.
    async fn adopt_copied(&self) -> u64 {
        let Ok(stale) = self.coord.stale(&self.name).await else {
            return 0;
        };
        let names = self.brick_names();
        let mut rain = self.rain.lock().unwrap();
        let mut adopted = 0;
        for (brick, name) in names.iter().enumerate() {
            // Only a brick seen back: one still down is not being copied to.
            if rain.is_down(brick) {
                continue;
            }
            for region in rain.returned(brick) {
                if !stale
                    .get(name)
                    .is_some_and(|recorded| recorded.contains(&region))
                {
                    rain.copied(brick, region);
                    adopted += 1;
                }
            }
        }
        adopted
    }

    /// The copying back a flush does before its interval: a few regions, none waited for.
    pub(super) async fn resync(&self, state: &mut State) {
        self.copy_back(state, REGIONS_PER_FLUSH, Duration::ZERO)
            .await
    }

    /// Copies back to each brick that was down and answers again up to `budget` regions it
    /// missed, from a current copy, each region as an interval on that brick alone, waiting
    /// up to `wait` for each region's segment.
    async fn copy_back(&self, state: &mut State, budget: usize, wait: Duration) {
        let mut budget = budget;
        for brick in 0..self.brick_count() {
            // A brick back but with regions left to copy (their segments were busy, or no
            // copy could be read) is tried again at every interval until it is in sync.
            let (in_sync, down) = {
                let rain = self.rain.lock().unwrap();
                (rain.in_sync(brick), rain.is_down(brick))
            };
            if in_sync || state.owed.contains_key(&brick) {
                continue;
            }
            let probe = IntervalId { client: 0, seq: 0 };
            if down && !self.answers(brick) {
                continue;
            }
            if down && self.brick(brick).status(probe).await.is_err() {
                self.unreachable(brick);
                continue;
            }
            if budget == 0 {
                return;
            }
            let regions = self.rain.lock().unwrap().returned(brick);
            let total = regions.len();
            let regions: Vec<u64> = regions.into_iter().take(budget).collect();
            budget -= regions.len();
            let name = &self.brick_name(brick);
            tracing::info!(volume = %self.name, brick = %name, regions = total, now = regions.len(), "brick is back: copying what it missed");
            let mut copied = BTreeSet::new();
            // Segments another host kept for the whole wait: its other regions are not
            // waited for again in this round.
            let mut busy: BTreeSet<u32> = BTreeSet::new();
            for (done, region) in regions.iter().enumerate() {
                *self.resyncing.lock().unwrap() = Some(Activity {
                    what: format!("copying back to {name} what it missed"),
                    done_bytes: done as u64 * self.unit,
                    // What it misses in all, of which this round copies the first.
                    total_bytes: total as u64 * self.unit,
                });
                let source = self.rain.lock().unwrap().source(brick, *region);
                let Some(source) = source else {
                    tracing::warn!(volume = %self.name, brick = %name, region, "no current copy reachable");
                    continue;
                };
                // The region is one stripe unit of the volume: its writer's segment must be
                // this host's, or the copy could overwrite that writer's newer data.
                let set = self.set_of(brick);
                let at = (region * self.sets.len() as u64 + set as u64) * self.unit;
                let segments = self
                    .claims
                    .segments_of(at, self.unit.min(self.geometry.size - at));
                if !busy.is_disjoint(&segments) {
                    continue;
                }
                let pin = match self.claims.acquire(&segments, wait).await {
                    Ok(pin) => pin,
                    Err(ClaimError::CatalogChanged(_)) => {
                        // Read again at this host's next write; its regions wait till then.
                        tracing::info!(volume = %self.name, "the volume's bricks changed: copying back waits");
                        break;
                    }
                    Err(error) => {
                        tracing::debug!(volume = %self.name, brick = %name, region, %error, "region left for later");
                        busy.extend(segments);
                        continue;
                    }
                };
                let offset = region * self.unit;
                let data = match self.brick(source).read(offset, self.unit as u32).await {
                    Ok(data) => data,
                    Err(error) => {
                        tracing::warn!(volume = %self.name, %error, "resync read failed");
                        continue;
                    }
                };
                let id = self.next_id(state);
                let tag = self.tag();
                let writes = BTreeMap::from([(brick, vec![(offset, data)])]);
                let outcome =
                    run_interval(&self.brick_clients(), id, writes, pin.fences(), tag).await;
                drop(pin);
                // A host waiting for the segment gets it now, between two copies: a rebuild
                // holding it from one region to the next would starve that host's writes.
                self.claims.release_wanted().await;
                if outcome.ended() {
                    self.rain.lock().unwrap().copied(brick, *region);
                    copied.insert(*region);
                    self.counters.regions_copied.fetch_add(1, Ordering::Relaxed);
                } else if outcome.silent.is_empty() && outcome.unacked.is_empty() {
                    // Refused (the brick holds another host's interval there undecided, say):
                    // the region waits for a later interval.
                    tracing::info!(volume = %self.name, brick = %name, region, refusals = ?outcome.refusals, "region copy refused: left for later");
                } else {
                    for &b in &outcome.unacked {
                        state
                            .owed
                            .entry(b)
                            .or_default()
                            .push((id, outcome.decision, tag));
                    }
                    tracing::warn!(volume = %self.name, brick = %name, "brick went away again during resync");
                    self.unreachable(brick);
                    let _ = self.rain.lock().unwrap().down(brick);
                    break;
                }
            }
            *self.resyncing.lock().unwrap() = None;
            let clear = self.coord.clear_stale(&self.name, name, &copied);
            if let Err(error) = self.within_lease("clearing copied regions", clear).await {
                // Harmless but for the next opener: it copies these again.
                tracing::warn!(volume = %self.name, %error, "copied regions not cleared in etcd");
            }
            tracing::info!(volume = %self.name, brick = %name, copied = copied.len(), of = regions.len(), "resync done");
        }
    }
}
