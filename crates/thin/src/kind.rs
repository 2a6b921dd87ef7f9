//! The thin pool as a registry kind: its build opens (or formats) the pool over its one child
//! and hands back the pool's node device, which is not a device to export (size 0) but the
//! parent of the volumes, made and found through control verbs.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use strata_core::duration::parse_duration;
use strata_core::layer::{
    Arg, ArgKind, ChildCount, LayerArgs, LayerKind, Options, Verb, CREATE_VOLUME,
};
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, Control, ControlReply, DeviceRef,
    DeviceShare, Geometry, Result, SpaceReport, WriteFlags,
};

use crate::{PoolConfig, ThinPool};

pub static KIND: LayerKind =
    LayerKind::new::<PoolConfig>("thin-pool", ChildCount::Exactly(1), |args| {
        Box::pin(build(args))
    })
    .about("thin pool: volumes that get physical extents on first write (Virtual Allocation)")
    .checked(check)
    .verbs(VERBS);

const VOLUME: Arg = Arg {
    name: "volume",
    kind: ArgKind::Name,
    help: "the volume's name (exported as <pool>/<volume>)",
    optional: false,
};
const SIZE: Arg = Arg {
    name: "size",
    kind: ArgKind::Size,
    help: "the volume's virtual size, e.g. 10GiB",
    optional: false,
};

/// The pool's online changes.
pub static VERBS: &[Verb] = &[
    Verb {
        name: CREATE_VOLUME,
        args: &[VOLUME, SIZE],
        help: "create a thin volume and export it",
    },
    Verb {
        name: "volume-list",
        args: &[],
        help: "list the pool's volumes and its space",
    },
    Verb {
        name: "volume-resize",
        args: &[
            VOLUME,
            SIZE,
            Arg {
                name: "shrink",
                kind: ArgKind::Flag,
                help: "agree that data past the new end is discarded",
                optional: true,
            },
        ],
        help: "change a volume's virtual size",
    },
    Verb {
        name: "volume-delete",
        args: &[
            VOLUME,
            Arg {
                name: "force",
                kind: ArgKind::Flag,
                help: "close the connections of clients using it instead of refusing",
                optional: true,
            },
        ],
        help: "delete a volume and give its extents back to the pool",
    },
    Verb {
        name: "grow-pool",
        args: &[],
        help: "append the pool's next grow-from spare to its concat child and take the room in",
    },
    Verb {
        name: SNAPSHOT_CREATE,
        args: &[
            VOLUME,
            Arg {
                name: "name",
                kind: ArgKind::Name,
                help: "the snapshot's name (default v<epoch>)",
                optional: true,
            },
        ],
        help: "take a snapshot of a volume: every write acknowledged before it is in it",
    },
    Verb {
        name: SNAPSHOT_LIST,
        args: &[Arg {
            name: "volume",
            kind: ArgKind::Name,
            help: "only this volume's snapshots",
            optional: true,
        }],
        help: "list snapshots with the space each alone holds and the space it shares",
    },
    Verb {
        name: SNAPSHOT_DELETE,
        args: &[VOLUME, SNAPSHOT],
        help: "delete a snapshot (any one, in any order) and free what only it held",
    },
    Verb {
        name: SNAPSHOT_ROLLBACK,
        args: &[VOLUME, SNAPSHOT],
        help: "make a volume read as one of its snapshots again (the snapshots stay)",
    },
    Verb {
        name: SNAPSHOT_CLONE,
        args: &[
            VOLUME,
            SNAPSHOT,
            Arg {
                name: "clone",
                kind: ArgKind::Name,
                help: "the new volume's name",
                optional: false,
            },
        ],
        help: "make a writable volume that starts as a snapshot and shares its data",
    },
    Verb {
        name: SNAPSHOT_COMPACT,
        args: &[VOLUME, SNAPSHOT],
        help: "store a snapshot's own extents as deltas against the next snapshot (Clotho)",
    },
    Verb {
        name: SNAPSHOT_UNCOMPACT,
        args: &[VOLUME, SNAPSHOT],
        help: "write a compacted snapshot's extents back whole and drop its deltas",
    },
    // Versions policies (policy_verbs.rs).
    crate::policy_verbs::POLICY,
    crate::policy_verbs::PROTECT,
    crate::policy_verbs::UNPROTECT,
];

