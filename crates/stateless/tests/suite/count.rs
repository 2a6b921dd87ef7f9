//! `count`, the example filter of docs/layers/README.md: built through its registry entry as
//! the stack builds it, it counts every kind of request, shows the counts in its description
//! and leaves the data alone.

use std::path::Path;

use bytes::Bytes;
use strata_core::layer::OptionValue;
use strata_core::{
    BlockDevice, Control, ControlReply, DeviceRef, TokioRuntime, WriteFlags, ZeroFlags,
};
use strata_stateless::count;

use crate::common;
use common::one_child_args;

const SIZE: u64 = 1 << 20;

async fn counted(options: &[(&str, OptionValue)]) -> strata_core::Result<DeviceRef> {
    let args = one_child_args(
        "counted",
        SIZE,
        options,
        Path::new(""),
        TokioRuntime::current(),
    );
    (count::KIND.build)(args).await
}

async fn detail(device: &DeviceRef) -> Vec<(String, String)> {
    let ControlReply::Describe(node) = device.control(Control::Describe).await.unwrap() else {
        panic!("describe");
    };
    assert_eq!(node.kind, "count");
    assert_eq!(node.children.len(), 1, "the child is described below it");
    assert_eq!(
        node.config,
        Some(toml::Table::new()),
        "no options, all explicit"
    );
    node.detail
}

fn get(detail: &[(String, String)], what: &str) -> u64 {
    detail
        .iter()
        .find(|(k, _)| k == what)
        .unwrap_or_else(|| panic!("{what} not in {detail:?}"))
        .1
        .parse()
        .unwrap()
}

#[tokio::test]
async fn every_kind_of_request_is_counted_and_the_data_passes_unchanged() {
    let device = counted(&[]).await.unwrap();
    let data = Bytes::from((0..8192u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    device
        .write(4096, data.clone(), WriteFlags::default())
        .await
        .unwrap();
    device
        .write(65536, data.slice(..4096), WriteFlags { fua: true })
        .await
        .unwrap();
    assert_eq!(&device.read(4096, 8192).await.unwrap()[..], &data[..]);
    device.flush().await.unwrap();
    device.discard(65536, 4096).await.unwrap();
    device
        .write_zeroes(0, 4096, ZeroFlags::default())
        .await
        .unwrap();
    assert!(device.read(0, 4096).await.unwrap().iter().all(|&b| b == 0));

    let d = detail(&device).await;
    assert_eq!(get(&d, "reads"), 2);
    assert_eq!(get(&d, "writes"), 2);
    assert_eq!(get(&d, "flushes"), 1);
    assert_eq!(get(&d, "discards"), 1);
    assert_eq!(get(&d, "write-zeroes"), 1);
    assert_eq!(get(&d, "bytes read"), 8192 + 4096);
    assert_eq!(get(&d, "bytes written"), 8192 + 4096);
    assert_eq!(
        device.geometry().size,
        SIZE,
        "a filter keeps its child's size"
    );
}

#[tokio::test]
async fn a_request_past_the_end_is_refused_before_it_is_counted() {
    let device = counted(&[]).await.unwrap();
    let refused = device.read(SIZE, 4096).await;
    assert!(
        matches!(refused, Err(strata_core::BlockError::OutOfRange { .. })),
        "past the end: {refused:?}"
    );
    assert_eq!(
        get(&detail(&device).await, "reads"),
        0,
        "the Filter blanket impl checks the range before the filter sees the request"
    );
}

#[tokio::test]
async fn verbs_for_the_layers_below_go_to_the_child() {
    let device = counted(&[]).await.unwrap();
    // The memory disk below has no members: the refusal is the disk's, not `count`'s.
    let error = device
        .control(Control::FailMember { index: 0 })
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("memory device"), "{error}");
}

#[tokio::test]
async fn an_option_it_does_not_have_is_refused_by_name() {
    let Err(error) = counted(&[("limit", OptionValue::Integer(3))]).await else {
        panic!("an unknown option was accepted");
    };
    let error = error.to_string();
    assert!(error.contains("`limit`"), "{error}");
}

#[tokio::test]
async fn reset_counts_answers_the_counts_and_starts_them_again() {
    let device = counted(&[]).await.unwrap();
    device
        .write(0, Bytes::from(vec![1u8; 4096]), WriteFlags::default())
        .await
        .unwrap();
    device.read(0, 512).await.unwrap();
    let reset = Control::Call {
        verb: count::RESET_COUNTS.name.to_string(),
        args: toml::Table::new(),
    };
    let ControlReply::Table(before) = device.control(reset.clone()).await.unwrap() else {
        panic!("reset-counts answers a table");
    };
    assert_eq!(before["writes"].as_integer(), Some(1));
    assert_eq!(before["bytes written"].as_integer(), Some(4096));
    assert_eq!(before["reads"].as_integer(), Some(1));
    let after = detail(&device).await;
    assert_eq!(get(&after, "writes"), 0);
    assert_eq!(get(&after, "bytes read"), 0);
    // A verb it does not declare goes to the child, which refuses it.
    let other = Control::Call {
        verb: "snapshot-create".into(),
        args: toml::Table::new(),
    };
    assert!(device.control(other).await.is_err());
}
