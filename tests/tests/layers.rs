//! The layers of `hexeract/src`, held: every module belongs to one layer of the table in
//! `docs/architecture.md` ("Layers"), and a module imports only from its own layer and those
//! below it. The imports that still run up are listed there too ("Imports that still run up"),
//! each with what removes it; this test fails on an upward import that is not listed (naming
//! the file and the line) and on a listed one that is gone (so the list only shrinks).
//!
//! What counts as an import: every `crate::…` path outside comments and outside a file's
//! `#[cfg(test)] mod tests`, in `use` declarations and in code, grouped ones (`crate::{a, b}`)
//! included; a root re-export (`crate::Error`) counts as an import of the module that defines
//! it (read from `lib.rs`), and a module loaded with `#[path]` is known by its declared name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

/// A table of `docs/architecture.md`: the rows of the first table after the heading `heading`,
/// as their cells (header and separator rows left out).
fn table(markdown: &str, heading: &str) -> Vec<Vec<String>> {
    let start = markdown
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("docs/architecture.md has no heading {heading:?}"));
    markdown[start + heading.len() + 2..]
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| {
            line.trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The module paths written in backticks in `cell`.
fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Module path → (layer's rank, layer's name), from the "Layers" table.
struct Layers(BTreeMap<String, (usize, String)>);

impl Layers {
    fn read(markdown: &str) -> Layers {
        let mut modules = BTreeMap::new();
        for (rank, row) in table(markdown, "## Layers").iter().enumerate() {
            let name = row[0].trim_matches('*').to_owned();
            for module in backticked(&row[1]) {
                let previous = modules.insert(module.clone(), (rank, name.clone()));
                assert!(previous.is_none(), "{module} is in two layers");
            }
        }
        assert!(
            modules.len() > 10,
            "the Layers table was not read: {modules:?}"
        );
        Layers(modules)
    }

    /// The table's entry that `module` falls under (the longest listed prefix), with its layer.
    fn of(&self, module: &str) -> Option<(&str, usize, &str)> {
        let segments: Vec<&str> = module.split("::").collect();
        (1..=segments.len()).rev().find_map(|n| {
            let prefix = segments[..n].join("::");
            self.0
                .get_key_value(&prefix)
                .map(|(entry, (rank, name))| (entry.as_str(), *rank, name.as_str()))
        })
    }
}

/// One `crate::` path in a file: the line, and the module path it names.
struct Reference {
    line: usize,
    module: String,
}

/// Every `crate::` path of `source` (comments and unit tests left out), resolved to a module
/// path with `reexports` (a root name → the module defining it).
fn references(source: &str, reexports: &BTreeMap<String, String>) -> Vec<Reference> {
    let source = match source.find("#[cfg(test)]\nmod tests") {
        Some(tests) => &source[..tests],
        None => source,
    };
    let code: String = source
        .lines()
        .map(|line| match line.trim_start().starts_with("//") {
            true => "",
            false => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = code[at..].find("crate::") {
        let start = at + offset;
        at = start + "crate::".len();
        let before = code[..start].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let line = code[..start].matches('\n').count() + 1;
        for path in paths_at(&code[at..]) {
            if let Some(module) = resolve(&path, reexports) {
                found.push(Reference { line, module });
            }
        }
    }
    found
}

/// The paths that start at `rest` (just after `crate::`): one, or each item of a `{…}` group.
/// A path that ends in `::` names a module (what follows is a group).
fn paths_at(rest: &str) -> Vec<String> {
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 1;
        let end = group
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map_or(group.len(), |(index, _)| index);
        let mut items = Vec::new();
        let mut depth = 0;
        let mut item = String::new();
        for c in group[..end].chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(std::mem::take(&mut item));
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        items.push(item);
        return items
            .iter()
            .flat_map(|item| paths_at(item.trim()))
            .collect();
    }
    let length = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(rest.len());
    vec![rest[..length].to_owned()]
}

/// The module path `path` (after `crate::`) names: its leading lower-case segments, or for a
/// root re-export the module that defines it. `None` for `self` and the like.
fn resolve(path: &str, reexports: &BTreeMap<String, String>) -> Option<String> {
    let names_a_module = path.ends_with("::");
    let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let first = *segments.first()?;
    if first == "self" || first == "super" {
        return None;
    }
    let reexported = first.starts_with(char::is_uppercase)
        || (segments.len() == 1 && !names_a_module && reexports.contains_key(first));
    if reexported {
        return reexports.get(first).cloned();
    }
    let modules: Vec<&str> = segments
        .iter()
        .take_while(|segment| segment.starts_with(|c: char| c.is_lowercase() || c == '_'))
        .copied()
        .collect();
    Some(modules.join("::"))
}

/// The names `lib.rs` re-exports at the root (`pub use module::{A, B}`), each with its module.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let flat = lib.replace('\n', " ");
    for statement in flat.split(';') {
        let Some(at) = statement.find("pub use ") else {
            continue;
        };
        let path = statement[at + "pub use ".len()..].trim();
        let (module, items) = match path.find("::{") {
            Some(brace) => (&path[..brace], path[brace + 3..].trim_end_matches('}')),
            None => match path.rfind("::") {
                Some(last) => (&path[..last], &path[last + 2..]),
                None => continue,
            },
        };
        // Modules re-exported from their layer's folder keep their names: not items.
        let folder = ["base", "core_layer", "engine", "worlds", "process"].contains(&module);
        if folder || module.starts_with("hexeract_macros") || module.starts_with("tokio_util") {
            continue;
        }
        for item in items.split(',') {
            let name = item.split(" as ").last().unwrap_or("").trim();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.to_owned());
            }
        }
    }
    names
}

