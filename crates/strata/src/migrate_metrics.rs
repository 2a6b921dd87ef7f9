//! Prometheus metrics of migrate layers, read at scrape time: each child's smoothed response
//! time and deviation, δ, where the data is, and every counter `strata status` shows,
//! labelled by layer (and child, or the pair of children a migration went between).

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use strata_migrate::Migrate;

use strata_core::metric_family::{family, Family, Kind, Labels};

pub struct MigrateCollector {
    layers: Vec<Arc<Migrate>>,
}

impl std::fmt::Debug for MigrateCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.layers.iter().map(|l| l.name()).collect();
        f.debug_struct("MigrateCollector")
            .field("layers", &names)
            .finish()
    }
}

impl MigrateCollector {
    pub fn new(layers: Vec<Arc<Migrate>>) -> Self {
        MigrateCollector { layers }
    }

    fn per_layer(&self, value: impl Fn(&Migrate) -> f64) -> Vec<(Labels, f64)> {
        self.layers
            .iter()
            .map(|l| (vec![("migrate", l.name().to_string())], value(l)))
            .collect()
    }

    /// One series per child of every layer.
    fn per_child(&self, value: impl Fn(&Migrate) -> Vec<f64>) -> Vec<(Labels, f64)> {
        let mut out = Vec::new();
        for layer in &self.layers {
            for (child, v) in value(layer).into_iter().enumerate() {
                let labels = vec![
                    ("migrate", layer.name().to_string()),
                    ("child", child.to_string()),
                ];
                out.push((labels, v));
            }
        }
        out
    }

    /// One series per ordered pair of two children of every layer.
    fn per_pair(&self) -> Vec<(Labels, f64)> {
        let mut out = Vec::new();
        for layer in &self.layers {
            for (from, to, count) in layer.pair_counters() {
                let labels = vec![
                    ("migrate", layer.name().to_string()),
                    ("from", from.to_string()),
                    ("to", to.to_string()),
                ];
                out.push((labels, count as f64));
            }
        }
        out
    }
}

/// "skipped no token" → "strata_migrate_skipped_no_token".
fn metric_name(counter: &str) -> String {
    let name: String = counter
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("strata_migrate_{name}")
}

impl Collector for MigrateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.layers.is_empty() {
            return Ok(());
        }
        let seconds = |us: f64| us / 1e6;
        let families: Vec<Family> = vec![
            (
                "strata_migrate_response_seconds",
                "Smoothed response time of each child, as the layer measures it",
                Kind::Gauge,
                self.per_child(|l| {
                    l.response_times()
                        .iter()
                        .map(|e| seconds(e.mean_us))
                        .collect()
                }),
            ),
            (
                "strata_migrate_response_deviation_seconds",
                "Standard deviation of each child's recent response times, weighted as the smoothed mean",
                Kind::Gauge,
                self.per_child(|l| {
                    l.response_times()
                        .iter()
                        .map(|e| seconds(e.deviation_us))
                        .collect()
                }),
            ),
            (
                "strata_migrate_blocks",
                "4 KiB blocks whose data is on each child",
                Kind::Gauge,
                self.per_child(|l| l.blocks_per_device().iter().map(|&b| b as f64).collect()),
            ),
            (
                "strata_migrate_child_requests",
                "Requests the layer sent each child",
                Kind::Counter,
                self.per_child(|l| l.child_counters().iter().map(|c| c.0 as f64).collect()),
            ),
            (
                "strata_migrate_migrations_to",
                "Migrations toward each child",
                Kind::Counter,
                self.per_child(|l| l.child_counters().iter().map(|c| c.1 as f64).collect()),
            ),
            (
                "strata_migrate_migrations_between",
                "Migrations from one child to another",
                Kind::Counter,
                self.per_pair(),
            ),
            (
                "strata_migrate_delta_seconds",
                "The migration threshold now, between the slowest and the fastest child",
                Kind::Gauge,
                self.per_layer(|l| seconds(l.current_delta_us())),
            ),
            (
                "strata_migrate_partial_chunks",
                "Chunks split over two children",
                Kind::Gauge,
                self.per_layer(|l| l.partial_chunks() as f64),
            ),
        ];
        for (name, help, kind, values) in families {
            family(&mut encoder, name, help, kind, &values)?;
        }
        let mut by_name: Vec<(String, Vec<(Labels, f64)>)> = Vec::new();
        for layer in &self.layers {
            for (i, (counter, value)) in layer.layer_counters().into_iter().enumerate() {
                if by_name.len() <= i {
                    by_name.push((counter, Vec::new()));
                }
                by_name[i]
                    .1
                    .push((vec![("migrate", layer.name().to_string())], value as f64));
            }
        }
        for (counter, values) in by_name {
            family(
                &mut encoder,
                &metric_name(&counter),
                &counter,
                Kind::Counter,
                &values,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_names_become_metric_names() {
        assert_eq!(
            metric_name("skipped no token"),
            "strata_migrate_skipped_no_token"
        );
        assert_eq!(metric_name("migrations"), "strata_migrate_migrations");
    }
}
