//! The catalog: the bricks of a cluster and the shared volumes laid over them.
//!
//! Records are JSON with a format number, created only where no record is, and changed only
//! against the revision they were read at. A record that does not parse, or has a format this
//! build does not know, is reported as damaged, never skipped: a volume that vanished from a
//! listing would look free to re-create over its bricks.

use std::collections::BTreeSet;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::keys::check_name;
use crate::{Coord, CoordError};

/// The record format this build writes and reads.
pub const RECORD_FORMAT: u32 = 1;

/// A brick: a block device one Strata server exports to the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrickRecord {
    pub format: u32,
    pub name: String,
    /// Where its server listens (`host:port`).
    pub address: String,
    pub size_bytes: u64,
}

/// A shared volume: striped in `unit_bytes` units over mirror sets of bricks (one brick per
/// set is RAIN-0, two or more RAIN-10), its locks served in `segment_bytes` segments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeRecord {
    pub format: u32,
    pub name: String,
    pub size_bytes: u64,
    pub unit_bytes: u64,
    pub segment_bytes: u64,
    pub mirror_sets: Vec<Vec<String>>,
}

impl VolumeRecord {
    /// Whether the layout is one Strata can serve; the message names the first thing wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.format != RECORD_FORMAT {
            return Err(format!(
                "record format {} (this build knows {RECORD_FORMAT})",
                self.format
            ));
        }
        if self.size_bytes == 0 || !self.size_bytes.is_multiple_of(4096) {
            return Err(format!(
                "size {} is not a positive multiple of 4096",
                self.size_bytes
            ));
        }
        for (what, bytes) in [("unit", self.unit_bytes), ("segment", self.segment_bytes)] {
            if bytes < 4096 || !bytes.is_power_of_two() {
                return Err(format!(
                    "{what} of {bytes} bytes: use a power of two of at least 4096"
                ));
            }
        }
        if self.mirror_sets.is_empty() {
            return Err("no mirror set: a volume needs at least one brick".into());
        }
        let copies = self.mirror_sets[0].len();
        if copies == 0 || self.mirror_sets.iter().any(|set| set.len() != copies) {
            return Err("every mirror set needs the same number (at least one) of bricks".into());
        }
        let mut seen = BTreeSet::new();
        for brick in self.mirror_sets.iter().flatten() {
            if !seen.insert(brick) {
                return Err(format!(
                    "brick {brick:?} appears twice: its copies would not be independent"
                ));
            }
        }
        Ok(())
    }

    pub fn copies(&self) -> usize {
        self.mirror_sets.first().map_or(0, Vec::len)
    }

    /// The bytes each brick must hold: its set's share of the units, rounded up to whole ones.
    pub fn bytes_per_brick(&self) -> u64 {
        let units = self.size_bytes.div_ceil(self.unit_bytes);
        units.div_ceil(self.mirror_sets.len() as u64) * self.unit_bytes
    }

    /// How many lock segments the volume has.
    pub fn segments(&self) -> u64 {
        self.size_bytes.div_ceil(self.segment_bytes)
    }

    pub fn bricks(&self) -> impl Iterator<Item = &String> {
        self.mirror_sets.iter().flatten()
    }
}

/// A record as stored, with the etcd revision it was last changed at (what an update or a
/// removal must name, so it cannot undo a change it never saw).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored<T> {
    pub record: T,
    pub revision: i64,
}

pub(crate) fn decode<T: DeserializeOwned>(kv: &KeyValue) -> Result<T, CoordError> {
    serde_json::from_slice(kv.value()).map_err(|e| CoordError::Damaged {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        why: e.to_string(),
    })
}

fn decode_volume(kv: &KeyValue) -> Result<Stored<VolumeRecord>, CoordError> {
    let record: VolumeRecord = decode(kv)?;
    record.validate().map_err(|why| CoordError::Damaged {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        why,
    })?;
    Ok(Stored {
        record,
        revision: kv.mod_revision(),
    })
}

fn decode_brick(kv: &KeyValue) -> Result<Stored<BrickRecord>, CoordError> {
    let record: BrickRecord = decode(kv)?;
    if record.format != RECORD_FORMAT {
        return Err(CoordError::Damaged {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            why: format!(
                "record format {} (this build knows {RECORD_FORMAT})",
                record.format
            ),
        });
    }
    Ok(Stored {
        record,
        revision: kv.mod_revision(),
    })
}

