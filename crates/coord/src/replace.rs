//! Replacing a brick of a shared volume: a failed one, or one the administrator moves off.
//!
//! The new brick takes the old one's place in its mirror set, in one transaction that also
//! records it stale in every region: no host reads it anywhere until each region has been
//! copied to it from a current brick of the set. Hosts learn of the change at their next
//! segment claim ([`Coord::claim_under`] refuses a claim made by an older record), and the
//! copy of each region is made under its segment's claim, so no host that still writes by the
//! old record can write a region after its copy: the new brick misses nothing it is not
//! recorded stale for.

use std::collections::BTreeSet;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::catalog::VolumeRecord;
use crate::keys::check_name;
use crate::{Coord, CoordError};

/// What a replacement changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    /// The volume's record after it, and its revision.
    pub record: VolumeRecord,
    pub revision: i64,
    /// The regions the new brick must be given (all of its share).
    pub regions: u64,
}

impl Coord {
    /// Puts brick `new` in the place of `old` in `volume`. Refused, naming why, if `new` is
    /// missing, too small or serves a volume; if `old` has no peer in its set that holds every
    /// region current (nothing to copy from); if the volume has versions (they are kept only
    /// on the bricks that took them, and the new brick would have none); or while a roll-back
    /// runs. Checked in one transaction against what was read.
    pub async fn replace_brick(
        &self,
        volume: &str,
        old: &str,
        new: &str,
    ) -> Result<Replacement, CoordError> {
        check_name("volume", volume)?;
        check_name("brick", old)?;
        check_name("brick", new)?;
        let stored = self.volume(volume).await?;
        let refuse = |why: String| {
            Err(CoordError::Invalid(format!(
                "replacing brick {old:?} of volume {volume:?} with {new:?}: {why}"
            )))
        };
        let Some(set) = (stored.record.mirror_sets.iter()).position(|s| s.iter().any(|b| b == old))
        else {
            return refuse(format!("{old:?} is not a brick of the volume"));
        };
        let bricks = self.bricks().await?;
        let Some(brick) = bricks.iter().find(|b| b.record.name == new) else {
            return Err(CoordError::NotFound(format!("brick {new:?}")));
        };
        let need = stored.record.bytes_per_brick();
        if brick.record.size_bytes < need {
            return refuse(format!(
                "{new:?} holds {} bytes; the volume needs {need} on each brick",
                brick.record.size_bytes
            ));
        }
        let volumes = self.volumes().await?;
        if let Some(user) = (volumes.iter()).find(|v| v.record.bricks().any(|b| b == new)) {
            return refuse(format!(
                "{new:?} already serves volume {:?}",
                user.record.name
            ));
        }
        let peers: Vec<&String> = stored.record.mirror_sets[set]
            .iter()
            .filter(|b| *b != old)
            .collect();
        if peers.is_empty() {
            return refuse(
                "its mirror set has no other brick to copy from (RAIN-0): the data on it is \
                 lost with it"
                    .into(),
            );
        }
        // A region is safe to copy if some peer holds it current: stale on every peer, it
        // existed only on the brick going away.
        let stale = self.stale(volume).await?;
        let regions = need / stored.record.unit_bytes;
        let lost: BTreeSet<u64> = (0..regions)
            .filter(|r| {
                peers
                    .iter()
                    .all(|p| stale.get(*p).is_some_and(|s| s.contains(r)))
            })
            .collect();
        if !lost.is_empty() {
            return refuse(format!(
                "{} regions (the first: {}) are current only on {old:?}; bring it back until \
                 they are copied to its peers",
                lost.len(),
                lost.first().expect("not empty")
            ));
        }
        let records = self.version_records(volume).await?;
        if let Some(to) = records.rollback {
            return Err(CoordError::RollingBack {
                volume: volume.to_string(),
                version: to,
            });
        }
        let versions: Vec<u64> = (records.taking.keys())
            .chain(records.complete.keys())
            .copied()
            .collect();
        if !versions.is_empty() {
            return refuse(format!(
                "the volume has versions {versions:?}, kept only on the bricks that took them; \
                 delete them first"
            ));
        }
        let counter_key = self.keys.version(volume);
        let counter_revision = (self
            .get_one(&counter_key, "reading the version counter")
            .await?)
            .map_or(0, |kv| kv.mod_revision());
        let mut record = stored.record.clone();
        for b in record.mirror_sets[set].iter_mut().filter(|b| *b == old) {
            *b = new.to_string();
        }
        let stale_prefix = self.keys.stale(volume);
        let mut compares = vec![
            Compare::mod_revision(self.keys.volume(volume), CompareOp::Equal, stored.revision),
            Compare::mod_revision(self.keys.brick(new), CompareOp::Equal, brick.revision),
            // No version announced and no roll-back begun since the check.
            Compare::mod_revision(counter_key.as_str(), CompareOp::Equal, counter_revision),
            Compare::create_revision(self.keys.rollback(volume), CompareOp::Equal, 0),
        ];
        // No volume appeared or changed since the listing (a new one might use `new`).
        let newest = volumes.iter().map(|v| v.revision).max().unwrap_or(0);
        compares.push(
            Compare::mod_revision(self.keys.volumes(), CompareOp::Less, newest + 1).with_prefix(),
        );
        // The peers' stale records are as checked.
        for peer in &peers {
            let key = format!("{stale_prefix}{peer}");
            let revision = (self.get_one(&key, "reading a stale brick").await?)
                .map_or(0, |kv| kv.mod_revision());
            compares.push(Compare::mod_revision(key, CompareOp::Equal, revision));
        }
        let txn = Txn::new().when(compares).and_then([
            TxnOp::put(
                self.keys.volume(volume),
                serde_json::to_vec(&record).expect("a volume record serialises"),
                None,
            ),
            TxnOp::put(
                format!("{stale_prefix}{new}"),
                crate::stale::encode(&(0..regions).collect()),
                None,
            ),
            TxnOp::delete(format!("{stale_prefix}{old}"), None),
            // A version being taken checks this mark before it seals.
            TxnOp::put(self.keys.stale_mark(volume), new, None),
        ]);
        let mut client = self.client.clone();
        let response = self.call("replacing a brick", client.txn(txn)).await?;
        if !response.succeeded() {
            return Err(CoordError::Conflict(format!(
                "volume {volume:?}, its bricks or versions, while replacing brick {old:?}"
            )));
        }
        let revision =
            (response.header().map(|h| h.revision())).ok_or_else(|| CoordError::Unavailable {
                what: "replacing a brick".into(),
                why: "etcd's answer had no header".into(),
            })?;
        tracing::warn!(
            volume,
            old,
            new,
            regions,
            "brick replaced: the new one is stale until copied to"
        );
        Ok(Replacement {
            record,
            revision,
            regions,
        })
    }
}

