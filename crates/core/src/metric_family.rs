//! Metric families whose values are read at scrape time: the collectors of state a component
//! already keeps (a pool's space, a stage's log, a brick's units) report it through these
//! rather than keep a second copy in Prometheus counters and gauges.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// One metric family: name, help, type, and a value per series (its labels).
pub type Family = (&'static str, &'static str, Kind, Vec<(Labels, f64)>);
pub type Labels = Vec<(&'static str, String)>;

pub enum Kind {
    Gauge,
    Counter,
}

/// Writes one family: its descriptor, then each series with its value as read now.
pub fn family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: Kind,
    values: &[(Labels, f64)],
) -> Result<(), std::fmt::Error> {
    let metric_type = match kind {
        Kind::Gauge => ConstGauge::new(0.0f64).metric_type(),
        Kind::Counter => ConstCounter::new(0.0f64).metric_type(),
    };
    let mut metric = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (labels, value) in values {
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let series = metric.encode_family(&labels)?;
        match kind {
            Kind::Gauge => ConstGauge::new(*value).encode(series)?,
            Kind::Counter => ConstCounter::new(*value).encode(series)?,
        }
    }
    Ok(())
}
