//! `strata snapshot policy|protect|unprotect`: a volume's periodic snapshots and the
//! snapshots no policy may delete (the pool's `snapshot-policy`, `snapshot-protect` and
//! `snapshot-unprotect` verbs).

use serde_json::Value;
use strata_core::outln;
use strata_thin::schedule::utc;

use crate::snapshot_cmd::{arg, call, split};

/// The flags of `strata snapshot policy`, as the verb's arguments.
pub struct PolicyFlags {
    pub every: Option<String>,
    pub every_writes: Option<String>,
    pub keep: Option<String>,
    pub off: bool,
}

pub fn policy(
    target: &crate::AdminTarget,
    volume: &str,
    flags: PolicyFlags,
    json: bool,
) -> anyhow::Result<()> {
    let (pool, name) = split(volume)?;
    let mut args = vec![arg("volume", name)];
    args.extend(flags.every.map(|v| arg("every", v)));
    args.extend(flags.every_writes.map(|v| arg("every-writes", v)));
    args.extend(flags.keep.map(|v| arg("keep", v)));
    if flags.off {
        args.push(("off".into(), None));
    }
    let answer = call(target, pool, "snapshot-policy", args)?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        outln!("{}", render(volume, &answer).trim_end());
    }
    Ok(())
}

/// The policy as people read it: what it does, when it acts next, what it did last.
fn render(volume: &str, policy: &Value) -> String {
    let mut out = String::new();
    let Some(described) = policy["policy"].as_str() else {
        out.push_str(&format!("{volume}: no periodic snapshots\n"));
        let protected = names(&policy["protected"]);
        if !protected.is_empty() {
            out.push_str(&format!("  protected: {protected}\n"));
        }
        return out;
    };
    out.push_str(&format!("{volume}: {described}\n"));
    let writes = policy["writes_since"].as_u64().unwrap_or(0);
    let mut next = Vec::new();
    if let Some(at) = policy["next_due_ms"].as_u64() {
        next.push(format!("{} UTC", utc(at)));
    }
    if let Some(every) = policy["every_writes"].as_u64() {
        next.push(format!(
            "after {} more writes",
            every.saturating_sub(writes)
        ));
    }
    out.push_str(&format!(
        "  next automatic snapshot: {}\n",
        next.join(" or ")
    ));
    let last = match (
        policy["last_auto"].as_str(),
        policy["last_auto_ms"].as_u64(),
    ) {
        (Some(name), Some(ms)) => format!("{name} ({} UTC)", utc(ms)),
        _ => "none".into(),
    };
    out.push_str(&format!("  last automatic snapshot: {last}\n"));
    out.push_str(&format!(
        "  writes since: {writes} (counted in memory: 0 after a restart)\n"
    ));
    let made = names(&policy["policy_snapshots"]);
    out.push_str(&format!(
        "  policy snapshots: {}\n",
        if made.is_empty() { "none" } else { &made }
    ));
    let protected = names(&policy["protected"]);
    if !protected.is_empty() {
        out.push_str(&format!("  protected: {protected}\n"));
    }
    out
}

fn names(list: &Value) -> String {
    let names: Vec<&str> = list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    names.join(", ")
}

pub fn protect(
    target: &crate::AdminTarget,
    volume: &str,
    snapshot: &str,
    protect: bool,
) -> anyhow::Result<()> {
    let (pool, name) = split(volume)?;
    let verb = if protect {
        "snapshot-protect"
    } else {
        "snapshot-unprotect"
    };
    call(
        target,
        pool,
        verb,
        vec![arg("volume", name), arg("snapshot", snapshot)],
    )?;
    if protect {
        outln!("{volume}@{snapshot} is protected: no policy deletes it, and a delete is refused");
    } else {
        outln!("{volume}@{snapshot} is no longer protected");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn a_policy_renders_what_it_does_and_when_it_acts_next() {
        let text = super::render(
            "pool/v",
            &json!({
                "policy": "every 10m or every 100 writes, keep 3",
                "every_writes": 100,
                "writes_since": 40,
                "next_due_ms": 1_795_629_915_000u64,
                "last_auto": "auto-20261125-175515",
                "last_auto_ms": 1_795_629_315_000u64,
                "policy_snapshots": ["auto-20261125-175515"],
                "protected": ["nightly"],
            }),
        );
        assert!(
            text.starts_with("pool/v: every 10m or every 100 writes, keep 3\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "next automatic snapshot: 2026-11-25 18:05:15 UTC or after 60 more writes"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "last automatic snapshot: auto-20261125-175515 (2026-11-25 17:55:15 UTC)"
            ),
            "{text}"
        );
        assert!(text.contains("protected: nightly"), "{text}");
        let off = super::render("pool/v", &json!({"policy": null, "protected": []}));
        assert_eq!(off, "pool/v: no periodic snapshots\n");
    }
}
