//! Network round trips as the user-centric migration paper measured them (its Table 1), for
//! the simulator's link model and the `delay` layer's `rtt` presets alike.

use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

/// One row of the migration paper's Table 1 (netem round-trip times, as `ping` reports them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RttRow {
    pub avg_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub mdev_ms: f64,
}

/// Kang & Reddy, user-centric migration, Table 1 (digest §1.3).
pub const MIGRATION_TABLE1: [RttRow; 3] = [
    RttRow {
        avg_ms: 9.0,
        min_ms: 4.3,
        max_ms: 18.5,
        mdev_ms: 2.3,
    },
    RttRow {
        avg_ms: 17.0,
        min_ms: 12.4,
        max_ms: 24.3,
        mdev_ms: 2.2,
    },
    RttRow {
        avg_ms: 25.0,
        min_ms: 20.5,
        max_ms: 32.2,
        mdev_ms: 2.2,
    },
];

impl RttRow {
    /// Table 1's row by its average round trip (9, 17 or 25 ms).
    pub fn by_avg_ms(avg_ms: u32) -> Option<&'static RttRow> {
        MIGRATION_TABLE1
            .iter()
            .find(|row| row.avg_ms == f64::from(avg_ms))
    }

    /// One round trip in nanoseconds: normal with the row's mean and deviation (ping's mdev
    /// is a standard deviation), clipped at zero. The rows' min and max are not modelled: the
    /// paper does not give netem's command line.
    pub fn sample_ns(&self, rng: &mut ChaCha8Rng) -> u64 {
        let millis = 1e6;
        Normal::new(self.avg_ms * millis, self.mdev_ms * millis)
            .expect("Table 1's deviations are finite and positive")
            .sample(rng)
            .max(0.0)
            .round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn samples_have_the_rows_mean_and_deviation() {
        for row in &MIGRATION_TABLE1 {
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            let n = 20_000;
            let samples: Vec<f64> = (0..n)
                .map(|_| row.sample_ns(&mut rng) as f64 / 1e6)
                .collect();
            let mean = samples.iter().sum::<f64>() / n as f64;
            let var = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
            assert!((mean - row.avg_ms).abs() < 0.05, "{row:?}: mean {mean}");
            assert!(
                (var.sqrt() - row.mdev_ms).abs() < 0.05,
                "{row:?}: sd {}",
                var.sqrt()
            );
        }
        assert_eq!(RttRow::by_avg_ms(17).unwrap().mdev_ms, 2.2);
        assert!(RttRow::by_avg_ms(10).is_none());
    }
}
