//! Issue 12, "done when": bytes flipped on the medium in a stateful layer's metadata (either
//! superblock, the active or the idle checkpoint slot, a journal block; for raid5 also its
//! stripe journal) after data was flushed and the layer closed. On reopen there is never
//! silent loss: either the open fails with an error, or every flushed byte reads back as the
//! model says. Plain memory devices. A seed fixes the writes and the place damaged (the
//! failure message names both); a store's first generation is random, so whether the damaged
//! superblock copy was the active one can differ between runs of one seed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::layer::StartPolicy;
use strata_core::{BlockDevice, Control, ControlReply, DeviceRef, TokioRuntime, WriteFlags};
use strata_crash::rand::{RngExt, SeedableRng};
use strata_crash::testkit::slot_names;
use strata_crash::CrashRng;
use strata_meta::BLOCK_SIZE;
use strata_raid::mirror::{Mirror, MirrorOptions};
use strata_raid::raid5::{Raid5, Settings, META_BYTES};
use strata_thin::{PoolOptions, PoolRuntime, ThinPool};

const SEEDS: u64 = 2000;
const BLOCK: u64 = BLOCK_SIZE as u64;

/// An ordinary restart: no format, no degraded start.
const RESTART: StartPolicy = StartPolicy {
    may_format: false,
    allow_degraded: false,
};

/// Random writes of whole 512-byte sectors over `[0, size)`, applied to `model` too.
fn plan_writes(rng: &mut CrashRng, size: u64, count: usize) -> Vec<(u64, Vec<u8>)> {
    (0..count)
        .map(|_| {
            let sectors = rng.random_range(1..=32u64).min(size / 512);
            let offset = rng.random_range(0..=(size / 512 - sectors)) * 512;
            let byte = rng.random_range(1..=255u8);
            (offset, vec![byte; (sectors * 512) as usize])
        })
        .collect()
}

