//! The stage as a registry kind and a block device: two children, `[fast, slow]` in that
//! order; format only over a blank fast child when the start policy allows it, open
//! otherwise, refuse damage.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use strata_core::layer::{ChildCount, LayerArgs, LayerKind, Options, StartPolicy, Verb};
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, Control, ControlReply, DeviceRef, Extent,
    Geometry, Result, WriteFlags, ZeroFlags,
};
use strata_meta::RecoveryError;

use crate::config::StageConfig;
use crate::shape::BLOCK;
use crate::stage::{Settings, Stage};

pub static KIND: LayerKind =
    LayerKind::new::<StageConfig>("stage", ChildCount::Exactly(2), |args| {
        Box::pin(build(args))
    })
    .about(
        "small writes staged in a log on a fast child, destaged as proximal I/O to the slow child",
    )
    .checked(check)
    .verbs(&[DESTAGE]);

/// `strata call STAGE destage`: destage everything staged now.
pub const DESTAGE: Verb = Verb {
    name: "destage",
    args: &[],
    help: "destage every staged block to the slow child now; answers what it did",
};

fn check(options: &Options) -> Result<()> {
    options
        .parse::<StageConfig>()?
        .check()
        .map_err(BlockError::InvalidArgument)
}

async fn build(args: LayerArgs) -> Result<DeviceRef> {
    let config: StageConfig = args.options.parse()?;
    config.check().map_err(BlockError::InvalidArgument)?;
    let mut children = args.all_children()?;
    let slow = children.pop().expect("two children");
    let fast = children.pop().expect("two children");
    let mut settings = Settings::from_config(&config, args.runtime.clone());
    settings.background = true;
    let stage = open_or_format(&args.name, fast, slow, &config, settings, args.start).await?;
    // What describe reports, decided values explicit: what labels record.
    let mut explicit = config.clone();
    explicit.metadata_size = Some(strata_core::ByteSize(stage.shape().log_offset));
    if let Some(table) = strata_core::layer::to_table(&explicit) {
        stage.set_config(table);
    }
    Ok(Arc::new(StageDevice(stage)))
}

/// Opens the stage on its children if the fast child holds one; formats it only if `start`
/// allows and the metadata region reads as zeros; refuses damage whatever the policy, with
/// nothing written before the decision.
pub async fn open_or_format(
    name: &str,
    fast: DeviceRef,
    slow: DeviceRef,
    config: &StageConfig,
    settings: Settings,
    start: StartPolicy,
) -> Result<Arc<Stage>> {
    let refuse = |why: String| BlockError::InvalidArgument(format!("stage {name}: {why}"));
    match strata_meta::recover(fast.as_ref(), 0).await {
        Ok(recovered) => {
            let stage = Stage::open_recovered(name, fast, slow, recovered, settings).await?;
            check_fixed(name, config, &stage)?;
            Ok(stage)
        }
        Err(RecoveryError::Io(error)) => Err(error),
        Err(RecoveryError::NoSuperblock { a, b }) => {
            // The fast child holds no store. If the slow child holds a stage's, the two were
            // given in the wrong order: say so, before any advice to format (which would
            // write metadata over the slow child's data).
            if holds_stage_metadata(slow.as_ref()).await {
                return Err(refuse(
                    "its slow child (the second) holds a stage's metadata and its fast child \
                     (the first) none: the children look swapped; a stage's children are \
                     [fast, slow], in that order"
                        .into(),
                ));
            }
            let region = config.metadata_bytes(fast.geometry().size, slow.geometry().size);
            if !strata_core::blank::region_is_zero(fast.as_ref(), 0, region).await? {
                return Err(BlockError::Corrupt(format!(
                    "stage {name}: no valid metadata superblock (copy A: {a}; copy B: {b}) but \
                     the fast child's metadata region is not blank; refusing to open or format \
                     it: run `strata check`"
                )));
            }
            if !start.may_format {
                return Err(refuse(
                    "the fast child is labelled as holding this hierarchy but its stage metadata \
                     is missing (all zeros); if this is a new layer, start it with `strata serve \
                     --format LAYER`"
                        .into(),
                ));
            }
            Stage::format(name, fast, slow, config, settings).await
        }
        Err(damage) => Err(BlockError::Corrupt(format!(
            "stage {name}: the metadata on the fast child is damaged ({damage}); refusing to \
             open or format it: run `strata check`"
        ))),
    }
}

