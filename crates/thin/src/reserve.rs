//! The space reserve for versions: free data space a pool keeps for its volumes' writes, which
//! versions may not eat. Pure: the options as the configuration writes them, the reserve in
//! extents, whether the pool is below it, and which snapshot `delete-oldest` deletes next.
//!
//! Why a reserve: a snapshot costs nothing when it is taken, but every later first write into
//! an extent it shares takes a new extent. Snapshots kept without limit can fill the pool and
//! fail the volumes' writes with ENOSPC; the reserve lets an operator choose, before that
//! happens, whether new versions are refused or old ones deleted.

use strata_core::ByteSize;

use crate::versions::Epoch;

/// How much free space the reserve keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reserve {
    /// A share of the pool's data space, more than 0 and less than 100 percent.
    Percent(f64),
    /// A number of bytes.
    Bytes(u64),
}

impl Reserve {
    /// `"10%"`, `"12.5%"` or a size such as `"1GiB"`.
    pub fn parse(text: &str) -> Result<Reserve, String> {
        let text = text.trim();
        if let Some(number) = text.strip_suffix('%') {
            let bad =
                || format!("{text:?} is not a percentage above 0% and below 100%, such as \"10%\"");
            let percent: f64 = number.trim().parse().map_err(|_| bad())?;
            if !(percent > 0.0 && percent < 100.0) {
                return Err(bad());
            }
            return Ok(Reserve::Percent(percent));
        }
        let bytes = ByteSize::parse(text)
            .map_err(|e| format!("{text:?} is neither a percentage (\"10%\") nor a size: {e}"))?;
        if bytes.0 == 0 {
            return Err(format!(
                "{text:?}: a reserve of 0 is no reserve (leave it out)"
            ));
        }
        Ok(Reserve::Bytes(bytes.0))
    }

    /// Whole extents kept free in a pool of `extents` extents of `extent_size` bytes: at
    /// least one, rounded up (a reserve is never less than asked), at most the whole pool.
    pub fn extents(self, extents: u64, extent_size: u64) -> u64 {
        let wanted = match self {
            Reserve::Percent(percent) => (extents as f64 * percent / 100.0).ceil() as u64,
            Reserve::Bytes(bytes) => bytes.div_ceil(extent_size.max(1)),
        };
        wanted.clamp(1, extents.max(1))
    }

    /// As the configuration wrote it.
    pub fn describe(self) -> String {
        match self {
            Reserve::Percent(percent) => format!("{percent}%"),
            Reserve::Bytes(bytes) => ByteSize(bytes).to_string(),
        }
    }
}

/// What the pool does when its free space is below the reserve.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WhenReserveLow {
    /// New snapshots, manual and periodic, are refused; existing ones stay.
    #[default]
    Refuse,
    /// The oldest unprotected snapshot of the pool is deleted (and collected), again and
    /// again, until free space is back at the reserve or none is left.
    DeleteOldest,
}

impl WhenReserveLow {
    pub fn parse(text: &str) -> Result<WhenReserveLow, String> {
        match text {
            "refuse" => Ok(WhenReserveLow::Refuse),
            "delete-oldest" => Ok(WhenReserveLow::DeleteOldest),
            other => Err(format!(
                "{other:?} is not a policy (\"refuse\" or \"delete-oldest\")"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            WhenReserveLow::Refuse => "refuse",
            WhenReserveLow::DeleteOldest => "delete-oldest",
        }
    }
}

/// The reserve a pool runs with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReservePolicy {
    pub reserve: Reserve,
    pub when_low: WhenReserveLow,
}

impl ReservePolicy {
    /// From the `snapshot-reserve` and `when-reserve-low` options; None without a reserve
    /// (the default). `when-reserve-low` alone is refused: it would silently do nothing.
    pub fn parse(
        reserve: Option<&str>,
        when_low: Option<&str>,
    ) -> Result<Option<ReservePolicy>, String> {
        let when_low = when_low
            .map(|text| {
                WhenReserveLow::parse(text).map_err(|e| format!("field `when-reserve-low`: {e}"))
            })
            .transpose()?;
        let Some(reserve) = reserve else {
            return match when_low {
                Some(_) => Err(
                    "field `when-reserve-low`: applies only with `snapshot-reserve`".to_string(),
                ),
                None => Ok(None),
            };
        };
        let reserve =
            Reserve::parse(reserve).map_err(|e| format!("field `snapshot-reserve`: {e}"))?;
        Ok(Some(ReservePolicy {
            reserve,
            when_low: when_low.unwrap_or_default(),
        }))
    }
}

/// Whether `free` extents are below a reserve of `reserve` extents.
pub fn below(free: u64, reserve: u64) -> bool {
    free < reserve
}

/// A snapshot `delete-oldest` may consider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub volume: String,
    pub name: String,
    pub created_ms: u64,
    pub epoch: Epoch,
    pub protected: bool,
}

