//! Periodic versions (Clotho's periodic snapshots, §1.7): a volume's policy, when its next
//! automatic snapshot is due, which of the snapshots it made go when it keeps only the last K,
//! and what an automatic snapshot is called. Pure: the wall clock and the volume's write count
//! are arguments, so tests drive them without sleeping.

use std::time::Duration;

use crate::versions::Epoch;

/// A volume's periodic-snapshot policy. At least one of `every` and `every_writes` is set
/// (a policy with neither is "off" and is not stored as a schedule).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// A snapshot this long after the last automatic one (or after the policy was set).
    pub every: Option<Duration>,
    /// A snapshot once the volume took this many write requests since the last automatic one.
    pub every_writes: Option<u64>,
    /// Keep only the newest K snapshots the policy made (None: keep them all).
    pub keep: Option<u32>,
}

/// Why a snapshot is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// `every` has passed since the anchor.
    Period,
    /// The volume took `every_writes` writes.
    Writes,
}

/// The longest period accepted: a year (a typo such as `10000d` is refused, not obeyed).
const LONGEST: Duration = Duration::from_secs(365 * 86_400);

/// A period as the policy command writes it: a whole number and one unit, `30s`, `10m`, `2h`
/// or `1d`. Whole numbers only, so that the period is exactly what was typed (no rounding of
/// `0.1h`), from one second to a year.
pub fn parse_period(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{text:?} is not a period: a whole number and s, m, h or d (30s, 10m, 2h, 1d), from \
             1s to 365d"
        )
    };
    let text = text.trim();
    let unit_at = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(unit_at);
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    let count: u64 = number.parse().map_err(|_| bad())?;
    let seconds = count.checked_mul(scale).ok_or_else(bad)?;
    let period = Duration::from_secs(seconds);
    if period.is_zero() || period > LONGEST {
        return Err(bad());
    }
    Ok(period)
}

/// A period written back in the largest unit that keeps it exact (`600s` is `10m`).
pub fn format_period(period: Duration) -> String {
    let seconds = period.as_secs();
    let (unit, scale) = [("d", 86_400), ("h", 3600), ("m", 60)]
        .into_iter()
        .find(|(_, scale)| seconds.is_multiple_of(*scale))
        .unwrap_or(("s", 1));
    format!("{}{unit}", seconds / scale)
}

/// A positive whole number for `field` (`every-writes`, `keep`).
fn positive(field: &str, text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "field `{field}`: {text:?} is not a whole number of at least 1"
        )),
    }
}

impl Schedule {
    /// From the policy command's fields, as text; each error names its field. A schedule
    /// needs `every` or `every-writes`; `keep` alone has nothing to keep.
    pub fn parse(
        every: Option<&str>,
        every_writes: Option<&str>,
        keep: Option<&str>,
    ) -> Result<Schedule, String> {
        let every = every
            .map(|text| parse_period(text).map_err(|e| format!("field `every`: {e}")))
            .transpose()?;
        let every_writes = every_writes
            .map(|text| positive("every-writes", text))
            .transpose()?;
        let keep = keep
            .map(|text| {
                let n = positive("keep", text)?;
                u32::try_from(n).map_err(|_| format!("field `keep`: {n} is too many"))
            })
            .transpose()?;
        if every.is_none() && every_writes.is_none() {
            return Err(
                "a snapshot policy needs `every` (a period) or `every-writes` (a count), or \
                 `off` to remove it"
                    .into(),
            );
        }
        Ok(Schedule {
            every,
            every_writes,
            keep,
        })
    }

    /// "every 10m or 1000 writes, keep 24": what status shows.
    pub fn describe(&self) -> String {
        let mut when = Vec::new();
        if let Some(every) = self.every {
            when.push(format!("every {}", format_period(every)));
        }
        if let Some(writes) = self.every_writes {
            when.push(format!("every {writes} writes"));
        }
        let keep = self
            .keep
            .map_or("keep all".to_string(), |k| format!("keep {k}"));
        format!("{}, {keep}", when.join(" or "))
    }
}