/// The folders of `hexeract/src` that stand for a layer and not a module: `worlds/outbox.rs`
/// is the module `outbox`. (The store layer's folder is the `store` module's own.)
const LAYER_FOLDERS: [&str; 5] = ["base", "core", "engine", "worlds", "process"];

/// The modules declared with `#[path = "…"]` in `source` (the file `file`, of module
/// `module`): each target file with its module path. Attributes on inline folder modules
/// (`#[path = "core"] mod core_layer {`) name folders, not files, and are left out.
fn path_modules(file: &Path, module: &str, source: &str) -> Vec<(PathBuf, String)> {
    let lines: Vec<&str> = source.lines().collect();
    let mut found = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let Some(target) = line
            .trim()
            .strip_prefix("#[path = \"")
            .and_then(|rest| rest.strip_suffix("\"]"))
        else {
            continue;
        };
        let declaration = lines[index + 1..]
            .iter()
            .map(|next| next.trim())
            .find(|next| !next.starts_with("#["))
            .expect("a module after a #[path] attribute");
        let Some(name) = declaration
            .split_whitespace()
            .skip_while(|word| *word != "mod")
            .nth(1)
            .and_then(|name| name.strip_suffix(';'))
        else {
            continue;
        };
        // Relative to the folder of the declaring file (`lib.rs`, `store.rs`, `engine/health.rs`).
        let folder = file.parent().expect("a file in a folder");
        let mut target_file = folder.to_path_buf();
        for part in target.split('/') {
            match part {
                ".." => {
                    target_file.pop();
                }
                part => target_file.push(part),
            }
        }
        let declared = match module {
            "crate" => name.to_owned(),
            parent => format!("{parent}::{name}"),
        };
        found.push((target_file, declared));
    }
    found
}

