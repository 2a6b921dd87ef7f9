//! Blocks, chunks and chunk slots: the layer's arithmetic, fixed at format.

/// The map's unit of validity: a 4 KiB block.
pub const BLOCK: u64 = 4096;

/// Where everything is, as the format record keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Blocks per chunk (at most 64: a location's validity bitmap is a u64).
    pub chunk_blocks: u64,
    /// Bytes at the start of child 0 kept for the metadata store; its slots start after.
    pub metadata_bytes: u64,
    /// Logical chunks the device presents.
    pub chunks: u64,
    /// Chunk slots on each child, in child order.
    pub slots: Vec<u64>,
}

impl Shape {
    /// The shape a format gives children of these sizes: every whole chunk slot after the
    /// metadata region is a slot, and an eighth of them (at least one) is kept free of
    /// logical chunks, as room for second locations (a migration needs a free slot).
    pub fn new(chunk_bytes: u64, metadata_bytes: u64, sizes: &[u64]) -> Result<Shape, String> {
        assert!(chunk_bytes.is_multiple_of(BLOCK) && chunk_bytes / BLOCK <= 64);
        let slots: Vec<u64> = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let start = if i == 0 { metadata_bytes } else { 0 };
                size.saturating_sub(start) / chunk_bytes
            })
            .collect();
        let total: u64 = slots.iter().sum();
        let spare = total.div_ceil(8).max(1);
        if total <= spare {
            return Err(format!(
                "the children hold {total} chunk slots of {chunk_bytes} bytes (after \
                 {metadata_bytes} bytes of metadata on child 0); a migrate layer needs at least 2"
            ));
        }
        Ok(Shape {
            chunk_blocks: chunk_bytes / BLOCK,
            metadata_bytes,
            chunks: total - spare,
            slots,
        })
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_blocks * BLOCK
    }

    pub fn size(&self) -> u64 {
        self.chunks * self.chunk_bytes()
    }

    pub fn devices(&self) -> usize {
        self.slots.len()
    }

    /// The byte offset on its child of block `index` of chunk slot `slot` of child `device`.
    pub fn offset(&self, device: usize, slot: u64, index: u64) -> u64 {
        assert!(slot < self.slots[device] && index < self.chunk_blocks);
        let start = if device == 0 { self.metadata_bytes } else { 0 };
        start + slot * self.chunk_bytes() + index * BLOCK
    }

    /// The bytes of child `device` the shape uses.
    pub fn used_bytes(&self, device: usize) -> u64 {
        let start = if device == 0 { self.metadata_bytes } else { 0 };
        start + self.slots[device] * self.chunk_bytes()
    }

    /// All `chunk_blocks` bits.
    pub fn full_mask(&self) -> u64 {
        if self.chunk_blocks == 64 {
            u64::MAX
        } else {
            (1 << self.chunk_blocks) - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_metadata_on_child_zero_and_an_eighth_is_spare() {
        let shape = Shape::new(128 << 10, 1 << 20, &[3 << 20, 2 << 20]).unwrap();
        assert_eq!(shape.slots, vec![16, 16]);
        assert_eq!(shape.chunks, 28);
        assert_eq!(shape.offset(0, 0, 0), 1 << 20);
        assert_eq!(shape.offset(1, 1, 2), (128 << 10) + 8192);
        assert_eq!(shape.full_mask(), 0xFFFF_FFFF);
        assert!(Shape::new(128 << 10, 1 << 20, &[1 << 20, 128 << 10]).is_err());
    }
}
