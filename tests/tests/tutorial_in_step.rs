//! docs/tutorial.md and the example it builds, kept in step: every ```rust block of the page is
//! an excerpt of a file of `examples/tutorial/`, found there verbatim (each line's trailing
//! whitespace aside). The example is built and tested with the workspace, so every line of
//! Rust the page shows is compiled.

use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

/// `text` with each line's trailing whitespace removed.
fn trimmed(text: &str) -> String {
    text.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A ```rust block of the page: the line of the page it starts on, and its text.
struct Block {
    line: usize,
    text: String,
}

fn rust_blocks(page: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (index, line) in page.lines().enumerate() {
        let fence = line.trim_start();
        match &mut open {
            None if fence.starts_with("```rust") => {
                open = Some(Block {
                    line: index + 1,
                    text: String::new(),
                });
            }
            Some(_) if fence.starts_with("```") => blocks.extend(open.take()),
            Some(block) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            None => {}
        }
    }
    assert!(
        open.is_none(),
        "docs/tutorial.md ends inside a ```rust block"
    );
    blocks
}

#[test]
fn every_rust_block_of_the_tutorial_is_an_excerpt_of_the_example() {
    let root = root();
    let page = std::fs::read_to_string(root.join("docs/tutorial.md")).expect("docs/tutorial.md");
    let folder = root.join("examples/tutorial");
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(&folder).expect("examples/tutorial") {
        let path = entry.expect("a folder entry").path();
        if path.extension().is_some_and(|ext| ext == "rs") {
            let text = std::fs::read_to_string(&path).expect("a readable source file");
            sources.push(trimmed(&text));
        }
    }
    assert!(!sources.is_empty(), "no .rs file in {}", folder.display());

    let blocks = rust_blocks(&page);
    assert!(
        blocks.len() >= 8,
        "docs/tutorial.md shows {} ```rust blocks; it shows the whole example step by step",
        blocks.len()
    );
    let stale: Vec<String> = blocks
        .iter()
        .filter(|block| {
            let excerpt = trimmed(&block.text);
            excerpt.trim().is_empty() || !sources.iter().any(|source| source.contains(&excerpt))
        })
        .map(|block| {
            let first = block.text.lines().find(|line| !line.trim().is_empty());
            format!(
                "the block at docs/tutorial.md:{} ({:?})",
                block.line,
                first.unwrap_or("").trim()
            )
        })
        .collect();
    assert!(
        stale.is_empty(),
        "these ```rust blocks of docs/tutorial.md are not found verbatim in examples/tutorial/ \
         (copy them from the source again, or change the source):\n  {}",
        stale.join("\n  ")
    );
}
