//! The store's answers on the wire and back, where the server and the client would otherwise
//! each spell them out: a version's figures, and the brick's summary (`Describe`, what
//! [`BrickStore::summary`](crate::BrickStore::summary) says).

use super::proto;
use crate::store::{BrickSummary, StepKind, StepProgress, Units, VersionInfo};

impl From<VersionInfo> for proto::VersionInfo {
    fn from(v: VersionInfo) -> Self {
        proto::VersionInfo {
            number: v.number,
            held_bytes: v.held_bytes,
        }
    }
}

impl From<proto::VersionInfo> for VersionInfo {
    fn from(v: proto::VersionInfo) -> Self {
        VersionInfo {
            number: v.number,
            held_bytes: v.held_bytes,
        }
    }
}

pub(super) fn to_reply(summary: BrickSummary) -> proto::DescribeReply {
    let BrickSummary {
        format,
        share_bytes,
        unit_bytes,
        units,
        versions,
        newest_version,
        sealed_version,
        in_doubt,
        step,
    } = summary;
    proto::DescribeReply {
        format: u32::from(format),
        share_bytes,
        unit_bytes,
        units_total: units.total,
        units_free: units.free,
        units_kept: units.kept,
        units_staged: units.staged,
        units_away: units.away,
        versions: versions.into_iter().map(Into::into).collect(),
        newest_version,
        sealed_version,
        in_doubt,
        step: step.map(|step| proto::Step {
            rollback: step.kind == StepKind::Rollback,
            version: step.version,
            done_entries: step.done_entries,
            total_entries: step.total_entries,
            running: step.running,
        }),
    }
}

/// `None` when the reply names a format this build cannot hold in a `u8`: damage, not a brick.
pub(super) fn from_reply(reply: proto::DescribeReply) -> Option<BrickSummary> {
    Some(BrickSummary {
        format: u8::try_from(reply.format).ok()?,
        share_bytes: reply.share_bytes,
        unit_bytes: reply.unit_bytes,
        units: Units {
            total: reply.units_total,
            free: reply.units_free,
            kept: reply.units_kept,
            staged: reply.units_staged,
            away: reply.units_away,
        },
        versions: reply.versions.into_iter().map(Into::into).collect(),
        newest_version: reply.newest_version,
        sealed_version: reply.sealed_version,
        in_doubt: reply.in_doubt,
        step: reply.step.map(|step| StepProgress {
            kind: if step.rollback {
                StepKind::Rollback
            } else {
                StepKind::Delete
            },
            version: step.version,
            done_entries: step.done_entries,
            total_entries: step.total_entries,
            running: step.running,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_crosses_the_wire_whole() {
        let summary = BrickSummary {
            format: 2,
            share_bytes: 1 << 30,
            unit_bytes: 4096,
            units: Units {
                total: 300_000,
                free: 1_000,
                kept: 7,
                staged: 5,
                away: 11,
            },
            versions: vec![
                VersionInfo {
                    number: 3,
                    held_bytes: 4096,
                },
                VersionInfo {
                    number: 4,
                    held_bytes: 6 * 4096,
                },
            ],
            newest_version: 6,
            sealed_version: 3,
            in_doubt: 2,
            step: Some(StepProgress {
                kind: StepKind::Delete,
                version: 4,
                done_entries: 9,
                total_entries: 13,
                running: true,
            }),
        };
        assert_eq!(from_reply(to_reply(summary.clone())), Some(summary.clone()));
        let rollback = BrickSummary {
            step: Some(StepProgress {
                kind: StepKind::Rollback,
                running: false,
                ..summary.step.unwrap()
            }),
            ..summary.clone()
        };
        assert_eq!(from_reply(to_reply(rollback.clone())), Some(rollback));
        let none = BrickSummary {
            step: None,
            ..summary
        };
        assert_eq!(from_reply(to_reply(none.clone())), Some(none));
        let mut damaged = to_reply(BrickSummary {
            step: None,
            ..Default::default()
        });
        damaged.format = 300;
        assert_eq!(from_reply(damaged), None);
    }
}
