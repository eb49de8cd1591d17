//! The nested cargo build of one `no_std` device crate to one PTX module.
//!
//! Route: `cargo rustc --manifest-path CRATE/Cargo.toml --lib --crate-type cdylib --target nvptx64-nvidia-cuda
//! -Zbuild-std=core --release`, with the release profile overridden to fat LTO, one codegen unit,
//! `panic = "abort"` and no debug info, and `-Ctarget-cpu=sm_90 -Ctarget-feature=+ptx86` for every crate (`core`
//! included). For a `cdylib` on this target rustc links with `llvm-bitcode-linker` (rustup component of the same
//! name), which links all the crates' bitcode, internalizes everything but the exported kernels, and writes one
//! `.ptx`. This is sturdier than `--emit=asm` on the rlib: that emits only the crate's own functions and leaves
//! every non-inlined `core` function as an `.extern`.

use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use crate::validate::{validate, PtxInfo};
use crate::{Result, ARCH, PTX_ISA, TARGET_TRIPLE};

/// A configured PTX build of one device crate (like `cuda_builder::CudaBuilder`); [`PtxBuilder::build`] runs
/// it. In a build script it also tells cargo when to run again and writes the PTX to `OUT_DIR`.
#[derive(Debug, Clone)]
pub struct PtxBuilder {
    crate_dir: PathBuf,
    target_dir: Option<PathBuf>,
    cargo: PathBuf,
    arch: String,
    ptx_isa: (u32, u32),
    locked: bool,
    jobs: Option<u32>,
    quiet: bool,
    build_script: bool,
}

/// A built and validated PTX module.
#[derive(Debug, Clone)]
pub struct BuiltPtx {
    /// Where it was written: `OUT_DIR/<lib name>.ptx` in a build script (for
    /// `include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"))` when the crate's library is `kernels`), else
    /// where cargo wrote it (inside the nested target directory).
    pub path: PathBuf,
    /// The device crate's library name (its package name with `-` as `_`, unless `[lib] name` says otherwise).
    pub lib_name: String,
    /// The module's text.
    pub ptx: String,
    /// What validation learned: version, target, kernel names.
    pub info: PtxInfo,
}

/// What one nested cargo run reported about the device crate.
struct CargoRun {
    /// The `.ptx` artifact, where cargo uplifted it.
    path: PathBuf,
    /// The crate's library name.
    lib_name: String,
    /// Cargo found the crate up to date and did not compile it.
    fresh: bool,
    /// The folders of the path crates it built (the device crate's included).
    path_crates: Vec<PathBuf>,
}

/// What to add to a failed build's message when rustc looked for `std` (a device crate, or a path crate it
/// uses, without `#![no_std]`): rustc's own note says so only in its full output, and its help (build the
/// standard library from source) points the wrong way, since nvptx64 has no `std`. Empty otherwise.
fn no_std_hint(errors: &[String]) -> &'static str {
    if errors.iter().any(|e| e.contains("can't find crate for `std`")) {
        " (device code has no `std` on nvptx64: begin the crate's src/lib.rs, and each path crate's it uses, with \
         `#![no_std]`)"
    } else {
        ""
    }
}

