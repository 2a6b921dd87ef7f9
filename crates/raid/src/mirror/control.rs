//! Control calls: describe the mirror, add a member, replace one, fail one.
//!
//! A new member gets a zeroed metadata region (no stale superblock or journal of an earlier
//! life can ever be mistaken for this mirror's), joins the metadata fanout, receives two full
//! checkpoints (so both superblock copies are valid on it), and is recorded as resyncing from
//! byte 0 — all durable before the call returns. The copy itself runs in the background.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use strata_core::layer;
use strata_core::lock::{self, HeldLock, LockRequest};
use strata_core::ByteSize;
use strata_core::{
    BlockError, Control, ControlReply, DeviceRef, Health, Member, NodeStatus, Result, WriteFlags,
};
use strata_meta::TxnClass;

use super::policy::{percent, MemberState, MirrorRecord};
use super::state::{Inner, Slot};
use super::MirrorConfig;

impl Inner {
    pub async fn control(self: &Arc<Self>, request: Control) -> Result<ControlReply> {
        if let Some(reply) = self.background.control(&request).await {
            return Ok(reply);
        }
        match request {
            Control::Describe => Ok(ControlReply::Describe(self.describe().await?)),
            Control::AddMember(member) => {
                self.add_member(None, member).await?;
                Ok(ControlReply::Done)
            }
            Control::ReplaceMember { index, member } => {
                self.add_member(Some(index), member).await?;
                Ok(ControlReply::Done)
            }
            Control::FailMember { index } => {
                self.check_can_fail(index)?;
                self.mark_faulty(index, "failed by the operator").await?;
                Ok(ControlReply::Done)
            }
            Control::Lock(request) => Ok(ControlReply::Lock(self.lock(request).await?)),
            _ => Err(BlockError::Unsupported("mirror: control")),
        }
    }

    /// Locks the range on every member that is written to (in sync or resyncing), past their
    /// metadata region; a faulty member is written nothing, so it holds nothing to lock.
    async fn lock(&self, request: LockRequest) -> Result<HeldLock> {
        self.geometry.check_range(request.offset, request.len)?;
        let start = self.data_offset + request.offset;
        let members: Vec<DeviceRef> = self
            .slots_read()?
            .iter()
            .filter(|slot| slot.state != MemberState::Faulty)
            .filter_map(|slot| slot.device.clone())
            .collect();
        let range = start..start + request.len;
        let pieces: Vec<_> = members.iter().zip(std::iter::repeat(range)).collect();
        lock::lock_children(&request, pieces).await
    }

    /// Refuses to fail the last in-sync member (md does the same): that would fail the mirror.
    fn check_can_fail(&self, index: usize) -> Result<()> {
        let states = self.states()?;
        if index >= states.len() {
            return Err(BlockError::InvalidArgument(format!(
                "mirror {}: no member {index}",
                self.name
            )));
        }
        let in_sync = states.iter().filter(|s| **s == MemberState::InSync).count();
        if states[index] == MemberState::InSync && in_sync == 1 {
            return Err(BlockError::InvalidArgument(format!(
                "mirror {}: member {index} is the last in-sync member",
                self.name
            )));
        }
        Ok(())
    }

    async fn add_member(self: &Arc<Self>, index: Option<usize>, member: Member) -> Result<()> {
        let g = member.device.geometry();
        let need = self.data_offset + self.size;
        if g.size < need {
            return Err(BlockError::InvalidArgument(format!(
                "mirror {}: member {} has {} bytes; it needs {need}",
                self.name, member.name, g.size
            )));
        }
        if g.min_io > self.geometry.min_io || !u64::from(g.min_io).is_power_of_two() {
            return Err(BlockError::InvalidArgument(format!(
                "mirror {}: member {} needs {}-byte requests; the mirror takes {}",
                self.name, member.name, g.min_io, self.geometry.min_io
            )));
        }
        if let Some(index) = index {
            self.check_can_fail(index)?;
            if self.states()?[index] != MemberState::Faulty {
                self.mark_faulty(index, "being replaced").await?;
            }
        }
        zero_region(&member.device, self.data_offset).await?;
        let state = MemberState::Resyncing { done: 0 };
        let index = {
            let mut slots = self.slots_write()?;
            let slot = Slot {
                name: member.name.clone(),
                device: Some(member.device.clone()),
                state,
            };
            let index = match index {
                Some(i) => {
                    slots[i] = slot;
                    i
                }
                None => {
                    slots.push(slot);
                    slots.len() - 1
                }
            };
            let record = MirrorRecord {
                members: slots.len() as u32,
                data_offset: self.data_offset,
                size: self.size,
                region: self.region,
            };
            self.store.transact(TxnClass::Normal, |_, txn| {
                txn.put_blob(self.ids.config, record.encode());
                txn.set(self.ids.members, index as u64, &state.encode());
                Ok(())
            })?;
            self.fanout.replicas().add(index, member.device.clone());
            index
        };
        self.store.checkpoint_now().await?;
        self.store.checkpoint_now().await?;
        self.commit().await?;
        tracing::info!(mirror = %self.name, member = %member.name, index, "member added; resync starts");
        self.kick_resync()
    }

