//! Versions of thin volumes against an in-memory model of every version: random writes,
//! discards, zeroing, snapshots, deletions in any order, rollbacks, clones, compactions and
//! uncompactions, and reopens; after
//! each step every volume and every snapshot reads exactly as the model says, holes read as
//! zeros, and the pool's records pass `check_state`.
//!
//! Volume `a` also has a versions policy (a snapshot every write request, keep 2): policy
//! ticks take snapshots and delete the policy's oldest beyond the last 2, which the model
//! predicts on its own; protect and unprotect flip a snapshot's protection, which keep-K and
//! a manual delete must respect.
//!
//! A discard may leave the bytes it covers as anything (NBD's TRIM), so the model marks them
//! unknown until they are written again; a snapshot taken over unknown bytes records what the
//! volume read then, and must read the same for ever after.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, DeviceRef, ExtentState, WriteFlags, ZeroFlags};
use strata_crash::testkit::block_on;
use strata_stateless::count::Count;
use strata_thin::{check_state, ThinPool};

use crate::common;
use common::{pool_options, settings};

const EXTENT: u64 = 64 << 10;
const SIZE: u64 = 4 * EXTENT;
/// The clock the policy ticks start from (2026-11-25 18:00:00 UTC).
const T0: u64 = 1_795_629_600_000;

/// What one step does to a volume's bytes.
#[derive(Clone, Debug)]
enum Io {
    Write { fill: u8 },
    Discard,
    Zero { trim: bool },
}

#[derive(Clone, Debug)]
enum Op {
    /// `Io` over [offset, +len) of the volume picked by `volume`.
    Io {
        volume: usize,
        offset: u64,
        len: u64,
        io: Io,
    },
    Snapshot {
        volume: usize,
    },
    Delete {
        pick: usize,
    },
    Rollback {
        pick: usize,
    },
    Clone {
        pick: usize,
    },
    DeleteVolume {
        volume: usize,
    },
    Compact {
        pick: usize,
    },
    Uncompact {
        pick: usize,
    },
    Reopen,
    /// Protects the picked snapshot, or unprotects it if it is protected.
    Protect {
        pick: usize,
    },
    /// One pass of the versions policies, one second after the last.
    Tick,
}

fn io() -> impl Strategy<Value = Io> {
    prop_oneof![
        8 => any::<u8>().prop_map(|fill| Io::Write { fill: fill | 1 }),
        2 => Just(Io::Discard),
        2 => any::<bool>().prop_map(|trim| Io::Zero { trim }),
    ]
}

/// How often each step comes: `[partial I/O, whole-volume write, snapshot, delete,
/// rollback, clone, volume delete, compact, uncompact, reopen, protect, policy tick]`.
type Weights = [u32; 12];

/// Every kind of step.
const EVERYTHING: Weights = [12, 2, 3, 2, 1, 1, 1, 2, 1, 1, 1, 2];
/// Many snapshots of whole-volume rewrites, so that versions own extents alone: what
/// compaction takes.
const COMPACTION: Weights = [4, 4, 5, 1, 1, 1, 1, 4, 2, 1, 1, 1];

fn op(w: Weights) -> impl Strategy<Value = Op> {
    let sectors = (0u64..SIZE / 512, 1u64..200).prop_map(|(start, sectors)| {
        let offset = start * 512;
        (offset, (sectors * 512).min(SIZE - offset))
    });
    prop_oneof![
        w[0] => (any::<usize>(), sectors, io()).prop_map(|(volume, (offset, len), io)| Op::Io { volume, offset, len, io }),
        w[1] => (any::<usize>(), any::<u8>()).prop_map(|(volume, fill)| Op::Io {
            volume,
            offset: 0,
            len: SIZE,
            io: Io::Write { fill: fill | 1 },
        }),
        w[2] => any::<usize>().prop_map(|volume| Op::Snapshot { volume }),
        w[3] => any::<usize>().prop_map(|pick| Op::Delete { pick }),
        w[4] => any::<usize>().prop_map(|pick| Op::Rollback { pick }),
        w[5] => any::<usize>().prop_map(|pick| Op::Clone { pick }),
        w[6] => any::<usize>().prop_map(|volume| Op::DeleteVolume { volume }),
        w[7] => any::<usize>().prop_map(|pick| Op::Compact { pick }),
        w[8] => any::<usize>().prop_map(|pick| Op::Uncompact { pick }),
        w[9] => Just(Op::Reopen),
        w[10] => any::<usize>().prop_map(|pick| Op::Protect { pick }),
        w[11] => Just(Op::Tick),
    ]
}

