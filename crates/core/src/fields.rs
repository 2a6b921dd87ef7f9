//! Reading a record's little-endian fields in order, for the decoders of what layers keep on
//! disk: every read is bounds-checked and a short record says where it fell short.

pub struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Fields<'a> {
    /// `what` names the record in errors ("versions record").
    pub fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Fields { bytes, at: 0, what }
    }

    pub fn take(&mut self, len: usize) -> Result<&'a [u8], String> {
        let slice = self
            .bytes
            .get(self.at..self.at.saturating_add(len))
            .ok_or_else(|| format!("{} is short at byte {}", self.what, self.at))?;
        self.at += len;
        Ok(slice)
    }

    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    pub fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    /// A name: one length byte, then UTF-8.
    pub fn name(&mut self) -> Result<String, String> {
        let len = self.u8()? as usize;
        String::from_utf8(self.take(len)?.to_vec())
            .map_err(|_| format!("a name in the {} is not UTF-8", self.what))
    }

    /// A u32 count of items of `size` bytes each, checked against the bytes left, so a
    /// damaged count cannot make a decoder allocate beyond the record.
    pub fn count(&mut self, size: usize) -> Result<usize, String> {
        let count = self.u32()? as usize;
        if count.saturating_mul(size) > self.remaining() {
            return Err(format!(
                "a count of {count} overruns the {} at byte {}",
                self.what, self.at
            ));
        }
        Ok(count)
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_records_say_where() {
        let mut fields = Fields::new(&[1, 2, 0, 0, 0, 9], "test record");
        assert_eq!(fields.u8(), Ok(1));
        assert_eq!(fields.u32(), Ok(2));
        assert_eq!(fields.u64(), Err("test record is short at byte 5".into()));
        let mut counted = Fields::new(&[3, 0, 0, 0, 1, 2], "test record");
        assert!(counted.count(1).is_err());
        let mut huge = Fields::new(&[0xff; 8], "r");
        assert!(huge.take(usize::MAX).is_err());
    }
}
