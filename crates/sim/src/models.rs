//! Device-model presets by name, as experiment files name them, with their options.
//!
//! ```toml
//! [[disk]]
//! name = "d0"
//! model = "cheetah-15k5-300g"   # or wd-re3-1t, wd-re3-1t-order-quirk, fc-10k-146g,
//!                               # intel-x25m-160gb, proximal-staging-flash
//! scheduler = "sptf"            # HDDs: sptf (default) or fifo
//! queue-depth = 8               # HDDs: commands the drive reorders
//! capacity = 34359738368        # proximal-staging-flash: bytes (default 32 GiB)
//! link = "rtt-17ms"             # any model: behind a network link (migration paper, Table 1)
//! ```

use crate::hdd::{presets, Hdd, Scheduler};
use crate::model::DeviceModel;
use crate::net::{Link, LinkParams, Remote};
use crate::ssd::{Ssd, SsdParams};

/// Every preset name, for error messages and `strata sim models`.
pub fn preset_names() -> Vec<String> {
    let mut names: Vec<String> = presets::all().into_iter().map(|p| p.name).collect();
    names.push(SsdParams::intel_x25m_160gb().name);
    names.push(SsdParams::proximal_staging(1).name);
    names
}

/// The model `name` with `options`, seeded (the drive's initial angle and arm position, the
/// link's delays).
pub fn build(name: &str, options: &toml::Table, seed: u64) -> Result<Box<dyn DeviceModel>, String> {
    let mut used = vec!["link"];
    let model: Box<dyn DeviceModel> = if let Some(mut params) = presets::by_name(name) {
        used.extend(["scheduler", "queue-depth"]);
        if let Some(scheduler) = text(options, "scheduler")? {
            params.scheduler = match scheduler.as_str() {
                "sptf" => Scheduler::Sptf,
                "fifo" => Scheduler::Fifo,
                other => return Err(format!("`scheduler`: {other:?} is not sptf or fifo")),
            };
        }
        if let Some(depth) = integer(options, "queue-depth")? {
            if depth == 0 {
                return Err("`queue-depth` must be at least 1".into());
            }
            params.queue_depth = depth as usize;
        }
        Box::new(Hdd::with_seed(params, seed))
    } else if name == SsdParams::intel_x25m_160gb().name {
        Box::new(Ssd::new(SsdParams::intel_x25m_160gb()))
    } else if name == SsdParams::proximal_staging(1).name {
        used.push("capacity");
        let capacity = integer(options, "capacity")?.unwrap_or(32 << 30);
        Box::new(Ssd::new(SsdParams::proximal_staging(capacity)))
    } else {
        return Err(format!(
            "unknown model {name:?} (presets: {})",
            preset_names().join(", ")
        ));
    };
    if let Some(key) = options.keys().find(|k| !used.contains(&k.as_str())) {
        return Err(format!(
            "model {name} has no option `{key}` (options: {})",
            used.join(", ")
        ));
    }
    match text(options, "link")? {
        None => Ok(model),
        Some(link) => {
            let params = link
                .strip_prefix("rtt-")
                .and_then(|ms| ms.strip_suffix("ms"))
                .and_then(|ms| ms.parse().ok())
                .and_then(LinkParams::migration_rtt_ms)
                .ok_or_else(|| {
                    format!("`link`: {link:?} is not one of rtt-9ms, rtt-17ms, rtt-25ms")
                })?;
            Ok(Box::new(Remote::new(
                Link::new(params, crate::executor::derive_seed(seed, "link")),
                model,
            )))
        }
    }
}

fn text(options: &toml::Table, key: &str) -> Result<Option<String>, String> {
    match options.get(key) {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("`{key}` must be a string")),
    }
}

fn integer(options: &toml::Table, key: &str) -> Result<Option<u64>, String> {
    match options.get(key) {
        None => Ok(None),
        Some(toml::Value::Integer(n)) if *n >= 0 => Ok(Some(*n as u64)),
        Some(_) => Err(format!("`{key}` must be a non-negative integer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_build_and_options_are_checked() {
        for name in preset_names() {
            let model = build(&name, &toml::Table::new(), 1).unwrap();
            assert!(model.capacity() > 0, "{name}");
        }
        let mut options = toml::Table::new();
        options.insert("scheduler".into(), toml::Value::String("fifo".into()));
        options.insert("link".into(), toml::Value::String("rtt-17ms".into()));
        assert!(build("wd-re3-1t", &options, 1).is_ok());
        options.insert("capacity".into(), toml::Value::Integer(5));
        let error = build("wd-re3-1t", &options, 1).err().unwrap();
        assert!(error.contains("`capacity`"), "{error}");
        let error = build("floppy", &toml::Table::new(), 1).err().unwrap();
        assert!(error.contains("cheetah-15k5-300g"), "{error}");
        let mut bad_link = toml::Table::new();
        bad_link.insert("link".into(), toml::Value::String("rtt-3ms".into()));
        assert!(build("intel-x25m-160gb", &bad_link, 1).is_err());
    }
}
