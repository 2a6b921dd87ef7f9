//! Online rebuild onto a replacement member.
//!
//! `ReplaceMember` copies the metadata region onto the new device (under the mirror's copy
//! gate, so no commit slips between), starts its journal, records it as *rebuilding* with
//! checkpoint 0, and spawns the rebuild through the runtime. The rebuild walks the stripes
//! in batches of [`BATCH`] run concurrently; each stripe, under the gate and its stripe lock,
//! is read from every other member, XORed and written to the new one, and is marked rebuilt
//! in memory before the lock drops, so that writes from then on update the new member too.
//! Every [`CHECKPOINT_STRIPES`] stripes the new member is flushed and the checkpoint
//! committed; after a restart the rebuild resumes there (the stripes rebuilt past it are
//! simply rebuilt again).

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::join_all;
use strata_core::{poison, Activity, BlockError, DeviceRef, Member, Result, WriteFlags};

use super::array::Array;
use super::members::{MemberState, META_BYTES};
use super::plan::xor_into;

/// Stripes rebuilt concurrently.
pub const BATCH: u64 = 8;
/// Stripes between durable checkpoints.
pub const CHECKPOINT_STRIPES: u64 = 64;

impl Array {
    pub async fn replace_member(self: &Arc<Self>, index: usize, member: Member) -> Result<()> {
        let layout = self.layout();
        let n = layout.members;
        if index >= n {
            return Err(BlockError::InvalidArgument(format!(
                "raid5 {}: no member {index}",
                self.name
            )));
        }
        let state = self.members.lock()[index].state;
        if state != MemberState::Failed {
            return Err(BlockError::InvalidArgument(format!(
                "raid5 {}: member {index} is {state:?}; only a failed member can be replaced",
                self.name
            )));
        }
        let need = layout.data_start + layout.stripes * layout.chunk_bytes;
        let size = member.device.geometry().size;
        if size < need {
            return Err(BlockError::InvalidArgument(format!(
                "raid5 {}: replacement {} has {size} bytes, the array needs {need}",
                self.name, member.name
            )));
        }
        self.install(index, member.device).await?;
        self.spawn_rebuild(index);
        Ok(())
    }

    /// Rebuilds member `index` from its durable checkpoint to the end, as the array's
    /// background work: each batch of stripes (and the checkpoint after it) is one step, so
    /// a quiesce lets the batch under way finish and holds the next, and a stop (or the
    /// array being dropped) ends the rebuild there; the next open resumes it from its
    /// checkpoint.
    pub fn spawn_rebuild(self: &Arc<Self>, index: usize) {
        let weak = Arc::downgrade(self);
        self.background
            .spawn(self.runtime.as_ref(), move |worker| async move {
                let mut next = None;
                loop {
                    let step = worker.step().await;
                    let Some(array) = weak.upgrade() else { return };
                    let Some(_step) = step else {
                        array.clear_activity();
                        return;
                    };
                    match array.rebuild_batch(index, &mut next).await {
                        Ok(true) => continue,
                        Ok(false) => {}
                        Err(error) => {
                            tracing::error!(array = %array.name, member = index, %error, "raid5: rebuild stopped");
                        }
                    }
                    array.clear_activity();
                    return;
                }
            });
    }

    fn clear_activity(&self) {
        if let Ok(mut activity) =
            poison::check(self.activity.lock(), &self.name, "the rebuild progress")
        {
            *activity = None;
        }
    }

    /// Puts `device` in place of member `index` as a rebuilding member with checkpoint 0.
    async fn install(&self, index: usize, device: DeviceRef) -> Result<()> {
        {
            let _copy = self.members.copy_gate.write().await;
            let region = self.metadata_region().await?;
            device.write(0, region, WriteFlags { fua: true }).await?;
            self.members.set_device(index, device.clone());
            let mut table = self.members.lock();
            table[index].state = MemberState::Rebuilding;
            table[index].cursor = 0;
            table[index].extra.clear();
            table[index].durable = false;
        }
        // Records logged before the replacement may leave this member out (degraded updates)
        // or carry its pre-failure contents: replayed after it is back, the older ones would
        // overwrite what the rebuild derives. Emptying every journal (after a flush) retires
        // them all; the new member's journal starts in the same step.
        self.reset_journals().await?;
        self.array_record()?.states[index].1 = 0;
        self.persist().await?;
        tracing::info!(array = %self.name, member = index, "raid5: member replaced; rebuilding");
        Ok(())
    }

