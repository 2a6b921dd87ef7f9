//! The migration policy, pure: response-time smoothing, the threshold δ, the destination,
//! the token bucket, the probabilistic-LRU candidate list, first-write allocation and the
//! seeded random numbers they draw. No I/O and no clock reads: the layer passes the time in.
//!
//! Rules (Kang & Reddy, digest `user-centric-migration.md` §3):
//! - migrate data on device `src` to device `dst` when `r_src − r_dst > δ` (§3.2);
//! - adaptive δ = 2·σ_device + 2·σ_RTT (§3.2, "as used in the experiments");
//! - `dst` = the device with the lowest `r` among those with free space, ties broken at
//!   random (§3.3);
//! - only data in the candidate list migrates (§3.4), and only with a token (§3.5).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The default memory of the response-time average: the paper smooths "to capture
/// longer-term trends and filter short-term variation" (§3.1) without giving a weight; the
/// digest suggests a time constant of 10–60 s. `smoothing` sets it.
pub const DEFAULT_SMOOTHING: Duration = Duration::from_secs(10);

/// Devices whose response times are within this fraction of the lowest count as tied for
/// the destination (the paper's "same or similar range" is unspecified).
pub const TIE_FRACTION: f64 = 0.05;

/// A device's response time averaged over the recent past: every sample weighs
/// `exp(−age / time constant)`, so the average forgets at a fixed rate in time whatever
/// the request rate, and samples that complete together weigh alike. The deviation is the
/// standard deviation of the samples under the same weights (the paper's σ, §3.2). Until
/// about one time constant of samples has arrived it is close to the plain mean of all of
/// them, so a new layer is not steered by its first request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ewma {
    pub mean_us: f64,
    pub deviation_us: f64,
    pub samples: u64,
    time_constant_s: f64,
    /// The decayed weight of all samples so far, and their decayed squared deviations
    /// from the mean (West's weighted update).
    weight: f64,
    squares: f64,
    last: Duration,
}

impl Ewma {
    pub fn new(time_constant: Duration) -> Self {
        assert!(!time_constant.is_zero());
        Ewma {
            mean_us: 0.0,
            deviation_us: 0.0,
            samples: 0,
            time_constant_s: time_constant.as_secs_f64(),
            weight: 0.0,
            squares: 0.0,
            last: Duration::ZERO,
        }
    }

    /// A response time observed at `now` (non-decreasing; an earlier `now` counts as the
    /// latest seen).
    pub fn update(&mut self, now: Duration, sample_us: f64) {
        assert!(sample_us >= 0.0 && sample_us.is_finite(), "{sample_us}");
        let age = now.saturating_sub(self.last).as_secs_f64();
        self.last = self.last.max(now);
        let decay = (-age / self.time_constant_s).exp();
        self.weight = self.weight * decay + 1.0;
        let error = sample_us - self.mean_us;
        self.mean_us += error / self.weight;
        self.squares = (self.squares * decay + error * (sample_us - self.mean_us)).max(0.0);
        self.deviation_us = (self.squares / self.weight).sqrt();
        self.samples += 1;
        assert!(self.mean_us >= 0.0 && self.deviation_us >= 0.0);
    }

    /// The response time the policy compares: never measured counts as 0 (so the first
    /// migration toward a device nobody used yet measures it).
    pub fn response_us(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.mean_us
        }
    }
}

/// How δ is set (`delta = "adaptive" | "pair" | "<duration>"`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Delta {
    /// 2·σ_device + 2·σ_RTT: the paper's experiments (§3.2).
    Adaptive,
    /// σ_src + σ_dst: the paper's statistical form, migrate when `μ_src − σ_src > μ_dst +
    /// σ_dst` (§2.2), from which it derives the adaptive one by taking σ_src ≈ σ_dst.
    Pair,
    Fixed(Duration),
}

