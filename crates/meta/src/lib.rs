//! Strata's metadata service: the one way layers keep state on disk.
//!
//! A layer keeps named, typed objects (sparse tables of fixed-size records, sparse bitmaps,
//! small blobs) in a region of a device. Changes are transactions, applied in memory at once
//! and made durable together by group commit into a journal; the journal is folded into a
//! checkpoint when it fills. Every block carries a crc32c and the epoch it belongs to, the
//! root is a pair of superblocks, and recovery at open needs no human. The on-disk format is
//! documented in `docs/metadata-format.md`.

mod block;
mod codec;
#[doc(hidden)]
pub mod fuzzing;
mod journal;
mod layout;
mod objects;
mod recovery;
mod replica;
mod state;
mod stats;
mod store;

pub use block::{BLOCK_SIZE, PAYLOAD_SIZE};
pub use codec::DecodeError;
pub use layout::{Layout, Superblock, FORMAT_VERSION, MIN_REGION_BLOCKS, OLDEST_FORMAT_VERSION};
pub use objects::{
    Bitmap, Table, Value, BITMAP_PAGE_BITS, MAX_VALUE_SIZE, PAGE_OVERHEAD, TABLE_PAGE_ENTRIES,
};
pub use recovery::{read_superblock, recover, JournalEnd, Recovered, RecoveryError};
pub use replica::{write_copies, Replicas, ReplicatedDevice};
pub use state::{ObjectId, ObjectKind, State, MAX_BITS_PER_OP, MAX_BLOB_SIZE, MAX_NAME_LEN};
pub use stats::{CountersSnapshot, MetaCounters, SpaceReport};
pub use store::{random_uuid, FormatOptions, MetaStore, StoreOptions, Txn, TxnClass};
