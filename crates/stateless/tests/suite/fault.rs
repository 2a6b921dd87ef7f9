//! `fault`: listed ranges fail and change nothing, random errors follow the seed, a device
//! that disappears fails everything, and layers above report the errors, never wrong data.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::layer::OptionValue;
use strata_core::{
    BlockDevice, BlockError, Control, ControlReply, DeviceRef, Health, TokioRuntime, WriteFlags,
    ZeroFlags,
};
use strata_stateless::fault::{self, Fault, FaultConfig};

use crate::common;
use common::one_child_args;
use strata_stateless::stripe::Stripe;

fn is_eio(result: &strata_core::Result<impl std::fmt::Debug>) -> bool {
    match result {
        Err(error @ BlockError::Io { source, .. }) => {
            source.raw_os_error() == Some(5) && error.errno() == 5
        }
        _ => false,
    }
}

fn faulty(config: FaultConfig) -> (Arc<MemoryDevice>, Fault) {
    let child = Arc::new(MemoryDevice::new(16 << 20));
    let fault = Fault::new("f".into(), child.clone(), config).unwrap();
    (child, fault)
}

#[tokio::test]
async fn listed_ranges_fail_with_eio_and_change_nothing() {
    let (child, f) = faulty(FaultConfig {
        fail_read: vec![(1 << 20, 4096)],
        fail_write: vec![(0, 512)],
        ..FaultConfig::default()
    });
    let ones = Bytes::from(vec![1; 8192]);
    child
        .write(0, ones.clone(), WriteFlags::default())
        .await
        .unwrap();
    assert!(is_eio(
        &f.write(0, ones.clone(), WriteFlags::default()).await
    ));
    assert!(is_eio(
        &f.write(511, Bytes::from(vec![9; 2]), WriteFlags::default())
            .await
    ));
    assert!(is_eio(
        &f.write_zeroes(256, 4096, ZeroFlags::default()).await
    ));
    assert!(is_eio(&f.discard(0, 1 << 20).await));
    assert_eq!(
        child.read(0, 8192).await.unwrap()[..],
        ones[..],
        "refused writes changed data"
    );
    // Next to the range, everything works.
    f.write(512, Bytes::from(vec![2; 512]), WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(f.read(512, 512).await.unwrap()[..], [2; 512][..]);

    assert!(is_eio(&f.read((1 << 20) + 4095, 1).await));
    assert!(is_eio(&f.read((1 << 20) - 1, 2).await));
    assert!(f.read((1 << 20) - 512, 512).await.is_ok());
    assert!(f.read((1 << 20) + 4096, 512).await.is_ok());
    // Writes to a read-failing range are fine: the fault is in reading.
    assert!(f
        .write(1 << 20, Bytes::from(vec![3; 512]), WriteFlags::default())
        .await
        .is_ok());
    f.flush().await.unwrap();
}

#[tokio::test]
async fn random_errors_follow_the_rate_and_the_seed() {
    let outcomes = |seed| async move {
        let (_, f) = faulty(FaultConfig {
            error_rate: 0.25,
            seed,
            ..FaultConfig::default()
        });
        let mut failed = Vec::new();
        for i in 0..2000u64 {
            failed.push(f.read(i % 4096 * 512, 512).await.is_err());
        }
        failed
    };
    let first = outcomes(7).await;
    assert_eq!(
        first,
        outcomes(7).await,
        "the same seed fails the same operations"
    );
    assert_ne!(first, outcomes(8).await, "another seed, other failures");
    let count = first.iter().filter(|&&f| f).count();
    // Binomial(2000, 0.25): mean 500, sd ~19; ±100 is over 5 sd.
    assert!(
        (400..600).contains(&count),
        "{count} failures of 2000 at rate 0.25"
    );
}

#[tokio::test]
async fn fail_member_zero_makes_the_device_disappear() {
    let (_, f) = faulty(FaultConfig::default());
    f.write(0, Bytes::from(vec![1; 512]), WriteFlags::default())
        .await
        .unwrap();
    let wrong = f.control(Control::FailMember { index: 1 }).await;
    assert!(matches!(wrong, Err(BlockError::InvalidArgument(_))));
    assert!(!f.is_gone());
    let done = f.control(Control::FailMember { index: 0 }).await;
    assert!(matches!(done, Ok(ControlReply::Done)));
    assert!(is_eio(&f.read(0, 512).await));
    assert!(is_eio(
        &f.write(0, Bytes::from(vec![1; 512]), WriteFlags::default())
            .await
    ));
    assert!(is_eio(&f.flush().await));
    assert!(is_eio(&f.block_status(0, 512).await));
    assert!(is_eio(&f.write_zeroes(0, 512, ZeroFlags::default()).await));
    let Ok(ControlReply::Describe(node)) = f.control(Control::Describe).await else {
        panic!("describe");
    };
    assert_eq!(node.health, Health::Failed);
    assert_eq!(node.children.len(), 1);
}

#[tokio::test]
async fn a_stripe_over_a_faulty_member_reports_errors_not_wrong_data() {
    let members: Vec<Arc<Fault>> = (0..3)
        .map(|i| {
            let config = FaultConfig {
                error_rate: 0.05,
                seed: i,
                ..FaultConfig::default()
            };
            Arc::new(faulty(config).1)
        })
        .collect();
    let devices: Vec<DeviceRef> = members.iter().map(|m| m.clone() as DeviceRef).collect();
    let stripe = Stripe::new("s".into(), devices, vec![], 4096).unwrap();
    let mut model = vec![0u8; 1 << 20];
    let (mut errors, mut reads) = (0, 0);
    for i in 0..400u64 {
        let offset = (i * 7919 % 200) * 4096;
        let len = 4096 * (1 + i % 5) as usize;
        if i % 2 == 0 {
            let data = vec![(i % 251) as u8 + 1; len];
            let written = stripe
                .write(offset, Bytes::from(data.clone()), WriteFlags::default())
                .await;
            if written.is_ok() {
                model[offset as usize..offset as usize + len].copy_from_slice(&data);
            } else {
                // A failed write may have landed in part: re-establish a known state.
                errors += 1;
                let zero = Bytes::from(vec![0; len]);
                let mut tries = 0;
                while stripe
                    .write(offset, zero.clone(), WriteFlags::default())
                    .await
                    .is_err()
                {
                    tries += 1;
                    assert!(tries < 100, "a 5% error rate cannot fail 100 times running");
                }
                model[offset as usize..offset as usize + len].fill(0);
            }
        } else {
            match stripe.read(offset, len).await {
                Ok(got) => {
                    reads += 1;
                    assert!(got[..] == model[offset as usize..offset as usize + len]);
                }
                Err(error) => {
                    errors += 1;
                    assert_eq!(error.errno(), 5, "{error}");
                }
            }
        }
    }
    assert!(
        errors > 10 && reads > 100,
        "{errors} errors, {reads} good reads"
    );
}

#[tokio::test]
async fn options_build_the_layer_and_bad_ones_are_named() {
    let build = |options: Vec<(&str, OptionValue)>| {
        let args = one_child_args(
            "flaky",
            16 << 20,
            &options,
            Path::new(""),
            TokioRuntime::current(),
        );
        (fault::KIND.build)(args)
    };
    let text = |s: &str| OptionValue::Text(s.into());
    let device = build(vec![
        ("fail-read", text("1MiB+4KiB,8MiB+64KiB")),
        ("error-rate", OptionValue::Float(0.0)),
        ("seed", OptionValue::Integer(3)),
    ])
    .await
    .unwrap();
    assert!(is_eio(&device.read(8 << 20, 512).await));
    assert!(device.read(0, 512).await.is_ok());
    let Ok(ControlReply::Describe(node)) = device.control(Control::Describe).await else {
        panic!("describe");
    };
    assert!(format!("{:?}", node.detail).contains("1MiB+4KiB,8MiB+64KiB"));
    let error = build(vec![("fail-write", text("1MiB"))])
        .await
        .err()
        .unwrap();
    assert!(error.to_string().contains("`fail-write`"), "{error}");
    let error = build(vec![("error-rate", OptionValue::Float(1.5))])
        .await
        .err()
        .unwrap();
    assert!(error.to_string().contains("`error-rate`"), "{error}");
}
