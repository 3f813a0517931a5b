//! The backend's layering, read from its sources and manifests, so that a new import that
//! breaks it fails here rather than in review:
//!
//! - no module imports a sibling that (directly or through others) imports it back: for
//!   every module, the graph of its children's `crate::`/`super::` references has no cycle
//!   (in every crate of the workspace: the backend's, the provider, the API, the e2e tests);
//! - the control plane and the node agent do not depend on each other, and the crates they
//!   share depend on neither (nor on the binary);
//! - the replay (`gpufleet-economics`) drives the control plane and knows no node agent, and
//!   the control plane does not know it;
//! - clap's types live only in the binary.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The backend's crates, as the workspace lists them (so a new one is checked too): each
/// folder under `backend-agent/`, and the source roots of its targets.
fn crates() -> Vec<(String, Vec<PathBuf>)> {
    let root = backend().join("..");
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let members = manifest["workspace"]["members"].as_array().unwrap();
    let found: Vec<(String, Vec<PathBuf>)> = members
        .iter()
        .filter_map(|m| m.as_str())
        .filter_map(|m| m.strip_prefix("backend-agent"))
        .map(|rest| {
            let folder = rest.trim_start_matches('/');
            let folder = if folder.is_empty() { "." } else { folder };
            let roots = ["src/lib.rs", "src/main.rs"]
                .iter()
                .map(|r| backend().join(folder).join(r))
                .filter(|r| r.is_file())
                .collect();
            (folder.to_string(), roots)
        })
        .collect();
    assert!(
        found.len() >= 7,
        "the workspace lists the backend's crates: {found:?}"
    );
    found
}

/// The source roots (lib.rs, main.rs) of every crate of the workspace, by member folder.
fn workspace_roots() -> Vec<(String, Vec<PathBuf>)> {
    let root = backend().join("..");
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let found: Vec<(String, Vec<PathBuf>)> = manifest["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m.as_str())
        .map(|member| {
            let roots = ["src/lib.rs", "src/main.rs"]
                .iter()
                .map(|r| root.join(member).join(r))
                .filter(|r| r.is_file())
                .collect();
            (member.to_string(), roots)
        })
        .collect();
    assert!(
        found.iter().any(|(m, _)| m == "provider"),
        "the workspace lists the provider: {found:?}"
    );
    found
}

fn backend() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

type Module = Vec<String>;

/// Every module of the crate rooted at `root` (a lib.rs or main.rs), with its file.
fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    collect(root, Vec::new(), &mut out);
    out
}

fn collect(file: &Path, path: Module, out: &mut BTreeMap<Module, PathBuf>) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    out.insert(path.clone(), file.to_path_buf());
    // Children live beside a lib.rs/main.rs/mod.rs, or in the folder named for the file.
    let name = file.file_stem().unwrap().to_string_lossy();
    let dir = if path.is_empty() || name == "mod" {
        file.parent().unwrap().to_path_buf()
    } else {
        file.parent().unwrap().join(&*name)
    };
    for line in text.lines() {
        let line = line.trim();
        let decl = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("pub(crate) mod "))
            .or_else(|| line.strip_prefix("mod "));
        let Some(child) = decl.and_then(|d| d.strip_suffix(';')) else {
            continue;
        };
        let flat = dir.join(format!("{child}.rs"));
        let nested = dir.join(child).join("mod.rs");
        let child_file = if flat.is_file() { flat } else { nested };
        let mut child_path = path.clone();
        child_path.push(child.to_string());
        collect(&child_file, child_path, out);
    }
}

/// The module paths `file` (module `at`) refers to through `crate::` and `super::`, as
/// written (the caller resolves them to modules). Comments are skipped.
fn references(text: &str, at: &Module) -> Vec<Module> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        for (i, _) in code.match_indices("crate::") {
            if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue; // `gpufleet_crate::` and the like
            }
            out.extend(paths(&code[i + "crate::".len()..], Vec::new()));
        }
        for (i, _) in code.match_indices("super::") {
            if code[..i].ends_with("super::") || code[..i].ends_with(|c: char| c.is_alphanumeric())
            {
                continue; // counted from the first `super::`
            }
            // `super` of a module is its parent, whether it is a file or a folder's mod.rs.
            let mut base = at.clone();
            let mut rest = &code[i..];
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            out.extend(paths(rest, base));
        }
    }
    out
}

/// The paths at the start of `rest` (after `crate::`), each prefixed by `base`: one path,
/// or one per entry of a `{a, b::c}` group.
fn paths(rest: &str, base: Module) -> Vec<Module> {
    if let Some(group) = rest.strip_prefix('{') {
        let end = group.find('}').unwrap_or(group.len());
        return group[..end]
            .split(',')
            .flat_map(|entry| paths(entry.trim(), base.clone()))
            .collect();
    }
    let mut path = base;
    for segment in rest.split("::") {
        let ident: String = segment
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() || ident == "self" {
            break;
        }
        path.push(ident.clone());
        if ident.len() != segment.len() {
            break;
        }
    }
    vec![path]
}

/// The longest prefix of `path` that is a module.
fn resolve(path: &Module, modules: &BTreeMap<Module, PathBuf>) -> Module {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains_key(p))
        .unwrap_or_default()
}

/// For each module with children, the edges between its children: child `a` refers to
/// something in child `b`.
fn sibling_edges(root: &Path) -> BTreeMap<Module, BTreeSet<(String, String)>> {
    let modules = modules(root);
    let mut edges: BTreeMap<Module, BTreeSet<(String, String)>> = BTreeMap::new();
    for (at, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap();
        for target in references(&text, at) {
            let to = resolve(&target, &modules);
            let common = at.iter().zip(&to).take_while(|(a, b)| a == b).count();
            // A module using its own descendant or ancestor is not a sibling edge.
            if common == at.len() || common == to.len() {
                continue;
            }
            edges
                .entry(at[..common].to_vec())
                .or_default()
                .insert((at[common].clone(), to[common].clone()));
        }
    }
    edges
}

