//! Coordination of Strata's shared volumes on etcd (issue 19, Orchestra/RIBD).
//!
//! Strata runs no consensus or failure detector of its own. etcd holds what every host must
//! agree on, and its primitives give the guarantees:
//! - [`session`]: a member (a serving host, a brick server) is live while its etcd
//!   lease is; the lease is renewed by heartbeat, and a member counts itself lost no later than
//!   etcd does;
//! - [`catalog`]: the bricks and the shared volumes laid over them, created only where nothing
//!   is, each change checked against the record it replaces;
//! - [`claims`]: which member may write each segment of a volume, taken in a transaction and
//!   bound to the claimant's lease; the claim's etcd revision is its fencing epoch, so a later
//!   claim always carries a larger one;
//! - [`versions`]: each shared volume's version counter, advanced by compare-and-swap;
//! - [`wants`]: a member waiting for a segment says so, and the holder gives it back;
//! - [`stale`]: which bricks of a volume miss which regions, recorded before a write skips
//!   them and cleared as the regions are copied back.
//!
//! Every key lives under `/strata/<cluster>/` (see `docs/shared-volumes.md`, "Coordination").

pub mod catalog;
pub mod claims;
mod error;
mod keys;
pub mod replace;
pub mod session;
pub mod stale;
pub mod versions;
pub mod wants;

use std::future::Future;
use std::time::Duration;

pub use error::CoordError;
pub use keys::valid_name;

use keys::Keys;

/// How long a failed read waits before it asks again.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// A connection to the etcd cluster holding one Strata cluster's coordination state.
#[derive(Clone)]
pub struct Coord {
    client: etcd_client::Client,
    keys: Keys,
    timeout: Duration,
}

impl Coord {
    /// Connects to any of `endpoints` (`http://host:port`). `timeout` bounds every request:
    /// without a quorum etcd cannot answer, and the caller gets `Unavailable` instead of a wait.
    pub async fn connect(
        endpoints: &[String],
        cluster: &str,
        timeout: Duration,
    ) -> Result<Coord, CoordError> {
        keys::check_name("cluster", cluster)?;
        if endpoints.is_empty() {
            return Err(CoordError::Invalid("no etcd endpoint given".into()));
        }
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(Duration::from_secs(2), timeout);
        let client = tokio::time::timeout(
            timeout,
            etcd_client::Client::connect(endpoints, Some(options)),
        )
        .await
        .map_err(|_| CoordError::unavailable_after("connecting", timeout))?
        .map_err(|e| CoordError::from_etcd("connecting", e))?;
        Ok(Coord {
            client,
            keys: Keys::new(cluster),
            timeout,
        })
    }

    /// The name of the cluster this connection coordinates.
    pub fn cluster(&self) -> &str {
        self.keys.cluster()
    }

    /// Runs a read under the connection's timeout, retrying while etcd cannot answer (an
    /// election in progress, a node restarting): a read changes nothing, so trying again is
    /// always safe.
    async fn read<T, F, Fut>(&self, what: &str, request: F) -> Result<T, CoordError>
    where
        F: FnMut(etcd_client::Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.read_within(what, self.timeout, request).await
    }

    async fn read_within<T, F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut request: F,
    ) -> Result<T, CoordError>
    where
        F: FnMut(etcd_client::Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, request(self.client.clone())).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) if tokio::time::Instant::now() + RETRY_PAUSE < deadline => {
                    tracing::debug!(what, error = %e, "etcd read failed; retrying");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Ok(Err(e)) => return Err(CoordError::from_etcd(what, e)),
                Err(_) => return Err(CoordError::unavailable_after(what, timeout)),
            }
        }
    }

    /// Runs one etcd request under the connection's timeout. Writes are not retried here: a
    /// write whose answer was lost may have been applied, and only its caller knows how to
    /// tell.
    async fn call<T, F>(&self, what: &str, request: F) -> Result<T, CoordError>
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_within(what, self.timeout, request).await
    }

    async fn call_within<T, F>(
        &self,
        what: &str,
        timeout: Duration,
        request: F,
    ) -> Result<T, CoordError>
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        match tokio::time::timeout(timeout, request).await {
            Ok(result) => result.map_err(|e| CoordError::from_etcd(what, e)),
            Err(_) => Err(CoordError::unavailable_after(what, timeout)),
        }
    }
}
