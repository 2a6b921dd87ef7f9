//! Recovery of a whole metadata region (format 2: two superblock copies, checkpoint slots,
//! two copies of every journal batch) after the fuzzer has flipped bytes in it. Recovery
//! must answer with a state or an error and never panic; a state it returns must be one the
//! store really held at some commit (its map is a prefix of the committed puts), never an
//! invention.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, DeviceRef, WriteFlags};
use strata_meta::{FormatOptions, MetaStore, StoreOptions, TxnClass};

const REGION: u64 = 64 * 4096;
const PUTS: u64 = 40;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}

/// A region after `PUTS` commits of one put each: several journal batches, and (the region
/// being small) at least one checkpoint forced by a full journal.
fn image() -> &'static [u8] {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        runtime().block_on(async {
            let device: DeviceRef = Arc::new(MemoryDevice::new(REGION));
            let mut format = FormatOptions::new("fuzz");
            format.first_generation = Some(1000);
            let store = MetaStore::format(device.clone(), 0, REGION, format, StoreOptions::new("f"))
                .await
                .expect("format");
            let map = store
                .transact(TxnClass::Normal, |_, txn| Ok(txn.create_table("map", 8)))
                .expect("create");
            store.commit().await.expect("commit");
            for i in 0..PUTS {
                store
                    .transact(TxnClass::Normal, |_, txn| {
                        txn.set(map, i, &(i + 1).to_le_bytes());
                        Ok(())
                    })
                    .expect("put");
                store.commit().await.expect("commit");
            }
            device.read(0, REGION as usize).await.expect("read").to_vec()
        })
    })
}

fuzz_target!(|data: &[u8]| {
    // The input is a list of (offset u32, xor mask u8) patches over the region.
    let mut region = image().to_vec();
    for patch in data.chunks_exact(5) {
        let at = u32::from_le_bytes(patch[..4].try_into().unwrap()) as usize % region.len();
        region[at] ^= patch[4];
    }
    runtime().block_on(async {
        let device = MemoryDevice::new(REGION);
        device
            .write(0, bytes::Bytes::from(region), WriteFlags { fua: false })
            .await
            .expect("write");
        let Ok(recovered) = strata_meta::recover(&device, 0).await else {
            return;
        };
        let state = &recovered.state;
        let Some(map) = state.id("map") else {
            return; // the state before the table's commit: a prefix too
        };
        let table = state.table(map).expect("map is a table");
        let held: Vec<u64> = table.iter_from(0).map(|(i, _)| i).collect();
        assert_eq!(held, (0..held.len() as u64).collect::<Vec<_>>(), "not a prefix");
        for (i, value) in table.iter_from(0) {
            assert_eq!(value, (i + 1).to_le_bytes(), "a value nobody wrote");
        }
    });
});
