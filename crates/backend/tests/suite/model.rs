//! Random sequences of every operation, run against each backend and checked against the
//! simplest possible model of a disk: a `Vec<u8>`.

use crate::common;

use std::ops::Range;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, BlockError, WriteFlags, ZeroFlags};

use common::{create, open_direct, pattern, read};

const SIZE: u64 = 256 * 1024;
const PAGE: u64 = 4096;

#[derive(Clone, Debug)]
enum Op {
    Read {
        offset: u64,
        len: u64,
    },
    Write {
        offset: u64,
        len: u64,
        seed: u8,
        fua: bool,
    },
    Flush,
    Discard {
        offset: u64,
        len: u64,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
        flags: ZeroFlags,
    },
    BlockStatus {
        offset: u64,
        len: u64,
    },
}

/// A range inside the device made of whole `unit`s, at most `max_units` long.
fn range_of(unit: u64, max_units: u64) -> BoxedStrategy<(u64, u64)> {
    let units = SIZE / unit;
    (0..=units)
        .prop_flat_map(move |start| {
            (0..=max_units.min(units - start)).prop_map(move |n| (start * unit, n * unit))
        })
        .boxed()
}

/// Ranges for a device accepting `unit`-aligned requests. Byte-addressable devices also get
/// page-aligned ranges, which are the ones that free or punch whole pages.
fn ranges(unit: u64) -> BoxedStrategy<(u64, u64)> {
    if unit == 1 {
        prop_oneof![range_of(1, 20_000), range_of(PAGE, 5)].boxed()
    } else {
        range_of(unit, 8)
    }
}

fn op(unit: u64) -> impl Strategy<Value = Op> {
    let flags =
        (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(may_trim, fast, fua)| ZeroFlags {
            may_trim,
            fast,
            fua,
        });
    prop_oneof![
        3 => ranges(unit).prop_map(|(offset, len)| Op::Read { offset, len }),
        4 => (ranges(unit), any::<u8>(), any::<bool>())
            .prop_map(|((offset, len), seed, fua)| Op::Write { offset, len, seed, fua }),
        1 => Just(Op::Flush),
        2 => ranges(unit).prop_map(|(offset, len)| Op::Discard { offset, len }),
        2 => (ranges(unit), flags)
            .prop_map(|((offset, len), flags)| Op::WriteZeroes { offset, len, flags }),
        2 => ranges(unit).prop_map(|(offset, len)| Op::BlockStatus { offset, len }),
    ]
}

fn ops(unit: u64) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(unit), 1..48)
}

fn span(offset: u64, len: u64) -> Range<usize> {
    offset as usize..(offset + len) as usize
}

fn failed(op: &Op, e: BlockError) -> TestCaseError {
    TestCaseError::fail(format!("{op:?} failed: {e}"))
}

/// Names the first differing byte instead of printing two long buffers.
fn same(got: &[u8], want: &[u8], offset: u64, what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}: length", what);
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        return Err(TestCaseError::fail(format!(
            "{what}: byte {} is {} but the model has {}",
            offset + i as u64,
            got[i],
            want[i]
        )));
    }
    Ok(())
}

