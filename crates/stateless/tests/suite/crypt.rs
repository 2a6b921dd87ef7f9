//! `crypt`: a model proptest, the IEEE 1619 vector through the layer, the child never holding
//! plaintext (zeros included), key-file checks, errors coming up as errors, and power cuts.
//!
//! Replay a crash seed: `STRATA_CRASH_SEED=<seed> cargo test -p strata-stateless --test suite -- crypt::`.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::layer::OptionValue;
use strata_core::{
    BlockDevice, BlockError, Control, ControlReply, DeviceRef, ExtentState, TokioRuntime,
    WriteFlags, ZeroFlags,
};
use strata_crash::{
    flat_device_scenario, open_disks, sector_disk, CrashGroup, CrashRun, ScenarioConfig,
};
use strata_stateless::crypt::{self, Crypt};

use crate::common;
use common::{data, one_child_args};

/// IEEE 1619 vectors 10-14: Key1 ‖ Key2.
const KEY_HEX: &str = "27182818284590452353602874713526624977572470936999595749669676273141592653589793238462643383279502884197169399375105820974944592";

fn key() -> Vec<u8> {
    (0..128)
        .step_by(2)
        .map(|i| u8::from_str_radix(&KEY_HEX[i..i + 2], 16).unwrap())
        .collect()
}

fn crypt_over(child: DeviceRef, sector: u64) -> Crypt {
    Crypt::new("c".into(), child, &key(), sector, TokioRuntime::current()).unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Write { at: f64, sectors: u64, seed: u8 },
    Read { at: f64, sectors: u64 },
    Zero { at: f64, sectors: u64 },
    Discard { at: f64, sectors: u64 },
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    let at = 0.0..1.0f64;
    // Up to 160 KiB: above the inline limit, so the blocking-pool path runs too.
    let sectors = 0u64..320;
    prop_oneof![
        6 => (at.clone(), sectors.clone(), any::<u8>()).prop_map(|(at, sectors, seed)| Op::Write { at, sectors, seed }),
        4 => (at.clone(), sectors.clone()).prop_map(|(at, sectors)| Op::Read { at, sectors }),
        2 => (at.clone(), sectors.clone()).prop_map(|(at, sectors)| Op::Zero { at, sectors }),
        1 => (at, sectors).prop_map(|(at, sectors)| Op::Discard { at, sectors }),
        1 => Just(Op::Flush),
    ]
}

/// A request of whole sectors, clamped to the device.
fn place(size: u64, sector: u64, at: f64, sectors: u64) -> (u64, u64) {
    let count = size / sector;
    let first = ((count as f64 * at) as u64).min(count);
    (first * sector, sectors.min(count - first) * sector)
}

async fn apply(c: &Crypt, model: &mut [u8], sector: u64, op: &Op) {
    let size = model.len() as u64;
    match *op {
        Op::Write { at, sectors, seed } => {
            let (offset, len) = place(size, sector, at, sectors);
            let bytes = Bytes::from(data(seed, offset, len));
            let before = bytes.clone();
            c.write(offset, bytes.clone(), WriteFlags::default())
                .await
                .unwrap();
            assert_eq!(bytes, before, "the caller's buffer is never changed");
            model[offset as usize..(offset + len) as usize].copy_from_slice(&bytes);
        }
        Op::Read { at, sectors } => {
            let (offset, len) = place(size, sector, at, sectors);
            let got = c.read(offset, len as usize).await.unwrap();
            let want = &model[offset as usize..(offset + len) as usize];
            assert!(got[..] == *want, "read [{offset}, +{len}) differs");
        }
        Op::Zero { at, sectors } => {
            let (offset, len) = place(size, sector, at, sectors);
            c.write_zeroes(offset, len, ZeroFlags::default())
                .await
                .unwrap();
            model[offset as usize..(offset + len) as usize].fill(0);
        }
        Op::Discard { at, sectors } => {
            let (offset, len) = place(size, sector, at, sectors);
            let error = c.discard(offset, len).await.unwrap_err();
            assert!(matches!(error, BlockError::Unsupported(_)), "{error:?}");
        }
        Op::Flush => c.flush().await.unwrap(),
    }
}

