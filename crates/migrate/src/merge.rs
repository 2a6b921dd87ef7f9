//! The background merger (§2.2 of the digest): a chunk split over two devices by migrations
//! is brought back to one, so that its second slot is free for future migrations.
//!
//! Which chunks: those with two locations that are not in the candidate list (inactive: the
//! paper leaves "inactive" unspecified). Which way: toward the location holding more valid
//! blocks (fewer blocks to move; ties toward the first). The minority's valid blocks are
//! read, written at the same positions of the majority's slot, and one transaction moves
//! their bits and drops the minority location; its slot is reused once that is durable.

use std::sync::Arc;

use crate::migrate::Migrate;
use crate::records::{self, Entry};
use crate::shape::BLOCK;

impl Migrate {
    /// Merges up to `limit` inactive partial chunks (all partial chunks if `everything`);
    /// answers how many it merged.
    pub async fn merge_partial(&self, limit: u64, everything: bool) -> strata_core::Result<u64> {
        let partial: Vec<u64> = self.store.read(|state| {
            records::entries(state, &self.ids)
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, e)| e.locations[1].is_some())
                .map(|(chunk, _)| chunk)
                .collect()
        });
        let mut merged = 0;
        for chunk in partial {
            if merged == limit {
                break;
            }
            let active = self.policy_state()?.candidates.contains(chunk);
            if active && !everything {
                continue;
            }
            if self.merge_chunk(chunk).await? {
                merged += 1;
            }
        }
        Ok(merged)
    }

    async fn merge_chunk(&self, chunk: u64) -> strata_core::Result<bool> {
        let _alone = self.locks.write_range(chunk..chunk + 1).await;
        self.changed(chunk);
        let entry = self.entry(chunk);
        let (Some(a), Some(b)) = (entry.locations[0], entry.locations[1]) else {
            return Ok(false); // merged or emptied meanwhile
        };
        let (keep, gone) = if b.valid.count_ones() > a.valid.count_ones() {
            (1, 0)
        } else {
            (0, 1)
        };
        let (target, source) = (
            entry.locations[keep].unwrap(),
            entry.locations[gone].unwrap(),
        );
        let max_io = |d: usize| u64::from(self.children[d].geometry().max_io);
        let run_max = (max_io(source.device).min(max_io(target.device)) / BLOCK).max(1);
        let mut index = 0;
        while index < self.shape.chunk_blocks {
            if source.valid >> index & 1 == 0 {
                index += 1;
                continue;
            }
            // A run of valid blocks, no longer than either child takes in one request.
            let mut end = index;
            while end < self.shape.chunk_blocks
                && end - index < run_max
                && source.valid >> end & 1 == 1
            {
                end += 1;
            }
            let at = self.shape.offset(source.device, source.slot, index);
            let data = self.children[source.device]
                .read(at, ((end - index) * BLOCK) as usize)
                .await?;
            let to = self.shape.offset(target.device, target.slot, index);
            self.children[target.device]
                .write(to, data.freeze(), strata_core::WriteFlags::default())
                .await?;
            index = end;
        }
        let mut updated = Entry::default();
        let mut kept = target;
        kept.valid |= source.valid;
        updated.locations[0] = Some(kept);
        updated.locations[1] = Some(records::Location { valid: 0, ..source });
        self.put_entry(chunk, updated)?;
        self.bump(&self.counters.merges, 1);
        self.bump(
            &self.counters.merged_blocks,
            u64::from(source.valid.count_ones()),
        );
        Ok(true)
    }

    /// The merger task: every `merge-interval`, merge up to 16 inactive partial chunks.
    pub(crate) fn spawn_merger(self: &Arc<Self>) {
        let Some(interval) = self.settings.merge_interval else {
            return;
        };
        let layer = Arc::downgrade(self);
        let runtime = self.settings.runtime.clone();
        self.background
            .spawn(runtime.clone().as_ref(), |worker| async move {
                loop {
                    if !worker.sleep(runtime.as_ref(), interval).await {
                        return;
                    }
                    let Some(_step) = worker.step().await else {
                        return;
                    };
                    let Some(layer) = layer.upgrade() else { return };
                    if let Err(error) = layer.merge_partial(16, false).await {
                        tracing::warn!(migrate = %layer.name, %error, "background merge failed; retrying later");
                    }
                }
            });
    }
}
