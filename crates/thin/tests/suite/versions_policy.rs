//! Versions policies of a thin pool, driven with a clock of the test's own: periodic snapshots
//! due by time and by writes, keep-K deleting only the policy's snapshots (never a manual or a
//! protected one), protection refusing a delete, the policy across a restart, and the space
//! reserve refusing snapshots or deleting the oldest unprotected ones. One test runs the
//! background runner itself, on a short interval.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_core::{BlockDevice, DeviceRef, WriteFlags};
use strata_crash::testkit::block_on;
use strata_crash::{sector_disk, CrashGroup};
use strata_thin::{check_state, PoolRuntime, ReservePolicy, Schedule, ThinPool, ThinVolume};

use crate::common;
use common::{pool_options, settings};

const EXTENT: u64 = 64 << 10;
const META: u64 = 1 << 20;
const EXTENTS: u64 = 20;
const MIN: u64 = 60_000;
/// 2026-11-25 18:00:00 UTC: the test's clock starts here.
const T0: u64 = 1_795_629_600_000;

async fn pool_with(configure: impl FnOnce(&mut PoolRuntime)) -> (DeviceRef, Arc<ThinPool>) {
    let disk = CrashGroup::new().disk(sector_disk(META + EXTENTS * EXTENT));
    let child: DeviceRef = Arc::new(disk);
    let mut settings = settings();
    configure(&mut settings);
    let pool = ThinPool::format("pool", child.clone(), &pool_options(EXTENT, META), settings)
        .await
        .unwrap();
    assert_eq!(pool.extents(), EXTENTS);
    (child, pool)
}

async fn reserve_pool(reserve: &str, when_low: &str) -> (DeviceRef, Arc<ThinPool>) {
    let policy = ReservePolicy::parse(Some(reserve), Some(when_low)).unwrap();
    pool_with(|settings| settings.snapshot_reserve = policy).await
}

/// Writes extent `index` of `volume` whole with `fill`.
async fn fill_extent(volume: &ThinVolume, index: u64, fill: u8) {
    let data = Bytes::from(vec![fill; EXTENT as usize]);
    volume
        .write(index * EXTENT, data, WriteFlags::default())
        .await
        .unwrap();
}

async fn write_block(volume: &ThinVolume, fill: u8) {
    let data = Bytes::from(vec![fill; 4096]);
    volume.write(0, data, WriteFlags::default()).await.unwrap();
}

fn names(pool: &ThinPool, volume: &str) -> Vec<String> {
    pool.snapshots(Some(volume))
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect()
}

fn detail(node: &strata_core::NodeStatus, key: &str) -> String {
    node.detail
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no {key:?} in {:?}", node.detail))
}

fn every(period: &str, keep: Option<&str>) -> Schedule {
    Schedule::parse(Some(period), None, keep).unwrap()
}

fn every_writes(writes: &str, keep: Option<&str>) -> Schedule {
    Schedule::parse(None, Some(writes), keep).unwrap()
}

fn assert_consistent(pool: &ThinPool) {
    let problems = pool.store().read(check_state);
    assert!(problems.is_empty(), "check_state: {problems:?}");
}

