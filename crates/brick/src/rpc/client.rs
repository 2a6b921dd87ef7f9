//! A client of one brick's service, with a deadline on every call.

use std::time::Duration;

use bytes::Bytes;
use strata_cluster::interval::{Decision, IntervalId, Status as IntervalStatus};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

use super::by_reference::{self, PREPARE, WRITE_DIRECT};
use super::proto::{self, brick_client};
use super::{wire, MAX_MESSAGE};
use crate::store::{BrickSummary, VersionInfo, Vote};

/// Why a call to a brick did not get its answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// No answer: the brick is down, unreachable or too slow. The request may or may not have
    /// been applied.
    #[error("brick {address} unreachable: {why}")]
    Unreachable { address: String, why: String },
    /// The brick answered with an error (a bad request, damage): it did not apply it.
    #[error("brick {address} refused: {why}")]
    Refused { address: String, why: String },
}

#[derive(Clone)]
pub struct BrickClient {
    inner: brick_client::BrickClient<Channel>,
    /// The same connection, for the calls that send block data by reference.
    channel: Channel,
    address: String,
}

fn id(interval: IntervalId) -> proto::Interval {
    proto::Interval {
        client: interval.client,
        seq: interval.seq,
    }
}

impl BrickClient {
    /// A client of the brick at `address` (`host:port`). Connects lazily, so a brick that is
    /// down now is simply unreachable until it returns.
    pub fn new(address: &str, timeout: Duration) -> Result<BrickClient, RpcError> {
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| RpcError::Refused {
                address: address.to_string(),
                why: format!("not an address: {e}"),
            })?
            .connect_timeout(timeout)
            .timeout(timeout)
            .tcp_nodelay(true)
            .initial_stream_window_size(super::STREAM_WINDOW)
            .initial_connection_window_size(super::CONNECTION_WINDOW)
            .max_frame_size(super::MAX_FRAME);
        let channel = endpoint.connect_lazy();
        let inner = brick_client::BrickClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        Ok(BrickClient {
            inner,
            channel,
            address: address.to_string(),
        })
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// A request this side will not send (too large for the brick to accept).
    fn refused(&self, why: String) -> RpcError {
        RpcError::Refused {
            address: self.address.clone(),
            why,
        }
    }

