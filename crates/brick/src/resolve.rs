//! A brick resolving the intervals it holds in doubt, once their client is fenced, by asking
//! the interval's other bricks (RIBD's recovery of a client crash, §2.5).

use std::collections::BTreeMap;
use std::future::Future;

use strata_cluster::interval::{resolve_statuses, Decision, IntervalId, Status};
use strata_core::Result;

use crate::participant::Participant;
use crate::store::BrickStore;

/// Resolves every interval in doubt on `store` (brick number `me`) whose client
/// `client_fenced` says is fenced. An interval whose peers do not all answer stays in doubt
/// for the next pass: a peer that is down is not a peer that never prepared. Each decision is
/// also sent to the peers, so a late prepare finds it. Returns the intervals decided.
///
/// A lease that ran out does not stop a client that was only paused: it may wake up and send
/// the commit it had decided. So before reading any state, the client is fenced on this brick
/// and on every peer of the interval, durably: from then on none of them takes a decision
/// from the client itself, and the states read cannot change under the resolution (two
/// bricks resolving at once read the same commits, and decide alike).
pub async fn resolve_in_doubt<P, F, Fut>(
    store: &BrickStore,
    me: u64,
    peers: &BTreeMap<u64, P>,
    client_fenced: F,
) -> Result<Vec<(IntervalId, Decision)>>
where
    P: Participant,
    F: Fn(u64) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut decided = Vec::new();
    'intervals: for (id, bricks) in store.try_in_doubt().await? {
        if !client_fenced(id.client).await {
            continue;
        }
        let mut others = Vec::new();
        for brick in bricks.iter().filter(|&&b| b != me) {
            let Some(peer) = peers.get(brick) else {
                tracing::warn!(?id, brick, "interval names a brick this one does not know");
                continue 'intervals;
            };
            others.push((*brick, peer));
        }
        store.fence_client(id.client).await?;
        for (brick, peer) in &others {
            if let Err(error) = peer.fence_client(id.client).await {
                tracing::info!(?id, brick, %error, "peer not fenced; interval stays in doubt");
                continue 'intervals;
            }
        }
        // Read after the fences: this brick's own state too may have moved since the list.
        let Some(own) = store.try_status(id).await? else {
            continue 'intervals;
        };
        if own != Status::Prepared {
            continue 'intervals;
        }
        let mut statuses = vec![Some(own)];
        for (brick, peer) in others {
            match peer.status(id).await {
                Ok(status) => statuses.push(status),
                Err(error) => {
                    tracing::info!(?id, brick, %error, "peer unanswered; interval stays in doubt");
                    continue 'intervals;
                }
            }
        }
        let decision = resolve_statuses(&statuses);
        store.decide_resolved(id, decision).await?;
        tracing::info!(?id, ?decision, "interval in doubt resolved");
        for brick in bricks.iter().filter(|&&b| b != me) {
            if let Err(error) = peers[brick].decide_resolved(id, decision).await {
                tracing::info!(?id, brick, %error, "peer not told the resolution");
            }
        }
        decided.push((id, decision));
    }
    Ok(decided)
}