pub const SNAPSHOT_CREATE: &str = "snapshot-create";
pub const SNAPSHOT_LIST: &str = "snapshot-list";
pub const SNAPSHOT_DELETE: &str = "snapshot-delete";
pub const SNAPSHOT_ROLLBACK: &str = "snapshot-rollback";
pub const SNAPSHOT_CLONE: &str = "snapshot-clone";
pub const SNAPSHOT_COMPACT: &str = "snapshot-compact";
pub const SNAPSHOT_UNCOMPACT: &str = "snapshot-uncompact";

const SNAPSHOT: Arg = Arg {
    name: "snapshot",
    kind: ArgKind::Name,
    help: "the snapshot's name",
    optional: false,
};

/// The loader's check: the options' types, then what the types cannot say (the extent rule).
fn check(options: &Options) -> Result<()> {
    options
        .parse::<PoolConfig>()?
        .check()
        .map_err(BlockError::InvalidArgument)
}

async fn build(args: LayerArgs) -> Result<DeviceRef> {
    let config: PoolConfig = args.options.parse()?;
    config.check().map_err(BlockError::InvalidArgument)?;
    let settings = config
        .settings(args.runtime.clone(), parse_duration)
        .map_err(BlockError::InvalidArgument)?;
    let child = args.all_children()?.remove(0);
    let pool = ThinPool::open_or_format(
        &args.name,
        child,
        &config.pool_options(),
        settings,
        args.start,
    )
    .await?;
    // What describe reports, defaults explicit: what labels record.
    if let Some(table) = strata_core::layer::to_table(&config.explicit()) {
        pool.set_config(table);
    }
    Ok(Arc::new(PoolNode(pool)))
}

impl ThinPool {
    /// The pool behind a node device a thin-pool kind built (None for any other device).
    pub async fn of(device: &DeviceRef) -> Option<Arc<ThinPool>> {
        match device.control(Control::Handle).await {
            Ok(ControlReply::Handle(handle)) => handle.downcast::<ThinPool>().ok(),
            _ => None,
        }
    }
}

/// The pool as a node of the stack: no bytes of its own; its volumes are the devices.
struct PoolNode(Arc<ThinPool>);

impl PoolNode {
    /// A volume, or a snapshot of one as `volume@snapshot` (read-only).
    fn volume(&self, name: &str) -> Result<ControlReply> {
        if let Some((volume, snapshot)) = name.split_once('@') {
            let device = self.0.snapshot_device(volume, snapshot)?;
            return Ok(ControlReply::Device(Arc::new(device)));
        }
        let volume = self.0.open_volume(name).ok_or_else(|| {
            BlockError::InvalidArgument(format!("the pool has no volume {name:?}"))
        })?;
        Ok(ControlReply::Device(Arc::new(volume)))
    }

    fn space_report(&self) -> SpaceReport {
        let pool = &self.0;
        let unit = pool.extent_size();
        let devices = (pool.volume_usage().into_iter())
            .map(|usage| DeviceShare {
                name: usage.name,
                size: usage.size,
                allocated_bytes: usage.mapped_extents * unit,
            })
            .collect();
        SpaceReport {
            unit_bytes: unit,
            data_bytes: pool.data_bytes(),
            allocated_bytes: pool.allocated_extents() * unit,
            devices,
        }
    }
}

/// An argument the stack checked against the verb's declaration.
fn text<'a>(args: &'a toml::Table, name: &str) -> Result<&'a str> {
    args.get(name)
        .and_then(toml::Value::as_str)
        .ok_or_else(|| BlockError::InvalidArgument(format!("argument {name:?} is missing")))
}

/// A report as a reply table (field names in kebab-case, as the CLI prints them).
fn as_table(report: &impl serde::Serialize) -> Result<toml::Table> {
    let table = toml::Table::try_from(report)
        .map_err(|e| BlockError::InvalidArgument(format!("report: {e}")))?;
    Ok(table
        .into_iter()
        .map(|(key, value)| (key.replace('_', "-"), value))
        .collect())
}

