//! `concat` against a byte-array model, over children of odd sizes: every read matches, every
//! child holds exactly its window of the model, block status never calls data a hole, and a
//! member added online grows the device.

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::{
    BlockDevice, BlockError, Control, ControlReply, DeviceRef, ExtentState, Member, WriteFlags,
};
use strata_crash::testkit::block_on;
use strata_crash::{sector_disk, CrashGroup};
use strata_stateless::concat::Concat;

use crate::common;
use common::{apply, data, request, status_shape, Op};

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        17 => request(20_000),
        1 => (512u64..30_000).prop_map(|size| Op::Grow { size }),
    ]
}

struct Harness {
    concat: Concat,
    children: Vec<Arc<MemoryDevice>>,
    model: Vec<u8>,
}

impl Harness {
    fn new(sizes: &[u64]) -> Harness {
        let children: Vec<Arc<MemoryDevice>> = sizes
            .iter()
            .map(|&s| Arc::new(MemoryDevice::new(s)))
            .collect();
        let members = children
            .iter()
            .enumerate()
            .map(|(i, c)| Member {
                name: format!("d{i}"),
                device: c.clone() as DeviceRef,
            })
            .collect();
        let concat = Concat::new("c".into(), members).unwrap();
        let size: u64 = sizes.iter().map(|s| s / 512 * 512).sum();
        assert_eq!(concat.geometry().size, size, "size = sum of rounded sizes");
        Harness {
            concat,
            children,
            model: vec![0; size as usize],
        }
    }

    async fn apply(&mut self, op: &Op) {
        match *op {
            Op::Grow { size } => self.grow(size).await,
            _ => apply(&self.concat, &mut self.model, op).await,
        }
    }

    async fn grow(&mut self, size: u64) {
        let child = Arc::new(MemoryDevice::new(size));
        let member = Member {
            name: format!("d{}", self.children.len()),
            device: child.clone() as DeviceRef,
        };
        let reply = self.concat.control(Control::AddMember(member)).await;
        assert!(matches!(reply, Ok(ControlReply::Done)), "{reply:?}");
        self.children.push(child);
        self.model
            .resize(self.model.len() + (size / 512 * 512) as usize, 0);
        assert_eq!(self.concat.geometry().size, self.model.len() as u64);
    }

    /// The layout itself: child i holds bytes [starts[i], starts[i + 1]) of the device.
    async fn check_children(&self) {
        let starts = self.concat.starts();
        for (i, child) in self.children.iter().enumerate() {
            let (start, end) = (starts[i], starts[i + 1]);
            let got = child.read(0, (end - start) as usize).await.unwrap();
            assert!(
                got[..] == self.model[start as usize..end as usize],
                "child {i} does not hold [{start}, {end})"
            );
        }
    }
}

fn run(sizes: Vec<u64>, ops: Vec<Op>) {
    block_on(async {
        let mut harness = Harness::new(&sizes);
        for op in &ops {
            harness.apply(op).await;
        }
        harness.check_children().await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn concat_matches_a_byte_array(
        sizes in prop::collection::vec(512u64..30_000, 1..5),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        run(sizes, ops);
    }
}

#[tokio::test]
async fn a_write_across_every_boundary_lands_on_each_child() {
    // Sizes 1000, 700, 5000 round down to 512, 512, 4608.
    let mut harness = Harness::new(&[1000, 700, 5000]);
    assert_eq!(harness.concat.starts(), vec![0, 512, 1024, 5632]);
    let write = Op::Write {
        at: 100.0 / 5632.0,
        len: 2000,
        seed: 9,
    };
    harness.apply(&write).await;
    harness.check_children().await;
    let child1 = harness.children[1].read(0, 512).await.unwrap();
    assert_eq!(child1[..], data(9, 100, 2000)[412..924]);
}

#[tokio::test]
async fn block_status_keeps_the_childrens_holes_in_place() {
    let harness = Harness::new(&[8192, 8192]);
    let c = &harness.concat;
    c.write(4096, Bytes::from(vec![1; 8192]), WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(
        status_shape(c, 0, 16384).await,
        vec![
            (0, 4096, ExtentState::Hole),
            (4096, 8192, ExtentState::Data),
            (12288, 4096, ExtentState::Hole),
        ]
    );
}

#[tokio::test]
async fn a_failing_child_fails_the_request_and_only_it() {
    let group = CrashGroup::new();
    let (d0, d1) = (group.disk(sector_disk(8192)), group.disk(sector_disk(8192)));
    let members = vec![
        Member {
            name: "d0".into(),
            device: Arc::new(d0.clone()),
        },
        Member {
            name: "d1".into(),
            device: Arc::new(d1.clone()),
        },
    ];
    let c = Concat::new("c".into(), members).unwrap();
    assert_eq!(c.geometry().min_io, 512);
    c.write(0, Bytes::from(vec![3; 16384]), WriteFlags::default())
        .await
        .unwrap();
    d1.fail_reads(0, 512);
    let error = c.read(7680, 1024).await.unwrap_err();
    assert!(matches!(error, BlockError::Io { .. }), "{error:?}");
    assert_eq!(error.errno(), 5);
    assert_eq!(c.read(0, 8192).await.unwrap()[..], [3; 8192][..]);
    d0.fail_writes(0, 8192);
    let error = c
        .write(4096, Bytes::from(vec![4; 512]), WriteFlags::default())
        .await
        .unwrap_err();
    assert_eq!(error.errno(), 5);
    d1.disappear();
    assert!(c.flush().await.is_err(), "a flush must reach every child");
}

#[tokio::test]
async fn members_that_cannot_take_the_alignment_are_refused() {
    let fine = MemoryDevice::new(8192);
    let tiny = MemoryDevice::new(100);
    let member = |name: &str, d: MemoryDevice| Member {
        name: name.into(),
        device: Arc::new(d),
    };
    let error = Concat::new("c".into(), vec![member("a", fine), member("b", tiny)])
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("member b") && error.contains("512"),
        "{error}"
    );
    let c = Concat::new("c".into(), vec![member("a", MemoryDevice::new(8192))]).unwrap();
    let big_sector = strata_core::Geometry {
        min_io: 4096,
        ..strata_core::Geometry::byte_addressable(1 << 20)
    };
    let strict = member("s", MemoryDevice::with_geometry(big_sector));
    let error = c.control(Control::AddMember(strict)).await.unwrap_err();
    assert!(error.to_string().contains("4096-byte alignment"), "{error}");
    assert_eq!(c.geometry().size, 8192, "a refused member changes nothing");
}
