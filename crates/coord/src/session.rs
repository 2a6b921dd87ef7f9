//! A member's session: an etcd lease with the member's record bound to it.
//!
//! While the lease lives, the member is in the cluster; when it runs out (the process died,
//! stopped or lost the network), etcd deletes the record and every claim bound to the lease,
//! and others may take them over. The member itself counts the lease from the moment it *sent*
//! each renewal, which is never later than etcd received it, so it believes itself live no
//! longer than etcd does and stops acting on its claims first.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::keys::check_name;
use crate::{Coord, CoordError};

/// What a member says about itself, readable by every other member while it is live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberRecord {
    pub name: String,
    /// What the member does: `client`, `brick`, `locks`, ...
    pub role: String,
    /// Where others reach it (`host:port`), empty for a member that serves nothing.
    pub address: String,
}

/// A live member as listed by [`Coord::members`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub record: MemberRecord,
    pub lease: i64,
}

struct Liveness {
    /// Send time of the last renewal etcd accepted, plus the TTL it granted.
    deadline: Instant,
    /// etcd said the lease is gone, or the session was closed: final.
    lost: bool,
}

struct Inner {
    coord: Coord,
    name: String,
    lease: i64,
    ttl: Duration,
    liveness: Mutex<Liveness>,
}

/// A member's session. Cheap to clone; every clone is the same session.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

