//! Entry points for `fuzz/` (cargo fuzz): the decoders of what a brick reads from its disk,
//! and of the requests it takes from the network by reference.

use crate::layout::BrickLayout;
use crate::record::{IntervalRecord, RECORD_VERSION};
use crate::store::versions::VersionsBlob;

/// An interval record, a layout and a versions blob from arbitrary bytes: each is refused or
/// re-encodes to the same bytes (a record of version 1, or of version 2 without staged
/// writes, which this build writes as version 3, decodes to what its re-encoding decodes
/// to); never a panic.
pub fn records(data: &[u8]) {
    if let Ok(record) = IntervalRecord::decode(data) {
        if data[0] == RECORD_VERSION || (data[0] == 2 && !record.extents.is_empty()) {
            assert_eq!(record.encode(), data, "a record re-encodes to its bytes");
        } else if record.state != crate::record::RecordState::Committed {
            assert_eq!(IntervalRecord::decode(&record.encode()), Ok(record));
        }
    }
    if let Ok(blob) = VersionsBlob::decode(data) {
        assert_eq!(
            blob.encode(),
            data,
            "a versions blob re-encodes to its bytes"
        );
    }
    if let Ok(layout) = BrickLayout::decode(data, u64::MAX) {
        assert_eq!(layout.encode(), data, "a layout re-encodes to its bytes");
    }
}

/// A prepare's or a direct write's body from the network (`rpc::by_reference`), cut into
/// frames where the first byte says: refused, or a message prost re-encodes and decodes to
/// itself, and exactly as prost itself decodes the same bytes; never a panic.
pub fn requests(data: &[u8]) {
    use crate::rpc::by_reference::{decode_message, Chunks};
    use crate::rpc::proto;
    use bytes::Bytes;
    use prost::Message;

    fn check<M: Message + Default + PartialEq + std::fmt::Debug>(data: &[u8]) {
        let Some((&step, wire)) = data.split_first() else {
            return;
        };
        let step = usize::from(step).max(1);
        let mut frames = Chunks::default();
        for frame in wire.chunks(step) {
            frames.push(Bytes::copy_from_slice(frame));
        }
        let by_reference = decode_message::<M>(frames);
        let by_prost = (wire.len() >= 5 && wire[0] == 0)
            .then(|| M::decode(&wire[5..]))
            .and_then(Result::ok);
        if let Ok(message) = &by_reference {
            assert_eq!(Some(message), by_prost.as_ref(), "decodes as prost does");
            let again = M::decode(message.encode_to_vec().as_slice()).expect("re-encoded");
            assert_eq!(&again, message, "re-encodes to itself");
        }
    }
    check::<proto::PrepareRequest>(data);
    check::<proto::WriteDirectRequest>(data);
}
