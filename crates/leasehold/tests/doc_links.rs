//! The READMEs and `docs.md` files that become crate documentation (`include_str!` in a crate
//! root or a `docs` module) link only to what resolves in the rendered docs: absolute URLs,
//! rustdoc paths and anchors. A relative file link (`docs/cli.md`, `../../docs/x.md`) works on
//! the repository's web page and is dead on docs.rs.

use std::path::{Path, PathBuf};

/// Every markdown file of its own package that a `src/lib.rs` of the workspace `include_str!`s
/// (the facade's doctest-only include of the repository's README is not rendered).
fn included_docs(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let crates = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path());
    for dir in crates.chain([root.join("conformance-tests")]) {
        let Ok(lib) = std::fs::read_to_string(dir.join("src/lib.rs")) else {
            continue;
        };
        for part in lib.split("include_str!(\"").skip(1) {
            let relative = part.split('"').next().unwrap();
            if relative.ends_with(".md") && !relative.starts_with("../../") {
                files.push(dir.join("src").join(relative));
            }
        }
    }
    files
}

/// The targets of `[text](target)` and `[label]: target` links in `text`.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        for part in line.split("](").skip(1) {
            targets.push(part.split(')').next().unwrap().to_string());
        }
        if let Some(rest) = line.strip_prefix('[')
            && let Some((_, target)) = rest.split_once("]: ")
        {
            targets.push(target.trim().to_string());
        }
    }
    targets
}

fn dead_in_rendered_docs(target: &str) -> bool {
    let file = target.split('#').next().unwrap();
    !file.contains("://")
        && (file.starts_with("./") || file.starts_with("../") || file.starts_with("docs/") || file.ends_with(".md"))
}

#[test]
fn crate_docs_have_no_relative_file_links() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let files = included_docs(&root);
    assert!(files.len() >= 10, "found only {files:?}");
    let mut dead = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for target in link_targets(&text) {
            if dead_in_rendered_docs(&target) {
                dead.push(format!("{}: {target}", file.display()));
            }
        }
    }
    assert!(dead.is_empty(), "links that are dead on docs.rs: {dead:#?}");
    assert!(dead_in_rendered_docs("docs/cli.md") && dead_in_rendered_docs("../../docs/x.md#y"));
    assert!(!dead_in_rendered_docs("https://docs.rs/x") && !dead_in_rendered_docs("#errors"));
    assert!(!dead_in_rendered_docs("leasehold_core::LeaseStore"));
}
