//! Requests that carry block data, sent and received with the data by reference.
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
//!
//! On the brick, tonic would gather each message's frames into one buffer before decoding it:
//! 11 % of a brick's CPU at 16 writers. `ReceiveByReference`, in front of the service, takes
//! the body of these two calls itself and decodes the message from the frames as HTTP/2 gave
//! them: a write's data that lies within one frame (the sender above gives it a frame of its
//! own) is a slice of that frame, not a copy. The handler finds the message in the request's
//! extensions, and tonic decodes an empty body in its place.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;

use super::codec::{WireDecoder, WireMessage};
use super::proto;
use super::MAX_MESSAGE;

/// The paths of the two calls, as `proto/brick.proto` names them.
pub(crate) const PREPARE: &str = "/strata.brick.v1.Brick/Prepare";
pub(crate) const WRITE_DIRECT: &str = "/strata.brick.v1.Brick/WriteDirect";

/// The field number of `writes` in `PrepareRequest`, and of `data` in `Write`
/// (`proto/brick.proto`).
const PREPARE_WRITES: u32 = 3;
const DIRECT_WRITES: u32 = 1;
const WRITE_DATA: u32 = 2;

/// A message's bytes as a list of chunks, either way: built here to be sent (the framing, and
/// each write's data as it was given), or received as HTTP/2's frames and read as one buffer,
/// where a read of a run of bytes within one chunk (`copy_to_bytes`, which prost uses for
/// `bytes` fields) is a slice of it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Chunks {
    chunks: VecDeque<Bytes>,
    len: usize,
}

