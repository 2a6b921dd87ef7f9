//! ALV's valve (paper §2.4): the mover runs or sleeps for a whole period, decided by what
//! the volume saw in the period before. The load of period i is "high" if any user request
//! met congestion on arrival, or if the latecomer ratio LR_i = late_i / N_i exceeds the
//! slack θ, where N_i counts user requests completed in period i and late_i those whose
//! latency inside the volume exceeded the bound B. On/off, no proportional control: the
//! paper's argument is that a volume-internal, short-period signal needs no model of how
//! latency responds to migration rate (unlike Aqueduct, §6).
//!
//! Time is passed in (virtual or real, as a `Duration` since any fixed origin); nothing
//! here reads a clock, so a simulator drives it deterministically.
//!
//! Choices the paper leaves open (§2.4 [?]): a period with no completions (N = 0) is low
//! load; if ticks skip whole periods, what was observed counts for the last of them. The
//! mover finishes a window it has started even if the valve closes meanwhile (a window is
//! the unit of consistency): the valve gates window starts only.

use std::time::Duration;

/// The valve's knobs; defaults are the paper's baseline (§4).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ValveConfig {
    /// Length of a period (1 s).
    pub period: Duration,
    /// Latency bound B (15 ms): a completion slower than this is a latecomer.
    pub latency_bound: Duration,
    /// Slack θ (0.1): the load is high when LR > θ. θ = 0 makes the mover yield to any one
    /// slow request, which §5.3 shows is too timid.
    pub slack: f64,
}

impl Default for ValveConfig {
    fn default() -> ValveConfig {
        ValveConfig {
            period: Duration::from_secs(1),
            latency_bound: Duration::from_millis(15),
            slack: 0.1,
        }
    }
}

/// The valve: observations of the current period, and the verdict of the last one.
#[derive(Clone, Debug)]
pub struct Valve {
    config: ValveConfig,
    period_start: Duration,
    congested: bool,
    completed: u64,
    late: u64,
    open: bool,
}

impl Valve {
    /// A valve whose first period starts at `now`, open (no load seen yet).
    pub fn new(config: ValveConfig, now: Duration) -> Valve {
        assert!(!config.period.is_zero(), "a valve period has a length");
        assert!(
            config.slack.is_finite() && (0.0..=1.0).contains(&config.slack),
            "slack {} is not a ratio",
            config.slack
        );
        Valve {
            config,
            period_start: now,
            congested: false,
            completed: 0,
            late: 0,
            open: true,
        }
    }

    pub fn config(&self) -> ValveConfig {
        self.config
    }

    /// B_i is a knob the application may turn per period (§2.4); completions from now on
    /// are judged against the new bound.
    pub fn set_latency_bound(&mut self, bound: Duration) {
        self.config.latency_bound = bound;
    }

    /// A user request arrived; `congested` if it could not enter service at once (in MD,
    /// no free stripe-cache entry).
    pub fn arrival(&mut self, congested: bool) {
        self.congested |= congested;
    }

    /// A user request completed after `latency` inside the volume.
    pub fn completion(&mut self, latency: Duration) {
        self.completed += 1;
        if latency > self.config.latency_bound {
            self.late += 1;
        }
        debug_assert!(self.late <= self.completed);
    }

    /// LR of the period so far: latecomers / completions, None with no completions.
    pub fn latecomer_ratio(&self) -> Option<f64> {
        (self.completed > 0).then(|| self.late as f64 / self.completed as f64)
    }

    /// Whether the period so far counts as high load.
    pub fn high_load(&self) -> bool {
        // The division is correctly rounded, so LR == θ exactly (1/10 vs 0.1) compares
        // equal and is not high: the paper's test is strict.
        self.congested
            || self
                .latecomer_ratio()
                .is_some_and(|lr| lr > self.config.slack)
    }

