//! The `[[layer]]` options of kind `migrate`, typed, with their defaults and their rules.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use strata_core::ByteSize;

use crate::policy::{Allocation, Delta, Policy};
use crate::shape::BLOCK;

/// The paper's chunk (§2.1): the unit of allocation and of the map.
pub const DEFAULT_CHUNK: u64 = 128 << 10;
/// The paper's token rate (§3.5): "four tokens per second".
pub const DEFAULT_TOKENS: u64 = 4;
/// The candidate list's admission probability and capacity ([U] in the paper; its [S]).
pub const DEFAULT_PROBABILITY: f64 = 0.05;
pub const DEFAULT_CANDIDATES: u64 = 4096;
/// The largest chunk: a location's validity bitmap is one u64.
pub const MAX_CHUNK: u64 = 64 * BLOCK;

/// A `[[layer]]` table of kind `migrate`. `chunk` and `metadata-size` are fixed at creation;
/// the rest may change between starts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct MigrateConfig {
    pub allocation: Allocation,
    pub policy: Policy,
    /// `"adaptive"` (2·σ_device + 2·σ_RTT), `"pair"` (σ_src + σ_dst) or a duration (`"5ms"`,
    /// `"0"`).
    pub delta: String,
    /// The time constant of the per-child response-time averages (`"10s"`).
    pub smoothing: String,
    /// Migration tokens per second.
    pub tokens: u64,
    /// Tokens saved up at most (default: `tokens`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_cap: Option<u64>,
    pub chunk: ByteSize,
    /// Probability that an access lists a chunk not yet in the candidate list.
    pub candidate_probability: f64,
    /// Chunks the candidate list holds.
    pub candidates: u64,
    /// How often the background merger looks for partial chunks (`"0"`: never).
    pub merge_interval: String,
    /// The seed of the policy's random draws (default: drawn from the runtime at start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The metadata region at the start of child 0 (default: see `metadata_bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata_size: Option<ByteSize>,
}

impl Default for MigrateConfig {
    fn default() -> Self {
        MigrateConfig {
            allocation: Allocation::Str,
            policy: Policy::Mig,
            delta: "adaptive".into(),
            smoothing: "10s".into(),
            tokens: DEFAULT_TOKENS,
            token_cap: None,
            chunk: ByteSize(DEFAULT_CHUNK),
            candidate_probability: DEFAULT_PROBABILITY,
            candidates: DEFAULT_CANDIDATES,
            merge_interval: "1s".into(),
            seed: None,
            metadata_size: None,
        }
    }
}

impl MigrateConfig {
    /// What the types cannot say; errors name the field.
    pub fn check(&self) -> Result<(), String> {
        let chunk = self.chunk.0;
        if !chunk.is_power_of_two() || !(BLOCK..=MAX_CHUNK).contains(&chunk) {
            return Err(format!(
                "field `chunk`: {chunk} bytes is not a power of two from 4KiB to 256KiB"
            ));
        }
        self.delta()?;
        self.smoothing()?;
        self.merge_interval()?;
        if self.token_cap == Some(0) {
            return Err("field `token-cap`: at least 1 token".into());
        }
        if !(0.0..=1.0).contains(&self.candidate_probability) {
            return Err(format!(
                "field `candidate-probability`: {} is not from 0 to 1",
                self.candidate_probability
            ));
        }
        if self.candidates == 0 {
            return Err("field `candidates`: at least 1 chunk".into());
        }
        if let Some(size) = self.metadata_size {
            if size.0 < 1 << 20 || !size.0.is_multiple_of(BLOCK) {
                return Err(format!(
                    "field `metadata-size`: {} bytes is not a multiple of 4KiB of at least 1MiB",
                    size.0
                ));
            }
        }
        Ok(())
    }

    pub fn delta(&self) -> Result<Delta, String> {
        if self.delta == "adaptive" {
            return Ok(Delta::Adaptive);
        }
        if self.delta == "pair" {
            return Ok(Delta::Pair);
        }
        strata_core::duration::parse_duration(&self.delta)
            .map(Delta::Fixed)
            .map_err(|e| format!("field `delta`: not \"adaptive\", \"pair\" nor a duration: {e}"))
    }