/// Whether `schedule` wants a snapshot now. `anchor_ms` is when the period counts from (the
/// last automatic snapshot, or when the policy was set), `writes` the volume's write requests
/// since then. A wall clock that stepped back more than a period before the anchor (a clock
/// fixed after it ran ahead) makes a snapshot due, which moves the anchor back to the clock:
/// otherwise the volume would go without versions until the clock caught up.
pub fn due(schedule: &Schedule, anchor_ms: u64, now_ms: u64, writes: u64) -> Option<Due> {
    if let Some(every) = schedule.every {
        let every = every.as_millis() as u64;
        let passed = now_ms >= anchor_ms.saturating_add(every);
        let stepped_back = now_ms.saturating_add(every) < anchor_ms;
        if passed || stepped_back {
            return Some(Due::Period);
        }
    }
    match schedule.every_writes {
        Some(n) if writes >= n => Some(Due::Writes),
        _ => None,
    }
}

/// When the period next falls due (None without `every`).
pub fn next_due_ms(schedule: &Schedule, anchor_ms: u64) -> Option<u64> {
    let every = schedule.every?;
    Some(anchor_ms.saturating_add(every.as_millis() as u64))
}

/// A snapshot the policy made, as keep-K sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Made {
    pub epoch: Epoch,
    pub protected: bool,
}

/// Which of the snapshots the policy made go when it keeps `keep`: everything older than the
/// newest `keep`, except protected ones. Protected snapshots stay, and hold a place among the
/// newest K only while they are among them (protecting an old one does not push a new one
/// out). Epochs grow with every snapshot of a volume, so the newest have the highest epochs.
pub fn beyond_keep(made: &[Made], keep: Option<u32>) -> Vec<Epoch> {
    let Some(keep) = keep else {
        return Vec::new();
    };
    let mut made = made.to_vec();
    made.sort_by_key(|m| std::cmp::Reverse(m.epoch));
    made.into_iter()
        .skip(keep as usize)
        .filter(|m| !m.protected)
        .map(|m| m.epoch)
        .collect()
}

/// Civil UTC date and time of `ms` since the Unix epoch: (year, month, day, hour, minute,
/// second), by Howard Hinnant's days-to-civil algorithm.
fn civil(ms: u64) -> (i64, i64, i64, u64, u64, u64) {
    let secs = ms / 1000;
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, rest / 3600, rest % 3600 / 60, rest % 60)
}

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
pub fn utc(ms: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(ms);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}")
}

/// The name of an automatic snapshot taken at `now_ms`: `auto-YYYYMMDD-HHMMSS` (UTC), with
/// `-2`, `-3`… after it when a snapshot of the volume has that name already (two in one
/// second, or a name a person chose).
pub fn auto_name(now_ms: u64, taken: impl Fn(&str) -> bool) -> String {
    let (y, mo, d, h, mi, s) = civil(now_ms);
    let base = format!("auto-{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}");
    if !taken(&base) {
        return base;
    }
    (2u32..)
        .map(|n| format!("{base}-{n}"))
        .find(|name| !taken(name))
        .expect("some suffix is free")
}

