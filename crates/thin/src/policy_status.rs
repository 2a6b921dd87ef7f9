//! The versions policies in `strata status`: the pool's reserve and what its policies did,
//! and each volume's schedule with its next and last automatic snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use strata_core::ByteSize;

use crate::pool::ThinPool;
use crate::reserve;
use crate::schedule;

impl ThinPool {
    /// The pool's part of status: the reserve, what the policies did since the pool was
    /// opened, and the last thing they did.
    pub(crate) fn policy_detail(&self) -> Vec<(String, String)> {
        let state = &self.versions_policy;
        let count = |key: &str, n: &AtomicU64| (key.to_string(), n.load(Relaxed).to_string());
        let mut detail = Vec::new();
        match &state.reserve {
            None => detail.push(("snapshot reserve".into(), "none".into())),
            Some(policy) => {
                let (free, reserve) = self.reserve_state(policy);
                let extent = self.extent_size();
                detail.push((
                    "snapshot reserve".into(),
                    format!(
                        "{} ({} in {reserve} extents; free {}{})",
                        policy.reserve.describe(),
                        ByteSize(reserve * extent),
                        ByteSize(free * extent),
                        if reserve::below(free, reserve) {
                            ", BELOW"
                        } else {
                            ""
                        }
                    ),
                ));
                detail.push(("when reserve low".into(), policy.when_low.name().into()));
            }
        }
        detail.push(count("snapshots refused for the reserve", &state.refused));
        detail.push(count(
            "snapshots deleted for the reserve",
            &state.reserve_deleted,
        ));
        detail.push(count("automatic snapshots taken", &state.taken));
        detail.push(count(
            "automatic snapshots deleted (keep)",
            &state.kept_deleted,
        ));
        detail.push(count("snapshot policy failures", &state.failed));
        let last = state
            .last_action
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        detail.push((
            "last versions action".into(),
            last.unwrap_or_else(|| "none".into()),
        ));
        detail
    }

    /// A volume's part of status: its schedule, the next and the last automatic snapshot.
    pub(crate) fn volume_policy_detail(&self, volume: &str) -> Vec<(String, String)> {
        let Ok(status) = self.snapshot_policy(volume) else {
            return Vec::new();
        };
        let Some(policy) = status.policy else {
            if status.protected.is_empty() {
                return Vec::new();
            }
            return vec![("protected snapshots".into(), status.protected.join(", "))];
        };
        let mut next = Vec::new();
        if let Some(at) = status.next_due_ms {
            next.push(format!("{} UTC", schedule::utc(at)));
        }
        if let Some(writes) = status.every_writes {
            next.push(format!(
                "after {} more writes",
                writes.saturating_sub(status.writes_since)
            ));
        }
        let mut detail = vec![
            ("snapshot policy".into(), policy),
            ("next automatic snapshot".into(), next.join(" or ")),
            (
                "last automatic snapshot".into(),
                match (&status.last_auto, status.last_auto_ms) {
                    (Some(name), Some(ms)) => format!("{name} at {} UTC", schedule::utc(ms)),
                    _ => "none".into(),
                },
            ),
            ("writes since".into(), status.writes_since.to_string()),
        ];
        if !status.protected.is_empty() {
            detail.push(("protected snapshots".into(), status.protected.join(", ")));
        }
        detail
    }
}
