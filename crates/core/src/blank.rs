//! Whether a layer's metadata region was never written: the one condition (with the server's
//! `may_format`) under which a stateful layer formats. A region without a valid superblock is
//! not enough: damaged superblocks in front of surviving checkpoints and journal batches look
//! the same to a superblock read, and formatting over them would silently destroy the layer.
//! So every byte of the region must read as zero.

use crate::{BlockDevice, Result};

/// Bytes read at once while scanning.
const PIECE: u64 = 1 << 20;

/// Whether `[offset, offset + len)` of `device` (clamped to its size) reads as all zeros.
/// Runs the device reports as holes or zeros are skipped; a device without `block_status`
/// is read in full. Stops at the first non-zero byte.
pub async fn region_is_zero(device: &dyn BlockDevice, offset: u64, len: u64) -> Result<bool> {
    let end = offset.saturating_add(len).min(device.geometry().size);
    if offset >= end {
        return Ok(true);
    }
    let size = device.geometry().size;
    let runs = match device.block_status(offset, end - offset).await {
        Ok(extents) => {
            let mut runs: Vec<std::ops::Range<u64>> = extents
                .iter()
                .filter(|e| !e.state.reads_zero())
                .map(|e| e.offset.max(offset)..(e.offset + e.len).min(end))
                .filter(|r| r.start < r.end)
                .collect();
            // An answer that stops short leaves the rest unknown: read it.
            let reported = extents
                .iter()
                .map(|e| e.offset + e.len)
                .max()
                .unwrap_or(offset);
            if reported < end {
                runs.push(reported.max(offset)..end);
            }
            runs
        }
        Err(_) => std::iter::once(offset..end).collect(),
    };
    let align = u64::from(device.geometry().min_io).max(1);
    let piece = (u64::from(device.geometry().max_io).min(PIECE) / align * align).max(align);
    for run in runs {
        // Widened to the device's I/O unit: a non-zero byte next to the region makes the
        // answer "not blank", which only ever refuses a format, never allows one.
        let mut at = run.start / align * align;
        let stop = (run.end.div_ceil(align) * align).min(size);
        while at < stop {
            let n = (stop - at).min(piece);
            let data = device.read(at, n as usize).await?;
            if data.iter().any(|&b| b != 0) {
                return Ok(false);
            }
            at += n;
        }
    }
    Ok(true)
}
