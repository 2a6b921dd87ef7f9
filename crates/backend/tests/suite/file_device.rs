//! FileDevice behaviour that a model cannot see: files on disk, sizes, modes, holes.

use crate::common;

use std::os::unix::fs::MetadataExt;

use bytes::Bytes;
use strata_backend::FileOptions;
use strata_core::{
    BlockDevice, BlockError, Control, ControlReply, Extent, ExtentState, Health, WriteFlags,
    ZeroFlags,
};

use common::{create, open, open_direct, pattern, read};

const MIB: u64 = 1 << 20;

fn hole(offset: u64, len: u64) -> Extent {
    Extent {
        offset,
        len,
        state: ExtentState::Hole,
    }
}

fn data(offset: u64, len: u64) -> Extent {
    Extent {
        offset,
        len,
        state: ExtentState::Data,
    }
}

async fn write(dev: &dyn BlockDevice, offset: u64, bytes: Vec<u8>) {
    dev.write(offset, Bytes::from(bytes), WriteFlags::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn creates_a_sparse_file_of_the_asked_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d0.img");
    let dev = create(&path, MIB);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), MIB);
    assert_eq!(meta.blocks(), 0, "a new image must not allocate space");
    assert_eq!(dev.geometry().size, MIB);
    assert_eq!(dev.geometry().min_io, 1);
    assert!(read(&dev, 0, MIB as usize)
        .await
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    assert_eq!(dev.block_status(0, MIB).await.unwrap(), vec![hole(0, MIB)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn reopening_keeps_data_and_size_and_only_ever_grows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d0.img");
    let bytes = pattern(1, 5000, 10_000);
    {
        let dev = create(&path, MIB);
        write(&dev, 5000, bytes.clone()).await;
        dev.flush().await.unwrap();
    }

    // No size: take the file as it is.
    let dev = open(FileOptions::new(&path)).unwrap();
    assert_eq!(dev.geometry().size, MIB);
    assert_eq!(read(&dev, 5000, 10_000).await.unwrap(), bytes);
    drop(dev);

    // Larger: grow sparse, keep the data.
    let dev = create(&path, 2 * MIB);
    assert_eq!(dev.geometry().size, 2 * MIB);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * MIB);
    assert_eq!(read(&dev, 5000, 10_000).await.unwrap(), bytes);
    assert_eq!(
        dev.block_status(MIB, MIB).await.unwrap(),
        vec![hole(MIB, MIB)]
    );
    drop(dev);

    // Smaller: never truncate.
    let dev = create(&path, MIB / 2);
    assert_eq!(dev.geometry().size, 2 * MIB);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * MIB);
    assert_eq!(read(&dev, 5000, 10_000).await.unwrap(), bytes);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_file_needs_a_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.img");
    match open(FileOptions::new(&path)) {
        Err(BlockError::Io { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
        }
        other => panic!("expected NotFound, got {:?}", other.map(|_| ())),
    }
    assert!(!path.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn only_regular_files_and_block_devices_are_backings() {
    let dir = tempfile::tempdir().unwrap();
    let options = FileOptions {
        read_only: true,
        ..FileOptions::new(dir.path())
    };
    let result = open(options);
    assert!(
        matches!(result, Err(BlockError::InvalidArgument(_))),
        "{:?}",
        result.map(|_| ())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn read_only_refuses_changes_with_eperm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d0.img");
    let bytes = pattern(2, 0, 64 * 1024);
    {
        let dev = create(&path, MIB);
        write(&dev, 0, bytes.clone()).await;
        dev.flush().await.unwrap();
    }
    let before = std::fs::read(&path).unwrap();

    let dev = open(FileOptions {
        read_only: true,
        ..FileOptions::new(&path)
    })
    .unwrap();
    assert!(dev.capabilities().read_only);
    let attempts = [
        dev.write(0, Bytes::from(vec![0; 512]), WriteFlags::default())
            .await,
        dev.discard(0, 4096).await,
        dev.write_durable(vec![(0, Bytes::from(vec![0; 512]))])
            .await,
        dev.write_zeroes(
            0,
            4096,
            ZeroFlags {
                may_trim: true,
                ..ZeroFlags::default()
            },
        )
        .await,
    ];
    for attempt in attempts {
        let err = attempt.expect_err("a read-only device must refuse changes");
        assert!(matches!(err, BlockError::ReadOnly), "{err:?}");
        assert_eq!(err.errno(), strata_core::errno::EPERM);
    }
    dev.flush().await.unwrap();
    assert_eq!(read(&dev, 0, bytes.len()).await.unwrap(), bytes);
    assert_eq!(std::fs::read(&path).unwrap(), before);

    // Read-only cannot grow a file to a requested size.
    let grow = open(FileOptions {
        read_only: true,
        size: Some(2 * MIB),
        ..FileOptions::new(&path)
    });
    assert!(
        matches!(grow, Err(BlockError::InvalidArgument(_))),
        "{:?}",
        grow.map(|_| ())
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), MIB);
}

#[tokio::test(flavor = "multi_thread")]
async fn discard_punches_real_holes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d0.img");
    let dev = create(&path, 4 * MIB);
    write(&dev, 0, pattern(3, 0, 4 * MIB as usize)).await;
    dev.flush().await.unwrap();
    let blocks_before = std::fs::metadata(&path).unwrap().blocks();
    assert!(
        blocks_before >= 4 * MIB / 512,
        "written data must be allocated"
    );

    dev.discard(MIB, 2 * MIB).await.unwrap();
    dev.flush().await.unwrap();
    let blocks_after = std::fs::metadata(&path).unwrap().blocks();
    // st_blocks counts 512-byte units.
    assert!(
        blocks_after <= blocks_before - 2 * MIB / 512,
        "discard freed too little: {blocks_before} -> {blocks_after} blocks"
    );
    assert!(read(&dev, MIB, 2 * MIB as usize)
        .await
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    assert_eq!(read(&dev, 0, 4096).await.unwrap(), pattern(3, 0, 4096));
    assert_eq!(
        read(&dev, 3 * MIB, 4096).await.unwrap(),
        pattern(3, 3 * MIB, 4096)
    );
    assert_eq!(
        dev.block_status(0, 4 * MIB).await.unwrap(),
        vec![data(0, MIB), hole(MIB, 2 * MIB), data(3 * MIB, MIB)]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn write_zeroes_zeroes_unaligned_ranges_in_every_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d0.img");
    let dev = create(&path, MIB);
    let all = pattern(4, 0, MIB as usize);
    let mut model = all.clone();
    write(&dev, 0, all).await;

    let ranges = [
        (1000u64, 10_000u64),
        (100_000, 3 * 4096),
        (300_001, 77_777),
        (600_000, 1),
    ];
    let modes = [(false, false), (true, false), (false, true), (true, true)];
    for (&(offset, len), (may_trim, fast)) in ranges.iter().zip(modes) {
        let flags = ZeroFlags {
            may_trim,
            fast,
            fua: may_trim,
        };
        let range = offset as usize..(offset + len) as usize;
        match dev.write_zeroes(offset, len, flags).await {
            Ok(()) => model[range].fill(0),
            // Only a fast request may be refused, and then nothing may change.
            Err(BlockError::Unsupported(_)) if fast => {}
            Err(e) => panic!("write_zeroes {offset}+{len} {flags:?}: {e}"),
        }
        assert_eq!(
            read(&dev, 0, MIB as usize).await.unwrap(),
            model,
            "after {flags:?}"
        );
    }
    // Another opener of the same file sees the same bytes.
    assert_eq!(std::fs::read(&path).unwrap(), model);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_fail_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d0.img");
    let dev = create(&path, 64 * 1024);
    write(&dev, 0, pattern(5, 0, 64 * 1024)).await;
    let before = std::fs::read(&path).unwrap();

    let out_of_range = [
        dev.write(60_000, Bytes::from(vec![0; 6000]), WriteFlags { fua: true })
            .await,
        dev.discard(0, 64 * 1024 + 1).await,
        dev.write_zeroes(u64::MAX - 10, 20, ZeroFlags::default())
            .await,
        dev.read(64 * 1024, 1).await.map(|_| ()),
        dev.block_status(64 * 1024 - 1, 2).await.map(|_| ()),
    ];
    for result in out_of_range {
        assert!(
            matches!(result, Err(BlockError::OutOfRange { .. })),
            "{result:?}"
        );
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 * 1024);
    drop(dev);

    let Some(dev) = open_direct(&path, 64 * 1024) else {
        return;
    };
    let min_io = u64::from(dev.geometry().min_io);
    let misaligned = [
        dev.write(
            1,
            Bytes::from(vec![0; min_io as usize]),
            WriteFlags::default(),
        )
        .await,
        dev.write(0, Bytes::from(vec![0; 100]), WriteFlags::default())
            .await,
        dev.discard(min_io / 2, min_io).await,
        dev.write_zeroes(0, min_io + 1, ZeroFlags::default()).await,
        dev.read(3, min_io as usize).await.map(|_| ()),
    ];
    for result in misaligned {
        assert!(
            matches!(result, Err(BlockError::InvalidArgument(_))),
            "{result:?}"
        );
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[tokio::test(flavor = "multi_thread")]
async fn direct_io_round_trips_aligned_requests_of_any_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d0.img");
    let Some(dev) = open_direct(&path, 8 * MIB) else {
        return;
    };
    let geometry = dev.geometry();
    assert!(
        geometry.min_io > 1 && geometry.min_io.is_power_of_two(),
        "{geometry:?}"
    );
    assert_eq!(geometry.size, 8 * MIB);

    // Larger than one bounce chunk, and not a whole number of them.
    let offset = 4096;
    let big = pattern(6, offset, 3 * MIB as usize + 8192);
    dev.write(offset, Bytes::from(big.clone()), WriteFlags { fua: true })
        .await
        .unwrap();
    assert_eq!(read(&dev, offset, big.len()).await.unwrap(), big);
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(
        &on_disk[offset as usize..offset as usize + big.len()],
        &big[..]
    );

    let flags = ZeroFlags::default();
    dev.write_zeroes(MIB, MIB, flags).await.unwrap();
    assert!(read(&dev, MIB, MIB as usize)
        .await
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    assert_eq!(
        read(&dev, 2 * MIB, 4096).await.unwrap(),
        pattern(6, 2 * MIB, 4096)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn direct_io_exports_only_whole_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.img");
    std::fs::write(&path, vec![7u8; 10_000]).unwrap();
    let Some(dev) = open_direct(&path, 10_000) else {
        return;
    };
    let min_io = u64::from(dev.geometry().min_io);
    assert_eq!(dev.geometry().size, 10_000 - 10_000 % min_io);
    assert!(dev.geometry().size < 10_000);
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        10_000,
        "the file is not truncated"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn describe_reports_kind_path_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d0.img");
    drop(create(&path, MIB));
    let dev = open(FileOptions {
        read_only: true,
        ..FileOptions::new(&path)
    })
    .unwrap();
    let reply = dev.control(Control::Describe).await.unwrap();
    let ControlReply::Describe(node) = reply else {
        panic!("expected a description, got {reply:?}");
    };
    assert_eq!(node.kind, "file");
    assert_eq!(node.size, MIB);
    assert_eq!(node.health, Health::ReadOnly);
    let detail = |key: &str| {
        node.detail
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(detail("path"), Some(path.display().to_string()));
    assert_eq!(detail("direct"), Some("false".to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn durable_writes_land_together_and_a_bad_one_refuses_them_all() {
    let dir = tempfile::tempdir().unwrap();
    for direct in [false, true] {
        let path = dir.path().join(format!("durable-{direct}.img"));
        let dev = if direct {
            let Some(dev) = open_direct(&path, MIB) else {
                continue;
            };
            dev
        } else {
            create(&path, MIB)
        };
        let (first, second) = (pattern(3, 0, 4096), pattern(4, 0, 8192));
        dev.write_durable(vec![
            (8192, Bytes::from(first.clone())),
            (MIB - 8192, Bytes::from(second.clone())),
        ])
        .await
        .unwrap();
        // Written through the file, not only cached in the device.
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[8192..12288], &first[..], "direct: {direct}");
        assert_eq!(
            &on_disk[(MIB - 8192) as usize..],
            &second[..],
            "direct: {direct}"
        );
        let refused = dev
            .write_durable(vec![
                (0, Bytes::from(vec![9; 4096])),
                (MIB, Bytes::from(vec![9; 4096])),
            ])
            .await;
        assert!(
            matches!(refused, Err(BlockError::OutOfRange { .. })),
            "{refused:?}"
        );
        assert!(read(&dev, 0, 4096).await.unwrap().iter().all(|&b| b == 0));
    }
}
