//! Lock-segment claims: which member may write each segment of a shared volume (its holder
//! serves the byte-range locks within it, `strata_brick::segments`).
//!
//! A claim is an etcd key created in a transaction and bound to the claimant's lease, so it
//! goes when the claimant's lease runs out. Its create revision is its **epoch**: etcd's
//! revisions only grow, so whoever claims the segment next holds a larger epoch. Bricks keep
//! the largest epoch seen per segment and refuse writes granted under a smaller one; a holder
//! that paused past its lease and woke up still believing in its claims is fenced there.
//!
//! The same transaction reads the volume's version counter, and a claim carries it: a host
//! tags what it writes under the claim with at least that number, so a write that follows
//! another host's (which passed the segment on) never lands before a version cut the other
//! write was already after (docs/shared-volumes.md, "Versions"). It also refuses while a
//! roll-back of the volume is under way.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};

use crate::keys::check_name;
use crate::session::Session;
use crate::{Coord, CoordError};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimRecord {
    holder: String,
}

/// A claim on one lock segment of a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub volume: String,
    pub segment: u32,
    pub holder: String,
    /// The fencing epoch: the etcd revision that created the claim.
    pub epoch: i64,
    pub lease: i64,
    /// The volume's version counter when the claim was taken (0 in [`Coord::claims`]'s
    /// listing, which does not read it).
    pub version_at_claim: u64,
}

impl Coord {
    /// Claims `segment` of `volume` for the session's member. Refused with `Held` (naming the
    /// holder and its epoch) while another session's claim stands, and with `Fenced` if the
    /// session is no longer live. Claiming what the session already holds returns that claim,
    /// so a claim whose answer was lost can simply be asked again.
    pub async fn claim(
        &self,
        session: &Session,
        volume: &str,
        segment: u32,
    ) -> Result<Claim, CoordError> {
        self.claim_under(session, volume, segment, None).await
    }