/// Whether `device` starts with a valid metadata superblock owned by a stage.
async fn holds_stage_metadata(device: &dyn strata_core::BlockDevice) -> bool {
    matches!(
        strata_meta::read_superblock(device, 0).await,
        Ok((superblock, _)) if superblock.owner == KIND.kind
    )
}

/// Extent, range and metadata size are fixed at format: a config that names others is refused.
fn check_fixed(name: &str, config: &StageConfig, stage: &Stage) -> Result<()> {
    let shape = stage.shape();
    let mismatch = |field: &str, configured: u64, formatted: u64| {
        BlockError::InvalidArgument(format!(
            "stage {name}: field `{field}`: {configured} bytes configured but the stage was \
             formatted with {formatted}; it is fixed at creation"
        ))
    };
    if config.range.0 != shape.range_bytes() {
        return Err(mismatch("range", config.range.0, shape.range_bytes()));
    }
    let extent = shape.extent_blocks() * BLOCK;
    if config.extent.0 != extent {
        return Err(mismatch("extent", config.extent.0, extent));
    }
    match config.metadata_size {
        Some(size) if size.0 != shape.log_offset => {
            Err(mismatch("metadata-size", size.0, shape.log_offset))
        }
        _ => Ok(()),
    }
}

/// The stage as the stack's node.
pub struct StageDevice(pub Arc<Stage>);

#[async_trait]
impl BlockDevice for StageDevice {
    fn geometry(&self) -> Geometry {
        let (fast, slow) = (self.0.fast.geometry(), self.0.slow.geometry());
        Geometry {
            size: self.0.shape().size(),
            // Every map is in 4 KiB blocks: a smaller write would need a read-modify-write.
            min_io: BLOCK as u32,
            logical_block: 4096,
            physical_block: 4096,
            preferred_io: self.0.shape().range_bytes().min(u64::from(u32::MAX)) as u32,
            // A read's pieces go to either child whole.
            max_io: slow.max_io.min(fast.max_io).clamp(BLOCK as u32, 32 << 20),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            read_only: false,
            flush: true,
            fua: true,
            discard: true,
            write_zeroes: true,
            // Zeroing that may trim only changes the map; without trimming it writes zeros.
            fast_zero: true,
            block_status: true,
            rotational: self.0.slow.capabilities().rotational,
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
            Control::Call { verb, .. } if verb == DESTAGE.name => {
                let report = self.0.destage_all().await?;
                let mut table = toml::Table::new();
                for (key, value) in [
                    ("blocks", report.blocks),
                    ("skipped", report.skipped),
                    ("batches", report.batches),
                    ("requests", report.requests),
                    ("strands", report.strands),
                    ("placed-in-home-range", report.placement.in_home_range),
                    ("placed-outside-window", report.placement.outside_window),
                ] {
                    table.insert(key.into(), toml::Value::Integer(value as i64));
                }
                Ok(ControlReply::Table(table))
            }
            other => Err(strata_core::refuse(&other)),
        }
    }
}

impl Stage {
    /// The stage behind a node device a `stage` kind built (None for any other device).
    pub async fn of(device: &DeviceRef) -> Option<Arc<Stage>> {
        match device.control(Control::Handle).await {
            Ok(ControlReply::Handle(handle)) => handle.downcast::<Stage>().ok(),
            _ => None,
        }
    }
}