/// σ_RTT of a device, derived: the layer sees only end-to-end times, so it takes child 0
/// (the local disk: no network) as the device alone, and assumes the network adds an
/// independent variation, so `σ_observed² = σ_device² + σ_RTT²`.
pub fn sigma_rtt_us(sigma_local_us: f64, sigma_observed_us: f64) -> f64 {
    (sigma_observed_us.powi(2) - sigma_local_us.powi(2))
        .max(0.0)
        .sqrt()
}

/// δ for moving data from `src` to `dst`, in microseconds. Adaptive: 2·σ_device + 2·σ_RTT
/// with σ_device the local child's deviation and σ_RTT the larger of the two devices'
/// (child 0's is 0 by definition). Pair: the two devices' deviations added.
pub fn delta_us(delta: Delta, stats: &[Ewma], src: usize, dst: usize) -> f64 {
    assert!(src < stats.len() && dst < stats.len(), "{src} {dst}");
    match delta {
        Delta::Fixed(value) => value.as_secs_f64() * 1e6,
        Delta::Adaptive => {
            let local = stats[0].deviation_us;
            let rtt = |i: usize| {
                if i == 0 {
                    0.0
                } else {
                    sigma_rtt_us(local, stats[i].deviation_us)
                }
            };
            2.0 * local + 2.0 * rtt(src).max(rtt(dst))
        }
        Delta::Pair => stats[src].deviation_us + stats[dst].deviation_us,
    }
}

/// The onset rule: `r_src − r_dst > δ`.
pub fn should_migrate(r_src_us: f64, r_dst_us: f64, delta_us: f64) -> bool {
    r_src_us - r_dst_us > delta_us
}

/// The destination: the lowest response time among devices with room (`room[i]`), ties
/// (within [`TIE_FRACTION`] of the lowest) broken by `draw`. None when no device has room.
pub fn choose_destination(response_us: &[f64], room: &[bool], draw: u64) -> Option<usize> {
    assert_eq!(response_us.len(), room.len());
    let lowest = (0..room.len())
        .filter(|&i| room[i])
        .map(|i| response_us[i])
        .fold(f64::INFINITY, f64::min);
    if !lowest.is_finite() {
        return None;
    }
    let window = lowest * (1.0 + TIE_FRACTION);
    let tied: Vec<usize> = (0..room.len())
        .filter(|&i| room[i] && response_us[i] <= window)
        .collect();
    assert!(!tied.is_empty());
    Some(tied[(draw % tied.len() as u64) as usize])
}

/// Which migration policy (`policy = …`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Policy {
    /// User-centric: the paper's rule.
    #[default]
    Mig,
    /// No migration (the STR-NOMIG and SEQ-NOMIG baselines).
    NoMig,
    /// Locality only: every access to data off child 0 moves it to child 0, whatever the
    /// response times (the paper's Fig. 6 baseline, without its cold-data demotion).
    Locality,
}

impl TryFrom<String> for Policy {
    type Error = String;
    fn try_from(name: String) -> Result<Self, String> {
        match name.as_str() {
            "mig" => Ok(Policy::Mig),
            "nomig" => Ok(Policy::NoMig),
            "locality" => Ok(Policy::Locality),
            _ => Err(format!(
                "{name:?} is not \"mig\", \"nomig\" or \"locality\""
            )),
        }
    }
}

impl From<Policy> for String {
    fn from(policy: Policy) -> String {
        match policy {
            Policy::Mig => "mig",
            Policy::NoMig => "nomig",
            Policy::Locality => "locality",
        }
        .into()
    }
}

/// Where to move data now on `src`, before the candidate list and the tokens are asked:
/// None for no migration. `room[i]`: device `i` can take the data.
pub fn decide(
    policy: Policy,
    delta: Delta,
    stats: &[Ewma],
    room: &[bool],
    src: usize,
    draw: u64,
) -> Option<usize> {
    assert!(src < stats.len());
    match policy {
        Policy::NoMig => None,
        Policy::Locality => (src != 0 && room[0]).then_some(0),
        Policy::Mig => {
            let response: Vec<f64> = stats.iter().map(Ewma::response_us).collect();
            let dst = choose_destination(&response, room, draw)?;
            let threshold = delta_us(delta, stats, src, dst);
            (dst != src && should_migrate(response[src], response[dst], threshold)).then_some(dst)
        }
    }
}

