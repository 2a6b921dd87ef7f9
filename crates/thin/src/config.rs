//! A thin pool's `[[layer]]` options, typed: one serde struct (unknown fields refused, sizes
//! parsed once, defaults here), turned into the pool's format options and runtime settings.
//! `volumes` and `grow-from` are the stack's business (it creates the volumes and holds the
//! spares) and are not options of the pool.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use strata_core::{ByteSize, Runtime};

use crate::pool::{
    check_extent_size, PoolOptions, PoolRuntime, DEFAULT_COMMIT_INTERVAL, DEFAULT_EXTENT_SIZE,
};
use crate::{LowWater, MapCommit, ReservePolicy, WhenFull, WhenReserveLow};

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PoolConfig {
    /// Allocation unit (default 512 KiB; see [`check_extent_size`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extent: Option<ByteSize>,
    /// Default: about 860 bytes per extent of the device (decided at format).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata_size: Option<ByteSize>,
    #[serde(default)]
    pub start_mid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_interval_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub map_commit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub when_full: Option<String>,
    /// Default: [`crate::policy::DEFAULT_FULL_WAIT`], with `when-full = "wait"` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full_wait: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub low_water: Option<String>,
    /// The first write into an extent a snapshot shares: `remap` (only the written granules
    /// go to a new extent: Clotho's remap-on-write, the default) or `copy` (the whole extent
    /// is copied: dm-thin's copy-on-write, kept for comparison).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_write: Option<String>,
    /// Free space versions may not eat: `"10%"` of the data space or a size (default: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_reserve: Option<String>,
    /// Below the reserve: `refuse` new snapshots (the default) or `delete-oldest`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub when_reserve_low: Option<String>,
}

/// Whether a `snapshot-write` value asks for whole-extent copies.
fn copies_extents(mode: &str) -> Result<bool, String> {
    match mode {
        "remap" => Ok(false),
        "copy" => Ok(true),
        other => Err(field(
            "snapshot-write",
            format!("{other:?}: use \"remap\" or \"copy\""),
        )),
    }
}

/// The option names, for the config checks' "known: …" list.
pub const OPTIONS: &[&str] = &[
    "extent",
    "metadata-size",
    "start-mid",
    "commit-interval-ms",
    "map-commit",
    "when-full",
    "full-wait",
    "low-water",
    "snapshot-write",
    "snapshot-reserve",
    "when-reserve-low",
];

/// A field and what is wrong with it.
fn field(key: &str, problem: impl std::fmt::Display) -> String {
    format!("field `{key}`: {problem}")
}

