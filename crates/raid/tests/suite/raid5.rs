//! raid5 against a model: random reads, writes and flushes over 3–5 in-memory members, a
//! member failed at a random point (reads must stay right), then replaced and rebuilt
//! (afterwards every stripe's parity must equal the XOR of its data), then a reopen. Also
//! the member I/O each kind of write costs, counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::layer::StartPolicy;
use strata_core::{
    async_trait, BlockDevice, Control, ControlReply, DeviceRef, Health, Member, Result,
    TokioRuntime, WriteFlags,
};
use strata_crash::testkit::{Intercepted, Interceptor, Request};
use strata_raid::raid5::{Layout, Raid5, Settings, META_BYTES};

use crate::common;
use common::{fail_member, refused};

const CHUNK: u64 = 4096;
const JOURNAL: u64 = 64 << 10;
const STRIPES: u64 = 24;

fn member_size(chunk: u64, journal: u64, stripes: u64) -> u64 {
    (META_BYTES + journal).div_ceil(chunk) * chunk + stripes * chunk
}

fn settings(chunk: u64, journal: u64) -> Settings {
    Settings {
        chunk: Some(chunk),
        journal: Some(journal),
        journal_device: None,
        unsafe_skip_journal: false,
        start: StartPolicy::FRESH,
    }
}

async fn open(devices: &[Option<DeviceRef>], chunk: u64, journal: u64) -> Result<Raid5> {
    Raid5::open(
        "r5".into(),
        devices.to_vec(),
        settings(chunk, journal),
        TokioRuntime::current(),
    )
    .await
}

/// Every stripe's chunks XOR to zero: parity == XOR of the data.
async fn check_parity(devices: &[DeviceRef], layout: Layout) {
    for stripe in 0..layout.stripes {
        let offset = layout.member_offset(stripe, 0);
        let mut sum = vec![0u8; layout.chunk_bytes as usize];
        for device in devices {
            let bytes = device
                .read(offset, layout.chunk_bytes as usize)
                .await
                .unwrap();
            for (a, b) in sum.iter_mut().zip(bytes.iter()) {
                *a ^= b;
            }
        }
        assert!(
            sum.iter().all(|&b| b == 0),
            "stripe {stripe}: parity does not match data"
        );
    }
}

async fn wait_rebuilt(raid: &Raid5) {
    for _ in 0..200_000 {
        if raid.health() == Health::Ok {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("rebuild did not finish");
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        at: u64,
        sectors: u64,
        fua: bool,
        seed: u8,
    },
    Read {
        at: u64,
        sectors: u64,
    },
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..1000, 1u64..40, any::<bool>(), any::<u8>())
            .prop_map(|(at, sectors, fua, seed)| Op::Write { at, sectors, fua, seed }),
        2 => (0u64..1000, 1u64..40).prop_map(|(at, sectors)| Op::Read { at, sectors }),
        1 => Just(Op::Flush),
    ]
}

async fn apply(raid: &Raid5, model: &mut [u8], op: &Op) {
    let sectors_total = model.len() as u64 / 512;
    match *op {
        Op::Write {
            at,
            sectors,
            fua,
            seed,
        } => {
            let at = at % sectors_total;
            let sectors = sectors.min(sectors_total - at);
            let data: Vec<u8> = (0..sectors * 512)
                .map(|i| (i as u8).wrapping_mul(31) ^ seed)
                .collect();
            raid.write(at * 512, Bytes::from(data.clone()), WriteFlags { fua })
                .await
                .unwrap();
            model[(at * 512) as usize..((at + sectors) * 512) as usize].copy_from_slice(&data);
        }
        Op::Read { at, sectors } => {
            let at = at % sectors_total;
            let sectors = sectors.min(sectors_total - at);
            let got = raid.read(at * 512, (sectors * 512) as usize).await.unwrap();
            assert!(
                got[..] == model[(at * 512) as usize..((at + sectors) * 512) as usize],
                "read at sector {at} differs from the model"
            );
        }
        Op::Flush => raid.flush().await.unwrap(),
    }
}

async fn read_all(raid: &Raid5, model: &[u8], when: &str) {
    let got = raid.read(0, model.len()).await.unwrap();
    if let Some(at) = (0..model.len()).find(|&i| got[i] != model[i]) {
        panic!("{when}: whole-device read differs from the model at byte {at}");
    }
}