/// First-write placement (`allocation = …`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Allocation {
    /// Striping: logical chunk `c` on device `c mod N` (from child 0), the next device with
    /// room if that one is full.
    #[default]
    Str,
    /// Sequential: child 0 until full, then child 1, and so on.
    Seq,
}

impl TryFrom<String> for Allocation {
    type Error = String;
    fn try_from(name: String) -> Result<Self, String> {
        match name.as_str() {
            "str" => Ok(Allocation::Str),
            "seq" => Ok(Allocation::Seq),
            _ => Err(format!("{name:?} is not \"str\" or \"seq\"")),
        }
    }
}

impl From<Allocation> for String {
    fn from(allocation: Allocation) -> String {
        match allocation {
            Allocation::Str => "str",
            Allocation::Seq => "seq",
        }
        .into()
    }
}

/// The device a chunk's first write allocates on, given each device's free slots.
pub fn first_device(allocation: Allocation, chunk: u64, free_slots: &[u64]) -> Option<usize> {
    let n = free_slots.len();
    assert!(n > 0);
    let start = match allocation {
        Allocation::Str => (chunk % n as u64) as usize,
        Allocation::Seq => 0,
    };
    (0..n).map(|k| (start + k) % n).find(|&i| free_slots[i] > 0)
}

/// Migration tokens: `rate` per second, at most `cap` saved up; starts full.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBucket {
    pub rate_per_s: f64,
    pub cap: f64,
    pub tokens: f64,
    pub last: Duration,
}

impl TokenBucket {
    pub fn new(rate_per_s: f64, cap: f64, now: Duration) -> Self {
        assert!(rate_per_s >= 0.0 && cap >= 1.0, "{rate_per_s} {cap}");
        TokenBucket {
            rate_per_s,
            cap,
            tokens: cap,
            last: now,
        }
    }

