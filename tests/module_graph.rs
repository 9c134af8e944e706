//! The modules of `src/` depend one way: no two top-level modules (`backend`, `metrics`,
//! `server`, …) reach each other through any chain of `crate::…` paths, and no two files of
//! one module directory (siblings under the same `mod.rs`) reach each other through
//! `super::…` paths. A module's own `mod.rs` is its parent, not a sibling: it may use its
//! children and they it. Unit tests (`#[cfg(test)]` modules) are left out: a test may reach
//! anywhere.
//!
//! Each binary's own modules (`src/bin/floodgate/`: the CLI's subcommands and upstream's
//! environment; `src/bin/floodgate-bench/`: the load generator) are a crate of their own over
//! the library: its files are one graph of their own, and the library names none of them. The Rust client's
//! modules (`clients/rust/src/`) are held to the same rule.
//!
//! The paths are read off the source text: `use` statements (groups `{…}` over several
//! lines included) and paths written inline in code; comments are ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A dependency graph: for each node, the nodes it uses and where (file:line), first seen.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// The binaries' directories, under `src/`.
const BINARIES: [&str; 2] = ["bin/floodgate", "bin/floodgate-bench"];

#[test]
fn top_level_modules_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/rust/src");
    let binaries = BINARIES.map(|binary| src.join(binary));
    for root in [src.clone(), client].into_iter().chain(binaries) {
        let mut graph = Graph::new();
        for file in rust_files(&root) {
            let relative = file.strip_prefix(&root).expect("under its root");
            let top = module_of(relative);
            if ["lib", "main", "bin"].contains(&top.as_str()) {
                continue;
            }
            for (line, path) in paths(&file) {
                if let Some(rest) = path.strip_prefix("crate::") {
                    let target = rest.split("::").next().unwrap_or_default().to_owned();
                    if !target.is_empty() && target != top {
                        add(&mut graph, &top, &target, relative, line);
                    }
                }
            }
        }
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let place = root.strip_prefix(manifest).unwrap_or(&root);
        assert_no_cycle(&place.display().to_string(), &graph);
    }
}

/// The library builds without the binaries: no library file names one of a binary's
/// modules or `anyhow`, and `lib.rs` declares none of them.
#[test]
fn the_library_depends_on_no_module_of_the_binary() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let binary: BTreeSet<String> = (BINARIES.iter())
        .flat_map(|binary| siblings(&src.join(binary)))
        .filter(|module| module != "main")
        .collect();
    assert!(
        binary.contains("compat") && binary.contains("report"),
        "{binary:?}"
    );
    let mut found = Vec::new();
    for file in rust_files(&src) {
        let relative = file.strip_prefix(&src).expect("under src");
        if relative.starts_with("bin") {
            continue;
        }
        for (line, path) in paths(&file) {
            let target = path
                .strip_prefix("crate::")
                .and_then(|rest| rest.split("::").next());
            if target.is_some_and(|target| binary.contains(target)) {
                found.push(format!("{}:{line}: {path}", relative.display()));
            }
        }
    }
    // `anyhow` is for the binary's edge: the library's errors are types a caller can match.
    for file in rust_files(&src) {
        let relative = file.strip_prefix(&src).expect("under src");
        if relative.starts_with("bin") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a readable file");
        if let Some(line) = (text.lines()).position(|line| line.contains("anyhow")) {
            found.push(format!("{}:{}: anyhow", relative.display(), line + 1));
        }
    }
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    for module in &binary {
        if lib
            .lines()
            .any(|line| line.trim_start_matches("pub ").trim() == format!("mod {module};"))
        {
            found.push(format!("lib.rs declares `mod {module}`"));
        }
    }
    assert!(
        found.is_empty(),
        "the library reaches the binary: {found:#?}"
    );
}

#[test]
fn sibling_files_of_a_module_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut directories: BTreeMap<PathBuf, Graph> = BTreeMap::new();
    for file in rust_files(&src) {
        let Some(directory) = file.parent().filter(|dir| *dir != src.as_path()) else {
            continue;
        };
        // A directory's root (`mod.rs`, or the binary's `main.rs`) is the parent of the
        // files beside it, not their sibling.
        if file
            .file_name()
            .is_some_and(|name| name == "mod.rs" || name == "main.rs")
        {
            continue;
        }
        let siblings = siblings(directory);
        let me = node_name(&file);
        let within = directory.strip_prefix(&src).expect("under src");
        // A binary's files name their siblings from its own root: `crate::query`.
        let in_binary = (BINARIES.iter()).find_map(|binary| within.strip_prefix(binary).ok());
        let module_path = in_binary
            .unwrap_or(within)
            .to_string_lossy()
            .replace('/', "::");
        let graph = directories.entry(directory.to_owned()).or_default();
        let relative = file.strip_prefix(&src).expect("under src");
        for (line, path) in paths(&file) {
            let own = if module_path.is_empty() {
                "crate::".to_owned()
            } else {
                format!("crate::{module_path}::")
            };
            let rest = path
                .strip_prefix("super::")
                .or_else(|| path.strip_prefix(own.as_str()));
            let Some(rest) = rest else { continue };
            let target = rest.split("::").next().unwrap_or_default();
            if target != me && siblings.contains(target) {
                add(graph, &me, target, relative, line);
            }
        }
    }
    for (directory, graph) in &directories {
        let place = directory.strip_prefix(&src).unwrap_or(directory);
        assert_no_cycle(&format!("src/{}", place.display()), graph);
    }
}

