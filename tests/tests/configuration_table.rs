//! The table "Every variable" of `docs/configuration.md` and the variables the crate reads, kept
//! in step: every variable the code reads has its row, and every variable a row names is read.
//!
//! What counts as read: a string literal in `SCREAMING_SNAKE_CASE` in `hexeract/src`, outside a
//! file's `#[cfg(test)] mod tests` and outside comments (every such literal there is a variable
//! name handed to the environment's lookup). What counts as documented: each name in backticks
//! in the first cell of a row of the first table under the heading `## Every variable`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

/// `SCREAMING_SNAKE_CASE` with at least one underscore: `MAX_DELIVERIES`, not `SQL` or `A`.
fn is_variable_name(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|first| first.is_ascii_uppercase())
        && text.contains('_')
        && !text.ends_with('_')
        && !text.contains("__")
        && text
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// The part of a source file the crate is built from: the file up to its test module, with the
/// comments left out.
fn code_of(source: &str) -> String {
    let end = source
        .find("\n#[cfg(test)]\nmod tests")
        .unwrap_or(source.len());
    source[..end]
        .lines()
        .map(|line| match line.trim_start().starts_with("//") {
            true => "",
            false => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The contents of every string literal of `code` (escapes not undone: the names have none).
fn string_literals(code: &str) -> Vec<&str> {
    let mut literals = Vec::new();
    let mut rest = code;
    while let Some(start) = rest.find('"') {
        // A character literal '"' is not the start of a string.
        if rest[..start].ends_with('\'') {
            rest = &rest[start + 1..];
            continue;
        }
        let after = &rest[start + 1..];
        let mut end = None;
        let mut escaped = false;
        for (at, c) in after.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(at);
                    break;
                }
                _ => escaped = false,
            }
        }
        let Some(end) = end else { break };
        literals.push(&after[..end]);
        rest = &after[end + 1..];
    }
    literals
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable source folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// Every variable the crate reads, with the first file that names it.
fn read_by_the_code() -> BTreeSet<(String, String)> {
    let src = root().join("hexeract/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut read = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for file in files {
        let source = std::fs::read_to_string(&file).expect("a readable source file");
        let code = code_of(&source);
        for literal in string_literals(&code) {
            if is_variable_name(literal) && seen.insert(literal.to_owned()) {
                let relative = file.strip_prefix(root()).unwrap_or(&file);
                read.insert((literal.to_owned(), relative.display().to_string()));
            }
        }
    }
    read
}

/// Every variable the table "Every variable" has a row for.
fn documented() -> BTreeSet<String> {
    let page = std::fs::read_to_string(root().join("docs/configuration.md"))
        .expect("docs/configuration.md is readable");
    let heading = "\n## Every variable\n";
    let start = page
        .find(heading)
        .expect("docs/configuration.md has the heading \"## Every variable\"");
    let section = &page[start + heading.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let rows: Vec<&str> = section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        // The header and the separator.
        .skip(2)
        .collect();
    assert!(
        rows.len() > 20,
        "the table under \"## Every variable\" has {} rows: was it moved or split?",
        rows.len()
    );
    let mut names = BTreeSet::new();
    for row in rows {
        let first_cell = row.trim_start_matches('|').split('|').next().unwrap_or("");
        for (at, part) in first_cell.split('`').enumerate() {
            // The odd parts are inside backticks.
            if at % 2 == 1 && is_variable_name(part) {
                names.insert(part.to_owned());
            }
        }
    }
    names
}

#[test]
fn every_variable_the_code_reads_has_its_row_and_every_row_is_read() {
    let read = read_by_the_code();
    let documented = documented();
    assert!(
        read.iter().any(|(name, _)| name == "MAX_DELIVERIES")
            && documented.contains("MAX_DELIVERIES"),
        "the scan finds nothing: read {read:?}, documented {documented:?}"
    );
    let undocumented: Vec<String> = read
        .iter()
        .filter(|(name, _)| !documented.contains(name))
        .map(|(name, file)| format!("{name} (read in {file})"))
        .collect();
    let unread: Vec<&String> = documented
        .iter()
        .filter(|name| !read.iter().any(|(read, _)| read == *name))
        .collect();
    assert!(
        undocumented.is_empty() && unread.is_empty(),
        "docs/configuration.md's table \"Every variable\" and the code disagree.\n\
         Read by the code, with no row (add one): {undocumented:?}\n\
         In the table, read by nothing (remove the row, or read it): {unread:?}"
    );
}

#[test]
fn the_scan_reads_names_in_code_and_leaves_comments_and_tests_out() {
    let source = "fn f() { lookup(\"DATABASE_URL\"); let c = '\"'; name(\"lower_case\"); }\n\
                  // lookup(\"IN_A_COMMENT\")\n\
                  #[cfg(test)]\nmod tests { fn g() { lookup(\"IN_A_TEST\"); } }\n";
    let code = code_of(source);
    let names: Vec<&str> = string_literals(&code)
        .into_iter()
        .filter(|literal| is_variable_name(literal))
        .collect();
    assert_eq!(names, ["DATABASE_URL"]);
    assert!(is_variable_name("KAFKA_SASL_USERNAME"));
    assert!(!is_variable_name("SQL") && !is_variable_name("_X") && !is_variable_name("A__B"));
}