/// Bytes with a flag each: known (the model says what they are) or not (after a discard).
#[derive(Clone, Debug)]
struct Image {
    bytes: Vec<u8>,
    known: Vec<bool>,
}

impl Image {
    fn zeros(len: u64) -> Image {
        Image {
            bytes: vec![0; len as usize],
            known: vec![true; len as usize],
        }
    }

    fn set(&mut self, offset: u64, data: &[u8]) {
        let at = offset as usize;
        self.bytes[at..at + data.len()].copy_from_slice(data);
        self.known[at..at + data.len()].fill(true);
    }

    fn forget(&mut self, offset: u64, len: u64) {
        self.known[offset as usize..(offset + len) as usize].fill(false);
    }

    /// Checks `read` against what is known, then learns the rest from it.
    fn check_and_learn(&mut self, read: &[u8], what: &str) {
        assert_eq!(read.len(), self.bytes.len(), "{what}: size");
        for (at, (&got, (&want, &known))) in read
            .iter()
            .zip(self.bytes.iter().zip(&self.known))
            .enumerate()
        {
            assert!(
                !known || got == want,
                "{what}: byte {at} reads {got}, the model says {want}"
            );
        }
        self.bytes.copy_from_slice(read);
        self.known.fill(true);
    }
}

struct Model {
    /// Volume name → what it holds.
    volumes: BTreeMap<String, Image>,
    /// (volume, snapshot) → what it holds (always fully known).
    snapshots: BTreeMap<(String, String), Image>,
    /// Snapshots with extents stored as deltas.
    compacted: BTreeSet<(String, String)>,
    next: usize,
    /// Snapshots of the policy volume the policy took and that exist, oldest first.
    policy_made: Vec<String>,
    protected: std::collections::BTreeSet<(String, String)>,
    /// Write requests to the policy volume since its last automatic snapshot (or the open).
    policy_writes: u64,
    /// The wall clock the ticks are given.
    clock: u64,
}

/// The volume with a policy, and the policy: a snapshot every write request, keep 2.
const POLICY_VOLUME: &str = "a";
const KEEP: usize = 2;

async fn read_all(device: &dyn BlockDevice) -> Vec<u8> {
    let size = device.geometry().size;
    let bytes = device.read(0, size as usize).await.unwrap();
    // Every hole must read as zeros.
    for extent in device.block_status(0, size).await.unwrap() {
        if extent.state == ExtentState::Hole {
            let at = extent.offset as usize;
            assert!(
                bytes[at..at + extent.len as usize].iter().all(|&b| b == 0),
                "a hole at {} (+{}) reads non-zero",
                extent.offset,
                extent.len
            );
        }
    }
    bytes.to_vec()
}