impl PtxBuilder {
    /// A build of the device crate in `crate_dir` (the folder of its `Cargo.toml`; relative to the calling
    /// package's folder in a build script, else to the current folder), for [`ARCH`] and PTX ISA [`PTX_ISA`].
    ///
    /// In a build script (cargo set `OUT_DIR`), the nested build goes to `<target>/ptx-build`, one folder shared
    /// by every profile of the outer build, and [`PtxBuilder::build`] prints `cargo:rerun-if-changed` for the
    /// device crate and every path dependency it builds, so that cargo reruns it only when one changed.
    pub fn new(crate_dir: impl AsRef<Path>) -> Self {
        let crate_dir = crate_dir.as_ref();
        let base = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
        // Absolute: the nested cargo runs in this folder, so a relative path would be taken from it, not from ours.
        let crate_dir = match (&base, crate_dir.is_relative()) {
            (Some(base), true) => base.join(crate_dir),
            _ => absolute(crate_dir),
        };
        let build_script = std::env::var_os("OUT_DIR").is_some() && base.is_some();
        PtxBuilder {
            crate_dir,
            target_dir: None,
            cargo: std::env::var_os("CARGO").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("cargo")),
            arch: ARCH.to_string(),
            ptx_isa: PTX_ISA,
            // A build script must not rewrite Cargo.lock; the outer cargo has already brought it up to date.
            locked: build_script,
            jobs: std::env::var("NUM_JOBS").ok().and_then(|n| n.parse().ok()).filter(|_| build_script),
            quiet: false,
            build_script,
        }
    }

    /// The GPU architecture to generate for (`-Ctarget-cpu`), `sm_90` by default. The driver JIT-compiles
    /// the PTX for newer GPUs; older ones cannot load it.
    pub fn arch(mut self, arch: impl Into<String>) -> Self {
        self.arch = arch.into();
        self
    }

    /// The oldest PTX ISA version to emit (`-Ctarget-feature=+ptxMN`), [`PTX_ISA`] (8.6) by default: the first
    /// with `fence.release`, which every doorbell post uses.
    pub fn ptx_isa(mut self, major: u32, minor: u32) -> Self {
        self.ptx_isa = (major, minor);
        self
    }

    /// The nested build's `--target-dir` (relative to the current folder, which is the package's folder in a
    /// build script). Give it a folder of its own: a build script that ran a nested cargo on the outer build's
    /// target directory would wait on the outer cargo's lock.
    pub fn target_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.target_dir = Some(absolute(&dir.into()));
        self
    }

    /// Pass `--locked`: the nested build must not touch `Cargo.lock` (the default in build scripts).
    pub fn locked(mut self, locked: bool) -> Self {
        self.locked = locked;
        self
    }

    /// Pass `--quiet`: no `Compiling …` lines, only errors and warnings.
    pub fn quiet(mut self, quiet: bool) -> Self {
        self.quiet = quiet;
        self
    }

    /// The device crate's folder.
    pub fn crate_dir(&self) -> &Path {
        &self.crate_dir
    }

    /// The nested build's target directory (see [`PtxBuilder::target_dir`] and [`nested_target_dir`]).
    pub fn resolved_target_dir(&self) -> PathBuf {
        if let Some(dir) = &self.target_dir {
            return dir.clone();
        }
        match std::env::var_os("OUT_DIR").filter(|_| self.build_script) {
            Some(out) => nested_target_dir(Path::new(&out)),
            None => self.crate_dir.join("target/ptx-build"),
        }
    }

    /// The `cargo rustc` command this build runs, with its cleaned environment (see [`clean_cargo_env`]).
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.cargo);
        clean_cargo_env(&mut cmd);
        let color = std::io::stderr().is_terminal();
        cmd.current_dir(&self.crate_dir)
            .arg("rustc")
            .arg("--manifest-path")
            .arg(self.crate_dir.join("Cargo.toml"))
            .args(["--lib", "--crate-type", "cdylib", "--release"])
            .args(["--target", TARGET_TRIPLE, "-Zbuild-std=core"])
            .arg("--target-dir")
            .arg(self.resolved_target_dir())
            // JSON on stdout: we find the artifact by package, and render the diagnostics ourselves so that we can
            // drop the one known-noise warning (see `is_known_noise`).
            .arg(if color { "--message-format=json-diagnostic-rendered-ansi" } else { "--message-format=json" })
            .arg(if color { "--color=always" } else { "--color=never" })
            // `-Zbuild-std` is unstable; the pinned stable toolchain allows it under RUSTC_BOOTSTRAP=1.
            .env("RUSTC_BOOTSTRAP", "1")
            // Highest-precedence rustflags, so that neither the outer build's nor a user's config leaks in. With
            // `--target`, they apply to the nvptx crates (core included), not to build scripts or proc-macros.
            .env("CARGO_ENCODED_RUSTFLAGS", self.rustflags().join("\x1f"))
            // The release profile as one self-contained module needs it, whatever the workspace's Cargo.toml says
            // (these variables take precedence over it): one codegen unit, fat LTO, abort on panic.
            .env("CARGO_PROFILE_RELEASE_LTO", "fat")
            .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
            .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
            .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
            .env("CARGO_PROFILE_RELEASE_INCREMENTAL", "false")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if self.locked {
            cmd.arg("--locked");
        }
        if let Some(jobs) = self.jobs {
            cmd.arg(format!("--jobs={jobs}"));
        }
        if self.quiet {
            cmd.arg("--quiet");
        }
        cmd
    }

    /// Codegen flags for every nvptx crate.
    fn rustflags(&self) -> Vec<String> {
        vec![
            format!("-Ctarget-cpu={}", self.arch),
            format!("-Ctarget-feature=+ptx{}{}", self.ptx_isa.0, self.ptx_isa.1),
        ]
    }

    /// Makes sure the toolchain has the components the build needs ([`crate::toolchain::ensure_components`],
    /// which may run `rustup component add`), runs the nested cargo, then reads and validates the PTX it wrote.
    /// Compiler diagnostics go to stderr. In a build script, also writes the PTX to `OUT_DIR/<lib name>.ptx`,
    /// prints `cargo:rerun-if-changed` lines (see [`PtxBuilder::new`]) and each warning about a path crate as
    /// one `cargo:warning` (cargo hides a build script's stderr unless it fails).
    ///
    /// Builds into one nested target directory take turns (a lock file in it) from the nested cargo to the read
    /// of the module, and a crate that cargo finds up to date although another crate with the same library name
    /// was built into that directory after it (they share the output file) is built again.
    ///
    /// # Errors
    /// The device crate's `Cargo.toml` is missing; a toolchain component is missing and cannot be added (the
    /// error names the `rustup` command); cargo cannot be started or fails (its errors are on stderr; a lock file
    /// that `--locked` keeps cargo from creating or updating is named with the command that fixes it); no
    /// `.ptx` artifact is reported (the crate has no `[lib]`); or the module fails [`validate`] (for instance an
    /// `.extern` left by a function that was not linked in); the nested target directory cannot be created or
    /// locked, or the file that records which crate built the module cannot be written; or the output of another
    /// crate with the same library name cannot be removed or does not make cargo build this crate again.
    pub fn build(&self) -> Result<BuiltPtx> {
        let manifest = self.crate_dir.join("Cargo.toml");
        if !manifest.is_file() {
            bail!(
                "no device crate at {}: PtxBuilder::new takes the folder of a no_std crate's Cargo.toml (relative to \
                 the package whose build script calls it)",
                self.crate_dir.display()
            );
        }
        let manifest = manifest.canonicalize().with_context(|| format!("cannot resolve {}", manifest.display()))?;
        let emit = |line: &str| {
            if self.build_script {
                println!("cargo:warning={line}");
            } else {
                eprintln!("gdaki-build: {line}");
            }
        };
        // Before cargo: a missing component would otherwise surface as an obscure error deep in the nested build.
        crate::toolchain::ensure_components(&self.crate_dir, emit)?;
        // Why a lock of our own: every build script of a workspace builds into the same nested target directory,
        // and cargo's lock on it is held only while a nested cargo runs. The artifact is read after that cargo
        // exits, and between the two another builder's cargo can uplift its own module to the same path (two
        // device crates with the same library name); the check of who built it below must not interleave either.
        let lock = lock_target_dir(&self.resolved_target_dir())?;
        let mut run = self.run_cargo(&manifest)?;
        // Why this check: cargo names a path crate's cdylib without a hash (`deps/kernels.ptx`), so device crates
        // with the same library name write one file. Each crate's fingerprint is its own, so after crate B built,
        // crate A is still fresh and cargo uplifts B's module as A's. A record of which manifest last built the
        // artifact tells; when it is not this one, removing the unhashed output makes cargo build A again.
        let built_from = built_from_record(&run.path);
        let ours = manifest.as_os_str().as_encoded_bytes();
        if run.fresh && fs::read(&built_from).ok().as_deref() != Some(ours) {
            let name = run.path.file_name().context("the artifact path has no file name")?;
            let output = run.path.with_file_name("deps").join(name);
            let (artifact, lib_name) = (run.path.clone(), run.lib_name.clone());
            let shared = |what: String| {
                format!(
                    "{what}, so {} may be the build of another crate with the library name `{}` in the same target \
                     directory; give the crates different library names or target directories",
                    artifact.display(),
                    lib_name
                )
            };
            fs::remove_file(&output).with_context(|| shared(format!("cannot remove {}", output.display())))?;
            run = self.run_cargo(&manifest)?;
            if run.fresh {
                bail!(shared(format!(
                    "cargo did not build {} again after {} was removed",
                    self.crate_dir.display(),
                    output.display()
                )));
            }
        }
        fs::write(&built_from, ours).with_context(|| format!("cannot write {}", built_from.display()))?;
        let CargoRun { path, lib_name, path_crates, .. } = run;
        if self.build_script {
            // Cargo's dep-info next to the artifact lists every source file of the path crates the build read.
            let dep_info = fs::read_to_string(path.with_extension("d")).ok();
            for p in self.rerun_paths(&path_crates, dep_info.as_deref()) {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
        let ptx = fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        drop(lock);
        let info = validate(&ptx, &self.arch, self.ptx_isa).with_context(|| format!("{}", path.display()))?;
        let mut built = BuiltPtx { path, lib_name, ptx, info };
        if let Some(out) = std::env::var_os("OUT_DIR").filter(|_| self.build_script) {
            let dest = Path::new(&out).join(format!("{}.ptx", built.lib_name));
            write_atomically(&dest, built.ptx.as_bytes())?;
            built.path = dest;
        }
        Ok(built)
    }

    /// Runs the nested cargo once: its diagnostics go to stderr (and, in a build script, those about path crates
    /// to `cargo:warning` lines); what it reported about the device crate's `.ptx` is returned.
    fn run_cargo(&self, manifest: &Path) -> Result<CargoRun> {
        let mut cmd = self.command();
        // Read on the way to our stderr, for the one cargo error that only the caller of this crate can fix.
        cmd.stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("cannot run `{}`", self.cargo.display()))?;
        let stdout = child.stdout.take().context("cargo's stdout was not captured")?;
        let cargo_stderr = child.stderr.take().context("cargo's stderr was not captured")?;
        let this = self.clone();
        let stderr_reader = std::thread::spawn(move || {
            let mut hint = None;
            let mut reader = BufReader::new(cargo_stderr);
            let mut line = Vec::new();
            while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                let _ = std::io::stderr().write_all(&line);
                hint = hint.or_else(|| this.locked_hint(&String::from_utf8_lossy(&line)));
                line.clear();
            }
            hint
        });

        let mut artifact = None;
        let mut path_crates = Vec::new();
        // One line per compile error of the device crate (or a path crate it uses), for the error this returns:
        // a build script's failure prints its whole output, and the rendered errors sit among the rest.
        let mut errors = Vec::new();
        let mut stderr = std::io::stderr().lock();
        for line in BufReader::new(stdout).lines() {
            let line = line.context("reading cargo's output")?;
            let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
                // Not JSON (a build script of a dependency printing to stdout): pass it on.
                let _ = writeln!(stderr, "{line}");
                continue;
            };
            match message["reason"].as_str() {
                Some("compiler-message") => {
                    let diagnostic = &message["message"];
                    if !is_known_noise(diagnostic) {
                        if let Some(rendered) = diagnostic["rendered"].as_str() {
                            let _ = write!(stderr, "{rendered}");
                        }
                        if self.build_script {
                            if let Some(summary) = workspace_diagnostic(&message, "warning") {
                                println!("cargo:warning={summary}");
                            }
                        }
                        // rustc's closing "aborting due to N previous errors" counts them; it is not one.
                        let closing = diagnostic["message"].as_str().is_some_and(|m| m.starts_with("aborting due to"));
                        errors.extend(workspace_diagnostic(&message, "error").filter(|_| !closing));
                    }
                }
                Some("compiler-artifact") => {
                    if let Some(dir) = message["package_id"].as_str().and_then(path_package_dir) {
                        path_crates.push(dir);
                    }
                    let ours = message["manifest_path"].as_str().map(Path::new).and_then(|p| p.canonicalize().ok());
                    if ours.as_deref() == Some(manifest) {
                        let files = message["filenames"].as_array().into_iter().flatten();
                        if let Some(ptx) = files.filter_map(|f| f.as_str()).find(|f| f.ends_with(".ptx")) {
                            let name = message["target"]["name"].as_str().unwrap_or("kernels").replace('-', "_");
                            // Whether cargo found the crate up to date (taken as built if a cargo does not say).
                            let fresh = message["fresh"].as_bool().unwrap_or(false);
                            artifact = Some((PathBuf::from(ptx), name, fresh));
                        }
                    }
                }
                _ => {}
            }
        }
        drop(stderr);
        let status = child.wait().context("waiting for cargo")?;
        let locked_hint = stderr_reader.join().ok().flatten();
        if !status.success() {
            // No `rerun-if-changed` lines: cargo runs a failed build script again anyway, and they would stand
            // between the errors and this message.
            let first = match errors.as_slice() {
                [] => locked_hint.map(|hint| format!(": {hint}")).unwrap_or_default(),
                [one] => format!(": error: {one}"),
                [one, rest @ ..] => format!(": error: {one} (and {} more errors)", rest.len()),
            };
            bail!(
                "building {} for {TARGET_TRIPLE} failed ({status}){first}{}; cargo's messages are above",
                self.crate_dir.display(),
                no_std_hint(&errors)
            );
        }
        let Some((path, lib_name, fresh)) = artifact else {
            bail!(
                "cargo built {} for {TARGET_TRIPLE} but reported no .ptx artifact (does the crate have a library?)",
                self.crate_dir.display()
            );
        };
        Ok(CargoRun { path, lib_name, fresh, path_crates })
    }

    /// What to do when `line` of cargo's stderr says it refused to create or update the device crate's lock
    /// file because of `--locked` (a device crate outside the calling package's workspace, without a lock file
    /// or with one that lacks a new dependency); `None` for other lines.
    fn locked_hint(&self, line: &str) -> Option<String> {
        if !(line.contains("the lock file") && line.contains("because --locked was passed")) {
            return None;
        }
        Some(format!(
            "{}'s Cargo.lock is missing or out of date, and the PTX build runs with --locked: run `cargo update \
             --workspace --manifest-path '{}'` once, or build with `.locked(false)`",
            self.crate_dir.display(),
            self.crate_dir.join("Cargo.toml").display()
        ))
    }

    /// What the `cargo:rerun-if-changed` lines name: the manifest, `src` and `build.rs` of the device crate and of
    /// each path crate it built; each other source file in cargo's `dep_info` for the artifact (a module under
    /// `#[path]`, an `include_str!` file, a `[lib] path` outside `src`); and the files that change what the
    /// nested build does (lock file, toolchain pin, cargo config) up the device crate's folders.
    fn rerun_paths(&self, path_crates: &[PathBuf], dep_info: Option<&str>) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = vec![self.crate_dir.clone()];
        dirs.extend(path_crates.iter().cloned());
        dirs.sort();
        dirs.dedup();
        let mut paths = Vec::new();
        let mut folders = Vec::new();
        for dir in &dirs {
            // Folders are scanned recursively by cargo; the manifest and sources are what matter, so the two are
            // named, not the whole folder (which may hold a target directory).
            for part in ["Cargo.toml", "src", "build.rs"] {
                let p = dir.join(part);
                if p.exists() {
                    if p.is_dir() {
                        folders.push(p.clone());
                    }
                    paths.push(p);
                }
            }
        }
        let sources = dep_info.map(dep_info_files).unwrap_or_default();
        for file in sources {
            if !folders.iter().any(|folder| file.starts_with(folder)) && !paths.contains(&file) {
                paths.push(file);
            }
        }
        for ancestor in self.crate_dir.ancestors() {
            for file in ["Cargo.lock", "Cargo.toml", "rust-toolchain.toml", "rust-toolchain", ".cargo/config.toml"] {
                let p = ancestor.join(file);
                if p.is_file() {
                    paths.push(p);
                }
            }
        }
        paths
    }
}

