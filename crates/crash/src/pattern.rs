//! Self-describing test data.
//!
//! When a crash test reads the wrong bytes, the first question is "whose bytes are these?".
//! Every 512-byte sector of [`pattern`] data answers it: a 16-byte header names the write and
//! the absolute byte offset the sector was written for, and the other 496 bytes derive from
//! both. So stale data (an older write id), misplaced data (a header whose offset is not where
//! it was read), another volume's data (an id from another model's range, see
//! `DeviceModel::with_first_id`) and garbage (no header, or a body that does not match it)
//! are each recognisable in a failure message.
//!
//! Header layout: bytes 0..4 magic `StPt`; 4..10 the write id (48 bits, little endian);
//! 10..16 the sector number, i.e. byte offset / 512 (48 bits, little endian).

use bytes::{Bytes, BytesMut};

use crate::model::WriteId;

/// Size of a pattern sector (and of the model's unit).
pub const SECTOR_BYTES: usize = 512;
const MAGIC: [u8; 4] = *b"StPt";
const MAX_48: u64 = (1 << 48) - 1;

/// What a sector's pattern header says about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatternHeader {
    pub id: WriteId,
    /// The absolute byte offset the sector was written for.
    pub offset: u64,
    /// Whether the 496 bytes after the header are the ones the header promises.
    pub intact: bool,
}

/// Pattern data of write `id` for `[offset, offset + len)`; both multiples of 512 bytes.
pub fn pattern(id: WriteId, offset: u64, len: usize) -> Bytes {
    assert!(
        offset.is_multiple_of(SECTOR_BYTES as u64) && len.is_multiple_of(SECTOR_BYTES),
        "pattern data is whole 512-byte sectors: [{offset}, +{len})"
    );
    assert!(id.0 <= MAX_48, "pattern write ids have 48 bits: {id}");
    let mut out = BytesMut::zeroed(len);
    for (i, sector) in out.chunks_exact_mut(SECTOR_BYTES).enumerate() {
        fill_sector(id, offset / SECTOR_BYTES as u64 + i as u64, sector);
    }
    out.freeze()
}

fn fill_sector(id: WriteId, sector_number: u64, out: &mut [u8]) {
    debug_assert_eq!(out.len(), SECTOR_BYTES);
    out[..4].copy_from_slice(&MAGIC);
    out[4..10].copy_from_slice(&id.0.to_le_bytes()[..6]);
    out[10..16].copy_from_slice(&sector_number.to_le_bytes()[..6]);
    let mut state = id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ sector_number.rotate_left(29);
    for word in out[16..].chunks_exact_mut(8) {
        word.copy_from_slice(&splitmix64(&mut state).to_le_bytes());
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn le48(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word[..6].copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

/// Decodes the header of one 512-byte sector, if it has one.
pub fn decode_pattern(sector: &[u8]) -> Option<PatternHeader> {
    if sector.len() < 16 || sector[..4] != MAGIC {
        return None;
    }
    let id = WriteId(le48(&sector[4..10]));
    let sector_number = le48(&sector[10..16]);
    let intact = sector.len() == SECTOR_BYTES && {
        let mut expected = [0u8; SECTOR_BYTES];
        fill_sector(id, sector_number, &mut expected);
        expected[..] == *sector
    };
    Some(PatternHeader {
        id,
        offset: sector_number * SECTOR_BYTES as u64,
        intact,
    })
}

/// One line about a sector read at `offset`: its first 16 bytes, and what they decode as.
pub fn describe_sector(offset: u64, sector: &[u8]) -> String {
    let head: Vec<String> = sector.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let head = head.join(" ");
    let meaning = if sector.iter().all(|&b| b == 0) {
        "all zeros".to_string()
    } else {
        match decode_pattern(sector) {
            Some(header) => {
                let place = if header.offset == offset {
                    "this sector".to_string()
                } else {
                    format!("byte offset {} (misplaced)", header.offset)
                };
                let body = if header.intact {
                    "body intact"
                } else {
                    "body corrupted"
                };
                format!("pattern of {} for {place}, {body}", header.id)
            }
            None => "not pattern data (garbage?)".to_string(),
        }
    };
    format!("{head} ({meaning})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sector_names_its_write_and_offset() {
        let data = pattern(WriteId(77), 4096, 1536);
        for (i, sector) in data.chunks(512).enumerate() {
            let header = decode_pattern(sector).expect("pattern header");
            assert_eq!(header.id, WriteId(77));
            assert_eq!(header.offset, 4096 + 512 * i as u64);
            assert!(header.intact);
        }
        assert_ne!(data[..512], data[512..1024]);
        assert_ne!(pattern(WriteId(78), 4096, 512), data.slice(..512));
        assert_eq!(pattern(WriteId(77), 4608, 512), data.slice(512..1024));
    }

    #[test]
    fn damage_and_strangers_are_described() {
        let mut sector = pattern(WriteId(5), 1024, 512).to_vec();
        assert!(describe_sector(1024, &sector).contains("pattern of w5 for this sector"));
        assert!(describe_sector(2048, &sector).contains("byte offset 1024 (misplaced)"));
        sector[300] ^= 1;
        assert!(describe_sector(1024, &sector).contains("body corrupted"));
        assert!(describe_sector(0, &[0; 512]).contains("all zeros"));
        assert!(describe_sector(0, &[7; 512]).contains("garbage"));
    }
}
