//! A pool's run-time policies, as the configuration names them, and what each one promises.
//! None of them is recorded on disk: they can change at any restart.

use std::time::Duration;

/// When the mapping a write creates is committed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MapCommit {
    /// On FLUSH and FUA requests and by the commit timer (dm-thin's contract, the paper's
    /// batched hardening): an acknowledged write that allocated an extent can still read
    /// back as zeros after a power cut until the next FLUSH, like any write a disk holds in
    /// its volatile cache.
    #[default]
    Batched,
    /// The paper's extent-based hardening: a write that allocates an extent (or revives
    /// discarded granules) completes only once its mapping is durable. The mapping may not
    /// reach the disk before the data it points to (the pool would show stale bytes of
    /// another volume after a crash), so the commit flushes the data first: such a write is
    /// durable when it completes, as if it carried FUA. Overwrites of live granules keep the
    /// volatile-cache contract and cost nothing extra.
    Extent,
}

impl MapCommit {
    pub fn parse(text: &str) -> Result<MapCommit, String> {
        match text {
            "batched" => Ok(MapCommit::Batched),
            "extent" => Ok(MapCommit::Extent),
            other => Err(format!(
                "{other:?} is not a map commit mode (\"batched\" or \"extent\")"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MapCommit::Batched => "batched",
            MapCommit::Extent => "extent",
        }
    }
}

/// What a write that needs a new extent does when none is free.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WhenFull {
    /// Fails at once with ENOSPC. Writes into mapped extents keep working.
    #[default]
    Fail,
    /// Waits up to this long for a discard, a zeroing or a volume delete to free an extent,
    /// then fails with ENOSPC.
    Wait(Duration),
}

/// How long `when-full = "wait"` holds a write when `full-wait` is not given.
pub const DEFAULT_FULL_WAIT: Duration = Duration::from_secs(30);

impl WhenFull {
    /// From the `when-full` and `full-wait` options (`full-wait` already parsed).
    pub fn parse(policy: Option<&str>, wait: Option<Duration>) -> Result<WhenFull, String> {
        match (policy.unwrap_or("fail"), wait) {
            ("fail", None) => Ok(WhenFull::Fail),
            ("fail", Some(_)) => {
                Err("field `full-wait`: applies only with `when-full = \"wait\"`".to_string())
            }
            ("wait", Some(wait)) if wait.is_zero() => Err(
                "field `full-wait`: must be longer than 0 (or use `when-full = \"fail\"`)"
                    .to_string(),
            ),
            ("wait", wait) => Ok(WhenFull::Wait(wait.unwrap_or(DEFAULT_FULL_WAIT))),
            (other, _) => Err(format!(
                "field `when-full`: {other:?} is not a policy (\"fail\" or \"wait\")"
            )),
        }
    }

    pub fn describe(self) -> String {
        match self {
            WhenFull::Fail => "fail".to_string(),
            WhenFull::Wait(wait) => format!("wait up to {}s", wait.as_secs_f64()),
        }
    }
}

/// The share of data extents allocated above which the pool reports low space.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LowWater(f64);

impl Default for LowWater {
    fn default() -> Self {
        LowWater(0.8)
    }
}

impl LowWater {
    /// `"80%"`, `"92.5%"`: more than 0 and at most 100 percent.
    pub fn parse(text: &str) -> Result<LowWater, String> {
        let bad = || format!("{text:?} is not a percentage from 1% to 100%, such as \"80%\"");
        let number = text.trim().strip_suffix('%').ok_or_else(bad)?;
        let percent: f64 = number.trim().parse().map_err(|_| bad())?;
        if !(percent > 0.0 && percent <= 100.0) {
            return Err(bad());
        }
        Ok(LowWater(percent / 100.0))
    }

    pub fn percent(self) -> f64 {
        self.0 * 100.0
    }

    /// Allocated extents at which a pool of `extents` is low on space (at least 1).
    pub fn threshold(self, extents: u64) -> u64 {
        ((extents as f64 * self.0).ceil() as u64).clamp(1, extents.max(1))
    }
}

/// What a read-only look at the pool's metadata region found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataFound {
    /// The store recovers.
    Valid,
    /// No valid superblock, and the whole region reads as zeros.
    Blank,
    /// Anything else: no superblock over a non-zero region (superblocks damaged in front of
    /// surviving checkpoints and journal), a damaged checkpoint or journal batch; with why.
    Damaged(String),
}