async fn check(dev: &dyn BlockDevice, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut model = vec![0u8; SIZE as usize];
    for op in ops {
        match *op {
            Op::Read { offset, len } => {
                let got = read(dev, offset, len as usize)
                    .await
                    .map_err(|e| failed(op, e))?;
                same(&got, &model[span(offset, len)], offset, &format!("{op:?}"))?;
            }
            Op::Write {
                offset,
                len,
                seed,
                fua,
            } => {
                let data = pattern(seed, offset, len as usize);
                dev.write(offset, Bytes::from(data.clone()), WriteFlags { fua })
                    .await
                    .map_err(|e| failed(op, e))?;
                model[span(offset, len)].copy_from_slice(&data);
            }
            Op::Flush => dev.flush().await.map_err(|e| failed(op, e))?,
            Op::Discard { offset, len } => {
                dev.discard(offset, len).await.map_err(|e| failed(op, e))?;
                // The contract lets each byte read as zero or as before; learn which.
                let got = read(dev, offset, len as usize)
                    .await
                    .map_err(|e| failed(op, e))?;
                for (i, (&g, &old)) in got.iter().zip(&model[span(offset, len)]).enumerate() {
                    prop_assert!(
                        g == 0 || g == old,
                        "{:?}: byte {} reads {} after discard, neither 0 nor the old {}",
                        op,
                        offset + i as u64,
                        g,
                        old
                    );
                }
                model[span(offset, len)].copy_from_slice(&got);
            }
            Op::WriteZeroes { offset, len, flags } => {
                match dev.write_zeroes(offset, len, flags).await {
                    Ok(()) => model[span(offset, len)].fill(0),
                    // Refusing a fast zero is a legal answer; the data must then be untouched,
                    // which later reads check.
                    Err(BlockError::Unsupported(_)) if flags.fast => {}
                    Err(e) => return Err(failed(op, e)),
                }
            }
            Op::BlockStatus { offset, len } => {
                let extents = dev
                    .block_status(offset, len)
                    .await
                    .map_err(|e| failed(op, e))?;
                if len == 0 {
                    prop_assert!(extents.is_empty(), "{:?}: {:?}", op, extents);
                    continue;
                }
                prop_assert!(!extents.is_empty(), "{:?}: no extents", op);
                let mut pos = offset;
                for (i, e) in extents.iter().enumerate() {
                    prop_assert_eq!(e.offset, pos, "{:?}: not contiguous: {:?}", op, extents);
                    prop_assert!(e.len > 0, "{:?}: empty extent in {:?}", op, extents);
                    if i > 0 {
                        prop_assert_ne!(extents[i - 1].state, e.state, "unmerged: {:?}", extents);
                    }
                    pos += e.len;
                    prop_assert!(
                        pos <= offset + len,
                        "{:?}: past the range: {:?}",
                        op,
                        extents
                    );
                    if e.state.reads_zero() {
                        let bytes = &model[span(e.offset, e.len)];
                        if let Some(i) = bytes.iter().position(|&b| b != 0) {
                            return Err(TestCaseError::fail(format!(
                                "{op:?}: {e:?} claims zeros but byte {} holds {}",
                                e.offset + i as u64,
                                bytes[i]
                            )));
                        }
                    }
                }
            }
        }
    }
    let all = read(dev, 0, SIZE as usize)
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    same(&all, &model, 0, "final read of the whole device")
}

/// Runs `cases` random sequences, each on a fresh device from `make`.
fn run_model<D: BlockDevice>(name: &str, cases: u32, unit: u64, make: impl Fn() -> Option<D>) {
    let handle = tokio::runtime::Handle::current();
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    // proptest drives synchronously; block_in_place lets this worker block on each case
    // while the runtime's other threads serve the device's blocking work.
    let result = tokio::task::block_in_place(|| {
        TestRunner::new(config).run(&ops(unit), |ops| {
            let Some(dev) = make() else {
                return Ok(());
            };
            handle.block_on(check(&dev, &ops))
        })
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_device_matches_the_model() {
    run_model("memory", 128, 1, || Some(MemoryDevice::new(SIZE)));
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_device_with_4k_min_io_matches_the_model() {
    let geometry = strata_core::Geometry {
        min_io: 4096,
        ..strata_core::Geometry::byte_addressable(SIZE)
    };
    run_model("memory 4k", 32, 4096, || {
        Some(MemoryDevice::with_geometry(geometry))
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn buffered_file_matches_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let case = std::sync::atomic::AtomicU32::new(0);
    run_model("buffered file", 64, 1, || {
        let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(create(&dir.path().join(format!("case{n}.img")), SIZE))
    });
}

/// The same, with every request on blocking threads (no page-cache fast path).
#[tokio::test(flavor = "multi_thread")]
async fn buffered_file_without_inline_io_matches_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let case = std::sync::atomic::AtomicU32::new(0);
    run_model("buffered file, threads only", 32, 1, || {
        let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let options = strata_backend::FileOptions {
            size: Some(SIZE),
            inline_cached_io: false,
            ..strata_backend::FileOptions::new(dir.path().join(format!("case{n}.img")))
        };
        Some(common::open(options).expect("open a test file"))
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn direct_file_matches_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let Some(probe) = open_direct(&dir.path().join("probe.img"), SIZE) else {
        return;
    };
    let min_io = u64::from(probe.geometry().min_io);
    assert!(min_io > 1, "O_DIRECT must demand alignment");
    if !PAGE.is_multiple_of(min_io) {
        eprintln!("note: O_DIRECT alignment {min_io} does not divide 4096; skipping");
        return;
    }
    let case = std::sync::atomic::AtomicU32::new(0);
    run_model("direct file", 64, PAGE, || {
        let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        open_direct(&dir.path().join(format!("case{n}.img")), SIZE)
    });
}
