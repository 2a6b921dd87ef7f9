//! The administrator's side of a shared volume's globally consistent versions and roll-back
//! (RIBD; docs/shared-volumes.md, "Versions"): taking a version as a cut consistent across
//! every brick, listing, deleting and rolling back to one.
//!
//! Version `n` holds exactly the intervals tagged below `n`, and every brick applies that rule
//! by itself (docs/brick-format.md). What this module adds is knowing when the cut is whole:
//! every host that could still have an interval tagged below `n` in flight has said it has
//! none (or is gone, and the bricks hold nothing of it in doubt), and no brick missed one of
//! those intervals (none was marked stale). Only then is the version sealed on the bricks and
//! recorded complete; a version that cannot be is recorded failed, saying what held it up.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::future::join_all;
use strata_coord::versions::{CompleteRecord, FailedRecord, Taking, TakingRecord};
use strata_coord::{Coord, CoordError};

use crate::rpc::{BrickClient, RpcError};
use crate::store::VersionInfo;

/// How often a taking looks again at acks and at the bricks' intervals in doubt.
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    #[error(transparent)]
    Coord(#[from] CoordError),
    /// Refused before anything was changed.
    #[error("volume {volume}: {why}")]
    Refused { volume: String, why: String },
    /// Version `number` was announced but is not a consistent cut: recorded failed.
    /// `held_by` names the members or bricks that held it up.
    #[error("version {number} of volume {volume} failed: {why}")]
    Failed {
        volume: String,
        number: u64,
        why: String,
        held_by: Vec<String>,
    },
    /// Some bricks did not do their part (unreachable, or refused): the command can be run
    /// again to finish.
    #[error("volume {volume}: {what} not done on {failures}")]
    Bricks {
        volume: String,
        what: String,
        failures: String,
    },
}

/// A volume's versions: what etcd records and what each brick keeps.
#[derive(Debug)]
pub struct VersionList {
    pub counter: u64,
    pub complete: BTreeMap<u64, CompleteRecord>,
    pub failed: BTreeMap<u64, FailedRecord>,
    pub taking: BTreeMap<u64, TakingRecord>,
    pub rollback: Option<u64>,
    /// Per brick, by name: its versions, or why it did not say.
    pub bricks: Vec<(String, Result<Vec<VersionInfo>, RpcError>)>,
}

/// The versions of one shared volume, reached through etcd and the bricks' service.
pub struct VolumeVersions {
    coord: Coord,
    volume: String,
    /// Each brick of the volume, by name, in the volume's order.
    bricks: Vec<(String, BrickClient)>,
}

impl VolumeVersions {
    /// Reads the volume and its bricks from the catalog; `timeout` bounds each brick request.
    pub async fn open(
        coord: &Coord,
        volume: &str,
        timeout: Duration,
    ) -> Result<VolumeVersions, VersionError> {
        let record = coord.volume(volume).await?.record;
        let catalog = coord.bricks().await?;
        let mut bricks = Vec::new();
        for name in record.bricks() {
            let brick = (catalog.iter())
                .find(|b| &b.record.name == name)
                .ok_or_else(|| CoordError::NotFound(format!("brick {name:?} in the catalog")))?;
            let client = BrickClient::new(&brick.record.address, timeout).map_err(|e| {
                VersionError::Refused {
                    volume: volume.to_string(),
                    why: format!("brick {name}: {e}"),
                }
            })?;
            bricks.push((name.clone(), client));
        }
        Ok(VolumeVersions {
            coord: coord.clone(),
            volume: volume.to_string(),
            bricks,
        })
    }

    fn refused(&self, why: String) -> VersionError {
        VersionError::Refused {
            volume: self.volume.clone(),
            why,
        }
    }

    /// Runs `call` on every brick at once; the bricks that failed, with why.
    async fn on_every_brick<T, F, Fut>(&self, call: F) -> Vec<(String, Result<T, RpcError>)>
    where
        F: Fn(BrickClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, RpcError>>,
    {
        let calls = (self.bricks.iter()).map(|(name, client)| {
            let answer = call(client.clone());
            async move { (name.clone(), answer.await) }
        });
        join_all(calls).await
    }

    fn failures<T>(answers: &[(String, Result<T, RpcError>)]) -> Vec<String> {
        (answers.iter())
            .filter_map(|(name, answer)| answer.as_ref().err().map(|e| format!("{name} ({e})")))
            .collect()
    }

    /// Every brick answers; else refused, naming the ones that do not.
    async fn all_bricks_answer(&self, before: &str) -> Result<(), VersionError> {
        let answers = self
            .on_every_brick(|c| async move { c.versions().await })
            .await;
        let failures = Self::failures(&answers);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(self.refused(format!(
                "{before} needs every brick; not answering: {}",
                failures.join(", ")
            )))
        }
    }

