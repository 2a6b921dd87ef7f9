//! Lock verbs for NBD clients: NBD has no lock command, so a lock-aware client opens a lock
//! session on the admin socket beside its NBD connection. The session is one lock holder;
//! each lock goes down the export's stack (`Control::Lock`) to the shared volumes under it.
//! Everything the session holds is released when its client goes.
//!
//! Protocol: after `{"cmd":"lock-session"}`, one JSON request per line, one reply per line:
//! - `{"lock":{"export":"vol","offset":0,"len":4096,"shared":false}}` →
//!   `{"locked":{"id":1,"parts":["volume v: [0, 4096) exclusive"]}}`
//! - `{"unlock":{"id":1}}` → `{"unlocked":1}`
//! - a refused request → `{"error":"…"}`; the session goes on.
//!
//! A lock waits for other holders (on this host and others) up to the volume's timeout. An
//! unlock commits what the host's volume has pending; writes the client made on its NBD
//! connection are that connection's stream, so the client flushes them before it unlocks.

use std::collections::BTreeMap;

use serde::Deserialize;
use strata_core::lock::{self, HeldLock, LockHolder, LockRequest};
use strata_core::BlockError;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, info, warn};

use crate::admin::AdminState;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
enum SessionRequest {
    Lock {
        export: String,
        offset: u64,
        len: u64,
        #[serde(default)]
        shared: bool,
    },
    Unlock {
        id: u64,
    },
}

/// The longest request line a session reads.
const MAX_LINE: usize = 4096;

/// Serves one lock session until its client closes the connection (or the server goes),
/// then releases what it still holds.
pub async fn run<R, W>(mut reader: R, mut writer: W, state: &AdminState) -> anyhow::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let holder = LockHolder::new();
    let mut held: BTreeMap<u64, HeldLock> = BTreeMap::new();
    let mut next_id = 1;
    info!(?holder, "lock session opened");
    let served = async {
        let mut line = String::new();
        loop {
            line.clear();
            if read_line(&mut reader, &mut line).await? == 0 {
                return anyhow::Ok(());
            }
            let reply = match serde_json::from_str::<SessionRequest>(&line) {
                Ok(SessionRequest::Lock {
                    export,
                    offset,
                    len,
                    shared,
                }) => {
                    let request = LockRequest {
                        holder,
                        offset,
                        len,
                        exclusive: !shared,
                    };
                    match take(state, &export, request).await {
                        Ok(lock) => {
                            let id = next_id;
                            next_id += 1;
                            let parts = lock.describe();
                            debug!(?holder, id, ?parts, "locked");
                            held.insert(id, lock);
                            serde_json::json!({ "locked": { "id": id, "parts": parts } })
                        }
                        Err(error) => {
                            warn!(?holder, %export, offset, len, %error, "lock refused");
                            serde_json::json!({ "error": error })
                        }
                    }
                }
                Ok(SessionRequest::Unlock { id }) => match held.remove(&id) {
                    Some(lock) => match lock.unlock().await {
                        Ok(()) => serde_json::json!({ "unlocked": id }),
                        Err(error) => {
                            warn!(?holder, id, %error, "unlock: the commit before it failed");
                            serde_json::json!({ "error": format!(
                                "lock {id} is released, but what the host had pending was not committed: {error}"
                            ) })
                        }
                    },
                    None => serde_json::json!({ "error": format!("no lock {id} in this session") }),
                },
                Err(error) => {
                    warn!(?holder, %error, "bad lock-session request");
                    serde_json::json!({ "error": format!("bad request: {error}") })
                }
            };
            writer.write_all(format!("{reply}\n").as_bytes()).await?;
        }
    }
    .await;
    // The client is gone, or its connection broke: nothing it holds may stay held.
    let left = held.len();
    for (id, lock) in held.into_iter().rev() {
        if let Err(error) = lock.unlock().await {
            warn!(?holder, id, %error, "releasing a lock of a closed session: the commit before it failed");
        }
    }
    info!(?holder, released = left, "lock session closed");
    served
}

/// Reads one line of at most [`MAX_LINE`] bytes; 0 at the end of the stream.
async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut String,
) -> anyhow::Result<usize> {
    let mut limited = (&mut *reader).take(MAX_LINE as u64 + 1);
    let read = limited.read_line(line).await?;
    if read > MAX_LINE {
        anyhow::bail!("a lock-session request is longer than {MAX_LINE} bytes");
    }
    Ok(read)
}

/// Takes `request` on the device of `export`.
async fn take(state: &AdminState, export: &str, request: LockRequest) -> Result<HeldLock, String> {
    let exports = state.exports.list();
    let Some(export) = exports.iter().find(|e| e.name == export) else {
        let names: Vec<&str> = exports.iter().map(|e| e.name.as_str()).collect();
        return Err(format!("no export {export:?} (exports: {names:?})"));
    };
    match lock::lock(export.device.as_ref(), request).await {
        Ok(held) => Ok(held),
        Err(BlockError::Unsupported(what)) => Err(format!(
            "export {}: its stack does not carry range locks ({what}): locks are held by \
             shared volumes, and pass down through filters, slice, concat, stripe, mirror and \
             crypt; thin pools, raid5, staging logs and migrating devices refuse them",
            export.name
        )),
        Err(error) => Err(format!("export {}: {error}", export.name)),
    }
}