/// No 16-byte block of plaintext sits in the child where it belongs, except in sectors
/// never written at all (zeros in the model and on the child alike).
async fn check_no_plaintext(child: &MemoryDevice, model: &[u8]) {
    let raw = child.read(0, model.len()).await.unwrap();
    for (index, (plain, stored)) in model.chunks(512).zip(raw.chunks(512)).enumerate() {
        let never_written = stored.iter().all(|&b| b == 0) && plain.iter().all(|&b| b == 0);
        if never_written {
            continue;
        }
        for (p, s) in plain.chunks(16).zip(stored.chunks(16)) {
            assert_ne!(p, s, "plaintext in sector {index} of the child");
        }
    }
}

fn run(size: u64, sector: u64, ops: Vec<Op>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    runtime.block_on(async {
        let child = Arc::new(MemoryDevice::new(size));
        let c = crypt_over(child.clone(), sector);
        assert_eq!(c.geometry().size, size / sector * sector);
        let mut model = vec![0; c.geometry().size as usize];
        for op in &ops {
            apply(&c, &mut model, sector, op).await;
        }
        let all = c.read(0, model.len()).await.unwrap();
        assert!(all[..] == model[..], "whole-device read differs");
        check_no_plaintext(&child, &model).await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    #[test]
    fn crypt_matches_a_byte_array(
        size in 300_000u64..700_000,
        large in any::<bool>(),
        ops in prop::collection::vec(op(), 1..30),
    ) {
        run(size, if large { 4096 } else { 512 }, ops);
    }
}

#[tokio::test]
async fn ieee_1619_vector_10_is_what_the_child_stores() {
    let child = Arc::new(MemoryDevice::new(1 << 20));
    let c = crypt_over(child.clone(), 512);
    let plaintext: Vec<u8> = (0..512).map(|i| i as u8).collect();
    c.write(
        255 * 512,
        Bytes::from(plaintext.clone()),
        WriteFlags::default(),
    )
    .await
    .unwrap();
    let stored = child.read(255 * 512, 512).await.unwrap();
    assert_eq!(
        stored[..16],
        [
            0x1c, 0x3b, 0x3a, 0x10, 0x2f, 0x77, 0x03, 0x86, 0xe4, 0x83, 0x6c, 0x99, 0xe3, 0x70,
            0xcf, 0x9b
        ]
    );
    assert_eq!(
        stored[496..],
        [
            0xc4, 0xf3, 0x6f, 0xfd, 0xa9, 0xfc, 0xea, 0x70, 0xb9, 0xc6, 0xe6, 0x93, 0xe1, 0x48,
            0xc1, 0x51
        ]
    );
    assert_eq!(c.read(255 * 512, 512).await.unwrap()[..], plaintext[..]);
}

#[tokio::test]
async fn zeros_are_written_as_ciphertext_and_nothing_reads_as_a_hole() {
    let child = Arc::new(MemoryDevice::new(4 << 20));
    let c = crypt_over(child.clone(), 512);
    assert!(!c.capabilities().discard);
    assert!(!c.capabilities().fast_zero);
    // 3 MiB: several pieces, some in flight together.
    c.write_zeroes(4096, 3 << 20, ZeroFlags::default())
        .await
        .unwrap();
    let raw = child.read(4096, 3 << 20).await.unwrap();
    assert!(
        raw.chunks(512).all(|s| s.iter().any(|&b| b != 0)),
        "a zero sector reached the child"
    );
    assert!(c.read(4096, 3 << 20).await.unwrap().iter().all(|&b| b == 0));
    let fast = ZeroFlags {
        fast: true,
        ..ZeroFlags::default()
    };
    let error = c.write_zeroes(0, 512, fast).await.unwrap_err();
    assert!(matches!(error, BlockError::Unsupported(_)), "{error:?}");
    let extents = c.block_status(0, 4 << 20).await.unwrap();
    assert_eq!(extents.len(), 1);
    assert_eq!(extents[0].state, ExtentState::Data);
}

fn key_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-crypt-{name}-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("keys")).unwrap();
    dir
}