/// Changes to one key: a volume's record ([`Coord::watch_volume`]) or its stale mark
/// ([`Coord::watch_stale`]).
pub struct KeyWatch {
    stream: etcd_client::WatchStream,
    what: &'static str,
}

impl KeyWatch {
    /// Waits for the key's next change. `None` once etcd closed the watch: the caller
    /// watches again and reads the key, which may have changed meanwhile.
    pub async fn changed(&mut self) -> Result<Option<()>, CoordError> {
        loop {
            let Some(response) =
                (self.stream.message().await).map_err(|e| CoordError::from_etcd(self.what, e))?
            else {
                return Ok(None);
            };
            if response.canceled() {
                return Ok(None);
            }
            if !response.events().is_empty() {
                return Ok(Some(()));
            }
        }
    }
}

impl Coord {
    /// Watches `volume`'s record from now on (a brick replaced changes it). Read the record
    /// after the watch is set up to learn of a change made before.
    pub async fn watch_volume(&self, volume: &str) -> Result<KeyWatch, CoordError> {
        check_name("volume", volume)?;
        self.watch_key(self.keys.volume(volume), "watching a volume's record")
            .await
    }

    /// Watches `volume`'s stale mark from now on: every `mark_stale` that records new
    /// regions rewrites it. Read the stale records after the watch is set up to learn of a
    /// mark made before.
    pub async fn watch_stale(&self, volume: &str) -> Result<KeyWatch, CoordError> {
        check_name("volume", volume)?;
        self.watch_key(
            self.keys.stale_mark(volume),
            "watching a volume's stale mark",
        )
        .await
    }

    async fn watch_key(&self, key: String, what: &'static str) -> Result<KeyWatch, CoordError> {
        let mut client = self.client.clone();
        let stream = self
            .call(what, client.watch(key, None::<etcd_client::WatchOptions>))
            .await?;
        Ok(KeyWatch { stream, what })
    }
}