async fn scenario(n: usize, ops: Vec<Op>, fail_at: usize, victim: usize) {
    let size = member_size(CHUNK, JOURNAL, STRIPES);
    let mut devices: Vec<DeviceRef> = (0..n)
        .map(|_| Arc::new(MemoryDevice::new(size)) as DeviceRef)
        .collect();
    let present: Vec<Option<DeviceRef>> = devices.iter().cloned().map(Some).collect();
    let raid = open(&present, CHUNK, JOURNAL).await.unwrap();
    let mut model = vec![0u8; raid.geometry().size as usize];
    let victim = victim % n;
    for (i, op) in ops.iter().enumerate() {
        if i == fail_at % ops.len() {
            fail_member(&raid, victim).await.unwrap();
            assert_eq!(raid.health(), Health::Degraded);
            read_all(&raid, &model, "after the failure").await;
        }
        apply(&raid, &mut model, op).await;
    }
    read_all(&raid, &model, "after the workload").await;
    let fresh: DeviceRef = Arc::new(MemoryDevice::new(size));
    let member = Member {
        name: "spare".into(),
        device: fresh.clone(),
    };
    raid.control(Control::ReplaceMember {
        index: victim,
        member,
    })
    .await
    .unwrap();
    wait_rebuilt(&raid).await;
    devices[victim] = fresh;
    read_all(&raid, &model, "after the rebuild").await;
    raid.flush().await.unwrap();
    check_parity(&devices, raid.layout()).await;
    drop(raid);
    let present: Vec<Option<DeviceRef>> = devices.iter().cloned().map(Some).collect();
    let raid = open(&present, CHUNK, JOURNAL).await.unwrap();
    assert_eq!(raid.health(), Health::Ok);
    read_all(&raid, &model, "after the reopen").await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn model_with_failure_and_rebuild(
        n in 3usize..=5,
        ops in proptest::collection::vec(op(), 1..50),
        fail_at in 0usize..50,
        victim in 0usize..5,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(scenario(n, ops, fail_at, victim));
    }
}

#[tokio::test]
async fn chunk_is_fixed_at_creation() {
    let size = member_size(CHUNK, JOURNAL, STRIPES);
    let devices: Vec<Option<DeviceRef>> = (0..3)
        .map(|_| Some(Arc::new(MemoryDevice::new(size)) as DeviceRef))
        .collect();
    drop(open(&devices, CHUNK, JOURNAL).await.unwrap());
    refused(
        open(&devices, 2 * CHUNK, JOURNAL).await,
        &["chunk = 8192", "chunk = 4096"],
    );
    let bad = Raid5::open(
        "x".into(),
        devices.clone(),
        Settings {
            chunk: Some(3000),
            ..settings(CHUNK, JOURNAL)
        },
        TokioRuntime::current(),
    )
    .await;
    assert!(bad.is_err());
    // A missing member at assembly is a failed member: degraded, data still readable.
    let raid = open(&devices, CHUNK, JOURNAL).await.unwrap();
    raid.write(0, Bytes::from(vec![7u8; 8192]), WriteFlags::default())
        .await
        .unwrap();
    raid.flush().await.unwrap();
    drop(raid);
    let mut partial = devices.clone();
    partial[0] = None;
    let raid = open(&partial, CHUNK, JOURNAL).await.unwrap();
    assert_eq!(raid.health(), Health::Degraded);
    assert_eq!(&raid.read(0, 8192).await.unwrap()[..], &[7u8; 8192][..]);
    // Two missing: never wrong data. The open is refused (issue 12: starting would record
    // the second member failed and fail the array for good), writing nothing, so the array
    // still opens degraded once that member is back.
    drop(raid);
    partial[1] = None;
    let error = open(&partial, CHUNK, JOURNAL).await.err().expect("refused");
    assert!(error.to_string().contains("member 1"), "{error}");
    partial[1] = devices[1].clone();
    let raid = open(&partial, CHUNK, JOURNAL).await.unwrap();
    assert_eq!(raid.health(), Health::Degraded);
    assert_eq!(&raid.read(0, 8192).await.unwrap()[..], &[7u8; 8192][..]);
}