/// What a pool does at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolStart {
    Open,
    Format,
    Refuse(String),
}

/// Formatting destroys whatever the region held, so it needs both the server's permission
/// (every disk under the pool was blank and unlabelled, or the operator asked) and a region
/// that holds nothing. Damage is never formatted over, whatever the policy: the operator
/// must see it (`strata check`) before anything is written.
pub fn pool_start(found: &MetadataFound, may_format: bool) -> PoolStart {
    match found {
        MetadataFound::Valid => PoolStart::Open,
        MetadataFound::Damaged(why) => PoolStart::Refuse(format!(
            "the thin pool metadata is damaged ({why}); refusing to open or format it: run \
             `strata check`"
        )),
        MetadataFound::Blank if may_format => PoolStart::Format,
        MetadataFound::Blank => PoolStart::Refuse(
            "the disk is labelled as holding this hierarchy but the thin pool metadata is \
             missing (its region is all zeros: zeroed, or never written); if this is a new \
             layer, start it with `strata serve --format LAYER`"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_commit_modes() {
        assert_eq!(MapCommit::parse("extent"), Ok(MapCommit::Extent));
        assert_eq!(MapCommit::parse("batched"), Ok(MapCommit::Batched));
        let error = MapCommit::parse("sync").unwrap_err();
        assert!(error.contains("\"batched\" or \"extent\""), "{error}");
    }

    #[test]
    fn full_policies_and_their_bound() {
        assert_eq!(WhenFull::parse(None, None), Ok(WhenFull::Fail));
        assert_eq!(
            WhenFull::parse(Some("wait"), None),
            Ok(WhenFull::Wait(DEFAULT_FULL_WAIT))
        );
        let two = Duration::from_secs(2);
        assert_eq!(
            WhenFull::parse(Some("wait"), Some(two)),
            Ok(WhenFull::Wait(two))
        );
        assert!(WhenFull::parse(Some("fail"), Some(two))
            .unwrap_err()
            .contains("only with"));
        assert!(WhenFull::parse(Some("wait"), Some(Duration::ZERO))
            .unwrap_err()
            .contains("longer than 0"));
        assert!(WhenFull::parse(Some("block"), None)
            .unwrap_err()
            .contains("\"block\" is not a policy"));
    }

    #[test]
    fn low_water_is_a_percentage_of_the_extents() {
        let mark = LowWater::parse("80%").unwrap();
        assert_eq!(mark.threshold(10), 8);
        assert_eq!(mark.threshold(1000), 800);
        assert_eq!(LowWater::parse(" 92.5 % ").unwrap().threshold(1000), 925);
        assert_eq!(LowWater::parse("100%").unwrap().threshold(7), 7);
        assert_eq!(
            LowWater::parse("1%").unwrap().threshold(7),
            1,
            "at least one"
        );
        for bad in ["80", "0%", "101%", "-5%", "x%", "nan%"] {
            let error = LowWater::parse(bad).unwrap_err();
            assert!(error.contains("percentage"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_pool_formats_only_a_blank_region_with_permission() {
        use super::{pool_start, MetadataFound, PoolStart};
        assert_eq!(pool_start(&MetadataFound::Valid, false), PoolStart::Open);
        assert_eq!(pool_start(&MetadataFound::Valid, true), PoolStart::Open);
        assert_eq!(pool_start(&MetadataFound::Blank, true), PoolStart::Format);
        let PoolStart::Refuse(why) = pool_start(&MetadataFound::Blank, false) else {
            panic!("a blank region without permission must be refused");
        };
        assert!(why.contains("strata serve --format"), "{why}");
        for may_format in [false, true] {
            let found = MetadataFound::Damaged("checkpoint crc".into());
            let PoolStart::Refuse(why) = pool_start(&found, may_format) else {
                panic!("damage must be refused");
            };
            assert!(why.contains("checkpoint crc") && why.contains("strata check"));
        }
    }
}
