//! Requests that carry block data, sent with the data by reference.
//!
//! tonic encodes a request into one buffer before HTTP/2 sends it, so every MiB a host sends a
//! brick was copied once more than the kernel needed: twice per interval on a mirror set, one
//! copy per replica. A profile of a host at 16 writers put 18 % of its CPU in that copy. A
//! prepare and a direct write are sent here instead: their framing (gRPC's 5-byte prefix and
//! protobuf's keys and lengths) is written out, and each write's data goes to HTTP/2 as the
//! `Bytes` the host already holds, which it hands to `writev` as they are.
//!
//! The bytes on the wire are a valid encoding of the same message: protobuf lets a message's
//! fields come in any order, and a repeated field's elements need not be adjacent. A property
//! test decodes what is built here with prost and finds the message it was built from. The
//! reply is decoded by tonic, as for any call.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
use prost::Message;

use super::codec::{WireDecoder, WireMessage};
use super::proto;
use super::MAX_MESSAGE;

/// The field number of `writes` in `PrepareRequest`, and of `data` in `Write`
/// (`proto/brick.proto`).
const PREPARE_WRITES: u32 = 3;
const DIRECT_WRITES: u32 = 1;
const WRITE_DATA: u32 = 2;

/// A message's encoding as chunks: the framing, and each write's data as it was given.
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    chunks: VecDeque<Bytes>,
    len: u64,
}

impl Chunks {
    fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.len += chunk.len() as u64;
            self.chunks.push_back(chunk);
        }
    }

    #[cfg(test)]
    pub(crate) fn concat(&self) -> Vec<u8> {
        self.chunks.iter().flat_map(|c| c.iter().copied()).collect()
    }
}

/// `rest` (a message without its writes) and then `writes` as the repeated field `field`,
/// framed as one gRPC message. Errs if the message would be larger than either end accepts.
pub(crate) fn framed(
    rest: &impl Message,
    field: u32,
    writes: Vec<(u64, Bytes)>,
) -> Result<Chunks, String> {
    let mut head = BytesMut::with_capacity(rest.encoded_len() + 32);
    rest.encode(&mut head)
        .expect("a BytesMut grows to hold any message");
    let mut out = Chunks::default();
    for (offset, data) in writes {
        let offset_part = proto::Write {
            offset,
            data: Bytes::new(),
        };
        let data_part = if data.is_empty() {
            0
        } else {
            1 + encoded_len_varint(data.len() as u64) + data.len()
        };
        let write_len = offset_part.encoded_len() + data_part;
        encode_key(field, WireType::LengthDelimited, &mut head);
        encode_varint(write_len as u64, &mut head);
        offset_part
            .encode(&mut head)
            .expect("a BytesMut grows to hold any message");
        if !data.is_empty() {
            encode_key(WRITE_DATA, WireType::LengthDelimited, &mut head);
            encode_varint(data.len() as u64, &mut head);
            out.push(head.split().freeze());
            out.push(data);
        }
    }
    out.push(head.freeze());
    let message = out.len;
    if message > MAX_MESSAGE as u64 {
        return Err(format!(
            "a message of {message} bytes is over the limit of {MAX_MESSAGE}"
        ));
    }
    // gRPC's prefix: not compressed, then the message's length.
    let mut prefix = BytesMut::with_capacity(tonic::codec::HEADER_SIZE);
    prefix.put_u8(0);
    prefix.put_u32(message as u32);
    out.len += prefix.len() as u64;
    out.chunks.push_front(prefix.freeze());
    Ok(out)
}

/// A prepare's request, with its writes' data by reference.
pub(crate) fn prepare(
    mut request: proto::PrepareRequest,
    writes: Vec<(u64, Bytes)>,
) -> Result<Chunks, String> {
    request.writes.clear();
    framed(&request, PREPARE_WRITES, writes)
}