#[test]
fn a_period_makes_a_snapshot_due_and_the_next_one_counts_from_it() {
    block_on(async {
        let (_, pool) = pool_with(|_| {}).await;
        let volume = pool.create_volume("v", 4 * EXTENT).await.unwrap();
        write_block(&volume, 1).await;
        let status = pool
            .set_snapshot_policy("v", Some(every("10m", None)), T0)
            .await
            .unwrap();
        assert_eq!(status.policy.as_deref(), Some("every 10m, keep all"));
        assert_eq!(status.next_due_ms, Some(T0 + 10 * MIN));

        assert_eq!(pool.policy_tick(T0 + 10 * MIN - 1).await.taken, vec![]);
        let report = pool.policy_tick(T0 + 10 * MIN).await;
        let expected = ("v".to_string(), "auto-20261125-181000".to_string());
        assert_eq!(report.taken, vec![expected.clone()]);
        // It holds what the volume held, and is timed by the clock the tick was given.
        write_block(&volume, 2).await;
        let snapshot = pool.snapshot_device("v", &expected.1).unwrap();
        assert_eq!(snapshot.read(0, 4096).await.unwrap()[..], [1u8; 4096][..]);
        let listed = pool.snapshots(Some("v")).unwrap();
        assert_eq!(listed[0].created_ms, T0 + 10 * MIN);

        // The next period counts from that snapshot.
        let status = pool.snapshot_policy("v").unwrap();
        assert_eq!(status.next_due_ms, Some(T0 + 20 * MIN));
        assert_eq!(status.last_auto.as_deref(), Some("auto-20261125-181000"));
        assert_eq!(status.policy_snapshots, vec![expected.1.clone()]);
        assert_eq!(pool.policy_tick(T0 + 15 * MIN).await.taken, vec![]);
        assert_eq!(pool.policy_tick(T0 + 20 * MIN).await.taken.len(), 1);

        // Status shows the policy on the volume and what the policies did on the pool.
        let node = pool.describe().await.unwrap();
        let v = node.children.iter().find(|c| c.name == "v").unwrap();
        assert_eq!(detail(v, "snapshot policy"), "every 10m, keep all");
        assert_eq!(
            detail(v, "next automatic snapshot"),
            "2026-11-25 18:30:00 UTC"
        );
        assert_eq!(
            detail(v, "last automatic snapshot"),
            "auto-20261125-182000 at 2026-11-25 18:20:00 UTC"
        );
        assert_eq!(detail(&node, "automatic snapshots taken"), "2");
        assert!(
            detail(&node, "last versions action").contains("took v@auto-20261125-182000"),
            "{:?}",
            node.detail
        );
        assert_consistent(&pool);
    });
}

#[test]
fn writes_make_a_snapshot_due_and_two_in_one_second_get_distinct_names() {
    block_on(async {
        let (_, pool) = pool_with(|_| {}).await;
        let volume = pool.create_volume("v", 4 * EXTENT).await.unwrap();
        let other = pool.create_volume("w", 4 * EXTENT).await.unwrap();
        pool.set_snapshot_policy("v", Some(every_writes("3", None)), T0)
            .await
            .unwrap();
        write_block(&volume, 1).await;
        volume.discard(EXTENT, EXTENT).await.unwrap();
        // Writes to another volume do not count for this one.
        for _ in 0..5 {
            write_block(&other, 9).await;
        }
        assert_eq!(pool.snapshot_policy("v").unwrap().writes_since, 2);
        assert!(pool.policy_tick(T0).await.taken.is_empty());
        // The third request (a zeroing, counted once whatever its length) makes it due.
        volume
            .write_zeroes(0, 3 * EXTENT, strata_core::ZeroFlags::default())
            .await
            .unwrap();
        let report = pool.policy_tick(T0).await;
        assert_eq!(
            report.taken,
            vec![("v".to_string(), "auto-20261125-180000".to_string())]
        );
        assert_eq!(pool.snapshot_policy("v").unwrap().writes_since, 0);
        assert!(pool.policy_tick(T0).await.taken.is_empty());
        for fill in 1..=3 {
            write_block(&volume, fill).await;
        }
        // Same second: a distinct name.
        let report = pool.policy_tick(T0 + 400).await;
        assert_eq!(
            report.taken,
            vec![("v".to_string(), "auto-20261125-180000-2".to_string())]
        );
        assert_eq!(names(&pool, "v").len(), 2);
        assert!(names(&pool, "w").is_empty(), "w has no policy");
        assert_consistent(&pool);
    });
}

#[test]
fn keep_k_deletes_only_the_policys_oldest_unprotected_snapshots() {
    block_on(async {
        let (_, pool) = pool_with(|_| {}).await;
        let volume = pool.create_volume("v", 4 * EXTENT).await.unwrap();
        pool.set_snapshot_policy("v", Some(every("1m", Some("2"))), T0)
            .await
            .unwrap();
        pool.create_snapshot("v", Some("manual-first"))
            .await
            .unwrap();
        let mut auto = Vec::new();
        for step in 1..=5u64 {
            write_block(&volume, step as u8).await;
            let report = pool.policy_tick(T0 + step * MIN).await;
            assert_eq!(report.taken.len(), 1, "step {step}: {report:?}");
            auto.push(report.taken[0].1.clone());
            if step == 1 {
                // The first automatic one is protected: keep-K passes it by.
                pool.protect_snapshot("v", &auto[0], true).await.unwrap();
            }
            if step == 3 {
                pool.create_snapshot("v", Some("manual-middle"))
                    .await
                    .unwrap();
            }
            if step >= 4 {
                assert_eq!(
                    report.kept_deleted,
                    vec![("v".to_string(), auto[step as usize - 3].clone())],
                    "step {step}"
                );
            }
        }
        let mut left = names(&pool, "v");
        left.sort();
        let mut expected = vec![
            "manual-first".to_string(),
            "manual-middle".to_string(),
            auto[0].clone(),
            auto[3].clone(),
            auto[4].clone(),
        ];
        expected.sort();
        assert_eq!(left, expected);
        let status = pool.snapshot_policy("v").unwrap();
        assert_eq!(status.protected, vec![auto[0].clone()]);
        assert_eq!(
            status.policy_snapshots,
            vec![auto[0].clone(), auto[3].clone(), auto[4].clone()]
        );
        let node = pool.describe().await.unwrap();
        assert_eq!(detail(&node, "automatic snapshots deleted (keep)"), "2");
        // Each remaining snapshot still reads what the volume held when it was taken.
        let newest = pool.snapshot_device("v", &auto[4]).unwrap();
        assert_eq!(newest.read(0, 4096).await.unwrap()[..], [5u8; 4096][..]);
        let protected = pool.snapshot_device("v", &auto[0]).unwrap();
        assert_eq!(protected.read(0, 4096).await.unwrap()[..], [1u8; 4096][..]);
        assert_consistent(&pool);
    });
}

