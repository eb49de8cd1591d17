//! Checks that a PTX module is what the host can load as is: the right `.target`, a recent enough `.version`,
//! at least one `.entry`, and no `.extern` declaration.
//!
//! `cuModuleLoadData` does not link: a `.extern .func` or `.extern .global` left by the compiler (a `core`
//! function that was not pulled in, a symbol the device code declared but nobody defined) makes loading fail at
//! run time on the GPU machine, far from its cause. We fail the build instead. The one `.extern` that is not a
//! link-time symbol is the unsized `.extern .shared` array that declares dynamic shared memory (sized by the
//! launch, as `global_asm!(".extern .shared .align 16 .b8 name[];")` writes it); it is allowed.

use std::fmt;

/// What [`validate`] learned about a valid module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxInfo {
    /// The `.version` directive, as `(major, minor)`.
    pub version: (u32, u32),
    /// The first target of the `.target` directive, e.g. `sm_90`.
    pub target: String,
    /// Names of the `.entry` functions (the kernels), in file order.
    pub entries: Vec<String>,
}

/// One reason why a PTX module is rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// No `.version` directive.
    MissingVersion,
    /// `.version` older than required (`found`, `required`).
    OldVersion {
        /// The module's version.
        found: (u32, u32),
        /// The oldest accepted version.
        required: (u32, u32),
    },
    /// No `.target` directive.
    MissingTarget,
    /// `.target` names another architecture.
    WrongTarget {
        /// The module's first target.
        found: String,
        /// The expected target.
        expected: String,
    },
    /// No `.entry`: nothing for the host to launch.
    NoEntry,
    /// A `.extern` declaration other than dynamic shared memory.
    Extern {
        /// 1-based line number in the module.
        line: usize,
        /// The declaration's first line, without comments, whitespace runs collapsed.
        decl: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::MissingVersion => write!(f, "no `.version` directive"),
            Violation::OldVersion { found, required } => {
                write!(f, "`.version {}.{}` is older than {}.{}", found.0, found.1, required.0, required.1)
            }
            Violation::MissingTarget => write!(f, "no `.target` directive"),
            Violation::WrongTarget { found, expected } => write!(f, "`.target {found}`, expected {expected}"),
            Violation::NoEntry => write!(f, "no `.entry` (no kernel to launch)"),
            Violation::Extern { line, decl } => write!(f, "line {line}: `{decl}`"),
        }
    }
}

/// A PTX module that failed [`validate`]; `Display` is one line listing every violation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationError {
    /// Every violation found, in file order for `.extern`s.
    pub violations: Vec<Violation>,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (externs, others): (Vec<_>, Vec<_>) =
            self.violations.iter().partition(|v| matches!(v, Violation::Extern { .. }));
        let mut parts: Vec<String> = others.iter().map(|v| v.to_string()).collect();
        if !externs.is_empty() {
            let list: Vec<String> = externs.iter().map(|v| v.to_string()).collect();
            parts.push(format!(
                "{} unresolved `.extern` declaration(s), which the CUDA driver cannot link: {}",
                externs.len(),
                list.join(", ")
            ));
        }
        write!(f, "invalid PTX: {}", parts.join("; "))
    }
}

/// Validates a PTX module's text for `expected_target` (e.g. [`crate::ARCH`]) and a minimum ISA version
/// `min_version` (e.g. [`crate::PTX_ISA`]).
///
/// # Errors
/// A [`ValidationError`] listing every violation: missing or wrong `.target`, missing or old `.version`, no
/// `.entry`, and each `.extern` other than an unsized `.extern .shared` array (dynamic shared memory).
pub fn validate(ptx: &str, expected_target: &str, min_version: (u32, u32)) -> Result<PtxInfo, ValidationError> {
    let mut violations = Vec::new();
    let mut version = None;
    let mut target = None;
    let mut entries = Vec::new();

    for (number, line) in code_lines(ptx) {
        let mut tokens = line.split_whitespace();
        while let Some(token) = tokens.next() {
            match token {
                ".version" if version.is_none() => {
                    version = tokens.next().and_then(parse_version);
                }
                ".target" if target.is_none() => {
                    // `.target sm_90` or `.target sm_90, texmode_independent`: the first item is the SM.
                    let rest: Vec<&str> = tokens.by_ref().collect();
                    let joined = rest.join(" ");
                    target = joined.split(',').next().map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
                }
                ".entry" => {
                    // `.visible .entry name(` or `.entry name (`: the name ends at `(` or whitespace.
                    if let Some(name) = tokens.next().and_then(|t| t.split('(').next()).filter(|n| !n.is_empty()) {
                        entries.push(name.to_string());
                    }
                }
                ".extern" => {
                    if !is_dynamic_shared(&line) {
                        let decl = line.split_whitespace().collect::<Vec<_>>().join(" ");
                        violations.push(Violation::Extern { line: number, decl });
                    }
                    break;
                }
                _ => {}
            }
        }
    }

    match version {
        None => violations.insert(0, Violation::MissingVersion),
        Some(found) if found < min_version => {
            violations.insert(0, Violation::OldVersion { found, required: min_version })
        }
        Some(_) => {}
    }
    match &target {
        None => violations.insert(0, Violation::MissingTarget),
        Some(found) if found != expected_target => {
            violations.insert(0, Violation::WrongTarget { found: found.clone(), expected: expected_target.to_string() })
        }
        Some(_) => {}
    }
    if entries.is_empty() {
        violations.insert(0, Violation::NoEntry);
    }

    match (violations.is_empty(), version, target) {
        (true, Some(version), Some(target)) => Ok(PtxInfo { version, target, entries }),
        _ => Err(ValidationError { violations }),
    }
}

