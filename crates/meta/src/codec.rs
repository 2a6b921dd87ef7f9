//! Little-endian encoding helpers. Decoding never panics and never trusts a length: every
//! read is bounds-checked and a short or malformed stream becomes a [`DecodeError`] that says
//! what was being read and where.

use bytes::BufMut;

/// Why a metadata stream could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("at byte {at}: {what}")]
pub struct DecodeError {
    pub at: usize,
    pub what: String,
}

/// A bounds-checked reader over a byte stream.
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    pub fn position(&self) -> usize {
        self.at
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub fn error(&self, what: impl Into<String>) -> DecodeError {
        DecodeError {
            at: self.at,
            what: what.into(),
        }
    }

    pub fn bytes(&mut self, len: usize, what: &str) -> Result<&'a [u8], DecodeError> {
        if len > self.remaining() {
            return Err(self.error(format!(
                "{what}: needs {len} bytes, {} left",
                self.remaining()
            )));
        }
        let slice = &self.bytes[self.at..self.at + len];
        self.at += len;
        Ok(slice)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        Ok(self.bytes(1, what)?[0])
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        let bytes = self.bytes(4, what)?;
        Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self, what: &str) -> Result<u64, DecodeError> {
        let bytes = self.bytes(8, what)?;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }

    /// A name: one length byte, then that many UTF-8 bytes.
    pub fn name(&mut self, what: &str) -> Result<String, DecodeError> {
        let len = self.u8(what)? as usize;
        let bytes = self.bytes(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.error(format!("{what}: not UTF-8")))
    }
}

/// Appends a name as [`Reader::name`] reads it. Names are at most 255 bytes.
pub fn put_name(out: &mut Vec<u8>, name: &str) {
    assert!(name.len() <= u8::MAX as usize, "name {name:?} too long");
    out.put_u8(name.len() as u8);
    out.put_slice(name.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounds_checked() {
        let mut out = Vec::new();
        out.put_u32_le(7);
        put_name(&mut out, "map");
        let mut reader = Reader::new(&out);
        assert_eq!(reader.u32("count").unwrap(), 7);
        assert_eq!(reader.name("name").unwrap(), "map");
        assert!(reader.is_empty());
        let error = reader.u64("index").unwrap_err();
        assert_eq!(error.at, 8);
        assert!(error.what.contains("index"), "{error}");
    }
}
