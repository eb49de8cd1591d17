//! The Markdown documentation's links: every relative link in README.md and in the Markdown files under docs/
//! (`[text](path)`, `[text](path#anchor)`, `[text](#anchor)`, and `[label]: path` definitions) must name a
//! file or folder that exists, and an anchor must be the GitHub slug of a heading in the file it points into.
//! Links in fenced code blocks and inline code are not links; `http(s)://` and `mailto:` targets are not
//! checked (no network in the tests).
//!
//! `cargo xtask test` runs this with the rest of `cargo test --workspace`; `cargo test -p xtask --test
//! doc_links` runs it alone.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The workspace root (this crate is `xtask/` in it).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask has a parent folder").to_path_buf()
}

/// README.md and every `.md` file under `docs/`, sorted.
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
    files.sort();
    files
}

/// A link found in a Markdown file: its 1-based line and its target as written.
#[derive(Debug, PartialEq, Eq)]
struct Link {
    line: usize,
    target: String,
}

/// Whether `line` opens or closes a fenced code block (three or more backticks or tildes, indented by at most
/// three spaces).
fn is_fence(line: &str) -> bool {
    let t = line.trim_start_matches(' ');
    line.len() - t.len() <= 3 && (t.starts_with("```") || t.starts_with("~~~"))
}

/// `line` with every inline code span replaced by `x`, so that brackets and parentheses in code are not read
/// as links (the text of a link may still be code: `` [`f`](a.md) `` becomes `[x](a.md)`).
fn strip_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        let closing = "`".repeat(ticks);
        match after.find(&closing) {
            Some(end) => {
                out.push('x');
                rest = &after[end + ticks..];
            }
            None => {
                // An unmatched run of backticks is literal text.
                out.push_str(&rest[start..start + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers and code spans stripped.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if is_fence(line) {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            out.push((i + 1, strip_code_spans(line)));
        }
    }
    out
}

/// Every link of `text`: inline links and images (`](target)`, target up to the first space or the closing
/// parenthesis, `<...>` unwrapped) and reference definitions (`[label]: target`).
fn links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (line, s) in prose_lines(text) {
        let trimmed = s.trim_start();
        if let Some(rest) = trimmed.strip_prefix('[') {
            if let Some(close) = rest.find("]:") {
                let target = rest[close + 2..].split_whitespace().next().unwrap_or("");
                if !target.is_empty() && !rest[..close].contains(']') {
                    out.push(Link { line, target: target.trim_matches(['<', '>']).to_string() });
                    continue;
                }
            }
        }
        let mut rest = s.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let inside = after[..end].trim();
            let target = if let Some(bracketed) = inside.strip_prefix('<') {
                bracketed.split('>').next().unwrap_or("")
            } else {
                inside.split_whitespace().next().unwrap_or("")
            };
            out.push(Link { line, target: target.to_string() });
            rest = &after[end.min(after.len())..];
        }
    }
    out
}

/// The anchor GitHub gives a heading: its text with links reduced to their text, lower-cased, with every
/// character that is not alphanumeric, `-`, `_` or a space dropped, and spaces turned into `-`.
fn slug(heading: &str) -> String {
    // `[text](target)` in a heading: only the text counts.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(at) = rest.find("](") {
        text.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        rest = after.find(')').map_or("", |end| &after[end + 1..]);
    }
    text.push_str(rest);
    text.chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file: one per ATX heading (`#` to `######`), repeated slugs numbered `-1`, `-2`,