/// The snapshot `delete-oldest` deletes next: the oldest unprotected one of the whole pool
/// (by creation time; ties, such as snapshots taken in one millisecond, by volume and epoch,
/// so the choice is the same on every run).
pub fn oldest_unprotected(candidates: &[Candidate]) -> Option<&Candidate> {
    candidates
        .iter()
        .filter(|c| !c.protected)
        .min_by(|a, b| (a.created_ms, &a.volume, a.epoch).cmp(&(b.created_ms, &b.volume, b.epoch)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_is_a_percentage_or_a_size_in_whole_extents() {
        const EXTENT: u64 = 64 << 10;
        let ten = Reserve::parse("10%").unwrap();
        assert_eq!(ten, Reserve::Percent(10.0));
        assert_eq!(ten.extents(100, EXTENT), 10);
        assert_eq!(ten.extents(101, EXTENT), 11, "rounded up");
        assert_eq!(ten.extents(3, EXTENT), 1, "at least one extent");
        assert_eq!(ten.describe(), "10%");
        let size = Reserve::parse("1MiB").unwrap();
        assert_eq!(size, Reserve::Bytes(1 << 20));
        assert_eq!(size.extents(100, EXTENT), 16);
        assert_eq!(Reserve::Bytes(EXTENT + 1).extents(100, EXTENT), 2);
        assert_eq!(size.extents(4, EXTENT), 4, "at most the pool");
        assert_eq!(size.describe(), "1MiB");
        for bad in ["0%", "100%", "-1%", "x%", "lots", "0", ""] {
            assert!(Reserve::parse(bad).is_err(), "{bad}");
        }
        assert!(below(9, 10) && !below(10, 10) && !below(11, 10));
    }

    #[test]
    fn reserve_options_name_their_field() {
        assert_eq!(ReservePolicy::parse(None, None), Ok(None));
        let policy = ReservePolicy::parse(Some("10%"), None).unwrap().unwrap();
        assert_eq!(policy.when_low, WhenReserveLow::Refuse, "refuse by default");
        let policy = ReservePolicy::parse(Some("2GiB"), Some("delete-oldest"))
            .unwrap()
            .unwrap();
        assert_eq!(policy.reserve, Reserve::Bytes(2 << 30));
        assert_eq!(policy.when_low.name(), "delete-oldest");
        let error = ReservePolicy::parse(None, Some("refuse")).unwrap_err();
        assert!(error.contains("only with `snapshot-reserve`"), "{error}");
        let error = ReservePolicy::parse(Some("10%"), Some("panic")).unwrap_err();
        assert!(error.starts_with("field `when-reserve-low`"), "{error}");
        let error = ReservePolicy::parse(Some("ten"), None).unwrap_err();
        assert!(error.starts_with("field `snapshot-reserve`"), "{error}");
    }

    #[test]
    fn delete_oldest_picks_the_oldest_unprotected_snapshot_of_the_pool() {
        let candidate = |volume: &str, name: &str, created_ms, epoch, protected| Candidate {
            volume: volume.into(),
            name: name.into(),
            created_ms,
            epoch,
            protected,
        };
        let pool = vec![
            candidate("b", "b1", 200, 1, false),
            candidate("a", "a0", 100, 0, true),
            candidate("a", "a2", 300, 2, false),
            candidate("c", "c0", 200, 0, false),
        ];
        let next = oldest_unprotected(&pool).unwrap();
        assert_eq!(
            next.name, "b1",
            "the protected older one is skipped; tie by volume"
        );
        assert_eq!(oldest_unprotected(&pool[1..]).unwrap().name, "c0");
        assert_eq!(
            oldest_unprotected(&pool[1..2]),
            None,
            "only a protected one left"
        );
        assert_eq!(oldest_unprotected(&[]), None);
    }
}
