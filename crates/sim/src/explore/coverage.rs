//! What a run (or many) exercised: how many of each event, layer kind, client operation and
//! online change, and which events could not run where they were drawn (a member failure
//! with no redundant member left to lose is skipped, not forced).

use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// (section, name) → count.
    counts: BTreeMap<(String, String), u64>,
}

impl Coverage {
    pub fn count(&mut self, section: &str, name: &str) {
        self.add(section, name, 1);
    }

    pub fn add(&mut self, section: &str, name: &str, n: u64) {
        *self
            .counts
            .entry((section.to_string(), name.to_string()))
            .or_default() += n;
    }

    pub fn get(&self, section: &str, name: &str) -> u64 {
        self.counts
            .get(&(section.to_string(), name.to_string()))
            .copied()
            .unwrap_or(0)
    }

    pub fn merge(&mut self, other: &Coverage) {
        for ((section, name), n) in &other.counts {
            self.add(section, name, *n);
        }
    }

    /// One line per section: `event: power-cut 812, restart 120, …`.
    pub fn render(&self) -> String {
        let mut sections: BTreeMap<&str, Vec<(&str, u64)>> = BTreeMap::new();
        for ((section, name), n) in &self.counts {
            sections.entry(section).or_default().push((name, *n));
        }
        let mut out = String::new();
        for (section, names) in sections {
            let items: Vec<String> = names.iter().map(|(n, c)| format!("{n} {c}")).collect();
            let _ = writeln!(out, "  {section}: {}", items.join(", "));
        }
        out
    }
}
