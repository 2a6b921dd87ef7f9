//! Prometheus metrics of thin pools and their metadata, read at scrape time.
//!
//! The metadata service counts its own work (commits, checkpoints, low-space events); this
//! collector turns those counters and the pools' space figures into metric families labelled
//! by pool, so that an alert can fire on `strata_meta_low_space == 1` before a pool fills.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use strata_layers::thin::ThinPool;

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

/// One metric family: name, help, type, and a value per pool.
type Family = (&'static str, &'static str, Kind, Vec<(String, f64)>);

enum Kind {
    Gauge,
    Counter,
}

fn family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: Kind,
    values: &[(String, f64)],
) -> Result<(), std::fmt::Error> {
    let metric_type = match kind {
        Kind::Gauge => ConstGauge::new(0.0f64).metric_type(),
        Kind::Counter => ConstCounter::new(0.0f64).metric_type(),
    };
    let mut metric = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (pool, value) in values {
        let labels = [("pool", pool.as_str())];
        let series = metric.encode_family(&labels)?;
        match kind {
            Kind::Gauge => ConstGauge::new(*value).encode(series)?,
            Kind::Counter => ConstCounter::new(*value).encode(series)?,
        }
    }
    Ok(())
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let per_pool = |f: &dyn Fn(&ThinPool) -> f64| -> Vec<(String, f64)> {
            self.pools
                .iter()
                .map(|p| (p.name().to_string(), f(p)))
                .collect()
        };
        let space = |p: &ThinPool| p.store().space();
        let counters = |p: &ThinPool| p.store().counters().snapshot();
        use Kind::{Counter, Gauge};
        let families: [Family; 10] = [
            (
                "strata_meta_used_bytes",
                "Metadata checkpoint space in use",
                Gauge,
                per_pool(&|p| space(p).used_bytes as f64),
            ),
            (
                "strata_meta_capacity_bytes",
                "Metadata checkpoint space in all",
                Gauge,
                per_pool(&|p| space(p).capacity_bytes as f64),
            ),
            (
                "strata_meta_reserve_bytes",
                "Metadata space kept for discard and delete",
                Gauge,
                per_pool(&|p| space(p).reserve_bytes as f64),
            ),
            (
                "strata_meta_low_space",
                "1 while metadata usage is above its low-water mark",
                Gauge,
                per_pool(&|p| space(p).low_space as u8 as f64),
            ),
            (
                "strata_meta_low_space_events",
                "Times metadata usage crossed its low-water mark",
                Counter,
                per_pool(&|p| counters(p).low_space_events as f64),
            ),
            (
                "strata_meta_transactions",
                "Metadata transactions applied",
                Counter,
                per_pool(&|p| counters(p).txns as f64),
            ),
            (
                "strata_meta_commits",
                "Metadata commits (journal batches or checkpoints)",
                Counter,
                per_pool(&|p| counters(p).commits as f64),
            ),
            (
                "strata_meta_checkpoints",
                "Metadata checkpoints written",
                Counter,
                per_pool(&|p| counters(p).checkpoints as f64),
            ),
            (
                "strata_thin_extents_allocated",
                "Extents mapped by the pool's volumes",
                Gauge,
                per_pool(&|p| p.allocated_extents() as f64),
            ),
            (
                "strata_thin_extents",
                "Extents in the pool",
                Gauge,
                per_pool(&|p| p.extents() as f64),
            ),
        ];
        for (name, help, kind, values) in families {
            family(&mut encoder, name, help, kind, &values)?;
        }
        Ok(())
    }
}
