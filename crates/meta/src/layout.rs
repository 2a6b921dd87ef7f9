//! Where things live in a metadata region, and the superblock that says which of them is
//! current.
//!
//! ```text
//! block 0             superblock copy A   (written when generation is even)
//! block 1             superblock copy B   (written when generation is odd)
//! blocks 2 ..         checkpoint slot 0   (slot_blocks)
//! then                checkpoint slot 1   (slot_blocks)
//! then                journal             (journal_blocks)
//! ```
//!
//! From format version 2 the journal holds every batch twice: copy 1 in its first half, copy 2
//! at the same block of its second half, so that one local media fault cannot take both and
//! recovery can tell a commit that never completed (neither copy whole) from one that
//! completed and was damaged later (one copy whole). Version 1 stores (one copy) still open;
//! their first checkpoint writes a version 2 superblock.
//!
//! A checkpoint is written to the slot the current superblock does not name, flushed, and only
//! then published by a superblock write to the copy that does not hold the current one. So a
//! torn superblock write leaves the other copy, which names an intact checkpoint and a journal
//! that the new epoch has not yet touched.

use bytes::{BufMut, BytesMut};

use crate::block::{self, BlockHeader, BlockKind, BLOCK_SIZE, PAYLOAD_SIZE};
use crate::codec::{put_name, DecodeError, Reader};

/// On-disk format version written by this code: 3, twin journal copies (from 2) and
/// checkpoints that store only a table page's present values (from 3).
pub const FORMAT_VERSION: u32 = 3;
/// Oldest format version this code still reads: 1, one journal copy per batch.
pub const OLDEST_FORMAT_VERSION: u32 = 1;

/// Fewest blocks a region may have: 2 superblocks, 2 × 2 checkpoint blocks, 4 journal blocks.
pub const MIN_REGION_BLOCKS: u64 = 10;

/// Block offsets of the parts of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Byte offset of the region on its device.
    pub offset: u64,
    pub region_blocks: u64,
    pub slot_blocks: u64,
    pub journal_blocks: u64,
}

impl Layout {
    /// Splits a region of `len` bytes: a quarter (at least 4 blocks) for the journal and the
    /// rest in two equal checkpoint slots.
    pub fn new(offset: u64, len: u64, journal_fraction: f64) -> Result<Layout, String> {
        if !offset.is_multiple_of(BLOCK_SIZE as u64) {
            return Err(format!(
                "metadata region offset {offset} is not 4 KiB aligned"
            ));
        }
        let region_blocks = len / BLOCK_SIZE as u64;
        if region_blocks < MIN_REGION_BLOCKS {
            return Err(format!(
                "metadata region of {len} bytes is smaller than {MIN_REGION_BLOCKS} blocks"
            ));
        }
        let journal_blocks = ((region_blocks as f64 * journal_fraction) as u64).max(4);
        let slot_blocks = (region_blocks - 2 - journal_blocks) / 2;
        if slot_blocks < 2 {
            return Err(format!(
                "metadata region of {len} bytes leaves no checkpoint space"
            ));
        }
        Ok(Layout {
            offset,
            region_blocks,
            slot_blocks,
            journal_blocks,
        })
    }

    pub fn superblock_offset(&self, copy: u64) -> u64 {
        assert!(copy < 2);
        self.offset + copy * BLOCK_SIZE as u64
    }

    pub fn slot_offset(&self, slot: u32) -> u64 {
        assert!(slot < 2);
        self.offset + (2 + slot as u64 * self.slot_blocks) * BLOCK_SIZE as u64
    }

    pub fn journal_offset(&self, block: u64) -> u64 {
        assert!(block <= self.journal_blocks);
        self.offset + (2 + 2 * self.slot_blocks + block) * BLOCK_SIZE as u64
    }

    /// Payload bytes a checkpoint slot holds: the bound on the state's size.
    pub fn slot_capacity_bytes(&self) -> u64 {
        self.slot_blocks * PAYLOAD_SIZE as u64
    }

    pub fn region_bytes(&self) -> u64 {
        self.region_blocks * BLOCK_SIZE as u64
    }
}

