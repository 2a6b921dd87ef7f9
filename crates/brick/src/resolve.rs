//! A brick resolving the intervals it holds in doubt, once their client is fenced, by asking
//! the interval's other bricks (RIBD's recovery of a client crash, §2.5).

use std::collections::BTreeMap;
use std::future::Future;

use strata_cluster::interval::{resolve_statuses, Decision, IntervalId, Status};
use strata_core::Result;

use crate::rpc::BrickClient;
use crate::store::BrickStore;

/// Resolves every interval in doubt on `store` (brick number `me`) whose client
/// `client_fenced` says is fenced. An interval whose peers do not all answer stays in doubt
/// for the next pass: a peer that is down is not a peer that never prepared. Each decision is
/// also sent to the peers, so a late prepare finds it. Returns the intervals decided.
pub async fn resolve_in_doubt<F, Fut>(
    store: &BrickStore,
    me: u64,
    peers: &BTreeMap<u64, BrickClient>,
    client_fenced: F,
) -> Result<Vec<(IntervalId, Decision)>>
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut decided = Vec::new();
    'intervals: for (id, bricks) in store.in_doubt().await {
        if !client_fenced(id.client).await {
            continue;
        }
        let mut statuses = vec![Some(Status::Prepared)];
        for brick in bricks.iter().filter(|&&b| b != me) {
            let Some(peer) = peers.get(brick) else {
                tracing::warn!(?id, brick, "interval names a brick this one does not know");
                continue 'intervals;
            };
            match peer.status(id).await {
                Ok(status) => statuses.push(status),
                Err(error) => {
                    tracing::info!(?id, brick, %error, "peer unanswered; interval stays in doubt");
                    continue 'intervals;
                }
            }
        }
        let decision = resolve_statuses(&statuses);
        store.decide(id, decision).await?;
        tracing::info!(?id, ?decision, "interval in doubt resolved");
        for brick in bricks.iter().filter(|&&b| b != me) {
            if let Err(error) = peers[brick].decide(id, decision).await {
                tracing::info!(?id, brick, %error, "peer not told the resolution");
            }
        }
        decided.push((id, decision));
    }
    Ok(decided)
}