impl Coord {
    /// Adds a brick to the catalog; refused if one of that name is there.
    pub async fn add_brick(&self, brick: &BrickRecord) -> Result<(), CoordError> {
        check_name("brick", &brick.name)?;
        if brick.format != RECORD_FORMAT || brick.size_bytes == 0 {
            return Err(CoordError::Invalid(format!(
                "brick {:?}: format must be {RECORD_FORMAT} and size positive",
                brick.name
            )));
        }
        let key = self.keys.brick(&brick.name);
        let value = serde_json::to_vec(brick).expect("a brick record serialises");
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), value, None)]);
        let mut client = self.client.clone();
        if !self
            .call("adding a brick", client.txn(txn))
            .await?
            .succeeded()
        {
            return Err(CoordError::Exists(format!("brick {:?}", brick.name)));
        }
        tracing::info!(brick = %brick.name, address = %brick.address, "brick added");
        Ok(())
    }

    /// Every brick, in name order.
    pub async fn bricks(&self) -> Result<Vec<Stored<BrickRecord>>, CoordError> {
        let kvs = self.list(&self.keys.bricks(), "listing bricks").await?;
        kvs.iter().map(decode_brick).collect()
    }

    /// Creates a shared volume. Refused if the name is taken, a brick is missing or too
    /// small, or a brick already serves another volume; checked in one transaction against
    /// the bricks and volumes as read, so two creations racing cannot share a brick.
    pub async fn create_volume(&self, volume: &VolumeRecord) -> Result<(), CoordError> {
        check_name("volume", &volume.name)?;
        for brick in volume.bricks() {
            check_name("brick", brick)?;
        }
        volume
            .validate()
            .map_err(|why| CoordError::Invalid(format!("volume {:?}: {why}", volume.name)))?;
        let bricks = self.bricks().await?;
        let volumes = self.volumes().await?;
        let need = volume.bytes_per_brick();
        let mut compares = vec![Compare::create_revision(
            self.keys.volume(&volume.name),
            CompareOp::Equal,
            0,
        )];
        for name in volume.bricks() {
            let Some(brick) = bricks.iter().find(|b| &b.record.name == name) else {
                return Err(CoordError::NotFound(format!("brick {name:?}")));
            };
            if brick.record.size_bytes < need {
                return Err(CoordError::Invalid(format!(
                    "brick {name:?} holds {} bytes; volume {:?} needs {need} on each brick",
                    brick.record.size_bytes, volume.name
                )));
            }
            if let Some(user) = volumes
                .iter()
                .find(|v| v.record.bricks().any(|b| b == name))
            {
                return Err(CoordError::Invalid(format!(
                    "brick {name:?} already serves volume {:?}",
                    user.record.name
                )));
            }
            compares.push(Compare::mod_revision(
                self.keys.brick(name),
                CompareOp::Equal,
                brick.revision,
            ));
        }
        // No volume appeared or changed since the listing (a new one might use these bricks).
        let newest = volumes.iter().map(|v| v.revision).max().unwrap_or(0);
        compares.push(
            Compare::mod_revision(self.keys.volumes(), CompareOp::Less, newest + 1).with_prefix(),
        );
        let key = self.keys.volume(&volume.name);
        let value = serde_json::to_vec(volume).expect("a volume record serialises");
        let txn = Txn::new()
            .when(compares)
            .and_then([TxnOp::put(key.as_str(), value, None)]);
        let mut client = self.client.clone();
        if self
            .call("creating a volume", client.txn(txn))
            .await?
            .succeeded()
        {
            tracing::info!(volume = %volume.name, size = volume.size_bytes, "shared volume created");
            return Ok(());
        }
        if self.volume(&volume.name).await.is_ok() {
            return Err(CoordError::Exists(format!("volume {:?}", volume.name)));
        }
        Err(CoordError::Conflict(format!(
            "the bricks or volumes, while creating volume {:?}",
            volume.name
        )))
    }

    /// One volume's record.
    pub async fn volume(&self, name: &str) -> Result<Stored<VolumeRecord>, CoordError> {
        check_name("volume", name)?;
        let key = self.keys.volume(name);
        match self.get_one(&key, "reading a volume").await? {
            Some(kv) => decode_volume(&kv),
            None => Err(CoordError::NotFound(format!("volume {name:?}"))),
        }
    }

    /// Every volume, in name order. One damaged record fails the listing, naming its key.
    pub async fn volumes(&self) -> Result<Vec<Stored<VolumeRecord>>, CoordError> {
        let kvs = self.list(&self.keys.volumes(), "listing volumes").await?;
        kvs.iter().map(decode_volume).collect()
    }

    /// Removes a volume from the catalog (its bricks keep their data), with its version
    /// counter and version records. Refused while any of its lock segments is claimed (it is in use) and if the
    /// record changed since `revision`.
    pub async fn remove_volume(&self, name: &str, revision: i64) -> Result<(), CoordError> {
        check_name("volume", name)?;
        let key = self.keys.volume(name);
        let claims = self.keys.claims(name);
        let txn = Txn::new()
            .when([
                Compare::mod_revision(key.as_str(), CompareOp::Equal, revision),
                Compare::create_revision(claims.as_str(), CompareOp::Equal, 0).with_prefix(),
            ])
            .and_then([
                TxnOp::delete(key.as_str(), None),
                TxnOp::delete(self.keys.version(name), None),
                TxnOp::delete(
                    self.keys.stale(name),
                    Some(etcd_client::DeleteOptions::new().with_prefix()),
                ),
                TxnOp::delete(self.keys.stale_mark(name), None),
                TxnOp::delete(
                    self.keys.version_records(name),
                    Some(etcd_client::DeleteOptions::new().with_prefix()),
                ),
            ]);
        let mut client = self.client.clone();
        if self
            .call("removing a volume", client.txn(txn))
            .await?
            .succeeded()
        {
            tracing::info!(volume = %name, "shared volume removed");
            return Ok(());
        }
        let current = self.volume(name).await?;
        if current.revision != revision {
            return Err(CoordError::Conflict(format!("volume {name:?}")));
        }
        Err(CoordError::Invalid(format!(
            "volume {name:?} is in use: its lock segments are claimed"
        )))
    }

    /// One key's value and revisions, `None` if it does not exist.
    pub(crate) async fn get_one(
        &self,
        key: &str,
        what: &str,
    ) -> Result<Option<KeyValue>, CoordError> {
        let mut response = self
            .read(what, |mut client| {
                let key = key.to_string();
                async move { client.get(key, None).await }
            })
            .await?;
        Ok(response.take_kvs().into_iter().next())
    }

    pub(crate) async fn list(&self, prefix: &str, what: &str) -> Result<Vec<KeyValue>, CoordError> {
        let mut response = self
            .read(what, |mut client| {
                let prefix = prefix.to_string();
                async move {
                    client
                        .get(prefix, Some(GetOptions::new().with_prefix()))
                        .await
                }
            })
            .await?;
        Ok(response.take_kvs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(sets: &[&[&str]]) -> VolumeRecord {
        VolumeRecord {
            format: RECORD_FORMAT,
            name: "v".into(),
            size_bytes: 10 << 20,
            unit_bytes: 1 << 20,
            segment_bytes: 4 << 20,
            mirror_sets: sets
                .iter()
                .map(|set| set.iter().map(|b| b.to_string()).collect())
                .collect(),
        }
    }

    #[test]
    fn a_layout_is_checked_before_it_is_stored() {
        assert_eq!(volume(&[&["a", "b"], &["c", "d"]]).validate(), Ok(()));
        assert_eq!(volume(&[&["a"], &["b"]]).validate(), Ok(()));
        let unequal = volume(&[&["a", "b"], &["c"]]).validate().unwrap_err();
        assert!(unequal.contains("same number"), "{unequal}");
        let twice = volume(&[&["a", "b"], &["c", "a"]]).validate().unwrap_err();
        assert!(twice.contains("\"a\" appears twice"), "{twice}");
        assert!(volume(&[]).validate().is_err());
        let mut odd = volume(&[&["a"]]);
        odd.unit_bytes = 3 << 12;
        assert!(odd.validate().unwrap_err().contains("unit of 12288"));
        let mut ragged = volume(&[&["a"]]);
        ragged.size_bytes = 4097;
        assert!(ragged.validate().is_err());
        let mut future = volume(&[&["a"]]);
        future.format = 2;
        assert!(future.validate().unwrap_err().contains("format 2"));
    }

    #[test]
    fn each_brick_holds_its_sets_share_in_whole_units() {
        // 10 units over 2 sets: 5 units a brick; over 3 sets: 4 (the last set holds 2).
        assert_eq!(
            volume(&[&["a", "b"], &["c", "d"]]).bytes_per_brick(),
            5 << 20
        );
        assert_eq!(volume(&[&["a"], &["b"], &["c"]]).bytes_per_brick(), 4 << 20);
        assert_eq!(volume(&[&["a"]]).segments(), 3);
        assert_eq!(volume(&[&["a", "b", "c"]]).copies(), 3);
    }
}
