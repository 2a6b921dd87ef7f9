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

    /// Makes a call, and makes it once more if the first try never left this host: tonic's
    /// channel can hand a request to a connection that has just closed (a brick that
    /// restarted), and hyper gives it back unsent, as canceled. That is not a brick down, and
    /// a host that took it for one would mark the brick stale and copy its regions back.
    async fn call<T, F, Fut>(&self, mut call: F) -> Result<tonic::Response<T>, RpcError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match call().await {
            Err(status) if never_sent(&status) => {
                tracing::debug!(address = %self.address, %status, "a call never sent; sent again");
                call().await.map_err(|s| self.error(s))
            }
            answer => answer.map_err(|s| self.error(s)),
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
        let (vote, _) = self
            .prepare_carrying(&[], interval, bricks, writes, fences, tag)
            .await?;
        Ok(vote)
    }

    /// A prepare that carries the commits of this client's earlier intervals `carried`
    /// (`BrickStore::prepare_carrying`): the vote, and for each carried commit, in order,
    /// whether the brick applied it (a decision's `accepted`); `None` from a brick that does
    /// not take carried commits, which applied none of them.
    pub async fn prepare_carrying(
        &self,
        carried: &[IntervalId],
        interval: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
        tag: u64,
    ) -> Result<(Vote, Option<Vec<bool>>), RpcError> {
        let request = proto::PrepareRequest {
            tag,
            id: Some(id(interval)),
            bricks,
            writes: vec![],
            fences: fences
                .iter()
                .map(|&(segment, epoch)| proto::Fence { segment, epoch })
                .collect(),
            commits: carried.iter().map(|&c| id(c)).collect(),
        };
        let body = by_reference::prepare(request, writes).map_err(|why| self.refused(why))?;
        let reply: proto::PrepareReply = self
            .call(|| async {
                by_reference::call(&mut self.channel.clone(), PREPARE, body.clone())
                    .await
                    .map(tonic::Response::new)
            })
            .await?
            .into_inner();
        // A brick built before commits were carried does not know the field: it applied
        // none of them, and answers for none.
        let committed = match reply.committed.len() {
            0 if !carried.is_empty() => None,
            n if n == carried.len() => Some(reply.committed),
            n => {
                return Err(self.refused(format!(
                    "the brick answered for {n} carried commits, {} were sent",
                    carried.len()
                )))
            }
        };
        let vote = if reply.yes {
            Vote::Yes
        } else {
            Vote::No(reply.reason)
        };
        Ok((vote, committed))
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
            .call(|| {
                let mut brick = self.inner.clone();
                async move { brick.decide(request).await }
            })
            .await?;
        Ok(reply.into_inner().accepted)
    }

    pub async fn status(&self, interval: IntervalId) -> Result<Option<IntervalStatus>, RpcError> {
        let reply = self
            .call(|| {
                let mut brick = self.inner.clone();
                let request = id(interval);
                async move { brick.status(request).await }
            })
            .await?
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
            .call(|| {
                let mut brick = self.inner.clone();
                let request = proto::Empty {};
                async move { brick.in_doubt(request).await }
            })
            .await?
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
        self.call(|| {
            let mut brick = self.inner.clone();
            let request = proto::FenceClientRequest { client };
            async move { brick.fence_client(request).await }
        })
        .await?;
        Ok(())
    }

    pub async fn forget(&self, client: u64, below: u64) -> Result<(), RpcError> {
        self.call(|| {
            let mut brick = self.inner.clone();
            let request = proto::ForgetRequest { client, below };
            async move { brick.forget(request).await }
        })
        .await?;
        Ok(())
    }

    /// Writes home outside any interval (the benchmark's baseline; see the proto).
    pub async fn write_direct(&self, writes: Vec<(u64, Bytes)>) -> Result<(), RpcError> {
        let body = by_reference::write_direct(writes).map_err(|why| self.refused(why))?;
        self.call(|| async {
            by_reference::call::<proto::Empty>(
                &mut self.channel.clone(),
                WRITE_DIRECT,
                body.clone(),
            )
            .await
            .map(tonic::Response::new)
        })
        .await?;
        Ok(())
    }

    pub async fn versions(&self) -> Result<Vec<VersionInfo>, RpcError> {
        let reply = self
            .call(|| {
                let mut brick = self.inner.clone();
                let request = proto::Empty {};
                async move { brick.versions(request).await }
            })
            .await?;
        Ok((reply.into_inner().versions.into_iter())
            .map(Into::into)
            .collect())
    }

    /// What the brick holds now (`BrickStore::summary`).
    pub async fn describe(&self) -> Result<BrickSummary, RpcError> {
        let reply = self
            .call(|| {
                let mut brick = self.inner.clone();
                let request = proto::Empty {};
                async move { brick.describe(request).await }
            })
            .await?;
        wire::from_reply(reply.into_inner()).ok_or_else(|| RpcError::Refused {
            address: self.address.clone(),
            why: "its summary names a brick format past 255: not a brick of this kind".into(),
        })
    }

    pub async fn seal_version(&self, number: u64) -> Result<(), RpcError> {
        self.call(|| {
            let mut brick = self.inner.clone();
            let request = proto::VersionRequest { number };
            async move { brick.seal_version(request).await }
        })
        .await?;
        Ok(())
    }

    /// `Ok(false)`: the brick had no such version.
    pub async fn delete_version(&self, number: u64) -> Result<bool, RpcError> {
        let reply = self
            .call(|| {
                let mut brick = self.inner.clone();
                let request = proto::VersionRequest { number };
                async move { brick.delete_version(request).await }
            })
            .await?;
        Ok(reply.into_inner().deleted)
    }

    pub async fn rollback(&self, number: u64, spent: u64) -> Result<(), RpcError> {
        self.call(|| {
            let mut brick = self.inner.clone();
            let request = proto::RollbackRequest { number, spent };
            async move { brick.rollback(request).await }
        })
        .await?;
        Ok(())
    }

    pub async fn read_version(
        &self,
        number: u64,
        offset: u64,
        len: u32,
    ) -> Result<Bytes, RpcError> {
        let reply = self
            .call(|| {
                let mut brick = self.inner.clone();
                let request = proto::ReadVersionRequest {
                    number,
                    offset,
                    len,
                };
                async move { brick.read_version(request).await }
            })
            .await?;
        Ok(reply.into_inner().data)
    }

    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, RpcError> {
        let reply = self
            .call(|| {
                let mut brick = self.inner.clone();
                let request = proto::ReadRequest { offset, len };
                async move { brick.read(request).await }
            })
            .await?;
        Ok(reply.into_inner().data)
    }
}

