//! `strata snapshot create|list|delete|rollback|clone|compact|uncompact|export|unexport`: versions of thin
//! volumes (the pool's own verbs, sent through `strata call`'s path; exports through the
//! volume requests).

use anyhow::Context;
use serde_json::Value;
use strata_core::{out, outln, ByteSize};
use strata_stack::call::Call;
use strata_stack::volumes::VolumeRequest;
// One civil-date rendering for the list and the policies (tested in strata-thin).
use strata_thin::schedule::utc;

use crate::admin::{self, AdminRequest};
use crate::snapshot_policy_cmd;

#[derive(clap::Subcommand)]
pub enum SnapshotCommand {
    /// Take a snapshot of POOL/VOLUME: every write acknowledged before it is in it, none after.
    Create {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/VOLUME
        volume: String,
        /// The snapshot's name (default v<epoch>).
        name: Option<String>,
    },
    /// List snapshots (of one pool, or of one POOL/VOLUME) with the space each alone holds.
    List {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL or POOL/VOLUME
        of: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot (any one, in any order); frees what only it held.
    Delete {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/VOLUME
        volume: String,
        snapshot: String,
    },
    /// Make POOL/VOLUME read as SNAPSHOT again (its size too); later snapshots stay.
    Rollback {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/VOLUME
        volume: String,
        snapshot: String,
    },
    /// Make a writable volume POOL/NEW that starts as SNAPSHOT, sharing its data; exported
    /// at once as POOL/NEW.
    Clone {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/VOLUME
        volume: String,
        snapshot: String,
        /// The new volume's name (in the same pool).
        new: String,
    },
    /// Store what only SNAPSHOT holds as deltas against the next snapshot (Clotho's
    /// differential compaction); it stays readable. Run again to finish one cut short.
    Compact {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/VOLUME
        volume: String,
        snapshot: String,
    },
    /// Write a compacted snapshot's extents back whole and drop its deltas.
    Uncompact {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/VOLUME
        volume: String,
        snapshot: String,
    },
    /// Export a snapshot read-only as POOL/VOLUME@SNAPSHOT while the volume is in use.
    Export {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/VOLUME
        volume: String,
        snapshot: String,
    },
    /// End a snapshot's export.
    Unexport {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/VOLUME
        volume: String,
        snapshot: String,
        /// Close the connections of clients using it instead of refusing.
        #[arg(long)]
        force: bool,
    },
    /// Show POOL/VOLUME's periodic snapshots, or set them (--every, --every-writes, --keep)
    /// or remove them (--off); see snapshot_policy_cmd.rs.
    Policy {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/VOLUME
        volume: String,
        /// Take a snapshot this often: 30s, 10m, 2h, 1d.
        #[arg(long)]
        every: Option<String>,
        /// Take a snapshot after this many write requests (counted in memory).
        #[arg(long)]
        every_writes: Option<String>,
        /// Keep only the last K snapshots the policy made (manual ones are never deleted).
        #[arg(long)]
        keep: Option<String>,
        /// Stop taking periodic snapshots (the ones taken stay).
        #[arg(long)]
        off: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Protect a snapshot: no policy (keep-K, the reserve) deletes it; a delete is refused.
    Protect {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/VOLUME
        volume: String,
        snapshot: String,
    },
    /// End a snapshot's protection.
    Unprotect {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/VOLUME
        volume: String,
        snapshot: String,
    },
}

/// `POOL/VOLUME` in two.
pub(crate) fn split(volume: &str) -> anyhow::Result<(String, String)> {
    match volume.split_once('/') {
        Some((pool, name)) if !pool.is_empty() && !name.is_empty() => {
            Ok((pool.to_string(), name.to_string()))
        }
        _ => anyhow::bail!("{volume:?}: name a volume as POOL/VOLUME"),
    }
}

pub(crate) fn arg(name: &str, value: impl Into<String>) -> (String, Option<String>) {
    (name.to_string(), Some(value.into()))
}

pub(crate) fn call(
    target: &crate::AdminTarget,
    layer: String,
    verb: &str,
    args: Vec<(String, Option<String>)>,
) -> anyhow::Result<Value> {
    let request = AdminRequest::Call(Call {
        layer,
        verb: verb.to_string(),
        args,
    });
    let reply = admin::request(&target.socket(), &request)?;
    Ok(reply["answer"].clone())
}

/// A verb on one snapshot of POOL/VOLUME.
fn on_snapshot(
    target: &crate::AdminTarget,
    volume: &str,
    snapshot: &str,
    verb: &str,
) -> anyhow::Result<Value> {
    let (pool, name) = split(volume)?;
    let args = vec![arg("volume", name), arg("snapshot", snapshot)];
    call(target, pool, verb, args)
}

fn volume_request(target: &crate::AdminTarget, request: VolumeRequest) -> anyhow::Result<()> {
    let reply = admin::request(&target.socket(), &AdminRequest::Volume(request))?;
    outln!("{}", reply["done"].as_str().unwrap_or("done"));
    Ok(())
}

fn freed(answer: &Value) -> String {
    let bytes = answer["bytes-freed"].as_u64().unwrap_or(0);
    let mut said = format!("{} freed", ByteSize(bytes));
    for line in answer["exports"].as_array().into_iter().flatten() {
        said.push_str(&format!("; {}", line.as_str().unwrap_or_default()));
    }
    said
}

pub fn run(command: SnapshotCommand) -> anyhow::Result<()> {
    match command {
        SnapshotCommand::Create {
            target,
            volume,
            name,
        } => {
            let (pool, name_of_volume) = split(&volume)?;
            let mut args = vec![arg("volume", name_of_volume)];
            args.extend(name.map(|n| arg("name", n)));
            let answer = call(&target, pool, "snapshot-create", args)?;
            outln!(
                "snapshot {volume}@{} taken (epoch {}, {})",
                answer["snapshot"].as_str().unwrap_or("?"),
                answer["epoch"],
                ByteSize(answer["size"].as_u64().unwrap_or(0))
            );
        }
        SnapshotCommand::List { target, of, json } => {
            let (pool, volume) = match of.split_once('/') {
                Some((pool, volume)) => (pool.to_string(), Some(volume.to_string())),
                None => (of.clone(), None),
            };
            let args = volume.map(|v| vec![arg("volume", v)]).unwrap_or_default();
            let answer = call(&target, pool.clone(), "snapshot-list", args)?;
            let rows = answer["snapshots"].as_array().cloned().unwrap_or_default();
            if json {
                outln!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                out!(
                    "{}",
                    render(&pool, &rows).context("the server's snapshot list")?
                );
            }
        }
        SnapshotCommand::Delete {
            target,
            volume,
            snapshot,
        } => {
            let answer = on_snapshot(&target, &volume, &snapshot, "snapshot-delete")?;
            outln!("deleted snapshot {volume}@{snapshot}: {}", freed(&answer));
        }
        SnapshotCommand::Rollback {
            target,
            volume,
            snapshot,
        } => {
            let answer = on_snapshot(&target, &volume, &snapshot, "snapshot-rollback")?;
            outln!(
                "{volume} reads as {snapshot} again: {} (connected clients see the change at once; \
                 reconnect them if the size changed)",
                freed(&answer)
            );
        }
        SnapshotCommand::Clone {
            target,
            volume,
            snapshot,
            new,
        } => {
            let (pool, name) = split(&volume)?;
            let args = vec![
                arg("volume", name),
                arg("snapshot", snapshot.clone()),
                arg("clone", new.clone()),
            ];
            call(&target, pool.clone(), "snapshot-clone", args)?;
            outln!("cloned {volume}@{snapshot} as {pool}/{new}, exported as \"{pool}/{new}\"");
        }
        SnapshotCommand::Compact {
            target,
            volume,
            snapshot,
        } => {
            let answer = on_snapshot(&target, &volume, &snapshot, "snapshot-compact")?;
            let number = |key: &str| answer[key].as_u64().unwrap_or(0);
            outln!(
                "compacted {volume}@{snapshot} against {}: {} extents as {} of deltas \
                 (their data: {}; {} kept whole), {} extents freed, {} delta extents; {} saved",
                answer["base"].as_str().unwrap_or("?"),
                number("extents-compacted"),
                ByteSize(number("delta-bytes")),
                ByteSize(number("data-bytes")),
                number("extents-kept"),
                number("extents-freed"),
                number("delta-extents"),
                signed_bytes(answer["bytes-saved"].as_i64().unwrap_or(0)),
            );
        }
        SnapshotCommand::Uncompact {
            target,
            volume,
            snapshot,
        } => {
            let answer = on_snapshot(&target, &volume, &snapshot, "snapshot-uncompact")?;
            outln!(
                "uncompacted {volume}@{snapshot}: {} extents restored into {} extents, {} delta \
                 extents freed",
                answer["extents-restored"],
                answer["extents-allocated"],
                answer["delta-extents-freed"],
            );
        }
        SnapshotCommand::Export {
            target,
            volume,
            snapshot,
        } => volume_request(
            &target,
            VolumeRequest::Export {
                volume: format!("{volume}@{snapshot}"),
            },
        )?,
        SnapshotCommand::Unexport {
            target,
            volume,
            snapshot,
            force,
        } => volume_request(
            &target,
            VolumeRequest::Unexport {
                volume: format!("{volume}@{snapshot}"),
                force,
            },
        )?,
        SnapshotCommand::Policy {
            target,
            volume,
            every,
            every_writes,
            keep,
            off,
            json,
        } => {
            let flags = snapshot_policy_cmd::PolicyFlags {
                every,
                every_writes,
                keep,
                off,
            };
            snapshot_policy_cmd::policy(&target, &volume, flags, json)?
        }
        SnapshotCommand::Protect {
            target,
            volume,
            snapshot,
        } => snapshot_policy_cmd::protect(&target, &volume, &snapshot, true)?,
        SnapshotCommand::Unprotect {
            target,
            volume,
            snapshot,
        } => snapshot_policy_cmd::protect(&target, &volume, &snapshot, false)?,
    }
    Ok(())
}

/// A byte count that may be negative (a compaction that cost space).
fn signed_bytes(bytes: i64) -> String {
    let sign = if bytes < 0 { "-" } else { "" };
    format!("{sign}{}", ByteSize(bytes.unsigned_abs()))
}

/// The snapshot table: name, time taken, size, space it alone holds, space it shares, and
/// for a compacted one, its deltas' size and what they are made against.
fn render(pool: &str, rows: &[Value]) -> anyhow::Result<String> {
    use std::fmt::Write as _;
    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("no snapshots\n");
        return Ok(out);
    }
    writeln!(
        out,
        "{:<36} {:>6} {:<20} {:>10} {:>10} {:>10}  compacted",
        "snapshot", "epoch", "taken (UTC)", "size", "own", "shared"
    )?;
    for row in rows {
        let text = |key: &str| row[key].as_str().unwrap_or("?").to_string();
        let bytes = |key: &str| ByteSize(row[key].as_u64().unwrap_or(0)).to_string();
        let compacted = match row["compacted_against"].as_str() {
            Some(base) => format!("{} against {base}", bytes("delta_bytes")),
            None => "-".to_string(),
        };
        writeln!(
            out,
            "{:<36} {:>6} {:<20} {:>10} {:>10} {:>10}  {compacted}",
            format!("{pool}/{}@{}", text("volume"), text("name")),
            row["epoch"],
            utc(row["created_ms"].as_u64().unwrap_or(0)),
            bytes("size"),
            bytes("unique_bytes"),
            bytes("shared_bytes"),
        )?;
    }
    Ok(out)
}
