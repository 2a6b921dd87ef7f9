//! Every `[[layer]]` example the documentation shows (docs/**/*.md, README.md, and the
//! module docs of the layer sources) passes its kind's typed config check, and every kind in
//! the registry has at least one such example: the typed configs accept what the docs teach.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use strata_stack::registry::{self, options_from_table};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The files under `folder` (recursively) whose names end in `.extension`.
fn files_under(folder: PathBuf, extension: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![folder];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == extension) {
                found.push(path);
            }
        }
    }
    found
}

/// Files whose text may hold TOML examples, with the comment prefix to strip from each line.
fn documented_files() -> Vec<(PathBuf, &'static str)> {
    let root = repository();
    let mut files = vec![(root.join("README.md"), "")];
    files.extend(
        files_under(root.join("docs"), "md")
            .into_iter()
            .map(|p| (p, "")),
    );
    for family in ["stateless", "raid", "stage", "migrate"] {
        let sources = files_under(root.join("crates").join(family).join("src"), "rs");
        files.extend(sources.into_iter().map(|p| (p, "//!")));
    }
    files
}

/// The ```toml blocks of `text` that parse as TOML (some are fragments of a larger file).
fn toml_blocks(text: &str, prefix: &str) -> Vec<toml::Table> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let Some(line) = line.trim_start().strip_prefix(prefix) else {
            continue;
        };
        let line = line.strip_prefix(' ').unwrap_or(line);
        match (&mut current, line.trim()) {
            (None, "```toml") => current = Some(String::new()),
            (Some(block), "```") => {
                if let Ok(table) = block.parse::<toml::Table>() {
                    blocks.push(table);
                }
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn every_documented_layer_table_passes_its_kinds_check() {
    let mut covered = BTreeSet::new();
    let mut checked = 0;
    for (path, prefix) in documented_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        for block in toml_blocks(&text, prefix) {
            let Some(toml::Value::Array(layers)) = block.get("layer") else {
                continue;
            };
            for layer in layers {
                let mut table = layer.as_table().unwrap().clone();
                let kind = table["kind"].as_str().unwrap().to_string();
                let Some(entry) = registry::find(&kind) else {
                    continue;
                };
                // What the loader takes as the graph, not as the kind's options.
                for key in ["name", "kind", "children", "volumes", "grow-from"] {
                    table.remove(key);
                }
                let options = options_from_table(&table, PathBuf::new()).unwrap();
                if let Err(error) = (entry.check)(&options) {
                    panic!(
                        "{}: a documented {kind} is refused: {error}",
                        path.display()
                    );
                }
                covered.insert(entry.kind);
                checked += 1;
            }
        }
    }
    let missing: Vec<&str> = registry::KINDS
        .iter()
        .map(|k| k.kind)
        .filter(|k| !covered.contains(k))
        .collect();
    assert!(
        missing.is_empty(),
        "kinds with no documented example: {missing:?}"
    );
    assert!(checked >= registry::KINDS.len(), "{checked} tables");
}