/// The prerequisites of a Makefile-style dep-info file as cargo writes it (`target: dep dep`, a space in a path
/// escaped as `\ `).
fn dep_info_files(text: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for line in text.lines() {
        // The target ends at the first `: ` (a space inside it is escaped, so never `: ` there).
        let Some((_, deps)) = line.split_once(": ") else { continue };
        let mut current = String::new();
        let mut chars = deps.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&' ') => current.push(chars.next().unwrap_or(' ')),
                ' ' => files.extend((!current.is_empty()).then(|| PathBuf::from(std::mem::take(&mut current)))),
                _ => current.push(c),
            }
        }
        files.extend((!current.is_empty()).then(|| PathBuf::from(current)));
    }
    files
}

/// `path` made absolute against the current folder (as is if there is none).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The folder of a path package from its cargo package id (`path+file:///w/device#gdaki-device@0.1.0`, a URL:
/// `/my%20app` is the folder `/my app`); `None` for registry and git packages.
fn path_package_dir(package_id: &str) -> Option<PathBuf> {
    let rest = package_id.strip_prefix("path+file://")?;
    let dir = rest.split('#').next()?;
    Some(PathBuf::from(percent_decode(dir)))
}

/// `%XX` escapes to their bytes; anything else as is. The bytes are the path's on Unix, where paths are bytes;
/// elsewhere a path that does not decode to UTF-8 is taken as is.
fn percent_decode(text: &str) -> std::ffi::OsString {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        let escaped = tail.get(..2).and_then(|hex| std::str::from_utf8(hex).ok());
        match escaped.and_then(|hex| u8::from_str_radix(hex, 16).ok()).filter(|_| first == b'%') {
            Some(byte) => {
                bytes.push(byte);
                rest = &tail[2..];
            }
            None => {
                bytes.push(first);
                rest = tail;
            }
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        std::ffi::OsString::from_vec(bytes)
    }
    #[cfg(not(unix))]
    {
        String::from_utf8(bytes).map(Into::into).unwrap_or_else(|_| text.into())
    }
}

