//! Renders `strata status` for people.

use std::fmt::Write;

use serde_json::Value;

use strata_core::ByteSize;

pub fn render(status: &Value) -> String {
    let mut out = String::new();
    let text = |v: &Value| v.as_str().unwrap_or("?").to_string();
    let num = |v: &Value| v.as_u64().unwrap_or(0);
    let _ = writeln!(
        out,
        "Strata {} — up {}s — data {}",
        text(&status["version"]),
        num(&status["uptime_s"]),
        text(&status["data_dir"])
    );
    let listeners: Vec<String> = status["listeners"]
        .as_array()
        .map(|l| l.iter().map(text).collect())
        .unwrap_or_default();
    let _ = writeln!(out, "listening on {}", listeners.join(", "));
    let _ = writeln!(
        out,
        "connections: {} open, {} since start",
        num(&status["connections"]["open"]),
        num(&status["connections"]["total"])
    );
    let _ = writeln!(out, "\nEXPORT           DEVICE        SIZE        MODE");
    for export in status["exports"].as_array().into_iter().flatten() {
        let mode = if export["read_only"].as_bool() == Some(true) {
            "ro"
        } else {
            "rw"
        };
        let _ = writeln!(
            out,
            "{:<16} {:<13} {:<11} {mode}",
            text(&export["name"]),
            text(&export["device"]),
            ByteSize(num(&export["size"])).to_string()
        );
    }
    let _ = writeln!(out, "\nDEVICES");
    for device in status["devices"].as_array().into_iter().flatten() {
        render_node(&mut out, device, 1);
    }
    out
}

fn render_node(out: &mut String, node: &Value, depth: usize) {
    let indent = "  ".repeat(depth);
    let _ = writeln!(
        out,
        "{indent}{} ({}) {} {}",
        node["name"].as_str().unwrap_or("?"),
        node["kind"].as_str().unwrap_or("?"),
        ByteSize(node["size"].as_u64().unwrap_or(0)),
        node["health"].as_str().unwrap_or("?")
    );
    if let Some(warning) = low_space_warning(node) {
        let _ = writeln!(out, "{indent}  {warning}");
    }
    if let Some(activity) = node["activity"].as_object() {
        let done = activity["done_bytes"].as_u64().unwrap_or(0);
        let total = activity["total_bytes"].as_u64().unwrap_or(0);
        let percent = if total == 0 {
            100.0
        } else {
            done as f64 * 100.0 / total as f64
        };
        let _ = writeln!(
            out,
            "{indent}  {}: {percent:.1} % ({} of {})",
            activity["what"].as_str().unwrap_or("working"),
            ByteSize(done),
            ByteSize(total)
        );
    }
    for pair in node["detail"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "{indent}  {} = {}",
            pair[0].as_str().unwrap_or(""),
            pair[1].as_str().unwrap_or("")
        );
    }
    if let Some(stats) = node["stats"].as_object() {
        for (op, counters) in stats {
            let ops = counters["ops"].as_u64().unwrap_or(0);
            if ops == 0 {
                continue;
            }
            let _ = writeln!(
                out,
                "{indent}  {op:<13} {ops:>10} ops {:>12} bytes {:>6} errors  mean {} µs",
                counters["bytes"].as_u64().unwrap_or(0),
                counters["errors"].as_u64().unwrap_or(0),
                counters["latency_us_mean"].as_u64().unwrap_or(0)
            );
        }
    }
    for child in node["children"].as_array().into_iter().flatten() {
        render_node(out, child, depth + 1);
    }
}

/// A thin pool at or above its low-water mark gets a line of its own, not just a detail.
fn low_space_warning(node: &Value) -> Option<String> {
    let detail = |key: &str| {
        node["detail"]
            .as_array()?
            .iter()
            .find(|pair| pair[0].as_str() == Some(key))
            .and_then(|pair| pair[1].as_str())
    };
    if node["kind"].as_str() != Some(strata_thin::KIND.kind) || detail("low space") != Some("true")
    {
        return None;
    }
    Some(format!(
        "LOW SPACE: {} of the data extents allocated (low water {})",
        detail("data used").unwrap_or("?"),
        detail("low water").unwrap_or("?")
    ))
}

/// Renders a layer's answer to `strata call`: one `key: value` line per entry (nested values
/// as compact JSON), or `done` when the layer had nothing to say.
pub fn render_answer(answer: &Value) -> String {
    let Some(entries) = answer.as_object().filter(|entries| !entries.is_empty()) else {
        return "done\n".to_string();
    };
    let mut out = String::new();
    for (key, value) in entries {
        let shown = match value {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let _ = writeln!(out, "{key}: {shown}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thin_pool_low_on_space_gets_a_warning_line() {
        let node = |low: &str| {
            serde_json::json!({
                "name": "pool", "kind": "thin-pool", "size": 1, "health": "degraded",
                "detail": [["data used", "87.5 %"], ["low water", "80 % (7 extents)"], ["low space", low]],
                "children": []
            })
        };
        let mut out = String::new();
        render_node(&mut out, &node("true"), 1);
        assert!(
            out.contains(
                "LOW SPACE: 87.5 % of the data extents allocated (low water 80 % (7 extents))"
            ),
            "{out}"
        );
        let mut out = String::new();
        render_node(&mut out, &node("false"), 1);
        assert!(!out.contains("LOW SPACE"), "{out}");
    }
}