async fn check_everything(pool: &Arc<ThinPool>, model: &mut Model) {
    for (name, image) in model.volumes.iter_mut() {
        let volume = pool.volume(name).unwrap();
        let read = read_all(volume.as_ref()).await;
        image.check_and_learn(&read, &format!("volume {name}"));
    }
    for ((volume, snapshot), image) in model.snapshots.iter_mut() {
        let device = pool.snapshot_device(volume, snapshot).unwrap();
        let read = read_all(&device).await;
        image.check_and_learn(&read, &format!("snapshot {volume}@{snapshot}"));
    }
    let problems = pool.store().read(check_state);
    assert!(problems.is_empty(), "check_state: {problems:?}");
    // `list` knows every snapshot of the model.
    let listed: Vec<(String, String)> = pool
        .snapshots(None)
        .unwrap()
        .into_iter()
        .map(|s| (s.volume, s.name))
        .collect();
    let expected: Vec<(String, String)> = model.snapshots.keys().cloned().collect();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort();
    assert_eq!(listed_sorted, expected, "snapshot list");
    // The protections and the policy's snapshots are what the model says.
    for name in model.volumes.keys() {
        let status = pool.snapshot_policy(name).unwrap();
        let mut protected = status.protected.clone();
        protected.sort();
        let expected: Vec<String> = (model.protected.iter())
            .filter(|(volume, _)| volume == name)
            .map(|(_, snapshot)| snapshot.clone())
            .collect();
        assert_eq!(protected, expected, "protected snapshots of {name}");
        if name == POLICY_VOLUME {
            assert_eq!(
                status.policy_snapshots, model.policy_made,
                "policy snapshots"
            );
        }
    }
}

/// Whether a rollback to or a clone of a snapshot was refused because it is compacted; it
/// must be refused exactly then.
fn refused_while_compacted(
    model: &Model,
    key: &(String, String),
    result: strata_core::Result<u64>,
) -> bool {
    if model.compacted.contains(key) {
        let error = result.expect_err("a compacted snapshot was rolled back to or cloned");
        assert!(error.to_string().contains("uncompact it"), "{error}");
        return true;
    }
    result.unwrap();
    false
}

fn pick<T: Clone>(items: &[T], at: usize) -> Option<T> {
    (!items.is_empty()).then(|| items[at % items.len()].clone())
}

/// Pool settings with the commit timer off, copying whole extents on the first write after a
/// snapshot when `copy` (dm-thin's way) instead of remapping granules.
fn settings_for(copy: bool) -> strata_thin::PoolRuntime {
    let mut settings = settings();
    settings.copy_on_write = copy;
    settings
}

