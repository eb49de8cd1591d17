//! NVIDIA's PTX assembler: find it, assemble the module for the target GPU, and read registers and spills per
//! kernel from `ptxas -v`.
//!
//! ptxas checks what LLVM's NVPTX back end does not (instruction availability per SM and PTX version, operand
//! types of inline asm), and its resource report is where a register-hungry or spilling kernel shows first.
//! Machines without CUDA get it from PyPI (`nvidia-cuda-nvcc-cu12` and friends); it needs no GPU.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use crate::Result;

/// Environment variable that names the ptxas to use, before PATH and Python wheels are searched.
pub const PTXAS_ENV: &str = "PTXAS";

/// Finds ptxas: `$PTXAS`, then `ptxas` on PATH, then in `wheel_dir` (the folder that
/// [`crate::prereq::ensure_ptxas`] installs the wheel into, `target/ptxas-wheel`), then inside pip-installed
/// NVIDIA wheels (`nvidia/cuda_nvcc/bin`, `nvidia/cu13/bin`, …, in every site-packages folder that `python3`
/// reports). `None` if none is found.
pub fn find(wheel_dir: &Path) -> Option<PathBuf> {
    find_tool("ptxas", PTXAS_ENV, wheel_dir)
}

/// Finds the CUDA binary `tool` (ptxas, cuobjdump, nvdisasm) as [`find`] finds ptxas: the path in the
/// environment variable `env`, then PATH, then `<wheel_dir>/nvidia/*/bin`, then the NVIDIA wheels of `python3`.
pub fn find_tool(tool: &str, env: &str, wheel_dir: &Path) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env).map(PathBuf::from) {
        // An explicit choice that does not exist is reported as "not found" rather than silently replaced.
        return is_executable(&path).then_some(path);
    }
    // Our own folder before Python's: it costs no `python3` run, and it is what `cargo xtask` installed.
    which::which(tool)
        .ok()
        .or_else(|| tool_in_nvidia_dir(&wheel_dir.join("nvidia"), tool))
        .or_else(|| find_in_python_wheels(tool))
}

/// Searches `<dir>/*/bin/<tool>` in every `nvidia` package folder known to `python3` (the namespace package's
/// `__path__`, plus `nvidia/` in each site-packages and the user site), `cuda_nvcc` first.
pub fn find_in_python_wheels(tool: &str) -> Option<PathBuf> {
    // Printed one per line; a missing `nvidia` package is not an error, the site folders are still listed.
    const SCRIPT: &str = "import os, site\n\
        dirs = []\n\
        try:\n    import nvidia\n    dirs += list(nvidia.__path__)\n\
        except Exception:\n    pass\n\
        sites = site.getsitepackages() if hasattr(site, 'getsitepackages') else []\n\
        dirs += [os.path.join(d, 'nvidia') for d in sites + [site.getusersitepackages()]]\n\
        print('\\n'.join(dirs))\n";
    let output = Command::new("python3").args(["-c", SCRIPT]).stderr(Stdio::null()).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines().find_map(|dir| tool_in_nvidia_dir(Path::new(dir), tool))
}

/// `<nvidia>/cuda_nvcc/bin/<tool>` if present, else the first `<nvidia>/<package>/bin/<tool>` in name order
/// (`cu12`, `cu13`, `cuda_cuobjdump`, …).
fn tool_in_nvidia_dir(nvidia: &Path, tool: &str) -> Option<PathBuf> {
    let preferred = nvidia.join("cuda_nvcc/bin").join(tool);
    if is_executable(&preferred) {
        return Some(preferred);
    }
    let mut packages: Vec<PathBuf> = std::fs::read_dir(nvidia).ok()?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    packages.sort();
    packages.into_iter().map(|p| p.join("bin").join(tool)).find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// The ptxas release line (`Cuda compilation tools, release 12.9, V12.9.86`), or `None` if it cannot be read.
pub fn version(ptxas: &Path) -> Option<String> {
    let output = Command::new(ptxas).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.lines().find(|l| l.contains("release")).or_else(|| text.lines().last()).map(|l| l.trim().to_string())
}

/// Resources of one function, from `ptxas -v`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// Function name as in the PTX.
    pub name: String,
    /// `true` for a kernel (`.entry`), `false` for a `.func` that ptxas kept as a real call.
    pub entry: bool,
    /// Registers per thread (`Used N registers`); `None` where ptxas reports none (non-entry functions).
    pub registers: Option<u32>,
    /// Bytes of stack frame per thread.
    pub stack_bytes: u32,
    /// Bytes of spill stores per thread.
    pub spill_stores: u32,
    /// Bytes of spill loads per thread.
    pub spill_loads: u32,
}

/// Assembles `ptx` for `arch` with `ptxas -v`, writes the cubin to `cubin`, and returns the per-function report.
///
/// # Errors
/// ptxas cannot be started, or rejects the module (the error names ptxas's own error lines).
pub fn assemble(ptxas: &Path, ptx: &Path, arch: &str, cubin: &Path) -> Result<Vec<Resources>> {
    let output = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg("-o")
        .arg(cubin)
        .arg(ptx)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", ptxas.display()))?;
    let text = String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let errors: Vec<&str> = text.lines().filter(|l| !l.starts_with("ptxas info")).map(str::trim).collect();
        bail!("ptxas rejected {} ({}): {}", ptx.display(), output.status, errors.join("; "));
    }
    Ok(parse_verbose(&text))
}

