//! The journal's record format: transactions as lists of ops, and batches of transactions.
//!
//! A batch is what one commit writes: the transactions since the previous commit, framed as a
//! unit of blocks (see `block`). It is atomic as a whole, because recovery replays a batch
//! only if every block of it checks out; the transactions inside it are atomic because they
//! only ever reach the disk inside one batch.
//!
//! Batch stream: `first_txn u64, txn_count u32`, then per transaction `op_count u32` and its
//! ops. Op: a tag byte, then
//! - 1 create: `id u32, kind u8, value_size u32, name (u8 len + bytes)`
//! - 2 delete: `id u32`
//! - 3 set: `id u32, index u64, len u16, value`
//! - 4 set-bits: `id u32, start u64, count u64, value u8`
//! - 5 put-blob: `id u32, len u32, data`

use bytes::BufMut;

use crate::codec::{put_name, DecodeError, Reader};
use crate::objects::Value;
use crate::state::{ObjectKind, Op, MAX_BLOB_SIZE};

const CREATE: u8 = 1;
const DELETE: u8 = 2;
const SET: u8 = 3;
const SET_BITS: u8 = 4;
const PUT_BLOB: u8 = 5;

/// Appends one op's encoding.
pub fn encode_op(out: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Create {
            id,
            kind,
            value_size,
            name,
        } => {
            out.put_u8(CREATE);
            out.put_u32_le(*id);
            out.put_u8(*kind as u8);
            out.put_u32_le(*value_size);
            put_name(out, name);
        }
        Op::Delete { id } => {
            out.put_u8(DELETE);
            out.put_u32_le(*id);
        }
        Op::Set { id, index, value } => {
            out.put_u8(SET);
            out.put_u32_le(*id);
            out.put_u64_le(*index);
            out.put_u16_le(value.len() as u16);
            out.put_slice(value);
        }
        Op::SetBits {
            id,
            start,
            count,
            value,
        } => {
            out.put_u8(SET_BITS);
            out.put_u32_le(*id);
            out.put_u64_le(*start);
            out.put_u64_le(*count);
            out.put_u8(*value as u8);
        }
        Op::PutBlob { id, data } => {
            out.put_u8(PUT_BLOB);
            out.put_u32_le(*id);
            out.put_u32_le(data.len() as u32);
            out.put_slice(data);
        }
    }
}

/// Reads one op.
pub fn decode_op(reader: &mut Reader) -> Result<Op, DecodeError> {
    let tag = reader.u8("op tag")?;
    let id = reader.u32("object id")?;
    let op = match tag {
        CREATE => {
            let kind = reader.u8("object kind")?;
            let kind = match kind {
                1 => ObjectKind::Table,
                2 => ObjectKind::Bitmap,
                3 => ObjectKind::Blob,
                other => return Err(reader.error(format!("unknown object kind {other}"))),
            };
            let value_size = reader.u32("value size")?;
            let name = reader.name("object name")?;
            Op::Create {
                id,
                kind,
                value_size,
                name,
            }
        }
        DELETE => Op::Delete { id },
        SET => {
            let index = reader.u64("index")?;
            let len = u16::from_le_bytes(reader.bytes(2, "value length")?.try_into().unwrap());
            let value = Value::from_slice(reader.bytes(len as usize, "value")?);
            Op::Set { id, index, value }
        }
        SET_BITS => {
            let start = reader.u64("first bit")?;
            let count = reader.u64("bit count")?;
            let value = match reader.u8("bit value")? {
                0 => false,
                1 => true,
                other => return Err(reader.error(format!("bit value {other}"))),
            };
            Op::SetBits {
                id,
                start,
                count,
                value,
            }
        }
        PUT_BLOB => {
            let len = reader.u32("blob length")? as usize;
            if len > MAX_BLOB_SIZE {
                return Err(reader.error(format!("blob of {len} bytes")));
            }
            let data = reader.bytes(len, "blob")?.to_vec();
            Op::PutBlob { id, data }
        }
        other => return Err(reader.error(format!("unknown op tag {other}"))),
    };
    Ok(op)
}

/// Transactions encoded for the next batch, in commit order.
#[derive(Debug, Default)]
pub struct PendingBatch {
    pub first_txn: u64,
    pub txn_count: u32,
    pub body: Vec<u8>,
}

impl PendingBatch {
    pub fn new(first_txn: u64) -> Self {
        PendingBatch {
            first_txn,
            txn_count: 0,
            body: Vec::new(),
        }
    }

    pub fn push(&mut self, ops: &[Op]) {
        self.body.put_u32_le(ops.len() as u32);
        for op in ops {
            encode_op(&mut self.body, op);
        }
        self.txn_count += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.txn_count == 0
    }

    /// The batch's payload stream.
    pub fn stream(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(12 + self.body.len());
        out.put_u64_le(self.first_txn);
        out.put_u32_le(self.txn_count);
        out.put_slice(&self.body);
        out
    }

    pub fn stream_len(&self) -> usize {
        12 + self.body.len()
    }
}

/// A batch read back from the journal.
#[derive(Debug, PartialEq, Eq)]
pub struct Batch {
    pub first_txn: u64,
    pub txns: Vec<Vec<Op>>,
}

pub fn decode_batch(stream: &[u8]) -> Result<Batch, DecodeError> {
    let mut reader = Reader::new(stream);
    let first_txn = reader.u64("first transaction")?;
    let count = reader.u32("transaction count")?;
    let mut txns = Vec::new();
    for _ in 0..count {
        let ops = reader.u32("op count")?;
        // Each op takes at least 5 bytes, which bounds a corrupt count before it allocates.
        if ops as usize > reader.remaining() / 5 {
            return Err(reader.error(format!("{ops} ops in {} bytes", reader.remaining())));
        }
        let txn = (0..ops)
            .map(|_| decode_op(&mut reader))
            .collect::<Result<Vec<_>, _>>()?;
        txns.push(txn);
    }
    if !reader.is_empty() {
        return Err(reader.error(format!(
            "{} bytes after the last transaction",
            reader.remaining()
        )));
    }
    Ok(Batch { first_txn, txns })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u32..100, "[a-z.0-9]{1,20}", 1u32..32).prop_map(|(id, name, value_size)| {
                Op::Create {
                    id,
                    kind: ObjectKind::Table,
                    value_size,
                    name,
                }
            }),
            (1u32..100).prop_map(|id| Op::Delete { id }),
            (
                1u32..100,
                any::<u64>(),
                proptest::collection::vec(any::<u8>(), 0..40)
            )
                .prop_map(|(id, index, value)| Op::Set {
                    id,
                    index,
                    value: Value::from_vec(value),
                }),
            (1u32..100, any::<u64>(), any::<u64>(), any::<bool>()).prop_map(
                |(id, start, count, value)| Op::SetBits {
                    id,
                    start,
                    count,
                    value
                }
            ),
            (1u32..100, proptest::collection::vec(any::<u8>(), 0..100))
                .prop_map(|(id, data)| Op::PutBlob { id, data }),
        ]
    }

    proptest! {
        #[test]
        fn batches_round_trip(txns in proptest::collection::vec(
            proptest::collection::vec(op_strategy(), 0..6), 0..6), first in any::<u64>()) {
            let mut pending = PendingBatch::new(first);
            for txn in &txns {
                pending.push(txn);
            }
            let stream = pending.stream();
            prop_assert_eq!(stream.len(), pending.stream_len());
            let batch = decode_batch(&stream).unwrap();
            prop_assert_eq!(batch, Batch { first_txn: first, txns });
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode_batch(&bytes);
        }
    }
}