fn run(copy: bool, ops: Vec<Op>) {
    block_on(async {
        let child: DeviceRef = Arc::new(MemoryDevice::new((2 << 20) + 512 * EXTENT));
        let options = pool_options(EXTENT, 2 << 20);
        let mut pool = ThinPool::format("pool", child.clone(), &options, settings_for(copy))
            .await
            .unwrap();
        pool.create_volume("a", SIZE).await.unwrap();
        pool.create_volume("b", SIZE).await.unwrap();
        let mut model = Model {
            volumes: [("a", SIZE), ("b", SIZE)]
                .into_iter()
                .map(|(n, s)| (n.to_string(), Image::zeros(s)))
                .collect(),
            snapshots: BTreeMap::new(),
            compacted: BTreeSet::new(),
            next: 0,
            policy_made: Vec::new(),
            protected: Default::default(),
            policy_writes: 0,
            clock: T0,
        };
        let every_write = strata_thin::Schedule::parse(None, Some("1"), Some("2")).unwrap();
        pool.set_snapshot_policy(POLICY_VOLUME, Some(every_write), T0)
            .await
            .unwrap();
        for op in ops {
            let names: Vec<String> = model.volumes.keys().cloned().collect();
            let snapshots: Vec<(String, String)> = model.snapshots.keys().cloned().collect();
            match op {
                Op::Io {
                    volume,
                    offset,
                    len,
                    io,
                } => {
                    let Some(name) = pick(&names, volume) else {
                        continue;
                    };
                    let image = model.volumes.get_mut(&name).unwrap();
                    if offset + len > image.bytes.len() as u64 {
                        continue;
                    }
                    let device = pool.volume(&name).unwrap();
                    if name == POLICY_VOLUME {
                        model.policy_writes += 1;
                    }
                    match io {
                        Io::Write { fill } => {
                            let data: Vec<u8> = (0..len)
                                .map(|i| fill.wrapping_add((i / 512) as u8))
                                .collect();
                            let payload = Bytes::from(data.clone());
                            device
                                .write(offset, payload, WriteFlags::default())
                                .await
                                .unwrap();
                            image.set(offset, &data);
                        }
                        Io::Discard => {
                            device.discard(offset, len).await.unwrap();
                            image.forget(offset, len);
                        }
                        Io::Zero { trim } => {
                            let flags = ZeroFlags {
                                may_trim: trim,
                                ..ZeroFlags::default()
                            };
                            device.write_zeroes(offset, len, flags).await.unwrap();
                            image.set(offset, &vec![0; len as usize]);
                        }
                    }
                }
                Op::Snapshot { volume } => {
                    let Some(name) = pick(&names, volume) else {
                        continue;
                    };
                    let snapshot = format!("s{}", model.next);
                    model.next += 1;
                    pool.create_snapshot(&name, Some(&snapshot)).await.unwrap();
                    // The snapshot holds what the volume reads now, unknown bytes included.
                    let read = read_all(pool.volume(&name).unwrap().as_ref()).await;
                    let image = model.volumes.get_mut(&name).unwrap();
                    image.check_and_learn(&read, &format!("volume {name} at snapshot"));
                    model.snapshots.insert((name, snapshot), image.clone());
                }
                Op::Delete { pick: at } => {
                    let Some((volume, snapshot)) = pick(&snapshots, at) else {
                        continue;
                    };
                    let key = (volume.clone(), snapshot.clone());
                    let deleted = pool.delete_snapshot(&volume, &snapshot).await;
                    if model.protected.contains(&key) {
                        let error = deleted.unwrap_err().to_string();
                        assert!(error.contains("is protected"), "{error}");
                        continue;
                    }
                    if let Err(error) = deleted {
                        // Only a compacted snapshot another one is compacted against stays.
                        assert!(model.compacted.contains(&key), "{error}");
                        let error = error.to_string();
                        assert!(error.contains("compacted against it"), "{error}");
                        continue;
                    }
                    model.compacted.remove(&key);
                    model
                        .policy_made
                        .retain(|made| volume != POLICY_VOLUME || *made != snapshot);
                    model.snapshots.remove(&key);
                }
                Op::Rollback { pick: at } => {
                    let Some((volume, snapshot)) = pick(&snapshots, at) else {
                        continue;
                    };
                    let key = (volume.clone(), snapshot.clone());
                    if refused_while_compacted(
                        &model,
                        &key,
                        pool.rollback(&volume, &snapshot).await,
                    ) {
                        continue;
                    }
                    let image = model.snapshots[&(volume.clone(), snapshot)].clone();
                    model.volumes.insert(volume, image);
                }
                Op::Clone { pick: at } => {
                    let Some((volume, snapshot)) = pick(&snapshots, at) else {
                        continue;
                    };
                    let clone = format!("c{}", model.next);
                    model.next += 1;
                    let key = (volume.clone(), snapshot.clone());
                    let made = pool.clone_snapshot(&volume, &snapshot, &clone).await;
                    if refused_while_compacted(&model, &key, made.map(|_| 0)) {
                        continue;
                    }
                    let image = model.snapshots[&(volume, snapshot)].clone();
                    model.volumes.insert(clone, image);
                }
                Op::DeleteVolume { volume } => {
                    let Some(name) = pick(&names, volume) else {
                        continue;
                    };
                    let refused = pool.delete_volume(&name).await;
                    let has_snapshots = snapshots.iter().any(|(v, _)| *v == name);
                    if has_snapshots {
                        assert!(refused.is_err(), "volume {name} with snapshots was deleted");
                    } else if refused.is_ok() {
                        model.volumes.remove(&name);
                    } else {
                        // Refused only for clones made from it.
                        let error = refused.unwrap_err().to_string();
                        assert!(error.contains("clones"), "{error}");
                    }
                }
                Op::Compact { pick: at } => {
                    // Not the policy's volume: its keep-K deletions, which the model
                    // predicts, would meet compacted snapshots others depend on.
                    let others: Vec<(String, String)> = (snapshots.iter())
                        .filter(|(volume, _)| volume != POLICY_VOLUME)
                        .cloned()
                        .collect();
                    let Some(key) = pick(&others, at) else {
                        continue;
                    };
                    match pool.compact_snapshot(&key.0, &key.1).await {
                        Ok(report) => {
                            if report.extents_compacted > 0 {
                                model.compacted.insert(key);
                            }
                        }
                        Err(error) => {
                            // Refused only for a reason the pool names: nothing to compact
                            // against, clones, or a compaction it would depend on.
                            let error = error.to_string();
                            assert!(
                                error.contains("no later snapshot")
                                    || error.contains("cannot be compacted"),
                                "{error}"
                            );
                        }
                    }
                }
                Op::Uncompact { pick: at } => {
                    let Some(key) = pick(&snapshots, at) else {
                        continue;
                    };
                    let done = pool.uncompact_snapshot(&key.0, &key.1).await;
                    if model.compacted.remove(&key) {
                        done.unwrap();
                    } else {
                        assert!(done.unwrap_err().to_string().contains("not compacted"));
                    }
                }
                Op::Reopen => {
                    pool.flush().await.unwrap();
                    drop(pool);
                    pool = ThinPool::open("pool", child.clone(), settings_for(copy))
                        .await
                        .unwrap()
                        .0;
                    // Write counts live in memory.
                    model.policy_writes = 0;
                }
                Op::Protect { pick: at } => {
                    let Some(key) = pick(&snapshots, at) else {
                        continue;
                    };
                    let protect = !model.protected.contains(&key);
                    pool.protect_snapshot(&key.0, &key.1, protect)
                        .await
                        .unwrap();
                    if protect {
                        model.protected.insert(key);
                    } else {
                        model.protected.remove(&key);
                    }
                }
                Op::Tick => {
                    model.clock += 1000;
                    let report = pool.policy_tick(model.clock).await;
                    assert!(report.refused.is_empty(), "{report:?}");
                    if !model.volumes.contains_key(POLICY_VOLUME) {
                        assert!(report.taken.is_empty(), "{report:?}");
                        continue;
                    }
                    let mut taken = Vec::new();
                    if model.policy_writes >= 1 {
                        let name = strata_thin::schedule::auto_name(model.clock, |name| {
                            snapshots
                                .iter()
                                .any(|(v, s)| v == POLICY_VOLUME && s == name)
                        });
                        let read = read_all(pool.volume(POLICY_VOLUME).unwrap().as_ref()).await;
                        let image = model.volumes.get_mut(POLICY_VOLUME).unwrap();
                        image.check_and_learn(&read, "policy volume at its snapshot");
                        let image = image.clone();
                        model
                            .snapshots
                            .insert((POLICY_VOLUME.to_string(), name.clone()), image);
                        model.policy_made.push(name.clone());
                        model.policy_writes = 0;
                        taken.push((POLICY_VOLUME.to_string(), name));
                    }
                    assert_eq!(report.taken, taken, "automatic snapshots");
                    // Keep 2: the policy's oldest beyond the newest two go, unless protected.
                    let beyond = model.policy_made.len().saturating_sub(KEEP);
                    let gone: Vec<String> = model.policy_made[..beyond]
                        .iter()
                        .filter(|name| {
                            !model
                                .protected
                                .contains(&(POLICY_VOLUME.to_string(), (*name).clone()))
                        })
                        .cloned()
                        .collect();
                    let expected: Vec<(String, String)> = gone
                        .iter()
                        .map(|name| (POLICY_VOLUME.to_string(), name.clone()))
                        .collect();
                    assert_eq!(report.kept_deleted, expected, "keep-K deletions");
                    for name in gone {
                        model.policy_made.retain(|made| *made != name);
                        model.snapshots.remove(&(POLICY_VOLUME.to_string(), name));
                    }
                }
            }
            check_everything(&pool, &mut model).await;
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(200)
    ))]

    #[test]
    fn every_version_reads_as_the_model_says(
        copy in any::<bool>(),
        ops in proptest::collection::vec(op(EVERYTHING), 1..40),
    ) {
        run(copy, ops);
    }

    #[test]
    fn compacted_versions_read_as_the_model_says(
        ops in proptest::collection::vec(op(COMPACTION), 1..40),
    ) {
        run(false, ops);
    }
}