    /// The configuration as the mirror runs: region and metadata size as its metadata
    /// records them (they count only at format), the rest as it was started with.
    fn config(&self) -> MirrorConfig {
        MirrorConfig {
            region: ByteSize(self.region),
            metadata_size: ByteSize(self.data_offset),
            bitmap_clear_ms: self.options.bitmap_clear.as_millis() as u64,
            resync_concurrency: self.options.resync_concurrency as u64,
        }
    }

    async fn describe(&self) -> Result<NodeStatus> {
        let mut node = NodeStatus::new(&self.name, "mirror", self.size);
        // Activity is read before the member states: the resync marks its target in sync a
        // moment before it clears its activity, so the reverse order could show a healthy
        // mirror still "resyncing".
        let activity = self.resync_control()?.activity.clone();
        let members: Vec<(String, Option<DeviceRef>, MemberState)> = self
            .slots_read()?
            .iter()
            .map(|s| (s.name.clone(), s.device.clone(), s.state))
            .collect();
        let needs_sync = self.regions_lock()?.needs_sync.len();
        let in_sync = members
            .iter()
            .filter(|(_, _, s)| *s == MemberState::InSync)
            .count();
        node.health = if in_sync == 0 {
            Health::Failed
        } else if in_sync < members.len() || needs_sync > 0 {
            Health::Degraded
        } else {
            Health::Ok
        };
        for (name, device, state) in members {
            node.detail
                .push((format!("member {name}"), state.label(self.size)));
            let child = match device {
                Some(device) => match device.control(Control::Describe).await {
                    Ok(ControlReply::Describe(status)) => status,
                    _ => NodeStatus::new(&name, "unknown", 0),
                },
                None => {
                    let mut missing = NodeStatus::new(&name, "missing", 0);
                    missing.health = Health::Failed;
                    missing
                }
            };
            node.children.push(child);
        }
        let c = &self.counters;
        node.detail.extend([
            ("region".to_string(), self.region.to_string()),
            ("dirty regions".to_string(), self.dirty_bits().to_string()),
            (
                "read errors".to_string(),
                c.read_errors.load(Ordering::Relaxed).to_string(),
            ),
            (
                "repaired reads".to_string(),
                c.repairs.load(Ordering::Relaxed).to_string(),
            ),
        ]);
        node.config = layer::to_table(&self.config());
        node.activity = activity.filter(|_| node.health != Health::Ok);
        if let Some(activity) = &node.activity {
            node.detail.push((
                "resync".into(),
                format!(
                    "{} {:.1} %",
                    activity.what,
                    percent(activity.done_bytes, activity.total_bytes)
                ),
            ));
        }
        Ok(node)
    }
}

/// Zeroes a new member's metadata region, so that nothing left on it from an earlier life
/// reads as a superblock or journal batch.
async fn zero_region(device: &DeviceRef, len: u64) -> Result<()> {
    let chunk = (1u64 << 20).min(u64::from(device.geometry().max_io));
    let zeros = Bytes::from(vec![0u8; chunk as usize]);
    let mut at = 0;
    while at < len {
        let n = chunk.min(len - at);
        device
            .write(at, zeros.slice(..n as usize), WriteFlags::default())
            .await?;
        at += n;
    }
    device.flush().await
}