#[test]
fn a_protected_snapshot_is_not_deleted_until_unprotected() {
    block_on(async {
        let (_, pool) = pool_with(|_| {}).await;
        let volume = pool.create_volume("v", 4 * EXTENT).await.unwrap();
        write_block(&volume, 1).await;
        pool.create_snapshot("v", Some("keep-me")).await.unwrap();
        pool.protect_snapshot("v", "keep-me", true).await.unwrap();
        let refused = pool.delete_snapshot("v", "keep-me").await.unwrap_err();
        assert!(
            refused.to_string().contains("v@keep-me is protected"),
            "{refused}"
        );
        assert_eq!(names(&pool, "v"), vec!["keep-me"]);
        let missing = pool.protect_snapshot("v", "nope", true).await.unwrap_err();
        assert!(
            missing.to_string().contains("no snapshot named \"nope\""),
            "{missing}"
        );
        let node = pool.describe().await.unwrap();
        let v = node.children.iter().find(|c| c.name == "v").unwrap();
        assert_eq!(detail(v, "protected snapshots"), "keep-me");
        pool.protect_snapshot("v", "keep-me", false).await.unwrap();
        pool.delete_snapshot("v", "keep-me").await.unwrap();
        assert!(names(&pool, "v").is_empty());
        // A record that says nothing any more is gone, not left empty.
        assert!(pool
            .store()
            .read(|state| state.id("versions-policy.1"))
            .is_none());
        assert_consistent(&pool);
    });
}

#[test]
fn the_policy_and_protections_survive_a_restart_and_the_write_count_restarts() {
    block_on(async {
        let (child, pool) = pool_with(|_| {}).await;
        let volume = pool.create_volume("v", 4 * EXTENT).await.unwrap();
        let schedule = Schedule::parse(Some("2h"), Some("5"), Some("1")).unwrap();
        pool.set_snapshot_policy("v", Some(schedule), T0)
            .await
            .unwrap();
        for fill in 1..=5 {
            write_block(&volume, fill).await;
        }
        let first = pool.policy_tick(T0 + MIN).await.taken[0].1.clone();
        pool.protect_snapshot("v", &first, true).await.unwrap();
        write_block(&volume, 6).await;
        let before = pool.snapshot_policy("v").unwrap();
        assert_eq!(before.writes_since, 1);
        drop(volume);
        drop(pool);

        let pool = ThinPool::open("pool", child.clone(), settings())
            .await
            .unwrap()
            .0;
        let after = pool.snapshot_policy("v").unwrap();
        assert_eq!(
            after.policy.as_deref(),
            Some("every 2h or every 5 writes, keep 1")
        );
        assert_eq!(
            after.next_due_ms, before.next_due_ms,
            "the anchor is on disk"
        );
        assert_eq!(after.next_due_ms, Some(T0 + MIN + 120 * MIN));
        assert_eq!(after.protected, vec![first.clone()]);
        assert_eq!(after.policy_snapshots, vec![first.clone()]);
        assert_eq!(after.writes_since, 0, "write counts live in memory");
        // Due by time after the restart; keep 1 keeps the new one and the protected old one.
        let report = pool.policy_tick(T0 + 121 * MIN).await;
        assert_eq!(report.taken.len(), 1);
        assert!(report.kept_deleted.is_empty(), "{report:?}");
        assert_eq!(names(&pool, "v").len(), 2);
        pool.protect_snapshot("v", &first, false).await.unwrap();
        let report = pool.policy_tick(T0 + 122 * MIN).await;
        assert_eq!(report.kept_deleted, vec![("v".to_string(), first)]);
        // `off` stops the schedule; the snapshot it made stays.
        let off = pool
            .set_snapshot_policy("v", None, T0 + 123 * MIN)
            .await
            .unwrap();
        assert_eq!(off.policy, None);
        assert!(pool.policy_tick(T0 + 1000 * MIN).await.taken.is_empty());
        assert_eq!(names(&pool, "v").len(), 1);
        assert_consistent(&pool);
    });
}