/// ... as GitHub numbers them, plus explicit `id="..."` / `name="..."` attributes of HTML tags.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = HashSet::new();
    let mut in_fence = false;
    for line in text.lines() {
        if is_fence(line) {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                let after = &rest[at + attr.len()..];
                let end = after.find('"').unwrap_or(after.len());
                out.insert(after[..end].to_string());
                rest = &after[end..];
            }
        }
        let t = line.trim_start_matches(' ');
        let hashes = t.chars().take_while(|&c| c == '#').count();
        if line.len() - t.len() > 3 || !(1..=6).contains(&hashes) {
            continue;
        }
        let title = &t[hashes..];
        if !(title.is_empty() || title.starts_with(' ') || title.starts_with('\t')) {
            continue;
        }
        // A closing run of `#`s is not part of the heading.
        let title = title.trim().trim_end_matches('#').trim_end();
        let base = slug(title.replace('`', "").as_str());
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// `path` with `.` and `..` components resolved without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// `%20` and the like in a link target, decoded (only what Markdown file names here could need).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Some(b) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The broken links of the Markdown file `file` (whose text is `text`) in the tree at `root`, one message
/// each: `file:line: target: why`.
fn broken_links(root: &Path, file: &Path, text: &str) -> Vec<String> {
    let shown = file.strip_prefix(root).unwrap_or(file).display().to_string();
    let mut out = Vec::new();
    for Link { line, target } in links(text) {
        let why = |why: &str| format!("{shown}:{line}: ({target}): {why}");
        if target.is_empty() {
            out.push(why("empty link target"));
            continue;
        }
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            file.to_path_buf()
        } else if let Some(from_root) = path.strip_prefix('/') {
            normalize(&root.join(percent_decode(from_root)))
        } else {
            normalize(&file.parent().expect("a file has a folder").join(percent_decode(path)))
        };
        if !resolved.starts_with(root) {
            out.push(why("points outside the repository"));
            continue;
        }
        if !resolved.exists() {
            out.push(why("no such file or folder"));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if resolved.extension().is_none_or(|x| x != "md") {
            out.push(why("an anchor into a file that is not Markdown"));
            continue;
        }
        let target_text = if resolved == file {
            text.to_string()
        } else {
            fs::read_to_string(&resolved).unwrap_or_else(|e| panic!("{}: {e}", resolved.display()))
        };
        if !anchors(&target_text).contains(anchor) {
            out.push(why("no heading has this anchor"));
        }
    }
    out
}

#[test]
fn readme_and_docs_links_resolve() {
    let root = workspace_root();
    let files = markdown_files(&root);
    assert!(files.len() >= 4, "README.md and docs/*.md: found only {files:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        checked += links(&text).len();
        broken.extend(broken_links(&root, file, &text));
    }
    assert!(checked > 10, "only {checked} links found: is the link parser broken?");
    assert!(broken.is_empty(), "{} broken link(s):\n{}", broken.len(), broken.join("\n"));
}

#[test]
fn github_heading_slugs() {
    assert_eq!(slug("Port channels: host side"), "port-channels-host-side");
    assert_eq!(slug("3. Run the hardware suite (one command)"), "3-run-the-hardware-suite-one-command");
    assert_eq!(slug("Host modes: the CPU proxy"), "host-modes-the-cpu-proxy");
    assert_eq!(slug("Two GPUs — one process each"), "two-gpus--one-process-each");
    assert_eq!(slug("LL packets"), "ll-packets");
    assert_eq!(slug("See [the guide](guide.md) first"), "see-the-guide-first");
    let a = anchors("# Top\n## `put` and more\n## Notes\n```\n# not a heading\n```\n## Notes\n#hashtag\n");
    let want: HashSet<String> = ["top", "put-and-more", "notes", "notes-1"].into_iter().map(String::from).collect();
    assert_eq!(a, want);
}

#[test]
fn links_skip_code_and_read_every_form() {
    let text = "See [a](a.md) and ![img](pics/x.png \"title\") and [`code`](<b c.md#sec>).\n\
                `[not](a link)` here\n\
                ```\n[not](either.md)\n```\n\
                [label]: ref.md#part\n";
    let got = links(text);
    let got: Vec<(usize, &str)> = got.iter().map(|l| (l.line, l.target.as_str())).collect();
    assert_eq!(got, [(1, "a.md"), (1, "pics/x.png"), (1, "b c.md#sec"), (6, "ref.md#part")]);
}

/// The checker itself fails on what it is for: a missing file, a missing anchor (in another file and in the
/// same one), a path out of the repository; and accepts good links, folders, and links in code.
#[test]
fn broken_links_are_reported() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("doc_links-{}", std::process::id()));
    let docs = root.join("docs");
    fs::create_dir_all(docs.join("results")).unwrap();
    fs::write(docs.join("other.md"), "# Other\n## Known part\n").unwrap();
    let text = "# Here\n\
                [ok](other.md) [ok](other.md#known-part) [ok](#here) [ok](results/) [ok](../docs/other.md)\n\
                [web](https://example.com/x#y) `[code](gone.md)`\n\
                [gone](gone.md)\n\
                [bad anchor](other.md#unknown-part)\n\
                [bad local anchor](#there)\n\
                [outside](../../elsewhere.md)\n";
    let file = docs.join("guide.md");
    fs::write(&file, text).unwrap();
    let got = broken_links(&root, &file, text);
    fs::remove_dir_all(&root).unwrap();
    assert_eq!(
        got,
        [
            "docs/guide.md:4: (gone.md): no such file or folder",
            "docs/guide.md:5: (other.md#unknown-part): no heading has this anchor",
            "docs/guide.md:6: (#there): no heading has this anchor",
            "docs/guide.md:7: (../../elsewhere.md): points outside the repository",
        ]
    );
}
