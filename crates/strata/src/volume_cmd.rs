//! `strata volume create|list|resize|delete`: the command line of thin volumes managed while
//! serving (the server side is `strata_stack::volumes`).

use anyhow::Context;
use strata_core::{out, outln, ByteSize};
use strata_stack::volumes::{PoolListing, VolumeRequest};

use crate::admin::{self, AdminRequest};

/// `strata volume …` on the command line.
#[derive(clap::Subcommand)]
pub enum VolumeCommand {
    /// Create a thin volume and export it as POOL/NAME at once.
    Create {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/NAME
        volume: String,
        /// Virtual size, a multiple of 512 bytes (e.g. 10GiB); may exceed the pool.
        #[arg(long)]
        size: String,
    },
    /// List every pool's volumes, their sizes and allocation, and each pool's over-commit.
    List {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Grow or shrink a volume. Connected clients see the new size when they reconnect.
    Resize {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/NAME
        volume: String,
        #[arg(long)]
        size: String,
        /// Confirm a shrink: everything stored past the new end is discarded.
        #[arg(long)]
        shrink: bool,
    },
    /// Delete a volume, its data and its export.
    Delete {
        #[command(flatten)]
        target: crate::AdminTarget,
        /// POOL/NAME
        volume: String,
        /// Close the connections of clients using the volume instead of refusing.
        #[arg(long)]
        force: bool,
    },
}

/// Runs a `strata volume` command against a server.
pub fn run(command: VolumeCommand) -> anyhow::Result<()> {
    let parse_size = |size: &str| -> anyhow::Result<u64> {
        Ok(ByteSize::parse(size)
            .map_err(|e| anyhow::anyhow!("--size {size:?}: {e}"))?
            .0)
    };
    let (target, request, json) = match command {
        VolumeCommand::Create {
            target,
            volume,
            size,
        } => {
            let size = parse_size(&size)?;
            (target, VolumeRequest::Create { volume, size }, false)
        }
        VolumeCommand::List { target, json } => (target, VolumeRequest::List, json),
        VolumeCommand::Resize {
            target,
            volume,
            size,
            shrink,
        } => {
            let size = parse_size(&size)?;
            (
                target,
                VolumeRequest::Resize {
                    volume,
                    size,
                    shrink,
                },
                false,
            )
        }
        VolumeCommand::Delete {
            target,
            volume,
            force,
        } => (target, VolumeRequest::Delete { volume, force }, false),
    };
    let listing = matches!(request, VolumeRequest::List);
    let reply = admin::request(&target.socket(), &AdminRequest::Volume(request))?;
    if !listing {
        outln!("{}", reply["done"].as_str().unwrap_or("done"));
    } else if json {
        outln!("{}", serde_json::to_string_pretty(&reply["pools"])?);
    } else {
        let pools: Vec<PoolListing> = serde_json::from_value(reply["pools"].clone())
            .context("the server's volume list is not in the expected shape")?;
        out!("{}", render(&pools));
    }
    Ok(())
}

fn render(pools: &[PoolListing]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if pools.is_empty() {
        out.push_str("no thin pools\n");
    }
    for pool in pools {
        let _ = writeln!(
            out,
            "pool {}: {} of {} allocated, volumes {} in all, over-commit {:.2}",
            pool.pool,
            ByteSize(pool.allocated_bytes),
            ByteSize(pool.data_bytes),
            ByteSize(pool.volume_bytes),
            pool.overcommit
        );
        let _ = writeln!(
            out,
            "  {:<28} {:>12} {:>12}  {:<7} export",
            "volume", "size", "allocated", "clients"
        );
        for volume in &pool.volumes {
            let _ = writeln!(
                out,
                "  {:<28} {:>12} {:>12}  {:<7} {}",
                format!("{}/{}", pool.pool, volume.volume),
                ByteSize(volume.size).to_string(),
                ByteSize(volume.allocated_bytes).to_string(),
                volume.clients,
                volume.exports.join(", ")
            );
        }
    }
    out
}