    /// The metadata region of an active member (a new member's first copy of it).
    pub(crate) async fn metadata_region(&self) -> Result<Bytes> {
        for m in 0..self.layout().members {
            if self.members.lock()[m].state != MemberState::Active {
                continue;
            }
            if let Ok(bytes) = self.m_read(m, 0, META_BYTES).await {
                return Ok(Bytes::from(bytes));
            }
        }
        Err(Array::io_error(format!(
            "raid5 {}: no member to copy metadata from",
            self.name
        )))
    }

    /// Rebuilds the next batch of member `index`'s stripes, from `next` (None: from its
    /// durable checkpoint), checkpointing when one is due; marks the member active once
    /// every stripe is rebuilt. Ok(false) when the rebuild is complete.
    async fn rebuild_batch(&self, index: usize, next: &mut Option<u64>) -> Result<bool> {
        let stripes = self.layout().stripes;
        let start = match *next {
            Some(start) => start,
            None => self.members.lock()[index].cursor,
        };
        if start >= stripes {
            {
                // A member failed after its last batch stays failed: never made active.
                let mut table = self.members.lock();
                if table[index].state != MemberState::Rebuilding {
                    return Err(Array::io_error(format!(
                        "raid5 {}: member {index} failed as its rebuild ended",
                        self.name
                    )));
                }
                table[index].state = MemberState::Active;
            }
            self.persist().await?;
            tracing::info!(array = %self.name, member = index, "raid5: rebuild complete");
            return Ok(false);
        }
        self.set_activity(index, start)?;
        let end = (start + BATCH).min(stripes);
        let steps = (start..end).map(|s| self.rebuild_stripe(index, s));
        for result in join_all(steps).await {
            result?;
        }
        {
            let mut table = self.members.lock();
            if table[index].state != MemberState::Rebuilding {
                return Err(Array::io_error(format!(
                    "raid5 {}: member {index} failed during its rebuild",
                    self.name
                )));
            }
            table[index].cursor = end;
            table[index].extra.retain(|&s| s >= end);
        }
        *next = Some(end);
        if end.is_multiple_of(CHECKPOINT_STRIPES) || end == stripes {
            self.checkpoint(index, end).await?;
        }
        Ok(true)
    }

    async fn checkpoint(&self, index: usize, cursor: u64) -> Result<()> {
        let flushed = match self.members.device(index) {
            Some(device) => device.flush().await.is_ok(),
            None => false,
        };
        if !flushed {
            self.fail_member(index).await?;
            return Err(Array::io_error(format!(
                "raid5 {}: replacement failed",
                self.name
            )));
        }
        self.array_record()?.states[index].1 = cursor;
        self.persist().await
    }

    async fn rebuild_stripe(&self, index: usize, stripe: u64) -> Result<()> {
        let _gate = self.gate.read().await;
        let _lock = self.lock_stripe(stripe).await;
        if self.members.lock()[index].state != MemberState::Rebuilding {
            return Ok(());
        }
        // During a (paused) grow each row is rebuilt in its own geometry; a row nothing reads,
        // or an old row on a member the old geometry does not have, holds nothing to rebuild.
        let Some(layout) = self
            .shape()
            .row_layout(stripe)
            .filter(|layout| index < layout.members)
        else {
            self.members.lock()[index].extra.insert(stripe);
            return Ok(());
        };
        let chunk = layout.chunk_bytes;
        let offset = layout.member_offset(stripe, 0);
        let sources = (0..layout.members).filter(|&m| m != index);
        let reads = join_all(sources.map(|m| self.m_read(m, offset, chunk))).await;
        let mut sum = vec![0u8; chunk as usize];
        for read in reads {
            match read {
                Ok(bytes) => xor_into(&mut sum, &bytes),
                Err(fault) => {
                    self.fail(fault).await?;
                    return Err(Array::io_error(format!(
                        "raid5 {}: rebuild source failed",
                        self.name
                    )));
                }
            }
        }
        if let Err(fault) = self.m_write(index, offset, Bytes::from(sum), false).await {
            self.fail(fault).await?;
            return Err(Array::io_error(format!(
                "raid5 {}: replacement write failed",
                self.name
            )));
        }
        self.members.lock()[index].extra.insert(stripe);
        Ok(())
    }

    fn set_activity(&self, index: usize, done: u64) -> Result<()> {
        let layout = self.layout();
        let bytes = layout.chunk_bytes;
        *poison::check(self.activity.lock(), &self.name, "the rebuild progress")? =
            Some(Activity {
                what: format!("rebuilding member {index}"),
                done_bytes: done * bytes,
                total_bytes: layout.stripes * bytes,
            });
        Ok(())
    }
}
