//! Following the volume's record while serving it: a brick replaced (`strata cluster
//! replace-brick`) takes the old one's place here, as soon as a watch of the record says so,
//! and at the latest at this host's next segment claim.
//!
//! Why the claim is what makes it safe: every write stands on claims, and a claim made under
//! an older record is refused (`Coord::claim_under`). A host that still writes by the old
//! record does so only under claims it took before the replacement; a region is copied to the
//! new brick only under its segment's claim, so after those writes. The new brick therefore
//! misses nothing that its stale record does not name.
//!
//! Why the watch as well: a host that owes a failed brick a decision keeps every claim it
//! holds (`segments`), so it would never claim again, and the copy to the new brick would
//! wait on it for ever. Taking the replacement in drops the debt, and the claims go back.

use super::*;
use crate::segments::ClaimError;

/// How many replacements one claim follows before it gives up.
const RELOADS: usize = 4;

/// How long after a lost watch of the record it is watched again.
const REWATCH: Duration = Duration::from_secs(1);

impl SharedVolume {
    /// Claims and pins `segments`, waiting up to `wait` for other hosts; reads the volume
    /// again whenever its bricks changed.
    pub(super) async fn pin(&self, segments: &BTreeSet<u32>, wait: Duration) -> Result<Pin> {
        let mut reloads = 0;
        loop {
            match self.claims.acquire(segments, wait).await {
                Err(ClaimError::CatalogChanged(_)) if reloads < RELOADS => {
                    reloads += 1;
                    self.reload().await?;
                }
                other => return other.map_err(|e| io_error(format!("volume {}: {e}", self.name))),
            }
        }
    }

    /// Watches the volume's record, and reads the volume again whenever the record moved
    /// past the one this host serves by. Holds the volume only while it reads, so a volume
    /// dropped meanwhile goes.
    pub(super) fn follow_catalog(self: &Arc<Self>) -> AbortOnDrop {
        let volume = Arc::downgrade(self);
        let (coord, name) = (self.coord.clone(), self.name.clone());
        AbortOnDrop(tokio::spawn(async move {
            loop {
                if let Ok(mut watch) = coord.watch_volume(&name).await {
                    loop {
                        // First after the watch is set up: a change made before is not missed.
                        let moved = match coord.volume(&name).await {
                            Ok(stored) => volume
                                .upgrade()
                                .is_some_and(|v| v.claims.catalog() != stored.revision),
                            Err(_) => false,
                        };
                        if moved {
                            let Some(shared) = volume.upgrade() else {
                                return;
                            };
                            if let Err(error) = shared.reload().await {
                                tracing::warn!(volume = %name, %error, "the volume's record changed and cannot be read again");
                            }
                        }
                        match watch.changed().await {
                            Ok(Some(())) => continue,
                            _ => break,
                        }
                    }
                }
                if volume.strong_count() == 0 {
                    return;
                }
                tokio::time::sleep(REWATCH).await;
            }
        }))
    }

    /// Reads the volume's record again and takes in each brick replaced since: it is written
    /// to from now on, read only where its stale record says it was copied to, and owed
    /// nothing the old brick was.
    pub(super) async fn reload(&self) -> Result<()> {
        let fail = |e: strata_coord::CoordError| {
            io_error(format!(
                "volume {}: reading it again after its bricks changed: {e}",
                self.name
            ))
        };
        let stored = self.coord.volume(&self.name).await.map_err(fail)?;
        let record = &stored.record;
        let names: Vec<String> = record.bricks().cloned().collect();
        if record.mirror_sets.len() != self.sets.len()
            || names.len() != self.brick_count()
            || record.unit_bytes != self.unit
            || record.size_bytes != self.geometry.size
        {
            return Err(io_error(format!(
                "volume {}: its layout changed beyond a replaced brick; open it again",
                self.name
            )));
        }
        let catalog = self.coord.bricks().await.map_err(fail)?;
        let stale = self.coord.stale(&self.name).await.map_err(fail)?;
        // No interval is planned or in flight meanwhile: each sees the old brick or the new,
        // whole.
        let _alone = self.alone().await;
        let mut state = self.state.lock().await;
        for (index, (was, now)) in self.brick_names().iter().zip(&names).enumerate() {
            if was == now {
                continue;
            }
            let brick = (catalog.iter())
                .find(|b| &b.record.name == now)
                .ok_or_else(|| {
                    io_error(format!(
                        "brick {now} of volume {} is not in the catalog",
                        self.name
                    ))
                })?;
            let client = BrickClient::new(&brick.record.address, self.timeout)
                .map_err(|e| io_error(format!("volume {}: {e}", self.name)))?;
            self.bricks.lock().unwrap()[index] = client;
            self.brick_names.lock().unwrap()[index] = now.clone();
            // Decisions owed to the old brick go with it: it is out of the volume.
            state.owed.remove(&index);
            self.reach[index].lock().unwrap().replaced();
            let missing = stale.get(now).cloned().unwrap_or_default();
            tracing::warn!(volume = %self.name, old = %was, new = %now, missing = missing.len(), "brick replaced: the new one is written to, and read where copied to");
            self.rain.lock().unwrap().restore(index, missing);
        }
        self.claims.set_catalog(stored.revision);
        // The debt that kept every claim may have gone with the old brick.
        self.claims.keep_all(!state.owed.is_empty());
        Ok(())
    }
}