/// The cycle finder finds a cycle, and only a cycle (so the tests above can fail).
#[test]
fn the_cycle_finder_finds_cycles() {
    let mut graph = Graph::new();
    add(&mut graph, "a", "b", Path::new("a.rs"), 1);
    add(&mut graph, "b", "c", Path::new("b.rs"), 2);
    assert_eq!(cycle(&graph), None);
    add(&mut graph, "c", "a", Path::new("c.rs"), 3);
    assert_eq!(
        cycle(&graph).map(|path| path.join(" -> ")),
        Some("a -> b -> c -> a".to_owned())
    );
    let parsed =
        paths_in("use crate::x::{\n    A,\n};\n// crate::no\nfn f() { super::{y, z::W}; }\n");
    let found: Vec<&str> = parsed.iter().map(|(_, path)| path.as_str()).collect();
    assert_eq!(found, ["crate::x", "super::y", "super::z"]);
}

fn add(graph: &mut Graph, from: &str, to: &str, file: &Path, line: usize) {
    (graph.entry(from.to_owned()).or_default())
        .entry(to.to_owned())
        .or_insert_with(|| format!("{}:{line}", file.display()));
}

fn assert_no_cycle(place: &str, graph: &Graph) {
    if let Some(cycle) = cycle(graph) {
        let steps: Vec<String> = (cycle.windows(2))
            .map(|step| format!("{} -> {} ({})", step[0], step[1], graph[&step[0]][&step[1]]))
            .collect();
        panic!(
            "a dependency cycle in {place}: make the lower module define what it needs, or move \
             the shared type down\n  {}",
            steps.join("\n  ")
        );
    }
}

/// A cycle of `graph` as its nodes, the first repeated at the end; `None` without one.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|seen| seen == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flat_map(BTreeMap::keys) {
            if let Some(cycle) = visit(next, graph, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The top-level module a file of `src/` belongs to: `backend` for `backend/redis/mod.rs`.
fn module_of(relative: &Path) -> String {
    let first = relative.components().next().expect("a path");
    let first = first.as_os_str().to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

/// A file's name as its siblings name it: `response` for `response.rs`, `redis` for
/// `redis/mod.rs`.
fn node_name(file: &Path) -> String {
    let stem = file.file_stem().expect("a name").to_string_lossy();
    stem.into_owned()
}

/// The modules beside `mod.rs` in `directory`: its `.rs` files and its subdirectories.
fn siblings(directory: &Path) -> BTreeSet<String> {
    (std::fs::read_dir(directory).expect("a readable directory"))
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.is_dir() || path.extension().is_some_and(|ext| ext == "rs"))
        .filter(|path| path.file_name().is_some_and(|name| name != "mod.rs"))
        .map(|path| node_name(&path))
        .collect()
}

/// Every `crate::a` / `super::a` path of `file` outside its unit tests, with its line.
fn paths(file: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(file).expect("a readable file");
    // A file's unit tests close it: everything from `#[cfg(test)]` on `mod tests` is left
    // out.
    let end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    paths_in(&text[..end])
}

/// The `crate::a` and `super::a` paths of `text` (each as far as its first segment, groups
/// `{a, b::c}` opened into one path each), with their lines; comments are skipped.
fn paths_in(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let code: String = (text.lines())
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    for root in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(root) {
            let start = from + at;
            from = start + root.len();
            // `floodgate::crate::` never occurs; a root must start a path.
            let before = code[..start].chars().last().unwrap_or(' ');
            if before.is_alphanumeric() || before == '_' {
                continue;
            }
            let line = code[..start].matches('\n').count() + 1;
            let rest = &code[from..];
            if let Some(group) = rest.strip_prefix('{') {
                let close = group.find('}').unwrap_or(group.len());
                for item in group[..close].split(',') {
                    let name = first_segment(item.trim());
                    if !name.is_empty() {
                        found.push((line, format!("{root}{name}")));
                    }
                }
            } else {
                let name = first_segment(rest);
                if !name.is_empty() {
                    found.push((line, format!("{root}{name}")));
                }
            }
        }
    }
    found.sort();
    found
}

fn first_segment(path: &str) -> &str {
    let end = path
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(path.len());
    &path[..end]
}