    /// Takes the next version: announces it, waits (up to `wait`) until every member that
    /// held claims at the announcement has acknowledged it or lost its lease and no brick
    /// holds an interval of a gone client in doubt, checks no brick was marked stale since,
    /// seals it on every brick and records it complete. Refused with nothing announced while
    /// a brick is stale or down or a roll-back is under way; once announced, any failure is
    /// recorded (`failed/<n>`) and reported with what held the version up.
    pub async fn create(&self, wait: Duration) -> Result<u64, VersionError> {
        self.all_bricks_answer("a version").await?;
        let taking = match self.coord.begin_version(&self.volume).await {
            Ok(taking) => taking,
            Err(CoordError::Invalid(why)) => return Err(self.refused(why)),
            Err(e) => return Err(e.into()),
        };
        let number = taking.number;
        match self.complete(&taking, wait).await {
            Ok(()) => {
                tracing::info!(volume = %self.volume, number, "version complete");
                Ok(number)
            }
            Err((why, held_by)) => {
                tracing::warn!(volume = %self.volume, number, %why, "version failed");
                if let Err(error) = self.coord.fail_version(&self.volume, number, &why).await {
                    tracing::warn!(volume = %self.volume, number, %error, "failure not recorded");
                }
                // Bricks that created the version for commits tagged with it keep old data
                // for it: let it go. A brick that does not answer keeps it, listed, until
                // `version delete`.
                for (brick, answer) in self
                    .on_every_brick(|c| async move { c.delete_version(number).await })
                    .await
                {
                    if let Err(error) = answer {
                        tracing::warn!(volume = %self.volume, number, brick, %error,
                            "failed version not deleted on the brick");
                    }
                }
                Err(VersionError::Failed {
                    volume: self.volume.clone(),
                    number,
                    why,
                    held_by,
                })
            }
        }
    }