impl BuiltPtx {
    /// Writes the module to `dest` (creating its folder) through a temporary file and a rename, so that a reader
    /// never sees half a file.
    ///
    /// # Errors
    /// The folder cannot be created or the file cannot be written.
    pub fn write_to(&self, dest: &Path) -> Result<()> {
        write_atomically(dest, self.ptx.as_bytes())
    }
}

/// Writes `bytes` to `dest` through `dest.tmp` and a rename.
///
/// # Errors
/// The folder cannot be created or the file cannot be written or renamed.
pub fn write_atomically(dest: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = dest.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut tmp = dest.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    fs::rename(&tmp, dest).with_context(|| format!("cannot rename {} to {}", tmp.display(), dest.display()))
}

/// `gdaki-device (nvptx64-nvidia-cuda): <message> at <file>:<line>:<column>` for a diagnostic of `level`
/// (`"warning"`, `"error"`) about a path crate; `None` for other levels and for dependencies'. Cargo prefixes a
/// build script's warning with `warning:`.
fn workspace_diagnostic(message: &serde_json::Value, level: &str) -> Option<String> {
    let diagnostic = &message["message"];
    let package_id = message["package_id"].as_str()?;
    if diagnostic["level"] != level || !package_id.starts_with("path+") {
        return None;
    }
    // `path+file:///w/device#gdaki-device@0.1.0`, or `path+file:///w/kernels#0.1.0` when the folder's name is
    // the package's.
    let (path, fragment) = package_id.rsplit_once('#').unwrap_or((package_id, ""));
    let package = match fragment.split_once('@') {
        Some((name, _)) => name,
        None => path.rsplit('/').next().unwrap_or(path),
    };
    let text = diagnostic["message"].as_str()?;
    let spans = diagnostic["spans"].as_array().into_iter().flatten();
    let location = spans
        .clone()
        .find(|s| s["is_primary"] == true)
        .map(|s| format!(" at {}:{}:{}", s["file_name"].as_str().unwrap_or("?"), s["line_start"], s["column_start"]));
    Some(format!("{package} ({TARGET_TRIPLE}): {text}{}", location.unwrap_or_default()))
}

