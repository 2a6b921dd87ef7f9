//! Durations as configurations write them (`"2ms"`): read once here, for every layer that
//! takes one (delay, the thin pool's `full-wait`).

use std::time::Duration;

/// A duration the way a configuration writes it, in the largest unit that keeps it exact
/// (`"2ms"`, `"1500us"`, `"0"`); [`parse_duration`] reads it back to the same value.
pub fn format_duration(value: Duration) -> String {
    let nanos = value.as_nanos();
    if nanos == 0 {
        return "0".into();
    }
    let (unit, scale) = [("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)]
        .into_iter()
        .find(|(_, scale)| nanos.is_multiple_of(*scale))
        .unwrap_or(("ns", 1));
    format!("{}{unit}", nanos / scale)
}

/// Parses `"2ms"`, `"250us"`, `"1.5s"`, `"0"`: a non-negative number and a unit (ns, us, µs,
/// ms, s). Zero needs no unit; anything else does, because a bare number is ambiguous.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    const UNITS: [(&str, f64); 5] = [
        ("ns", 1e-9),
        ("us", 1e-6),
        ("µs", 1e-6),
        ("ms", 1e-3),
        ("s", 1.0),
    ];
    let (number, scale) = UNITS
        .iter()
        .find_map(|(unit, scale)| text.strip_suffix(unit).map(|n| (n.trim(), *scale)))
        .ok_or_else(|| format!("{text:?} is not a duration (examples: 2ms, 250us, 1.5s)"))?;
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (examples: 2ms, 250us, 1.5s)"))?;
    if !value.is_finite() || value < 0.0 || value * scale > 3600.0 {
        return Err(format!("{text:?} is not between 0 and one hour"));
    }
    // Whole numbers are counted exactly in nanoseconds, so that what `format_duration`
    // writes reads back to the same duration (7ms through f64 seconds is 6.999999ms).
    if let Ok(whole) = number.parse::<u64>() {
        return Ok(Duration::from_nanos(whole * (scale * 1e9).round() as u64));
    }
    Ok(Duration::from_secs_f64(value * scale))
}
