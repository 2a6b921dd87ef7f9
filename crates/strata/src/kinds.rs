//! `strata kinds`: every layer kind in the registry, with its options and the online verbs
//! its entry declares (what `replace`, `fail-member`, `volume create` … may be sent to).

use std::fmt::Write;

use strata_stack::registry::{self, LayerKind};

/// The listing, one block per kind.
pub fn render() -> String {
    let mut text = String::new();
    for kind in registry::KINDS {
        render_kind(&mut text, kind);
    }
    text
}

fn render_kind(text: &mut String, kind: &LayerKind) {
    let _ = writeln!(text, "{}: {}", kind.kind, kind.about);
    let _ = writeln!(text, "  children: {}", kind.children.describe());
    let options = (kind.options)();
    if !options.is_empty() {
        let _ = writeln!(text, "  options: {}", options.join(", "));
    }
    for verb in kind.verbs {
        let _ = writeln!(text, "  verb {}: {}", verb.usage(), verb.help);
        for arg in verb.args {
            let _ = writeln!(text, "    {}: {}", arg.name.to_uppercase(), arg.help);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Commands that are not online changes of a layer (`call` sends any declared verb;
    /// `brick` and `cluster` run on their own, not through a server; `lock` is a lock session
    /// that goes down the stack as `Control::Lock`).
    const NOT_VERBS: [&str; 11] = [
        "serve", "status", "check", "metrics", "sim", "kinds", "help", "call", "brick", "cluster",
        "lock",
    ];
    /// Changes of the exports, which the stack makes itself, and views (`raid5 watch` polls
    /// the status).
    const EXPORT_CHANGES: [&str; 3] = ["snapshot-export", "snapshot-unexport", "raid5-watch"];
    /// CLI commands whose verb has another name (`strata raid5 grow` sends `grow-members`).
    const SENDS: [(&str, &str); 3] = [
        ("raid5-grow", "grow-members"),
        ("raid5-pause", "grow-pause"),
        ("raid5-resume", "grow-resume"),
    ];

    /// The verbs the command line offers: its change commands, and `volume X` as `volume-X`.
    fn cli_verbs() -> Vec<String> {
        let cli = crate::Cli::command();
        let mut verbs = Vec::new();
        for command in cli.get_subcommands() {
            let name = command.get_name();
            if NOT_VERBS.contains(&name) {
                continue;
            }
            let subcommands: Vec<String> = command
                .get_subcommands()
                .map(|sub| format!("{name}-{}", sub.get_name()))
                .filter(|sub| !sub.ends_with("-help"))
                .collect();
            let subcommands: Vec<String> = subcommands
                .into_iter()
                .filter(|sub| !EXPORT_CHANGES.contains(&sub.as_str()))
                .map(|sub| match SENDS.iter().find(|(cli, _)| *cli == sub) {
                    Some((_, verb)) => verb.to_string(),
                    None => sub,
                })
                .collect();
            if subcommands.is_empty() {
                verbs.push(name.to_string());
            } else {
                verbs.extend(subcommands);
            }
        }
        verbs
    }

    #[test]
    fn every_verb_the_cli_offers_is_declared_by_some_kind() {
        let verbs = cli_verbs();
        for verb in [
            "replace",
            "add-member",
            "fail-member",
            "grow",
            "volume-create",
            "snapshot-create",
            "snapshot-rollback",
            "grow-members",
            "grow-pause",
        ] {
            assert!(verbs.iter().any(|v| v == verb), "{verb} in {verbs:?}");
        }
        for verb in &verbs {
            assert!(
                registry::KINDS.iter().any(|kind| kind.verb(verb).is_some()),
                "the CLI offers {verb:?} but no kind declares it"
            );
        }
    }

    #[test]
    fn the_listing_shows_each_kind_with_its_verbs_and_their_help() {
        let text = render();
        for kind in registry::KINDS {
            assert!(text.contains(&format!("{}: ", kind.kind)), "{text}");
        }
        assert!(
            text.contains("verb fail-member MEMBER: stop using a member"),
            "{text}"
        );
        assert!(text.contains("verb volume-create VOLUME SIZE: "), "{text}");
        assert!(text.contains("thin-pool: "), "{text}");
    }
}
