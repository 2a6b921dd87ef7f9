//! A shared volume as a block device, for the host that serves it to its clients: striped
//! over mirror sets of bricks (RAIN-10; one brick per set is RAIN-0), every write buffered
//! until the client's flush, and each flush one consistency interval committed on every
//! brick it touches, or on none.
//!
//! Replicas are kept identical by the interval itself: a write goes to every brick of its
//! set, and if one of them cannot take it the interval aborts everywhere and the flush fails.
//! Running degraded (committing without an absent brick, recording what it missed, copying
//! only that back) is not built: the policy for it is `strata_cluster::rain`, and its missing
//! half is recording in etcd which bricks are stale, so no other host reads from them.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use strata_cluster::interval::{Decision, IntervalId};
use strata_cluster::rain::Rain10;
use strata_coord::session::{Heartbeat, MemberRecord, Session};
use strata_coord::Coord;
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, Geometry, Result, WriteFlags,
};

use crate::commit::run_interval;
use crate::rpc::{BrickClient, RpcError, MAX_MESSAGE};

/// Writes buffered past this are committed as an interval of their own, before the flush:
/// one brick's share of an interval travels in one message.
const MAX_PENDING: u64 = (MAX_MESSAGE / 4) as u64;

pub struct SharedVolume {
    name: String,
    geometry: Geometry,
    unit: u64,
    /// Each mirror set's bricks, as indices into `bricks`.
    sets: Vec<Vec<usize>>,
    bricks: Vec<BrickClient>,
    /// Placement and the round-robin of reads over a set's copies.
    rain: Mutex<Rain10>,
    session: Session,
    _heartbeat: Heartbeat,
    state: tokio::sync::Mutex<State>,
}

struct State {
    /// Written since the last interval, in order: a later write wins where they overlap.
    pending: Vec<(u64, Bytes)>,
    pending_bytes: u64,
    next_seq: u64,
    /// Decisions a brick has not acknowledged: delivered before anything else goes to it,
    /// and the brick is not read from until they are.
    owed: BTreeMap<usize, Vec<(IntervalId, Decision)>>,
}

fn io_error(context: String) -> BlockError {
    BlockError::Io {
        context,
        source: std::io::Error::other("shared volume"),
    }
}

impl SharedVolume {
    /// Opens `volume` from the cluster's catalog, joining the cluster as `member` (a client).
    /// The session's lease id names this host's intervals: when the host dies and its lease
    /// runs out, the bricks resolve what it left in doubt.
    pub async fn open(
        coord: &Coord,
        volume: &str,
        member: &str,
        timeout: Duration,
    ) -> anyhow::Result<SharedVolume> {
        let record = coord.volume(volume).await?.record;
        let catalog = coord.bricks().await?;
        let mut bricks = Vec::new();
        for name in record.bricks() {
            let brick = catalog
                .iter()
                .find(|b| &b.record.name == name)
                .ok_or_else(|| {
                    anyhow::anyhow!("brick {name} of volume {volume} is not in the catalog")
                })?;
            bricks.push(BrickClient::new(&brick.record.address, timeout)?);
        }
        let copies = record.copies();
        let sets: Vec<Vec<usize>> = (0..record.mirror_sets.len())
            .map(|set| (set * copies..(set + 1) * copies).collect())
            .collect();
        let session = Session::open(
            coord,
            MemberRecord {
                name: member.to_string(),
                role: "client".into(),
                address: String::new(),
            },
            Duration::from_secs(10),
        )
        .await?;
        let heartbeat = session.heartbeat();
        tracing::info!(
            volume,
            member,
            client = session.lease(),
            bricks = bricks.len(),
            "shared volume opened"
        );
        Ok(SharedVolume {
            name: volume.to_string(),
            geometry: Geometry {
                size: record.size_bytes,
                min_io: 512,
                logical_block: 512,
                physical_block: 4096,
                preferred_io: record.unit_bytes.min(1 << 20) as u32,
                max_io: 4 << 20,
            },
            unit: record.unit_bytes,
            rain: Mutex::new(Rain10::new(
                record.unit_bytes,
                record.unit_bytes,
                sets.clone(),
            )),
            sets,
            bricks,
            session,
            _heartbeat: heartbeat,
            state: tokio::sync::Mutex::new(State {
                pending: Vec::new(),
                pending_bytes: 0,
                next_seq: 1,
                owed: BTreeMap::new(),
            }),
        })
    }

    /// The id this host's intervals carry: its session's lease.
    pub fn client_id(&self) -> u64 {
        self.session.lease() as u64
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry.check_range(offset, len)?;
        if !offset.is_multiple_of(512) || !len.is_multiple_of(512) {
            return Err(BlockError::InvalidArgument(format!(
                "[{offset}, +{len}) is not in whole 512-byte sectors"
            )));
        }
        Ok(())
    }

