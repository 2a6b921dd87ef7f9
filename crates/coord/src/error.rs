use std::time::Duration;

/// What a coordination request can end in. Every error names what was asked, so a log line or
/// a CLI message says which record or claim it was about.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    /// etcd did not answer in time or refused for want of a quorum: nothing was decided, and
    /// the caller must not act as if it had been.
    #[error("etcd unavailable while {what}: {why}")]
    Unavailable { what: String, why: String },
    #[error("{0} already exists")]
    Exists(String),
    #[error("{0} does not exist")]
    NotFound(String),
    /// The record changed between reading it and writing it back.
    #[error("{0} changed concurrently; read it again")]
    Conflict(String),
    #[error("{what} is held by {holder} (epoch {epoch})")]
    Held {
        what: String,
        holder: String,
        epoch: i64,
    },
    /// The member's lease ran out (or the claim passed to another): what it held is gone, and
    /// it must not write on the strength of it.
    #[error("fenced: {0}")]
    Fenced(String),
    /// A record in etcd that cannot be read: reported, never treated as absent.
    #[error("damaged record {key}: {why}")]
    Damaged { key: String, why: String },
    /// A roll-back of the volume is under way (or was interrupted and must be run again):
    /// nothing may claim its segments or take a version of it until it has finished.
    #[error("volume {volume:?} is being rolled back to version {version}; run the roll-back again to finish it")]
    RollingBack { volume: String, version: u64 },
    /// The volume's record changed since the caller read it (a brick was replaced): the
    /// caller must read the volume again before it writes.
    #[error("the bricks of volume {volume:?} changed; the volume must be read again")]
    CatalogChanged { volume: String },
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl CoordError {
    pub(crate) fn from_etcd(what: &str, error: etcd_client::Error) -> CoordError {
        CoordError::Unavailable {
            what: what.to_string(),
            why: error.to_string(),
        }
    }

    pub(crate) fn unavailable_after(what: &str, timeout: Duration) -> CoordError {
        CoordError::Unavailable {
            what: what.to_string(),
            why: format!("no answer within {timeout:?}"),
        }
    }
}