/// Counts member I/O by region: metadata, journal, data.
type Counting = Intercepted<Counters>;

struct Counters {
    data_start: u64,
    data_reads: AtomicU64,
    data_writes: AtomicU64,
    journal_writes: AtomicU64,
    other: AtomicU64,
    fail_writes: std::sync::atomic::AtomicBool,
}

impl Counters {
    fn over_memory(size: u64, data_start: u64) -> Arc<Counting> {
        Intercepted::new(
            Arc::new(MemoryDevice::new(size)),
            Counters {
                data_start,
                data_reads: AtomicU64::new(0),
                data_writes: AtomicU64::new(0),
                journal_writes: AtomicU64::new(0),
                other: AtomicU64::new(0),
                fail_writes: Default::default(),
            },
        )
    }

    fn take(&self) -> [u64; 4] {
        [
            &self.data_reads,
            &self.data_writes,
            &self.journal_writes,
            &self.other,
        ]
        .map(|c| c.swap(0, Ordering::SeqCst))
    }
}

#[async_trait]
impl Interceptor for Counters {
    async fn before(&self, request: Request) -> Result<()> {
        match request {
            Request::Read { offset, .. } => {
                let counter = if offset >= self.data_start {
                    &self.data_reads
                } else {
                    &self.other
                };
                counter.fetch_add(1, Ordering::SeqCst);
            }
            Request::Write { offset, .. } => {
                let counter = if offset >= self.data_start {
                    &self.data_writes
                } else if offset >= META_BYTES {
                    &self.journal_writes
                } else {
                    &self.other
                };
                counter.fetch_add(1, Ordering::SeqCst);
                if self.fail_writes.load(Ordering::SeqCst) {
                    return Err(strata_core::BlockError::io(
                        "planted write failure",
                        std::io::Error::from_raw_os_error(5),
                    ));
                }
                // A real device completes later: let other requests run meanwhile.
                tokio::task::yield_now().await;
            }
            _ => {}
        }
        Ok(())
    }
}

/// One step of xorshift64: the same offsets on every run, no rand dependency.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn totals(devices: &[Arc<Counting>]) -> [u64; 4] {
    devices.iter().fold([0; 4], |acc, d| {
        let t = d.take();
        [acc[0] + t[0], acc[1] + t[1], acc[2] + t[2], acc[3] + t[3]]
    })
}

/// Writes `byte` over the whole stripe of `stripe` bytes at `offset`.
async fn write_full_stripe(raid: &Raid5, offset: u64, stripe: u64, byte: u8) {
    let data = Bytes::from(vec![byte; stripe as usize]);
    raid.write(offset, data, WriteFlags::default())
        .await
        .unwrap();
}

const COUNTED_CHUNK: u64 = 64 << 10;
const COUNTED_JOURNAL: u64 = 4 << 20;

/// Four counted members of 160 stripes of [`COUNTED_CHUNK`] after a [`COUNTED_JOURNAL`]
/// journal, and the same as children.
fn counted_members() -> (Vec<Arc<Counting>>, Vec<Option<DeviceRef>>) {
    let (chunk, journal) = (COUNTED_CHUNK, COUNTED_JOURNAL);
    let data_start = (META_BYTES + journal).div_ceil(chunk) * chunk;
    let size = member_size(chunk, journal, 160);
    let counting: Vec<Arc<Counting>> = (0..4)
        .map(|_| Counters::over_memory(size, data_start))
        .collect();
    let devices = counting
        .iter()
        .map(|c| Some(c.clone() as DeviceRef))
        .collect();
    (counting, devices)
}