    /// Cuts `[offset, offset + len)` at stripe-unit boundaries: (volume offset, set, offset
    /// on the set's bricks, length) per piece.
    fn pieces(&self, offset: u64, len: u64) -> Vec<(u64, usize, u64, u64)> {
        let rain = self.rain.lock().unwrap();
        let mut out = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let take = (self.unit - at % self.unit).min(offset + len - at);
            let place = rain.place(at);
            out.push((at, place.set, place.offset, take));
            at += take;
        }
        out
    }

    /// Delivers what bricks are owed; the ones still unreachable keep their debt.
    async fn settle(&self, state: &mut State) {
        let owed = std::mem::take(&mut state.owed);
        for (brick, decisions) in owed {
            let mut left = Vec::new();
            for (id, decision) in decisions {
                if !left.is_empty() {
                    left.push((id, decision));
                    continue;
                }
                match self.bricks[brick].decide(id, decision).await {
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(volume = %self.name, brick, %error, "decision still owed");
                        left.push((id, decision));
                    }
                }
            }
            if !left.is_empty() {
                state.owed.insert(brick, left);
            }
        }
    }

    /// Commits what is pending as one interval on every brick it touches, or fails.
    async fn commit(&self, state: &mut State) -> Result<()> {
        if state.pending.is_empty() {
            return Ok(());
        }
        self.settle(state).await;
        if let Some(brick) = state.owed.keys().next() {
            // An earlier interval is not decided there yet: a later one must not overtake it.
            return Err(io_error(format!(
                "volume {}: brick {} is unreachable and owes an earlier decision",
                self.name,
                self.bricks[*brick].address()
            )));
        }
        let id = IntervalId {
            client: self.client_id(),
            seq: state.next_seq,
        };
        state.next_seq += 1;
        let mut writes: BTreeMap<usize, Vec<(u64, Bytes)>> = BTreeMap::new();
        for (offset, data) in &state.pending {
            for (at, set, brick_offset, len) in self.pieces(*offset, data.len() as u64) {
                let from = (at - offset) as usize;
                let piece = data.slice(from..from + len as usize);
                for &brick in &self.sets[set] {
                    writes
                        .entry(brick)
                        .or_default()
                        .push((brick_offset, piece.clone()));
                }
            }
        }
        let outcome = run_interval(&self.bricks, id, writes, &[]).await;
        for &brick in &outcome.unacked {
            state
                .owed
                .entry(brick)
                .or_default()
                .push((id, outcome.decision));
        }
        match outcome.decision {
            Decision::Commit => {
                state.pending.clear();
                state.pending_bytes = 0;
                Ok(())
            }
            // The writes stay pending (and readable here): the next flush tries again.
            Decision::Abort => Err(io_error(format!(
                "volume {}: interval {} aborted (refused: {:?}; unanswered: {:?})",
                self.name,
                id.seq,
                outcome.refusals,
                outcome
                    .silent
                    .iter()
                    .map(|&b| self.bricks[b].address())
                    .collect::<Vec<_>>()
            ))),
        }
    }

    /// Reads one piece from a current copy: round-robin, skipping bricks that owe a decision
    /// and ones that do not answer.
    async fn read_piece(
        &self,
        set: usize,
        brick_offset: u64,
        len: u64,
        owed: &[usize],
    ) -> Result<Bytes> {
        let first = {
            let mut rain = self.rain.lock().unwrap();
            rain.read_from(strata_cluster::rain::Place {
                set,
                offset: brick_offset,
            })
            .map_err(|e| io_error(e.to_string()))?
        };
        let bricks = &self.sets[set];
        let start = bricks.iter().position(|&b| b == first).unwrap_or(0);
        let mut last_error = None;
        for i in 0..bricks.len() {
            let brick = bricks[(start + i) % bricks.len()];
            if owed.contains(&brick) {
                continue;
            }
            match self.bricks[brick].read(brick_offset, len as u32).await {
                Ok(data) if data.len() as u64 == len => return Ok(data),
                Ok(data) => {
                    last_error = Some(format!("{} bytes of {len}", data.len()));
                }
                Err(RpcError::Unreachable { address, why }) => {
                    tracing::warn!(volume = %self.name, %address, %why, "read from another copy");
                    last_error = Some(format!("{address}: {why}"));
                }
                Err(RpcError::Refused { address, why }) => {
                    return Err(io_error(format!("brick {address} refused a read: {why}")));
                }
            }
        }
        Err(io_error(format!(
            "volume {}: no copy of set {set} answered ({})",
            self.name,
            last_error.unwrap_or_else(|| "every brick owes a decision".into())
        )))
    }
}

#[async_trait]
impl BlockDevice for SharedVolume {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            discard: false,
            write_zeroes: false,
            fast_zero: false,
            block_status: false,
            // Each host buffers its own interval: another opener does not see it until the
            // flush, so NBD multi-conn must not be advertised.
            consistent_across_openers: false,
            fua: false,
            ..Capabilities::ALL
        }
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.check(offset, len as u64)?;
        let (pending, owed): (Vec<(u64, Bytes)>, Vec<usize>) = {
            let state = self.state.lock().await;
            (state.pending.clone(), state.owed.keys().copied().collect())
        };
        let mut out = BytesMut::with_capacity(len);
        for (_, set, brick_offset, piece) in self.pieces(offset, len as u64) {
            out.extend_from_slice(&self.read_piece(set, brick_offset, piece, &owed).await?);
        }
        // This host's writes not yet committed, in order.
        let end = offset + len as u64;
        for (at, data) in &pending {
            let (from, to) = ((*at).max(offset), (at + data.len() as u64).min(end));
            if from < to {
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&data[(from - at) as usize..(to - at) as usize]);
            }
        }
        Ok(out)
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        let mut state = self.state.lock().await;
        state.pending_bytes += data.len() as u64;
        state.pending.push((offset, data));
        if flags.fua || state.pending_bytes > MAX_PENDING {
            self.commit(&mut state).await?;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        let mut state = self.state.lock().await;
        self.commit(&mut state).await
    }
}
