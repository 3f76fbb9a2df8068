//! The edge's modules form layers: no import circle between its top-level modules,
//! and none of them imports from the crate root (`lib.rs` wires them together and
//! sits on top). Read from the sources, so a new `use` that closes a circle fails
//! here with the circle named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source folder") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `crate::NAME` paths a source names, outside its test module.
fn crate_paths(source: &str) -> Vec<String> {
    let code = source.split("#[cfg(test)]").next().unwrap_or("");
    let mut out = Vec::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            if after.starts_with('{') {
                let group = &after[1..after.find('}').unwrap_or(after.len())];
                for item in group.split(',') {
                    let item = item.trim();
                    out.push(item.split("::").next().unwrap_or(item).to_string());
                }
            } else {
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push(name);
            }
            rest = after;
        }
    }
    out
}

/// Each top-level module and the top-level modules (or `lib` for the crate root's
/// own items) it imports.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("src") {
        let path = entry.expect("entry").path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if name == "lib" {
            continue;
        }
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else {
            files.push(path);
        }
        modules.insert(name, files);
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (name, files) in &modules {
        let mut deps = BTreeSet::new();
        for f in files {
            let source = std::fs::read_to_string(f).expect("readable source");
            for dep in crate_paths(&source) {
                if dep == *name || dep.is_empty() || dep == "self" {
                    continue;
                }
                deps.insert(if names.contains(&dep) {
                    dep
                } else {
                    "lib".into()
                });
            }
        }
        graph.insert(name.clone(), deps);
    }
    graph
}

/// A circle through `from`, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &BTreeMap<String, BTreeSet<String>>,
        at: &str,
        goal: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(at).into_iter().flatten() {
            if next == goal {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, next, goal, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![from.to_string()];
    walk(graph, from, from, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn the_edge_modules_form_layers_without_circles() {
    let graph = graph();
    assert!(graph.len() > 10, "modules found: {graph:?}");
    for (name, deps) in &graph {
        assert!(
            !deps.contains("lib"),
            "{name} imports from the crate root; what it needs belongs in a module below it ({deps:?})"
        );
        if let Some(c) = circle(&graph, name) {
            panic!(
                "an import circle between the edge's modules: {}",
                c.join(" -> ")
            );
        }
    }
}
