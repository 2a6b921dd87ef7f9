//! Prometheus metrics of stages, read at scrape time: the log's usage, the destage backlog,
//! the fast child's health and every counter `strata status` shows, labelled by stage.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use strata_stage::Stage;

use strata_core::metric_family::{family, Family, Kind, Labels};

pub struct StageCollector {
    stages: Vec<Arc<Stage>>,
}

impl std::fmt::Debug for StageCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.stages.iter().map(|s| s.name()).collect();
        f.debug_struct("StageCollector")
            .field("stages", &names)
            .finish()
    }
}

impl StageCollector {
    pub fn new(stages: Vec<Arc<Stage>>) -> Self {
        StageCollector { stages }
    }

    fn per_stage(&self, value: impl Fn(&Stage) -> f64) -> Vec<(Labels, f64)> {
        self.stages
            .iter()
            .map(|s| (vec![("stage", s.name().to_string())], value(s)))
            .collect()
    }
}

/// "destage I/Os" → "strata_stage_destage_ios": the status name in snake case, prefixed.
fn metric_name(counter: &str) -> String {
    let name: String = counter
        .chars()
        .filter(|&c| c != '/')
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("strata_stage_{name}")
}

impl Collector for StageCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.stages.is_empty() {
            return Ok(());
        }
        let usage = |s: &Stage| s.log_usage().unwrap_or((0, 0));
        let families: Vec<Family> = vec![
            (
                "strata_stage_log_slots",
                "Slots of the staging log",
                Kind::Gauge,
                self.per_stage(|s| s.shape().log_slots as f64),
            ),
            (
                "strata_stage_log_slots_busy",
                "Log slots live, reserved or waiting for their free to be durable",
                Kind::Gauge,
                self.per_stage(|s| usage(s).1 as f64),
            ),
            (
                "strata_stage_backlog_blocks",
                "Blocks staged and not yet destaged",
                Kind::Gauge,
                self.per_stage(|s| usage(s).0 as f64),
            ),
            (
                "strata_stage_fast_child_failed",
                "1 once the fast child (log and metadata) has failed",
                Kind::Gauge,
                self.per_stage(|s| s.fast_child_failed() as u8 as f64),
            ),
        ];
        let counters = self
            .stages
            .iter()
            .map(|s| (s.name().to_string(), s.counters()));
        let mut by_name: Vec<(&'static str, Vec<(Labels, f64)>)> = Vec::new();
        for (stage, snapshot) in counters {
            for (i, (counter, value)) in snapshot.into_iter().enumerate() {
                if by_name.len() <= i {
                    by_name.push((counter, Vec::new()));
                }
                by_name[i]
                    .1
                    .push((vec![("stage", stage.clone())], value as f64));
            }
        }
        for (name, help, kind, values) in families {
            family(&mut encoder, name, help, kind, &values)?;
        }
        // The counters `strata status` shows, one family each, named after them.
        for (counter, values) in by_name {
            family(
                &mut encoder,
                &metric_name(counter),
                counter,
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
        assert_eq!(metric_name("destage I/Os"), "strata_stage_destage_ios");
        assert_eq!(
            metric_name("placed in home range"),
            "strata_stage_placed_in_home_range"
        );
    }
}
