//! Entry points for the fuzz targets in `fuzz/` (cargo fuzz): every decoder that reads what
//! a disk hands it, with the checksums out of the way so the fuzzer reaches the parsers.
//! Each must return an error for bad input and never panic; what decodes must re-encode to
//! the same bytes.

use crate::codec::Reader;
use crate::journal::{decode_batch, PendingBatch};
use crate::layout::Superblock;
use crate::state::{decode_checkpoint, encode_checkpoint, TablePages};

/// A checkpoint stream: decodes or fails; what decodes (in the current encoding)
/// re-encodes identically and its size accounting is exact. The older encoding must decode
/// or fail without panicking too.
pub fn checkpoint(bytes: &[u8]) {
    if let Ok(state) = decode_checkpoint(bytes, TablePages::Whole) {
        let mut again = Vec::new();
        encode_checkpoint(&state, &mut again);
        assert_eq!(again.len() as u64, state.encoded_bytes());
    }
    let Ok(state) = decode_checkpoint(bytes, TablePages::Masked) else {
        return;
    };
    let mut again = Vec::new();
    encode_checkpoint(&state, &mut again);
    assert_eq!(again.len() as u64, state.encoded_bytes());
    assert_eq!(
        again, bytes,
        "a decoded checkpoint must re-encode to the same bytes"
    );
}

/// A journal batch stream: decodes or fails; what decodes re-encodes identically.
pub fn batch(bytes: &[u8]) {
    let Ok(batch) = decode_batch(bytes) else {
        return;
    };
    let mut pending = PendingBatch::new(batch.first_txn);
    for txn in &batch.txns {
        pending.push(txn);
    }
    assert_eq!(
        pending.stream(),
        bytes,
        "a decoded batch must re-encode to the same bytes"
    );
}

/// A superblock block (any length; padded or cut to 4 KiB).
pub fn superblock(bytes: &[u8]) {
    let mut block = vec![0u8; crate::block::BLOCK_SIZE];
    let n = bytes.len().min(block.len());
    block[..n].copy_from_slice(&bytes[..n]);
    let _ = Superblock::decode(&block, 0);
    let mut reader = Reader::new(bytes);
    let _ = reader.name("name");
}
