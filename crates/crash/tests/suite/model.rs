//! The reference model's rules, one sector at a time.

use bytes::Bytes;
use strata_crash::{pattern, DeviceModel, WriteId};

fn sector(byte: u8) -> Bytes {
    Bytes::from(vec![byte; 512])
}

#[test]
fn the_documented_example() {
    let mut m = DeviceModel::new(4096);
    let a = m.write_started(0, sector(1));
    m.write_completed(a, false);
    let f1 = m.flush_started();
    let b = m.write_started(0, sector(2));
    m.flush_completed(f1);
    assert_eq!(m.allowed(0), vec![a, b]);
    m.write_completed(b, false);
    let c = m.write_started(0, sector(3));
    m.write_failed(c);
    assert_eq!(m.allowed(0), vec![a, b, c]);
    for byte in [1, 2, 3] {
        assert!(m.check(0, &[byte; 512]).is_ok());
    }
    assert!(
        m.check(0, &[0; 512]).is_err(),
        "A was durable: zeros are gone"
    );
    let f2 = m.flush_started();
    m.flush_completed(f2);
    assert_eq!(m.allowed(0), vec![b, c]);
    assert!(m.check(0, &[1; 512]).is_err());
}

#[test]
fn a_flush_covers_only_writes_completed_before_it_started() {
    let mut m = DeviceModel::new(4096);
    let w = m.write_started(512, sector(1));
    let f = m.flush_started();
    m.write_completed(w, false);
    m.flush_completed(f);
    assert_eq!(m.allowed(512), vec![WriteId::ZEROS, w]);
    let f = m.flush_started();
    m.flush_failed(f);
    assert_eq!(
        m.allowed(512),
        vec![WriteId::ZEROS, w],
        "a failed flush promises nothing"
    );
    let f = m.flush_started();
    m.flush_completed(f);
    assert_eq!(m.allowed(512), vec![w]);
    assert_eq!(
        m.allowed(0),
        vec![WriteId::ZEROS],
        "other sectors untouched"
    );
}

#[test]
fn fua_collapses_its_sectors_and_zeroes_are_writes_of_zeros() {
    let mut m = DeviceModel::new(4096);
    let a = m.write_started(0, Bytes::from(vec![1; 1024]));
    m.write_completed(a, false);
    let z = m.zeroes_started(512, 1024);
    m.write_completed(z, true);
    assert_eq!(m.allowed(0), vec![WriteId::ZEROS, a]);
    assert_eq!(m.allowed(512), vec![z]);
    assert_eq!(m.allowed(1024), vec![z]);
    let mut read = vec![0; 2048];
    read[..512].fill(1);
    assert!(m.check(0, &read).is_ok());
    read[600] = 1;
    let error = m.check(0, &read).unwrap_err();
    assert!(error.contains("byte offset 512"), "{error}");
    assert!(
        error.contains("zeroes [512, +1024), completed with FUA, durable"),
        "{error}"
    );
}

#[test]
fn a_failed_write_stays_a_candidate_until_superseded() {
    let mut m = DeviceModel::new(4096);
    let w = m.write_started(0, sector(9));
    m.write_failed(w);
    let f = m.flush_started();
    m.flush_completed(f);
    assert_eq!(m.allowed(0), vec![WriteId::ZEROS, w]);
    let v = m.write_started(0, sector(8));
    m.write_completed(v, true);
    assert_eq!(m.allowed(0), vec![v]);
}

#[test]
fn live_reads_must_see_the_newest_completed_write() {
    let mut m = DeviceModel::new(4096);
    let (a, data_a) = m.pattern_write_started(0, 1024);
    m.write_completed(a, false);
    let (b, data_b) = m.pattern_write_started(512, 512);
    m.write_completed(b, false);
    let mut now = data_a.to_vec();
    now[512..].copy_from_slice(&data_b);
    assert!(m.check_live(0, &now).is_ok());
    let error = m.check_live(0, &data_a).unwrap_err();
    assert!(error.contains("before any crash"), "{error}");
    assert!(
        error.contains(&format!("pattern of {a} for this sector")),
        "{error}"
    );
    assert!(
        error.contains(&format!("superseded (stale if read now): zeros, {a}")),
        "{error}"
    );
    assert!(
        m.check(0, &data_a).is_ok(),
        "after a crash the older write may win"
    );
    // A write in flight may or may not be visible yet.
    let (c, data_c) = m.pattern_write_started(0, 512);
    assert!(m.check_live(0, &data_c).is_ok());
    assert!(m.check_live(0, &data_a[..512]).is_ok());
    m.write_failed(c);
}

