//! raid5 against a model: random reads, writes and flushes over 3–5 in-memory members, a
//! member failed at a random point (reads must stay right), then replaced and rebuilt
//! (afterwards every stripe's parity must equal the XOR of its data), then a reopen. Also
//! the member I/O each kind of write costs, counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::{
    async_trait, BlockDevice, Capabilities, Control, ControlReply, DeviceRef, Extent, Geometry,
    Health, Member, Result, TokioRuntime, WriteFlags, ZeroFlags,
};
use strata_layers::raid5::{Layout, Raid5, Settings, META_BYTES};

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
        unsafe_skip_journal: false,
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
            raid.control(Control::FailMember { index: victim })
                .await
                .unwrap();
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
    let error = open(&devices, 2 * CHUNK, JOURNAL)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        error.contains("chunk = 8192") && error.contains("chunk = 4096"),
        "{error}"
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
    // Two missing: every I/O fails, never wrong data.
    drop(raid);
    partial[1] = None;
    let raid = open(&partial, CHUNK, JOURNAL).await.unwrap();
    assert_eq!(raid.health(), Health::Failed);
    assert!(raid.read(0, 512).await.is_err());
}

/// Counts member I/O by region: metadata, journal, data.
struct Counting {
    inner: MemoryDevice,
    data_start: u64,
    data_reads: AtomicU64,
    data_writes: AtomicU64,
    journal_writes: AtomicU64,
    other: AtomicU64,
}

impl Counting {
    fn new(size: u64, data_start: u64) -> Arc<Counting> {
        Arc::new(Counting {
            inner: MemoryDevice::new(size),
            data_start,
            data_reads: AtomicU64::new(0),
            data_writes: AtomicU64::new(0),
            journal_writes: AtomicU64::new(0),
            other: AtomicU64::new(0),
        })
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
impl BlockDevice for Counting {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        let counter = if offset >= self.data_start {
            &self.data_reads
        } else {
            &self.other
        };
        counter.fetch_add(1, Ordering::SeqCst);
        self.inner.read(offset, len).await
    }
    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        let counter = if offset >= self.data_start {
            &self.data_writes
        } else if offset >= META_BYTES {
            &self.journal_writes
        } else {
            &self.other
        };
        counter.fetch_add(1, Ordering::SeqCst);
        // A real device completes later: let other requests run meanwhile.
        tokio::task::yield_now().await;
        self.inner.write(offset, data, flags).await
    }
    async fn flush(&self) -> Result<()> {
        self.inner.flush().await
    }
    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.discard(offset, len).await
    }
    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.inner.write_zeroes(offset, len, flags).await
    }
    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.inner.block_status(offset, len).await
    }
    async fn control(&self, request: Control) -> Result<ControlReply> {
        self.inner.control(request).await
    }
}

fn totals(devices: &[Arc<Counting>]) -> [u64; 4] {
    devices.iter().fold([0; 4], |acc, d| {
        let t = d.take();
        [acc[0] + t[0], acc[1] + t[1], acc[2] + t[2], acc[3] + t[3]]
    })
}

#[tokio::test]
async fn member_io_per_write_is_counted() {
    let chunk = 64 << 10;
    let journal = 4 << 20;
    let stripes = 160;
    let data_start = (META_BYTES + journal).div_ceil(chunk) * chunk;
    let size = member_size(chunk, journal, stripes);
    let counting: Vec<Arc<Counting>> = (0..4).map(|_| Counting::new(size, data_start)).collect();
    let devices: Vec<Option<DeviceRef>> = counting
        .iter()
        .map(|c| Some(c.clone() as DeviceRef))
        .collect();
    let raid = open(&devices, chunk, journal).await.unwrap();
    totals(&counting);
    // One 4 KiB write at an aligned offset: read old data + old parity, write both, and one
    // journal record (header + data + parity, one FUA write on the parity member).
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..50 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let offset = state % (raid.geometry().size / 4096) * 4096;
        raid.write(offset, Bytes::from(vec![1u8; 4096]), WriteFlags::default())
            .await
            .unwrap();
        assert_eq!(totals(&counting), [2, 2, 1, 0], "4 KiB write at {offset}");
    }
    // A full, aligned stripe: no reads, every member written once, one intent record.
    let stripe = 3 * chunk;
    raid.write(
        5 * stripe,
        Bytes::from(vec![2u8; stripe as usize]),
        WriteFlags::default(),
    )
    .await
    .unwrap();
    assert_eq!(totals(&counting), [0, 4, 1, 0]);
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
        raid.control(Control::FailMember { index: 1 })
            .await
            .unwrap();
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
            strata_layers::raid5::MemberState::Rebuilding
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
