//! Proximal I/O Appendix A: how many revolutions a strand of D requests needs, as a
//! birthday problem. A track is cut into B bins, each as wide as the time the head needs to
//! move to another track; two requests (on different tracks) in the same bin cannot both be
//! served in one revolution. A strand is served in k revolutions when the fullest bin holds
//! k requests.
//!
//! B = SPT / H, with H the track-switch time in sectors, i.e. B = revolution / switch time.
//! The formulas are written for a real B (falling factorials instead of factorials of B),
//! which agrees with the paper's for whole B and lets B come from a drive's timing.

/// b (b - 1) ... (b - count + 1); zero once a factor would be negative.
fn falling(b: f64, count: u32) -> f64 {
    let mut product = 1.0;
    for t in 0..count {
        let factor = b - f64::from(t);
        if factor <= 0.0 {
            return 0.0;
        }
        product *= factor;
    }
    product
}

fn factorial(n: u32) -> f64 {
    (1..=n).map(f64::from).product()
}

/// Q1: the probability that `requests` balls in `bins` bins all land apart, i.e. the strand
/// needs no extra revolution: b! / ((b - n)! b^n).
pub fn no_extra_revolution(requests: u32, bins: f64) -> f64 {
    assert!(bins > 0.0);
    falling(bins, requests) / bins.powi(requests as i32)
}

/// Q_k: the probability that the fullest bin holds exactly `k` requests, i.e. the strand is
/// served in exactly `k` revolutions (k - 1 extra). The paper's recurrence: choose the i bins
/// holding k requests each, and spread the other n - ik requests over the remaining b - i
/// bins with fewer than k in each.
pub fn revolutions_exactly(k: u32, requests: u32, bins: f64) -> f64 {
    assert!(k >= 1);
    if requests == 0 {
        return 0.0;
    }
    if k == 1 {
        return no_extra_revolution(requests, bins);
    }
    let n = requests;
    let mut total = 0.0;
    for i in 1..=n / k {
        let rest = n - i * k;
        let arrangements = factorial(n) * falling(bins, i)
            / (factorial(i) * factorial(k).powi(i as i32) * factorial(rest))
            / bins.powi((i * k) as i32);
        if arrangements == 0.0 {
            continue;
        }
        let rest_bins = bins - f64::from(i);
        let rest_below_k = fewer_than_in_every_bin(k, rest, rest_bins);
        let rest_placed = (rest_bins / bins).powi(rest as i32);
        total += arrangements * rest_below_k * rest_placed;
    }
    total
}

/// Probability that no bin holds `k` or more of `requests` spread over `bins`:
/// sum of Q_j for j < k, and 1 for no requests.
fn fewer_than_in_every_bin(k: u32, requests: u32, bins: f64) -> f64 {
    if requests == 0 {
        return 1.0;
    }
    if bins <= 0.0 {
        return 0.0;
    }
    (1..k).map(|j| revolutions_exactly(j, requests, bins)).sum()
}

/// P_k = 1 - sum_{i=1..k} Q_i: the probability of at least k extra revolutions.
pub fn at_least_extra_revolutions(k: u32, requests: u32, bins: f64) -> f64 {
    1.0 - (1..=k)
        .map(|i| revolutions_exactly(i, requests, bins))
        .sum::<f64>()
}

/// Q_1..Q_n: the distribution of the number of revolutions for a strand.
pub fn revolutions_distribution(requests: u32, bins: f64) -> Vec<f64> {
    (1..=requests)
        .map(|k| revolutions_exactly(k, requests, bins))
        .collect()
}

/// The most likely number of revolutions (the paper: 3 for D = 8 on its disk).
pub fn most_likely_revolutions(requests: u32, bins: f64) -> u32 {
    let distribution = revolutions_distribution(requests, bins);
    let mut best = (f64::MIN, 0);
    for (index, &p) in distribution.iter().enumerate() {
        if p > best.0 {
            best = (p, index as u32 + 1);
        }
    }
    best.1
}

/// B = revolution / switch: how many bins a track holds for a given switch time.
pub fn bins_per_track(revolution_ns: u64, switch_ns: u64) -> f64 {
    assert!(switch_ns > 0);
    revolution_ns as f64 / switch_ns as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Max-occupancy distribution by enumerating all b^n placements.
    fn enumerate(n: u32, b: u32) -> Vec<f64> {
        let mut counts = vec![0u64; n as usize + 1];
        let total = u64::from(b).pow(n);
        for code in 0..total {
            let mut bins = vec![0u32; b as usize];
            let mut c = code;
            for _ in 0..n {
                bins[(c % u64::from(b)) as usize] += 1;
                c /= u64::from(b);
            }
            counts[*bins.iter().max().unwrap() as usize] += 1;
        }
        counts[1..]
            .iter()
            .map(|&c| c as f64 / total as f64)
            .collect()
    }

    #[test]
    fn recurrence_matches_enumeration() {
        for (n, b) in [(3, 3), (4, 3), (5, 4), (6, 6), (7, 5)] {
            let exact = enumerate(n, b);
            let formula = revolutions_distribution(n, f64::from(b));
            for (k, (e, f)) in exact.iter().zip(&formula).enumerate() {
                assert!((e - f).abs() < 1e-12, "n={n} b={b} k={}: {e} vs {f}", k + 1);
            }
        }
    }

    #[test]
    fn classic_birthday_number() {
        // 23 people, 365 days: just over half share a birthday.
        let shared = 1.0 - no_extra_revolution(23, 365.0);
        assert!((shared - 0.5073).abs() < 1e-4, "{shared}");
    }

    #[test]
    fn paper_appendix_a_shape_with_six_bins() {
        // A 4 ms revolution over a ~0.65 ms switch leaves about six bins.
        assert_eq!(most_likely_revolutions(8, 6.0), 3);
        assert!(no_extra_revolution(6, 6.0) < 0.02);
        let p = at_least_extra_revolutions(1, 8, 6.0);
        assert!((p - (1.0 - no_extra_revolution(8, 6.0))).abs() < 1e-12);
    }
}