/// `rustc` warns once per crate that `+ptx86` is not a stable target feature; we know, and it is the documented
/// way to ask LLVM for PTX 8.6, so it would only bury real warnings.
fn is_known_noise(diagnostic: &serde_json::Value) -> bool {
    let text = diagnostic["message"].as_str().unwrap_or_default();
    diagnostic["level"] == "warning"
        && text.starts_with("unstable feature specified for `-Ctarget-feature`")
        && text.contains("`ptx")
}

/// Removes from `cmd`'s environment what an outer cargo (or the user, for host builds) set and a nested cargo
/// for another target would obey: rustflags, wrappers, target-dir, `CARGO_BUILD_*`, `CARGO_PROFILE_*`,
/// `CARGO_TARGET_*`, the jobserver (`CARGO_MAKEFLAGS`, `MAKEFLAGS`, `MFLAGS`), and the variables cargo sets for
/// build scripts (`OUT_DIR`, `TARGET`, `PROFILE`, `CARGO_CFG_*`, `CARGO_FEATURE_*`, …).
///
/// Kept: `CARGO_HOME`, the network and registry settings (`CARGO_NET_*`, `CARGO_HTTP_*`, `CARGO_REGISTRY_*`,
/// `CARGO_REGISTRIES_*`), `CARGO_TERM_*`, `CARGO_LOG`, `RUSTC` (the outer build's compiler, same toolchain) and
/// rustup's `RUSTUP_*`.
pub fn clean_cargo_env(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if should_remove(&name) {
            cmd.env_remove(&name);
        }
    }
}