/// A direct write's request, with its data by reference.
pub(crate) fn write_direct(writes: Vec<(u64, Bytes)>) -> Result<Chunks, String> {
    framed(&proto::WriteDirectRequest::default(), DIRECT_WRITES, writes)
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.chunks.pop_front().map(|chunk| {
            self.len -= chunk.len() as u64;
            Ok(Frame::data(chunk))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

/// Sends `body` to `path` (`/strata.brick.v1.Brick/Method`) over `channel` as a unary gRPC
/// call and decodes its reply, as tonic's generated client would.
pub(crate) async fn call<R: WireMessage + Sync>(
    channel: &mut tonic::transport::Channel,
    path: &'static str,
    body: Chunks,
) -> Result<R, tonic::Status> {
    use tonic::client::GrpcService;
    let request = http::Request::builder()
        .method(http::Method::POST)
        .version(http::Version::HTTP_2)
        .uri(path)
        .header(http::header::TE, "trailers")
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .body(tonic::body::Body::new(body))
        .map_err(|e| tonic::Status::internal(format!("building a request: {e}")))?;
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|e| tonic::Status::from_error(Box::new(e)))?;
    let response = channel
        .call(request)
        .await
        .map_err(|e| tonic::Status::from_error(Box::new(e)))?;
    // A reply with only headers carries its status there (gRPC's "Trailers-Only").
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        if status.code() != tonic::Code::Ok {
            return Err(status);
        }
    }
    let status_code = response.status();
    let mut reply = tonic::codec::Streaming::new_response(
        WireDecoder::<R>::default(),
        response.into_body(),
        status_code,
        None,
        Some(MAX_MESSAGE),
    );
    let message = reply
        .message()
        .await?
        .ok_or_else(|| tonic::Status::internal("the reply carried no message"))?;
    // Reads to the end of the reply, where a failed call's status is.
    reply.trailers().await?;
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn writes() -> impl Strategy<Value = Vec<(u64, Vec<u8>)>> {
        proptest::collection::vec(
            (
                prop_oneof![Just(0u64), any::<u64>(), 0u64..1 << 20],
                proptest::collection::vec(any::<u8>(), 0..300),
            ),
            0..5,
        )
    }

    fn decode<M: Message + Default>(chunks: &Chunks) -> M {
        let wire = chunks.concat();
        assert_eq!(wire[0], 0, "not compressed");
        let len = u32::from_be_bytes(wire[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, wire.len() - 5, "the prefix gives the message's length");
        M::decode(&wire[5..]).expect("prost decodes what was built")
    }

    proptest! {
        #[test]
        fn a_prepare_sent_by_reference_decodes_to_the_message_it_was_built_from(
            client in any::<u64>(), seq in any::<u64>(),
            bricks in proptest::collection::vec(any::<u64>(), 0..4),
            fences in proptest::collection::vec((any::<u32>(), any::<i64>()), 0..3),
            tag in any::<u64>(),
            writes in writes(),
        ) {
            let writes: Vec<(u64, Bytes)> =
                writes.into_iter().map(|(o, d)| (o, Bytes::from(d))).collect();
            let request = proto::PrepareRequest {
                id: Some(proto::Interval { client, seq }),
                bricks,
                writes: vec![],
                fences: fences.iter().map(|&(segment, epoch)| proto::Fence { segment, epoch }).collect(),
                tag,
            };
            let built = prepare(request.clone(), writes.clone()).unwrap();
            let expected = proto::PrepareRequest {
                writes: writes.iter().map(|(offset, data)| proto::Write { offset: *offset, data: data.clone() }).collect(),
                ..request
            };
            prop_assert_eq!(decode::<proto::PrepareRequest>(&built), expected.clone());
            // The same length as prost's own encoding: nothing added, nothing left out.
            prop_assert_eq!(built.concat().len() - 5, expected.encoded_len());
        }

        #[test]
        fn a_direct_write_sent_by_reference_decodes_to_its_writes(writes in writes()) {
            let writes: Vec<(u64, Bytes)> =
                writes.into_iter().map(|(o, d)| (o, Bytes::from(d))).collect();
            let built = write_direct(writes.clone()).unwrap();
            let expected = proto::WriteDirectRequest {
                writes: writes.into_iter().map(|(offset, data)| proto::Write { offset, data }).collect(),
            };
            prop_assert_eq!(decode::<proto::WriteDirectRequest>(&built), expected);
        }
    }

    #[test]
    fn the_data_is_sent_as_the_bytes_it_was_given() {
        let data = Bytes::from(vec![9u8; 4096]);
        let built = write_direct(vec![(512, data.clone())]).unwrap();
        assert!(
            built
                .chunks
                .iter()
                .any(|c| c.as_ptr() == data.as_ptr() && c.len() == data.len()),
            "the data went out by reference, not copied"
        );
    }

    #[test]
    fn a_message_over_the_limit_is_refused_before_it_is_sent() {
        let big = Bytes::from(vec![0u8; MAX_MESSAGE]);
        let err = write_direct(vec![(0, big)]).unwrap_err();
        assert!(err.contains("over the limit"), "{err}");
    }
}
