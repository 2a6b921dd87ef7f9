//! Each shared volume's version counter: the number the next globally consistent version of
//! the volume takes. Advanced by compare-and-swap, so two members advancing it at once get two
//! different numbers, each exactly once.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::keys::check_name;
use crate::{Coord, CoordError};

/// How often `next_version` retries when others advance the counter between its read and its
/// write, before it reports the contention.
const ATTEMPTS: usize = 64;

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
        let number = std::str::from_utf8(kv.value())
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| CoordError::Damaged {
                key: key.clone(),
                why: format!(
                    "not a version number: {:?}",
                    String::from_utf8_lossy(kv.value())
                ),
            })?;
        Ok((number, kv.mod_revision()))
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
}
