//! What `strata status` shows of a migrate layer: each child's response time and deviation,
//! δ, where the data is, migrations (per second and in all), merges, and the counters.

use std::sync::atomic::{AtomicU64, Ordering};

use strata_core::{describe, NodeStatus, Result};

use crate::migrate::Migrate;
use crate::policy::{self, Delta};

/// Running totals since the layer was opened.
#[derive(Debug)]
pub struct Counters {
    pub migrations: AtomicU64,
    pub migrated_blocks: AtomicU64,
    pub read_migrations: AtomicU64,
    pub write_migrations: AtomicU64,
    /// Migrations the rule wanted but the chunk was not in the candidate list.
    pub not_candidate: AtomicU64,
    /// Migrations the rule wanted but no token was left.
    pub no_token: AtomicU64,
    /// Read migrations the rule wanted but `MAX_MIGRATIONS_IN_FLIGHT` were in flight, or
    /// one of the same chunk was.
    pub in_flight_skips: AtomicU64,
    pub migration_failures: AtomicU64,
    /// Read migrations dropped because the chunk changed between the read and the move.
    pub migration_races: AtomicU64,
    /// Read migrations cancelled before they ran (the background work stopped).
    pub migrations_cancelled: AtomicU64,
    pub merges: AtomicU64,
    pub merged_blocks: AtomicU64,
    pub unmapped_blocks: AtomicU64,
    /// Per child: requests the layer sent it (timed), and migrations toward it.
    pub child_requests: Vec<AtomicU64>,
    pub moved_to: Vec<AtomicU64>,
    /// Migrations by (source, destination): `moved[src][dst]`.
    pub moved: Vec<Vec<AtomicU64>>,
}

/// A copy of the counters, by name (the order status prints them in).
pub type CountersSnapshot = Vec<(String, u64)>;

impl Counters {
    pub fn new(children: usize) -> Self {
        let per = || (0..children).map(|_| AtomicU64::new(0)).collect();
        Counters {
            migrations: AtomicU64::new(0),
            migrated_blocks: AtomicU64::new(0),
            read_migrations: AtomicU64::new(0),
            write_migrations: AtomicU64::new(0),
            not_candidate: AtomicU64::new(0),
            no_token: AtomicU64::new(0),
            in_flight_skips: AtomicU64::new(0),
            migration_failures: AtomicU64::new(0),
            migration_races: AtomicU64::new(0),
            migrations_cancelled: AtomicU64::new(0),
            merges: AtomicU64::new(0),
            merged_blocks: AtomicU64::new(0),
            unmapped_blocks: AtomicU64::new(0),
            child_requests: per(),
            moved_to: per(),
            moved: (0..children).map(|_| per()).collect(),
        }
    }

    /// The layer-wide counters (status adds the per-child ones, [`Counters::per_child`]).
    pub fn snapshot(&self) -> CountersSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out: CountersSnapshot = [
            ("migrations", &self.migrations),
            ("migrated blocks", &self.migrated_blocks),
            ("read migrations", &self.read_migrations),
            ("write migrations", &self.write_migrations),
            ("skipped not candidate", &self.not_candidate),
            ("skipped no token", &self.no_token),
            ("skipped in flight", &self.in_flight_skips),
            ("migration failures", &self.migration_failures),
            ("migrations dropped by a race", &self.migration_races),
            ("migrations cancelled", &self.migrations_cancelled),
            ("merges", &self.merges),
            ("merged blocks", &self.merged_blocks),
            ("unmapped blocks", &self.unmapped_blocks),
        ]
        .into_iter()
        .map(|(name, c)| (name.to_string(), get(c)))
        .collect();
        for (i, (requests, moved_to)) in self.per_child().into_iter().enumerate() {
            out.push((format!("child {i} requests"), requests));
            out.push((format!("migrations to child {i}"), moved_to));
        }
        out
    }

    /// Migrations by (source, destination), for every ordered pair of two children.
    pub fn per_pair(&self) -> Vec<(usize, usize, u64)> {
        let mut out = Vec::new();
        for (src, row) in self.moved.iter().enumerate() {
            for (dst, count) in row.iter().enumerate() {
                if src != dst {
                    out.push((src, dst, count.load(Ordering::Relaxed)));
                }
            }
        }
        out
    }

    /// Per child: (requests the layer sent it, migrations toward it).
    pub fn per_child(&self) -> Vec<(u64, u64)> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        self.child_requests
            .iter()
            .zip(&self.moved_to)
            .map(|(r, m)| (get(r), get(m)))
            .collect()
    }
}

fn ms(us: f64) -> String {
    format!("{:.2} ms", us / 1000.0)
}

impl Migrate {
    /// The counters by name (tests, status), the per-child ones last.
    pub fn counters(&self) -> CountersSnapshot {
        self.counters.snapshot()
    }

