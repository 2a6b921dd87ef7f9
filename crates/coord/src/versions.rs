//! Each shared volume's versions in etcd: the counter, advanced by compare-and-swap, and the
//! records of the protocol that turns a number into a globally consistent version
//! (docs/shared-volumes.md, "Versions"):
//! - `taking/<n>`: version `n` is being taken, by whom it waits for (the members that held
//!   claims on the volume when `n` was announced) and the stale generation it started from;
//! - `acks/<n>/<member>`: a host has every interval it tagged below `n` decided and delivered;
//!   bound to the host's lease, so an ack goes with its host;
//! - `complete/<n>`: the version is a consistent cut, sealed on every brick;
//! - `failed/<n>`: the taking stopped, and why; never rolled back to;
//! - `rollback`: a roll-back is under way; claims and takings are refused until it is gone.
//!
//! The counter only grows, also across a roll-back: a host that saw number `c` tags its
//! intervals `c` or more from then on, and a counter going back would put its later writes
//! before a cut they came after.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use etcd_client::{
    Compare, CompareOp, DeleteOptions, EventType, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions, WatchStream,
};
use serde::{Deserialize, Serialize};

use crate::keys::check_name;
use crate::session::Session;
use crate::{Coord, CoordError};

/// How often `next_version` retries when others advance the counter between its read and its
/// write, before it reports the contention.
const ATTEMPTS: usize = 64;

/// A member a version waits for: it held claims on the volume when the number was announced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holder {
    pub member: String,
    pub lease: i64,
}

/// A version being taken.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TakingRecord {
    pub holders: Vec<Holder>,
    /// The mod revision of the volume's stale mark when the number was announced (0: never
    /// marked). A brick marked stale since misses writes of the cut: the version fails.
    pub stale_mark: i64,
    pub started_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteRecord {
    pub completed_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailedRecord {
    pub why: String,
    pub failed_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackRecord {
    to: u64,
}

/// What etcd records of a volume's versions, by number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionRecords {
    pub counter: u64,
    pub taking: BTreeMap<u64, TakingRecord>,
    pub complete: BTreeMap<u64, CompleteRecord>,
    pub failed: BTreeMap<u64, FailedRecord>,
    /// The version a roll-back under way goes back to.
    pub rollback: Option<u64>,
}

/// A number just announced, and whom it waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taking {
    pub number: u64,
    pub record: TakingRecord,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn damaged(kv: &KeyValue, why: &str) -> CoordError {
    CoordError::Damaged {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        why: format!("{why}: {:?}", String::from_utf8_lossy(kv.value())),
    }
}

pub(crate) fn parse_counter(kv: &KeyValue) -> Result<u64, CoordError> {
    std::str::from_utf8(kv.value())
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| damaged(kv, "not a version number"))
}

pub(crate) fn parse_rollback(kv: &KeyValue) -> Result<u64, CoordError> {
    Ok(crate::catalog::decode::<RollbackRecord>(kv)?.to)
}

/// The number at the end of a record's key (`.../<n>` or `.../<n>/<member>`).
fn number_in(prefix: &str, kv: &KeyValue) -> Result<(u64, String), CoordError> {
    let key = String::from_utf8_lossy(kv.key());
    let rest = key
        .strip_prefix(prefix)
        .ok_or_else(|| damaged(kv, "outside its prefix"))?;
    let (number, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let number = number
        .parse()
        .map_err(|_| damaged(kv, "not a version number in the key"))?;
    Ok((number, tail.to_string()))
}

/// The end of a prefix's range: the prefix with its last byte raised by one.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("prefixes are not empty") += 1;
    end
}

/// The volume's version counter as it changes; see [`Coord::watch_version`].
pub struct VersionWatch {
    stream: WatchStream,
}