    /// Takes a token if one is there at `now`.
    pub fn try_take(&mut self, now: Duration) -> bool {
        let elapsed = now.saturating_sub(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.rate_per_s).min(self.cap);
        assert!(self.tokens >= 0.0 && self.tokens <= self.cap);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The migration candidate list, a probabilistic LRU (§3.4, LRU-RED): an access refreshes a
/// listed chunk; an unlisted one enters with probability `p` (evicting the least recent when
/// full). Hot chunks get in and stay; a chunk touched once rarely gets in.
#[derive(Clone, Debug)]
pub struct CandidateList {
    capacity: usize,
    probability: f64,
    clock: u64,
    stamps: HashMap<u64, u64>,
    by_age: BTreeMap<u64, u64>,
}

impl CandidateList {
    pub fn new(capacity: usize, probability: f64) -> Self {
        assert!(capacity > 0 && (0.0..=1.0).contains(&probability));
        CandidateList {
            capacity,
            probability,
            clock: 0,
            stamps: HashMap::new(),
            by_age: BTreeMap::new(),
        }
    }

    /// An access to `key`; `draw` uniform in [0, 1). Answers whether `key` is listed after.
    pub fn touch(&mut self, key: u64, draw: f64) -> bool {
        self.clock += 1;
        if let Some(stamp) = self.stamps.get_mut(&key) {
            self.by_age.remove(stamp);
            *stamp = self.clock;
            self.by_age.insert(self.clock, key);
            return true;
        }
        if draw >= self.probability {
            return false;
        }
        if self.stamps.len() == self.capacity {
            let (_, oldest) = self.by_age.pop_first().expect("full");
            self.stamps.remove(&oldest);
        }
        self.stamps.insert(key, self.clock);
        self.by_age.insert(self.clock, key);
        assert_eq!(self.stamps.len(), self.by_age.len());
        true
    }

    pub fn contains(&self, key: u64) -> bool {
        self.stamps.contains_key(&key)
    }

    pub fn len(&self) -> usize {
        self.stamps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stamps.is_empty()
    }
}

/// SplitMix64: the policy's random numbers, from a seed, so a run repeats exactly.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An average that has seen `mean_us ± deviation_us`.
    fn ewma(mean_us: f64, deviation_us: f64) -> Ewma {
        Ewma {
            mean_us,
            deviation_us,
            samples: 10,
            ..Ewma::new(DEFAULT_SMOOTHING)
        }
    }

    fn at_ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn early_samples_average_plainly_and_their_deviation_is_the_standard_one() {
        let mut e = Ewma::new(Duration::from_secs(10));
        assert_eq!(e.response_us(), 0.0);
        e.update(at_ms(0), 8000.0);
        assert_eq!((e.mean_us, e.deviation_us), (8000.0, 0.0));
        // Two samples at the same instant weigh alike: mean 12 ms, σ 4 ms.
        e.update(at_ms(0), 16000.0);
        assert_eq!((e.mean_us, e.deviation_us), (12000.0, 4000.0));
        assert_eq!(e.samples, 2);
    }

    #[test]
    fn the_average_forgets_at_its_time_constant_whatever_the_request_rate() {
        // 10 ms for a long while, then 20 ms: after one time constant the mean has moved
        // 1 − 1/e of the way, at 100 samples per second and at 1000 alike.
        for per_second in [100u64, 1000] {
            let mut e = Ewma::new(Duration::from_secs(10));
            let step = 1_000_000 / per_second;
            let mut now = Duration::ZERO;
            for _ in 0..per_second * 200 {
                now += Duration::from_micros(step);
                e.update(now, 10_000.0);
            }
            assert!((e.mean_us - 10_000.0).abs() < 1e-6);
            assert!(e.deviation_us < 1.0, "{}", e.deviation_us);
            for _ in 0..per_second * 10 {
                now += Duration::from_micros(step);
                e.update(now, 20_000.0);
            }
            let moved = (e.mean_us - 10_000.0) / 10_000.0;
            let expected = 1.0 - (-1.0f64).exp();
            assert!((moved - expected).abs() < 0.01, "{per_second}/s: {moved}");
        }
    }

    #[test]
    fn a_steady_latency_converges_and_a_jittery_one_shows_its_sigma() {
        let mut steady = Ewma::new(DEFAULT_SMOOTHING);
        let mut jittery = Ewma::new(DEFAULT_SMOOTHING);
        for i in 0..20_000u64 {
            steady.update(at_ms(i), 9000.0);
            // 5 or 13 ms alternately: mean 9 ms, σ 4 ms.
            jittery.update(at_ms(i), if i % 2 == 0 { 5000.0 } else { 13000.0 });
        }
        assert!((steady.mean_us - 9000.0).abs() < 1e-6);
        assert!(steady.deviation_us < 1e-3, "{}", steady.deviation_us);
        assert!(
            (jittery.mean_us - 9000.0).abs() < 10.0,
            "{}",
            jittery.mean_us
        );
        assert!(
            (jittery.deviation_us - 4000.0).abs() < 10.0,
            "{}",
            jittery.deviation_us
        );
    }

    #[test]
    fn sigma_rtt_is_what_the_network_adds_in_quadrature() {
        assert_eq!(sigma_rtt_us(3000.0, 5000.0), 4000.0);
        // A remote device steadier than the local one: the network adds nothing observable.
        assert_eq!(sigma_rtt_us(5000.0, 3000.0), 0.0);
    }

    #[test]
    fn adaptive_delta_is_two_sigma_device_plus_two_sigma_rtt() {
        // Table 1 of the paper: a 9 ms RTT with a mean deviation of 2.3 ms, over a steady
        // local disk: 2·σ_RTT = 4.6 ms, the paper's "≈ 4.4–4.6 ms".
        let stats = [ewma(5000.0, 0.0), ewma(14000.0, 2300.0)];
        let delta = delta_us(Delta::Adaptive, &stats, 1, 0);
        assert!((delta - 4600.0).abs() < 1e-9, "{delta}");
        // σ_device 3 ms, remote deviation 5 ms: σ_RTT 4 ms, δ = 6 + 8 = 14 ms, either way.
        let stats = [ewma(5000.0, 3000.0), ewma(14000.0, 5000.0)];
        assert_eq!(delta_us(Delta::Adaptive, &stats, 1, 0), 14000.0);
        assert_eq!(delta_us(Delta::Adaptive, &stats, 0, 1), 14000.0);
        // The pair form: σ_src + σ_dst, either way.
        assert_eq!(delta_us(Delta::Pair, &stats, 1, 0), 8000.0);
        assert_eq!(delta_us(Delta::Pair, &stats, 0, 1), 8000.0);
        let fixed = Delta::Fixed(Duration::from_micros(2500));
        assert_eq!(delta_us(fixed, &stats, 1, 0), 2500.0);
    }

    #[test]
    fn the_onset_rule_is_strictly_more_than_delta_both_ways() {
        assert!(should_migrate(15000.0, 5000.0, 9999.0));
        assert!(!should_migrate(15000.0, 5000.0, 10000.0));
        assert!(!should_migrate(5000.0, 15000.0, 0.0));
        let stats = [ewma(5000.0, 0.0), ewma(15000.0, 0.0)];
        let fixed = Delta::Fixed(Duration::from_millis(4));
        let room = [true, true];
        // Remote slower by 10 ms > 4: its data moves to the local disk.
        assert_eq!(decide(Policy::Mig, fixed, &stats, &room, 1, 0), Some(0));
        // Data already on the fastest device stays.
        assert_eq!(decide(Policy::Mig, fixed, &stats, &room, 0, 0), None);
        // And the other way when the local disk is the slow one (the SEQ-MIG case).
        let stats = [ewma(20000.0, 0.0), ewma(9000.0, 0.0)];
        assert_eq!(decide(Policy::Mig, fixed, &stats, &room, 0, 0), Some(1));
        // Within δ: nothing.
        let stats = [ewma(12000.0, 0.0), ewma(9000.0, 0.0)];
        assert_eq!(decide(Policy::Mig, fixed, &stats, &room, 0, 0), None);
    }

    #[test]
    fn the_destination_is_the_fastest_with_room_and_ties_are_drawn() {
        let response = [9000.0, 3000.0, 5000.0];
        assert_eq!(choose_destination(&response, &[true; 3], 0), Some(1));
        assert_eq!(
            choose_destination(&response, &[true, false, true], 0),
            Some(2)
        );
        assert_eq!(choose_destination(&response, &[false; 3], 0), None);
        // 3000 and 3100 are within 5 %: both get picked over draws, 9000 never.
        let response = [9000.0, 3000.0, 3100.0];
        let mut rng = Rng::new(7);
        let picks: std::collections::BTreeSet<usize> = (0..64)
            .map(|_| choose_destination(&response, &[true; 3], rng.next_u64()).unwrap())
            .collect();
        assert_eq!(picks, [1, 2].into_iter().collect());
        // Same seed, same picks.
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..16)
                .map(|_| choose_destination(&response, &[true; 3], rng.next_u64()))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
    }

