//! `strata brick status <address>`: what a served brick holds now, asked over its transaction
//! channel (`Describe`). It asks the running brick rather than reading its file, because only
//! the process running a roll-back or a deletion knows how far it has got.

use std::time::Duration;

use anyhow::Context;
use strata_brick::rpc::{BrickClient, RpcError};
use strata_brick::{BrickSummary, StepKind, StepProgress};
use strata_core::outln;

pub async fn show(address: &str, timeout: Duration) -> anyhow::Result<()> {
    let client = BrickClient::new(address, timeout)?;
    let summary = client
        .describe()
        .await
        .with_context(|| format!("asking brick {address} what it holds"))?;
    for line in render(address, &summary) {
        outln!("{line}");
    }
    Ok(())
}

fn render(address: &str, s: &BrickSummary) -> Vec<String> {
    let units = &s.units;
    let mut lines = vec![
        format!(
            "brick {address}: format {}, share {} bytes ({} units of {} bytes)",
            s.format,
            s.share_bytes,
            s.share_bytes / s.unit_bytes.max(1),
            s.unit_bytes
        ),
        format!(
            "  units: {} in all, {} used, {} free; {} kept by versions, {} staged by prepared \
             intervals, {} of the share away from home",
            units.total,
            units.used(),
            units.free,
            units.kept,
            units.staged,
            units.away
        ),
    ];
    let versions: Vec<String> = (s.versions.iter())
        .map(|v| {
            let sealed = if s.is_sealed(v.number) {
                "sealed, "
            } else {
                ""
            };
            format!("{} ({sealed}{} bytes held)", v.number, v.held_bytes)
        })
        .collect();
    lines.push(format!(
        "  versions: {}; newest created {}, newest sealed {}",
        if versions.is_empty() {
            "none".to_string()
        } else {
            versions.join(", ")
        },
        s.newest_version,
        s.sealed_version
    ));
    lines.push(format!("  intervals in doubt: {}", s.in_doubt));
    if let Some(step) = s.step {
        lines.push(if step.running {
            format!("  in progress: {}", step_progress(&step))
        } else {
            format!(
                "  last: {} {}, ended, {} of {} entries",
                step_name(step.kind),
                step.version,
                step.done_entries,
                step.total_entries
            )
        });
    }
    lines
}

fn step_name(kind: StepKind) -> &'static str {
    match kind {
        StepKind::Rollback => "roll-back to version",
        StepKind::Delete => "deletion of version",
    }
}

/// "roll-back to version 1, 3 of 6 entries done (50 %)"
fn step_progress(step: &StepProgress) -> String {
    let (done, total) = (step.done_entries, step.total_entries);
    let percent = (done * 100).checked_div(total).unwrap_or(100);
    format!(
        "{} {}, {done} of {total} entries done ({percent} %)",
        step_name(step.kind),
        step.version
    )
}

/// What `strata cluster status` says of a brick, after its catalog record: what it answered
/// to `Describe`, on one line, or why it did not answer.
pub fn brief(answer: &Result<BrickSummary, RpcError>) -> String {
    let s = match answer {
        Ok(summary) => summary,
        Err(RpcError::Unreachable { why, .. }) => return format!("not answering: {why}"),
        Err(RpcError::Refused { why, .. }) => return format!("refused to describe itself: {why}"),
    };
    let units = &s.units;
    let mut parts = vec![format!(
        "up, {} of {} units used ({} kept by versions, {} staged)",
        units.used(),
        units.total,
        units.kept,
        units.staged
    )];
    if s.in_doubt > 0 {
        parts.push(format!("{} intervals in doubt", s.in_doubt));
    }
    if !s.versions.is_empty() {
        let numbers: Vec<String> = s.versions.iter().map(|v| v.number.to_string()).collect();
        parts.push(format!("versions {}", numbers.join(", ")));
    }
    if let Some(step) = s.step.filter(|step| step.running) {
        parts.push(step_progress(&step));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_brick::{Units, VersionInfo};

    /// A brick with 112 of its 512 units used (6 kept, 2 staged), `versions` and `step`.
    fn summary(versions: Vec<VersionInfo>, step: StepProgress) -> BrickSummary {
        BrickSummary {
            format: 2,
            share_bytes: 1 << 20,
            unit_bytes: 4096,
            units: Units {
                total: 512,
                free: 400,
                kept: 6,
                staged: 2,
                away: 9,
            },
            newest_version: versions.last().map_or(0, |v| v.number),
            versions,
            sealed_version: 0,
            in_doubt: 0,
            step: Some(step),
        }
    }

    #[test]
    fn shows_space_versions_and_a_step_in_progress() {
        let versions = vec![
            VersionInfo {
                number: 1,
                held_bytes: 8192,
            },
            VersionInfo {
                number: 2,
                held_bytes: 16384,
            },
        ];
        let rollback = StepProgress {
            kind: StepKind::Rollback,
            version: 1,
            done_entries: 3,
            total_entries: 6,
            running: true,
        };
        let mut summary = BrickSummary {
            sealed_version: 1,
            in_doubt: 1,
            ..summary(versions, rollback)
        };
        let text = render("b:1", &summary).join("\n");
        assert!(
            text.contains("format 2, share 1048576 bytes (256 units"),
            "{text}"
        );
        assert!(
            text.contains("512 in all, 112 used, 400 free; 6 kept"),
            "{text}"
        );
        assert!(
            text.contains("versions: 1 (sealed, 8192 bytes held), 2 (16384"),
            "{text}"
        );
        assert!(text.contains("intervals in doubt: 1"), "{text}");
        assert!(
            text.contains("in progress: roll-back to version 1, 3 of 6 entries done (50 %)"),
            "{text}"
        );
        summary.step = summary.step.map(|s| StepProgress {
            running: false,
            done_entries: 6,
            kind: StepKind::Delete,
            ..s
        });
        summary.versions.clear();
        let text = render("b:1", &summary).join("\n");
        assert!(text.contains("versions: none;"), "{text}");
        assert!(
            text.contains("last: deletion of version 1, ended, 6 of 6 entries"),
            "{text}"
        );
        assert!(!text.contains("in progress"), "{text}");
    }

    #[test]
    fn one_line_per_brick_for_the_cluster_status() {
        let versions = vec![VersionInfo {
            number: 3,
            held_bytes: 8192,
        }];
        let deletion = StepProgress {
            kind: StepKind::Delete,
            version: 2,
            done_entries: 1,
            total_entries: 4,
            running: true,
        };
        let summary = BrickSummary {
            sealed_version: 3,
            in_doubt: 2,
            ..summary(versions, deletion)
        };
        assert_eq!(
            brief(&Ok(summary)),
            "up, 112 of 512 units used (6 kept by versions, 2 staged); 2 intervals in doubt; \
             versions 3; deletion of version 2, 1 of 4 entries done (25 %)"
        );
        let failed = RpcError::Unreachable {
            address: "b:1".into(),
            why: "the brick's disk failed (EIO)".into(),
        };
        assert_eq!(
            brief(&Err(failed)),
            "not answering: the brick's disk failed (EIO)"
        );
    }
}
