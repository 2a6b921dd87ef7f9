//! A compacted extent of a version, as stored on disk: which chain links it replaces and the
//! version's bytes from them as a binary delta against its successor's view of the extent
//! (Clotho's differential compaction, §1.8 of the digest).
//!
//! The delta is a zstd frame compressed with the successor's whole extent as a raw prefix
//! (zstd's `--patch-from` method): matches are found anywhere in the base, and what is new is
//! entropy-coded. Chosen over a hand-written XOR or bsdiff coder because it finds moved data
//! as well as changed bytes, is a well-kept library, and decodes at memory speed.
//!
//! Record layout (little-endian), version 1:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | record version (1) |
//! | 1 | reserved, 0 |
//! | 2 | number of links *n* |
//! | *n* × (4 + 2·*b*) | per link: its epoch, the granules it gave the version as data, the granules it gave as zeros (*b* = ⌈granules per extent / 8⌉ bytes each, bit *g* of byte *g*/8) |
//! | 4 | length of the version's data: 4 KiB per data granule, in granule order |
//! | rest | the zstd frame |
//!
//! The record's crc32c is kept with its location in the `deltas` table, so a damaged record is
//! refused, never decoded into wrong data.

use crate::map::GRANULE;
use crate::versions::{Epoch, Granules};

const RECORD_VERSION: u8 = 1;
const LEVEL: i32 = 3;

/// A chain link a compaction took out: what the version read from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakenLink {
    pub epoch: Epoch,
    /// Granules the version read from it as data.
    pub data: Granules,
    /// Granules the version read from it as zeros (masked).
    pub zeros: Granules,
}

/// A decoded record: the links and the version's bytes of their data granules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub links: Vec<TakenLink>,
    /// 4 KiB per data granule of all links, in granule order.
    pub data: Vec<u8>,
}

impl Decoded {
    /// Every data granule of the links, ascending (the order of `data`).
    pub fn data_granules(&self) -> Vec<u64> {
        let mut all: Vec<u64> = self.links.iter().flat_map(|l| l.data.iter()).collect();
        all.sort_unstable();
        all
    }
}

/// Whether a delta is worth keeping: Clotho keeps an extent whole when its delta is large.
/// Compacted reads cost a second access, so the delta must at least halve the data.
pub fn worth_compacting(data_bytes: usize, record_bytes: usize) -> bool {
    data_bytes > 0 && record_bytes * 2 <= data_bytes
}

fn set_bytes(per_extent: u64) -> usize {
    per_extent.div_ceil(8) as usize
}

fn put_set(out: &mut Vec<u8>, set: &Granules) {
    let mut bytes = vec![0u8; set_bytes(set.len())];
    for g in set.iter() {
        bytes[(g / 8) as usize] |= 1 << (g % 8);
    }
    out.extend_from_slice(&bytes);
}

/// Encodes `links` and the version's `data` (their data granules, in granule order) against
/// `base`, the successor's view of the whole extent.
pub fn encode(links: &[TakenLink], data: &[u8], base: &[u8]) -> Result<Vec<u8>, String> {
    let data_granules: u64 = links.iter().map(|l| l.data.count()).sum();
    assert_eq!(
        data.len() as u64,
        data_granules * GRANULE,
        "data is one 4 KiB per granule"
    );
    let mut out = vec![RECORD_VERSION, 0];
    out.extend_from_slice(&(links.len() as u16).to_le_bytes());
    for link in links {
        out.extend_from_slice(&link.epoch.to_le_bytes());
        put_set(&mut out, &link.data);
        put_set(&mut out, &link.zeros);
    }
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    let mut cctx = zstd::zstd_safe::CCtx::create();
    let code = |e| zstd::zstd_safe::get_error_name(e).to_string();
    cctx.set_parameter(zstd::zstd_safe::CParameter::CompressionLevel(LEVEL))
        .map_err(code)?;
    // The frame's own checksum: a record decoded against the wrong base fails instead of
    // giving other bytes.
    cctx.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
        .map_err(code)?;
    // The window must reach back over the whole base, or zstd sizes it to the data alone
    // and finds no match in most of the base.
    let window = (base.len() + data.len())
        .next_power_of_two()
        .trailing_zeros();
    cctx.set_parameter(zstd::zstd_safe::CParameter::WindowLog(window.clamp(10, 27)))
        .map_err(code)?;
    cctx.ref_prefix(base).map_err(code)?;
    let mut frame = Vec::with_capacity(zstd::zstd_safe::compress_bound(data.len()));
    cctx.compress2(&mut frame, data).map_err(code)?;
    out.extend_from_slice(&frame);
    Ok(out)
}