#[tokio::test]
async fn member_io_per_write_is_counted() {
    let (chunk, journal) = (COUNTED_CHUNK, COUNTED_JOURNAL);
    let (counting, devices) = counted_members();
    let raid = open(&devices, chunk, journal).await.unwrap();
    totals(&counting);
    // One 4 KiB write at an aligned offset: read old data + old parity, write both, and one
    // journal record (header + data + parity) written to both copies of the parity member's
    // journal: two FUA writes, issued together (journal version 3).
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..50 {
        let offset = xorshift(&mut state) % (raid.geometry().size / 4096) * 4096;
        raid.write(offset, Bytes::from(vec![1u8; 4096]), WriteFlags::default())
            .await
            .unwrap();
        assert_eq!(totals(&counting), [2, 2, 2, 0], "4 KiB write at {offset}");
    }
    // A full, aligned stripe: no reads, every member written once, one intent record (in
    // two copies).
    let stripe = 3 * chunk;
    write_full_stripe(&raid, 5 * stripe, stripe, 2).await;
    assert_eq!(totals(&counting), [0, 4, 2, 0]);
    // Group commit: 32 concurrent small writes to stripes whose parity is on one member
    // share journal writes.
    let writes = (0..32u64).map(|i| {
        let offset = (4 * i + 1) * stripe; // stripes 1, 5, 9, …: parity on member 2
        raid.write(offset, Bytes::from(vec![3u8; 4096]), WriteFlags::default())
    });
    futures_util::future::try_join_all(writes).await.unwrap();
    let [reads, data, journal_writes, other] = totals(&counting);
    assert_eq!((reads, data, other), (64, 64, 0));
    eprintln!("32 concurrent 4 KiB writes on one parity member: {journal_writes} journal writes");
    assert!(
        journal_writes < 32,
        "{journal_writes} journal writes for 32 updates"
    );
}

/// A numeric line of raid5's Describe detail.
async fn detail(raid: &Raid5, key: &str) -> u64 {
    let Ok(ControlReply::Describe(node)) = raid.control(Control::Describe).await else {
        panic!("raid5 describes itself");
    };
    let (_, value) = node
        .detail
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key:?} in {:?}", node.detail));
    value.parse().unwrap()
}

#[tokio::test]
async fn small_concurrent_writes_to_one_stripe_share_one_parity_update() {
    let (chunk, journal) = (COUNTED_CHUNK, COUNTED_JOURNAL);
    let (counting, devices) = counted_members();
    let raid = open(&devices, chunk, journal).await.unwrap();
    let stripe = 3 * chunk;
    write_full_stripe(&raid, stripe, stripe, 9).await;
    let (updates, coalesced) = (
        detail(&raid, "stripe updates").await,
        detail(&raid, "coalesced writes").await,
    );
    totals(&counting);
    // Six 4 KiB writes to stripe 1, submitted together: rows 0, 8 KiB and 16 KiB of its
    // first two data chunks. Alone, each would be a read-modify-write (2 reads, 2 writes:
    // 12 and 12). Together, each row's two writes share its parity, and a row with two of
    // three chunks written is cheaper to rebuild from the third: 3 reads, 6 + 3 writes.
    let offsets: Vec<u64> = [0, chunk]
        .iter()
        .flat_map(|&c| [0u64, 8 << 10, 16 << 10].map(|row| stripe + c + row))
        .collect();
    let writes = offsets.iter().enumerate().map(|(i, &offset)| {
        raid.write(
            offset,
            Bytes::from(vec![i as u8 + 1; 4096]),
            WriteFlags::default(),
        )
    });
    futures_util::future::try_join_all(writes).await.unwrap();
    let [reads, data, journal_writes, other] = totals(&counting);
    assert_eq!((reads, data, other), (3, 9, 0));
    // One journal record for the whole update, in the journal's two copies.
    assert_eq!(journal_writes, 2);
    assert_eq!(detail(&raid, "stripe updates").await, updates + 1);
    assert_eq!(detail(&raid, "coalesced writes").await, coalesced + 5);
    let mut expect = vec![9u8; stripe as usize];
    for (i, &offset) in offsets.iter().enumerate() {
        let at = (offset - stripe) as usize;
        expect[at..at + 4096].fill(i as u8 + 1);
    }
    let read = raid.read(stripe, stripe as usize).await.unwrap();
    assert!(read[..] == expect[..], "stripe 1 reads back wrong");
    let plain: Vec<DeviceRef> = devices.iter().map(|d| d.clone().unwrap()).collect();
    check_parity(&plain, raid.layout()).await;
}