/// The root of a store: which checkpoint is current and what the journal's epoch is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The format the journal of this superblock's epoch is written in (1 or 2). Writers
    /// always write [`FORMAT_VERSION`]; a version 1 superblock is only ever read.
    pub format_version: u32,
    pub uuid: [u8; 16],
    /// Bumped by every checkpoint; also the epoch stamped on the checkpoint's blocks and on
    /// every journal batch written after it.
    pub generation: u64,
    /// Who keeps state here ("thin-pool"): `strata check` uses it to pick the invariants.
    pub owner: String,
    pub layout: Layout,
    pub active_slot: u32,
    pub checkpoint_blocks: u64,
    /// Transactions numbered below this are in the checkpoint.
    pub checkpoint_txn: u64,
    /// Checkpoint bytes kept back for transactions that free space.
    pub reserve_bytes: u64,
    /// Usage above which the store raises a low-space event.
    pub low_water_bytes: u64,
}

impl Superblock {
    pub fn encode(&self) -> BytesMut {
        let mut payload = Vec::new();
        payload.put_u32_le(self.format_version);
        payload.put_u32_le(BLOCK_SIZE as u32);
        payload.put_slice(&self.uuid);
        payload.put_u64_le(self.generation);
        put_name(&mut payload, &self.owner);
        payload.put_u64_le(self.layout.region_blocks);
        payload.put_u64_le(self.layout.slot_blocks);
        payload.put_u64_le(self.layout.journal_blocks);
        payload.put_u32_le(self.active_slot);
        payload.put_u64_le(self.checkpoint_blocks);
        payload.put_u64_le(self.checkpoint_txn);
        payload.put_u64_le(self.reserve_bytes);
        payload.put_u64_le(self.low_water_bytes);
        let mut out = BytesMut::with_capacity(BLOCK_SIZE);
        let header = BlockHeader {
            kind: BlockKind::Superblock,
            epoch: self.generation,
            seq: 0,
            index: 0,
            count: 1,
            payload_len: payload.len() as u32,
            unit_crc: crc32c::crc32c(&payload),
        };
        block::encode(&mut out, header, &payload);
        out
    }

    /// Parses and checks a superblock read from `offset` (the region's start).
    pub fn decode(data: &[u8], offset: u64) -> Result<Superblock, String> {
        let (header, payload) = block::decode(data).map_err(|fault| fault.to_string())?;
        if header.kind != BlockKind::Superblock {
            return Err(format!("a {:?} block, not a superblock", header.kind));
        }
        let superblock = Self::decode_payload(payload, offset).map_err(|e| e.to_string())?;
        if superblock.generation != header.epoch {
            return Err("generation differs from the block header".into());
        }
        superblock.validate()?;
        Ok(superblock)
    }

