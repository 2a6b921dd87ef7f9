//! The brick service's codec: prost's encoding, with buffers sized for the data a message
//! carries.
//!
//! tonic's prost codec starts every message's buffer at 8 KiB. A 1 MiB prepare then grew its
//! buffers by reallocation on both ends, and each growth copied what had arrived so far: the
//! sender's buffer grew step by step as prost wrote the data in, and the receiver's, having
//! taken the first 1 MiB frame, grew again to fit the whole message after it (tonic reserves
//! the message's length beyond what it already holds). A profile of a host and two bricks at
//! 16 writers found these copies in 8 % of all the CPU they used.
//!
//! So the encoder reserves a message's whole encoded length before writing it, and messages
//! that carry block data start their receive buffer large enough for one frame and a whole
//! 1 MiB message behind it. The others keep tonic's default: a large buffer per decision or
//! status call would be memory held for nothing.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use super::proto;
use super::MAX_FRAME;

/// tonic's own default, for messages without block data.
const SMALL_BUFFER: usize = 8 << 10;

/// The yield threshold tonic uses by default: an encoder hands its buffer on once it holds this
/// much, which for the unary calls here means after every message.
const YIELD_THRESHOLD: usize = 32 << 10;

/// A receive buffer for a message with block data: its first frame, and room after it for a
/// whole message of 1 MiB of data with its fields, so no 1 MiB message reallocates.
pub(crate) const DATA_BUFFER: usize = MAX_FRAME as usize + (1 << 20) + (64 << 10);

/// How large a receive buffer a message type starts with.
pub trait WireMessage: Message + Default + Send + 'static {
    /// The initial capacity of the buffer a message of this type is received into.
    const RECEIVE_BUFFER: usize = SMALL_BUFFER;
}

macro_rules! small_messages {
    ($($name:ident),* $(,)?) => { $(impl WireMessage for proto::$name {})* };
}

small_messages!(
    VersionRequest,
    RollbackRequest,
    VersionsReply,
    DeleteVersionReply,
    ReadVersionRequest,
    Empty,
    Interval,
    PrepareReply,
    DecideRequest,
    FenceClientRequest,
    DecideReply,
    StatusReply,
    InDoubtReply,
    ForgetRequest,
    ReadRequest,
    DescribeReply,
    // The brick takes these two bodies itself, frame by frame (`by_reference`): tonic only
    // decodes the empty body left in their place, and a large buffer would be an allocation
    // per call for nothing.
    PrepareRequest,
    WriteDirectRequest,
);

impl WireMessage for proto::ReadReply {
    const RECEIVE_BUFFER: usize = DATA_BUFFER;
}

/// The codec `build.rs` names for the brick service, on both ends.
#[derive(Debug, Clone)]
pub struct WireCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for WireCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T: WireMessage, U: WireMessage> Codec for WireCodec<T, U> {
    type Encode = T;
    type Decode = U;
    type Encoder = WireEncoder<T>;
    type Decoder = WireDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        WireEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        WireDecoder(PhantomData)
    }
}

/// Writes a message into a buffer reserved for all of it at once.
#[derive(Debug)]
pub struct WireEncoder<T>(PhantomData<T>);

impl<T: WireMessage> Encoder for WireEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(SMALL_BUFFER, YIELD_THRESHOLD)
    }
}

/// Reads a message from a buffer that started at its type's `RECEIVE_BUFFER`.
#[derive(Debug)]
pub struct WireDecoder<U>(PhantomData<U>);

impl<U> Default for WireDecoder<U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<U: WireMessage> Decoder for WireDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|e| Status::internal(format!("decoding a message: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(U::RECEIVE_BUFFER, YIELD_THRESHOLD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// tonic holds the first frame, then reserves the whole message's length beyond it: a
    /// read of 1 MiB must fit both without growing, or its data is copied a second time.
    /// Prepares and direct writes are received by reference, so tonic's buffer for them
    /// stays small.
    #[test]
    fn a_one_mib_read_reply_fits_its_receive_buffer_behind_a_full_frame() {
        let message = proto::ReadReply {
            data: Bytes::from(vec![7u8; 1 << 20]),
        }
        .encoded_len();
        let framed = tonic::codec::HEADER_SIZE + message;
        assert!(
            MAX_FRAME as usize + framed <= <proto::ReadReply as WireMessage>::RECEIVE_BUFFER,
            "a frame of {MAX_FRAME} and a message of {framed} bytes outgrow {DATA_BUFFER}"
        );
        for small in [
            <proto::PrepareRequest as WireMessage>::RECEIVE_BUFFER,
            <proto::WriteDirectRequest as WireMessage>::RECEIVE_BUFFER,
            <proto::DecideRequest as WireMessage>::RECEIVE_BUFFER,
        ] {
            assert_eq!(small, SMALL_BUFFER);
        }
    }
}