#[tokio::test]
async fn a_batch_too_large_for_one_journal_record_is_split() {
    let (chunk, journal) = (COUNTED_CHUNK, COUNTED_JOURNAL);
    let (_, devices) = counted_members();
    let raid = open(&devices, chunk, journal).await.unwrap();
    let stripe = 3 * chunk;
    let updates = detail(&raid, "stripe updates").await;
    // 190 concurrent 512-byte writes, every other sector of stripe 2: each adds a data and
    // a parity range to an update record, whose header lists at most 202.
    let offsets: Vec<u64> = (0..190u64).map(|i| 2 * stripe + i * 1024).collect();
    let writes = offsets.iter().enumerate().map(|(i, &offset)| {
        raid.write(
            offset,
            Bytes::from(vec![i as u8 | 1; 512]),
            WriteFlags::default(),
        )
    });
    futures_util::future::try_join_all(writes).await.unwrap();
    let runs = detail(&raid, "stripe updates").await - updates;
    assert!(
        (2..190).contains(&runs),
        "{runs} stripe updates for 190 writes"
    );
    let read = raid.read(2 * stripe, stripe as usize).await.unwrap();
    for (i, &offset) in offsets.iter().enumerate() {
        let at = (offset - 2 * stripe) as usize;
        assert!(
            read[at..at + 512].iter().all(|&b| b == i as u8 | 1),
            "write {i}"
        );
        assert!(
            read[at + 512..at + 1024].iter().all(|&b| b == 0),
            "gap after {i}"
        );
    }
    let plain: Vec<DeviceRef> = devices.iter().map(|d| d.clone().unwrap()).collect();
    check_parity(&plain, raid.layout()).await;
}

/// Opens `r5` over `devices` with `settings` (kept for a reopen).
async fn open_with(devices: &[Option<DeviceRef>], settings: &Settings) -> Raid5 {
    let runtime = TokioRuntime::current();
    Raid5::open("r5".into(), devices.to_vec(), settings.clone(), runtime)
        .await
        .unwrap()
}

fn with_journal_device(chunk: u64, journal: u64, index: usize) -> Settings {
    Settings {
        journal_device: Some(index),
        ..settings(chunk, journal)
    }
}

/// Journals on a journal device: a small write costs exactly its 4 member I/Os (2 reads, 2
/// writes) and a full stripe its 4 writes; every journal record goes to the journal device.
#[tokio::test]
async fn journal_device_takes_the_journal_writes() {
    let (chunk, journal) = (COUNTED_CHUNK, COUNTED_JOURNAL);
    let (counting, mut devices) = counted_members();
    let journal_device = Counters::over_memory(4096 + 4 * journal, 0);
    devices.push(Some(journal_device.clone() as DeviceRef));
    let settings = with_journal_device(chunk, journal, 4);
    let raid = open_with(&devices, &settings).await;
    totals(&counting);
    journal_device.take();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut written = Vec::new();
    for i in 0..50u8 {
        let offset = xorshift(&mut state) % (raid.geometry().size / 4096) * 4096;
        raid.write(offset, Bytes::from(vec![i; 4096]), WriteFlags::default())
            .await
            .unwrap();
        written.push((offset, i));
        assert_eq!(totals(&counting), [2, 2, 0, 0], "4 KiB write at {offset}");
        // One record, in both copies of the member's journal there (journal version 3).
        assert_eq!(
            journal_device.take(),
            [0, 2, 0, 0],
            "journal record at {offset}"
        );
    }
    let stripe = 3 * chunk;
    write_full_stripe(&raid, 7 * stripe, stripe, 9).await;
    assert_eq!(totals(&counting), [0, 4, 0, 0]);
    assert_eq!(journal_device.take(), [0, 2, 0, 0]);
    raid.flush().await.unwrap();
    drop(raid);
    // Reopened from its members and journal device, the array reads back what was written.
    let raid = Raid5::open("r5".into(), devices, settings, TokioRuntime::current())
        .await
        .unwrap();
    let mut expected = std::collections::HashMap::new();
    for (offset, value) in written {
        expected.insert(offset, value);
    }
    for (offset, value) in expected {
        let bytes = raid.read(offset, 4096).await.unwrap();
        if offset / stripe != 7 {
            assert!(bytes.iter().all(|&b| b == value), "at {offset}");
        }
    }
    let bytes = raid.read(7 * stripe, stripe as usize).await.unwrap();
    assert!(bytes.iter().all(|&b| b == 9));
}

