//! Wire constants and message layouts of the NBD protocol, from the specification
//! (NetworkBlockDevice/nbd, doc/proto.md). What the server and the client speak is here.

use bytes::{BufMut, BytesMut};

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// What an oldstyle server sends where a newstyle one sends IHAVEOPT.
pub const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub const REP_ERR_POLICY: u32 = REP_ERR | 2;
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR | 7;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR | 9;

/// Whether an option reply type is an error.
pub fn is_rep_err(reply: u32) -> bool {
    reply & REP_ERR != 0
}

/// Information types in NBD_OPT_INFO / NBD_OPT_GO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply chunk flags and types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;
/// The length of a simple reply header and of a structured reply chunk header.
pub const SIMPLE_REPLY_HEADER_LEN: usize = 16;
pub const CHUNK_HEADER_LEN: usize = 20;

/// `base:allocation` status flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// The only metadata context we serve, and its id on this server.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Strings (export names, messages) must not exceed this (spec: "MUST be no longer than 4096").
pub const MAX_STRING_LEN: usize = 4096;
/// The largest option payload we read. INFO/GO with a 4096-byte name and a few info requests,
/// or SET_META_CONTEXT with a handful of queries, fit easily.
pub const MAX_OPTION_LEN: u32 = 64 * 1024;

pub const REQUEST_HEADER_LEN: usize = 28;

/// A transmission-phase request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    /// Parses a header, or returns the bad magic number.
    pub fn parse(header: &[u8; REQUEST_HEADER_LEN]) -> Result<Request, u32> {
        let magic = u32::from_be_bytes(header[0..4].try_into().expect("4 bytes"));
        if magic != REQUEST_MAGIC {
            return Err(magic);
        }
        Ok(Request {
            flags: u16::from_be_bytes([header[4], header[5]]),
            kind: u16::from_be_bytes([header[6], header[7]]),
            handle: u64::from_be_bytes(header[8..16].try_into().expect("8 bytes")),
            offset: u64::from_be_bytes(header[16..24].try_into().expect("8 bytes")),
            length: u32::from_be_bytes(header[24..28].try_into().expect("4 bytes")),
        })
    }

    pub fn encode(&self, out: &mut BytesMut) {
        out.put_u32(REQUEST_MAGIC);
        out.put_u16(self.flags);
        out.put_u16(self.kind);
        out.put_u64(self.handle);
        out.put_u64(self.offset);
        out.put_u32(self.length);
    }
}

/// Appends a simple reply header.
pub fn put_simple_reply(out: &mut BytesMut, error: u32, handle: u64) {
    out.put_u32(SIMPLE_REPLY_MAGIC);
    out.put_u32(error);
    out.put_u64(handle);
}

/// Appends a structured reply chunk header announcing `length` bytes of payload.
pub fn put_chunk_header(out: &mut BytesMut, flags: u16, kind: u16, handle: u64, length: u32) {
    out.put_u32(STRUCTURED_REPLY_MAGIC);
    out.put_u16(flags);
    out.put_u16(kind);
    out.put_u64(handle);
    out.put_u32(length);
}

/// Appends a complete NBD_REPLY_TYPE_ERROR chunk (always the final chunk here).
pub fn put_error_chunk(out: &mut BytesMut, handle: u64, error: u32, message: &str) {
    let message = truncate_utf8(message, MAX_STRING_LEN);
    let payload_len = 4 + 2 + message.len();
    put_chunk_header(
        out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        handle,
        payload_len as u32,
    );
    out.put_u32(error);
    out.put_u16(message.len() as u16);
    out.put_slice(message.as_bytes());
}

/// Appends a client's option header announcing `length` bytes of option data.
pub fn put_option(out: &mut BytesMut, option: u32, length: u32) {
    out.put_u64(IHAVEOPT);
    out.put_u32(option);
    out.put_u32(length);
}

/// Appends an option reply header.
pub fn put_option_reply(out: &mut BytesMut, option: u32, reply: u32, length: u32) {
    out.put_u64(OPTION_REPLY_MAGIC);
    out.put_u32(option);
    out.put_u32(reply);
    out.put_u32(length);
}

/// Cuts `text` to at most `max` bytes on a character boundary.
pub fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips_and_bad_magic_is_reported() {
        let request = Request {
            flags: CMD_FLAG_FUA,
            kind: CMD_WRITE,
            handle: 0xdead_beef,
            offset: 1 << 40,
            length: 4096,
        };
        let mut out = BytesMut::new();
        request.encode(&mut out);
        assert_eq!(out.len(), REQUEST_HEADER_LEN);
        let header: [u8; REQUEST_HEADER_LEN] = out[..].try_into().unwrap();
        assert_eq!(Request::parse(&header), Ok(request));
        let mut bad = header;
        bad[0] = 0;
        assert_eq!(Request::parse(&bad), Err(0x0060_9513));
    }

    #[test]
    fn error_chunk_length_matches_its_payload() {
        let mut out = BytesMut::new();
        put_error_chunk(&mut out, 7, 22, "bad offset");
        assert_eq!(out.len(), 20 + 4 + 2 + 10);
        let length = u32::from_be_bytes(out[16..20].try_into().unwrap());
        assert_eq!(length as usize, out.len() - 20);
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate_utf8("héllo", 2), "h");
        assert_eq!(truncate_utf8("abc", 10), "abc");
    }
}
