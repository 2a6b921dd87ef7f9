//! Which bricks of a shared volume miss writes, and where: RAIN-10's dirty regions, kept where
//! every host sees them. A host records a brick's regions here *before* it commits an interval
//! without that brick, so no host (this one after a restart, or another) reads them from it;
//! they are cleared region by region as they are copied back.

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::keys::check_name;
use crate::{Coord, CoordError};

/// How often a read-modify-write of a stale record retries when another host changed it
/// between the read and the write.
const ATTEMPTS: usize = 64;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StaleRecord {
    /// Regions (in stripe units of the brick's address space) the brick does not hold current.
    regions: BTreeSet<u64>,
}

/// A stale record saying `brick` misses `regions`, as [`Coord::stale`] reads it.
pub(crate) fn encode(regions: BTreeSet<u64>) -> Vec<u8> {
    serde_json::to_vec(&StaleRecord { regions }).expect("a stale record serialises")
}

impl Coord {
    /// Every stale brick of `volume`, by name, with its dirty regions.
    pub async fn stale(&self, volume: &str) -> Result<BTreeMap<String, BTreeSet<u64>>, CoordError> {
        check_name("volume", volume)?;
        let prefix = self.keys.stale(volume);
        let kvs = self.list(&prefix, "listing stale bricks").await?;
        kvs.iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let record: StaleRecord = crate::catalog::decode(kv)?;
                Ok((key[prefix.len()..].to_string(), record.regions))
            })
            .collect()
    }

    /// Adds `regions` to what `brick` of `volume` misses.
    pub async fn mark_stale(
        &self,
        volume: &str,
        brick: &str,
        regions: &BTreeSet<u64>,
    ) -> Result<(), CoordError> {
        self.change_stale(volume, brick, true, |record| {
            record.regions.extend(regions.iter().copied())
        })
        .await
    }

    /// `regions` were copied back to `brick`; the record goes once none is left.
    pub async fn clear_stale(
        &self,
        volume: &str,
        brick: &str,
        regions: &BTreeSet<u64>,
    ) -> Result<(), CoordError> {
        self.change_stale(volume, brick, false, |record| {
            record.regions.retain(|r| !regions.contains(r))
        })
        .await
    }

    async fn change_stale(
        &self,
        volume: &str,
        brick: &str,
        mark: bool,
        change: impl Fn(&mut StaleRecord),
    ) -> Result<(), CoordError> {
        check_name("volume", volume)?;
        check_name("brick", brick)?;
        let key = format!("{}{brick}", self.keys.stale(volume));
        for _ in 0..ATTEMPTS {
            let (mut record, revision) = match self.get_one(&key, "reading a stale brick").await? {
                Some(kv) => (crate::catalog::decode(&kv)?, kv.mod_revision()),
                None => (StaleRecord::default(), 0),
            };
            let before = record.clone();
            change(&mut record);
            if record == before {
                return Ok(());
            }
            let write = if record.regions.is_empty() {
                TxnOp::delete(key.as_str(), None)
            } else {
                let value = serde_json::to_vec(&record).expect("a stale record serialises");
                TxnOp::put(key.as_str(), value, None)
            };
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(key.as_str(), CompareOp::Equal, revision),
                    Compare::create_revision(self.keys.volume(volume), CompareOp::Greater, 0),
                ])
                .and_then(if mark {
                    // A version being taken compares this key's revision before it seals:
                    // a brick marked even briefly (and copied back since) missed writes.
                    vec![write, TxnOp::put(self.keys.stale_mark(volume), brick, None)]
                } else {
                    vec![write]
                });
            let mut client = self.client.clone();
            if self
                .call("recording a stale brick", client.txn(txn))
                .await?
                .succeeded()
            {
                return Ok(());
            }
            self.volume(volume).await?;
        }
        Err(CoordError::Conflict(format!(
            "stale record of brick {brick:?} of volume {volume:?}"
        )))
    }
}
