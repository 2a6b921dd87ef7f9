//! The seek curve: seek time as a function of cylinder distance, in three parts (Proximal
//! I/O §2, after Ruemmler & Wilkes and Schlosser et al.):
//! - a plateau: below `plateau_cylinders` the arm barely accelerates and the time is about
//!   the head-settle time, rising gently from `settle` (one cylinder, a track switch) to
//!   `plateau_end` (the paper gives 0.4-0.8 ms for this range);
//! - a square-root part, where the arm accelerates and decelerates;
//! - a linear part, where it coasts at full speed, ending at the full-stroke time.
//!
//! The square-root coefficient is not a datasheet number; [`SeekCurve::fit`] derives it so
//! the mean seek over random LBN pairs equals the drive's average seek. Both the sqrt and
//! linear parts are affine in that coefficient, so the fit is one division, not a search.

use crate::model::Nanos;

/// What a datasheet (or the paper) gives about a drive's arm.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct SeekParams {
    /// Seek over one cylinder (track switch / head settle).
    pub settle: Nanos,
    /// Seek over `plateau_cylinders` - 1 cylinders; the plateau rises linearly from `settle`.
    pub plateau_end: Nanos,
    /// Seeks shorter than this are on the plateau; C in the paper.
    pub plateau_cylinders: u32,
    /// Where the square-root part hands over to the linear part.
    pub linear_from_cylinders: u32,
    /// Seek over the whole stroke.
    pub full_stroke: Nanos,
    /// Mean seek over random LBN pairs that the fit must reproduce.
    pub average: Nanos,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeekCurve {
    settle: f64,
    /// Rise per cylinder along the plateau.
    plateau_rise: f64,
    plateau_end: f64,
    plateau: u32,
    sqrt_plateau: f64,
    sqrt_coeff: f64,
    linear_from: u32,
    at_linear_from: f64,
    slope: f64,
}

impl SeekCurve {
    /// A curve through `params` whose mean over `distances` (samples of the distance between
    /// two random LBNs, zero-length ones included) equals `params.average`, counting only
    /// non-zero distances, as datasheets do. `max_distance` is the full stroke in cylinders.
    pub fn fit(params: &SeekParams, max_distance: u32, distances: &[u32]) -> Self {
        let p = params;
        assert!(p.plateau_cylinders >= 1);
        assert!(p.plateau_cylinders <= p.linear_from_cylinders);
        assert!(p.linear_from_cylinders < max_distance);
        let (mut fixed_sum, mut coeff_sum, mut count) = (0.0, 0.0, 0usize);
        for &d in distances.iter().filter(|&&d| d > 0) {
            let (fixed, coeff) = Self::affine_terms(p, max_distance, d);
            fixed_sum += fixed;
            coeff_sum += coeff;
            count += 1;
        }
        assert!(count > 0 && coeff_sum > 0.0, "no seek distances to fit");
        let sqrt_coeff = (p.average as f64 * count as f64 - fixed_sum) / coeff_sum;
        assert!(
            sqrt_coeff > 0.0,
            "average seek {} is below the plateau",
            p.average
        );
        Self::with_coefficient(p, max_distance, sqrt_coeff)
    }

    /// A curve with an explicit square-root coefficient (ns per sqrt(cylinder)).
    pub fn with_coefficient(p: &SeekParams, max_distance: u32, sqrt_coeff: f64) -> Self {
        let settle = p.settle as f64;
        let plateau_end = p.plateau_end as f64;
        assert!(plateau_end >= settle, "the plateau may not fall");
        let plateau_rise =
            (plateau_end - settle) / f64::from(p.plateau_cylinders.max(2) - 2).max(1.0);
        let sqrt_plateau = f64::from(p.plateau_cylinders).sqrt();
        let at_linear_from =
            plateau_end + sqrt_coeff * (f64::from(p.linear_from_cylinders).sqrt() - sqrt_plateau);
        let span = f64::from(max_distance - p.linear_from_cylinders);
        let slope = (p.full_stroke as f64 - at_linear_from) / span;
        assert!(
            slope > 0.0,
            "full stroke must exceed the seek at the linear knee"
        );
        Self {
            settle,
            plateau_rise,
            plateau_end,
            plateau: p.plateau_cylinders,
            sqrt_plateau,
            sqrt_coeff,
            linear_from: p.linear_from_cylinders,
            at_linear_from,
            slope,
        }
    }

    /// seek(d) = fixed + coeff * sqrt_coeff, for the fit.
    fn affine_terms(p: &SeekParams, max_distance: u32, d: u32) -> (f64, f64) {
        let plateau_end = p.plateau_end as f64;
        let sqrt_plateau = f64::from(p.plateau_cylinders).sqrt();
        if d < p.plateau_cylinders {
            let settle = p.settle as f64;
            let rise = (plateau_end - settle) / f64::from(p.plateau_cylinders.max(2) - 2).max(1.0);
            return (settle + rise * f64::from(d - 1), 0.0);
        }
        if d < p.linear_from_cylinders {
            return (plateau_end, f64::from(d).sqrt() - sqrt_plateau);
        }
        let knee = f64::from(p.linear_from_cylinders).sqrt() - sqrt_plateau;
        let f = f64::from(d - p.linear_from_cylinders)
            / f64::from(max_distance - p.linear_from_cylinders);
        (
            plateau_end * (1.0 - f) + p.full_stroke as f64 * f,
            knee * (1.0 - f),
        )
    }

    /// Seek time over `distance` cylinders; 0 for 0.
    pub fn time(&self, distance: u32) -> Nanos {
        if distance == 0 {
            return 0;
        }
        let t = if distance < self.plateau {
            self.settle + self.plateau_rise * f64::from(distance - 1)
        } else if distance < self.linear_from {
            self.plateau_end + self.sqrt_coeff * (f64::from(distance).sqrt() - self.sqrt_plateau)
        } else {
            self.at_linear_from + self.slope * f64::from(distance - self.linear_from)
        };
        t as Nanos
    }

    pub fn sqrt_coefficient(&self) -> f64 {
        self.sqrt_coeff
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MILLIS;

    fn params() -> SeekParams {
        SeekParams {
            settle: 600_000,
            plateau_end: 700_000,
            plateau_cylinders: 65,
            linear_from_cylinders: 10_000,
            full_stroke: 8 * MILLIS,
            average: 5 * MILLIS,
        }
    }

    #[test]
    fn fit_reproduces_the_average_over_the_sample() {
        let distances: Vec<u32> = (0..60_000).step_by(7).collect();
        let curve = SeekCurve::fit(&params(), 60_000, &distances);
        let nonzero: Vec<u32> = distances.into_iter().filter(|&d| d > 0).collect();
        let mean =
            nonzero.iter().map(|&d| curve.time(d) as f64).sum::<f64>() / nonzero.len() as f64;
        assert!((mean - 5e6).abs() < 1e3, "mean seek {mean}");
        assert_eq!(curve.time(60_000), 8 * MILLIS);
    }
}