impl Session {
    /// Joins the cluster as `record.name`, refused while a live member has that name (two
    /// processes with one identity would each believe the other's claims their own). `ttl` is
    /// rounded up to whole seconds, etcd's unit.
    pub async fn open(
        coord: &Coord,
        record: MemberRecord,
        ttl: Duration,
    ) -> Result<Session, CoordError> {
        check_name("member", &record.name)?;
        let ttl_secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        if ttl_secs == 0 {
            return Err(CoordError::Invalid("a session's lease needs a TTL".into()));
        }
        let key = coord.keys.member(&record.name);
        let value = serde_json::to_vec(&record).expect("a member record serialises");
        let sent = Instant::now();
        let mut client = coord.client.clone();
        let grant = coord
            .call(
                "granting a lease",
                client.lease_grant(ttl_secs as i64, None),
            )
            .await?;
        let lease = grant.id();
        let granted = Duration::from_secs(grant.ttl().max(0) as u64);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let joined = match coord.call("joining", client.txn(txn)).await {
            Ok(response) => response.succeeded(),
            Err(e) => {
                let _ = coord.call("revoking", client.lease_revoke(lease)).await;
                return Err(e);
            }
        };
        if !joined {
            let _ = coord.call("revoking", client.lease_revoke(lease)).await;
            return Err(CoordError::Exists(format!(
                "member {:?} (live in cluster {:?})",
                record.name,
                coord.cluster()
            )));
        }
        tracing::info!(member = %record.name, lease, ttl = ?granted, "joined the cluster");
        Ok(Session {
            inner: Arc::new(Inner {
                coord: coord.clone(),
                name: record.name,
                lease,
                ttl: granted,
                liveness: Mutex::new(Liveness {
                    deadline: sent + granted,
                    lost: false,
                }),
            }),
        })
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The etcd lease: every claim the member takes is bound to it.
    pub fn lease(&self) -> i64 {
        self.inner.lease
    }

    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Whether the member may still act on what it holds: the lease was renewed recently
    /// enough that etcd cannot yet have let it run out.
    pub fn is_live(&self) -> bool {
        let liveness = self.inner.liveness.lock().unwrap();
        !liveness.lost && Instant::now() < liveness.deadline
    }

    /// How long the member may still count itself live without another renewal (zero once
    /// it may not): a bound for waits that end in acting on what it holds.
    pub fn time_left(&self) -> Duration {
        let liveness = self.inner.liveness.lock().unwrap();
        if liveness.lost {
            Duration::ZERO
        } else {
            liveness.deadline.saturating_duration_since(Instant::now())
        }
    }

    pub(crate) fn ensure_live(&self) -> Result<(), CoordError> {
        let liveness = self.inner.liveness.lock().unwrap();
        if liveness.lost {
            Err(self.fenced())
        } else if Instant::now() >= liveness.deadline {
            Err(CoordError::Fenced(format!(
                "member {:?}: no renewal of its lease {:x} reached etcd in time, so it may have run out",
                self.inner.name, self.inner.lease
            )))
        } else {
            Ok(())
        }
    }

    /// How long one renewal may take: a third of the TTL, so a renewal stuck on a dead etcd
    /// node leaves time for the next to reach a live one before the lease runs out.
    fn attempt_timeout(&self) -> Duration {
        (self.inner.ttl / 3)
            .min(self.inner.coord.timeout)
            .max(Duration::from_millis(100))
    }

    fn fenced(&self) -> CoordError {
        CoordError::Fenced(format!(
            "member {:?}: its lease {:x} has run out",
            self.inner.name, self.inner.lease
        ))
    }

    fn mark_lost(&self) {
        self.inner.liveness.lock().unwrap().lost = true;
    }

    /// Renews the lease once. `Fenced` once etcd has let it run out: the member must join
    /// again, as a new session, and take its claims afresh.
    pub async fn renew(&self) -> Result<(), CoordError> {
        if self.inner.liveness.lock().unwrap().lost {
            return Err(self.fenced());
        }
        let coord = &self.inner.coord;
        let mut client = coord.client.clone();
        let lease = self.inner.lease;
        let sent = Instant::now();
        let renewal = coord
            .call_within("renewing the lease", self.attempt_timeout(), async move {
                let (mut keeper, mut stream) = client.lease_keep_alive(lease).await?;
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await;
        let answer = match renewal {
            Ok(answer) => answer,
            // The keep-alive failed: ask etcd whether the lease still exists, so that a lease
            // etcd has dropped is told apart from an etcd that did not answer.
            Err(e) => match self.remaining().await {
                Ok(None) => {
                    self.mark_lost();
                    tracing::warn!(member = %self.inner.name, lease, "lease ran out: fenced");
                    return Err(self.fenced());
                }
                _ => return Err(e),
            },
        };
        match answer {
            Some(response) if response.ttl() > 0 => {
                let mut liveness = self.inner.liveness.lock().unwrap();
                let deadline = sent + Duration::from_secs(response.ttl() as u64);
                liveness.deadline = liveness.deadline.max(deadline);
                Ok(())
            }
            Some(_) => {
                self.mark_lost();
                tracing::warn!(member = %self.inner.name, lease, "lease ran out: fenced");
                Err(self.fenced())
            }
            None => Err(CoordError::Unavailable {
                what: "renewing the lease".into(),
                why: "etcd closed the keep-alive stream".into(),
            }),
        }
    }

    /// The lease's time left according to etcd; `None` once etcd no longer knows it.
    async fn remaining(&self) -> Result<Option<Duration>, CoordError> {
        let lease = self.inner.lease;
        let answer = self
            .inner
            .coord
            .read_within(
                "reading the lease",
                self.attempt_timeout(),
                |mut client| async move { client.lease_time_to_live(lease, None).await },
            )
            .await?;
        // etcd answers -1 for a lease it no longer holds, and whole seconds left for one it
        // does: 0 is a lease in its last second, still alive, its claims still standing.
        Ok((answer.ttl() >= 0).then(|| Duration::from_secs(answer.ttl() as u64)))
    }

    /// Renews the lease every third of its TTL until etcd says it has run out; dropping the
    /// returned guard stops it. While renewals fail for want of etcd the session stays live
    /// only until the last accepted renewal's deadline.
    pub fn heartbeat(&self) -> Heartbeat {
        let session = self.clone();
        let period = (self.inner.ttl / 3).max(Duration::from_millis(100));
        let task = tokio::spawn(async move {
            let mut pause = period;
            loop {
                tokio::time::sleep(pause).await;
                // After a failure, try again soon: the next attempt may reach a live node.
                pause = period / 4;
                match session.renew().await {
                    Ok(()) => pause = period,
                    Err(CoordError::Fenced(_)) => return,
                    // Without etcd the session lapses locally (is_live turns false) but is
                    // not lost: if a later renewal finds the lease still alive, nothing bound
                    // to it can have passed to anyone else, and the member is live again.
                    Err(e) => {
                        tracing::warn!(member = %session.inner.name, error = %e, live = session.is_live(), "heartbeat failed");
                    }
                }
            }
        });
        Heartbeat { task }
    }

    /// Leaves the cluster: the lease is revoked, so the member record and every claim bound
    /// to it go at once instead of at expiry.
    pub async fn close(self) -> Result<(), CoordError> {
        self.mark_lost();
        let coord = &self.inner.coord;
        let mut client = coord.client.clone();
        coord
            .call("revoking the lease", client.lease_revoke(self.inner.lease))
            .await?;
        tracing::info!(member = %self.inner.name, "left the cluster");
        Ok(())
    }
}

/// The running heartbeat of a session; dropping it stops the renewals.
pub struct Heartbeat {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Coord {
    /// Whether etcd still holds `lease`: a client whose lease is gone is fenced, and its
    /// intervals in doubt are the bricks' to resolve.
    pub async fn lease_alive(&self, lease: i64) -> Result<bool, CoordError> {
        let answer = self
            .read("reading a lease", |mut client| async move {
                client.lease_time_to_live(lease, None).await
            })
            .await?;
        // -1: gone. 0: in its last second, and alive until etcd revokes it (a client reported
        // fenced then could still be sending, and the bricks would resolve under it).
        Ok(answer.ttl() >= 0)
    }

    /// The live members, in name order.
    pub async fn members(&self) -> Result<Vec<Member>, CoordError> {
        let prefix = self.keys.members();
        let response = self
            .read("listing members", |mut client| {
                let prefix = prefix.clone();
                async move {
                    client
                        .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
                        .await
                }
            })
            .await?;
        response
            .kvs()
            .iter()
            .map(|kv| {
                Ok(Member {
                    record: crate::catalog::decode(kv)?,
                    lease: kv.lease(),
                })
            })
            .collect()
    }
}