/// A pool over a `count` filter over a memory disk, to count the data I/O the pool does.
async fn counted_pool(copy: bool) -> (Arc<ThinPool>, Arc<Count>) {
    let disk: DeviceRef = Arc::new(MemoryDevice::new((2 << 20) + 64 * EXTENT));
    let counted = Arc::new(Count::new("counted".into(), disk));
    let options = pool_options(EXTENT, 2 << 20);
    let pool = ThinPool::format("pool", counted.clone(), &options, settings_for(copy))
        .await
        .unwrap();
    (pool, counted)
}

#[test]
fn copy_mode_copies_the_whole_extent_on_the_first_write_after_a_snapshot() {
    block_on(async {
        let (pool, counted) = counted_pool(true).await;
        let volume = pool.create_volume("v", SIZE).await.unwrap();
        let old = Bytes::from(vec![1u8; EXTENT as usize]);
        volume.write(0, old, WriteFlags::default()).await.unwrap();
        pool.create_snapshot("v", None).await.unwrap();
        let before = counted.counts();
        volume
            .write(8192, Bytes::from(vec![2u8; 4096]), WriteFlags::default())
            .await
            .unwrap();
        let after = counted.counts();
        assert_eq!(after.bytes_written - before.bytes_written, EXTENT);
        assert!(
            after.bytes_read - before.bytes_read >= EXTENT - 4096,
            "the old extent is read"
        );
        let now = volume.read(0, EXTENT as usize).await.unwrap();
        assert!(now[..8192].iter().all(|&b| b == 1) && now[12288..].iter().all(|&b| b == 1));
        assert!(now[8192..12288].iter().all(|&b| b == 2));
    });
}