#[test]
fn deleting_a_volume_deletes_its_policy() {
    block_on(async {
        let (_, pool) = pool_with(|_| {}).await;
        pool.create_volume("v", 4 * EXTENT).await.unwrap();
        pool.set_snapshot_policy("v", Some(every("1m", None)), T0)
            .await
            .unwrap();
        assert!(pool.store().read(|s| s.id("versions-policy.1")).is_some());
        pool.delete_volume("v").await.unwrap();
        assert!(pool.store().read(|s| s.id("versions-policy.1")).is_none());
        assert!(pool.policy_tick(T0 + 10 * MIN).await.taken.is_empty());
        assert_consistent(&pool);
    });
}

#[test]
fn below_the_reserve_refuse_refuses_every_new_snapshot_with_the_numbers() {
    block_on(async {
        // 20 extents, a reserve of 25 %: 5 extents (320 KiB) kept free.
        let (_, pool) = reserve_pool("25%", "refuse").await;
        let volume = pool.create_volume("v", 12 * EXTENT).await.unwrap();
        // A volume without versions, whose discards free extents at once.
        let scratch = pool.create_volume("w", 4 * EXTENT).await.unwrap();
        for index in 0..12 {
            fill_extent(&volume, index, 1).await;
        }
        for index in 0..3 {
            fill_extent(&scratch, index, 1).await;
        }
        pool.create_snapshot("v", Some("at-the-reserve"))
            .await
            .unwrap();
        fill_extent(&scratch, 3, 1).await;
        let refused = pool.create_snapshot("v", Some("below")).await.unwrap_err();
        let said = refused.to_string();
        for part in [
            "snapshot of pool/v refused",
            "free space 256KiB (4 extents)",
            "snapshot reserve 320KiB (5 extents; snapshot-reserve = \"25%\"",
            "when-reserve-low = \"refuse\"",
        ] {
            assert!(said.contains(part), "{part:?} in {said}");
        }
        assert_eq!(
            names(&pool, "v"),
            vec!["at-the-reserve"],
            "nothing is deleted"
        );
        // A periodic one is refused too, and counts as this period's: not retried at once.
        pool.set_snapshot_policy("v", Some(every("1m", None)), T0)
            .await
            .unwrap();
        let report = pool.policy_tick(T0 + MIN).await;
        assert!(report.taken.is_empty());
        assert_eq!(report.refused.len(), 1, "{report:?}");
        assert!(
            report.refused[0].1.contains("snapshot reserve"),
            "{report:?}"
        );
        assert_eq!(
            pool.snapshot_policy("v").unwrap().next_due_ms,
            Some(T0 + 2 * MIN)
        );
        assert!(pool.policy_tick(T0 + MIN + 1).await.refused.is_empty());
        let node = pool.describe().await.unwrap();
        assert_eq!(detail(&node, "snapshots refused for the reserve"), "2");
        assert_eq!(
            detail(&node, "snapshot reserve"),
            "25% (320KiB in 5 extents; free 256KiB, BELOW)"
        );
        assert_eq!(detail(&node, "when reserve low"), "refuse");
        assert!(detail(&node, "last versions action").contains("refused a snapshot of v"));
        // Freeing space lifts the refusal.
        scratch.discard(2 * EXTENT, 2 * EXTENT).await.unwrap();
        pool.flush().await.unwrap();
        pool.create_snapshot("v", Some("room-again")).await.unwrap();
        assert_consistent(&pool);
    });
}