/// The journal device is checked at every open: missing, another array's, blank, not
/// configured, or configured for an array created without one: each refused with its reason.
#[tokio::test]
async fn journal_device_is_checked_at_open() {
    let size = member_size(CHUNK, JOURNAL, STRIPES);
    let jd_size = 4096 + 3 * JOURNAL;
    let array = |n: usize| -> Vec<Option<DeviceRef>> {
        (0..n)
            .map(|_| Some(Arc::new(MemoryDevice::new(size)) as DeviceRef))
            .collect()
    };
    let jd = || Some(Arc::new(MemoryDevice::new(jd_size)) as DeviceRef);
    let open_jd = |devices: Vec<Option<DeviceRef>>| async move {
        let last = devices.len() - 1;
        Raid5::open(
            "r5".into(),
            devices,
            with_journal_device(CHUNK, JOURNAL, last),
            TokioRuntime::current(),
        )
        .await
    };
    let refused = |result: Result<Raid5>, what: &str| {
        let error = result.err().expect("refused").to_string();
        assert!(error.contains(what), "{error}");
    };
    // Too small a journal device is refused at creation.
    let mut small = array(3);
    small.push(Some(
        Arc::new(MemoryDevice::new(jd_size - 4096)) as DeviceRef
    ));
    refused(open_jd(small).await, "the journal device has");
    // Create A (with a journal device) and B (with its own).
    let mut a = array(3);
    a.push(jd());
    drop(open_jd(a.clone()).await.unwrap());
    let mut b = array(3);
    b.push(jd());
    drop(open_jd(b.clone()).await.unwrap());
    // A's members with B's journal device, a blank one, or none at all.
    let mut mixed = a[..3].to_vec();
    mixed.push(b[3].clone());
    refused(open_jd(mixed).await, "belongs to another array");
    let mut blank = a[..3].to_vec();
    blank.push(jd());
    refused(open_jd(blank).await, "holds no raid5 journal header");
    let mut missing = a[..3].to_vec();
    missing.push(None);
    refused(open_jd(missing).await, "the journal device is missing");
    refused(
        open(&a[..3], CHUNK, JOURNAL).await,
        "created with a journal device",
    );
    // An array created without one cannot be given one.
    let c = array(3);
    drop(open(&c, CHUNK, JOURNAL).await.unwrap());
    let mut added = c.clone();
    added.push(jd());
    refused(open_jd(added).await, "cannot be added later");
    // A still opens with its own.
    open_jd(a).await.unwrap();
}

/// A failed member's journal stays on the journal device, but its records are older than
/// the unjournaled (data-only) writes its stripes took since: reopening must not replay them.
#[tokio::test]
async fn failed_members_journal_is_not_replayed_over_later_writes() {
    let size = member_size(CHUNK, JOURNAL, STRIPES);
    let mut devices: Vec<Option<DeviceRef>> = (0..3)
        .map(|_| Some(Arc::new(MemoryDevice::new(size)) as DeviceRef))
        .collect();
    devices.push(Some(
        Arc::new(MemoryDevice::new(4096 + 3 * JOURNAL)) as DeviceRef
    ));
    let settings = with_journal_device(CHUNK, JOURNAL, 3);
    let raid = open_with(&devices, &settings).await;
    let parity = raid.layout().parity_member(0);
    // A journaled small write to stripe 0, then its parity member fails, then a data-only
    // write to the same place.
    raid.write(0, Bytes::from(vec![1u8; 512]), WriteFlags::default())
        .await
        .unwrap();
    raid.flush().await.unwrap();
    fail_member(&raid, parity).await.unwrap();
    raid.write(0, Bytes::from(vec![2u8; 512]), WriteFlags::default())
        .await
        .unwrap();
    raid.flush().await.unwrap();
    drop(raid);
    let raid = Raid5::open("r5".into(), devices, settings, TokioRuntime::current())
        .await
        .unwrap();
    assert!(raid.read(0, 512).await.unwrap().iter().all(|&b| b == 2));
}