    /// The layer-wide counters only (metrics: the per-child ones are labelled instead).
    pub fn layer_counters(&self) -> CountersSnapshot {
        let children = self.children.len();
        let mut all = self.counters.snapshot();
        all.truncate(all.len() - 2 * children);
        all
    }

    /// Migrations by (source, destination), every ordered pair of two children.
    pub fn pair_counters(&self) -> Vec<(usize, usize, u64)> {
        self.counters.per_pair()
    }

    /// Per child: (requests the layer sent it, migrations toward it).
    pub fn child_counters(&self) -> Vec<(u64, u64)> {
        self.counters.per_child()
    }

    /// δ now between the slowest and the fastest child (microseconds).
    pub fn current_delta_us(&self) -> f64 {
        let stats = self.response_times();
        let by_response = |better: bool| {
            (0..stats.len())
                .max_by(|&a, &b| {
                    let (x, y) = (stats[a].response_us(), stats[b].response_us());
                    if better {
                        y.total_cmp(&x)
                    } else {
                        x.total_cmp(&y)
                    }
                })
                .unwrap_or(0)
        };
        let (slow, fast) = (by_response(false), by_response(true));
        if slow == fast {
            return match self.settings.delta {
                Delta::Fixed(d) => d.as_secs_f64() * 1e6,
                adaptive => policy::delta_us(adaptive, &stats, 0, 0),
            };
        }
        policy::delta_us(self.settings.delta, &stats, slow, fast)
    }

    /// Migrations per second since the previous status (since the open, the first time).
    fn migration_rate(&self) -> f64 {
        let now = self.now();
        let total = self.counters.migrations.load(Ordering::Relaxed);
        let mut last = self
            .last_status
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let seconds = now.saturating_sub(last.0).as_secs_f64();
        let rate = if seconds > 0.0 {
            (total - last.1) as f64 / seconds
        } else {
            0.0
        };
        *last = (now, total);
        rate
    }

    pub async fn describe(&self) -> Result<NodeStatus> {
        let mut node = NodeStatus::new(&self.name, "migrate", self.shape.size());
        let stats = self.response_times();
        let blocks = self.blocks_per_device();
        let (free, pending) = {
            let space = self.space()?;
            let free: Vec<usize> = space.free.iter().map(|f| f.len()).collect();
            (free, space.pending.len())
        };
        let delta = match self.settings.delta {
            Delta::Adaptive => format!("adaptive, now {}", ms(self.current_delta_us())),
            Delta::Pair => format!("pair, now {}", ms(self.current_delta_us())),
            Delta::Fixed(d) => format!("fixed {}", ms(d.as_secs_f64() * 1e6)),
        };
        let mut detail: Vec<(String, String)> = vec![
            ("policy".into(), String::from(self.settings.policy)),
            ("allocation".into(), String::from(self.settings.allocation)),
            ("delta".into(), delta),
            (
                "tokens".into(),
                format!(
                    "{} per second, at most {}",
                    self.settings.tokens_per_s, self.settings.token_cap
                ),
            ),
            (
                "migrations per second".into(),
                format!("{:.2}", self.migration_rate()),
            ),
            (
                "migrations in flight".into(),
                format!(
                    "{} (at most {})",
                    self.migrations_in_flight(),
                    crate::migrate::MAX_MIGRATIONS_IN_FLIGHT
                ),
            ),
            ("partial chunks".into(), self.partial_chunks().to_string()),
            ("slots waiting for a commit".into(), pending.to_string()),
        ];
        for (i, stat) in stats.iter().enumerate() {
            detail.push((
                format!("child {i} response"),
                format!(
                    "{} ± {} ({} samples)",
                    ms(stat.mean_us),
                    ms(stat.deviation_us),
                    stat.samples
                ),
            ));
            detail.push((format!("child {i} blocks"), blocks[i].to_string()));
            detail.push((
                format!("child {i} free slots"),
                format!("{} of {}", free[i], self.shape.slots[i]),
            ));
        }
        for (src, dst, count) in self.counters.per_pair() {
            detail.push((
                format!("migrations child {src} to child {dst}"),
                count.to_string(),
            ));
        }
        let store_space = self.store.space();
        detail.push((
            "metadata".into(),
            format!(
                "{} of {} bytes",
                store_space.used_bytes, store_space.capacity_bytes
            ),
        ));
        if store_space.failed.is_some() {
            node.health = strata_core::Health::Failed;
        }
        detail.extend(
            self.counters
                .snapshot()
                .into_iter()
                .map(|(name, value)| (name, value.to_string())),
        );
        node.detail = detail;
        node.config = self.config().cloned();
        for child in &self.children {
            if let Ok(status) = describe(child.as_ref()).await {
                node.children.push(status);
            }
        }
        Ok(node)
    }
}
