//! Each NBD connection to a shared volume has its own stream of intervals
//! (`Control::Connection`): its flush commits its writes and only its writes, its reads see
//! its own writes before they are committed and no other connection's, and writes a
//! connection leaves unflushed are committed when it ends.

use std::time::{Duration, Instant};

use strata_core::{BlockDevice, Control, ControlReply, DeviceRef, WriteFlags};

use crate::shared::*;

fn zeros() -> bytes::Bytes {
    bytes::Bytes::from(vec![0u8; 512])
}

async fn connection(volume: &strata_brick::SharedVolume) -> DeviceRef {
    match volume.control(Control::Connection).await.unwrap() {
        ControlReply::Device(view) => view,
        _ => panic!("a shared volume gives each connection a view"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_commits_its_own_connections_writes_and_no_others() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    let (one, two) = (connection(&a).await, connection(&a).await);
    one.write(0, sector("one"), WriteFlags::default())
        .await
        .unwrap();
    two.write(UNIT, sector("two"), WriteFlags::default())
        .await
        .unwrap();
    two.flush().await.unwrap();
    // Only the second connection's write is on the bricks.
    assert_replicas(&cluster, UNIT, &sector("two")).await;
    assert_replicas(&cluster, 0, &zeros()).await;
    // Each reads its own pending write, and not the other's.
    assert_eq!(one.read(0, 512).await.unwrap(), sector("one"));
    assert_eq!(two.read(0, 512).await.unwrap(), zeros());
    assert_eq!(one.read(UNIT, 512).await.unwrap(), sector("two"));
    // The volume's own callers are a stream of their own too.
    assert_eq!(a.read(0, 512).await.unwrap(), zeros());
    one.flush().await.unwrap();
    assert_replicas(&cluster, 0, &sector("one")).await;
    assert_eq!(a.read(0, 512).await.unwrap(), sector("one"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_ends_unflushed_has_its_writes_committed() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    let gone = connection(&a).await;
    gone.write(2 * UNIT, sector("left"), WriteFlags::default())
        .await
        .unwrap();
    drop(gone);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held = cluster.clients[0].read(2 * UNIT, 512).await.unwrap();
        if held == sector("left") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the unflushed write never landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_replicas(&cluster, 2 * UNIT, &sector("left")).await;
}
