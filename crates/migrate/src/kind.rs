//! The migrate layer as a registry kind and a block device: N ≥ 2 children, child 0 the
//! local disk (it also holds the metadata); format only over a blank metadata region when
//! the start policy allows it, open otherwise, refuse damage.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use strata_core::layer::{ChildCount, LayerArgs, LayerKind, Options, StartPolicy, Verb};
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, Control, ControlReply, DeviceRef, Extent,
    Geometry, Result, WriteFlags, ZeroFlags,
};
use strata_meta::RecoveryError;

use crate::config::MigrateConfig;
use crate::migrate::{Migrate, Settings};
use crate::shape::BLOCK;

pub static KIND: LayerKind =
    LayerKind::new::<MigrateConfig>("migrate", ChildCount::AtLeast(2), |args| {
        Box::pin(build(args))
    })
    .about("hot data moves between a local child and remote ones by observed response time")
    .checked(check)
    .verbs(&[MERGE]);

/// `strata call MIGRATE merge`: merge every partial chunk now.
pub const MERGE: Verb = Verb {
    name: "merge",
    args: &[],
    help: "merge every chunk split over two children back into one; answers how many",
};

fn check(options: &Options) -> Result<()> {
    options
        .parse::<MigrateConfig>()?
        .check()
        .map_err(BlockError::InvalidArgument)
}

async fn build(args: LayerArgs) -> Result<DeviceRef> {
    let config: MigrateConfig = args.options.parse()?;
    config.check().map_err(BlockError::InvalidArgument)?;
    let children = args.all_children()?;
    let settings = Settings::from_config(&config, args.runtime.clone())?;
    let layer = open_or_format(&args.name, children, &config, settings, args.start).await?;
    let mut explicit = config.clone();
    explicit.metadata_size = Some(strata_core::ByteSize(layer.shape().metadata_bytes));
    if let Some(table) = strata_core::layer::to_table(&explicit) {
        layer.set_config(table);
    }
    Ok(Arc::new(MigrateDevice(layer)))
}

/// Opens the layer if child 0 holds one; formats it only if `start` allows and the metadata
/// region reads as zeros; refuses damage whatever the policy, with nothing written before
/// the decision.
pub async fn open_or_format(
    name: &str,
    children: Vec<DeviceRef>,
    config: &MigrateConfig,
    settings: Settings,
    start: StartPolicy,
) -> Result<Arc<Migrate>> {
    let refuse = |why: String| BlockError::InvalidArgument(format!("migrate {name}: {why}"));
    let Some(first) = children.first().cloned() else {
        return Err(refuse("no children".into()));
    };
    match strata_meta::recover(first.as_ref(), 0).await {
        Ok(recovered) => {
            let layer = Migrate::open_recovered(name, children, recovered, settings).await?;
            check_fixed(name, config, &layer)?;
            Ok(layer)
        }
        Err(RecoveryError::Io(error)) => Err(error),
        Err(RecoveryError::NoSuperblock { a, b }) => {
            for (i, child) in children.iter().enumerate().skip(1) {
                if holds_migrate_metadata(child.as_ref()).await {
                    return Err(refuse(format!(
                        "child {i} holds a migrate layer's metadata and child 0 none: the \
                         children look reordered; child 0 (the local disk) holds the metadata"
                    )));
                }
            }
            let region = config.metadata_bytes(children.iter().map(|c| c.geometry().size).sum());
            let region = region.min(first.geometry().size);
            if !strata_core::blank::region_is_zero(first.as_ref(), 0, region).await? {
                return Err(BlockError::Corrupt(format!(
                    "migrate {name}: no valid metadata superblock (copy A: {a}; copy B: {b}) \
                     but child 0's metadata region is not blank; refusing to open or format \
                     it: run `strata check`"
                )));
            }
            if !start.may_format {
                return Err(refuse(
                    "child 0 holds no migrate metadata (all zeros); if this is a new layer, \
                     start it with `strata serve --format LAYER`"
                        .into(),
                ));
            }
            Migrate::format(name, children, config, settings).await
        }
        Err(damage) => Err(BlockError::Corrupt(format!(
            "migrate {name}: the metadata on child 0 is damaged ({damage}); refusing to open \
             or format it: run `strata check`"
        ))),
    }
}

