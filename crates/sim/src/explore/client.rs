//! The clients: random operations on a target, each checked against the target's reference
//! model as it completes. Several clients share a target; they never have overlapping
//! requests in flight (block devices leave that undefined), which a range lock per target
//! ensures.

use std::cell::RefCell;
use std::rc::Rc;

use bytes::Bytes;
use strata_core::{BlockError, DeviceRef, ExtentState, WriteFlags, ZeroFlags};
use strata_crash::{CrashGroup, DeviceModel};

use crate::explore::coverage::Coverage;
use crate::explore::rng::Picks;

/// The largest request a client makes.
const MAX_REQUEST: u64 = 96 << 10;

/// A target as the clients see it: its device, its model and the ranges in flight.
pub struct Target {
    pub name: String,
    pub device: DeviceRef,
    pub model: DeviceModel,
    /// Writes to it may fail for want of space (a thin pool's volume).
    pub may_fill: bool,
    busy: Vec<(u64, u64)>,
}

impl Target {
    pub fn new(name: String, device: DeviceRef, model: DeviceModel, may_fill: bool) -> Self {
        Target {
            name,
            device,
            model,
            may_fill,
            busy: Vec::new(),
        }
    }

    /// Keeps clients off `[offset, offset + len)` for good (a range reported lost).
    pub fn reserve(&mut self, offset: u64, len: u64) {
        self.busy.push((offset, len));
    }

    fn lock(&mut self, offset: u64, len: u64) -> bool {
        let end = offset + len;
        if self.busy.iter().any(|&(o, l)| offset < o + l && o < end) {
            return false;
        }
        self.busy.push((offset, len));
        true
    }

    fn unlock(&mut self, offset: u64) {
        let at = self
            .busy
            .iter()
            .position(|&(o, _)| o == offset)
            .expect("locked range");
        self.busy.swap_remove(at);
    }
}

/// What every client of a burst shares.
pub struct Shared<'a> {
    pub group: &'a CrashGroup,
    pub coverage: &'a RefCell<Coverage>,
    /// The first defect a client saw; every client stops at it.
    pub failure: RefCell<Option<String>>,
    /// Where a trace of every operation goes (`STRATA_EXPLORE_TRACE=1`).
    pub timing: &'a crate::explore::disks::Timing,
}

impl Shared<'_> {
    fn fail(&self, message: String) {
        self.failure.borrow_mut().get_or_insert(message);
    }

    fn stopped(&self) -> bool {
        self.failure.borrow().is_some() || self.group.is_powered_off()
    }

    fn count(&self, what: &str) {
        self.coverage.borrow_mut().count("op", what);
    }

    fn trace(&self, line: impl FnOnce() -> String) {
        self.timing.record(line);
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Write {
        fua: bool,
    },
    Read,
    Flush,
    Zeroes {
        fua: bool,
        may_trim: bool,
    },
    Discard,
    Status,
    /// A request the device must refuse: misaligned, or past its end.
    Bad {
        past_end: bool,
    },
}

fn pick_op(pick: &mut Picks) -> Op {
    match pick.next(100) {
        0..=34 => Op::Write { fua: false },
        35..=41 => Op::Write { fua: true },
        42..=61 => Op::Read,
        62..=69 => Op::Flush,
        70..=76 => Op::Zeroes {
            fua: pick.one_in(3),
            may_trim: pick.one_in(2),
        },
        77..=83 => Op::Discard,
        84..=91 => Op::Status,
        _ => Op::Bad {
            past_end: pick.one_in(2),
        },
    }
}

