//! The drives of the papers. Where a paper gives a figure it wins; where it is silent the
//! value comes from the drive's product manual; where both are silent the choice is marked
//! as an assumption. docs/simulator.md lists every value with its source.

use super::geometry::linear_zones;
use super::{HddParams, Scheduler, SeekParams};
use crate::model::{MICROS, MILLIS};

const SECTOR_BYTES: u32 = 512;

/// Zones per preset: enough that the transfer rate falls smoothly; real drives of the era
/// report 15-30 zones.
const ZONES: u32 = 16;

/// Queue depth of the presets: the paper's strands use at most 8 outstanding commands
/// (§2.7), and DiskSim's extracted Cheetah 15K.5 spec uses a maximum queue length of 8.
const QUEUE_DEPTH: usize = 8;

/// Read-ahead per stream: an assumption (the manuals give the buffer size, 8-32 MB, not the
/// segment size); 512 KiB is the paper's enterprise allocation-range size.
const READ_AHEAD_BYTES: u64 = 512 * 1024;

/// Seagate Cheetah 15K.5, 300 GB (ST3300655), the drive of Proximal I/O §2.
/// Paper: 15,000 RPM, 8 surfaces, 1,200 sectors per track, C = 65, average seek 3.6 ms,
/// track switch 0.4-0.8 ms.
pub fn cheetah_15k5() -> HddParams {
    let surfaces = 8;
    HddParams {
        name: "cheetah-15k5-300g".to_owned(),
        rpm: 15_000,
        sector_bytes: SECTOR_BYTES,
        surfaces,
        capacity_sectors: 585_937_500,
        // Outer tracks hold the paper's 1,200 sectors; the inner/outer ratio follows the
        // manual's sustained transfer range (73-125 MB/s).
        zones: linear_zones(1200, 700, ZONES, surfaces, 585_937_500),
        band_cylinders: 65,
        seek: SeekParams {
            settle: 620 * MICROS,
            plateau_end: 1000 * MICROS,
            plateau_cylinders: 65,
            linear_from_cylinders: 15_000,
            full_stroke: 7_400 * MICROS,
            average: 3_500 * MICROS,
        },
        head_switch: 620 * MICROS,
        write_settle: 200 * MICROS,
        command_overhead: 100 * MICROS,
        read_ahead_bytes: READ_AHEAD_BYTES,
        queue_depth: QUEUE_DEPTH,
        scheduler: Scheduler::Sptf,
        // Calibrated: equal to the settle, so a non-contiguous access on the same track
        // costs what one on the next track does (track-approximate ≈ proximal, §2).
        same_track_reposition: 620 * MICROS,
        order_quirk: false,
    }
}

/// Western Digital RE3, 1 TB (WD1002FBYS), the RAID members of Proximal I/O §5.
/// Paper: 7,200 RPM, average seek 6.9 ms. Three platters (six surfaces).
pub fn wd_re3_1tb() -> HddParams {
    let surfaces = 6;
    HddParams {
        name: "wd-re3-1t".to_owned(),
        rpm: 7_200,
        sector_bytes: SECTOR_BYTES,
        surfaces,
        capacity_sectors: 1_953_525_168,
        zones: linear_zones(1_840, 1_000, ZONES, surfaces, 1_953_525_168),
        // Assumption: the paper measured C only on the Cheetah; the same band is used.
        band_cylinders: 65,
        seek: SeekParams {
            settle: 600 * MICROS,
            plateau_end: 800 * MICROS,
            plateau_cylinders: 65,
            linear_from_cylinders: 40_000,
            full_stroke: 18 * MILLIS,
            average: 6_900 * MICROS,
        },
        head_switch: 600 * MICROS,
        write_settle: 200 * MICROS,
        command_overhead: 100 * MICROS,
        read_ahead_bytes: READ_AHEAD_BYTES,
        queue_depth: QUEUE_DEPTH,
        scheduler: Scheduler::Sptf,
        // Assumption: the Cheetah's mechanism (reposition = settle) on this drive's settle.
        same_track_reposition: 600 * MICROS,
        order_quirk: false,
    }
}

/// The WD RE3 with the issue-order quirk of Proximal I/O §2.7: its firmware reorders only
/// commands that reached it in ascending LBN order ("issuing requests in a random order and
/// relying solely on the scheduler's ability to reorder them does not work"). The paper
/// blames weak embedded CPUs, "especially for nearline drives", and a firmware bug that a
/// later release fixed; so this is the RE3 as §5 may have met it, and `wd-re3-1t` the drive
/// with fixed firmware. Everything else is `wd_re3_1tb()`.
pub fn wd_re3_1tb_order_quirk() -> HddParams {
    HddParams {
        name: "wd-re3-1t-order-quirk".to_owned(),
        order_quirk: true,
        ..wd_re3_1tb()
    }
}

/// A 10,000 RPM, 146 GB Fibre Channel drive: the Seagate ST3146807FC (Cheetah 10K.6 FC)
/// named in ALV §5.1. The ALV paper gives no mechanical figures; all come from the
/// product manual (publication 100195490) or are marked assumptions in the docs.
pub fn fc_10k_146g() -> HddParams {
    let surfaces = 8;
    HddParams {
        name: "fc-10k-146g".to_owned(),
        rpm: 10_000,
        sector_bytes: SECTOR_BYTES,
        surfaces,
        capacity_sectors: 286_749_488,
        zones: linear_zones(1_000, 560, ZONES, surfaces, 286_749_488),
        band_cylinders: 65,
        seek: SeekParams {
            settle: 500 * MICROS,
            plateau_end: 800 * MICROS,
            plateau_cylinders: 65,
            linear_from_cylinders: 10_000,
            full_stroke: 10 * MILLIS,
            average: 4_700 * MICROS,
        },
        head_switch: 500 * MICROS,
        write_settle: 300 * MICROS,
        command_overhead: 100 * MICROS,
        read_ahead_bytes: READ_AHEAD_BYTES,
        queue_depth: QUEUE_DEPTH,
        scheduler: Scheduler::Sptf,
        // Assumption: the Cheetah's mechanism (reposition = settle) on this drive's settle.
        same_track_reposition: 500 * MICROS,
        order_quirk: false,
    }
}

/// All presets, by name, for command lines and reports.
pub fn all() -> Vec<HddParams> {
    vec![
        cheetah_15k5(),
        wd_re3_1tb(),
        wd_re3_1tb_order_quirk(),
        fc_10k_146g(),
    ]
}

/// A preset by its `name`.
pub fn by_name(name: &str) -> Option<HddParams> {
    all().into_iter().find(|p| p.name == name)
}