/// When the journal device fails, writes are refused (no update may start without its write
/// hole closed) while reads go on, no member is blamed, and the array says read-only.
#[tokio::test]
async fn failed_journal_device_refuses_writes_and_keeps_reads() {
    let size = member_size(CHUNK, JOURNAL, STRIPES);
    let mut devices: Vec<Option<DeviceRef>> = (0..3)
        .map(|_| Some(Arc::new(MemoryDevice::new(size)) as DeviceRef))
        .collect();
    let journal_device = Counters::over_memory(4096 + 3 * JOURNAL, 0);
    devices.push(Some(journal_device.clone() as DeviceRef));
    let raid = Raid5::open(
        "r5".into(),
        devices,
        with_journal_device(CHUNK, JOURNAL, 3),
        TokioRuntime::current(),
    )
    .await
    .unwrap();
    raid.write(0, Bytes::from(vec![4u8; 8192]), WriteFlags::default())
        .await
        .unwrap();
    journal_device.fail_writes.store(true, Ordering::SeqCst);
    let error = raid
        .write(4096, Bytes::from(vec![5u8; 4096]), WriteFlags::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("journal device failed"), "{error}");
    let again = raid
        .write(
            3 * CHUNK * 2,
            Bytes::from(vec![6u8; 512]),
            WriteFlags::default(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(again.contains("writes are refused"), "{again}");
    assert!(raid.read(0, 8192).await.unwrap().iter().all(|&b| b == 4));
    assert!(raid
        .member_states()
        .iter()
        .all(|s| *s == strata_raid::raid5::MemberState::Active));
    assert_eq!(raid.health(), strata_core::Health::ReadOnly);
}

async fn rebuild_progress(raid: &Raid5) -> Option<(u64, u64)> {
    let ControlReply::Describe(node) = raid.control(Control::Describe).await.unwrap() else {
        panic!("describe");
    };
    node.activity.map(|a| {
        assert!(a.what.contains("rebuilding member 1"), "{}", a.what);
        (a.done_bytes, a.total_bytes)
    })
}

/// A rebuild cut short by a restart resumes from its durable checkpoint, reports progress,
/// and leaves every stripe consistent.
#[test]
fn rebuild_resumes_after_restart() {
    let stripes = 200;
    let size = member_size(CHUNK, JOURNAL, stripes);
    let mut devices: Vec<DeviceRef> = (0..3)
        .map(|_| Arc::new(MemoryDevice::new(size)) as DeviceRef)
        .collect();
    let fresh: DeviceRef = Arc::new(MemoryDevice::new(size));
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let model = first.block_on(async {
        let present: Vec<Option<DeviceRef>> = devices.iter().cloned().map(Some).collect();
        let raid = open(&present, CHUNK, JOURNAL).await.unwrap();
        let len = raid.geometry().size as usize;
        let mut model: Vec<u8> = (0..len).map(|i| (i / 512 * 7 + i) as u8).collect();
        raid.write(0, Bytes::from(model.clone()), WriteFlags::default())
            .await
            .unwrap();
        fail_member(&raid, 1).await.unwrap();
        let degraded = vec![9u8; 3 * 4096];
        raid.write(4096, Bytes::from(degraded.clone()), WriteFlags::default())
            .await
            .unwrap();
        model[4096..4096 + degraded.len()].copy_from_slice(&degraded);
        let member = Member {
            name: "spare".into(),
            device: fresh.clone(),
        };
        raid.control(Control::ReplaceMember { index: 1, member })
            .await
            .unwrap();
        loop {
            tokio::task::yield_now().await;
            let (done, total) = rebuild_progress(&raid).await.unwrap_or((0, 1));
            assert_eq!(raid.health(), Health::Degraded);
            if done >= 100 * CHUNK {
                assert_eq!(total, stripes * CHUNK);
                break;
            }
        }
        model
    });
    drop(first); // the process dies: the rebuild task goes with it
    devices[1] = fresh;
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let present: Vec<Option<DeviceRef>> = devices.iter().cloned().map(Some).collect();
        let raid = open(&present, CHUNK, JOURNAL).await.unwrap();
        assert_eq!(
            raid.member_states()[1],
            strata_raid::raid5::MemberState::Rebuilding
        );
        tokio::task::yield_now().await;
        let (done, _) = rebuild_progress(&raid).await.expect("rebuild resumed");
        assert!(
            done >= 64 * CHUNK,
            "resumed from {done}, not from the checkpoint"
        );
        wait_rebuilt(&raid).await;
        read_all(&raid, &model, "after the resumed rebuild").await;
        raid.flush().await.unwrap();
        check_parity(&devices, raid.layout()).await;
    });
}