/// The cycles (strongly connected sets of two or more) of a directed graph.
fn cycles(edges: &BTreeSet<(String, String)>) -> Vec<BTreeSet<String>> {
    let nodes: BTreeSet<&String> = edges.iter().flat_map(|(a, b)| [a, b]).collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for (a, b) in edges {
                if *a == n && seen.insert(b.clone()) {
                    todo.push(b.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for n in &nodes {
        if !reaches[n].contains(*n) || out.iter().any(|c| c.contains(*n)) {
            continue;
        }
        let set: BTreeSet<String> = nodes
            .iter()
            .filter(|m| reaches[n].contains(**m) && reaches[**m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        out.push(set);
    }
    out
}

#[test]
fn no_module_imports_a_sibling_that_imports_it_back() {
    let mut found = Vec::new();
    for (folder, roots) in workspace_roots() {
        assert!(!roots.is_empty(), "{folder} has no lib.rs or main.rs");
        for root in roots {
            for (parent, edges) in sibling_edges(&root) {
                for cycle in cycles(&edges) {
                    let links: Vec<String> = edges
                        .iter()
                        .filter(|(a, b)| cycle.contains(a) && cycle.contains(b))
                        .map(|(a, b)| format!("{a} -> {b}"))
                        .collect();
                    found.push(format!(
                        "{} in `{}`: {}",
                        root.display(),
                        if parent.is_empty() {
                            "crate".to_string()
                        } else {
                            parent.join("::")
                        },
                        links.join(", ")
                    ));
                }
            }
        }
    }
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

#[test]
fn the_cycle_check_finds_a_cycle_and_follows_groups_and_super() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\npub mod c;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::{b::Thing, c};\n").unwrap();
    std::fs::write(src.join("b.rs"), "pub mod inner;\n").unwrap();
    std::fs::create_dir(src.join("b")).unwrap();
    // b::inner -> a through two levels of `super`.
    std::fs::write(src.join("b/inner.rs"), "fn f() { super::super::a::g() }\n").unwrap();
    std::fs::write(src.join("c.rs"), "// crate::a in a comment is no edge\n").unwrap();
    let edges = sibling_edges(&src.join("lib.rs"));
    let top = &edges[&Vec::new()];
    assert!(top.contains(&("a".into(), "b".into())));
    assert!(top.contains(&("a".into(), "c".into())));
    assert!(top.contains(&("b".into(), "a".into())));
    assert!(!top.contains(&("c".into(), "a".into())));
    let found = cycles(top);
    assert_eq!(
        found,
        vec![BTreeSet::from(["a".to_string(), "b".to_string()])]
    );
}

/// The names of the gpufleet crates a manifest depends on (normal dependencies).
fn gpufleet_dependencies(folder: &str) -> (String, BTreeSet<String>, BTreeSet<String>) {
    let path = backend().join(folder).join("Cargo.toml");
    let manifest: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
    let name = manifest["package"]["name"].as_str().unwrap().to_string();
    let deps: BTreeSet<String> = manifest
        .get("dependencies")
        .and_then(|d| d.as_table())
        .map(|t| t.keys().cloned().collect())
        .unwrap_or_default();
    let gpufleet = deps
        .iter()
        .filter(|d| d.starts_with("gpufleet-"))
        .cloned()
        .collect();
    (name, gpufleet, deps)
}

#[test]
fn control_plane_and_node_agent_meet_only_in_the_binary() {
    let mut by_name = BTreeMap::new();
    for (folder, _) in crates() {
        let (name, gpufleet, deps) = gpufleet_dependencies(&folder);
        if name != "gpufleet-agent" {
            assert!(
                !deps.contains("clap"),
                "{name} depends on clap: flags belong to the binary"
            );
        }
        by_name.insert(name, gpufleet);
    }
    let forbidden: &[(&str, &[&str])] = &[
        (
            "gpufleet-control",
            &["gpufleet-node", "gpufleet-agent", "gpufleet-economics"],
        ),
        ("gpufleet-node", &["gpufleet-control", "gpufleet-agent"]),
        // The replay drives the control plane's admission; it knows no node agent.
        ("gpufleet-economics", &["gpufleet-node", "gpufleet-agent"]),
        (
            "gpufleet-wire",
            &["gpufleet-control", "gpufleet-node", "gpufleet-agent"],
        ),
        (
            "gpufleet-process",
            &["gpufleet-control", "gpufleet-node", "gpufleet-agent"],
        ),
        (
            "gpufleet-slurm",
            &["gpufleet-control", "gpufleet-node", "gpufleet-agent"],
        ),
        // The store's engines know nothing of what is stored.
        (
            "gpufleet-sql",
            &["gpufleet-control", "gpufleet-node", "gpufleet-agent"],
        ),
        (
            "gpufleet-gpu",
            &[
                "gpufleet-control",
                "gpufleet-node",
                "gpufleet-agent",
                "gpufleet-wire",
            ],
        ),
    ];
    for (name, never) in forbidden {
        let deps = by_name
            .get(*name)
            .unwrap_or_else(|| panic!("no crate {name}"));
        for n in *never {
            assert!(!deps.contains(*n), "{name} depends on {n}");
        }
    }
    // The binary composes both.
    assert!(by_name["gpufleet-agent"].contains("gpufleet-control"));
    assert!(by_name["gpufleet-agent"].contains("gpufleet-node"));
}