/// Parses `ptxas -v` output into one [`Resources`] per function, kernels in the order ptxas compiled them,
/// then other functions.
pub fn parse_verbose(text: &str) -> Vec<Resources> {
    let mut functions: Vec<Resources> = Vec::new();
    // `Used N registers` belongs to the entry being compiled; `N bytes stack frame, …` to the function named by
    // the `Function properties for` line just above it.
    let mut compiling: Option<usize> = None;
    let mut properties: Option<usize> = None;
    let index_of = |functions: &mut Vec<Resources>, name: &str, entry: bool| -> usize {
        match functions.iter().position(|f| f.name == name) {
            Some(i) => {
                functions[i].entry |= entry;
                i
            }
            None => {
                functions.push(Resources { name: name.to_string(), entry, ..Resources::default() });
                functions.len() - 1
            }
        }
    };
    for line in text.lines() {
        let body = line.split_once(':').map(|(_, rest)| rest.trim()).unwrap_or_default();
        if let Some(name) = body.strip_prefix("Compiling entry function '").and_then(|r| r.split('\'').next()) {
            compiling = Some(index_of(&mut functions, name, true));
        } else if let Some(name) = body.strip_prefix("Function properties for ") {
            properties = Some(index_of(&mut functions, name.trim(), false));
        } else if let Some(rest) = body.strip_prefix("Used ") {
            if let (Some(i), Some(n)) = (compiling, number_before(rest, "registers")) {
                functions[i].registers = Some(n);
            }
        } else if line.contains("bytes stack frame") {
            if let Some(i) = properties.take() {
                let f = &mut functions[i];
                f.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                f.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                f.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            }
        }
    }
    // Kernels first (stable sort keeps ptxas's order within each group).
    functions.sort_by_key(|f| !f.entry);
    functions
}

/// The number just before `unit` in `text`: `number_before("0 bytes gmem, 12 registers", "registers")` → 12.
fn number_before(text: &str, unit: &str) -> Option<u32> {
    let before = &text[..text.find(unit)?];
    before.split(|c: char| c.is_whitespace() || c == ',').rev().find(|t| !t.is_empty())?.parse().ok()
}

/// Formats the report as a table: one row per function, kernels first, Rust symbol names demangled (without
/// their hash).
pub fn table(functions: &[Resources]) -> String {
    let names: Vec<String> = functions.iter().map(|f| format!("{:#}", rustc_demangle::demangle(&f.name))).collect();
    let width = names.iter().map(String::len).max().unwrap_or(0).max("kernel".len());
    let mut out = format!(
        "{:<width$}  {:>5}  {:>9}  {:>16}  {:>15}  {:>9}\n",
        "kernel", "kind", "registers", "spill stores (B)", "spill loads (B)", "stack (B)"
    );
    for (f, name) in functions.iter().zip(&names) {
        let registers = f.registers.map_or_else(|| "-".to_string(), |r| r.to_string());
        out += &format!(
            "{:<width$}  {:>5}  {:>9}  {:>16}  {:>15}  {:>9}\n",
            name,
            if f.entry { "entry" } else { "func" },
            registers,
            f.spill_stores,
            f.spill_loads,
            f.stack_bytes
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Output of ptxas 12.9 (`-arch=sm_90 -v`) for two kernels and a `.func` kept as a call.
    const VERBOSE: &str = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k2' for 'sm_90'
ptxas info    : Function properties for k2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 4 registers, used 0 barriers
ptxas info    : Compile time = 6.073 ms
ptxas info    : Compiling entry function 'k1' for 'sm_90'
ptxas info    : Function properties for k1
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 1.427 ms
ptxas info    : Function properties for helper
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
";

    #[test]
    fn parses_kernels_and_functions() {
        let report = parse_verbose(VERBOSE);
        assert_eq!(
            report,
            [
                Resources {
                    name: "k2".into(),
                    entry: true,
                    registers: Some(4),
                    stack_bytes: 0,
                    spill_stores: 0,
                    spill_loads: 0
                },
                Resources {
                    name: "k1".into(),
                    entry: true,
                    registers: Some(255),
                    stack_bytes: 16,
                    spill_stores: 8,
                    spill_loads: 12
                },
                Resources { name: "helper".into(), entry: false, ..Resources::default() },
            ]
        );
        let table = table(&report);
        assert!(table.lines().nth(2).is_some_and(|l| l.starts_with("k1") && l.contains("255")), "{table}");
    }

    #[test]
    fn numbers() {
        assert_eq!(number_before("Used 12 registers, used 0 barriers", "registers"), Some(12));
        assert_eq!(number_before("  8 bytes stack frame, 4 bytes spill stores", "bytes spill stores"), Some(4));
        assert_eq!(number_before("no number here", "registers"), None);
    }

    #[test]
    fn wheel_layout() {
        let dir = std::env::temp_dir().join(format!("xtask-ptxas-{}", std::process::id()));
        let bin = dir.join("cu13/bin");
        std::fs::create_dir_all(&bin).expect("temp dir");
        assert_eq!(tool_in_nvidia_dir(&dir, "ptxas"), None);
        let ptxas = bin.join("ptxas");
        std::fs::write(&ptxas, "").expect("write");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ptxas, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(tool_in_nvidia_dir(&dir, "ptxas"), Some(ptxas));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
