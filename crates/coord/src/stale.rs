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

/// More regions than a stale record may name: they are held in memory one by one (a brick
/// of 4 PiB in 64 KiB units), so a damaged record must not make a host try.
const MAX_REGIONS: u64 = 1 << 26;

/// The regions (in stripe units of the brick's address space) a brick does not hold
/// current, as stored: runs of consecutive regions, so that a replaced brick, stale in its
/// whole share, is one short record and not a list of every region (which, past about
/// 150,000 regions, would not fit in one etcd request).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredStale {
    /// Each region listed: what builds before the runs wrote. Read, never written.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    regions: BTreeSet<u64>,
    /// `(first region, count)`, in order, not touching.
    #[serde(default)]
    runs: Vec<(u64, u64)>,
}

/// A brick's stale regions, in memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct StaleRecord {
    regions: BTreeSet<u64>,
}

impl StaleRecord {
    fn decode(kv: &etcd_client::KeyValue) -> Result<StaleRecord, CoordError> {
        Self::parse(&String::from_utf8_lossy(kv.key()), kv.value())
    }

    fn parse(key: &str, value: &[u8]) -> Result<StaleRecord, CoordError> {
        let damaged = |why: String| CoordError::Damaged {
            key: key.to_string(),
            why,
        };
        let stored: StoredStale =
            serde_json::from_slice(value).map_err(|e| damaged(e.to_string()))?;
        let mut regions = stored.regions;
        let total = (stored.runs.iter()).fold(0u64, |sum, &(_, count)| sum.saturating_add(count));
        if total > MAX_REGIONS {
            return Err(damaged(format!(
                "{total} regions in runs; no brick has more than {MAX_REGIONS}"
            )));
        }
        for (first, count) in stored.runs {
            let end = first
                .checked_add(count)
                .ok_or_else(|| damaged(format!("run of {count} regions from {first} overflows")))?;
            regions.extend(first..end);
        }
        Ok(StaleRecord { regions })
    }
}

/// Runs of consecutive regions, in order.
fn runs(regions: &BTreeSet<u64>) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &region in regions {
        match runs.last_mut() {
            Some((first, count)) if *first + *count == region => *count += 1,
            _ => runs.push((region, 1)),
        }
    }
    runs
}

/// A stale record saying a brick misses `regions`, as [`Coord::stale`] reads it.
pub(crate) fn encode(regions: &BTreeSet<u64>) -> Vec<u8> {
    let stored = StoredStale {
        regions: BTreeSet::new(),
        runs: runs(regions),
    };
    serde_json::to_vec(&stored).expect("a stale record serialises")
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
                let record = StaleRecord::decode(kv)?;
                Ok((key[prefix.len()..].to_string(), record.regions))
            })
            .collect()
    }

    /// Deletes the stale records of bricks no longer in `volume`: a host that still wrote by
    /// the record before a replacement marks the old brick, which nothing reads any more.
    /// Returns their names.
    pub async fn forget_stale_of_departed(&self, volume: &str) -> Result<Vec<String>, CoordError> {
        let stored = self.volume(volume).await?;
        let mut gone = Vec::new();
        for name in self.stale(volume).await?.into_keys() {
            if stored.record.bricks().any(|b| *b == name) {
                continue;
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    self.keys.volume(volume),
                    CompareOp::Equal,
                    stored.revision,
                )])
                .and_then([TxnOp::delete(
                    format!("{}{name}", self.keys.stale(volume)),
                    None,
                )]);
            let mut client = self.client.clone();
            if !(self
                .call("forgetting a stale record", client.txn(txn))
                .await?)
                .succeeded()
            {
                return Err(CoordError::CatalogChanged {
                    volume: volume.to_string(),
                });
            }
            gone.push(name);
        }
        Ok(gone)
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
                Some(kv) => (StaleRecord::decode(&kv)?, kv.mod_revision()),
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
                TxnOp::put(key.as_str(), encode(&record.regions), None)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_stored_as_runs_and_a_whole_share_is_one() {
        let set = |r: &[u64]| r.iter().copied().collect::<BTreeSet<u64>>();
        assert_eq!(runs(&set(&[])), vec![]);
        assert_eq!(
            runs(&set(&[0, 1, 2, 5, 7, 8])),
            vec![(0, 3), (5, 1), (7, 2)]
        );
        let whole: BTreeSet<u64> = (0..1 << 20).collect();
        let encoded = encode(&whole);
        assert_eq!(
            String::from_utf8(encoded).unwrap(),
            r#"{"runs":[[0,1048576]]}"#
        );
    }

    #[test]
    fn records_round_trip_and_older_lists_are_read() {
        let kv = |value: &[u8]| StaleRecord::parse("/strata/t/stale/v/b1", value);
        let regions: BTreeSet<u64> = [3, 4, 9, 10, 11, 40].into_iter().collect();
        let decoded = kv(&encode(&regions)).unwrap();
        assert_eq!(decoded.regions, regions);
        let older = kv(br#"{"regions":[1,2,7]}"#).unwrap();
        assert_eq!(older.regions, [1, 2, 7].into_iter().collect());
        let bad = kv(br#"{"runs":[[18446744073709551615,2]]}"#);
        assert!(matches!(bad, Err(CoordError::Damaged { .. })), "{bad:?}");
        let huge = kv(br#"{"runs":[[0,1099511627776]]}"#);
        assert!(matches!(huge, Err(CoordError::Damaged { .. })), "{huge:?}");
        let unknown = kv(br#"{"dirty":[1]}"#);
        assert!(
            matches!(unknown, Err(CoordError::Damaged { .. })),
            "{unknown:?}"
        );
    }
}
