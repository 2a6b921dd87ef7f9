//! The pool's verbs for its versions policies, declared and answered here so that the kind's
//! entry only lists them: `snapshot-policy` (set, change, remove or show a volume's periodic
//! snapshots), `snapshot-protect` and `snapshot-unprotect`.

use strata_core::layer::{Arg, ArgKind, Verb};
use strata_core::{BlockError, Result};

use crate::schedule::{self, Schedule};
use crate::ThinPool;

pub const SNAPSHOT_POLICY: &str = "snapshot-policy";
pub const SNAPSHOT_PROTECT: &str = "snapshot-protect";
pub const SNAPSHOT_UNPROTECT: &str = "snapshot-unprotect";

const VOLUME: Arg = Arg {
    name: "volume",
    kind: ArgKind::Name,
    help: "the volume's name",
    optional: false,
};
const SNAPSHOT: Arg = Arg {
    name: "snapshot",
    kind: ArgKind::Name,
    help: "the snapshot's name",
    optional: false,
};

/// Periods and counts travel as text (the pool parses them, naming the field it refuses).
pub const POLICY: Verb = Verb {
    name: SNAPSHOT_POLICY,
    args: &[
        VOLUME,
        Arg {
            name: "every",
            kind: ArgKind::Name,
            help: "take a snapshot this often: 30s, 10m, 2h, 1d",
            optional: true,
        },
        Arg {
            name: "every-writes",
            kind: ArgKind::Name,
            help: "take a snapshot after this many write requests",
            optional: true,
        },
        Arg {
            name: "keep",
            kind: ArgKind::Name,
            help: "keep only the last K snapshots the policy made",
            optional: true,
        },
        Arg {
            name: "off",
            kind: ArgKind::Flag,
            help: "stop taking periodic snapshots (the ones taken stay)",
            optional: true,
        },
    ],
    help: "set a volume's periodic snapshots (every, every-writes, keep), remove them (off), \
           or show them (no other argument)",
};

pub const PROTECT: Verb = Verb {
    name: SNAPSHOT_PROTECT,
    args: &[VOLUME, SNAPSHOT],
    help: "protect a snapshot: no policy deletes it, and a delete is refused",
};

pub const UNPROTECT: Verb = Verb {
    name: SNAPSHOT_UNPROTECT,
    args: &[VOLUME, SNAPSHOT],
    help: "end a snapshot's protection",
};

fn text<'a>(args: &'a toml::Table, name: &str) -> Option<&'a str> {
    args.get(name).and_then(toml::Value::as_str)
}

fn required<'a>(args: &'a toml::Table, name: &str) -> Result<&'a str> {
    text(args, name)
        .ok_or_else(|| BlockError::InvalidArgument(format!("argument {name:?} is missing")))
}

/// Answers one of the verbs above; `Unsupported` for any other.
pub async fn call(pool: &ThinPool, verb: &str, args: &toml::Table) -> Result<toml::Table> {
    if ![SNAPSHOT_POLICY, SNAPSHOT_PROTECT, SNAPSHOT_UNPROTECT].contains(&verb) {
        return Err(BlockError::Unsupported("call"));
    }
    let volume = required(args, "volume")?;
    match verb {
        SNAPSHOT_POLICY => {
            let off = args.get("off").and_then(toml::Value::as_bool) == Some(true);
            let (every, writes, keep) = (
                text(args, "every"),
                text(args, "every-writes"),
                text(args, "keep"),
            );
            let given = every.is_some() || writes.is_some() || keep.is_some();
            let status = match (off, given) {
                (true, true) => {
                    return Err(BlockError::InvalidArgument(
                        "`off` removes the policy: give it alone".into(),
                    ))
                }
                (true, false) => {
                    pool.set_snapshot_policy(volume, None, schedule::wall_ms())
                        .await?
                }
                (false, true) => {
                    let schedule = Schedule::parse(every, writes, keep)
                        .map_err(BlockError::InvalidArgument)?;
                    pool.set_snapshot_policy(volume, Some(schedule), schedule::wall_ms())
                        .await?
                }
                (false, false) => pool.snapshot_policy(volume)?,
            };
            toml::Table::try_from(&status)
                .map_err(|e| BlockError::InvalidArgument(format!("snapshot policy: {e}")))
        }
        SNAPSHOT_PROTECT | SNAPSHOT_UNPROTECT => {
            let snapshot = required(args, "snapshot")?;
            let protect = verb == SNAPSHOT_PROTECT;
            pool.protect_snapshot(volume, snapshot, protect).await?;
            let mut answer = toml::Table::new();
            answer.insert("volume".into(), volume.into());
            answer.insert("snapshot".into(), snapshot.into());
            answer.insert("protected".into(), protect.into());
            Ok(answer)
        }
        _ => Err(BlockError::Unsupported("call")),
    }
}