/// One client: `ops` operations on `target`.
pub async fn client(target: Rc<RefCell<Target>>, shared: &Shared<'_>, seed: u64, ops: u32) {
    let mut pick = Picks::new(seed);
    let (device, size) = {
        let t = target.borrow();
        (t.device.clone(), t.model.size())
    };
    let geometry = device.geometry();
    let unit = u64::from(geometry.min_io).max(512);
    let max_io = match u64::from(geometry.max_io) {
        0 => MAX_REQUEST,
        max => max.min(MAX_REQUEST),
    };
    let max_len = (max_io / unit).max(1) * unit;
    let units = size / unit;
    if units == 0 {
        return;
    }
    // Half the requests fall in a hot window, so that sectors are rewritten often enough for
    // reordering and superseded data to matter.
    let hot_units = (units / 8).max(1);
    let hot_start = pick.next(units - hot_units + 1);
    for _ in 0..ops {
        if shared.stopped() {
            return;
        }
        let op = pick_op(&mut pick);
        if let Op::Flush = op {
            flush(&target, &device, shared).await;
            continue;
        }
        if let Op::Bad { past_end } = op {
            bad(&device, shared, &mut pick, size, unit, past_end).await;
            continue;
        }
        // A range no request in flight overlaps; after a few tries, a flush instead.
        let mut range = None;
        for _ in 0..8 {
            let len_units = 1 + pick.next(max_len / unit);
            let offset_units = if pick.one_in(2) {
                hot_start + pick.next(hot_units)
            } else {
                pick.next(units)
            };
            let offset = offset_units.min(units - 1) * unit;
            let len = (len_units * unit).min(size - offset);
            if target.borrow_mut().lock(offset, len) {
                range = Some((offset, len));
                break;
            }
        }
        let Some((offset, len)) = range else {
            flush(&target, &device, shared).await;
            continue;
        };
        let next = target.borrow().model.next_write_id();
        shared.trace(|| {
            format!(
                "    {} {op:?} [{offset}, +{len}) as {next} ...",
                target.borrow().name
            )
        });
        ranged(&target, &device, shared, op, offset, len).await;
        shared.trace(|| {
            format!(
                "    {} {op:?} [{offset}, +{len}) done",
                target.borrow().name
            )
        });
        target.borrow_mut().unlock(offset);
    }
}

async fn flush(target: &RefCell<Target>, device: &DeviceRef, shared: &Shared<'_>) {
    shared.count("flush");
    let id = target.borrow_mut().model.flush_started();
    shared.trace(|| format!("    {} flush ...", target.borrow().name));
    let result = device.flush().await;
    shared.trace(|| format!("    {} flush: {result:?}", target.borrow().name));
    match result {
        Ok(()) => target.borrow_mut().model.flush_completed(id),
        Err(e) => {
            target.borrow_mut().model.flush_failed(id);
            if !shared.group.is_powered_off() {
                shared.fail(format!("{}: flush failed: {e}", target.borrow().name));
            }
        }
    }
}

/// What a raid5 answers for a chunk it lost in a crash while degraded: damage reported,
/// which the device may answer where its content was in doubt.
pub(crate) const LOST: &str = "was lost in a crash while degraded";

/// Whether an error is an answer the device may give here, rather than a defect: power is
/// off; a thin volume's pool is full; a write into a chunk reported lost (the write fails,
/// so the model keeps it as "may have landed").
fn excused(target: &RefCell<Target>, shared: &Shared<'_>, error: &BlockError) -> bool {
    shared.group.is_powered_off()
        || (matches!(error, BlockError::NoSpace) && target.borrow().may_fill)
        || error.to_string().contains(LOST)
}

/// Whether every sector of `[offset, offset + len)` is in doubt in `model` (more than one
/// thing may be there), so that a read of it may report the content lost.
pub(crate) fn in_doubt(model: &DeviceModel, offset: u64, len: u64) -> bool {
    (offset..offset + len)
        .step_by(512)
        .all(|sector| model.allowed(sector).len() > 1)
}