/// Decodes a record made by [`encode`] with the same `base`, for an extent of
/// `per_extent` granules. Every field is checked; a damaged record is an error.
pub fn decode(record: &[u8], per_extent: u64, base: &[u8]) -> Result<Decoded, String> {
    let short = || format!("delta record of {} bytes is short", record.len());
    let take = |at: usize, len: usize| record.get(at..at + len).ok_or_else(short);
    let header = take(0, 4)?;
    if header[0] != RECORD_VERSION {
        return Err(format!("delta record version {}", header[0]));
    }
    let count = u16::from_le_bytes([header[2], header[3]]) as usize;
    let set_len = set_bytes(per_extent);
    let mut at = 4;
    let mut links = Vec::with_capacity(count);
    let read_set = |bytes: &[u8]| -> Result<Granules, String> {
        let set = Granules::from_fn(per_extent, |g| {
            bytes[(g / 8) as usize] & (1 << (g % 8)) != 0
        });
        let stray = (per_extent..(bytes.len() as u64 * 8))
            .any(|g| bytes[(g / 8) as usize] & (1 << (g % 8)) != 0);
        if stray {
            return Err(format!("a granule past the extent's {per_extent}"));
        }
        Ok(set)
    };
    let mut seen = Granules::empty(per_extent);
    for _ in 0..count {
        let epoch = u32::from_le_bytes(take(at, 4)?.try_into().unwrap());
        let data = read_set(take(at + 4, set_len)?)?;
        let zeros = read_set(take(at + 4 + set_len, set_len)?)?;
        at += 4 + 2 * set_len;
        let mut both = data.clone();
        both.union_with(&zeros);
        if !seen.intersection(&both).is_empty() || !data.intersection(&zeros).is_empty() {
            return Err("a granule given by two links".into());
        }
        seen.union_with(&both);
        links.push(TakenLink { epoch, data, zeros });
    }
    let len = u32::from_le_bytes(take(at, 4)?.try_into().unwrap()) as usize;
    let expected: u64 = links.iter().map(|l| l.data.count() * GRANULE).sum();
    if len as u64 != expected {
        return Err(format!(
            "data of {len} bytes for {expected} bytes of granules"
        ));
    }
    let frame = &record[at + 4..];
    let code = |e| zstd::zstd_safe::get_error_name(e).to_string();
    let mut dctx = zstd::zstd_safe::DCtx::create();
    dctx.ref_prefix(base).map_err(code)?;
    let mut data = Vec::with_capacity(len);
    let got = dctx.decompress(&mut data, frame).map_err(code)?;
    if got != len {
        return Err(format!("delta decodes to {got} bytes, not {len}"));
    }
    Ok(Decoded { links, data })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn granules(len: u64, members: &[u64]) -> Granules {
        Granules::from_fn(len, |g| members.contains(&g))
    }

    #[test]
    fn an_edited_extent_compacts_to_a_small_delta_and_decodes_exactly() {
        let per_extent = 16;
        let base: Vec<u8> = (0..per_extent * GRANULE)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        // The version's granules 2 and 9: the base's, with a few bytes changed.
        let mut data = Vec::new();
        for g in [2u64, 9] {
            let mut granule = base[(g * GRANULE) as usize..((g + 1) * GRANULE) as usize].to_vec();
            granule[100] ^= 0xff;
            granule[3000] = 42;
            data.extend_from_slice(&granule);
        }
        let links = vec![
            TakenLink {
                epoch: 3,
                data: granules(per_extent, &[9]),
                zeros: granules(per_extent, &[4]),
            },
            TakenLink {
                epoch: 1,
                data: granules(per_extent, &[2]),
                zeros: granules(per_extent, &[]),
            },
        ];
        let record = encode(&links, &data, &base).unwrap();
        assert!(
            record.len() < 200,
            "an edit of 4 bytes costs {} bytes",
            record.len()
        );
        assert!(worth_compacting(data.len(), record.len()));
        let decoded = decode(&record, per_extent, &base).unwrap();
        assert_eq!(decoded.links, links);
        assert_eq!(decoded.data, data);
        assert_eq!(decoded.data_granules(), vec![2, 9]);
    }

    #[test]
    fn damage_and_a_wrong_base_are_refused_not_decoded() {
        let per_extent = 8;
        let base = vec![7u8; (per_extent * GRANULE) as usize];
        let links = vec![TakenLink {
            epoch: 0,
            data: granules(per_extent, &[1]),
            zeros: granules(per_extent, &[]),
        }];
        let data = vec![9u8; GRANULE as usize];
        let record = encode(&links, &data, &base).unwrap();
        assert!(decode(&record[..record.len() - 1], per_extent, &base).is_err());
        assert!(decode(&record[..3], per_extent, &base).is_err());
        let mut version = record.clone();
        version[0] = 2;
        assert!(decode(&version, per_extent, &base)
            .unwrap_err()
            .contains("version 2"));
        let mut overlap = record.clone();
        overlap[4 + 4 + 1] = 0b10; // granule 1 as zeros too
        assert!(decode(&overlap, per_extent, &base).is_err());
        // Against another base, a delta that used its base fails its frame checksum rather
        // than give other bytes.
        let noise: Vec<u8> = (0..per_extent * GRANULE)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let mut edited = noise[GRANULE as usize..2 * GRANULE as usize].to_vec();
        edited[10] ^= 1;
        let used_base = encode(&links, &edited, &noise).unwrap();
        assert!(
            used_base.len() < 400,
            "the delta is {} bytes",
            used_base.len()
        );
        let other = vec![8u8; (per_extent * GRANULE) as usize];
        match decode(&used_base, per_extent, &other) {
            Ok(decoded) => assert_eq!(decoded.data, edited),
            Err(e) => assert!(e.contains("hecksum") || e.contains("orrupt"), "{e}"),
        }
        assert!(decode(&used_base, per_extent, &other).is_err());
    }

    #[test]
    fn a_delta_must_halve_the_data() {
        assert!(worth_compacting(8192, 4096));
        assert!(!worth_compacting(8192, 4097));
        assert!(!worth_compacting(0, 0));
    }

    proptest! {
        #[test]
        fn any_links_and_data_round_trip(
            per_extent in 1u64..40,
            seed in any::<u64>(),
            edits in proptest::collection::vec((0usize..4096, any::<u8>()), 0..20),
        ) {
            let base: Vec<u8> = (0..per_extent * GRANULE)
                .map(|i| (i.wrapping_mul(seed | 1) >> 7) as u8)
                .collect();
            let data_set = Granules::from_fn(per_extent, |g| (seed >> (g % 64)) & 1 == 1);
            let zeros = Granules::from_fn(per_extent, |g| !data_set.contains(g) && g % 3 == 0);
            let mut data = Vec::new();
            for g in data_set.iter() {
                let mut granule =
                    base[(g * GRANULE) as usize..((g + 1) * GRANULE) as usize].to_vec();
                for &(at, byte) in &edits {
                    granule[at] = byte;
                }
                data.extend_from_slice(&granule);
            }
            let links = vec![TakenLink { epoch: seed as u32, data: data_set, zeros }];
            let record = encode(&links, &data, &base).unwrap();
            let decoded = decode(&record, per_extent, &base).unwrap();
            prop_assert_eq!(decoded.links, links);
            prop_assert_eq!(decoded.data, data);
        }
    }
}