#[test]
fn a_write_after_a_snapshot_writes_only_its_own_granule_and_the_snapshot_keeps_the_rest() {
    block_on(async {
        let (pool, counted) = counted_pool(false).await;
        let volume = pool.create_volume("v", SIZE).await.unwrap();
        let old = Bytes::from(vec![1u8; EXTENT as usize]);
        volume
            .write(0, old.clone(), WriteFlags::default())
            .await
            .unwrap();
        pool.create_snapshot("v", Some("before")).await.unwrap();
        let allocated = pool.allocated_extents();
        let before = counted.counts();
        volume
            .write(8192, Bytes::from(vec![2u8; 4096]), WriteFlags::default())
            .await
            .unwrap();
        let after = counted.counts();
        assert_eq!(pool.allocated_extents(), allocated + 1, "one new extent");
        assert_eq!(after.writes - before.writes, 1, "exactly one data write");
        assert_eq!(after.bytes_written - before.bytes_written, 4096);
        assert_eq!(
            after.reads, before.reads,
            "nothing of the old extent is read"
        );
        let now = volume.read(0, EXTENT as usize).await.unwrap();
        assert!(now[..8192].iter().all(|&b| b == 1));
        assert!(now[8192..12288].iter().all(|&b| b == 2));
        assert!(
            now[12288..].iter().all(|&b| b == 1),
            "the rest still comes from the old extent"
        );
        let snapshot = pool.snapshot_device("v", "before").unwrap();
        assert_eq!(
            &snapshot.read(0, EXTENT as usize).await.unwrap()[..],
            &old[..]
        );
        let listed = pool.snapshots(Some("v")).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            listed[0].unique_bytes, 4096,
            "only the rewritten granule is its own"
        );
        assert_eq!(listed[0].shared_bytes, EXTENT - 4096);
        // Deleting the snapshot frees nothing (the volume reads 15 of the old granules) but
        // kills the overwritten one.
        assert_eq!(pool.delete_snapshot("v", "before").await.unwrap(), 0);
        assert!(
            snapshot.read(0, 4096).await.is_err(),
            "a deleted snapshot reads no more"
        );
        let problems = pool.store().read(check_state);
        assert!(problems.is_empty(), "{problems:?}");
    });
}