/// Every `.rs` file under `dir` with its module path (`store::postgres`; `crate` for
/// `lib.rs`): the layer folder left out of the path, `#[path]` modules by their declared names.
fn modules(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut found: Vec<(PathBuf, String)> = files
        .iter()
        .map(|path| {
            let relative = path.strip_prefix(dir).unwrap().with_extension("");
            let mut parts: Vec<String> = relative
                .components()
                .map(|part| part.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.len() > 1 && LAYER_FOLDERS.contains(&parts[0].as_str()) {
                parts.remove(0);
            }
            let module = match parts.join("::").as_str() {
                "lib" => "crate".to_owned(),
                other => other.to_owned(),
            };
            (path.clone(), module)
        })
        .collect();
    // Files loaded by `#[path]` are known by their declared names (repeated: a `#[path]`
    // module may declare another).
    for _ in 0..3 {
        let declared: Vec<(PathBuf, String)> = found
            .iter()
            .flat_map(|(file, module)| {
                path_modules(file, module, &std::fs::read_to_string(file).unwrap())
            })
            .collect();
        for (target, module) in declared {
            if let Some(entry) = found.iter_mut().find(|(file, _)| *file == target) {
                entry.1 = module;
            }
        }
    }
    found.sort();
    found
}

/// The layer whose folder holds `file` (under `dir`): the first folder of its path, or the
/// store's for `store.rs`; `None` for `lib.rs`.
fn folder_layer(dir: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(dir).unwrap();
    let first = relative.components().next()?.as_os_str().to_string_lossy();
    match first.as_ref() {
        "lib.rs" => None,
        "store.rs" => Some("store".to_owned()),
        folder => Some(folder.trim_end_matches(".rs").to_owned()),
    }
}

#[test]
fn no_module_imports_from_a_layer_above_its_own_unless_listed() {
    let root = root();
    let architecture = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let layers = Layers::read(&architecture);
    let listed: BTreeSet<(String, String)> = table(&architecture, "## Imports that still run up")
        .iter()
        .map(|row| {
            let from = backticked(&row[0]);
            let to = backticked(&row[1]);
            (from[0].clone(), to[0].clone())
        })
        .collect();
    let src = root.join("hexeract/src");
    let reexports = root_reexports(&std::fs::read_to_string(src.join("lib.rs")).unwrap());

    let mut unlisted = Vec::new();
    let mut unclassified = Vec::new();
    let mut misplaced = Vec::new();
    let mut seen = BTreeSet::new();
    for (file, module) in modules(&src) {
        let Some((_, rank, layer)) = layers.of(&module) else {
            unclassified.push(module);
            continue;
        };
        if let Some(folder) = folder_layer(&src, &file) {
            if folder != layer {
                misplaced.push(format!(
                    "{}: `{module}` is in the {layer} layer, its file in the {folder} folder",
                    file.strip_prefix(&root).unwrap().display()
                ));
            }
        }
        let source = std::fs::read_to_string(&file).unwrap();
        for reference in references(&source, &reexports) {
            let Some((entry, their_rank, their_layer)) = layers.of(&reference.module) else {
                if !reference.module.is_empty() {
                    unclassified.push(reference.module);
                }
                continue;
            };
            if their_rank <= rank {
                continue;
            }
            let key = (module.clone(), entry.to_owned());
            if !listed.contains(&key) {
                unlisted.push(format!(
                    "{}:{}: `{module}` ({layer}) imports `{}` ({their_layer})",
                    file.strip_prefix(&root).unwrap().display(),
                    reference.line,
                    reference.module
                ));
            }
            seen.insert(key);
        }
    }
    unclassified.sort();
    unclassified.dedup();
    assert!(
        unclassified.is_empty(),
        "modules in no layer of docs/architecture.md (add each to the Layers table): {unclassified:?}"
    );
    assert!(
        misplaced.is_empty(),
        "files outside their layer's folder (hexeract/src/<layer>/; store.rs and store/ for the \
         store layer):\n{}",
        misplaced.join("\n")
    );
    assert!(
        unlisted.is_empty(),
        "imports from a lower layer to a higher one (move the code to the layer it belongs to; \
         docs/architecture.md says which holds what):\n{}",
        unlisted.join("\n")
    );
    let gone: Vec<_> = listed.difference(&seen).collect();
    assert!(
        gone.is_empty(),
        "listed in docs/architecture.md as running up, but no longer there (remove the rows): {gone:?}"
    );
    println!(
        "layers: {} modules, {} imports still running up (listed)",
        modules(&src).len(),
        seen.len()
    );
}

#[test]
fn the_reader_finds_grouped_renamed_and_reexported_paths() {
    let reexports = root_reexports(
        "pub use error::{ConfigError, Error};\npub use store::process::publish;\npub use app::run;",
    );
    assert_eq!(reexports["Error"], "error");
    assert_eq!(reexports["publish"], "store::process");
    let source = "use crate::{envelope::Envelope, store::{self, DeliveryStore}};\n\
                  // use crate::config::AppConfig;\n\
                  fn f() -> Result<(), crate::Error> { crate::publish::Publish; crate::publish(); }\n\
                  #[cfg(test)]\nmod tests { use crate::cli; }";
    let found: Vec<(usize, String)> = references(source, &reexports)
        .into_iter()
        .map(|reference| (reference.line, reference.module))
        .collect();
    assert_eq!(
        found,
        [
            (1, "envelope".to_owned()),
            (1, "store".to_owned()),
            (3, "error".to_owned()),
            (3, "publish".to_owned()),
            (3, "store::process".to_owned()),
        ]
    );
}

/// The entries of the Layers table that each entry imports (itself left out), over every file
/// of `hexeract/src`.
fn entry_graph(root: &Path, layers: &Layers) -> BTreeMap<String, BTreeSet<String>> {
    let src = root.join("hexeract/src");
    let reexports = root_reexports(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, module) in modules(&src) {
        let Some((from, _, _)) = layers.of(&module) else {
            continue;
        };
        let from = from.to_owned();
        let source = std::fs::read_to_string(&file).unwrap();
        for reference in references(&source, &reexports) {
            if let Some((to, _, _)) = layers.of(&reference.module) {
                if to != from {
                    graph.entry(from.clone()).or_default().insert(to.to_owned());
                }
            }
        }
    }
    graph
}

/// The circles of `graph`: each group of two or more entries that reach one another (Tarjan's
/// strongly connected components), sorted.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a str) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.graph.get(node).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut group = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    group.push(member.to_owned());
                    if member == node {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            walk.visit(node);
        }
    }
    walk.found.sort();
    walk.found
}

#[test]
fn the_circle_finder_finds_a_circle_and_only_circles() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a", "d"]),
        ("d", vec![]),
        ("e", vec!["d"]),
    ]
    .into_iter()
    .map(|(from, to)| (from.to_owned(), to.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
}

/// No two modules (entries of the Layers table) reach each other through their imports, in any
/// layer: a circle across layers would run up somewhere, and one inside a layer means two
/// modules that are one concern or share a third.
#[test]
fn no_modules_import_each_other_in_a_circle() {
    let root = root();
    let architecture = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let layers = Layers::read(&architecture);
    let graph = entry_graph(&root, &layers);
    assert!(graph.len() > 10, "the imports were not read: {graph:?}");
    let found = circles(&graph);
    let shown: Vec<String> = found
        .iter()
        .map(|group| {
            group
                .iter()
                .map(|member| {
                    let reaches: Vec<&String> = graph[member]
                        .iter()
                        .filter(|to| group.contains(to))
                        .collect();
                    format!("`{member}` imports {reaches:?}")
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .collect();
    assert!(
        found.is_empty(),
        "modules that import each other in a circle:\n{}",
        shown.join("\n")
    );
}
