//! Prometheus metrics of thin pools and their metadata, read at scrape time.
//!
//! The metadata service counts its own work (commits, checkpoints, low-space events); this
//! collector turns those counters and the pools' space figures into metric families labelled
//! by pool (and volume, for a volume's share), so that an alert can fire on
//! `strata_thin_low_space == 1` or `strata_meta_low_space == 1` before a pool fills.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use strata_core::metric_family::{family, Family, Kind, Labels};
use strata_thin::{PoolSpace, ThinPool, VolumeSpace};

pub struct PoolCollector {
    pools: Vec<Arc<ThinPool>>,
}

impl std::fmt::Debug for PoolCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.pools.iter().map(|p| p.name()).collect();
        f.debug_struct("PoolCollector")
            .field("pools", &names)
            .finish()
    }
}

impl PoolCollector {
    pub fn new(pools: Vec<Arc<ThinPool>>) -> Self {
        PoolCollector { pools }
    }
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Counted once per scrape: the per-volume figures walk every map.
        let spaces: Vec<(String, PoolSpace)> = self
            .pools
            .iter()
            .map(|p| (p.name().to_string(), p.space()))
            .collect();
        let per_pool = |f: &dyn Fn(&ThinPool) -> f64| -> Vec<(Labels, f64)> {
            self.pools
                .iter()
                .map(|p| (vec![("pool", p.name().to_string())], f(p)))
                .collect()
        };
        let per_pool_space = |f: &dyn Fn(&PoolSpace) -> u64| -> Vec<(Labels, f64)> {
            spaces
                .iter()
                .map(|(pool, space)| (vec![("pool", pool.clone())], f(space) as f64))
                .collect()
        };
        let per_volume = |f: &dyn Fn(&VolumeSpace) -> u64| -> Vec<(Labels, f64)> {
            spaces
                .iter()
                .flat_map(|(pool, space)| {
                    space.volumes.iter().map(move |volume| {
                        let labels = vec![("pool", pool.clone()), ("volume", volume.name.clone())];
                        (labels, f(volume) as f64)
                    })
                })
                .collect()
        };
        let space = |p: &ThinPool| p.store().space();
        let counters = |p: &ThinPool| p.store().counters().snapshot();
        let policies = |p: &ThinPool| p.policy_counts();
        use Kind::{Counter, Gauge};
        // One row a family: name, help, type, values.
        #[rustfmt::skip]
        let families: [Family; 28] = [
            ("strata_meta_used_bytes", "Metadata checkpoint space in use", Gauge, per_pool(&|p| space(p).used_bytes as f64)),
            ("strata_meta_capacity_bytes", "Metadata checkpoint space in all", Gauge, per_pool(&|p| space(p).capacity_bytes as f64)),
            ("strata_meta_reserve_bytes", "Metadata space kept for discard and delete", Gauge, per_pool(&|p| space(p).reserve_bytes as f64)),
            ("strata_meta_low_space", "1 while metadata usage is above its low-water mark", Gauge, per_pool(&|p| space(p).low_space as u8 as f64)),
            ("strata_meta_low_space_events", "Times metadata usage crossed its low-water mark", Counter, per_pool(&|p| counters(p).low_space_events as f64)),
            ("strata_meta_transactions", "Metadata transactions applied", Counter, per_pool(&|p| counters(p).txns as f64)),
            ("strata_meta_commits", "Metadata commits (journal batches or checkpoints)", Counter, per_pool(&|p| counters(p).commits as f64)),
            ("strata_meta_checkpoints", "Metadata checkpoints written", Counter, per_pool(&|p| counters(p).checkpoints as f64)),
            ("strata_thin_extents_allocated", "Extents mapped by the pool's volumes", Gauge, per_pool_space(&|s| s.extents_allocated)),
            ("strata_thin_extents", "Extents in the pool", Gauge, per_pool_space(&|s| s.extents)),
            ("strata_thin_granules_live", "4 KiB granules holding data (the rest of the allocated extents reads as zeros)", Gauge, per_pool_space(&|s| s.granules_live)),
            ("strata_thin_extents_partly_dead", "Allocated extents with some granules not live (never written, discarded or zeroed)", Gauge, per_pool_space(&|s| s.extents_partly_dead)),
            ("strata_thin_low_space", "1 while the allocated data extents are at or above the pool's low-water mark", Gauge, per_pool_space(&|s| s.low_space as u64)),
            ("strata_thin_low_space_events", "Times the allocated data extents crossed the low-water mark upwards", Counter, per_pool_space(&|s| s.low_space_events)),
            ("strata_thin_extents_freed", "Extents returned to the pool by discard or zeroing", Counter, per_pool_space(&|s| s.extents_freed)),
            ("strata_thin_extents_freed_by_granules", "Extents freed whose last discard did not cover them whole: whole-extent liveness alone would still hold them", Counter, per_pool_space(&|s| s.extents_freed_by_granules)),
            ("strata_thin_no_space_errors", "Allocating writes refused with ENOSPC", Counter, per_pool_space(&|s| s.no_space_errors)),
            ("strata_thin_writes_waiting", "Allocating writes waiting for space (when-full = wait)", Gauge, per_pool_space(&|s| s.writes_waiting)),
            ("strata_thin_spares", "Spare devices left to grow the pool with (grow-from)", Gauge, per_pool_space(&|s| s.spares_left)),
            ("strata_thin_low_water_extents", "Allocated extents at which the pool reports low space", Gauge, per_pool_space(&|s| s.low_water_extents)),
            ("strata_thin_snapshots_automatic", "Snapshots taken by the volumes' periodic policies", Counter, per_pool(&|p| policies(p).taken as f64)),
            ("strata_thin_snapshots_automatic_deleted", "Automatic snapshots deleted because a policy keeps only its last K", Counter, per_pool(&|p| policies(p).kept_deleted as f64)),
            ("strata_thin_snapshot_reserve_deletes", "Snapshots deleted because free space was below the snapshot reserve (delete-oldest)", Counter, per_pool(&|p| policies(p).reserve_deleted as f64)),
            ("strata_thin_snapshot_reserve_refusals", "Snapshots refused because free space was below the snapshot reserve", Counter, per_pool(&|p| policies(p).refused as f64)),
            ("strata_thin_snapshot_policy_failures", "Versions-policy passes that failed for a volume", Counter, per_pool(&|p| policies(p).failed as f64)),
            ("strata_thin_volume_extents_allocated", "Extents a volume maps", Gauge, per_volume(&|v| v.extents_allocated)),
            ("strata_thin_volume_granules_live", "4 KiB granules holding a volume's data", Gauge, per_volume(&|v| v.granules_live)),
            ("strata_thin_volume_extents_partly_dead", "A volume's extents with some granules not live", Gauge, per_volume(&|v| v.extents_partly_dead)),
        ];
        for (name, help, kind, values) in families {
            family(&mut encoder, name, help, kind, &values)?;
        }
        Ok(())
    }
}