async fn ranged(
    target: &RefCell<Target>,
    device: &DeviceRef,
    shared: &Shared<'_>,
    op: Op,
    offset: u64,
    len: u64,
) {
    let name = target.borrow().name.clone();
    match op {
        Op::Write { fua } => {
            shared.count(if fua { "write-fua" } else { "write" });
            let (id, data) = target
                .borrow_mut()
                .model
                .pattern_write_started(offset, len as usize);
            match device.write(offset, data, WriteFlags { fua }).await {
                Ok(()) => target.borrow_mut().model.write_completed(id, fua),
                Err(e) => {
                    target.borrow_mut().model.write_failed(id);
                    if matches!(e, BlockError::NoSpace) {
                        shared.count("pool-full");
                    }
                    if !excused(target, shared, &e) {
                        shared.fail(format!("{name}: write [{offset}, +{len}) failed: {e}"));
                    }
                }
            }
        }
        Op::Zeroes { fua, may_trim } => {
            shared.count("write-zeroes");
            let id = target.borrow_mut().model.zeroes_started(offset, len);
            let flags = ZeroFlags {
                fua,
                may_trim,
                fast: false,
            };
            match device.write_zeroes(offset, len, flags).await {
                Ok(()) => target.borrow_mut().model.write_completed(id, fua),
                Err(e) => {
                    target.borrow_mut().model.write_failed(id);
                    if !excused(target, shared, &e) {
                        shared.fail(format!(
                            "{name}: write_zeroes [{offset}, +{len}) failed: {e}"
                        ));
                    }
                }
            }
        }
        Op::Discard => {
            shared.count("discard");
            // Afterwards the range reads as zeros or as before, sector by sector: exactly a
            // write of zeros that may or may not have landed.
            let id = target.borrow_mut().model.zeroes_started(offset, len);
            let result = device.discard(offset, len).await;
            target.borrow_mut().model.write_failed(id);
            if let Err(e) = result {
                if !excused(target, shared, &e) && !matches!(e, BlockError::Unsupported(_)) {
                    shared.fail(format!("{name}: discard [{offset}, +{len}) failed: {e}"));
                }
            }
        }
        Op::Read => {
            shared.count("read");
            match device.read(offset, len as usize).await {
                Ok(data) => {
                    if data.len() as u64 != len {
                        shared.fail(format!(
                            "{name}: read [{offset}, +{len}) returned {} bytes",
                            data.len()
                        ));
                    } else if let Err(e) = target.borrow().model.check_live(offset, &data) {
                        shared.fail(format!("{name}: read [{offset}, +{len}): {e}"));
                    }
                }
                Err(e)
                    if e.to_string().contains(LOST)
                        && in_doubt(&target.borrow().model, offset, len) =>
                {
                    shared.count("read-reported-lost");
                }
                Err(e) => {
                    if !shared.group.is_powered_off() {
                        shared.fail(format!("{name}: read [{offset}, +{len}) failed: {e}"));
                    }
                }
            }
        }
        Op::Status => {
            shared.count("block-status");
            match device.block_status(offset, len).await {
                Ok(extents) => {
                    if let Err(e) = check_extents(&target.borrow().model, offset, len, &extents) {
                        shared.fail(format!("{name}: block_status [{offset}, +{len}): {e}"));
                    }
                }
                Err(e) => {
                    if !shared.group.is_powered_off() {
                        shared.fail(format!(
                            "{name}: block_status [{offset}, +{len}) failed: {e}"
                        ));
                    }
                }
            }
        }
        Op::Flush | Op::Bad { .. } => unreachable!("not ranged"),
    }
}

/// Extents must cover `[offset, …)` contiguously, at least one byte and at most `len`, and
/// every range said to read as zeros must be allowed to.
fn check_extents(
    model: &DeviceModel,
    offset: u64,
    len: u64,
    extents: &[strata_core::Extent],
) -> Result<(), String> {
    let mut at = offset;
    for extent in extents {
        if extent.offset != at || extent.len == 0 {
            return Err(format!("extents not contiguous from {offset}: {extents:?}"));
        }
        at += extent.len;
        if at > offset + len {
            return Err(format!("extents reach past the request: {extents:?}"));
        }
        if extent.state != ExtentState::Data {
            // Sector by sector, so a failure names the sector.
            let zeros = vec![0u8; extent.len as usize];
            model.check_live(extent.offset, &zeros).map_err(|e| {
                format!(
                    "an extent reported {:?} does not read as zeros: {e}",
                    extent.state
                )
            })?;
        }
    }
    if at == offset {
        return Err("no extent".into());
    }
    Ok(())
}

/// A request the device must refuse, touching nothing.
async fn bad(
    device: &DeviceRef,
    shared: &Shared<'_>,
    pick: &mut Picks,
    size: u64,
    unit: u64,
    past_end: bool,
) {
    shared.count(if past_end { "past-end" } else { "misaligned" });
    // A grown device (a raid5 grow ends in the background) is bigger than the model: past
    // its end is past the device's.
    let device_size = device.geometry().size.max(size);
    let (offset, len) = if past_end {
        (device_size - unit, 2 * unit)
    } else if unit > 512 && pick.one_in(2) {
        // A whole number of sectors that is not a whole number of the device's units.
        (0, unit + 512)
    } else {
        (pick.next(size / unit) * unit + 1 + pick.next(511), unit)
    };
    let result = if pick.one_in(2) {
        device
            .write(
                offset,
                Bytes::from(vec![0xA5; len as usize]),
                WriteFlags::default(),
            )
            .await
            .map(|_| ())
    } else {
        device.read(offset, len as usize).await.map(|_| ())
    };
    match result {
        Err(BlockError::InvalidArgument(_) | BlockError::OutOfRange { .. }) => {}
        Err(_) if shared.group.is_powered_off() => {}
        Err(e) => shared.fail(format!(
            "a bad request [{offset}, +{len}) was refused with the wrong error: {e}"
        )),
        Ok(()) if past_end && device.geometry().size >= offset + len => {}
        Ok(()) => shared.fail(format!(
            "a bad request [{offset}, +{len}) (size {size}, unit {unit}) was accepted"
        )),
    }
}