    #[test]
    fn baselines_nomig_never_and_locality_always_toward_child_zero() {
        let stats = [ewma(50000.0, 0.0), ewma(1000.0, 0.0), ewma(1000.0, 0.0)];
        let room = [true; 3];
        let delta = Delta::Fixed(Duration::ZERO);
        for src in 0..3 {
            assert_eq!(decide(Policy::NoMig, delta, &stats, &room, src, 0), None);
        }
        // Locality moves to child 0 even though it is 50 times slower.
        assert_eq!(
            decide(Policy::Locality, delta, &stats, &room, 1, 0),
            Some(0)
        );
        assert_eq!(
            decide(Policy::Locality, delta, &stats, &room, 2, 0),
            Some(0)
        );
        assert_eq!(decide(Policy::Locality, delta, &stats, &room, 0, 0), None);
        assert_eq!(
            decide(Policy::Locality, delta, &stats, &[false, true, true], 1, 0),
            None
        );
    }

    #[test]
    fn an_unmeasured_device_is_tried() {
        let stats = [ewma(5000.0, 100.0), Ewma::new(DEFAULT_SMOOTHING)];
        let delta = Delta::Fixed(Duration::from_millis(1));
        assert_eq!(
            decide(Policy::Mig, delta, &stats, &[true; 2], 0, 0),
            Some(1)
        );
    }

