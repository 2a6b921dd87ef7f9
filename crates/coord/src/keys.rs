//! The key layout under `/strata/<cluster>/`. One place, so the layout in the docs is this file.

use crate::CoordError;

/// A member, brick, volume or cluster name: 1 to 64 of `[A-Za-z0-9._-]`, not starting with a
/// dot. Names become etcd key components, so a slash (or an empty name) must never get in.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

pub(crate) fn check_name(what: &str, name: &str) -> Result<(), CoordError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(CoordError::Invalid(format!(
            "{what} name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'"
        )))
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Keys {
    cluster: String,
    root: String,
}

impl Keys {
    pub fn new(cluster: &str) -> Keys {
        Keys {
            cluster: cluster.to_string(),
            root: format!("/strata/{cluster}/"),
        }
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    pub fn members(&self) -> String {
        format!("{}members/", self.root)
    }
    pub fn member(&self, name: &str) -> String {
        format!("{}{name}", self.members())
    }
    pub fn bricks(&self) -> String {
        format!("{}bricks/", self.root)
    }
    pub fn brick(&self, name: &str) -> String {
        format!("{}{name}", self.bricks())
    }
    pub fn volumes(&self) -> String {
        format!("{}volumes/", self.root)
    }
    pub fn volume(&self, name: &str) -> String {
        format!("{}{name}", self.volumes())
    }
    pub fn claims(&self, volume: &str) -> String {
        format!("{}claims/{volume}/", self.root)
    }
    /// Zero-padded so the keys list in segment order.
    pub fn claim(&self, volume: &str, segment: u32) -> String {
        format!("{}{segment:010}", self.claims(volume))
    }
    pub fn wants(&self, volume: &str) -> String {
        format!("{}wants/{volume}/", self.root)
    }
    pub fn want(&self, volume: &str, segment: u32, member: &str) -> String {
        format!("{}{segment:010}/{member}", self.wants(volume))
    }
    pub fn stale(&self, volume: &str) -> String {
        format!("{}stale/{volume}/", self.root)
    }
    pub fn version(&self, volume: &str) -> String {
        format!("{}versions/{volume}", self.root)
    }
    /// Everything about the volume's versions but the counter: the counter's key is this
    /// without the slash, so a prefix listing here never meets it (nor another volume's).
    pub fn version_records(&self, volume: &str) -> String {
        format!("{}versions/{volume}/", self.root)
    }
    /// Zero-padded so acks, takings and completions list in version order.
    pub fn version_acks(&self, volume: &str, number: u64) -> String {
        format!("{}acks/{number:020}/", self.version_records(volume))
    }
    pub fn version_ack(&self, volume: &str, number: u64, member: &str) -> String {
        format!("{}{member}", self.version_acks(volume, number))
    }
    pub fn version_takings(&self, volume: &str) -> String {
        format!("{}taking/", self.version_records(volume))
    }
    pub fn version_taking(&self, volume: &str, number: u64) -> String {
        format!("{}{number:020}", self.version_takings(volume))
    }
    pub fn version_completes(&self, volume: &str) -> String {
        format!("{}complete/", self.version_records(volume))
    }
    pub fn version_complete(&self, volume: &str, number: u64) -> String {
        format!("{}{number:020}", self.version_completes(volume))
    }
    pub fn version_failures(&self, volume: &str) -> String {
        format!("{}failed/", self.version_records(volume))
    }
    pub fn version_failed(&self, volume: &str, number: u64) -> String {
        format!("{}{number:020}", self.version_failures(volume))
    }
    /// Present while a roll-back of the volume is under way: claims and version creation
    /// are refused until it is gone.
    pub fn rollback(&self, volume: &str) -> String {
        format!("{}rollback", self.version_records(volume))
    }
    /// Rewritten by every `mark_stale` that changes a record: its mod revision is the
    /// volume's stale generation, which a version creation compares before and after.
    pub fn stale_mark(&self, volume: &str) -> String {
        format!("{}stale-mark/{volume}", self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_escape_their_key() {
        for good in ["a", "vol-1", "brick_02.x", &"n".repeat(64)] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", "ü", &"n".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn claims_list_in_segment_order() {
        let keys = Keys::new("c");
        assert_eq!(keys.claim("v", 7), "/strata/c/claims/v/0000000007");
        assert!(keys.claim("v", 9) < keys.claim("v", 10));
        assert!(keys.claim("v", 0).starts_with(&keys.claims("v")));
        // A volume whose name extends another's does not list the other's claims.
        assert!(!keys.claim("vv", 0).starts_with(&keys.claims("v")));
    }

    #[test]
    fn version_records_never_meet_a_counter() {
        let keys = Keys::new("c");
        assert!(!keys.version("v").starts_with(&keys.version_records("v")));
        assert!(!keys.version("vv").starts_with(&keys.version_records("v")));
        assert!(!keys
            .version_complete("vv", 1)
            .starts_with(&keys.version_records("v")));
        assert!(keys.version_complete("v", 9) < keys.version_complete("v", 10));
        assert!(keys
            .version_ack("v", 3, "h")
            .starts_with(&keys.version_acks("v", 3)));
        assert!(!keys
            .version_ack("v", 30, "h")
            .starts_with(&keys.version_acks("v", 3)));
    }
}