#[test]
fn garbage_and_misplaced_data_are_named() {
    let mut m = DeviceModel::new(8192);
    let (id, data) = m.pattern_write_started(1024, 1024);
    m.write_completed(id, false);
    let error = m.check(0, &[0x42; 512]).unwrap_err();
    assert!(error.contains("garbage"), "{error}");
    assert!(error.contains("zeros (initial, durable)"), "{error}");
    let error = m.check(4096, &data[..1024]).unwrap_err();
    assert!(error.contains("byte offset 1024 (misplaced)"), "{error}");
    assert!(error.contains("1 more bad sectors"), "{error}");
}

#[test]
fn settle_pins_sectors_and_forgets_unreferenced_writes() {
    let mut m = DeviceModel::new(4096);
    let mut ids = Vec::new();
    for byte in 1..=5 {
        let w = m.write_started(0, sector(byte));
        m.write_completed(w, false);
        ids.push(w);
    }
    let in_flight = m.write_started(512, sector(7));
    m.crashed();
    assert_eq!(m.tracked_writes(), 6);
    m.check(0, &[3; 512]).unwrap();
    m.settle(0, &[3; 512]);
    m.settle(512, &[0; 512]);
    assert_eq!(m.allowed(0), vec![ids[2]]);
    assert_eq!(m.allowed(512), vec![WriteId::ZEROS]);
    assert_eq!(m.tracked_writes(), 1);
    assert!(m.check(0, &[5; 512]).is_err());
    let _ = in_flight;
}

#[test]
fn ids_can_start_elsewhere_so_volumes_are_told_apart() {
    let mut a = DeviceModel::new(4096);
    let mut b = DeviceModel::with_first_id(4096, (1 << 40) + 1);
    let (wa, da) = a.pattern_write_started(0, 512);
    let (wb, db) = b.pattern_write_started(0, 512);
    assert_ne!(wa, wb);
    a.write_completed(wa, true);
    b.write_completed(wb, true);
    let error = a.check(0, &db).unwrap_err();
    assert!(error.contains(&format!("pattern of {wb}")), "{error}");
    assert!(a.check(0, &da).is_ok());
    assert_eq!(pattern(wa, 0, 512), da);
}

#[test]
fn disjoint_writes_may_be_in_flight_together() {
    let mut m = DeviceModel::new(4096);
    let a = m.write_started(0, sector(1));
    let b = m.write_started(512, sector(2));
    m.write_completed(b, false);
    m.write_completed(a, true);
    assert_eq!(m.allowed(0), vec![a]);
    assert_eq!(m.allowed(512), vec![WriteId::ZEROS, b]);
}

#[test]
#[should_panic(expected = "overlapping concurrent writes")]
fn overlapping_writes_in_flight_are_refused() {
    let mut m = DeviceModel::new(4096);
    m.write_started(0, Bytes::from(vec![1; 1024]));
    m.write_started(512, sector(2));
}

#[test]
#[should_panic(expected = "call crashed()")]
fn settle_needs_the_crash_recorded() {
    let mut m = DeviceModel::new(4096);
    m.write_started(0, sector(1));
    m.settle(0, &[0; 512]);
}

#[test]
fn a_grown_device_holds_what_its_new_tail_read() {
    let mut m = DeviceModel::new(1024);
    let tail = Bytes::from(vec![7u8; 1024]);
    m.grow_as_read(2048, tail.clone());
    assert_eq!(m.size(), 2048);
    m.check(1024, &tail).unwrap();
    assert!(
        m.check(1024, &[0u8; 1024]).is_err(),
        "the tail read is durable, not zeros"
    );
    m.crashed();
    m.check(1024, &tail).unwrap();
    // A tail of zeros is the plain resize.
    m.grow_as_read(2560, Bytes::from(vec![0u8; 512]));
    m.check(2048, &[0u8; 512]).unwrap();
}
