//! Thin pools that grow from spare disks: Virtual Allocation's storage expansion, driven by
//! the low-water mark.
//!
//! A pool configured with `grow-from = [spare paths]` sits on a concat. Once a second the
//! server looks at each such pool; one above its low-water mark gets its first spare appended
//! to the concat through the ordinary reconfiguration path (the spare is labelled, the
//! config rewritten with the spare moved from `grow-from` to the concat's children, the
//! hierarchy relabelled), and the pool then takes in the new extents, durably, before it
//! hands any of them out. One spare per look, so a pool takes only what it needs.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use strata_thin::ThinPool;

use crate::build::NodeKind;
use crate::control::ControlPlane;
use crate::reconfig::Change;

/// How often pools are looked at. Allocation at full speed fills about a GiB per second, so
/// the low-water mark should leave at least a few seconds of room above it.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Runs for the life of the server.
pub async fn grow_pools(state: Arc<ControlPlane>) {
    // A spare that could not be added is not tried again (its error is logged once); an
    // operator fixes it and restarts, or removes it from the list.
    let mut refused: BTreeSet<(String, String)> = BTreeSet::new();
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        for (pool, spares) in pools_with_spares(&state).await {
            pool.set_spares_left(spares.len() as u64);
            let Some(spare) = spares.first() else {
                continue;
            };
            if !pool.above_low_water()
                || refused.contains(&(pool.name().to_string(), spare.clone()))
            {
                continue;
            }
            tracing::warn!(pool = pool.name(), %spare, "thin pool above its low-water mark: growing it from a spare");
            match state
                .change(Change::GrowPool {
                    pool: pool.name().to_string(),
                })
                .await
            {
                Ok(_) => match pool.grow().await {
                    Ok(added) => {
                        pool.set_spares_left(spares.len() as u64 - 1);
                        tracing::info!(pool = pool.name(), %spare, extents_added = added, extents = pool.extents(), "thin pool grew from a spare");
                    }
                    Err(error) => {
                        tracing::error!(pool = pool.name(), %error, "thin pool could not take in its new spare");
                    }
                },
                Err(error) => {
                    tracing::error!(pool = pool.name(), %spare, "spare not added: {error:#}");
                    refused.insert((pool.name().to_string(), spare.clone()));
                }
            }
        }
    }
}

/// Every thin pool the server built that has `grow-from` configured, with its spares left.
async fn pools_with_spares(state: &ControlPlane) -> Vec<(Arc<ThinPool>, Vec<String>)> {
    let configured: Vec<(String, Vec<String>)> = {
        let reconfig = state.reconfig.lock().await;
        reconfig
            .loaded
            .layers
            .iter()
            .filter(|l| !l.grow_from.is_empty())
            .map(|l| (l.name.clone(), l.grow_from.clone()))
            .collect()
    };
    let nodes = state.nodes();
    let mut pools = Vec::new();
    for (name, spares) in configured {
        let node = nodes.iter().find_map(|node| match &node.kind {
            NodeKind::Maker(device) if node.name == name => Some(device),
            _ => None,
        });
        // grow-from is the thin pool's own option: its pool object does the growing.
        if let Some(pool) = match node {
            Some(device) => ThinPool::of(device).await,
            None => None,
        } {
            pools.push((pool, spares));
        }
    }
    pools
}