/// Milliseconds since the Unix epoch now: the clock automatic snapshots are named and timed by.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;

    #[test]
    fn periods_are_whole_numbers_with_a_unit() {
        assert_eq!(parse_period("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_period("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_period(" 2h "), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_period("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_period("365d"), Ok(LONGEST));
        for bad in [
            "",
            "10",
            "m",
            "0s",
            "0m",
            "1.5h",
            "-1m",
            "10 m",
            "10min",
            "2H",
            "366d",
            "1e3s",
            "99999999999999999999s",
        ] {
            let error = parse_period(bad).unwrap_err();
            assert!(error.contains("is not a period"), "{bad:?}: {error}");
        }
        for period in ["30s", "10m", "90s", "2h", "1d", "36h"] {
            assert_eq!(format_period(parse_period(period).unwrap()), period);
        }
        assert_eq!(format_period(Duration::from_secs(600)), "10m");
    }

    #[test]
    fn a_schedule_names_the_field_it_refuses() {
        let schedule = Schedule::parse(Some("10m"), Some("500"), Some("3")).unwrap();
        assert_eq!(schedule.every, Some(Duration::from_secs(600)));
        assert_eq!(schedule.every_writes, Some(500));
        assert_eq!(schedule.keep, Some(3));
        assert_eq!(schedule.describe(), "every 10m or every 500 writes, keep 3");
        let writes_only = Schedule::parse(None, Some("7"), None).unwrap();
        assert_eq!(writes_only.describe(), "every 7 writes, keep all");
        let cases = [
            (Some("10x"), None, None, "field `every`"),
            (None, Some("0"), None, "field `every-writes`"),
            (None, Some("many"), None, "field `every-writes`"),
            (Some("1m"), None, Some("0"), "field `keep`"),
            (Some("1m"), None, Some("-2"), "field `keep`"),
            (Some("1m"), None, Some("4294967296"), "field `keep`"),
            (None, None, Some("3"), "needs `every`"),
        ];
        for (every, writes, keep, named) in cases {
            let error = Schedule::parse(every, writes, keep).unwrap_err();
            assert!(
                error.contains(named),
                "{every:?} {writes:?} {keep:?}: {error}"
            );
        }
    }

    #[test]
    fn a_snapshot_is_due_by_period_or_by_writes() {
        let both = Schedule {
            every: Some(Duration::from_secs(600)),
            every_writes: Some(100),
            keep: None,
        };
        let anchor = 1_000 * MIN;
        assert_eq!(due(&both, anchor, anchor, 0), None);
        assert_eq!(due(&both, anchor, anchor + 10 * MIN - 1, 99), None);
        assert_eq!(
            due(&both, anchor, anchor + 10 * MIN, 0),
            Some(Due::Period),
            "exactly one period later"
        );
        assert_eq!(due(&both, anchor, anchor + MIN, 100), Some(Due::Writes));
        assert_eq!(next_due_ms(&both, anchor), Some(anchor + 10 * MIN));
        let writes = Schedule {
            every_writes: Some(3),
            ..Schedule::default()
        };
        assert_eq!(
            due(&writes, anchor, u64::MAX, 2),
            None,
            "no period: time alone never"
        );
        assert_eq!(due(&writes, anchor, 0, 3), Some(Due::Writes));
        assert_eq!(next_due_ms(&writes, anchor), None);
        // A clock a little behind the anchor waits; one stepped back by more than a period
        // takes a snapshot (and so moves the anchor) instead of waiting for the old time.
        assert_eq!(due(&both, anchor, anchor - MIN, 0), None);
        assert_eq!(due(&both, anchor, anchor - 11 * MIN, 0), Some(Due::Period));
        // No overflow at the ends of time: the due time saturates at the last millisecond.
        let period = Schedule {
            every: Some(LONGEST),
            ..Schedule::default()
        };
        assert_eq!(due(&period, u64::MAX - 5, u64::MAX - 1, 0), None);
        assert_eq!(next_due_ms(&period, u64::MAX - 5), Some(u64::MAX));
    }

    #[test]
    fn keep_k_deletes_the_oldest_unprotected_beyond_the_newest_k() {
        let made = |epochs: &[(Epoch, bool)]| -> Vec<Made> {
            epochs
                .iter()
                .map(|&(epoch, protected)| Made { epoch, protected })
                .collect()
        };
        let five = made(&[(7, false), (1, false), (3, false), (9, false), (5, false)]);
        assert_eq!(beyond_keep(&five, Some(2)), vec![5, 3, 1]);
        assert_eq!(beyond_keep(&five, Some(5)), Vec::<Epoch>::new());
        assert_eq!(beyond_keep(&five, Some(9)), Vec::<Epoch>::new());
        assert_eq!(beyond_keep(&five, None), Vec::<Epoch>::new(), "keep all");
        // A protected old one stays and does not push a newer one out.
        let protected_old = made(&[(1, true), (3, false), (5, false), (7, false)]);
        assert_eq!(beyond_keep(&protected_old, Some(2)), vec![3]);
        // A protected one among the newest K holds its place.
        let protected_new = made(&[(1, false), (3, false), (5, true), (7, false)]);
        assert_eq!(beyond_keep(&protected_new, Some(2)), vec![3, 1]);
        assert_eq!(beyond_keep(&[], Some(1)), Vec::<Epoch>::new());
    }

    #[test]
    fn automatic_names_are_utc_and_unique() {
        // 2026-11-25 18:05:15.250 UTC
        let at = 1_795_629_915_250;
        assert_eq!(utc(at), "2026-11-25 18:05:15");
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(auto_name(at, |_| false), "auto-20261125-180515");
        let taken = ["auto-20261125-180515", "auto-20261125-180515-2"];
        assert_eq!(
            auto_name(at, |name| taken.contains(&name)),
            "auto-20261125-180515-3"
        );
        for name in [
            auto_name(at, |_| false),
            auto_name(at, |n| taken.contains(&n)),
        ] {
            crate::versions::check_name(&name).unwrap();
        }
    }
}