    fn error(&self, status: tonic::Status) -> RpcError {
        let why = status.message().to_string();
        let address = self.address.clone();
        match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                RpcError::Unreachable { address, why }
            }
            _ => RpcError::Refused { address, why },
        }
    }

    /// [`Self::prepare_tagged`] before the volume's first version (tag 0).
    pub async fn prepare(
        &self,
        interval: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
    ) -> Result<Vote, RpcError> {
        self.prepare_tagged(interval, bricks, writes, fences, 0)
            .await
    }

    pub async fn prepare_tagged(
        &self,
        interval: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
        tag: u64,
    ) -> Result<Vote, RpcError> {
        let request = proto::PrepareRequest {
            tag,
            id: Some(id(interval)),
            bricks,
            writes: vec![],
            fences: fences
                .iter()
                .map(|&(segment, epoch)| proto::Fence { segment, epoch })
                .collect(),
        };
        let body = by_reference::prepare(request, writes).map_err(|why| self.refused(why))?;
        let reply: proto::PrepareReply =
            by_reference::call(&mut self.channel.clone(), PREPARE, body)
                .await
                .map_err(|s| self.error(s))?;
        Ok(if reply.yes {
            Vote::Yes
        } else {
            Vote::No(reply.reason)
        })
    }

    /// The interval's client sends its decision.
    pub async fn decide(&self, interval: IntervalId, decision: Decision) -> Result<bool, RpcError> {
        self.send_decision(interval, decision, false).await
    }

    /// A peer sends the decision it resolved for an interval in doubt.
    pub async fn decide_resolved(
        &self,
        interval: IntervalId,
        decision: Decision,
    ) -> Result<bool, RpcError> {
        self.send_decision(interval, decision, true).await
    }

    async fn send_decision(
        &self,
        interval: IntervalId,
        decision: Decision,
        resolution: bool,
    ) -> Result<bool, RpcError> {
        let decision = match decision {
            Decision::Commit => proto::Decision::Commit,
            Decision::Abort => proto::Decision::Abort,
        };
        let request = proto::DecideRequest {
            id: Some(id(interval)),
            decision: decision as i32,
            resolution,
        };
        let reply = self
            .inner
            .clone()
            .decide(request)
            .await
            .map_err(|s| self.error(s))?;
        Ok(reply.into_inner().accepted)
    }

    pub async fn status(&self, interval: IntervalId) -> Result<Option<IntervalStatus>, RpcError> {
        let reply = self
            .inner
            .clone()
            .status(id(interval))
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        match proto::State::try_from(reply.state) {
            Ok(proto::State::Unknown) => Ok(None),
            Ok(proto::State::Prepared) => Ok(Some(IntervalStatus::Prepared)),
            Ok(proto::State::Committed) => Ok(Some(IntervalStatus::Decided(Decision::Commit))),
            Ok(proto::State::Aborted) => Ok(Some(IntervalStatus::Decided(Decision::Abort))),
            Err(_) => Err(RpcError::Refused {
                address: self.address.clone(),
                why: format!("unknown interval state {}", reply.state),
            }),
        }
    }

    pub async fn in_doubt(&self) -> Result<Vec<(IntervalId, Vec<u64>)>, RpcError> {
        let listed = self.in_doubt_tagged().await?;
        Ok(listed
            .into_iter()
            .map(|(id, bricks, _)| (id, bricks))
            .collect())
    }

    /// [`Self::in_doubt`], with each interval's version tag.
    pub async fn in_doubt_tagged(&self) -> Result<Vec<(IntervalId, Vec<u64>, u64)>, RpcError> {
        let reply = self
            .inner
            .clone()
            .in_doubt(proto::Empty {})
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        Ok(reply
            .intervals
            .into_iter()
            .filter_map(|i| {
                let id = i.id?;
                Some((
                    IntervalId {
                        client: id.client,
                        seq: id.seq,
                    },
                    i.bricks,
                    i.tag,
                ))
            })
            .collect())
    }

    /// Fences `client` on this brick before its intervals are resolved (see the proto).
    pub async fn fence_client(&self, client: u64) -> Result<(), RpcError> {
        self.inner
            .clone()
            .fence_client(proto::FenceClientRequest { client })
            .await
            .map_err(|s| self.error(s))?;
        Ok(())
    }

    pub async fn forget(&self, client: u64, below: u64) -> Result<(), RpcError> {
        self.inner
            .clone()
            .forget(proto::ForgetRequest { client, below })
            .await
            .map_err(|s| self.error(s))?;
        Ok(())
    }

    /// Writes home outside any interval (the benchmark's baseline; see the proto).
    pub async fn write_direct(&self, writes: Vec<(u64, Bytes)>) -> Result<(), RpcError> {
        let body = by_reference::write_direct(writes).map_err(|why| self.refused(why))?;
        let _: proto::Empty = by_reference::call(&mut self.channel.clone(), WRITE_DIRECT, body)
            .await
            .map_err(|s| self.error(s))?;
        Ok(())
    }

    pub async fn versions(&self) -> Result<Vec<VersionInfo>, RpcError> {
        let reply = self
            .inner
            .clone()
            .versions(proto::Empty {})
            .await
            .map_err(|s| self.error(s))?;
        Ok((reply.into_inner().versions.into_iter())
            .map(Into::into)
            .collect())
    }

    /// What the brick holds now (`BrickStore::summary`).
    pub async fn describe(&self) -> Result<BrickSummary, RpcError> {
        let reply = self
            .inner
            .clone()
            .describe(proto::Empty {})
            .await
            .map_err(|s| self.error(s))?;
        wire::from_reply(reply.into_inner()).ok_or_else(|| RpcError::Refused {
            address: self.address.clone(),
            why: "its summary names a brick format past 255: not a brick of this kind".into(),
        })
    }

    pub async fn seal_version(&self, number: u64) -> Result<(), RpcError> {
        self.inner
            .clone()
            .seal_version(proto::VersionRequest { number })
            .await
            .map_err(|s| self.error(s))?;
        Ok(())
    }

    /// `Ok(false)`: the brick had no such version.
    pub async fn delete_version(&self, number: u64) -> Result<bool, RpcError> {
        let reply = self
            .inner
            .clone()
            .delete_version(proto::VersionRequest { number })
            .await
            .map_err(|s| self.error(s))?;
        Ok(reply.into_inner().deleted)
    }

    pub async fn rollback(&self, number: u64, spent: u64) -> Result<(), RpcError> {
        self.inner
            .clone()
            .rollback(proto::RollbackRequest { number, spent })
            .await
            .map_err(|s| self.error(s))?;
        Ok(())
    }

    pub async fn read_version(
        &self,
        number: u64,
        offset: u64,
        len: u32,
    ) -> Result<Bytes, RpcError> {
        let reply = self
            .inner
            .clone()
            .read_version(proto::ReadVersionRequest {
                number,
                offset,
                len,
            })
            .await
            .map_err(|s| self.error(s))?;
        Ok(reply.into_inner().data)
    }

    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, RpcError> {
        let reply = self
            .inner
            .clone()
            .read(proto::ReadRequest { offset, len })
            .await
            .map_err(|s| self.error(s))?;
        Ok(reply.into_inner().data)
    }
}