fn apply(model: &mut [u8], writes: &[(u64, Vec<u8>)]) {
    for (offset, data) in writes {
        model[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
    }
}

/// Flips 1 to 4 bytes of one block of the metadata store whose region starts at `region` on
/// `device`, in a structure picked at random. Returns what was hit, for the failure message.
///
/// Journal damage lands in one copy of a batch (format 2 writes two), picked at random; with
/// `Journal::LastBatchOnly` every flip lands in the last batch replayed.
async fn flip_store(
    rng: &mut CrashRng,
    device: &DeviceRef,
    region: u64,
    journal: Journal,
) -> String {
    let recovered = strata_meta::recover(device.as_ref(), region)
        .await
        .expect("the store recovers before the damage");
    let layout = recovered.superblock.layout;
    let active = recovered.superblock.active_slot;
    let last = last_batch(device, &layout, recovered.journal_end_block).await;
    let pick = match journal {
        Journal::LastBatchOnly => 4,
        _ => rng.random_range(0..5u32),
    };
    let (what, offset) = match pick {
        0 => ("superblock A".to_string(), region),
        1 => ("superblock B".to_string(), region + BLOCK),
        2 => {
            let b = rng.random_range(0..recovered.superblock.checkpoint_blocks);
            (
                format!("active checkpoint block {b}"),
                layout.slot_offset(active) + b * BLOCK,
            )
        }
        3 => {
            let b = rng.random_range(0..layout.slot_blocks.min(4));
            (
                format!("idle checkpoint block {b}"),
                layout.slot_offset(1 - active) + b * BLOCK,
            )
        }
        _ => {
            let end = recovered.journal_end_block;
            // Blocks replayed, plus the one after them (unused, or a stale older batch).
            let candidates: Vec<u64> = match journal {
                Journal::Any => {
                    (0..(end + 1).min(recovered.superblock.journal_capacity())).collect()
                }
                Journal::LastBatchOnly => last.clone().collect(),
            };
            let b = candidates[rng.random_range(0..candidates.len())];
            let copy = rng.random_range(0..recovered.superblock.journal_copies());
            (
                format!(
                    "journal copy {copy} block {b} (end {})",
                    recovered.journal_end_block
                ),
                recovered.superblock.journal_copy_offset(copy, b),
            )
        }
    };
    flip_block(rng, device, offset).await;
    what
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Journal {
    Any,
    LastBatchOnly,
}

/// Journal blocks of the last batch replayed, found by walking the batch headers (block
/// framing in docs/metadata-format.md: `count` at bytes 28..32).
async fn last_batch(
    device: &DeviceRef,
    layout: &strata_meta::Layout,
    end: u64,
) -> std::ops::Range<u64> {
    let mut at = 0;
    let mut last = 0..0;
    while at < end {
        let block = device
            .read(layout.journal_offset(at), BLOCK as usize)
            .await
            .unwrap();
        let count = u32::from_le_bytes(block[28..32].try_into().unwrap()) as u64;
        last = at..at + count.max(1);
        at += count.max(1);
    }
    last
}

/// Flips 1 to 4 bytes of the 4 KiB block at `offset`.
async fn flip_block(rng: &mut CrashRng, device: &DeviceRef, offset: u64) {
    let mut block = device.read(offset, BLOCK as usize).await.unwrap();
    for _ in 0..rng.random_range(1..=4u32) {
        let at = rng.random_range(0..BLOCK as usize);
        block[at] ^= rng.random_range(1..=255u8);
    }
    device
        .write(offset, block.freeze(), WriteFlags::default())
        .await
        .unwrap();
}

// --- mirror -------------------------------------------------------------------------------

const M_META: u64 = 128 << 10;
const M_DATA: u64 = 256 << 10;

async fn open_mirror(disks: &[DeviceRef], start: StartPolicy) -> strata_core::Result<Mirror> {
    let options = MirrorOptions {
        region: 16 << 10,
        metadata_size: M_META,
        // No timer: nothing runs after the mirror is dropped.
        bitmap_clear: Duration::ZERO,
        resync_concurrency: 2,
        copy_chunk: 16 << 10,
        resync_checkpoint: 64 << 10,
        start,
    };
    let children = disks.iter().map(|d| Some(d.clone())).collect();
    let runtime = TokioRuntime::current();
    Mirror::open(
        "m".into(),
        slot_names(disks.len()),
        children,
        options,
        runtime,
    )
    .await
}

#[tokio::test]
async fn mirror_metadata_damage_is_never_silent() {
    let (mut refused, mut intact) = (0, 0);
    for seed in 0..SEEDS {
        let mut rng = CrashRng::seed_from_u64(seed);
        let disks: Vec<DeviceRef> = (0..2)
            .map(|_| Arc::new(MemoryDevice::new(M_META + M_DATA)) as DeviceRef)
            .collect();
        let mut model = vec![0u8; M_DATA as usize];
        let mirror = open_mirror(&disks, StartPolicy::FRESH).await.unwrap();
        // Half the seeds fail a member after the first round: its disk then holds stale data
        // that must never be served, whichever copy the damage hits.
        let fail_after_first = rng.random_bool(0.5).then(|| rng.random_range(0..2usize));
        for round in 0..rng.random_range(2..=3u32) {
            if round == 1 {
                if let Some(index) = fail_after_first {
                    mirror.control(Control::FailMember { index }).await.unwrap();
                }
            }
            let writes = plan_writes(&mut rng, M_DATA, 8);
            for (offset, data) in &writes {
                let data = Bytes::from(data.clone());
                mirror
                    .write(*offset, data, WriteFlags::default())
                    .await
                    .unwrap();
            }
            mirror.flush().await.unwrap();
            apply(&mut model, &writes);
        }
        drop(mirror);
        let victim = rng.random_range(0..2usize);
        let what = flip_store(&mut rng, &disks[victim], 0, Journal::Any).await;
        match open_mirror(&disks, RESTART).await {
            Err(_) => refused += 1,
            Ok(mirror) => {
                let got = mirror.read(0, M_DATA as usize).await;
                let ok = got.as_ref().is_ok_and(|b| b[..] == model[..]);
                assert!(
                    ok,
                    "seed {seed}: member {victim} {what}: data differs from the model"
                );
                intact += 1;
            }
        }
    }
    eprintln!("mirror: {intact} reopened intact, {refused} refused");
}

// --- raid5 --------------------------------------------------------------------------------

const R_CHUNK: u64 = 4096;
const R_JOURNAL: u64 = 64 << 10;
const R_STRIPES: u64 = 32;

/// Blocks of one copy of a stripe journal (version 3 keeps two, in the region's halves).
const R_HALF: u64 = R_JOURNAL / BLOCK / 2;

async fn open_raid(disks: &[DeviceRef], start: StartPolicy) -> strata_core::Result<Raid5> {
    let settings = Settings {
        chunk: Some(R_CHUNK),
        journal: Some(R_JOURNAL),
        start,
        ..Settings::default()
    };
    let children = disks.iter().map(|d| Some(d.clone())).collect();
    Raid5::open("r5".into(), children, settings, TokioRuntime::current()).await
}

/// The "journal findings" Describe reports: stripe-journal damage repaired at open.
async fn journal_findings(raid: &Raid5) -> u64 {
    let ControlReply::Describe(node) = raid.control(Control::Describe).await.unwrap() else {
        panic!("describe");
    };
    let (_, value) = node
        .detail
        .iter()
        .find(|(k, _)| k == "journal findings")
        .expect("raid5 describes its journal findings");
    value.parse().unwrap()
}

/// One raid5 seed; Err names the silent loss found, Ok(Some(findings)) intact, Ok(None)
/// refused. With `stripe_journal_records`, 1 to 3 blocks of one half of one member's stripe
/// journal (one copy: superblock, records, stale blocks alike) are damaged; the other copy
/// is whole, so the open must succeed and read back the model.
async fn raid5_seed(seed: u64, stripe_journal_records: bool) -> Result<Option<u64>, String> {
    let member = (META_BYTES + R_JOURNAL).div_ceil(R_CHUNK) * R_CHUNK + R_STRIPES * R_CHUNK;
    let mut rng = CrashRng::seed_from_u64(seed);
    let disks: Vec<DeviceRef> = (0..3)
        .map(|_| Arc::new(MemoryDevice::new(member)) as DeviceRef)
        .collect();
    let raid = open_raid(&disks, StartPolicy::FRESH).await.unwrap();
    let size = raid.layout().size();
    let mut model = vec![0u8; size as usize];
    // Half the seeds fail a member after the first round: its chunks are then stale.
    let fail_after_first = rng.random_bool(0.5).then(|| rng.random_range(0..3usize));
    for round in 0..rng.random_range(2..=3u32) {
        if round == 1 {
            if let Some(index) = fail_after_first {
                raid.control(Control::FailMember { index }).await.unwrap();
            }
        }
        let writes = plan_writes(&mut rng, size, 8);
        for (offset, data) in &writes {
            let data = Bytes::from(data.clone());
            raid.write(*offset, data, WriteFlags::default())
                .await
                .unwrap();
        }
        raid.flush().await.unwrap();
        apply(&mut model, &writes);
    }
    drop(raid);
    let victim = rng.random_range(0..3usize);
    let what = if stripe_journal_records {
        let half = rng.random_range(0..2u64);
        let mut hit = Vec::new();
        for _ in 0..rng.random_range(1..=3u32) {
            let b = half * R_HALF + rng.random_range(0..R_HALF);
            flip_block(&mut rng, &disks[victim], META_BYTES + b * BLOCK).await;
            hit.push(b);
        }
        format!("stripe journal blocks {hit:?} (copy {})", half + 1)
    } else if rng.random_bool(0.9) {
        flip_store(&mut rng, &disks[victim], 0, Journal::Any).await
    } else {
        flip_block(&mut rng, &disks[victim], META_BYTES).await;
        "stripe journal superblock".to_string()
    };
    let raid = match open_raid(&disks, RESTART).await {
        Ok(raid) => raid,
        Err(error) if stripe_journal_records => {
            return Err(format!(
                "seed {seed}: member {victim} {what}: refused although the other copy is \
                 whole: {error}"
            ))
        }
        Err(_) => return Ok(None),
    };
    let got = raid.read(0, size as usize).await;
    if got.as_ref().is_ok_and(|b| b[..] == model[..]) {
        Ok(Some(journal_findings(&raid).await))
    } else {
        Err(format!(
            "seed {seed}: member {victim} {what} (failed: {fail_after_first:?}): data differs \
             from the model"
        ))
    }
}

#[tokio::test]
async fn raid5_metadata_damage_is_never_silent() {
    let (mut refused, mut intact) = (0, 0);
    for seed in 0..SEEDS {
        match raid5_seed(seed, false).await {
            Ok(Some(_)) => intact += 1,
            Ok(None) => refused += 1,
            Err(loss) => panic!("{loss}"),
        }
    }
    eprintln!("raid5: {intact} reopened intact, {refused} refused");
}

/// Issue 12's stripe-journal case: bytes flipped in one copy of a member's stripe journal
/// after acknowledged writes (its records, its superblock, stale blocks). With one copy
/// (journal version 2) a damaged record ended its lane like a crash-torn one and replay could
/// write an older update of a stripe over the newer data; with two copies the other one is
/// replayed and the open reports a finding. Every seed must reopen with the model's data.
#[tokio::test]
async fn raid5_stripe_journal_record_damage_is_never_silent() {
    let (mut seeds_with_findings, mut findings) = (0, 0);
    for seed in 0..SEEDS {
        match raid5_seed(seed, true).await {
            Ok(Some(found)) => {
                seeds_with_findings += u64::from(found > 0);
                findings += found;
            }
            Ok(None) => unreachable!("journal damage is never refused as metadata damage"),
            Err(loss) => panic!("{loss}"),
        }
    }
    eprintln!(
        "raid5 stripe journal: {SEEDS} seeds intact, {seeds_with_findings} with findings \
         ({findings} findings)"
    );
    // The damage must have hit live records often enough for this test to mean something.
    assert!(
        seeds_with_findings > SEEDS / 10,
        "{seeds_with_findings} seeds with findings"
    );
}

/// Three members, stripe 0 (parity on member 2) updated twice: its journal holds two
/// records of the stripe, older first. Returns the disks and the newer contents.
async fn two_updates_of_stripe_zero() -> (Vec<DeviceRef>, Vec<u8>) {
    let member = (META_BYTES + R_JOURNAL).div_ceil(R_CHUNK) * R_CHUNK + R_STRIPES * R_CHUNK;
    let disks: Vec<DeviceRef> = (0..3)
        .map(|_| Arc::new(MemoryDevice::new(member)) as DeviceRef)
        .collect();
    let raid = open_raid(&disks, StartPolicy::FRESH).await.unwrap();
    for byte in [1u8, 2] {
        raid.write(0, Bytes::from(vec![byte; 4096]), WriteFlags::default())
            .await
            .unwrap();
    }
    raid.flush().await.unwrap();
    drop(raid);
    (disks, vec![2u8; 4096])
}

/// Header blocks (relative to the journal) of the current epoch's records in copy 1 of a
/// one-lane stripe journal, walked by their headers (docs/layers/raid5.md: magic "S5JR",
/// epoch at 8, blocks at 24, index at 52; superblock epoch at 8).
async fn record_blocks(disk: &DeviceRef) -> Vec<u64> {
    let journal = disk
        .read(META_BYTES, R_JOURNAL as usize)
        .await
        .unwrap()
        .to_vec();
    let u64_at = |at: usize| u64::from_le_bytes(journal[at..at + 8].try_into().unwrap());
    let epoch = u64_at(8);
    let (mut block, mut index, mut out) = (1u64, 0u32, Vec::new());
    while block < R_HALF {
        let at = (block * BLOCK) as usize;
        let header = &journal[at..at + BLOCK as usize];
        if header[0..4] != 0x5335_4a52u32.to_le_bytes()
            || u64_at(at + 8) != epoch
            || header[52..56] != index.to_le_bytes()
        {
            break;
        }
        out.push(block);
        block += u64_at(at + 24);
        index += 1;
    }
    out
}

/// The regression for issue 12's stripe-journal defect: one copy of the *last acknowledged*
/// record (the newer update of stripe 0) damaged. Version 2 ended the lane there and
/// replayed the older update over the newer data; now the other copy is replayed, the data
/// reads back new, and Describe reports one finding. Both copies in turn.
#[tokio::test]
async fn raid5_damaged_copy_of_the_last_record_is_replayed_from_the_other() {
    for copy in 0..2u64 {
        let (disks, newer) = two_updates_of_stripe_zero().await;
        let records = record_blocks(&disks[2]).await;
        assert!(records.len() >= 2, "records at {records:?}");
        let last = *records.last().unwrap() + copy * R_HALF;
        let mut block = disks[2]
            .read(META_BYTES + last * BLOCK, BLOCK as usize)
            .await
            .unwrap();
        block[100] ^= 0x41;
        disks[2]
            .write(
                META_BYTES + last * BLOCK,
                block.freeze(),
                WriteFlags::default(),
            )
            .await
            .unwrap();
        let raid = open_raid(&disks, RESTART).await.unwrap();
        let got = raid.read(0, 4096).await.unwrap();
        assert!(
            got[..] == newer[..],
            "copy {}: stripe 0 rolled back",
            copy + 1
        );
        assert_eq!(journal_findings(&raid).await, 1, "copy {}", copy + 1);
        // The reset after replay rewrote the journal: the next open finds nothing to report.
        drop(raid);
        let raid = open_raid(&disks, RESTART).await.unwrap();
        assert_eq!(journal_findings(&raid).await, 0);
        assert!(raid.read(0, 4096).await.unwrap()[..] == newer[..]);
    }
}

/// The journal superblock: one copy damaged is repaired from the other (a finding); both
/// damaged refuses the open, naming it, instead of reading the journal as empty (which would
/// skip the replay a crash may need).
#[tokio::test]
async fn raid5_stripe_journal_superblock_damage_is_never_silent() {
    for damaged in [vec![0], vec![R_HALF], vec![0, R_HALF]] {
        let (disks, newer) = two_updates_of_stripe_zero().await;
        for &b in &damaged {
            let mut block = disks[2]
                .read(META_BYTES + b * BLOCK, BLOCK as usize)
                .await
                .unwrap();
            block[20] ^= 0x10;
            disks[2]
                .write(
                    META_BYTES + b * BLOCK,
                    block.freeze(),
                    WriteFlags::default(),
                )
                .await
                .unwrap();
        }
        match open_raid(&disks, RESTART).await {
            Ok(raid) => {
                assert_eq!(
                    damaged.len(),
                    1,
                    "both superblock copies damaged, yet opened"
                );
                assert_eq!(journal_findings(&raid).await, 1);
                assert!(raid.read(0, 4096).await.unwrap()[..] == newer[..]);
            }
            Err(error) => {
                assert_eq!(damaged.len(), 2, "one copy damaged, yet refused: {error}");
                let error = error.to_string();
                assert!(
                    error.contains("member 2")
                        && error.contains("both copies of the journal superblock"),
                    "{error}"
                );
            }
        }
    }
}

/// A journal device's header (written once, at creation) damaged: refused as damage, not
/// read as empty journals and not confused with another array's device.
#[tokio::test]
async fn raid5_journal_device_header_damage_is_refused() {
    let member = (META_BYTES + R_JOURNAL).div_ceil(R_CHUNK) * R_CHUNK + R_STRIPES * R_CHUNK;
    let mut disks: Vec<DeviceRef> = (0..3)
        .map(|_| Arc::new(MemoryDevice::new(member)) as DeviceRef)
        .collect();
    disks.push(Arc::new(MemoryDevice::new(BLOCK + 3 * R_JOURNAL)));
    let open = |start| {
        let settings = Settings {
            chunk: Some(R_CHUNK),
            journal: Some(R_JOURNAL),
            journal_device: Some(3),
            start,
            ..Settings::default()
        };
        let children = disks.iter().map(|d| Some(d.clone())).collect();
        Raid5::open("r5".into(), children, settings, TokioRuntime::current())
    };
    let raid = open(StartPolicy::FRESH).await.unwrap();
    raid.write(0, Bytes::from(vec![5u8; 4096]), WriteFlags::default())
        .await
        .unwrap();
    raid.flush().await.unwrap();
    drop(raid);
    let mut header = disks[3].read(0, BLOCK as usize).await.unwrap();
    header[40] ^= 1;
    disks[3]
        .write(0, header.freeze(), WriteFlags::default())
        .await
        .unwrap();
    let error = open(RESTART).await.err().expect("refused").to_string();
    assert!(error.contains("header is damaged"), "{error}");
}

// --- thin pool ----------------------------------------------------------------------------

const T_EXTENT: u64 = 64 << 10;
const T_META: u64 = 1 << 20;
const T_VOLUME: u64 = 512 << 10;

async fn open_pool(child: &DeviceRef, start: StartPolicy) -> strata_core::Result<Arc<ThinPool>> {
    let options = PoolOptions {
        extent_size: T_EXTENT,
        metadata_size: Some(T_META),
        start_mid: false,
    };
    let mut settings = PoolRuntime::new(TokioRuntime::current());
    settings.commit_interval = None;
    ThinPool::open_or_format("pool", child.clone(), &options, settings, start).await
}

/// One thin seed: writes, flushes, drops the pool, damages its metadata, reopens. Err names
/// the silent loss found.
async fn thin_seed(seed: u64, journal: Journal) -> Result<bool, String> {
    let mut rng = CrashRng::seed_from_u64(seed);
    let child: DeviceRef = Arc::new(MemoryDevice::new(T_META + 16 * T_EXTENT));
    let pool = open_pool(&child, StartPolicy::FRESH).await.unwrap();
    let volume = pool.create_volume("v", T_VOLUME).await.unwrap();
    let mut model = vec![0u8; T_VOLUME as usize];
    for _ in 0..rng.random_range(1..=3u32) {
        let writes = plan_writes(&mut rng, T_VOLUME, 8);
        for (offset, data) in &writes {
            let data = Bytes::from(data.clone());
            volume
                .write(*offset, data, WriteFlags::default())
                .await
                .unwrap();
        }
        volume.flush().await.unwrap();
        apply(&mut model, &writes);
    }
    drop(volume);
    drop(pool);
    let what = flip_store(&mut rng, &child, 0, journal).await;
    let Ok(pool) = open_pool(&child, RESTART).await else {
        return Ok(false);
    };
    let Some(volume) = pool.volume("v") else {
        return Err(format!("seed {seed}: {what}: the volume is gone"));
    };
    let got = volume.read(0, T_VOLUME as usize).await;
    if got.as_ref().is_ok_and(|b| b[..] == model[..]) {
        Ok(true)
    } else {
        Err(format!("seed {seed}: {what}: data differs from the model"))
    }
}

#[tokio::test]
async fn thin_pool_metadata_damage_is_never_silent() {
    let (mut refused, mut intact) = (0, 0);
    for seed in 0..SEEDS {
        match thin_seed(seed, Journal::Any).await {
            Ok(true) => intact += 1,
            Ok(false) => refused += 1,
            Err(loss) => panic!("{loss}"),
        }
    }
    eprintln!("thin: {intact} reopened intact, {refused} refused");
}

/// The last journal batch is the one a torn commit and damage after the fact look alike in
/// (with one copy per batch, as in metadata format 1, this test failed: recovery dropped an
/// acknowledged commit). Format 2 writes each batch twice, so a flip in one copy is replayed
/// from the other (docs/metadata-format.md).
#[tokio::test]
async fn thin_pool_damage_to_the_last_journal_batch_is_never_silent() {
    for seed in 0..SEEDS {
        if let Err(loss) = thin_seed(seed, Journal::LastBatchOnly).await {
            panic!("{loss}");
        }
    }
}

/// An array whose stripe journal is still version 2 (one copy) after an upgrade: its records
/// are replayed with version 2's rules and the reset after replay writes the current version
/// (4). Built from a current journal with one lane and its tails at 0 (no reclaim yet), whose
/// copy 1 has version 2's layout (records from block 1): its superblock is re-stamped version
/// 2 and copy 2's superblock erased. The
/// in-place data of stripe 0 are zeroed so that only the replay can bring them back.
#[tokio::test]
async fn raid5_version_2_journal_is_replayed_then_rewritten_as_the_current_version() {
    let (disks, newer) = two_updates_of_stripe_zero().await;
    let mut sup = disks[2]
        .read(META_BYTES, BLOCK as usize)
        .await
        .unwrap()
        .to_vec();
    assert_eq!(sup[36..40], 4u32.to_le_bytes());
    // No reclaim yet: the tails (generation, seq, per-lane offset and index) are all zero.
    assert!(sup[48..112].iter().all(|&b| b == 0));
    sup[36..40].copy_from_slice(&2u32.to_le_bytes());
    sup[4..8].fill(0);
    let crc = crc32c::crc32c(&sup);
    sup[4..8].copy_from_slice(&crc.to_le_bytes());
    let write = |disk: &DeviceRef, offset: u64, bytes: Vec<u8>| {
        let disk = disk.clone();
        async move {
            disk.write(offset, Bytes::from(bytes), WriteFlags::default())
                .await
                .unwrap()
        }
    };
    write(&disks[2], META_BYTES, sup).await;
    write(
        &disks[2],
        META_BYTES + R_HALF * BLOCK,
        vec![0; BLOCK as usize],
    )
    .await;
    // Stripe 0's first data chunk is on member 0 at the start of the data area.
    let data_start = (META_BYTES + R_JOURNAL).div_ceil(R_CHUNK) * R_CHUNK;
    write(&disks[0], data_start, vec![0; 4096]).await;
    let raid = open_raid(&disks, RESTART).await.unwrap();
    assert!(raid.read(0, 4096).await.unwrap()[..] == newer[..]);
    assert_eq!(journal_findings(&raid).await, 0);
    drop(raid);
    for copy in 0..2 {
        let block = disks[2]
            .read(META_BYTES + copy * R_HALF * BLOCK, BLOCK as usize)
            .await
            .unwrap();
        assert_eq!(
            block[0..4],
            0x5335_4a53u32.to_le_bytes(),
            "copy {}",
            copy + 1
        );
        assert_eq!(block[36..40], 4u32.to_le_bytes(), "copy {}", copy + 1);
    }
}
