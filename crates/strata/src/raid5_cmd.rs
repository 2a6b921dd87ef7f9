//! `strata raid5 grow|pause|resume|watch`: growing a served raid5 onto new disks (ALV), with
//! its progress as a bar (the same figures `strata status` shows).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use strata_core::outln;
use strata_stack::call::Call;
use strata_stack::reconfig::Change;

use crate::admin::{self, AdminRequest};

#[derive(clap::Subcommand)]
pub enum Raid5Command {
    /// Add disks to a raid5 and spread its data over all of them, online (ALV: docs/layers/
    /// raid5-grow.md). The size grows when the last stripe is moved; clients see it when they
    /// reconnect. Shows the progress until the grow completes (Ctrl-C stops watching, not
    /// the grow).
    Grow {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// The raid5 layer.
        layer: String,
        /// The new disks (files, created sparse at the members' size, or block devices).
        #[arg(long = "add", required = true, num_args = 1..)]
        add: Vec<PathBuf>,
        /// How the data move: alv, or md (md's reshape, kept as the baseline to compare).
        #[arg(long, default_value = "alv")]
        policy: String,
        /// With a member failed mid-grow: continue (degraded) or wait (for its replacement).
        #[arg(long, default_value = "continue")]
        on_failure: String,
        /// Return once the grow has started instead of showing its progress.
        #[arg(long)]
        detach: bool,
    },
    /// Pause the grow under way after its current window (it stays paused across restarts).
    Pause {
        #[command(flatten)]
        target: crate::AdminTarget,
        layer: String,
    },
    /// Resume a paused grow.
    Resume {
        #[command(flatten)]
        target: crate::AdminTarget,
        layer: String,
    },
    /// Show a grow's progress until it completes.
    Watch {
        #[command(flatten)]
        target: crate::AdminTarget,
        layer: String,
    },
}

pub fn run(command: Raid5Command) -> anyhow::Result<()> {
    match command {
        Raid5Command::Grow {
            target,
            layer,
            add,
            policy,
            on_failure,
            detach,
        } => {
            let mut options = toml::Table::new();
            options.insert("policy".into(), toml::Value::String(policy));
            options.insert("on-failure".into(), toml::Value::String(on_failure));
            let paths = add
                .iter()
                .map(|p| crate::absolute(p))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let change = Change::GrowMembers {
                layer: layer.clone(),
                paths,
                options,
            };
            let reply = admin::request(&target.socket(), &AdminRequest::Change(change))?;
            outln!("{}", reply["done"].as_str().unwrap_or("done"));
            if !detach {
                watch(&target, &layer)?;
            }
            Ok(())
        }
        Raid5Command::Pause { target, layer } => call(&target, layer, "grow-pause"),
        Raid5Command::Resume { target, layer } => call(&target, layer, "grow-resume"),
        Raid5Command::Watch { target, layer } => watch(&target, &layer),
    }
}

fn call(target: &crate::AdminTarget, layer: String, verb: &str) -> anyhow::Result<()> {
    let request = AdminRequest::Call(Call {
        layer,
        verb: verb.into(),
        args: Vec::new(),
    });
    admin::request(&target.socket(), &request)?;
    outln!("done");
    Ok(())
}

/// The node named `layer` in a status tree.
fn find<'a>(node: &'a Value, layer: &str) -> Option<&'a Value> {
    if node["name"].as_str() == Some(layer) {
        return Some(node);
    }
    let children = node["children"].as_array().into_iter().flatten();
    let nested = node.as_array().into_iter().flatten();
    children.chain(nested).find_map(|child| find(child, layer))
}

fn detail<'a>(node: &'a Value, key: &str) -> Option<&'a str> {
    node["detail"]
        .as_array()?
        .iter()
        .find(|pair| pair[0].as_str() == Some(key))
        .and_then(|pair| pair[1].as_str())
}

/// The layer's node in the server's status (exports' devices, then every node).
fn layer_node(target: &crate::AdminTarget, layer: &str) -> anyhow::Result<Value> {
    let status = admin::request(&target.socket(), &AdminRequest::Status)?;
    let found = ["devices", "nodes", "exports"]
        .iter()
        .find_map(|key| find(&status[*key], layer))
        .or_else(|| find(&status, layer))
        .cloned();
    found.ok_or_else(|| anyhow::anyhow!("no layer {layer:?} in the server's status"))
}

fn watch(target: &crate::AdminTarget, layer: &str) -> anyhow::Result<()> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {percent:>3}% {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )?
        .progress_chars("=> "),
    );
    loop {
        let node = layer_node(target, layer)?;
        let Some(state) = detail(&node, "grow") else {
            bar.finish_and_clear();
            outln!(
                "{layer}: grow complete: {} members, {} bytes",
                detail(&node, "members").unwrap_or("?"),
                node["size"].as_u64().unwrap_or(0)
            );
            return Ok(());
        };
        if let Some(activity) = node["activity"].as_object() {
            bar.set_length(activity["total_bytes"].as_u64().unwrap_or(0));
            bar.set_position(activity["done_bytes"].as_u64().unwrap_or(0));
        }
        bar.set_message(format!("{layer}: {state}"));
        if state.starts_with("stopped") {
            bar.abandon();
            anyhow::bail!("{layer}: the grow {state}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
