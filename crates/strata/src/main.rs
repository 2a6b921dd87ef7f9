//! `strata`: serve hierarchies of virtual block devices over NBD.

mod admin;
mod brick_status;
mod cluster_cmd;
mod kinds;
mod lock_cmd;
mod lock_session;
mod metrics_http;
mod migrate_metrics;
mod pool_metrics;
mod raid5_cmd;
mod serve;
mod sim_forward;
mod snapshot_cmd;
mod snapshot_policy_cmd;
mod stage_metrics;
mod status;
mod volume_cmd;

use std::path::PathBuf;
use std::process::ExitCode;
use strata_core::{errln, out, outln};

use clap::{Parser, Subcommand};

use crate::admin::AdminRequest;
use strata_stack::check;
use strata_stack::reconfig::Change;

/// mimalloc returns freed request buffers to the OS within milliseconds; glibc's malloc kept
/// ~70 MiB resident after a burst of 1 MiB requests (measured), over our idle budget.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "strata",
    version,
    about = "Block-storage virtualization, served over NBD"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the configured exports (the embedded default when no config is given).
    Serve(serve::ServeArgs),
    /// Bricks of shared volumes: format one, serve one, ask one what it holds.
    #[command(subcommand)]
    Brick(cluster_cmd::BrickCommand),
    /// The cluster of hosts sharing volumes, coordinated on etcd: its status, its volumes.
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCommand),
    /// Show a running server's exports, devices and counters.
    Status {
        #[command(flatten)]
        target: AdminTarget,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Verify the metadata on devices offline (the server must not be using them).
    ///
    /// Exit status: 0 clean (or repaired), 1 damaged or refused, 3 a device is not a Strata
    /// disk (no hierarchy label and no metadata superblock) and none is damaged.
    ///
    /// --repair rewrites only what it can repair (a damaged superblock copy, a torn journal
    /// tail) and nothing on a clean device. A member of a mirror or raid5 is repaired only
    /// when every member of that layer is given on the command line and all are at the
    /// same metadata generation and journal length: repairing one member alone (or one
    /// behind the others) could make a stale member win. For a member that is lost or
    /// stale, serve with --degraded and use `strata replace` instead.
    Check {
        /// Devices (files) whose metadata to check.
        #[arg(required = true)]
        devices: Vec<PathBuf>,
        /// Rewrite the metadata from what recovery reads, where that cannot lose
        /// acknowledged data (a torn journal tail, a damaged superblock copy); see above for
        /// members of a mirror or raid5.
        #[arg(long)]
        repair: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Replace a member of a layer with a new disk, online; the layer rebuilds onto it.
    Replace {
        #[command(flatten)]
        target: AdminTarget,
        /// The layer (a mirror, a raid5).
        layer: String,
        /// The member to replace: its name or its index among the layer's children.
        member: String,
        /// The new disk (a file, created sparse at the member's size, or a block device).
        path: PathBuf,
        /// Name of the new disk (default: the file's stem).
        #[arg(long)]
        name: Option<String>,
    },
    /// Add a new disk as a member of a layer, online (a mirror leg; a concat's tail).
    AddMember {
        #[command(flatten)]
        target: AdminTarget,
        layer: String,
        path: PathBuf,
        #[arg(long)]
        name: Option<String>,
    },
    /// Stop using a member of a layer, as if it had failed.
    FailMember {
        #[command(flatten)]
        target: AdminTarget,
        layer: String,
        member: String,
    },
    /// Grow a layer (a slice) to a new size, online.
    Grow {
        #[command(flatten)]
        target: AdminTarget,
        layer: String,
        /// The new size, e.g. 8GiB.
        size: String,
    },
    /// Grow a raid5 onto new disks online, pause or resume the grow, watch its progress.
    Raid5 {
        #[command(subcommand)]
        command: raid5_cmd::Raid5Command,
    },
    /// List the layer kinds, their options and the online verbs each declares.
    Kinds,
    /// Run a command while holding a byte-range lock of an export (lock verbs for NBD
    /// clients: the lock reaches the shared volumes under the export through its stack).
    Lock {
        #[command(flatten)]
        target: AdminTarget,
        #[command(flatten)]
        args: lock_cmd::LockArgs,
    },
    /// Print a running server's metrics in Prometheus text format.
    Metrics {
        #[command(flatten)]
        target: AdminTarget,
    },
    /// Call a verb a layer declares (`strata kinds` lists each kind's verbs), online.
    ///
    /// Arguments are NAME=VALUE (a flag may be given bare). Sent to a layer above the one
    /// that declares the verb, the call goes down to it.
    Call {
        #[command(flatten)]
        target: AdminTarget,
        layer: String,
        verb: String,
        /// NAME=VALUE, or a bare flag NAME.
        args: Vec<String>,
        /// Print the layer's answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Versions of thin volumes: snapshots taken, listed, deleted, rolled back to, cloned,
    /// exported read-only while serving.
    Snapshot {
        #[command(subcommand)]
        command: snapshot_cmd::SnapshotCommand,
    },
    /// Create, list, resize and delete thin volumes while serving.
    Volume {
        #[command(subcommand)]
        command: volume_cmd::VolumeCommand,
    },
    /// The deterministic simulator: Strata's layers over modelled disks, in virtual time
    /// (runs the `strata-sim` executable installed next to this one).
    #[command(disable_help_flag = true)]
    Sim {
        /// The simulator's command and its arguments (`strata sim --help` lists them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

#[derive(clap::Args)]
struct AdminTarget {
    /// Data folder of the server (its admin socket is <data-dir>/admin.sock).
    #[arg(long, default_value = "strata-data")]
    data_dir: PathBuf,
    /// The admin socket, if not in the data folder.
    #[arg(long)]
    admin: Option<PathBuf>,
}

impl AdminTarget {
    fn socket(&self) -> PathBuf {
        self.admin
            .clone()
            .unwrap_or_else(|| self.data_dir.join("admin.sock"))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    raise_open_file_limit();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            errln!("strata: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Raises the soft limit on open files to the hard one. Each file disk holds
/// `strata_backend` descriptions of its own for syncs (nine descriptors a disk) besides its
/// clients' sockets, and systemd's default soft limit is 1024 (its hard limit far more), a
/// limit that only protects programs using select(2), which Strata does not.
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let from = limit.current;
        limit.current = limit.maximum;
        if let Err(error) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(?from, %error, "could not raise the open-file limit");
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let command = match cli.command {
        Command::Serve(args) => return run_serve(&args),
        Command::Brick(command) => {
            cluster_cmd::run_brick(command)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Cluster(command) => {
            cluster_cmd::run_cluster(command)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Check {
            devices,
            repair,
            json,
        } => return run_check(&devices, repair, json),
        other => other,
    };
    match command {
        Command::Serve(_) | Command::Brick(_) | Command::Cluster(_) | Command::Check { .. } => {
            unreachable!("handled above")
        }
        Command::Lock { target, args } => return lock_cmd::run(&target.socket(), args),
        Command::Kinds => {
            out!("{}", kinds::render());
            Ok(())
        }
        Command::Status { target, json } => {
            let status = admin::request(&target.socket(), &AdminRequest::Status)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                out!("{}", status::render(&status));
            }
            Ok(())
        }
        Command::Replace {
            target,
            layer,
            member,
            path,
            name,
        } => change(
            &target,
            Change::Replace {
                layer,
                member,
                path: absolute(&path)?,
                name,
            },
        ),
        Command::AddMember {
            target,
            layer,
            path,
            name,
        } => change(
            &target,
            Change::AddMember {
                layer,
                path: absolute(&path)?,
                name,
            },
        ),
        Command::FailMember {
            target,
            layer,
            member,
        } => change(&target, Change::FailMember { layer, member }),
        Command::Grow {
            target,
            layer,
            size,
        } => {
            let size = strata_core::ByteSize::parse(&size)
                .map_err(anyhow::Error::msg)?
                .0;
            change(&target, Change::Grow { layer, size })
        }
        Command::Call {
            target,
            layer,
            verb,
            args,
            json,
        } => call(&target, layer, verb, &args, json),
        Command::Volume { command } => volume_cmd::run(command),
        Command::Raid5 { command } => raid5_cmd::run(command),
        Command::Snapshot { command } => snapshot_cmd::run(command),
        Command::Sim { args } => return sim_forward::run(&args),
        Command::Metrics { target } => {
            let reply = admin::request(&target.socket(), &AdminRequest::Metrics)?;
            out!("{}", reply["metrics"].as_str().unwrap_or_default());
            Ok(())
        }
    }
    .map(|()| ExitCode::SUCCESS)
}

fn run_serve(args: &serve::ServeArgs) -> anyhow::Result<ExitCode> {
    let loaded = serve::load_config(args)?;
    let start = serve::start_options(args, &loaded)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata")
        .build()?;
    runtime.block_on(serve::serve(loaded, start))?;
    Ok(ExitCode::SUCCESS)
}

fn run_check(devices: &[PathBuf], repair: bool, json: bool) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut damaged = false;
    let mut foreign = false;
    for report in runtime.block_on(check::check_all(devices, repair))? {
        damaged |= !report.errors.is_empty();
        foreign |= report.not_strata;
        if json {
            outln!("{}", serde_json::to_string(&report)?);
        } else {
            out!("{}", check::render(&report));
        }
    }
    if damaged {
        anyhow::bail!("metadata damage found");
    }
    if foreign {
        return Ok(ExitCode::from(check::NOT_STRATA_EXIT));
    }
    Ok(ExitCode::SUCCESS)
}

/// The server resolves paths against its own folder; the operator means the shell's.
pub(crate) fn absolute(path: &std::path::Path) -> anyhow::Result<PathBuf> {
    Ok(std::env::current_dir()?.join(path))
}

fn change(target: &AdminTarget, change: Change) -> anyhow::Result<()> {
    let reply = admin::request(&target.socket(), &AdminRequest::Change(change))?;
    outln!("{}", reply["done"].as_str().unwrap_or("done"));
    Ok(())
}

fn call(
    target: &AdminTarget,
    layer: String,
    verb: String,
    args: &[String],
    json: bool,
) -> anyhow::Result<()> {
    let args = args
        .iter()
        .map(|arg| match arg.split_once('=') {
            Some((name, value)) => (name.to_string(), Some(value.to_string())),
            None => (arg.clone(), None),
        })
        .collect();
    let request = AdminRequest::Call(strata_stack::call::Call { layer, verb, args });
    let reply = admin::request(&target.socket(), &request)?;
    let answer = &reply["answer"];
    if json {
        outln!("{}", serde_json::to_string_pretty(answer)?);
    } else {
        out!("{}", status::render_answer(answer));
    }
    Ok(())
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
        // rustls warns about what peers send that it ignores (an IP address as SNI, which
        // GnuTLS clients send): our own log lines say what a connection's TLS came to.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rustls=error"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(|| LossyStderr)
        .init();
}

/// stderr for the log, dropping what it cannot write. The log's reader may go away
/// (`strata serve 2>&1 | head`): a write then fails with EPIPE, and no log line is worth
/// more than the data path. Any other write error (a full disk under a redirect) is dropped
/// for the same reason.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}
