//! A brick's share read from its durable metadata, without opening the brick: for an
//! administrator (`strata brick dump`) and for tests. Nothing is written, so it may run while
//! a server has the brick open; it then shows what the last durable metadata commit says,
//! which every acknowledged commit is in.

use std::collections::BTreeMap;

use bytes::BytesMut;
use strata_core::{BlockError, DeviceRef, Result};

use crate::layout::BrickLayout;
use crate::store::versions::parse_table_name;
use crate::store::{Placement, LAYOUT_BLOB, MAP_TABLE, OWNER};

/// The whole share of the brick on `device` (or version `version` of it), as its durable
/// metadata says.
pub async fn read_share(device: &DeviceRef, version: Option<u64>) -> Result<BytesMut> {
    let recovered = strata_meta::recover(device.as_ref(), 0)
        .await
        .map_err(|e| BlockError::Corrupt(format!("brick: its metadata does not recover: {e}")))?;
    if recovered.superblock.owner != OWNER {
        return Err(BlockError::InvalidArgument(format!(
            "the device's metadata belongs to {:?}, not to a brick",
            recovered.superblock.owner
        )));
    }
    let state = &recovered.state;
    let layout_blob = state
        .id(LAYOUT_BLOB)
        .and_then(|id| state.blob(id))
        .ok_or_else(|| BlockError::Corrupt("brick: no layout".into()))?;
    let (layout, format) = BrickLayout::decode_any(layout_blob, device.geometry().size)
        .map_err(|why| BlockError::Corrupt(format!("brick: {why}")))?;
    let runs = match state.id(MAP_TABLE) {
        // Format 1 keeps the share in place, and has no versions.
        None if format == 1 && version.is_none() => vec![(layout.home_offset, layout.home_bytes)],
        None => return Err(BlockError::Corrupt("brick: no map".into())),
        Some(map) => {
            let versions: BTreeMap<u64, _> = state
                .objects()
                .filter_map(|(id, body)| Some((parse_table_name(&body.name)?, id)))
                .collect();
            if let Some(number) = version.filter(|n| !versions.contains_key(n)) {
                return Err(BlockError::InvalidArgument(format!(
                    "the brick keeps no version {number}"
                )));
            }
            let place = Placement {
                state,
                map,
                versions: &versions,
                home_offset: layout.home_offset,
            };
            place.locate(version, 0, layout.home_bytes)
        }
    };
    let mut share = BytesMut::with_capacity(layout.home_bytes as usize);
    let max = u64::from(device.geometry().max_io);
    for (start, len) in runs {
        let mut at = 0;
        while at < len {
            let piece = (len - at).min(max);
            share.extend_from_slice(&device.read(start + at, piece as usize).await?);
            at += piece;
        }
    }
    Ok(share)
}
