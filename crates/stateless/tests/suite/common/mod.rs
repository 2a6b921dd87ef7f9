//! Helpers shared by the stateless layers' tests: the byte-array model that concat and stripe
//! are checked against, and the arguments that build a layer from its options.

#![allow(dead_code)] // Each test crate uses a different subset.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::layer::{LayerArgs, OptionValue, Options, StartPolicy};
use strata_core::{BlockDevice, DeviceRef, ExtentState, Runtime, WriteFlags, ZeroFlags};

/// A request against the model. Offsets and lengths are fractions of the device size, so
/// they stay in range as it grows.
#[derive(Clone, Debug)]
pub enum Op {
    Write {
        at: f64,
        len: u64,
        seed: u8,
    },
    Read {
        at: f64,
        len: u64,
    },
    Zero {
        at: f64,
        len: u64,
    },
    Discard {
        at: f64,
        len: u64,
    },
    Status {
        at: f64,
        len: u64,
    },
    Flush,
    /// A member of `size` bytes added at the end (concat only).
    Grow {
        size: u64,
    },
}

/// Every request but [`Op::Grow`], up to `max_len` bytes long.
pub fn request(max_len: u64) -> impl Strategy<Value = Op> {
    let at = 0.0..1.0f64;
    let len = 0u64..max_len;
    prop_oneof![
        6 => (at.clone(), len.clone(), any::<u8>()).prop_map(|(at, len, seed)| Op::Write { at, len, seed }),
        4 => (at.clone(), len.clone()).prop_map(|(at, len)| Op::Read { at, len }),
        2 => (at.clone(), len.clone()).prop_map(|(at, len)| Op::Zero { at, len }),
        2 => (at.clone(), len.clone()).prop_map(|(at, len)| Op::Discard { at, len }),
        2 => (at, len).prop_map(|(at, len)| Op::Status { at, len }),
        1 => Just(Op::Flush),
    ]
}

/// Bytes that name their position, so a misplaced byte cannot pass for the right one.
pub fn data(seed: u8, offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len)
        .map(|i| (i.wrapping_mul(7) as u8) ^ seed.wrapping_mul(31) ^ 0x5a)
        .collect()
}

/// Clamps a request to the device.
pub fn place(size: u64, at: f64, len: u64) -> (u64, u64) {
    let offset = ((size as f64 * at) as u64).min(size);
    (offset, len.min(size - offset))
}

/// Runs `op` on `device` and on `model` (the device's bytes), checking every read against
/// the model. Children must zero what they discard (memory devices do). Panics on
/// [`Op::Grow`], which only the caller knows how to do.
pub async fn apply(device: &dyn BlockDevice, model: &mut [u8], op: &Op) {
    let size = model.len() as u64;
    match *op {
        Op::Write { at, len, seed } => {
            let (offset, len) = place(size, at, len);
            let bytes = data(seed, offset, len);
            device
                .write(offset, Bytes::from(bytes.clone()), WriteFlags::default())
                .await
                .unwrap();
            model[offset as usize..(offset + len) as usize].copy_from_slice(&bytes);
        }
        Op::Read { at, len } => {
            let (offset, len) = place(size, at, len);
            let got = device.read(offset, len as usize).await.unwrap();
            let want = &model[offset as usize..(offset + len) as usize];
            assert!(got[..] == *want, "read [{offset}, +{len}) differs");
        }
        Op::Zero { at, len } | Op::Discard { at, len } => {
            let (offset, len) = place(size, at, len);
            if matches!(op, Op::Zero { .. }) {
                let flags = ZeroFlags::default();
                device.write_zeroes(offset, len, flags).await.unwrap();
            } else {
                device.discard(offset, len).await.unwrap();
            }
            model[offset as usize..(offset + len) as usize].fill(0);
        }
        Op::Status { at, len } => check_status(device, model, place(size, at, len)).await,
        Op::Flush => device.flush().await.unwrap(),
        Op::Grow { .. } => panic!("{op:?}: the caller grows the device"),
    }
}

/// Block status of `[offset, +len)` is contiguous from the start, describes at least one byte,
/// and never calls data a hole.
async fn check_status(device: &dyn BlockDevice, model: &[u8], (offset, len): (u64, u64)) {
    let extents = device.block_status(offset, len).await.unwrap();
    let mut pos = offset;
    for extent in &extents {
        assert_eq!(extent.offset, pos, "extents are contiguous from the start");
        pos += extent.len;
        let bytes = &model[extent.offset as usize..pos as usize];
        if extent.state.reads_zero() {
            assert!(bytes.iter().all(|&b| b == 0), "{extent:?} holds data");
        }
    }
    assert!(pos <= offset + len);
    assert!(len == 0 || pos > offset, "at least one byte is described");
}

/// What block status says of `[offset, +len)`: each extent's offset, length and state.
pub async fn status_shape(
    device: &dyn BlockDevice,
    offset: u64,
    len: u64,
) -> Vec<(u64, u64, ExtentState)> {
    let extents = device.block_status(offset, len).await.unwrap();
    extents.iter().map(|e| (e.offset, e.len, e.state)).collect()
}

/// The arguments that build layer `name` over one memory child `d0` of `child_size` bytes,
/// from `(key, value)` option pairs; paths in options resolve against `dir`.
pub fn one_child_args(
    name: &str,
    child_size: u64,
    options: &[(&str, OptionValue)],
    dir: &Path,
    runtime: Arc<dyn Runtime>,
) -> LayerArgs {
    let values: BTreeMap<String, OptionValue> = options
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    LayerArgs {
        name: name.into(),
        children: vec![Some(Arc::new(MemoryDevice::new(child_size)) as DeviceRef)],
        child_names: vec!["d0".into()],
        options: Options::new(values, dir.to_path_buf()),
        runtime,
        start: StartPolicy::FRESH,
    }
}
