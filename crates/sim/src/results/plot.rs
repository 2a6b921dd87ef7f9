//! SVG plots with plotters' SVG back end, which writes labels as `<text>` elements: no font
//! files are read, so plots render the same on any machine (the viewer picks the font). No
//! PNG: plotters' bitmap back end would need a TrueType font at run time.

use std::collections::BTreeMap;
use std::ops::Range;

use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::prelude::*;

use crate::model::{DeviceSample, MILLIS, SECONDS};

use super::stats::{CdfPoint, TimePoint};

const SIZE: (u32, u32) = (800, 500);

#[derive(Debug, thiserror::Error)]
#[error("drawing {what}: {message}")]
pub struct PlotError {
    pub what: &'static str,
    pub message: String,
}

/// One named line: x and y already in plot units.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

struct Axes<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
}

fn span(values: impl Iterator<Item = f64>, floor: f64) -> Range<f64> {
    let max = values.fold(floor, f64::max);
    // 5% headroom so the highest point is not on the frame.
    0.0..if max > 0.0 { max * 1.05 } else { 1.0 }
}

/// A tick label without trailing zeros: 0.25, 2, 100.
fn tick(value: &f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn all_points(series: &[Series]) -> impl Iterator<Item = &(f64, f64)> {
    series.iter().flat_map(|s| s.points.iter())
}

/// Draws line series; `x_spec` is a linear or logarithmic x range.
fn line_chart<XS>(
    axes: &Axes,
    series: &[Series],
    x_spec: XS,
    y_range: Range<f64>,
) -> Result<String, PlotError>
where
    XS: AsRangedCoord<Value = f64>,
    XS::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let fail = |e: &dyn std::fmt::Display| PlotError {
        what: "chart",
        message: e.to_string(),
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(axes.title, ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(x_spec, y_range)
            .map_err(|e| fail(&e))?;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 15))
            .x_labels(8)
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .axis_desc_style(("sans-serif", 17))
            .x_desc(axes.x_label)
            .y_desc(axes.y_label)
            .draw()
            .map_err(|e| fail(&e))?;
        for (index, line) in series.iter().enumerate() {
            let color = Palette99::pick(index).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    line.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| fail(&e))?
                .label(line.name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        if series.len() > 1 {
            chart
                .configure_series_labels()
                .label_font(("sans-serif", 15))
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| fail(&e))?;
        }
        root.present().map_err(|e| fail(&e))?;
    }
    Ok(svg)
}

/// Linear axes from 0.
fn linear_chart(axes: &Axes, series: &[Series], y_max: Option<f64>) -> Result<String, PlotError> {
    let x_range = span(all_points(series).map(|p| p.0), 0.0);
    let y_range = match y_max {
        Some(max) => 0.0..max,
        None => span(all_points(series).map(|p| p.1), 0.0),
    };
    line_chart(axes, series, x_range, y_range)
}

/// Named lines on linear axes from 0 (e.g. one per policy), with a legend when there are
/// several.
pub fn lines_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<String, PlotError> {
    let axes = Axes {
        title,
        x_label,
        y_label,
    };
    linear_chart(&axes, series, None)
}

/// Latency CDFs, one line per named series (e.g. per op or per policy), x in ms on a
/// logarithmic axis so that a tail 10x the median stays readable.
pub fn latency_cdf_svg(title: &str, curves: &[(&str, &[CdfPoint])]) -> Result<String, PlotError> {
    // A latency of 0 has no logarithm: draw it at 1 ns.
    let ms = |ns: u64| ns.max(1) as f64 / MILLIS as f64;
    let series: Vec<Series> = curves
        .iter()
        .map(|(name, points)| Series {
            name: (*name).to_owned(),
            points: points
                .iter()
                .map(|p| (ms(p.latency_ns), p.fraction))
                .collect(),
        })
        .collect();
    let axes = Axes {
        title,
        x_label: "latency (ms, log scale)",
        y_label: "fraction of requests",
    };
    let low = all_points(&series)
        .map(|p| p.0)
        .fold(f64::INFINITY, f64::min);
    let high = all_points(&series).map(|p| p.0).fold(0.0, f64::max);
    let (low, high) = if low.is_finite() {
        (low / 1.2, high * 1.2)
    } else {
        (0.001, 1.0)
    };
    line_chart(&axes, &series, (low..high).log_scale(), 0.0..1.0)
}

/// Mean latency per time bucket, x in seconds, y in ms.
pub fn latency_over_time_svg(title: &str, points: &[TimePoint]) -> Result<String, PlotError> {
    let series = Series {
        name: "mean latency".to_owned(),
        points: points
            .iter()
            .map(|p| {
                (
                    p.at_ns as f64 / SECONDS as f64,
                    p.mean_latency_ns / MILLIS as f64,
                )
            })
            .collect(),
    };
    let axes = Axes {
        title,
        x_label: "time (s)",
        y_label: "mean latency (ms)",
    };
    linear_chart(&axes, &[series], None)
}

/// One series per device, in device-name order.
fn per_device(samples: &[DeviceSample], value: impl Fn(&DeviceSample) -> f64) -> Vec<Series> {
    let mut devices: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for sample in samples {
        devices
            .entry(sample.device.as_str())
            .or_default()
            .push((sample.at as f64 / SECONDS as f64, value(sample)));
    }
    devices
        .into_iter()
        .map(|(name, points)| Series {
            name: name.to_owned(),
            points,
        })
        .collect()
}

pub fn utilization_svg(title: &str, samples: &[DeviceSample]) -> Result<String, PlotError> {
    let series = per_device(samples, |s| s.utilization);
    let axes = Axes {
        title,
        x_label: "time (s)",
        y_label: "utilization",
    };
    linear_chart(&axes, &series, Some(1.0))
}

pub fn queue_depth_svg(title: &str, samples: &[DeviceSample]) -> Result<String, PlotError> {
    let series = per_device(samples, |s| s.queue_depth as f64);
    let axes = Axes {
        title,
        x_label: "time (s)",
        y_label: "requests outstanding",
    };
    linear_chart(&axes, &series, None)
}