/// `8.2` → `(8, 2)`.
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// `.extern .shared .align 16 .b8 name[];`: dynamic shared memory, sized at launch, not a link-time symbol.
fn is_dynamic_shared(decl: &str) -> bool {
    let mut tokens = decl.split_whitespace();
    let is_shared = tokens.next() == Some(".extern") && tokens.next() == Some(".shared");
    is_shared && decl.trim_end().trim_end_matches(';').trim_end().ends_with("[]")
}

/// The module's lines with `//` and `/* */` comments removed, numbered from 1, empty lines skipped.
///
/// PTX has no string literals, so a comment marker always starts a comment.
fn code_lines(ptx: &str) -> impl Iterator<Item = (usize, String)> + '_ {
    let mut in_block = false;
    ptx.lines().enumerate().filter_map(move |(index, raw)| {
        let mut code = String::new();
        let mut rest = raw;
        loop {
            if in_block {
                match rest.find("*/") {
                    Some(end) => {
                        in_block = false;
                        rest = &rest[end + 2..];
                    }
                    None => break,
                }
            } else {
                let line_comment = rest.find("//");
                let block_comment = rest.find("/*");
                match (line_comment, block_comment) {
                    (Some(l), Some(b)) if l < b => {
                        code.push_str(&rest[..l]);
                        break;
                    }
                    (Some(l), None) => {
                        code.push_str(&rest[..l]);
                        break;
                    }
                    (_, Some(b)) => {
                        code.push_str(&rest[..b]);
                        code.push(' ');
                        in_block = true;
                        rest = &rest[b + 2..];
                    }
                    (None, None) => {
                        code.push_str(rest);
                        break;
                    }
                }
            }
        }
        (!code.trim().is_empty()).then_some((index + 1, code))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// LLVM's output for two kernels (trimmed), with a comment that mentions `.extern`.
    const GOOD: &str =
        "//\n// Generated by LLVM NVPTX Back-End\n//\n\n.version 8.2\n.target sm_90\n.address_size 64\n\n\
        \t// .globl\tgdaki_smoke // .extern in a comment\n\
        .visible .entry gdaki_smoke(\n\t.param .u64 .ptr .align 1 gdaki_smoke_param_0\n)\n{\n\tret;\n}\n\
        .entry second (\n)\n{\n\tret;\n}\n";

    #[test]
    fn accepts_llvm_output() {
        let info = validate(GOOD, "sm_90", (8, 2)).expect("valid");
        assert_eq!(info.version, (8, 2));
        assert_eq!(info.target, "sm_90");
        assert_eq!(info.entries, ["gdaki_smoke", "second"]);
    }

    #[test]
    fn newer_version_is_fine() {
        let ptx = GOOD.replace(".version 8.2", ".version 8.7");
        assert_eq!(validate(&ptx, "sm_90", (8, 2)).expect("valid").version, (8, 7));
    }

    #[test]
    fn lists_every_extern() {
        let ptx = format!(
            "{GOOD}.extern .func  (.param .b32 r)\tfoo(.param .b32 a); // comment\n\
             /* .extern .func x(); */\n.extern .global .align 4 .b32 bar;\n"
        );
        let err = validate(&ptx, "sm_90", (8, 2)).expect_err("externs");
        assert_eq!(
            err.violations,
            [
                Violation::Extern { line: 21, decl: ".extern .func (.param .b32 r) foo(.param .b32 a);".into() },
                Violation::Extern { line: 23, decl: ".extern .global .align 4 .b32 bar;".into() },
            ]
        );
        let line = err.to_string();
        assert!(!line.contains('\n'), "one line: {line}");
        assert!(line.contains("2 unresolved `.extern`") && line.contains("foo") && line.contains("bar"), "{line}");
    }

    #[test]
    fn dynamic_shared_memory_is_allowed() {
        let ptx = format!("{GOOD}.extern .shared .align 16 .b8 dyn_smem[];\n");
        assert!(validate(&ptx, "sm_90", (8, 2)).is_ok());
        let sized = format!("{GOOD}.extern .shared .align 16 .b8 fixed[64];\n");
        assert!(validate(&sized, "sm_90", (8, 2)).is_err());
    }

    #[test]
    fn wrong_target_old_version_and_no_entry() {
        let ptx = ".version 7.8\n.target sm_80, texmode_independent\n.address_size 64\n";
        let err = validate(ptx, "sm_90", (8, 2)).expect_err("invalid");
        assert_eq!(
            err.violations,
            [
                Violation::NoEntry,
                Violation::WrongTarget { found: "sm_80".into(), expected: "sm_90".into() },
                Violation::OldVersion { found: (7, 8), required: (8, 2) },
            ]
        );
    }

    #[test]
    fn empty_module() {
        let err = validate("", "sm_90", (8, 2)).expect_err("invalid");
        assert_eq!(err.violations, [Violation::NoEntry, Violation::MissingTarget, Violation::MissingVersion]);
    }

    #[test]
    fn block_comments_span_lines() {
        let ptx = format!("/* start\n.extern .func hidden();\nend */{GOOD}");
        assert!(validate(&ptx, "sm_90", (8, 2)).is_ok());
    }
}
