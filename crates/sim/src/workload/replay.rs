//! Open-loop trace replay: each record arrives at its timestamp (relative to the first
//! replayed record, divided by the speed-up), at an address folded into the volume.

use crate::model::{Io, Nanos, Workload};

use super::trace::TraceRecord;

pub const SECTOR_BYTES: u64 = 512;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplayOptions {
    pub volume_size: u64,
    /// Arrivals are divided by this: 2.0 replays twice as fast.
    pub speedup: f64,
    /// Replay only this trace device (MQSim device, MSR DiskNumber, SPC ASU).
    pub device: Option<u32>,
}

impl ReplayOptions {
    pub fn new(volume_size: u64) -> Self {
        Self {
            volume_size,
            speedup: 1.0,
            device: None,
        }
    }
}

/// Folds a trace request into a volume of `volume_size` bytes: the length rounds up to whole
/// sectors (at least one, at most the volume), the offset wraps modulo the volume and aligns
/// down to a sector, and a request that would cross the end moves back to end exactly there.
/// Returns `(offset, len)`.
pub fn fold_into_volume(offset: u64, len: u64, volume_size: u64) -> (u64, u64) {
    assert!(
        volume_size >= SECTOR_BYTES,
        "a volume holds at least one sector"
    );
    let volume = volume_size - volume_size % SECTOR_BYTES;
    let len = len
        .max(1)
        .div_ceil(SECTOR_BYTES)
        .saturating_mul(SECTOR_BYTES)
        .min(volume);
    let wrapped = offset % volume;
    let aligned = wrapped - wrapped % SECTOR_BYTES;
    let folded = aligned.min(volume - len);
    debug_assert!(folded.is_multiple_of(SECTOR_BYTES) && folded + len <= volume_size);
    (folded, len)
}

pub struct TraceWorkload {
    records: Vec<TraceRecord>,
    next: usize,
    first_timestamp: Nanos,
    last_arrival: Nanos,
    options: ReplayOptions,
}

impl TraceWorkload {
    pub fn new(records: Vec<TraceRecord>, options: ReplayOptions) -> Result<Self, String> {
        if !(options.speedup.is_finite() && options.speedup > 0.0) {
            return Err(format!(
                "speed-up {} must be a positive number",
                options.speedup
            ));
        }
        if options.volume_size < SECTOR_BYTES {
            return Err(format!(
                "volume of {} bytes holds no sector",
                options.volume_size
            ));
        }
        let records: Vec<TraceRecord> = match options.device {
            Some(device) => records.into_iter().filter(|r| r.device == device).collect(),
            None => records,
        };
        let first_timestamp = records.first().map_or(0, |r| r.timestamp_ns);
        Ok(Self {
            records,
            next: 0,
            first_timestamp,
            last_arrival: 0,
            options,
        })
    }

    /// Records that will be replayed in all (after the device filter).
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

impl Workload for TraceWorkload {
    /// A timestamp earlier than its predecessor's (out-of-order trace lines) arrives together
    /// with it, so arrivals never go backwards.
    fn next_io(&mut self) -> Option<Io> {
        let record = *self.records.get(self.next)?;
        self.next += 1;
        let since_first = record.timestamp_ns.saturating_sub(self.first_timestamp);
        let scaled = (since_first as f64 / self.options.speedup).round() as Nanos;
        let arrival = scaled.max(self.last_arrival);
        self.last_arrival = arrival;
        let (offset, len) = fold_into_volume(record.offset, record.len, self.options.volume_size);
        Some(Io {
            arrival: Some(arrival),
            op: record.op,
            offset,
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Op;

    #[test]
    fn folding_wraps_aligns_and_stays_inside() {
        assert_eq!(fold_into_volume(10_000, 4096, 1 << 20), (9728, 4096));
        assert_eq!(
            fold_into_volume((1 << 20) + 512, 4096, 1 << 20),
            (512, 4096)
        );
        // Would cross the end: moved back to end there.
        assert_eq!(
            fold_into_volume((1 << 20) - 512, 4096, 1 << 20),
            ((1 << 20) - 4096, 4096)
        );
        // Odd sizes round up to sectors; larger than the volume, clipped to it.
        assert_eq!(fold_into_volume(0, 100, 1 << 20), (0, 512));
        assert_eq!(fold_into_volume(7, 1 << 30, 1 << 20), (0, 1 << 20));
    }

    #[test]
    fn arrivals_are_relative_scaled_and_filtered() {
        let record = |timestamp_ns, device| TraceRecord {
            timestamp_ns,
            device,
            op: Op::Read,
            offset: 0,
            len: 512,
        };
        let records = vec![
            record(1_000, 1),
            record(2_000, 0),
            record(5_000, 1),
            record(4_000, 1),
        ];
        let options = ReplayOptions {
            volume_size: 1 << 20,
            speedup: 2.0,
            device: Some(1),
        };
        let mut replay = TraceWorkload::new(records, options).unwrap();
        assert_eq!(replay.len(), 3);
        let arrivals: Vec<_> = std::iter::from_fn(|| replay.next_io())
            .map(|io| io.arrival.unwrap())
            .collect();
        assert_eq!(arrivals, vec![0, 2_000, 2_000]);
        assert!(TraceWorkload::new(
            vec![],
            ReplayOptions {
                speedup: 0.0,
                ..options
            }
        )
        .is_err());
    }
}