    pub fn smoothing(&self) -> Result<Duration, String> {
        let constant = strata_core::duration::parse_duration(&self.smoothing)
            .map_err(|e| format!("field `smoothing`: {e}"))?;
        if constant < Duration::from_millis(1) {
            return Err(format!(
                "field `smoothing`: {:?} is shorter than a millisecond",
                self.smoothing
            ));
        }
        Ok(constant)
    }

    /// None: no background merger.
    pub fn merge_interval(&self) -> Result<Option<Duration>, String> {
        let interval = strata_core::duration::parse_duration(&self.merge_interval)
            .map_err(|e| format!("field `merge-interval`: {e}"))?;
        Ok((!interval.is_zero()).then_some(interval))
    }

    pub fn token_cap(&self) -> u64 {
        self.token_cap.unwrap_or(self.tokens).max(1)
    }

    /// The metadata region a format gives child 0: 32 bytes of map per logical chunk, kept
    /// at most 3/8 of the region by the store (two checkpoint slots and a quarter of
    /// journal) less a 5 % reserve, so 96 bytes of region per chunk; at least 1 MiB.
    pub fn metadata_bytes(&self, total_bytes: u64) -> u64 {
        self.metadata_size.map_or_else(
            || {
                let chunks = total_bytes / self.chunk.0;
                (96 * chunks).max(1 << 20).next_multiple_of(1 << 20)
            },
            |size| size.0,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_papers() {
        let config = MigrateConfig::default();
        assert_eq!(config.check(), Ok(()));
        assert_eq!(config.chunk.0, 128 << 10);
        assert_eq!(config.tokens, 4);
        assert_eq!(config.token_cap(), 4);
        assert_eq!(config.delta(), Ok(Delta::Adaptive));
        assert_eq!(config.merge_interval(), Ok(Some(Duration::from_secs(1))));
        assert_eq!(config.smoothing(), Ok(crate::policy::DEFAULT_SMOOTHING));
    }

    #[test]
    fn bad_values_are_refused_by_field() {
        let bad = |edit: fn(&mut MigrateConfig), field: &str| {
            let mut config = MigrateConfig::default();
            edit(&mut config);
            let error = config.check().unwrap_err();
            assert!(error.contains(field), "{error}");
        };
        bad(|c| c.chunk = ByteSize(3 << 12), "`chunk`");
        bad(|c| c.chunk = ByteSize(512 << 10), "`chunk`");
        bad(|c| c.delta = "fast".into(), "`delta`");
        bad(|c| c.delta = "5".into(), "`delta`");
        bad(|c| c.merge_interval = "soon".into(), "`merge-interval`");
        bad(|c| c.smoothing = "0".into(), "`smoothing`");
        bad(|c| c.smoothing = "later".into(), "`smoothing`");
        bad(|c| c.token_cap = Some(0), "`token-cap`");
        bad(|c| c.candidate_probability = 1.5, "`candidate-probability`");
        bad(|c| c.candidates = 0, "`candidates`");
        bad(
            |c| c.metadata_size = Some(ByteSize(4096)),
            "`metadata-size`",
        );
    }

    #[test]
    fn a_fixed_delta_is_a_duration() {
        let config = MigrateConfig {
            delta: "2500us".into(),
            ..MigrateConfig::default()
        };
        assert_eq!(
            config.delta(),
            Ok(Delta::Fixed(Duration::from_micros(2500)))
        );
        let zero = MigrateConfig {
            delta: "0".into(),
            ..MigrateConfig::default()
        };
        assert_eq!(zero.delta(), Ok(Delta::Fixed(Duration::ZERO)));
        let pair = MigrateConfig {
            delta: "pair".into(),
            ..MigrateConfig::default()
        };
        assert_eq!(pair.delta(), Ok(Delta::Pair));
    }

    #[test]
    fn the_default_metadata_region_grows_with_the_devices() {
        let config = MigrateConfig::default();
        assert_eq!(config.metadata_bytes(64 << 20), 1 << 20);
        // 1 TiB in 128 KiB chunks: 8 Mi chunks × 96 B = 768 MiB.
        assert_eq!(config.metadata_bytes(1 << 40), 768 << 20);
    }
}