/// Whether a call failed before its request left this host: hyper's "canceled", found among
/// the causes tonic keeps. A deadline that passed is tonic's own error, not this.
fn never_sent(status: &tonic::Status) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = cause {
        if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
            return hyper.is_canceled();
        }
        cause = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real "canceled" from hyper: a request handed to an HTTP/2 connection that has closed.
    async fn canceled_by_hyper() -> hyper::Error {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (mut sender, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(ours),
        )
        .await
        .expect("the handshake needs no answer to start");
        drop(theirs);
        connection.await.ok();
        let request = http::Request::new(http_body_util::Empty::<Bytes>::new());
        sender
            .send_request(request)
            .await
            .expect_err("the connection is closed")
    }

    #[tokio::test]
    async fn only_a_call_hyper_never_sent_is_sent_again() {
        let canceled = canceled_by_hyper().await;
        assert!(canceled.is_canceled(), "{canceled:?}");
        let unsent = tonic::Status::from_error(Box::new(canceled));
        assert!(never_sent(&unsent), "{unsent:?}");
        // A deadline that passed, a brick's own answer and a plain status are not retried.
        let timeout = tonic::Status::cancelled("Timeout expired");
        assert!(!never_sent(&timeout));
        assert!(!never_sent(&tonic::Status::unavailable(
            "the brick's disk failed"
        )));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(!never_sent(&tonic::Status::from_error(Box::new(io))));
    }
}
