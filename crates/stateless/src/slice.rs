//! `slice`: a window `[offset, offset + length)` of one child, like dm-linear.
//!
//! ```toml
//! [[layer]]
//! name = "part1"
//! kind = "slice"
//! children = ["d0"]
//! offset = "1GiB"     # default 0
//! length = "4GiB"     # default: to the end of the child
//! ```
//!
//! Keeps no state. Every request is the child's request moved by `offset`; geometry and
//! capabilities are the child's, with the size cut to the window.

use std::sync::atomic::{AtomicU64, Ordering};
use strata_core::layer::verbs;
use strata_core::lock;

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, Control, ControlReply, DeviceRef, Extent,
    Geometry, NodeStatus, Result, WriteFlags, ZeroFlags,
};

use serde::{Deserialize, Serialize};
use strata_core::layer::{self, ChildCount, LayerArgs, LayerKind};
use strata_core::ByteSize;

pub static KIND: LayerKind =
    LayerKind::new::<SliceConfig>("slice", ChildCount::Exactly(1), |args| {
        Box::pin(async move { build(args).map(|s| std::sync::Arc::new(s) as DeviceRef) })
    })
    .about("a window of one child (offset + length)")
    .verbs(&[verbs::GROW]);

/// A `[[layer]]` table of kind `slice`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct SliceConfig {
    pub offset: ByteSize,
    /// None: to the end of the child.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub length: Option<ByteSize>,
}

fn build(args: LayerArgs) -> Result<Slice> {
    let config: SliceConfig = args.options.parse()?;
    let child = args.all_children()?.remove(0);
    Slice::new(
        args.name,
        child,
        config.offset.0,
        config.length.map(|l| l.0),
    )
}

pub struct Slice {
    name: String,
    child: DeviceRef,
    offset: u64,
    /// Grows online (`Control::Grow`); never shrinks, so a request checked against an older
    /// length stays inside the window.
    length: AtomicU64,
}

impl Slice {
    /// A window of `child` from `offset`, `length` bytes long (to its end if None).
    pub fn new(name: String, child: DeviceRef, offset: u64, length: Option<u64>) -> Result<Slice> {
        let geometry = child.geometry();
        let align = u64::from(geometry.min_io.max(512));
        let length = length.unwrap_or(geometry.size.saturating_sub(offset));
        let end = offset.checked_add(length);
        if end.is_none_or(|end| end > geometry.size) || length == 0 {
            return Err(BlockError::InvalidArgument(format!(
                "slice {name}: [{offset}, +{length}) does not fit in a {}-byte child",
                geometry.size
            )));
        }
        if !offset.is_multiple_of(align) || !length.is_multiple_of(align) {
            return Err(BlockError::InvalidArgument(format!(
                "slice {name}: offset and length must be multiples of {align} bytes"
            )));
        }
        Ok(Slice {
            name,
            child,
            offset,
            length: AtomicU64::new(length),
        })
    }

    fn length(&self) -> u64 {
        self.length.load(Ordering::Acquire)
    }

    /// The window as it is now (grown, if it was), the length explicit.
    pub fn config(&self) -> SliceConfig {
        SliceConfig {
            offset: ByteSize(self.offset),
            length: Some(ByteSize(self.length())),
        }
    }

    fn grow(&self, size: u64) -> Result<()> {
        let room = self.child.geometry().size - self.offset;
        let align = u64::from(self.child.geometry().min_io.max(512));
        if size < self.length() || size > room || !size.is_multiple_of(align) {
            return Err(BlockError::InvalidArgument(format!(
                "slice {}: can grow from {} to at most {room} bytes in multiples of {align}, not to {size}",
                self.name,
                self.length()
            )));
        }
        self.length.store(size, Ordering::Release);
        tracing::info!(slice = %self.name, size, "slice grown");
        Ok(())
    }
}

#[async_trait]
impl BlockDevice for Slice {
    fn geometry(&self) -> Geometry {
        Geometry {
            size: self.length(),
            ..self.child.geometry()
        }
    }

    fn capabilities(&self) -> Capabilities {
        self.child.capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry().check_range(offset, len as u64)?;
        self.child.read(self.offset + offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.geometry().check_range(offset, data.len() as u64)?;
        self.child.write(self.offset + offset, data, flags).await
    }

    async fn flush(&self) -> Result<()> {
        self.child.flush().await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry().check_range(offset, len)?;
        self.child.discard(self.offset + offset, len).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.geometry().check_range(offset, len)?;
        self.child
            .write_zeroes(self.offset + offset, len, flags)
            .await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.geometry().check_range(offset, len)?;
        let extents = self.child.block_status(self.offset + offset, len).await?;
        Ok(extents
            .into_iter()
            .map(|e| Extent {
                offset: e.offset - self.offset,
                ..e
            })
            .collect())
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => {
                let child = strata_core::describe(self.child.as_ref()).await?;
                let mut node = NodeStatus::new(&self.name, "slice", self.length());
                node.health = child.health;
                node.detail = vec![("offset".into(), self.offset.to_string())];
                node.config = layer::to_table(&self.config());
                node.children = vec![child];
                Ok(ControlReply::Describe(node))
            }
            Control::Grow { size } => self.grow(size).map(|()| ControlReply::Done),
            Control::Lock(request) => {
                self.geometry().check_range(request.offset, request.len)?;
                let start = self.offset + request.offset;
                let range = start..start + request.len;
                let held = lock::lock_children(&request, [(&self.child, range)]).await?;
                Ok(ControlReply::Lock(held))
            }
            _ => Err(BlockError::Unsupported("slice: control")),
        }
    }
}
