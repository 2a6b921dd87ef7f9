//! Results of a run, from the driver's `IoRecord`s and `DeviceSample`s: statistics, CSV/JSON
//! export, SVG plots and a terminal table.

pub mod export;
pub mod plot;
pub mod stats;
pub mod table;

pub use export::{
    cdf_to_csv, device_summaries_to_csv, records_from_csv, records_to_csv, samples_from_csv,
    samples_to_csv, summary_from_json, summary_latencies_from_csv, summary_to_csv,
    time_points_to_csv, to_json, write_text, ExportError, SummaryRow,
};
pub use plot::{
    latency_cdf_svg, latency_over_time_svg, lines_svg, queue_depth_svg, utilization_svg, PlotError,
    Series,
};
pub use stats::{
    latency_cdf, latency_ns, latency_over_time, percentile, summarize, summarize_devices,
    summarize_latencies, throughput, CdfPoint, DeviceSummary, LatencySummary, RunSummary, Scope,
    ScopedLatency, Throughput, TimePoint,
};
pub use table::{format_device_table, format_summary_table};