#[test]
fn below_the_reserve_delete_oldest_deletes_unprotected_snapshots_oldest_first() {
    block_on(async {
        // 20 extents, a reserve of 20 %: 4 extents kept free. Volume of 8 extents.
        let (_, pool) = reserve_pool("20%", "delete-oldest").await;
        let volume = pool.create_volume("v", 8 * EXTENT).await.unwrap();
        for index in 0..8 {
            fill_extent(&volume, index, 1).await;
        }
        // s1 (protected), s2 and s3, each owning two extents (0 and 1 rewritten after it).
        for (at, name) in ["s1", "s2", "s3"].into_iter().enumerate() {
            pool.create_snapshot("v", Some(name)).await.unwrap();
            fill_extent(&volume, 0, 10 + at as u8).await;
            fill_extent(&volume, 1, 10 + at as u8).await;
        }
        pool.protect_snapshot("v", "s1", true).await.unwrap();
        assert_eq!(pool.allocated_extents(), 14);
        assert!(
            pool.enforce_reserve().await.unwrap().is_empty(),
            "6 free: above"
        );
        fill_extent(&volume, 2, 2).await;
        fill_extent(&volume, 3, 2).await;
        assert!(
            pool.enforce_reserve().await.unwrap().is_empty(),
            "4 free: at it"
        );
        fill_extent(&volume, 4, 2).await;
        // 3 free: the oldest unprotected (s2) goes, which frees 2: back above.
        assert_eq!(
            pool.enforce_reserve().await.unwrap(),
            vec![("v".to_string(), "s2".to_string())]
        );
        assert_eq!(pool.extents() - pool.allocated_extents(), 5);
        let mut left = names(&pool, "v");
        left.sort();
        assert_eq!(left, vec!["s1", "s3"]);

        // At creation: below again, s3 goes and the new snapshot is taken.
        fill_extent(&volume, 5, 2).await;
        fill_extent(&volume, 6, 2).await;
        pool.create_snapshot("v", Some("s4")).await.unwrap();
        let mut left = names(&pool, "v");
        left.sort();
        assert_eq!(left, vec!["s1", "s4"]);
        // The protected snapshot and the volume read as they should.
        let s1 = pool.snapshot_device("v", "s1").unwrap();
        let all = s1.read(0, 8 * EXTENT as usize).await.unwrap();
        assert!(all.iter().all(|&b| b == 1), "s1 holds the first contents");
        let now = volume.read(0, 7 * EXTENT as usize).await.unwrap();
        assert!(now[..EXTENT as usize].iter().all(|&b| b == 12));
        assert!(now[2 * EXTENT as usize..].iter().all(|&b| b == 2));

        // Only protected snapshots left and still below: refused, saying so.
        pool.delete_snapshot("v", "s4").await.unwrap();
        fill_extent(&volume, 7, 2).await;
        let scratch = pool.create_volume("w", EXTENT).await.unwrap();
        fill_extent(&scratch, 0, 3).await;
        let free = pool.extents() - pool.allocated_extents();
        assert!(free < 4, "{free} free");
        let refused = pool.create_snapshot("v", Some("s5")).await.unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("no unprotected snapshot is left to delete"),
            "{refused}"
        );
        assert_eq!(names(&pool, "v"), vec!["s1"]);
        let node = pool.describe().await.unwrap();
        assert_eq!(detail(&node, "snapshots deleted for the reserve"), "2");
        assert_eq!(detail(&node, "snapshots refused for the reserve"), "1");
        assert_eq!(detail(&node, "when reserve low"), "delete-oldest");
        assert_consistent(&pool);
    });
}

/// The runner itself: a write-count policy and a `delete-oldest` reserve acted on without the
/// test driving them (a short interval), and stopped with the pool's background work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_runner_takes_due_snapshots_and_stops_with_the_pool() {
    let (_, pool) = pool_with(|settings| {
        settings.policy_interval = Some(Duration::from_millis(20));
    })
    .await;
    let volume = pool.create_volume("v", 4 * EXTENT).await.unwrap();
    pool.set_snapshot_policy("v", Some(every_writes("2", Some("1"))), T0)
        .await
        .unwrap();
    assert_eq!(pool.background().running(), 1, "the runner");
    let mut seen: Vec<String> = Vec::new();
    for round in 0..3u8 {
        write_block(&volume, round).await;
        write_block(&volume, round).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let taken = pool.snapshot_policy("v").unwrap().last_auto;
            if let Some(taken) = taken.filter(|name| seen.last() != Some(name)) {
                seen.push(taken);
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: no snapshot"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // Keep 1: the runner deleted the older ones after each new one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while names(&pool, "v").len() > 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            names(&pool, "v")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pool.background().stop().await;
    assert_eq!(pool.background().running(), 0);
    assert_consistent(&pool);
}
