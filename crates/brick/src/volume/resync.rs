//! Copying back to a returned brick the regions it missed, each as an interval of its own.

use super::*;

impl SharedVolume {
    /// Copies back to each brick that was down and answers again the regions it missed, from
    /// a current copy, each region as an interval on that brick alone.
    pub(super) async fn resync(&self, state: &mut State) {
        for brick in 0..self.bricks.len() {
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
            if down && self.bricks[brick].status(probe).await.is_err() {
                self.unreachable(brick);
                continue;
            }
            let regions = self.rain.lock().unwrap().returned(brick);
            let name = &self.brick_names[brick];
            tracing::info!(volume = %self.name, brick = %name, regions = regions.len(), "brick is back: copying what it missed");
            let mut copied = BTreeSet::new();
            for (done, region) in regions.iter().enumerate() {
                *self.resyncing.lock().unwrap() = Some(Activity {
                    what: format!("copying back to {name} what it missed"),
                    done_bytes: done as u64 * self.unit,
                    total_bytes: regions.len() as u64 * self.unit,
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
                let pin = match self.claims.acquire(&segments, Duration::ZERO).await {
                    Ok(pin) => pin,
                    Err(error) => {
                        tracing::debug!(volume = %self.name, brick = %name, region, %error, "region left for later");
                        continue;
                    }
                };
                let offset = region * self.unit;
                let data = match self.bricks[source].read(offset, self.unit as u32).await {
                    Ok(data) => data,
                    Err(error) => {
                        tracing::warn!(volume = %self.name, %error, "resync read failed");
                        continue;
                    }
                };
                let id = self.next_id(state);
                let tag = self.tag();
                let writes = BTreeMap::from([(brick, vec![(offset, data)])]);
                let outcome = run_interval(&self.bricks, id, writes, pin.fences(), tag).await;
                drop(pin);
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
            if let Err(error) = self.coord.clear_stale(&self.name, name, &copied).await {
                // Harmless but for the next opener: it copies these again.
                tracing::warn!(volume = %self.name, %error, "copied regions not cleared in etcd");
            }
            tracing::info!(volume = %self.name, brick = %name, copied = copied.len(), of = regions.len(), "resync done");
        }
    }
}