impl PoolNode {
    /// The pool's own verbs (versions), called through `strata call` / `strata snapshot`.
    async fn call(&self, verb: &str, args: &toml::Table) -> Result<toml::Table> {
        let pool = &self.0;
        let mut answer = toml::Table::new();
        let freed = |answer: &mut toml::Table, extents: u64| {
            answer.insert("extents-freed".into(), (extents as i64).into());
            answer.insert(
                "bytes-freed".into(),
                ((extents * pool.extent_size()) as i64).into(),
            );
        };
        match verb {
            SNAPSHOT_CREATE => {
                let volume = text(args, "volume")?;
                let name = args.get("name").and_then(toml::Value::as_str);
                let snapshot = pool.create_snapshot(volume, name).await?;
                answer.insert("volume".into(), volume.into());
                answer.insert("snapshot".into(), snapshot.name.into());
                answer.insert("epoch".into(), i64::from(snapshot.epoch).into());
                answer.insert("size".into(), (snapshot.size as i64).into());
                answer.insert("created-ms".into(), (snapshot.created_ms as i64).into());
            }
            SNAPSHOT_LIST => {
                let volume = args.get("volume").and_then(toml::Value::as_str);
                let list = pool.snapshots(volume)?;
                let rows = toml::Value::try_from(&list)
                    .map_err(|e| BlockError::InvalidArgument(format!("snapshot list: {e}")))?;
                answer.insert("snapshots".into(), rows);
            }
            SNAPSHOT_DELETE => {
                let extents = pool
                    .delete_snapshot(text(args, "volume")?, text(args, "snapshot")?)
                    .await?;
                freed(&mut answer, extents);
            }
            SNAPSHOT_ROLLBACK => {
                let extents = pool
                    .rollback(text(args, "volume")?, text(args, "snapshot")?)
                    .await?;
                freed(&mut answer, extents);
            }
            SNAPSHOT_CLONE => {
                let clone = text(args, "clone")?;
                pool.clone_snapshot(text(args, "volume")?, text(args, "snapshot")?, clone)
                    .await?;
                answer.insert("volume".into(), clone.into());
            }
            SNAPSHOT_COMPACT => {
                let report = pool
                    .compact_snapshot(text(args, "volume")?, text(args, "snapshot")?)
                    .await?;
                answer = as_table(&report)?;
            }
            SNAPSHOT_UNCOMPACT => {
                let report = pool
                    .uncompact_snapshot(text(args, "volume")?, text(args, "snapshot")?)
                    .await?;
                answer = as_table(&report)?;
            }
            // Versions policies (policy_verbs.rs).
            other => return crate::policy_verbs::call(pool, other, args).await,
        }
        Ok(answer)
    }
}

#[async_trait]
impl BlockDevice for PoolNode {
    fn geometry(&self) -> Geometry {
        Geometry::byte_addressable(0)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            read_only: true,
            ..Capabilities::default()
        }
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry().check_range(offset, len as u64)?;
        Ok(BytesMut::new())
    }

    async fn write(&self, offset: u64, data: Bytes, _flags: WriteFlags) -> Result<()> {
        self.geometry().check_range(offset, data.len() as u64)
    }

    async fn flush(&self) -> Result<()> {
        self.0.flush().await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        // Quiesce, resume and stop reach the pool's metadata committer.
        if let Some(reply) = self.0.background().control(&request).await {
            return Ok(reply);
        }
        match request {
            Control::Describe => self.0.describe().await.map(ControlReply::Describe),
            Control::Volumes => Ok(ControlReply::Names(self.0.volume_names())),
            Control::Volume { name } => self.volume(&name),
            Control::CreateVolume { name, size } => {
                self.0.create_volume(&name, size).await?;
                self.volume(&name)
            }
            Control::ResizeVolume { name, size } => {
                self.0.resize_volume(&name, size).await?;
                Ok(ControlReply::Done)
            }
            Control::DeleteVolume { name } => {
                self.0.delete_volume(&name).await?;
                Ok(ControlReply::Done)
            }
            Control::Space => Ok(ControlReply::Space(self.space_report())),
            Control::Call { verb, args } => self.call(&verb, &args).await.map(ControlReply::Table),
            Control::Handle => Ok(ControlReply::Handle(self.0.clone())),
            other => Err(strata_core::refuse(&other)),
        }
    }
}