impl VersionWatch {
    /// The counter's next value, `None` once etcd closed the watch (the caller watches again
    /// and reads the counter, which may have moved meanwhile).
    pub async fn next(&mut self) -> Result<Option<u64>, CoordError> {
        loop {
            let Some(response) = self
                .stream
                .message()
                .await
                .map_err(|e| CoordError::from_etcd("watching a version counter", e))?
            else {
                return Ok(None);
            };
            if response.canceled() {
                return Ok(None);
            }
            let newest = (response.events().iter())
                .filter(|e| e.event_type() == EventType::Put)
                .filter_map(|e| e.kv())
                .map(parse_counter)
                .collect::<Result<Vec<u64>, _>>()?
                .into_iter()
                .max();
            if let Some(number) = newest {
                return Ok(Some(number));
            }
        }
    }
}

impl Coord {
    /// The volume's newest version number, 0 before the first.
    pub async fn version(&self, volume: &str) -> Result<u64, CoordError> {
        check_name("volume", volume)?;
        Ok(self.read_version(volume).await?.0)
    }

    async fn read_version(&self, volume: &str) -> Result<(u64, i64), CoordError> {
        let key = self.keys.version(volume);
        let Some(kv) = self.get_one(&key, "reading a version").await? else {
            return Ok((0, 0));
        };
        Ok((parse_counter(&kv)?, kv.mod_revision()))
    }