    fn decode_payload(payload: &[u8], offset: u64) -> Result<Superblock, DecodeError> {
        let mut reader = Reader::new(payload);
        let version = reader.u32("format version")?;
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(reader.error(format!(
                "format version {version}; this build reads versions \
                 {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION}"
            )));
        }
        let block_size = reader.u32("block size")?;
        if block_size as usize != BLOCK_SIZE {
            return Err(reader.error(format!("block size {block_size}")));
        }
        let uuid = reader.bytes(16, "uuid")?.try_into().expect("16 bytes");
        let generation = reader.u64("generation")?;
        let owner = reader.name("owner")?;
        let layout = Layout {
            offset,
            region_blocks: reader.u64("region blocks")?,
            slot_blocks: reader.u64("slot blocks")?,
            journal_blocks: reader.u64("journal blocks")?,
        };
        Ok(Superblock {
            format_version: version,
            uuid,
            generation,
            owner,
            layout,
            active_slot: reader.u32("active slot")?,
            checkpoint_blocks: reader.u64("checkpoint blocks")?,
            checkpoint_txn: reader.u64("checkpoint transaction")?,
            reserve_bytes: reader.u64("reserve bytes")?,
            low_water_bytes: reader.u64("low-water bytes")?,
        })
    }

    /// Checks that the parts fit the region and each other.
    pub fn validate(&self) -> Result<(), String> {
        let layout = &self.layout;
        if layout.region_blocks < 2 + 2 * layout.slot_blocks + layout.journal_blocks {
            return Err(format!("layout {layout:?} does not fit its region"));
        }
        if self.active_slot > 1 {
            return Err(format!("active slot {}", self.active_slot));
        }
        if self.checkpoint_blocks == 0 || self.checkpoint_blocks > layout.slot_blocks {
            return Err(format!(
                "checkpoint of {} blocks in a {}-block slot",
                self.checkpoint_blocks, layout.slot_blocks
            ));
        }
        if self.reserve_bytes > layout.slot_capacity_bytes() {
            return Err(format!("reserve of {} bytes", self.reserve_bytes));
        }
        Ok(())
    }

    /// Where the copy for this generation goes.
    pub fn copy(&self) -> u64 {
        self.generation % 2
    }

    /// Copies of every journal batch in this epoch: 1 in format version 1, 2 after.
    pub fn journal_copies(&self) -> u64 {
        if self.format_version >= 2 {
            2
        } else {
            1
        }
    }

    /// Journal blocks one copy of the journal has: the whole journal area in version 1, half
    /// of it (rounded down) in version 2.
    pub fn journal_capacity(&self) -> u64 {
        self.layout.journal_blocks / self.journal_copies()
    }

    /// Byte offset of `block` in journal copy `copy` (0 or 1).
    pub fn journal_copy_offset(&self, copy: u64, block: u64) -> u64 {
        assert!(copy < self.journal_copies() && block <= self.journal_capacity());
        self.layout
            .journal_offset(copy * self.journal_capacity() + block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_splits_a_region() {
        let layout = Layout::new(8192, 4 << 20, 0.25).unwrap();
        assert_eq!(layout.region_blocks, 1024);
        assert_eq!(layout.journal_blocks, 256);
        assert_eq!(layout.slot_blocks, 383);
        assert_eq!(layout.slot_offset(0), 8192 + 2 * 4096);
        assert_eq!(layout.journal_offset(0), 8192 + (2 + 766) * 4096);
        assert!(layout.journal_offset(layout.journal_blocks) <= 8192 + (4 << 20));
        assert!(Layout::new(0, 9 * 4096, 0.25).is_err());
        assert!(Layout::new(100, 1 << 20, 0.25).is_err());
    }

    #[test]
    fn superblock_round_trips_and_rejects_damage() {
        let superblock = Superblock {
            format_version: FORMAT_VERSION,
            uuid: [7; 16],
            generation: 41,
            owner: "thin-pool".into(),
            layout: Layout::new(0, 1 << 20, 0.25).unwrap(),
            active_slot: 1,
            checkpoint_blocks: 3,
            checkpoint_txn: 99,
            reserve_bytes: 4096,
            low_water_bytes: 100_000,
        };
        let block = superblock.encode();
        assert_eq!(Superblock::decode(&block, 0).unwrap(), superblock);
        assert_eq!(superblock.copy(), 1);
        let mut torn = block.clone();
        torn[60..].fill(0xff);
        assert!(Superblock::decode(&torn, 0)
            .unwrap_err()
            .contains("checksum"));
        let bad = Superblock {
            checkpoint_blocks: 10_000,
            ..superblock
        };
        assert!(Superblock::decode(&bad.encode(), 0).is_err());
    }

    #[test]
    fn superblock_versions_1_to_3_are_read_and_newer_ones_refused() {
        let v2 = Superblock {
            format_version: 2,
            uuid: [7; 16],
            generation: 8,
            owner: "thin-pool".into(),
            layout: Layout::new(0, 1 << 20, 0.25).unwrap(),
            active_slot: 0,
            checkpoint_blocks: 1,
            checkpoint_txn: 0,
            reserve_bytes: 0,
            low_water_bytes: 0,
        };
        assert_eq!(v2.journal_copies(), 2);
        assert_eq!(v2.journal_capacity(), 32);
        assert_eq!(v2.journal_copy_offset(1, 3), v2.layout.journal_offset(35));
        let v1 = Superblock {
            format_version: 1,
            ..v2.clone()
        };
        assert_eq!(Superblock::decode(&v1.encode(), 0).unwrap(), v1);
        assert_eq!(v1.journal_capacity(), 64);
        assert_eq!(v1.journal_copy_offset(0, 3), v1.layout.journal_offset(3));
        let v3 = Superblock {
            format_version: 3,
            ..v2.clone()
        };
        assert_eq!(Superblock::decode(&v3.encode(), 0).unwrap(), v3);
        assert_eq!(v3.journal_capacity(), 32);
        for version in [0, 4] {
            let other = Superblock {
                format_version: version,
                ..v2.clone()
            };
            let error = Superblock::decode(&other.encode(), 0).unwrap_err();
            assert!(
                error.contains(&format!(
                    "format version {version}; this build reads versions 1 to 3"
                )),
                "{error}"
            );
        }
    }
}
