//! What the client's commit and the bricks' resolution need of a brick, whatever carries the
//! messages: the gRPC client in a cluster, a simulated network in the simulator. Both run
//! the same `commit::run_interval` and `resolve::resolve_in_doubt` over it.

use bytes::Bytes;
use strata_cluster::interval::{Decision, IntervalId, Status};
use strata_core::async_trait;

use crate::rpc::{BrickClient, RpcError};
use crate::store::Vote;

/// One brick, as seen across the network: every call may end `Unreachable` (maybe applied,
/// maybe not) or `Refused` (answered, applied nothing).
#[async_trait]
pub trait Participant: Send + Sync {
    /// `tag`: the version cut the interval comes after (`BrickStore::prepare_tagged`).
    /// `carried`: commits of the client's earlier intervals the prepare carries
    /// (`BrickStore::prepare_carrying`); with the vote comes, for each of them, whether the
    /// brick applied it, or `None` when it took none of them.
    async fn prepare(
        &self,
        carried: &[IntervalId],
        id: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
        tag: u64,
    ) -> Result<(Vote, Option<Vec<bool>>), RpcError>;

    /// The interval's client sends its decision.
    async fn decide(&self, id: IntervalId, decision: Decision) -> Result<bool, RpcError>;

    /// A peer sends the decision it resolved for an interval in doubt.
    async fn decide_resolved(&self, id: IntervalId, decision: Decision) -> Result<bool, RpcError>;

    async fn status(&self, id: IntervalId) -> Result<Option<Status>, RpcError>;

    /// Takes no more prepares or decisions from `client` (a resolving peer's first step).
    async fn fence_client(&self, client: u64) -> Result<(), RpcError>;
}

#[async_trait]
impl Participant for BrickClient {
    async fn prepare(
        &self,
        carried: &[IntervalId],
        id: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
        tag: u64,
    ) -> Result<(Vote, Option<Vec<bool>>), RpcError> {
        BrickClient::prepare_carrying(self, carried, id, bricks, writes, fences, tag).await
    }

    async fn decide(&self, id: IntervalId, decision: Decision) -> Result<bool, RpcError> {
        BrickClient::decide(self, id, decision).await
    }

    async fn decide_resolved(&self, id: IntervalId, decision: Decision) -> Result<bool, RpcError> {
        BrickClient::decide_resolved(self, id, decision).await
    }

    async fn status(&self, id: IntervalId) -> Result<Option<Status>, RpcError> {
        BrickClient::status(self, id).await
    }

    async fn fence_client(&self, client: u64) -> Result<(), RpcError> {
        BrickClient::fence_client(self, client).await
    }
}
