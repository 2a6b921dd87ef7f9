//! Where a brick keeps what: metadata first, then the home region (one unit of room per unit
//! of the volume's share), then the staging region, the room for prepared writes and for the
//! old data versions keep. Recorded in the metadata store as the `layout` blob, so an open
//! never guesses.

/// The brick format this build writes: 2 maps each unit of the share to where it lives. It
/// also opens format 1 (the share at home, in place), and upgrades it.
pub const LAYOUT_VERSION: u8 = 3;
const ENCODED_LEN: usize = 1 + 8 * 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BrickLayout {
    pub meta_bytes: u64,
    pub home_offset: u64,
    pub home_bytes: u64,
    pub staging_offset: u64,
    pub staging_bytes: u64,
}

impl BrickLayout {
    /// Lays out a device of `device_bytes`: `meta_bytes` of metadata, `home_bytes` of home,
    /// and at least `min_staging` of staging (everything left over goes to staging).
    pub fn plan(
        device_bytes: u64,
        meta_bytes: u64,
        home_bytes: u64,
        min_staging: u64,
    ) -> Result<BrickLayout, String> {
        if meta_bytes == 0 || !meta_bytes.is_multiple_of(1 << 20) {
            return Err(format!(
                "metadata region of {meta_bytes} bytes: use a positive multiple of 1 MiB"
            ));
        }
        if home_bytes == 0 || !home_bytes.is_multiple_of(4096) {
            return Err(format!(
                "home region of {home_bytes} bytes: use a positive multiple of 4096"
            ));
        }
        let home_offset = meta_bytes;
        let staging_offset = (home_offset + home_bytes).next_multiple_of(64 << 10);
        let staging_bytes = device_bytes.saturating_sub(staging_offset) / 4096 * 4096;
        if staging_bytes < min_staging.max(4096) {
            return Err(format!(
                "a device of {device_bytes} bytes leaves {staging_bytes} bytes of staging after \
                 {meta_bytes} of metadata and {home_bytes} of home; at least {} are needed",
                min_staging.max(4096)
            ));
        }
        Ok(BrickLayout {
            meta_bytes,
            home_offset,
            home_bytes,
            staging_offset,
            staging_bytes,
        })
    }

    /// Where the data region (home and staging, and the gap between) ends.
    pub fn data_end(&self) -> u64 {
        self.staging_offset + self.staging_bytes
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENCODED_LEN);
        out.push(LAYOUT_VERSION);
        for field in [
            self.meta_bytes,
            self.home_offset,
            self.home_bytes,
            self.staging_offset,
            self.staging_bytes,
        ] {
            out.extend_from_slice(&field.to_le_bytes());
        }
        out
    }

    /// Decodes and checks a layout of this build's format against the device it was found on.
    pub fn decode(bytes: &[u8], device_bytes: u64) -> Result<BrickLayout, String> {
        match Self::decode_any(bytes, device_bytes)? {
            (layout, LAYOUT_VERSION) => Ok(layout),
            (_, version) => Err(format!(
                "layout version {version} (this build writes {LAYOUT_VERSION})"
            )),
        }
    }

    /// Decodes a layout of format 1, 2 or 3, with its format.
    pub fn decode_any(bytes: &[u8], device_bytes: u64) -> Result<(BrickLayout, u8), String> {
        if bytes.len() != ENCODED_LEN {
            return Err(format!(
                "layout of {} bytes, expected {ENCODED_LEN}",
                bytes.len()
            ));
        }
        if !(1..=LAYOUT_VERSION).contains(&bytes[0]) {
            return Err(format!(
                "layout version {} (this build knows 1 to {LAYOUT_VERSION})",
                bytes[0]
            ));
        }
        let field = |i: usize| u64::from_le_bytes(bytes[1 + 8 * i..9 + 8 * i].try_into().unwrap());
        let layout = BrickLayout {
            meta_bytes: field(0),
            home_offset: field(1),
            home_bytes: field(2),
            staging_offset: field(3),
            staging_bytes: field(4),
        };
        let home_end = layout.home_offset.checked_add(layout.home_bytes);
        let staging_end = layout.staging_offset.checked_add(layout.staging_bytes);
        let ordered = layout.home_offset >= layout.meta_bytes
            && home_end.is_some_and(|end| end <= layout.staging_offset)
            && staging_end.is_some_and(|end| end <= device_bytes)
            && layout.staging_bytes.is_multiple_of(4096)
            && layout.staging_bytes > 0;
        if !ordered {
            return Err(format!(
                "layout {layout:?} does not fit a device of {device_bytes} bytes"
            ));
        }
        Ok((layout, bytes[0]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_regions_follow_each_other_and_staging_takes_the_rest() {
        let layout = BrickLayout::plan(64 << 20, 8 << 20, 40 << 20, 1 << 20).unwrap();
        assert_eq!(layout.home_offset, 8 << 20);
        assert_eq!(layout.staging_offset, 48 << 20);
        assert_eq!(layout.staging_bytes, 16 << 20);
        assert_eq!(BrickLayout::decode(&layout.encode(), 64 << 20), Ok(layout));
        // The device shrank under it: refused, never served short.
        assert!(BrickLayout::decode(&layout.encode(), 63 << 20).is_err());
        let small = BrickLayout::plan(48 << 20, 8 << 20, 40 << 20, 1 << 20).unwrap_err();
        assert!(small.contains("0 bytes of staging"), "{small}");
        assert!(BrickLayout::plan(64 << 20, 8 << 20, 1000, 0).is_err());
        let mut future = layout.encode();
        future[0] = 4;
        assert!(BrickLayout::decode(&future, 64 << 20)
            .unwrap_err()
            .contains("layout version 4 (this build knows 1 to 3)"));
        for format in [1, 2] {
            let mut old = layout.encode();
            old[0] = format;
            assert_eq!(
                BrickLayout::decode_any(&old, 64 << 20),
                Ok((layout, format))
            );
            assert!(BrickLayout::decode(&old, 64 << 20).is_err());
        }
    }
}