    /// Takes the next version number of a volume that exists in the catalog.
    pub async fn next_version(&self, volume: &str) -> Result<u64, CoordError> {
        check_name("volume", volume)?;
        let key = self.keys.version(volume);
        for _ in 0..ATTEMPTS {
            let (current, revision) = self.read_version(volume).await?;
            let next = current + 1;
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(key.as_str(), CompareOp::Equal, revision),
                    Compare::create_revision(self.keys.volume(volume), CompareOp::Greater, 0),
                ])
                .and_then([TxnOp::put(key.as_str(), next.to_string(), None)]);
            let mut client = self.client.clone();
            if self
                .call("advancing a version", client.txn(txn))
                .await?
                .succeeded()
            {
                return Ok(next);
            }
            // Either someone else advanced it (retry) or the volume is gone (say so).
            self.volume(volume).await?;
        }
        Err(CoordError::Conflict(format!(
            "version counter of volume {volume:?} ({ATTEMPTS} attempts)"
        )))
    }

    /// Announces the next version of `volume` and records its taking. In the one transaction
    /// that advances the counter: no brick of the volume is stale and no roll-back is under
    /// way (else refused, saying which), and the claims standing then are read: their holders
    /// are the members the version waits for. A member that claims later reads the new
    /// number in its claim, and tags everything it writes after the cut.
    pub async fn begin_version(&self, volume: &str) -> Result<Taking, CoordError> {
        check_name("volume", volume)?;
        let key = self.keys.version(volume);
        let claims = self.keys.claims(volume);
        let stale = self.keys.stale(volume);
        let rollback = self.keys.rollback(volume);
        for _ in 0..ATTEMPTS {
            let (current, revision) = self.read_version(volume).await?;
            let number = current + 1;
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(key.as_str(), CompareOp::Equal, revision),
                    Compare::create_revision(self.keys.volume(volume), CompareOp::Greater, 0),
                    Compare::create_revision(stale.as_str(), CompareOp::Equal, 0).with_prefix(),
                    Compare::create_revision(rollback.as_str(), CompareOp::Equal, 0),
                ])
                .and_then([
                    TxnOp::put(key.as_str(), number.to_string(), None),
                    TxnOp::get(
                        claims.as_str(),
                        Some(etcd_client::GetOptions::new().with_prefix()),
                    ),
                    TxnOp::get(self.keys.stale_mark(volume), None),
                ]);
            let mut client = self.client.clone();
            let response = self.call("announcing a version", client.txn(txn)).await?;
            if !response.succeeded() {
                self.volume(volume).await?;
                if let Some(to) = self.rollback_pending(volume).await? {
                    return Err(CoordError::RollingBack {
                        volume: volume.to_string(),
                        version: to,
                    });
                }
                let stale = self.stale(volume).await?;
                if !stale.is_empty() {
                    let names: Vec<&String> = stale.keys().collect();
                    return Err(CoordError::Invalid(format!(
                        "volume {volume:?}: bricks {names:?} are stale (they miss writes until \
                         copied back), so no version can be a cut of every copy"
                    )));
                }
                continue;
            }
            let ops = response.op_responses();
            let mut gets = ops.iter().filter_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get.kvs()),
                _ => None,
            });
            let mut holders: BTreeMap<String, i64> = BTreeMap::new();
            for kv in gets.next().unwrap_or_default() {
                #[derive(Deserialize)]
                struct ClaimHolder {
                    holder: String,
                }
                let claim: ClaimHolder = crate::catalog::decode(kv)?;
                holders.insert(claim.holder, kv.lease());
            }
            let stale_mark = (gets.next().unwrap_or_default().first())
                .map(|kv| kv.mod_revision())
                .unwrap_or(0);
            let record = TakingRecord {
                holders: (holders.into_iter())
                    .map(|(member, lease)| Holder { member, lease })
                    .collect(),
                stale_mark,
                started_ms: now_ms(),
            };
            let value = serde_json::to_vec(&record).expect("a taking serialises");
            let mut client = self.client.clone();
            self.call(
                "recording a version's taking",
                client.put(self.keys.version_taking(volume, number), value, None),
            )
            .await?;
            tracing::info!(volume, number, holders = ?record.holders, "version announced");
            return Ok(Taking { number, record });
        }
        Err(CoordError::Conflict(format!(
            "version counter of volume {volume:?} ({ATTEMPTS} attempts)"
        )))
    }

    /// Watches the volume's version counter from now on. Read [`Coord::version`] after it is
    /// set up to learn the value it had before.
    pub async fn watch_version(&self, volume: &str) -> Result<VersionWatch, CoordError> {
        check_name("volume", volume)?;
        let mut client = self.client.clone();
        let stream = self
            .call(
                "watching a version counter",
                client.watch(self.keys.version(volume), None::<WatchOptions>),
            )
            .await?;
        Ok(VersionWatch { stream })
    }

    /// Says that this member has every interval it tagged below `number` decided and
    /// delivered, and withdraws its ack of `previous` (an ack of a number stands for every
    /// smaller one). Bound to the session's lease.
    pub async fn ack_version(
        &self,
        session: &Session,
        volume: &str,
        number: u64,
        previous: Option<u64>,
    ) -> Result<(), CoordError> {
        check_name("volume", volume)?;
        session.ensure_live()?;
        let mut ops = vec![TxnOp::put(
            self.keys.version_ack(volume, number, session.name()),
            Vec::new(),
            Some(PutOptions::new().with_lease(session.lease())),
        )];
        if let Some(previous) = previous.filter(|&p| p != number) {
            ops.push(TxnOp::delete(
                self.keys.version_ack(volume, previous, session.name()),
                None,
            ));
        }
        let mut client = self.client.clone();
        self.call(
            "acknowledging a version",
            client.txn(Txn::new().and_then(ops)),
        )
        .await?;
        Ok(())
    }

    /// Each member's newest ack on `volume`.
    pub async fn version_acks(&self, volume: &str) -> Result<BTreeMap<String, u64>, CoordError> {
        check_name("volume", volume)?;
        let prefix = format!("{}acks/", self.keys.version_records(volume));
        let mut acks = BTreeMap::new();
        for kv in self.list(&prefix, "listing version acks").await? {
            let (number, member) = number_in(&prefix, &kv)?;
            let newest = acks.entry(member).or_insert(number);
            *newest = (*newest).max(number);
        }
        Ok(acks)
    }

    /// The mod revision of the volume's stale mark: it moves whenever a brick is marked
    /// stale (0: never).
    pub async fn stale_mark(&self, volume: &str) -> Result<i64, CoordError> {
        check_name("volume", volume)?;
        Ok(self
            .get_one(&self.keys.stale_mark(volume), "reading the stale mark")
            .await?
            .map(|kv| kv.mod_revision())
            .unwrap_or(0))
    }

    /// Records version `number` complete: a consistent cut, sealed on every brick.
    pub async fn complete_version(&self, volume: &str, number: u64) -> Result<(), CoordError> {
        let record = serde_json::to_vec(&CompleteRecord {
            completed_ms: now_ms(),
        })
        .expect("a completion serialises");
        self.end_taking(
            volume,
            number,
            self.keys.version_complete(volume, number),
            record,
        )
        .await
    }

    /// Records that taking version `number` stopped, and why.
    pub async fn fail_version(
        &self,
        volume: &str,
        number: u64,
        why: &str,
    ) -> Result<(), CoordError> {
        let record = serde_json::to_vec(&FailedRecord {
            why: why.to_string(),
            failed_ms: now_ms(),
        })
        .expect("a failure serialises");
        self.end_taking(
            volume,
            number,
            self.keys.version_failed(volume, number),
            record,
        )
        .await
    }

    async fn end_taking(
        &self,
        volume: &str,
        number: u64,
        key: String,
        value: Vec<u8>,
    ) -> Result<(), CoordError> {
        check_name("volume", volume)?;
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.keys.volume(volume),
                CompareOp::Greater,
                0,
            )])
            .and_then([
                TxnOp::put(key, value, None),
                TxnOp::delete(self.keys.version_taking(volume, number), None),
                TxnOp::delete(
                    self.keys.version_acks(volume, number),
                    Some(DeleteOptions::new().with_prefix()),
                ),
            ]);
        let mut client = self.client.clone();
        if self
            .call("recording a version", client.txn(txn))
            .await?
            .succeeded()
        {
            return Ok(());
        }
        Err(CoordError::NotFound(format!("volume {volume:?}")))
    }

    /// Every record of the volume's versions.
    pub async fn version_records(&self, volume: &str) -> Result<VersionRecords, CoordError> {
        check_name("volume", volume)?;
        let prefix = self.keys.version_records(volume);
        let mut records = VersionRecords {
            counter: self.version(volume).await?,
            ..VersionRecords::default()
        };
        let (taking, complete, failed) = (
            self.keys.version_takings(volume),
            self.keys.version_completes(volume),
            self.keys.version_failures(volume),
        );
        for kv in self.list(&prefix, "listing versions").await? {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            if key.starts_with(&taking) {
                let (n, _) = number_in(&taking, &kv)?;
                records.taking.insert(n, crate::catalog::decode(&kv)?);
            } else if key.starts_with(&complete) {
                let (n, _) = number_in(&complete, &kv)?;
                records.complete.insert(n, crate::catalog::decode(&kv)?);
            } else if key.starts_with(&failed) {
                let (n, _) = number_in(&failed, &kv)?;
                records.failed.insert(n, crate::catalog::decode(&kv)?);
            } else if key == self.keys.rollback(volume) {
                records.rollback = Some(parse_rollback(&kv)?);
            }
        }
        Ok(records)
    }

    /// Forgets version `number` (deleted on the bricks): its records go.
    pub async fn forget_version(&self, volume: &str, number: u64) -> Result<(), CoordError> {
        check_name("volume", volume)?;
        let txn = Txn::new().and_then([
            TxnOp::delete(self.keys.version_complete(volume, number), None),
            TxnOp::delete(self.keys.version_failed(volume, number), None),
            TxnOp::delete(self.keys.version_taking(volume, number), None),
            TxnOp::delete(
                self.keys.version_acks(volume, number),
                Some(DeleteOptions::new().with_prefix()),
            ),
        ]);
        let mut client = self.client.clone();
        self.call("forgetting a version", client.txn(txn)).await?;
        Ok(())
    }

    /// The version a roll-back under way goes back to, if one is.
    pub async fn rollback_pending(&self, volume: &str) -> Result<Option<u64>, CoordError> {
        check_name("volume", volume)?;
        match self
            .get_one(&self.keys.rollback(volume), "reading a roll-back")
            .await?
        {
            Some(kv) => Ok(Some(parse_rollback(&kv)?)),
            None => Ok(None),
        }
    }

    /// Puts the intent to roll `volume` back to version `number`, from which on no segment
    /// can be claimed and no version taken. Refused unless `number` is complete, no segment
    /// is claimed, no brick is stale and no version is being taken, all checked in the
    /// transaction that puts it. An intent already standing for `number` is an interrupted
    /// roll-back: it is resumed (`Ok`); one for another number is refused.
    pub async fn begin_rollback(&self, volume: &str, number: u64) -> Result<(), CoordError> {
        check_name("volume", volume)?;
        let key = self.keys.rollback(volume);
        let value = serde_json::to_vec(&RollbackRecord { to: number }).expect("serialises");
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                Compare::create_revision(self.keys.volume(volume), CompareOp::Greater, 0),
                Compare::create_revision(
                    self.keys.version_complete(volume, number),
                    CompareOp::Greater,
                    0,
                ),
                Compare::create_revision(self.keys.claims(volume), CompareOp::Equal, 0)
                    .with_prefix(),
                Compare::create_revision(self.keys.stale(volume), CompareOp::Equal, 0)
                    .with_prefix(),
                Compare::create_revision(self.keys.version_takings(volume), CompareOp::Equal, 0)
                    .with_prefix(),
            ])
            .and_then([TxnOp::put(key.as_str(), value, None)]);
        let mut client = self.client.clone();
        if self
            .call("putting a roll-back intent", client.txn(txn))
            .await?
            .succeeded()
        {
            tracing::info!(volume, number, "roll-back intent recorded");
            return Ok(());
        }
        self.volume(volume).await?;
        match self.rollback_pending(volume).await? {
            Some(to) if to == number => return Ok(()),
            Some(to) => {
                return Err(CoordError::RollingBack {
                    volume: volume.to_string(),
                    version: to,
                })
            }
            None => {}
        }
        let records = self.version_records(volume).await?;
        if !records.complete.contains_key(&number) {
            return Err(CoordError::Invalid(format!(
                "volume {volume:?} has no complete version {number}"
            )));
        }
        let claims = self.claims(volume).await?;
        if !claims.is_empty() {
            let holders: std::collections::BTreeSet<&str> =
                claims.iter().map(|c| c.holder.as_str()).collect();
            return Err(CoordError::Invalid(format!(
                "volume {volume:?} is in use: {holders:?} hold claims on its segments"
            )));
        }
        let stale = self.stale(volume).await?;
        if !stale.is_empty() {
            return Err(CoordError::Invalid(format!(
                "volume {volume:?}: bricks {:?} are stale",
                stale.keys().collect::<Vec<_>>()
            )));
        }
        if let Some(n) = records.taking.keys().next() {
            return Err(CoordError::Invalid(format!(
                "volume {volume:?}: version {n} is being taken (or its taking was interrupted: \
                 delete it first)"
            )));
        }
        Err(CoordError::Conflict(format!("volume {volume:?}")))
    }

    /// Ends the roll-back to `number`, once every brick is back at it: the records of the
    /// versions after it go, and so does the intent.
    pub async fn finish_rollback(&self, volume: &str, number: u64) -> Result<(), CoordError> {
        check_name("volume", volume)?;
        let after = |prefix: String, first: String| {
            TxnOp::delete(
                first,
                Some(DeleteOptions::new().with_range(prefix_end(&prefix))),
            )
        };
        let key = self.keys.rollback(volume);
        let value = serde_json::to_vec(&RollbackRecord { to: number }).expect("serialises");
        let txn = Txn::new()
            .when([Compare::value(key.as_str(), CompareOp::Equal, value)])
            .and_then([
                after(
                    self.keys.version_completes(volume),
                    self.keys.version_complete(volume, number + 1),
                ),
                after(
                    self.keys.version_failures(volume),
                    self.keys.version_failed(volume, number + 1),
                ),
                TxnOp::delete(key.as_str(), None),
            ]);
        let mut client = self.client.clone();
        if self
            .call("ending a roll-back", client.txn(txn))
            .await?
            .succeeded()
        {
            tracing::info!(volume, number, "roll-back finished");
            return Ok(());
        }
        Err(CoordError::Conflict(format!(
            "roll-back intent of volume {volume:?} (not to version {number})"
        )))
    }
}