impl PoolConfig {
    /// Parses the options as the config gave them (a TOML table).
    pub fn from_table(table: toml::Table) -> Result<PoolConfig, String> {
        let config: PoolConfig = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| e.message().to_string())?;
        config.check()?;
        Ok(config)
    }

    /// What the types cannot say: the extent size rule, the policies' syntax.
    pub fn check(&self) -> Result<(), String> {
        check_extent_size(self.extent_size()).map_err(|e| field("extent", e))?;
        if let Some(mode) = &self.map_commit {
            MapCommit::parse(mode).map_err(|e| field("map-commit", e))?;
        }
        if let Some(mark) = &self.low_water {
            LowWater::parse(mark).map_err(|e| field("low-water", e))?;
        }
        if let Some(mode) = &self.snapshot_write {
            copies_extents(mode)?;
        }
        self.reserve()?;
        Ok(())
    }

    /// The space reserve for versions, if one is configured.
    fn reserve(&self) -> Result<Option<ReservePolicy>, String> {
        ReservePolicy::parse(
            self.snapshot_reserve.as_deref(),
            self.when_reserve_low.as_deref(),
        )
    }

    /// The same configuration with every default that does not depend on the device made
    /// explicit: what `describe` reports. `metadata-size` (sized from the device at format)
    /// and `full-wait` (meaningful with `when-full = "wait"` only) stay as given.
    pub fn explicit(&self) -> PoolConfig {
        PoolConfig {
            extent: Some(ByteSize(self.extent_size())),
            commit_interval_ms: Some(
                self.commit_interval_ms
                    .unwrap_or(DEFAULT_COMMIT_INTERVAL.as_millis() as u64),
            ),
            map_commit: Some(
                self.map_commit
                    .clone()
                    .unwrap_or_else(|| MapCommit::default().name().to_string()),
            ),
            when_full: Some(self.when_full.clone().unwrap_or_else(|| "fail".into())),
            low_water: Some(
                self.low_water
                    .clone()
                    .unwrap_or_else(|| format!("{}%", LowWater::default().percent())),
            ),
            snapshot_write: Some(
                self.snapshot_write
                    .clone()
                    .unwrap_or_else(|| "remap".into()),
            ),
            // Only with a reserve: alone it is refused.
            when_reserve_low: self.snapshot_reserve.as_ref().map(|_| {
                self.when_reserve_low
                    .clone()
                    .unwrap_or_else(|| WhenReserveLow::default().name().into())
            }),
            ..self.clone()
        }
    }

    pub fn extent_size(&self) -> u64 {
        self.extent.map_or(DEFAULT_EXTENT_SIZE, |s| s.0)
    }

    /// How the pool is formatted.
    pub fn pool_options(&self) -> PoolOptions {
        PoolOptions {
            extent_size: self.extent_size(),
            metadata_size: self.metadata_size.map(|s| s.0),
            start_mid: self.start_mid,
        }
    }

    /// How the pool runs. `parse_duration` reads `full-wait` ("30s") the way the other
    /// layers' durations are read.
    pub fn settings(
        &self,
        runtime: Arc<dyn Runtime>,
        parse_duration: fn(&str) -> Result<Duration, String>,
    ) -> Result<PoolRuntime, String> {
        let mut settings = PoolRuntime::new(runtime);
        if let Some(ms) = self.commit_interval_ms {
            settings.commit_interval = Some(Duration::from_millis(ms.max(1)));
        }
        if let Some(mode) = &self.map_commit {
            settings.map_commit = MapCommit::parse(mode).map_err(|e| field("map-commit", e))?;
        }
        let full_wait = self
            .full_wait
            .as_deref()
            .map(|text| parse_duration(text).map_err(|e| field("full-wait", e)))
            .transpose()?;
        settings.when_full = WhenFull::parse(self.when_full.as_deref(), full_wait)?;
        if let Some(mark) = &self.low_water {
            settings.low_water = LowWater::parse(mark).map_err(|e| field("low-water", e))?;
        }
        if let Some(mode) = &self.snapshot_write {
            settings.copy_on_write = copies_extents(mode)?;
        }
        settings.snapshot_reserve = self.reserve()?;
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PoolConfig, String> {
        PoolConfig::from_table(text.parse().unwrap())
    }

    #[test]
    fn options_are_typed_with_their_defaults_in_one_place() {
        let config =
            parse("extent = \"1MiB\"\nstart-mid = true\ncommit-interval-ms = 5\n").unwrap();
        assert_eq!(config.extent_size(), 1 << 20);
        assert!(config.pool_options().start_mid);
        let default = parse("").unwrap();
        assert_eq!(default.extent_size(), DEFAULT_EXTENT_SIZE);
        assert_eq!(default.pool_options().metadata_size, None);
        let names: Vec<&str> = OPTIONS.to_vec();
        assert_eq!(names.len(), 11);
        assert_eq!(default.explicit().snapshot_write.as_deref(), Some("remap"));
    }

    #[tokio::test]
    async fn snapshot_write_chooses_remap_or_whole_extent_copies() {
        let settings = |text: &str| {
            parse(text)
                .unwrap()
                .settings(strata_core::TokioRuntime::current(), |_| Ok(Duration::ZERO))
                .unwrap()
        };
        assert!(settings("snapshot-write = \"copy\"\n").copy_on_write);
        assert!(!settings("snapshot-write = \"remap\"\n").copy_on_write);
        assert!(!settings("").copy_on_write);
    }

    #[test]
    fn explicit_defaults_parse_back_to_the_same_pool() {
        let given = parse("low-water = \"92.5%\"\n").unwrap();
        let explicit = given.explicit();
        assert_eq!(explicit.extent_size(), DEFAULT_EXTENT_SIZE);
        assert_eq!(explicit.commit_interval_ms, Some(1000));
        assert_eq!(explicit.map_commit.as_deref(), Some("batched"));
        assert_eq!(explicit.when_full.as_deref(), Some("fail"));
        assert_eq!(explicit.low_water.as_deref(), Some("92.5%"));
        assert_eq!(
            parse("").unwrap().explicit().low_water.as_deref(),
            Some("80%")
        );
        let table = toml::Table::try_from(&explicit).unwrap();
        assert!(!table.contains_key("metadata-size"), "{table}");
        assert_eq!(PoolConfig::from_table(table).unwrap(), explicit);
        assert_eq!(explicit.explicit(), explicit);
    }

    #[test]
    fn unknown_fields_and_bad_extents_are_refused_by_name() {
        let error = parse("extnet = \"1MiB\"\n").unwrap_err();
        assert!(error.contains("extnet"), "{error}");
        let error = parse("extent = \"96KiB\"\n").unwrap_err();
        assert!(
            error.starts_with("field `extent`: 98304 bytes is not a power of two"),
            "{error}"
        );
        let error = parse("low-water = \"lots\"\n").unwrap_err();
        assert!(error.starts_with("field `low-water`"), "{error}");
        let error = parse("snapshot-write = \"cow\"\n").unwrap_err();
        assert!(error.starts_with("field `snapshot-write`"), "{error}");
        let error = parse("snapshot-reserve = \"lots\"\n").unwrap_err();
        assert!(error.starts_with("field `snapshot-reserve`"), "{error}");
        let error = parse("when-reserve-low = \"refuse\"\n").unwrap_err();
        assert!(error.contains("only with `snapshot-reserve`"), "{error}");
    }

    #[tokio::test]
    async fn a_snapshot_reserve_reaches_the_pool_with_its_policy() {
        let settings = |text: &str| {
            parse(text)
                .unwrap()
                .settings(strata_core::TokioRuntime::current(), |_| Ok(Duration::ZERO))
                .unwrap()
        };
        assert_eq!(settings("").snapshot_reserve, None, "no reserve by default");
        let reserve = settings("snapshot-reserve = \"10%\"\n")
            .snapshot_reserve
            .unwrap();
        assert_eq!(reserve.when_low, WhenReserveLow::Refuse);
        let reserve =
            settings("snapshot-reserve = \"1GiB\"\nwhen-reserve-low = \"delete-oldest\"\n")
                .snapshot_reserve
                .unwrap();
        assert_eq!(reserve.reserve, crate::Reserve::Bytes(1 << 30));
        assert_eq!(reserve.when_low, WhenReserveLow::DeleteOldest);
        // The explicit configuration names the policy only with a reserve, and parses back.
        let given = parse("snapshot-reserve = \"10%\"\n").unwrap().explicit();
        assert_eq!(given.when_reserve_low.as_deref(), Some("refuse"));
        assert_eq!(parse("").unwrap().explicit().when_reserve_low, None);
        let table = toml::Table::try_from(&given).unwrap();
        assert_eq!(PoolConfig::from_table(table).unwrap(), given);
    }
}