impl Chunks {
    pub(crate) fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.len += chunk.len();
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
fn framed(rest: &impl Message, field: u32, writes: Vec<(u64, Bytes)>) -> Result<Chunks, String> {
    let mut head = BytesMut::with_capacity(rest.encoded_len() + 32);
    rest.encode(&mut head)
        .expect("a BytesMut grows to hold any message");
    let mut out = Chunks::default();
    for (offset, data) in writes {
        let offset_part = proto::Write {
            offset,
            data: Bytes::new(),
        };
        // proto3 leaves an empty `bytes` field out, as prost does.
        let data_part = if data.is_empty() {
            0
        } else {
            prost::encoding::bytes::encoded_len(WRITE_DATA, &data)
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
    if message > MAX_MESSAGE {
        return Err(format!(
            "a message of {message} bytes is over the limit of {MAX_MESSAGE}"
        ));
    }
    // gRPC's prefix: not compressed, then the message's length.
    let mut prefix = BytesMut::with_capacity(tonic::codec::HEADER_SIZE);
    prefix.put_u8(0);
    prefix.put_u32(message as u32);
    out.len += prefix.len();
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
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.chunks.pop_front().map(|chunk| {
            self.len -= chunk.len();
            Ok(Frame::data(chunk))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len as u64)
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

impl Buf for Chunks {
    fn remaining(&self) -> usize {
        self.len
    }

    fn chunk(&self) -> &[u8] {
        self.chunks.front().map_or(&[], |c| &c[..])
    }

    fn advance(&mut self, mut n: usize) {
        assert!(n <= self.len, "advance past the end");
        self.len -= n;
        while n > 0 {
            let front = self
                .chunks
                .front_mut()
                .expect("remaining counts the chunks");
            if n < front.len() {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.chunks.pop_front();
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(len <= self.len, "copy_to_bytes past the end");
        match self.chunks.front_mut() {
            Some(front) if len <= front.len() => {
                self.len -= len;
                let out = front.split_to(len);
                if front.is_empty() {
                    self.chunks.pop_front();
                }
                out
            }
            _ => {
                let mut out = BytesMut::with_capacity(len);
                out.put((&mut *self).take(len));
                out.freeze()
            }
        }
    }
}

/// One gRPC message from a request body's frames: its 5-byte prefix checked, the message
/// decoded with its `bytes` fields sliced from the frames. Exactly one message, uncompressed.
pub(crate) fn decode_message<M: Message + Default>(mut frames: Chunks) -> Result<M, String> {
    if frames.remaining() < tonic::codec::HEADER_SIZE {
        return Err(format!(
            "a request of {} bytes is shorter than gRPC's prefix",
            frames.remaining()
        ));
    }
    if frames.get_u8() != 0 {
        return Err("a compressed request (none was offered)".to_string());
    }
    let len = frames.get_u32() as usize;
    if len > MAX_MESSAGE {
        return Err(format!(
            "a message of {len} bytes is over the limit of {MAX_MESSAGE}"
        ));
    }
    if frames.remaining() != len {
        return Err(format!(
            "the prefix gives {len} bytes and the body holds {}: one message per call",
            frames.remaining()
        ));
    }
    M::decode(frames).map_err(|e| format!("decoding the request: {e}"))
}

/// A message `ReceiveByReference` decoded, left for the handler in the request's extensions.
#[derive(Clone, Debug)]
pub(crate) struct Decoded<M>(pub(crate) M);

/// gRPC's encoding of an empty message: the body tonic decodes in place of one taken here.
const EMPTY_MESSAGE: [u8; 5] = [0; 5];

/// Takes the bodies of `Prepare` and `WriteDirect` off the service below and decodes them by
/// reference (see the module's comment); every other call passes through untouched.
#[derive(Clone, Debug)]
pub(crate) struct ReceiveByReference<S>(pub(crate) S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for ReceiveByReference<S> {
    const NAME: &'static str = S::NAME;
}

type HttpRequest = http::Request<tonic::body::Body>;
type HttpResponse = http::Response<tonic::body::Body>;

impl<S> tonic::codegen::Service<HttpRequest> for ReceiveByReference<S>
where
    S: tonic::codegen::Service<HttpRequest, Response = HttpResponse, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: HttpRequest) -> Self::Future {
        // The service that was polled ready serves this call; a clone waits for the next.
        let clone = self.0.clone();
        let mut inner = std::mem::replace(&mut self.0, clone);
        let path = request.uri().path();
        let taken: Option<fn(HttpRequest) -> Taken> = if path == PREPARE {
            Some(take::<proto::PrepareRequest>)
        } else if path == WRITE_DIRECT {
            Some(take::<proto::WriteDirectRequest>)
        } else {
            None
        };
        Box::pin(async move {
            let request = match taken {
                None => request,
                Some(take) => match take(request).await {
                    Ok(request) => request,
                    Err(status) => {
                        tracing::warn!(%status, "brick request refused");
                        return Ok(status.into_http());
                    }
                },
            };
            inner.call(request).await
        })
    }
}

type Taken = Pin<Box<dyn Future<Output = Result<HttpRequest, tonic::Status>> + Send>>;

/// Reads `request`'s body to its end, decodes it as an `M`, and gives back the request with
/// the message in its extensions and an empty message as its body.
fn take<M: Message + Default + Clone + Send + Sync + 'static>(request: HttpRequest) -> Taken {
    Box::pin(async move {
        let (mut parts, mut body) = request.into_parts();
        let mut frames = Chunks::default();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame?;
            if let Ok(data) = frame.into_data() {
                frames.push(data);
                if frames.remaining() > tonic::codec::HEADER_SIZE + MAX_MESSAGE {
                    return Err(tonic::Status::out_of_range(format!(
                        "a request over the limit of {MAX_MESSAGE} bytes"
                    )));
                }
            }
        }
        let message: M = decode_message(frames).map_err(tonic::Status::invalid_argument)?;
        parts.extensions.insert(Decoded(message));
        let mut empty = Chunks::default();
        empty.push(Bytes::from_static(&EMPTY_MESSAGE));
        Ok(http::Request::from_parts(
            parts,
            tonic::body::Body::new(empty),
        ))
    })
}

/// The message `ReceiveByReference` decoded for this request, or, for a request that did not
/// pass through it, the one tonic decoded.
pub(crate) fn received<M: Send + Sync + Clone + 'static>(mut request: tonic::Request<M>) -> M {
    match request.extensions_mut().remove::<Decoded<M>>() {
        Some(Decoded(message)) => message,
        None => request.into_inner(),
    }
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
            commits in proptest::collection::vec(any::<u64>(), 0..3),
        ) {
            let writes: Vec<(u64, Bytes)> =
                writes.into_iter().map(|(o, d)| (o, Bytes::from(d))).collect();
            let request = proto::PrepareRequest {
                id: Some(proto::Interval { client, seq }),
                bricks,
                writes: vec![],
                fences: fences.iter().map(|&(segment, epoch)| proto::Fence { segment, epoch }).collect(),
                tag,
                commits: commits.iter().map(|&seq| proto::Interval { client, seq }).collect(),
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

    fn received_in(wire: &[u8], cuts: &[usize]) -> Chunks {
        let mut frames = Chunks::default();
        let mut at = 0;
        for &cut in cuts {
            let cut = cut.min(wire.len()).max(at);
            frames.push(Bytes::copy_from_slice(&wire[at..cut]));
            at = cut;
        }
        frames.push(Bytes::copy_from_slice(&wire[at..]));
        frames
    }

    proptest! {
        #[test]
        fn a_prepare_cut_into_any_frames_decodes_to_what_prost_encoded(
            seq in any::<u64>(),
            writes in writes(),
            mut cuts in proptest::collection::vec(0usize..2000, 0..6),
        ) {
            let request = proto::PrepareRequest {
                id: Some(proto::Interval { client: 7, seq }),
                bricks: vec![0, 1],
                writes: writes.into_iter().map(|(offset, data)| proto::Write { offset, data: Bytes::from(data) }).collect(),
                fences: vec![],
                tag: 3,
                commits: vec![proto::Interval { client: 7, seq: 1 }],
            };
            let mut wire = vec![0u8];
            wire.extend_from_slice(&(request.encoded_len() as u32).to_be_bytes());
            wire.extend_from_slice(&request.encode_to_vec());
            cuts.sort_unstable();
            let decoded: proto::PrepareRequest = decode_message(received_in(&wire, &cuts)).unwrap();
            prop_assert_eq!(decoded, request);
        }
    }

    #[test]
    fn data_sent_in_a_frame_of_its_own_is_received_as_a_slice_of_that_frame() {
        let data = Bytes::from(vec![5u8; 1 << 20]);
        let sent = prepare(
            proto::PrepareRequest {
                id: Some(proto::Interval { client: 1, seq: 2 }),
                ..Default::default()
            },
            vec![(4096, data.clone())],
        )
        .unwrap();
        let mut frames = Chunks::default();
        for chunk in &sent.chunks {
            frames.push(chunk.clone());
        }
        let decoded: proto::PrepareRequest = decode_message(frames).unwrap();
        assert_eq!(decoded.writes.len(), 1);
        assert_eq!(decoded.writes[0].offset, 4096);
        assert_eq!(decoded.writes[0].data, data);
        assert_eq!(
            decoded.writes[0].data.as_ptr(),
            data.as_ptr(),
            "sliced, not copied"
        );
    }

    #[test]
    fn a_bad_prefix_or_length_is_refused_with_what_was_wrong() {
        let message = proto::WriteDirectRequest::default().encode_to_vec();
        let refused = |wire: Vec<u8>| {
            decode_message::<proto::WriteDirectRequest>(received_in(&wire, &[2])).unwrap_err()
        };
        assert!(refused(vec![0, 0, 0]).contains("shorter than gRPC's prefix"));
        assert!(refused(vec![1, 0, 0, 0, 0]).contains("compressed"));
        assert!(refused(vec![0, 0, 0, 0, 9, 1]).contains("one message per call"));
        let over = (MAX_MESSAGE as u32 + 1).to_be_bytes();
        assert!(refused(vec![0, over[0], over[1], over[2], over[3]]).contains("over the limit"));
        // A message whose field claims more bytes than it holds.
        assert!(refused(vec![0, 0, 0, 0, 3, 0x0a, 0x05, 0x08]).contains("decoding the request"));
        let mut fine = vec![0, 0, 0, 0, message.len() as u8];
        fine.extend_from_slice(&message);
        assert!(decode_message::<proto::WriteDirectRequest>(received_in(&fine, &[1, 3])).is_ok());
    }
}