    /// The taking's steps after the announcement; on failure, why and who held it up.
    async fn complete(&self, taking: &Taking, wait: Duration) -> Result<(), (String, Vec<String>)> {
        let number = taking.number;
        let deadline = tokio::time::Instant::now() + wait;
        let etcd = |e: CoordError| (format!("etcd: {e}"), Vec::new());
        // 1. Every holder at the announcement acknowledged it, or is gone.
        let mut gone = BTreeSet::new();
        loop {
            let acks = self.coord.version_acks(&self.volume).await.map_err(etcd)?;
            let mut waiting = Vec::new();
            for holder in &taking.record.holders {
                if acks.get(&holder.member).is_some_and(|&n| n >= number) {
                    continue;
                }
                if gone.contains(&holder.lease) {
                    continue;
                }
                if self.coord.lease_alive(holder.lease).await.map_err(etcd)? {
                    waiting.push(holder.member.clone());
                } else {
                    gone.insert(holder.lease);
                }
            }
            if waiting.is_empty() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err((
                    format!(
                        "members {waiting:?} held claims when it was announced and did not \
                         acknowledge it within {wait:?} (their intervals tagged before it may \
                         still be undecided)"
                    ),
                    waiting,
                ));
            }
            tokio::time::sleep(POLL).await;
        }
        // 2. No brick holds in doubt an interval tagged before the cut of a client whose lease
        // is gone: it may yet commit. (A live client holds none tagged before it: every
        // holder acknowledged, and a host that claims after the announcement tags its
        // intervals with it or more.) Once sealed, the bricks refuse any later prepare tagged
        // before the cut, and sealing itself is refused while one is undecided.
        let mut alive: BTreeMap<u64, bool> = BTreeMap::new();
        loop {
            let answers = self
                .on_every_brick(|c| async move { c.in_doubt_tagged().await })
                .await;
            let failures = Self::failures(&answers);
            if !failures.is_empty() {
                return Err((
                    format!("bricks did not list their intervals in doubt: {failures:?}"),
                    failures,
                ));
            }
            let mut doubtful = Vec::new();
            for (name, answer) in &answers {
                let answer = answer.as_ref().expect("failures returned above");
                for (id, _, _) in answer.iter().filter(|(_, _, tag)| *tag < number) {
                    let live = match alive.get(&id.client) {
                        Some(&live) => live,
                        None => {
                            let live = (self.coord)
                                .lease_alive(id.client as i64)
                                .await
                                .map_err(etcd)?;
                            alive.insert(id.client, live);
                            live
                        }
                    };
                    if !live {
                        doubtful.push(format!(
                            "{name} (interval {:x}/{} of a client whose lease ran out)",
                            id.client, id.seq
                        ));
                    }
                }
            }
            if doubtful.is_empty() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err((
                    format!(
                        "bricks still hold intervals in doubt after {wait:?}: {}",
                        doubtful.join(", ")
                    ),
                    doubtful,
                ));
            }
            tokio::time::sleep(POLL).await;
        }
        // 3. No brick missed an interval of the cut: none is stale, and none was marked since
        // the announcement (and copied back).
        let stale = self.coord.stale(&self.volume).await.map_err(etcd)?;
        if !stale.is_empty() {
            let names: Vec<String> = stale.keys().cloned().collect();
            return Err((
                format!("bricks {names:?} went stale while it was taken"),
                names,
            ));
        }
        let mark = self.coord.stale_mark(&self.volume).await.map_err(etcd)?;
        if mark != taking.record.stale_mark {
            return Err((
                "a brick was marked stale while it was taken (and copied back since): it \
                 missed writes of the cut"
                    .into(),
                Vec::new(),
            ));
        }
        // 4. Sealed on every brick, then recorded complete.
        let answers = self
            .on_every_brick(|c| async move { c.seal_version(number).await })
            .await;
        let failures = Self::failures(&answers);
        if !failures.is_empty() {
            return Err((
                format!("not sealed on {}", failures.join(", ")),
                (answers.into_iter())
                    .filter(|(_, a)| a.is_err())
                    .map(|(name, _)| name)
                    .collect(),
            ));
        }
        self.coord
            .complete_version(&self.volume, number)
            .await
            .map_err(etcd)
    }

    /// What etcd records and what every brick keeps.
    pub async fn list(&self) -> Result<VersionList, VersionError> {
        let records = self.coord.version_records(&self.volume).await?;
        let bricks = self
            .on_every_brick(|c| async move { c.versions().await })
            .await;
        Ok(VersionList {
            counter: records.counter,
            complete: records.complete,
            failed: records.failed,
            taking: records.taking,
            rollback: records.rollback,
            bricks,
        })
    }

    /// Deletes version `number` on every brick, then its records. A brick that does not
    /// answer leaves the records in place, so running it again finishes it.
    pub async fn delete(&self, number: u64) -> Result<(), VersionError> {
        let answers = self
            .on_every_brick(|c| async move { c.delete_version(number).await })
            .await;
        let failures = Self::failures(&answers);
        if !failures.is_empty() {
            return Err(VersionError::Bricks {
                volume: self.volume.clone(),
                what: format!("deleting version {number}"),
                failures: failures.join(", "),
            });
        }
        self.coord.forget_version(&self.volume, number).await?;
        Ok(())
    }

    /// Deletes the oldest complete versions until the newest `keep` remain ([`beyond_keep`]),
    /// oldest first; returns the ones deleted. Stops at the first that a brick does not
    /// delete, so what remains is always the newest versions: the next run finishes it.
    pub async fn prune(&self, keep: usize) -> Result<Vec<u64>, VersionError> {
        let records = self.coord.version_records(&self.volume).await?;
        let complete: Vec<u64> = records.complete.keys().copied().collect();
        let mut deleted = Vec::new();
        for number in beyond_keep(&complete, keep) {
            self.delete(number).await?;
            tracing::info!(volume = %self.volume, number, keep, "version deleted: beyond the newest to keep");
            deleted.push(number);
        }
        Ok(deleted)
    }

    /// Rolls the volume back to complete version `number` on every brick. Refused unless no
    /// member holds a claim on it, no brick is stale and every brick answers; the intent is
    /// recorded first (no claim, no open and no version is taken while it stands), so an
    /// interrupted roll-back is finished by running it again.
    pub async fn rollback(&self, number: u64) -> Result<(), VersionError> {
        self.all_bricks_answer("a roll-back").await?;
        match self.coord.begin_rollback(&self.volume, number).await {
            Ok(()) => {}
            Err(CoordError::Invalid(why)) => return Err(self.refused(why)),
            Err(e) => return Err(e.into()),
        }
        // Hosts go on tagging with the counter: the numbers after `number` are spent.
        let spent = self.coord.version(&self.volume).await?;
        let answers = self
            .on_every_brick(|c| async move { c.rollback(number, spent).await })
            .await;
        let failures = Self::failures(&answers);
        if !failures.is_empty() {
            return Err(VersionError::Bricks {
                volume: self.volume.clone(),
                what: format!("rolling back to version {number} (run it again to finish)"),
                failures: failures.join(", "),
            });
        }
        self.coord.finish_rollback(&self.volume, number).await?;
        tracing::info!(volume = %self.volume, number, "rolled back");
        Ok(())
    }
}

/// Retention: of the complete versions `complete` (any order), the ones to delete so that
/// only the newest `keep` remain, oldest first. Failed and unfinished versions are not
/// counted: they are not versions one can roll back to.
pub fn beyond_keep(complete: &[u64], keep: usize) -> Vec<u64> {
    let mut numbers = complete.to_vec();
    numbers.sort_unstable();
    numbers.dedup();
    let excess = numbers.len().saturating_sub(keep);
    numbers.truncate(excess);
    numbers
}

#[cfg(test)]
mod retention_tests {
    use super::beyond_keep;

    #[test]
    fn the_oldest_beyond_the_newest_kept_go_first() {
        assert_eq!(beyond_keep(&[1, 2, 3, 4, 5], 2), vec![1, 2, 3]);
        // Numbers with gaps (deleted or failed versions between), in any order.
        assert_eq!(beyond_keep(&[9, 3, 7, 12], 3), vec![3]);
        assert_eq!(beyond_keep(&[4, 5], 2), Vec::<u64>::new());
        assert_eq!(beyond_keep(&[4], 5), Vec::<u64>::new());
        assert_eq!(beyond_keep(&[], 1), Vec::<u64>::new());
        assert_eq!(beyond_keep(&[2, 1, 2], 1), vec![1]);
    }
}