fn should_remove(name: &OsStr) -> bool {
    const KEEP_PREFIXES: &[&str] =
        &["CARGO_HOME", "CARGO_NET_", "CARGO_HTTP_", "CARGO_REGISTRY_", "CARGO_REGISTRIES_", "CARGO_TERM_"];
    const REMOVE: &[&str] = &[
        "RUSTFLAGS",
        "RUSTDOCFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_LINKER",
        "RUSTDOC",
        "RUSTC_BOOTSTRAP",
        "MAKEFLAGS",
        "MFLAGS",
        "OUT_DIR",
        "TARGET",
        "HOST",
        "NUM_JOBS",
        "OPT_LEVEL",
        "DEBUG",
        "PROFILE",
    ];
    let Some(name) = name.to_str() else { return false };
    if name == "CARGO_LOG" || KEEP_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return false;
    }
    REMOVE.contains(&name) || name.starts_with("CARGO_") || name.starts_with("__CARGO")
}

/// Takes the lock that [`PtxBuilder::build`]s on one nested target directory hold in turn (on
/// `dir/.gdaki-build-lock`, until the returned file is dropped), creating the folder if need be.
fn lock_target_dir(dir: &Path) -> Result<fs::File> {
    if !dir.is_dir() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        // Cargo marks a target directory it creates as a cache (for backup tools), but not one that exists.
        let _ = fs::write(dir.join("CACHEDIR.TAG"), "Signature: 8a477f597d28d172789f06886806bc55\n");
    }
    let path = dir.join(".gdaki-build-lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    file.lock().with_context(|| format!("cannot lock {}", path.display()))?;
    Ok(file)
}

/// The file next to an uplifted `artifact` that names the manifest of the crate that last built it
/// (`kernels.ptx.built-from`).
fn built_from_record(artifact: &Path) -> PathBuf {
    let mut name = artifact.as_os_str().to_owned();
    name.push(".built-from");
    PathBuf::from(name)
}