    /// [`Self::claim`], refused with `CatalogChanged` unless the volume's record is still at
    /// `catalog`, the revision the caller serves the volume by. A host whose bricks changed
    /// (one was replaced) thus learns of it before it writes under a new claim: it must
    /// reload the volume first, or it would leave the new brick out of its writes.
    pub async fn claim_under(
        &self,
        session: &Session,
        volume: &str,
        segment: u32,
        catalog: Option<i64>,
    ) -> Result<Claim, CoordError> {
        check_name("volume", volume)?;
        session.ensure_live()?;
        let stored = self.volume(volume).await?;
        let changed = || CoordError::CatalogChanged {
            volume: volume.to_string(),
        };
        if catalog.is_some_and(|revision| revision != stored.revision) {
            return Err(changed());
        }
        if u64::from(segment) >= stored.record.segments() {
            return Err(CoordError::Invalid(format!(
                "volume {volume:?} has {} lock segments; there is no segment {segment}",
                stored.record.segments()
            )));
        }
        let key = self.keys.claim(volume, segment);
        let value = serde_json::to_vec(&ClaimRecord {
            holder: session.name().to_string(),
        })
        .expect("a claim serialises");
        let version_key = self.keys.version(volume);
        let rollback_key = self.keys.rollback(volume);
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                // The volume is the one read above: not removed, not re-created.
                Compare::mod_revision(self.keys.volume(volume), CompareOp::Equal, stored.revision),
                Compare::create_revision(rollback_key.as_str(), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(
                    key.as_str(),
                    value,
                    Some(PutOptions::new().with_lease(session.lease())),
                ),
                TxnOp::get(version_key.as_str(), None),
            ])
            .or_else([
                TxnOp::get(key.as_str(), None),
                TxnOp::get(rollback_key.as_str(), None),
                TxnOp::get(version_key.as_str(), None),
            ]);
        let mut client = self.client.clone();
        let response = self.call("claiming a segment", client.txn(txn)).await?;
        let what = format!("segment {segment} of volume {volume:?}");
        let ops = response.op_responses();
        let gets: Vec<Option<&etcd_client::KeyValue>> = (ops.iter())
            .filter_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get.kvs().first()),
                _ => None,
            })
            .collect();
        let version_at_claim = match gets.last() {
            Some(Some(kv)) => crate::versions::parse_counter(kv)?,
            _ => 0,
        };
        if response.succeeded() {
            let epoch =
                response
                    .header()
                    .map(|h| h.revision())
                    .ok_or_else(|| CoordError::Unavailable {
                        what: "claiming a segment".into(),
                        why: "etcd's answer had no header".into(),
                    })?;
            tracing::info!(member = %session.name(), volume, segment, epoch, version_at_claim, "segment claimed");
            return Ok(Claim {
                volume: volume.to_string(),
                segment,
                holder: session.name().to_string(),
                epoch,
                lease: session.lease(),
                version_at_claim,
            });
        }
        if let [claim, rollback, _] = gets[..] {
            if let Some(kv) = rollback {
                return Err(CoordError::RollingBack {
                    volume: volume.to_string(),
                    version: crate::versions::parse_rollback(kv)?,
                });
            }
            if let Some(kv) = claim {
                let record: ClaimRecord = crate::catalog::decode(kv)?;
                if kv.lease() == session.lease() {
                    // Already ours (an earlier attempt whose answer was lost, say): the
                    // same claim, the same epoch; the counter as read now, which is no
                    // older than at the claim.
                    return Ok(Claim {
                        volume: volume.to_string(),
                        segment,
                        holder: record.holder,
                        epoch: kv.create_revision(),
                        lease: kv.lease(),
                        version_at_claim,
                    });
                }
                return Err(CoordError::Held {
                    what,
                    holder: record.holder,
                    epoch: kv.create_revision(),
                });
            }
        }
        if catalog.is_some() {
            return Err(changed());
        }
        Err(CoordError::Conflict(format!("volume {volume:?}")))
    }

    /// Whether the claim still stands: the same key, created at the same revision. The lock
    /// server asks before answering from what it believes it holds.
    pub async fn confirm(&self, claim: &Claim) -> Result<(), CoordError> {
        let key = self.keys.claim(&claim.volume, claim.segment);
        match self.get_one(&key, "confirming a claim").await? {
            Some(kv) if kv.create_revision() == claim.epoch => Ok(()),
            _ => Err(lost(claim)),
        }
    }

    /// Gives up a claim. `Fenced` if it had already gone (to expiry or to another member).
    pub async fn release(&self, claim: &Claim) -> Result<(), CoordError> {
        let key = self.keys.claim(&claim.volume, claim.segment);
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                claim.epoch,
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        let mut client = self.client.clone();
        if self
            .call("releasing a claim", client.txn(txn))
            .await?
            .succeeded()
        {
            Ok(())
        } else {
            Err(lost(claim))
        }
    }

    /// The standing claims on a volume's segments, in segment order.
    pub async fn claims(&self, volume: &str) -> Result<Vec<Claim>, CoordError> {
        check_name("volume", volume)?;
        let prefix = self.keys.claims(volume);
        let kvs = self.list(&prefix, "listing claims").await?;
        kvs.iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let segment = key[prefix.len()..]
                    .parse()
                    .map_err(|_| CoordError::Damaged {
                        key: key.clone(),
                        why: "not a segment number".into(),
                    })?;
                let record: ClaimRecord = crate::catalog::decode(kv)?;
                Ok(Claim {
                    volume: volume.to_string(),
                    segment,
                    holder: record.holder,
                    epoch: kv.create_revision(),
                    lease: kv.lease(),
                    version_at_claim: 0,
                })
            })
            .collect()
    }
}

fn lost(claim: &Claim) -> CoordError {
    CoordError::Fenced(format!(
        "{}'s claim on segment {} of volume {:?} (epoch {}) is gone",
        claim.holder, claim.segment, claim.volume, claim.epoch
    ))
}
