//! What `strata status` shows of a shared volume.

use super::*;

/// What this host's intervals came to, for `strata status`.
#[derive(Default)]
pub(super) struct VolumeCounters {
    pub(super) committed: AtomicU64,
    pub(super) aborted: AtomicU64,
    pub(super) regions_copied: AtomicU64,
}

impl SharedVolume {
    /// What `strata status` shows: each brick's state as this host sees it, the segments it
    /// holds, what its intervals came to, and the copy back under way.
    pub(super) fn describe(&self) -> NodeStatus {
        let mut node = NodeStatus::new(self.name.clone(), "shared", self.geometry.size);
        // Not behind a commit that may be waiting on a brick: unknown then.
        let owed: Option<BTreeMap<usize, usize>> = self
            .state
            .try_lock()
            .ok()
            .map(|state| state.owed.iter().map(|(&b, d)| (b, d.len())).collect());
        let mut detail = vec![
            ("volume".to_string(), self.name.clone()),
            ("member".to_string(), self.session.name().to_string()),
            ("client".to_string(), format!("{:x}", self.client_id())),
        ];
        let mut degraded = false;
        {
            let rain = self.rain.lock().unwrap();
            for (brick, name) in self.brick_names().iter().enumerate() {
                let missing = rain.missing(brick);
                let mut state = match (rain.is_down(brick), missing) {
                    (true, 0) => "down".to_string(),
                    (true, n) => format!("down, {n} regions to copy back"),
                    (false, 0) => "up".to_string(),
                    (false, n) => format!("stale, {n} regions to copy back"),
                };
                degraded |= rain.is_down(brick) || missing > 0;
                if !self.answers(brick) {
                    state.push_str(", not answering (probed)");
                }
                if let Some(&n) = owed.as_ref().and_then(|owed| owed.get(&brick)) {
                    state.push_str(&format!(", owed {n} decisions"));
                    degraded = true;
                }
                let address = self.brick(brick).address().to_string();
                detail.push((format!("brick {name}"), format!("{state} ({address})")));
            }
        }
        let held = self.claims.held();
        detail.push((
            "segments held".to_string(),
            if held.is_empty() {
                "none".to_string()
            } else {
                (held.iter())
                    .map(|(segment, epoch)| format!("{segment} (epoch {epoch})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ));
        let counters = &self.counters;
        detail.push((
            "intervals".to_string(),
            format!(
                "{} committed, {} aborted, {} in flight",
                counters.committed.load(Ordering::Relaxed),
                counters.aborted.load(Ordering::Relaxed),
                self.flights.count()
            ),
        ));
        detail.push((
            "regions copied back".to_string(),
            counters.regions_copied.load(Ordering::Relaxed).to_string(),
        ));
        node.detail = detail;
        node.health = if !self.session.is_live() {
            Health::Failed
        } else if degraded {
            Health::Degraded
        } else {
            Health::Ok
        };
        node.activity = self.resyncing.lock().unwrap().clone();
        node
    }
}
