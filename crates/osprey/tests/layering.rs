//! The layout is the boundary: code under `src/signal/` may import only the
//! signal-safe halves of the shared data structures, and the agent's
//! top-level modules import each other without a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `crate::a::b` paths named in `text` (in `use` lines and inline), as `a` or `a::b`.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines().map(str::trim).filter(|l| !l.starts_with("//")) {
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + 7..];
            let path: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
            let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
            match parts.as_slice() {
                [] => {}
                [a] => drop(found.insert(a.to_string())),
                [a, b, ..] => drop(found.insert(format!("{a}::{b}"))),
            }
        }
    }
    found
}

#[test]
fn signal_folder_imports_only_signal_safe_code() {
    let mut files = Vec::new();
    rust_files(&src().join("signal"), &mut files);
    assert!(files.len() >= 5, "signal/ not found");
    // `record` (layout, context read, ring push), `registry` (its lookup half:
    // `Registry::get/lookup/claim_current/handler_depth`), `storage` (`put`).
    let allowed = |p: &str| {
        let top = p.split("::").next().unwrap_or("");
        matches!(top, "signal" | "record" | "registry" | "storage")
    };
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for p in crate_paths(&text) {
            assert!(allowed(&p), "{} imports crate::{p}, which is agent-side", f.display());
        }
    }
    // The signal-safe halves named above import nothing agent-side either.
    for half in ["registry/lookup.rs", "storage/put.rs", "record/mod.rs", "record/context.rs", "record/ring.rs"] {
        let text = std::fs::read_to_string(src().join(half)).unwrap();
        for p in crate_paths(&text) {
            assert!(allowed(&p), "{half} imports crate::{p}, which is agent-side");
        }
    }
}

#[test]
fn agent_modules_import_without_cycles() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src()).unwrap();
        let module = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if module == "lib" {
            continue;
        }
        let deps = graph.entry(module.clone()).or_default();
        for p in crate_paths(&std::fs::read_to_string(f).unwrap()) {
            let top = p.split("::").next().unwrap().to_string();
            if top != module && top != "internals" {
                deps.insert(top);
            }
        }
    }
    // Depth-first search for a back edge.
    fn visit(
        m: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) {
        match state.get(m) {
            Some(2) => return,
            Some(1) => panic!("import cycle: {} -> {m}", path.join(" -> ")),
            _ => {}
        }
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            visit(d, g, state, path);
        }
        path.pop();
        state.insert(m.to_string(), 2);
    }
    let mut state = BTreeMap::new();
    for m in graph.keys() {
        visit(m, &graph, &mut state, &mut Vec::new());
    }
    assert!(graph.len() >= 12, "expected the agent's modules, found {:?}", graph.keys());
}
