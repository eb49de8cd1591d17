//! Code quoted in the documentation stays the code: a fenced block right after a line
//! `<!-- excerpt: PATH -->` in README.md or a Markdown file under docs/ must appear, line for line, in the file
//! PATH (relative to the repository root), so that a change to the template or an example fails this test until
//! the guide quotes it again.
//!
//! `cargo xtask test` runs this with the rest of `cargo test --workspace`; `cargo test -p xtask --test
//! doc_excerpts` runs it alone.

use std::fs;
use std::path::{Path, PathBuf};

/// The workspace root (this crate is `xtask/` in it).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask has a parent folder").to_path_buf()
}

/// An excerpt marker and the fenced block after it: the marker's 1-based line, the quoted path, the block's
/// lines.
#[derive(Debug, PartialEq, Eq)]
struct Excerpt {
    line: usize,
    path: String,
    code: Vec<String>,
}

/// The excerpts of one Markdown text. A marker not followed (on its next line) by a fenced block is an error.
fn excerpts(md: &str) -> Result<Vec<Excerpt>, String> {
    let lines: Vec<&str> = md.lines().collect();
    let mut found = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(rest) = l.trim().strip_prefix("<!-- excerpt:") else { continue };
        let path = rest.strip_suffix("-->").ok_or(format!("line {}: marker not closed with -->", i + 1))?.trim();
        let fence = lines.get(i + 1).filter(|f| f.starts_with("```"));
        let fence = fence.ok_or(format!("line {}: no fenced block right after the excerpt marker", i + 1))?;
        let close = &fence[..fence.len() - fence.trim_start_matches('`').len()];
        let body: Vec<String> =
            lines[i + 2..].iter().take_while(|b| b.trim_end() != close).map(|b| b.to_string()).collect();
        if i + 2 + body.len() >= lines.len() {
            return Err(format!("line {}: the excerpt's block is not closed", i + 1));
        }
        found.push(Excerpt { line: i + 1, path: path.to_string(), code: body });
    }
    Ok(found)
}

/// Whether `code` appears as consecutive whole lines of `source`.
fn quotes(source: &str, code: &[String]) -> bool {
    let src: Vec<&str> = source.lines().collect();
    !code.is_empty() && src.windows(code.len()).any(|w| w.iter().zip(code).all(|(a, b)| a == b))
}

/// README.md and every `.md` file under `docs/`.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a readable folder entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "md") {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn every_excerpt_is_the_code_it_quotes() {
    let root = workspace_root();
    let mut bad = Vec::new();
    let mut checked = 0;
    for md in markdown_files(&root) {
        let text = fs::read_to_string(&md).unwrap_or_else(|e| panic!("{}: {e}", md.display()));
        let shown = md.strip_prefix(&root).unwrap_or(&md).display().to_string();
        match excerpts(&text) {
            Err(e) => bad.push(format!("{shown}: {e}")),
            Ok(list) => {
                for x in list {
                    match fs::read_to_string(root.join(&x.path)) {
                        Err(e) => bad.push(format!("{shown}:{}: {}: {e}", x.line, x.path)),
                        Ok(src) if !quotes(&src, &x.code) => {
                            bad.push(format!("{shown}:{}: the block is no longer in {}", x.line, x.path))
                        }
                        Ok(_) => checked += 1,
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "stale excerpts:\n{}", bad.join("\n"));
    // The guide's "Your first kernel" quotes the template four times; fewer means the markers were lost.
    assert!(checked >= 4, "only {checked} excerpts found");
}

#[test]
fn a_changed_line_is_caught() {
    let md = "text\n<!-- excerpt: a.rs -->\n```rust\nfn a() {}\nfn b() {}\n```\n";
    let x = excerpts(md).expect("parses");
    assert_eq!(x, vec![Excerpt { line: 2, path: "a.rs".into(), code: vec!["fn a() {}".into(), "fn b() {}".into()] }]);
    assert!(quotes("// head\nfn a() {}\nfn b() {}\n", &x[0].code));
    assert!(!quotes("fn a() {}\nfn c() {}\nfn b() {}\n", &x[0].code));
    assert!(!quotes("fn a() {}\n", &x[0].code));
    assert!(excerpts("<!-- excerpt: a.rs -->\ntext\n").is_err());
    assert!(excerpts("<!-- excerpt: a.rs -->\n```\nunclosed\n").is_err());
}