    #[test]
    fn striping_round_robins_and_sequential_fills_in_order() {
        let free = [10, 10, 10];
        let str_devices: Vec<_> = (0..6)
            .map(|c| first_device(Allocation::Str, c, &free).unwrap())
            .collect();
        assert_eq!(str_devices, [0, 1, 2, 0, 1, 2]);
        assert_eq!(first_device(Allocation::Str, 1, &[10, 0, 10]), Some(2));
        assert_eq!(first_device(Allocation::Seq, 5, &free), Some(0));
        assert_eq!(first_device(Allocation::Seq, 5, &[0, 3, 10]), Some(1));
        assert_eq!(first_device(Allocation::Seq, 5, &[0, 0, 0]), None);
    }

    #[test]
    fn the_token_bucket_gives_rate_per_second_after_its_burst() {
        let mut bucket = TokenBucket::new(4.0, 4.0, Duration::ZERO);
        let taken = (0..10).filter(|_| bucket.try_take(Duration::ZERO)).count();
        assert_eq!(taken, 4, "the burst is the cap");
        // 250 ms later: one more (4 per second).
        assert!(!bucket.try_take(Duration::from_millis(200)));
        assert!(bucket.try_take(Duration::from_millis(250)));
        assert!(!bucket.try_take(Duration::from_millis(250)));
        // Asking every millisecond for 10 s (9.999 s elapsed): 4 per second, no more.
        let mut granted = 0;
        for ms in 250..10_250 {
            granted += u64::from(bucket.try_take(Duration::from_millis(ms)));
        }
        assert_eq!(granted, 39);
        // A long idle period saves up only the cap.
        let later = Duration::from_secs(100);
        let burst = (0..10).filter(|_| bucket.try_take(later)).count();
        assert_eq!(burst, 4);
    }

    #[test]
    fn the_candidate_list_admits_with_probability_and_evicts_the_least_recent() {
        let mut list = CandidateList::new(2, 0.1);
        assert!(!list.touch(1, 0.5), "a draw above p keeps it out");
        assert!(list.touch(1, 0.05));
        assert!(list.touch(1, 0.99), "listed: refreshed whatever the draw");
        assert!(list.touch(2, 0.0));
        list.touch(1, 0.99); // 1 is now the most recent
        assert!(list.touch(3, 0.0));
        assert!(list.contains(1) && list.contains(3) && !list.contains(2));
        assert_eq!(list.len(), 2);
        // With p = 0.05, a chunk touched once enters about 5 % of the time; one touched 100
        // times is almost surely in.
        let mut rng = Rng::new(1);
        let mut list = CandidateList::new(10_000, 0.05);
        let cold = (0..4000)
            .filter(|&key| list.touch(key, rng.next_f64()))
            .count();
        assert!((120..=280).contains(&cold), "{cold}");
        let hot = (0..100).any(|_| list.touch(1_000_000, rng.next_f64()));
        assert!(hot && list.contains(1_000_000));
    }

    #[test]
    fn the_random_numbers_repeat_from_a_seed() {
        let (mut a, mut b) = (Rng::new(42), Rng::new(42));
        for _ in 0..10 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let f = a.next_f64();
        assert!((0.0..1.0).contains(&f));
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }
}