async fn build(
    dir: &std::path::Path,
    options: &[(&str, OptionValue)],
) -> strata_core::Result<DeviceRef> {
    let args = one_child_args("secret", 1 << 20, options, dir, TokioRuntime::current());
    (crypt::KIND.build)(args).await
}

#[tokio::test]
async fn the_key_file_must_hold_exactly_64_raw_bytes() {
    let dir = key_dir("keys");
    let text = |s: &str| OptionValue::Text(s.into());
    std::fs::write(dir.join("keys/good.key"), key()).unwrap();
    let mut with_newline = key();
    with_newline.push(b'\n');
    std::fs::write(dir.join("keys/newline.key"), with_newline).unwrap();
    std::fs::write(dir.join("keys/hex.key"), KEY_HEX).unwrap();

    let device = build(&dir, &[("key-file", text("keys/good.key"))])
        .await
        .unwrap();
    let ControlReply::Describe(node) = device.control(Control::Describe).await.unwrap() else {
        panic!("no description");
    };
    assert_eq!(node.kind, "crypt");
    let details = format!("{:?}", node.detail);
    assert!(
        details.contains("good.key") && !details.contains("2718"),
        "{details}"
    );

    for (file, bytes) in [("keys/newline.key", 65), ("keys/hex.key", 128)] {
        let error = build(&dir, &[("key-file", text(file))])
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains(&format!("holds {bytes} bytes")) && error.contains("exactly 64"),
            "{error}"
        );
    }
    let missing = build(&dir, &[]).await.err().unwrap().to_string();
    assert!(missing.contains("`key-file` is required"), "{missing}");
    let absent = build(&dir, &[("key-file", text("keys/none.key"))]).await;
    assert!(matches!(absent, Err(BlockError::Io { .. })));
    let odd = build(
        &dir,
        &[
            ("key-file", text("keys/good.key")),
            ("sector-size", OptionValue::Integer(1024)),
        ],
    )
    .await
    .err()
    .unwrap()
    .to_string();
    assert!(odd.contains("512 or 4096"), "{odd}");
    let same_halves = Crypt::new(
        "c".into(),
        Arc::new(MemoryDevice::new(4096)),
        &[7; 64],
        512,
        TokioRuntime::current(),
    );
    assert!(same_halves.is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn child_errors_come_up_as_errors() {
    let disk = CrashGroup::new().disk(sector_disk(1 << 20));
    let c = crypt_over(Arc::new(disk.clone()), 512);
    c.write(0, Bytes::from(vec![1; 8192]), WriteFlags::default())
        .await
        .unwrap();
    disk.fail_reads(4096, 512);
    let error = c.read(0, 8192).await.unwrap_err();
    assert_eq!(error.errno(), 5, "{error:?}");
    assert_eq!(c.read(0, 4096).await.unwrap()[..], [1; 4096][..]);
    disk.fail_writes(0, 512);
    let error = c
        .write_zeroes(0, 4096, ZeroFlags::default())
        .await
        .unwrap_err();
    assert_eq!(error.errno(), 5, "{error:?}");
}

#[test]
fn crypt_keeps_every_flushed_write_through_power_cuts() {
    let run = CrashRun {
        name: "crypt",
        replay: "cargo test -p strata-stateless --test suite -- crypt::crypt_keeps",
        default_iterations: 300,
    };
    let mut config = ScenarioConfig::new(vec![sector_disk(512 << 10)]);
    config.max_write = 128 << 10;
    config.concurrency = 3;
    let summary = run.run_async(|seed| {
        let config = config.clone();
        async move {
            flat_device_scenario(seed, &config, |group, images| {
                let disk = open_disks(group, &config.disks, images).remove(0);
                async move {
                    let c = crypt_over(Arc::new(disk), 512);
                    c.flush().await?;
                    Ok(Arc::new(c) as DeviceRef)
                }
            })
            .await
        }
    });
    assert!(summary.crash_points >= summary.iterations);
}