    /// Ends the period if `now` is past it and decides the next one. Returns whether the
    /// mover may start windows in the period `now` falls in.
    pub fn tick(&mut self, now: Duration) -> bool {
        assert!(now >= self.period_start, "time went backwards");
        let elapsed = now - self.period_start;
        let periods = elapsed.as_nanos() / self.config.period.as_nanos();
        if periods > 0 {
            self.open = !self.high_load();
            self.congested = false;
            self.completed = 0;
            self.late = 0;
            let skip = u32::try_from(periods).expect("ticks skip 2^32 periods");
            self.period_start += self.config.period * skip;
        }
        debug_assert!(now - self.period_start < self.config.period);
        self.open
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    /// When the current period ends (and the next verdict is due).
    pub fn period_end(&self) -> Duration {
        self.period_start + self.config.period
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Drives the valve in 10 ms steps from `from` to `to`; each step one request arrives
    /// and completes with the latency `load(t)` gives. Returns the first tick time whose
    /// verdict differs from `was_open`, if any.
    fn drive(
        valve: &mut Valve,
        from: Duration,
        to: Duration,
        load: impl Fn(Duration) -> Duration,
        was_open: bool,
    ) -> Option<Duration> {
        let mut t = from;
        let mut flipped = None;
        while t < to {
            if valve.tick(t) != was_open && flipped.is_none() {
                flipped = Some(t);
            }
            valve.arrival(false);
            valve.completion(load(t));
            t += 10 * MS;
        }
        flipped
    }

    /// A load step at a period boundary closes the valve at the next boundary (one period
    /// later), and the fall reopens it one period after the fall.
    #[test]
    fn load_step_closes_within_one_period_and_reopens_within_one() {
        let mut valve = Valve::new(ValveConfig::default(), Duration::ZERO);
        let (rise, fall) = (Duration::from_secs(5), Duration::from_secs(9));
        let load = |t: Duration| {
            if (rise..fall).contains(&t) {
                40 * MS
            } else {
                2 * MS
            }
        };
        let end = Duration::from_secs(12);
        assert_eq!(drive(&mut valve, Duration::ZERO, rise, load, true), None);
        let closed = drive(&mut valve, rise, fall, load, true).expect("valve closes");
        assert_eq!(closed, Duration::from_secs(6), "one period after the rise");
        let opened = drive(&mut valve, fall, end, load, false).expect("valve reopens");
        assert_eq!(opened, Duration::from_secs(10), "one period after the fall");
    }

    /// A rise in mid-period closes the valve at the end of that period once the latecomers
    /// exceed θ of it. A fall in mid-period leaves that period high, so the valve reopens at
    /// the end of the first whole low period: under two periods after the fall.
    #[test]
    fn mid_period_steps_take_at_most_one_whole_low_period() {
        let mut valve = Valve::new(ValveConfig::default(), Duration::ZERO);
        let (rise, fall) = (Duration::from_millis(5500), Duration::from_millis(9300));
        let load = |t: Duration| {
            if (rise..fall).contains(&t) {
                40 * MS
            } else {
                2 * MS
            }
        };
        let closed = drive(&mut valve, Duration::ZERO, fall, load, true).unwrap();
        assert_eq!(closed, Duration::from_secs(6));
        let opened = drive(&mut valve, fall, Duration::from_secs(13), load, false).unwrap();
        assert_eq!(opened, Duration::from_secs(11));
        assert!(opened - fall < 2 * valve.config().period);
    }

    /// LR = late / N; LR == θ is not high, one more latecomer is.
    #[test]
    fn latecomer_ratio_is_strictly_above_slack() {
        let mut valve = Valve::new(ValveConfig::default(), Duration::ZERO);
        for i in 0..20 {
            valve.completion(if i < 2 { 16 * MS } else { 15 * MS });
        }
        assert_eq!(valve.latecomer_ratio(), Some(0.1));
        assert!(!valve.high_load(), "LR = 2/20 = θ is not high");
        assert!(valve.tick(Duration::from_secs(1)));
        for i in 0..20 {
            valve.completion(if i < 3 { 16 * MS } else { MS });
        }
        assert_eq!(valve.latecomer_ratio(), Some(0.15));
        assert!(!valve.tick(Duration::from_secs(2)), "LR = 3/20 > θ");
        assert!(
            !valve.tick(Duration::from_millis(2999)),
            "verdict holds for the period"
        );
    }

    /// A latency equal to B is not late; congestion alone closes the valve; an empty
    /// period (N = 0) is low load.
    #[test]
    fn congestion_closes_and_an_empty_period_opens() {
        let mut valve = Valve::new(ValveConfig::default(), Duration::ZERO);
        valve.completion(15 * MS);
        assert_eq!(valve.latecomer_ratio(), Some(0.0));
        valve.arrival(true);
        assert!(!valve.tick(Duration::from_secs(1)), "congestion");
        assert_eq!(valve.latecomer_ratio(), None, "counters reset");
        assert!(valve.tick(Duration::from_secs(2)), "N = 0 is low load");
        assert_eq!(valve.period_end(), Duration::from_secs(3));
    }

    /// Skipped periods: the observations count for the last one, then the next starts
    /// clean.
    #[test]
    fn skipped_periods_judge_what_was_seen() {
        let mut valve = Valve::new(ValveConfig::default(), Duration::ZERO);
        valve.completion(100 * MS);
        assert!(!valve.tick(Duration::from_millis(3500)));
        assert_eq!(valve.period_end(), Duration::from_secs(4));
        assert!(valve.tick(Duration::from_secs(4)));
    }

    #[test]
    fn latency_bound_is_a_knob() {
        let mut valve = Valve::new(ValveConfig::default(), Duration::ZERO);
        valve.set_latency_bound(6 * MS);
        valve.completion(8 * MS);
        assert_eq!(valve.latecomer_ratio(), Some(1.0));
        assert!(!valve.tick(Duration::from_secs(1)));
    }
}