/// A replacement whose first data write, while armed, waits at a gate; counts data writes.
struct GatedWrites {
    data_start: u64,
    armed: std::sync::atomic::AtomicBool,
    data_writes: AtomicU64,
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[async_trait]
impl Interceptor for GatedWrites {
    async fn before(&self, request: Request) -> Result<()> {
        if let Request::Write { offset, .. } = request {
            if offset >= self.data_start {
                if self.armed.swap(false, Ordering::SeqCst) {
                    // notify_one stores a permit, so neither side can miss the other.
                    self.entered.notify_one();
                    self.release.notified().await;
                }
                self.data_writes.fetch_add(1, Ordering::SeqCst);
            }
        }
        Ok(())
    }
}

/// A quiesce lets the batch of stripes under way finish, then holds the rebuild: no stripe
/// is rebuilt while quiesced, and the rebuild completes after the resume.
#[tokio::test(flavor = "current_thread")]
async fn quiesce_pauses_a_rebuild_and_resume_continues_it() {
    let size = member_size(CHUNK, JOURNAL, STRIPES);
    let devices: Vec<DeviceRef> = (0..3)
        .map(|_| Arc::new(MemoryDevice::new(size)) as DeviceRef)
        .collect();
    let present: Vec<Option<DeviceRef>> = devices.iter().cloned().map(Some).collect();
    let raid = Arc::new(open(&present, CHUNK, JOURNAL).await.unwrap());
    let len = raid.geometry().size as usize;
    let model: Vec<u8> = (0..len).map(|i| (i / 512 * 13 + i) as u8).collect();
    raid.write(0, Bytes::from(model.clone()), WriteFlags::default())
        .await
        .unwrap();
    fail_member(raid.as_ref(), 1).await.unwrap();
    let stripes = raid.layout().stripes;
    let replacement = Intercepted::new(
        Arc::new(MemoryDevice::new(size)),
        GatedWrites {
            data_start: raid.layout().data_start,
            armed: true.into(),
            data_writes: AtomicU64::new(0),
            entered: tokio::sync::Notify::new(),
            release: tokio::sync::Notify::new(),
        },
    );
    let member = Member {
        name: "spare".into(),
        device: replacement.clone(),
    };
    raid.control(Control::ReplaceMember { index: 1, member })
        .await
        .unwrap();
    replacement.entered.notified().await;

    let quiescing = {
        let raid = raid.clone();
        tokio::spawn(async move { raid.control(Control::Quiesce).await })
    };
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        !quiescing.is_finished(),
        "the quiesce must wait for the batch under way"
    );
    replacement.release.notify_one();
    quiescing.await.unwrap().expect("quiesce");
    let batch = replacement.data_writes.load(Ordering::SeqCst);
    assert!(batch > 0 && batch < stripes, "{batch} of {stripes} stripes");
    for _ in 0..1000 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        replacement.data_writes.load(Ordering::SeqCst),
        batch,
        "stripes rebuilt while quiesced"
    );
    assert_eq!(
        raid.member_states()[1],
        strata_raid::raid5::MemberState::Rebuilding
    );

    raid.control(Control::Resume).await.expect("resume");
    wait_rebuilt(&raid).await;
    assert_eq!(replacement.data_writes.load(Ordering::SeqCst), stripes);
    read_all(&raid, &model, "after the quiesced rebuild").await;
    raid.flush().await.unwrap();
    let mut members = devices.clone();
    members[1] = replacement;
    check_parity(&members, raid.layout()).await;
    raid.control(Control::Stop).await.expect("stop");
}

/// A journal that passes the record rule but is too small for a copy's lanes (48 KiB for three
/// members of 4 KiB chunks) is refused with the rule, not a panic at open.
#[tokio::test]
async fn a_journal_below_64_kib_is_refused_by_field() {
    let journal = 48 << 10;
    let devices: Vec<Option<DeviceRef>> = (0..3)
        .map(|_| {
            Some(Arc::new(MemoryDevice::new(member_size(CHUNK, 64 << 10, STRIPES))) as DeviceRef)
        })
        .collect();
    refused(
        open(&devices, CHUNK, journal).await,
        &["journal = 49152", "at least 65536 bytes"],
    );
}