/// Where a build script should put the nested PTX build: `<dir>/ptx-build`, with `<dir>` the folder that holds
/// the outer build's profile folder (`target/` or `target/<triple>/`), found from `OUT_DIR`
/// (`<dir>/<profile>/build/<package>-<hash>/out`). One folder for every outer profile, so that debug and release
/// builds share the PTX build (cargo's lock on that folder serializes them). If `OUT_DIR` does not have that
/// shape, `OUT_DIR/ptx-build`.
pub fn nested_target_dir(out_dir: &Path) -> PathBuf {
    let build = out_dir.parent().and_then(Path::parent);
    match build.filter(|b| b.file_name() == Some(OsStr::new("build"))).and_then(Path::parent).and_then(Path::parent) {
        Some(dir) => dir.join("ptx-build"),
        None => out_dir.join("ptx-build"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_cleaning() {
        for removed in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "CARGO_BUILD_RUSTFLAGS",
            "CARGO_PROFILE_RELEASE_LTO",
            "CARGO_TARGET_NVPTX64_NVIDIA_CUDA_LINKER",
            "CARGO_MAKEFLAGS",
            "MAKEFLAGS",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "CARGO_CFG_TARGET_OS",
            "CARGO_FEATURE_STD",
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_INCREMENTAL",
            "OUT_DIR",
            "PROFILE",
            "__CARGO_FIX_PLZ",
        ] {
            assert!(should_remove(OsStr::new(removed)), "{removed}");
        }
        for kept in [
            "CARGO_HOME",
            "CARGO_NET_OFFLINE",
            "CARGO_HTTP_PROXY",
            "CARGO_REGISTRIES_CRATES_IO_PROTOCOL",
            "CARGO_TERM_COLOR",
            "CARGO_LOG",
            "RUSTC",
            "RUSTUP_TOOLCHAIN",
            "PATH",
            "HOME",
        ] {
            assert!(!should_remove(OsStr::new(kept)), "{kept}");
        }
    }

    #[test]
    fn path_packages_and_their_folders() {
        assert_eq!(path_package_dir("path+file:///w/device#gdaki-device@0.1.0"), Some(PathBuf::from("/w/device")));
        assert_eq!(path_package_dir("path+file:///w/kernels#0.1.0"), Some(PathBuf::from("/w/kernels")));
        assert_eq!(path_package_dir("registry+https://github.com/rust-lang/crates.io-index#bytemuck@1.25.2"), None);
        // Cargo writes the folder as a URL: a space, a non-ASCII letter and `%` itself are percent-encoded.
        assert_eq!(
            path_package_dir("path+file:///tmp/my%20app/k%C3%A9rnels%25#common@0.1.0"),
            Some(PathBuf::from("/tmp/my app/k\u{e9}rnels%"))
        );
        // A folder whose name is not UTF-8 (bytes are bytes on Unix).
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            assert_eq!(
                path_package_dir("path+file:///tmp/k%FFx#common@0.1.0"),
                Some(PathBuf::from(OsStr::from_bytes(b"/tmp/k\xffx")))
            );
        }
        // `%` not followed by two hex digits is kept.
        assert_eq!(path_package_dir("path+file:///tmp/a%2x%#c@0.1.0"), Some(PathBuf::from("/tmp/a%2x%")));
    }

    #[test]
    fn rerun_paths_include_sources_outside_src() {
        let root = std::env::temp_dir().join(format!("gdaki-build-rerun {}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let kernels = root.join("my kernels");
        for file in ["Cargo.toml", "src/lib.rs", "extra/consts.rs"] {
            fs::create_dir_all(kernels.join(file).parent().expect("parent")).expect("mkdir");
            fs::write(kernels.join(file), "").expect("write");
        }
        // The dep-info file cargo writes next to the artifact: spaces escaped, the sources of every path crate.
        let dep_info = format!(
            "{0}/target/kernels.ptx: {0}/my\\ kernels/extra/consts.rs {0}/my\\ kernels/src/lib.rs\n",
            root.display().to_string().replace(' ', "\\ ")
        );
        let paths = PtxBuilder::new(&kernels).rerun_paths(&[], Some(&dep_info));
        assert_eq!(paths[..2], [kernels.join("Cargo.toml"), kernels.join("src")]);
        // `#[path]`, `include_str!`, `[lib] path`: a file outside `src` that the build read.
        assert!(paths.contains(&kernels.join("extra/consts.rs")), "{paths:?}");
        // Not named twice: `src` covers its files.
        assert!(!paths.contains(&kernels.join("src/lib.rs")), "{paths:?}");
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn relative_target_dir_is_the_callers() {
        let kernels = std::env::temp_dir().join("kernels");
        let cmd = PtxBuilder::new(&kernels).target_dir("ptx out").command();
        // Cargo runs in the device crate's folder; the paths it is given must not depend on that.
        assert_eq!(cmd.get_current_dir(), Some(kernels.as_path()));
        let args: Vec<&OsStr> = cmd.get_args().collect();
        let after = |flag: &str| args.iter().position(|a| *a == flag).map(|i| PathBuf::from(args[i + 1]));
        let cwd = std::env::current_dir().expect("cwd");
        assert_eq!(after("--target-dir"), Some(cwd.join("ptx out")));
        assert_eq!(after("--manifest-path"), Some(kernels.join("Cargo.toml")));
    }

    /// rustc's error for a crate without `#![no_std]` gets the fix; other errors nothing.
    #[test]
    fn a_crate_that_needs_std_is_told_to_be_no_std() {
        let std_err = "stdk (nvptx64-nvidia-cuda): can't find crate for `std` at src/lib.rs:1:1".to_string();
        let other = "stdk (nvptx64-nvidia-cuda): cannot find value `x` in this scope at src/lib.rs:3:5".to_string();
        assert!(no_std_hint(&[other.clone(), std_err]).contains("`#![no_std]`"));
        assert_eq!(no_std_hint(&[other]), "");
        assert_eq!(no_std_hint(&[]), "");
    }

    #[test]
    fn locked_refusal_says_what_to_do() {
        let kernels = std::env::temp_dir().join("my kernels");
        let builder = PtxBuilder::new(&kernels);
        let lock = kernels.join("Cargo.lock");
        let hint = format!(
            "{}'s Cargo.lock is missing or out of date, and the PTX build runs with --locked: run `cargo update \
             --workspace --manifest-path '{}'` once, or build with `.locked(false)`",
            kernels.display(),
            kernels.join("Cargo.toml").display()
        );
        for verb in ["create", "update"] {
            let line = format!(
                "error: cannot {verb} the lock file {} because --locked was passed to prevent this\n",
                lock.display()
            );
            assert_eq!(builder.locked_hint(&line).as_deref(), Some(hint.as_str()), "{verb}");
        }
        assert_eq!(builder.locked_hint("error: could not compile `kernels` (lib) due to 1 previous error"), None);
    }

    #[test]
    fn nested_dir_from_out_dir() {
        assert_eq!(
            nested_target_dir(Path::new("/w/target/debug/build/gdaki-0123/out")),
            Path::new("/w/target/ptx-build")
        );
        assert_eq!(
            nested_target_dir(Path::new("/w/target/x86_64-unknown-linux-gnu/release/build/gdaki-0123/out")),
            Path::new("/w/target/x86_64-unknown-linux-gnu/ptx-build")
        );
        assert_eq!(nested_target_dir(Path::new("/odd/out")), Path::new("/odd/out/ptx-build"));
    }

    #[test]
    fn workspace_diagnostics_become_one_line() {
        let warning = serde_json::json!({
            "reason": "compiler-message",
            "package_id": "path+file:///w/device#gdaki-device@0.1.0",
            "message": {
                "level": "warning",
                "message": "unused variable: `x`",
                "spans": [{ "is_primary": true, "file_name": "device/src/sq.rs", "line_start": 12, "column_start": 9 }],
            },
        });
        let line = "gdaki-device (nvptx64-nvidia-cuda): unused variable: `x` at device/src/sq.rs:12:9";
        assert_eq!(workspace_diagnostic(&warning, "warning").as_deref(), Some(line));
        let mut named_by_folder = warning.clone();
        named_by_folder["package_id"] = "path+file:///w/kernels#0.1.0".into();
        assert_eq!(
            workspace_diagnostic(&named_by_folder, "warning").as_deref(),
            Some("kernels (nvptx64-nvidia-cuda): unused variable: `x` at device/src/sq.rs:12:9")
        );
        let mut dependency = warning.clone();
        dependency["package_id"] = "registry+https://github.com/rust-lang/crates.io-index#bytemuck@1.25.2".into();
        assert_eq!(workspace_diagnostic(&dependency, "warning"), None);
        let mut error = warning.clone();
        error["message"]["level"] = "error".into();
        assert_eq!(workspace_diagnostic(&error, "warning"), None);
        assert_eq!(workspace_diagnostic(&error, "error").as_deref(), Some(line));
        assert_eq!(workspace_diagnostic(&warning, "error"), None);
    }

    #[test]
    fn noise_filter_is_narrow() {
        let noise = serde_json::json!({
            "level": "warning",
            "message": "unstable feature specified for `-Ctarget-feature`: `ptx86`",
        });
        assert!(is_known_noise(&noise));
        let other = serde_json::json!({ "level": "warning", "message": "unused variable: `x`" });
        assert!(!is_known_noise(&other));
        let error = serde_json::json!({ "level": "error", "message": noise["message"] });
        assert!(!is_known_noise(&error));
    }
}