async fn holds_migrate_metadata(device: &dyn BlockDevice) -> bool {
    matches!(
        strata_meta::read_superblock(device, 0).await,
        Ok((superblock, _)) if superblock.owner == KIND.kind
    )
}

/// The chunk and the metadata size are fixed at format: a config naming others is refused.
fn check_fixed(name: &str, config: &MigrateConfig, layer: &Migrate) -> Result<()> {
    let shape = layer.shape();
    let mismatch = |field: &str, configured: u64, formatted: u64| {
        BlockError::InvalidArgument(format!(
            "migrate {name}: field `{field}`: {configured} bytes configured but the layer was \
             formatted with {formatted}; it is fixed at creation"
        ))
    };
    if config.chunk.0 != shape.chunk_bytes() {
        return Err(mismatch("chunk", config.chunk.0, shape.chunk_bytes()));
    }
    match config.metadata_size {
        Some(size) if size.0 != shape.metadata_bytes => {
            Err(mismatch("metadata-size", size.0, shape.metadata_bytes))
        }
        _ => Ok(()),
    }
}

/// The layer as the stack's node.
pub struct MigrateDevice(pub Arc<Migrate>);

#[async_trait]
impl BlockDevice for MigrateDevice {
    fn geometry(&self) -> Geometry {
        let max_io = self
            .0
            .children()
            .iter()
            .map(|c| c.geometry().max_io)
            .min()
            .unwrap_or(BLOCK as u32);
        Geometry {
            size: self.0.shape().size(),
            // The validity bitmaps are per 4 KiB block.
            min_io: BLOCK as u32,
            logical_block: 4096,
            physical_block: 4096,
            preferred_io: self.0.shape().chunk_bytes() as u32,
            max_io: max_io.clamp(BLOCK as u32, 32 << 20),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            read_only: false,
            flush: true,
            fua: true,
            discard: true,
            write_zeroes: true,
            fast_zero: true,
            block_status: true,
            ..Capabilities::default()
        }
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry().check_range(offset, len as u64)?;
        self.0.read_blocks(offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.geometry().check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        self.0.write_blocks(offset, data, flags.fua).await
    }

    async fn flush(&self) -> Result<()> {
        self.0.flush_all().await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry().check_range(offset, len)?;
        self.0.unmap_blocks(offset, len, false).await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.geometry().check_range(offset, len)?;
        Ok(self.0.allocation(offset, len))
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.geometry().check_range(offset, len)?;
        if flags.may_trim {
            return self.0.unmap_blocks(offset, len, flags.fua).await;
        }
        strata_core::write_zeroes_by_writing(self, offset, len, flags).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        if let Some(reply) = self.0.background().control(&request).await {
            return Ok(reply);
        }
        match request {
            Control::Describe => self.0.describe().await.map(ControlReply::Describe),
            Control::Handle => Ok(ControlReply::Handle(self.0.clone())),
            Control::Call { verb, .. } if verb == MERGE.name => {
                let merged = self.0.merge_partial(u64::MAX, true).await?;
                let mut table = toml::Table::new();
                table.insert("merged".into(), toml::Value::Integer(merged as i64));
                Ok(ControlReply::Table(table))
            }
            other => Err(strata_core::refuse(&other)),
        }
    }
}

impl Migrate {
    /// The layer behind a node device a `migrate` kind built (None for any other device).
    pub async fn of(device: &DeviceRef) -> Option<Arc<Migrate>> {
        match device.control(Control::Handle).await {
            Ok(ControlReply::Handle(handle)) => handle.downcast::<Migrate>().ok(),
            _ => None,
        }
    }
}
