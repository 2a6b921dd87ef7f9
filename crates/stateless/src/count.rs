//! `count`: counts the requests that pass through it, by kind, and the bytes read and
//! written; `strata status` shows the counts. The smallest useful filter, and the worked
//! example of `docs/layers/README.md` ("Adding a layer"): one module and one registry line.
//!
//! ```toml
//! [[layer]]
//! name = "counted"
//! kind = "count"
//! children = ["d0"]
//! ```
//!
//! It changes no data and no timing: everything but the counting and the description is
//! forwarded by [`Filter`]'s defaults. (Every device's latency histograms are exported to
//! Prometheus already; this filter counts at one chosen point of a stack.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use strata_core::layer::{self, ChildCount, LayerArgs, LayerKind, Verb};
use strata_core::{
    async_trait, Control, ControlReply, DeviceRef, Filter, NodeStatus, Result, WriteFlags,
    ZeroFlags,
};

pub static KIND: LayerKind =
    LayerKind::new::<CountConfig>("count", ChildCount::Exactly(1), |args| {
        Box::pin(async move { build(args).map(|c| Arc::new(c) as DeviceRef) })
    })
    .about("counts the requests passing through, by kind, and the bytes moved")
    .verbs(&[RESET_COUNTS]);

/// A verb of the layer's own (`strata call LAYER reset-counts`): the counts start again from
/// zero; the answer is what they were.
pub const RESET_COUNTS: Verb = Verb {
    name: "reset-counts",
    args: &[],
    help: "start the counts again from zero; answers what they were",
};

/// A `[[layer]]` table of kind `count`: no options.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountConfig {}

fn build(args: LayerArgs) -> Result<Count> {
    let _: CountConfig = args.options.parse()?;
    let child = args.all_children()?.remove(0);
    Ok(Count::new(args.name, child))
}

/// What has passed through so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub write_zeroes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl Counts {
    /// Each count with the name `status` shows it under.
    pub fn named(self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("reads", self.reads),
            ("writes", self.writes),
            ("flushes", self.flushes),
            ("discards", self.discards),
            ("write-zeroes", self.write_zeroes),
            ("bytes read", self.bytes_read),
            ("bytes written", self.bytes_written),
        ]
        .into_iter()
    }
}

pub struct Count {
    name: String,
    child: DeviceRef,
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    write_zeroes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

impl Count {
    pub fn new(name: String, child: DeviceRef) -> Count {
        Count {
            name,
            child,
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            discards: AtomicU64::new(0),
            write_zeroes: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
        }
    }

    pub fn counts(&self) -> Counts {
        self.take(false)
    }

    /// The counts, set back to zero when `reset` (each counter swapped on its own: a request
    /// passing meanwhile is counted before or after, never lost).
    fn take(&self, reset: bool) -> Counts {
        let get = |counter: &AtomicU64| {
            if reset {
                counter.swap(0, Ordering::Relaxed)
            } else {
                counter.load(Ordering::Relaxed)
            }
        };
        Counts {
            reads: get(&self.reads),
            writes: get(&self.writes),
            flushes: get(&self.flushes),
            discards: get(&self.discards),
            write_zeroes: get(&self.write_zeroes),
            bytes_read: get(&self.bytes_read),
            bytes_written: get(&self.bytes_written),
        }
    }
}

/// Requests are counted when they arrive, whether or not the child then fails them: the
/// filter counts what was asked of the stack at this point.
#[async_trait]
impl Filter for Count {
    fn next(&self) -> &DeviceRef {
        &self.child
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        bump(&self.reads, 1);
        bump(&self.bytes_read, len as u64);
        self.child.read(offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        bump(&self.writes, 1);
        bump(&self.bytes_written, data.len() as u64);
        self.child.write(offset, data, flags).await
    }

    async fn flush(&self) -> Result<()> {
        bump(&self.flushes, 1);
        self.child.flush().await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        bump(&self.discards, 1);
        self.child.discard(offset, len).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        bump(&self.write_zeroes, 1);
        self.child.write_zeroes(offset, len, flags).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => {}
            Control::Call { verb, .. } if verb == RESET_COUNTS.name => {
                let table = self
                    .take(true)
                    .named()
                    .map(|(what, n)| (what.to_string(), toml::Value::Integer(n as i64)))
                    .collect();
                return Ok(ControlReply::Table(table));
            }
            // A view of the layer below would bypass the counting.
            Control::Connection => return Err(strata_core::refuse(&request)),
            // Verbs for the layers below (fail-member, grow…) are theirs to answer.
            other => return self.child.control(other).await,
        }
        let child = strata_core::describe(self.child.as_ref()).await?;
        let mut node = NodeStatus::new(&self.name, "count", self.child.geometry().size);
        node.health = child.health;
        node.detail = self
            .counts()
            .named()
            .map(|(what, n)| (what.to_string(), n.to_string()))
            .collect();
        node.config = layer::to_table(&CountConfig {});
        node.children = vec![child];
        Ok(ControlReply::Describe(node))
    }
}
