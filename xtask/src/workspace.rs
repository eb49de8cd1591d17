//! Where the workspace and its target directory are, as cargo sees them (`CARGO_TARGET_DIR`, `build.target-dir`
//! in a config file, or the default `target/`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use crate::Result;

/// The workspace root and target directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    /// Folder of the workspace `Cargo.toml`.
    pub root: PathBuf,
    /// Cargo's target directory for this workspace.
    pub target_dir: PathBuf,
}

impl Workspace {
    /// Asks `cargo metadata` about the workspace whose manifest is `manifest` (the root `Cargo.toml`).
    ///
    /// # Errors
    /// cargo cannot be run or fails, or its answer lacks the two paths.
    pub fn locate(manifest: &Path) -> Result<Workspace> {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let output = Command::new(&cargo)
            .args(["metadata", "--format-version=1", "--no-deps", "--manifest-path"])
            .arg(manifest)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .context("cannot run `cargo metadata`")?;
        if !output.status.success() {
            bail!("`cargo metadata --manifest-path {}` failed ({})", manifest.display(), output.status);
        }
        let metadata: serde_json::Value =
            serde_json::from_slice(&output.stdout).context("`cargo metadata` printed something other than JSON")?;
        let path = |key: &str| -> Result<PathBuf> {
            metadata[key].as_str().map(PathBuf::from).with_context(|| format!("`cargo metadata` gave no `{key}`"))
        };
        Ok(Workspace { root: path("workspace_root")?, target_dir: path("target_directory")? })
    }

    /// The workspace this xtask binary was built from (its manifest is next to the `xtask/` folder).
    ///
    /// # Errors
    /// As [`Workspace::locate`].
    pub fn current() -> Result<Workspace> {
        let xtask_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = xtask_dir.parent().context("xtask has no parent folder")?;
        Workspace::locate(&root.join("Cargo.toml"))
    }

    /// `target/ptx`: where `cargo xtask build-ptx` puts the PTX, cubin and report.
    pub fn ptx_dir(&self) -> PathBuf {
        self.target_dir.join("ptx")
    }

    /// `target/ptxas-wheel`: where `cargo xtask test` installs the ptxas wheel with `pip install --target` when
    /// ptxas is missing. A folder of ours, because pip refuses to install into an externally managed Python
    /// (Debian's and Ubuntu's, PEP 668); `cargo clean` removes it, and the next test run installs it again.
    pub fn ptxas_wheel_dir(&self) -> PathBuf {
        self.target_dir.join("ptxas-wheel")
    }

    /// `target/<tool>-wheel`: where `cargo xtask sass` installs the wheel of `tool` (cuobjdump, nvdisasm) when
    /// it is missing, one folder per wheel (see [`crate::prereq::ensure_tool`]).
    pub fn tool_wheel_dir(&self, tool: &str) -> PathBuf {
        self.target_dir.join(format!("{tool}-wheel"))
    }

    /// `target/xtask-install.log`: the output of the apt-get and pip runs that install missing prerequisites
    /// ([`crate::prereq::Installer`]), the last run's only.
    pub fn install_log(&self) -> PathBuf {
        self.target_dir.join("xtask-install.log")
    }

    /// `target/sass`: where `cargo xtask sass` writes the SASS listings and fast paths.
    pub fn sass_dir(&self) -> PathBuf {
        self.target_dir.join("sass")
    }

    /// `target/ptx-build`: the nested cargo's target directory, the same one gdaki-build uses from a build script (testkit/build.rs) for a build in
    /// `target/<profile>`, so that `cargo build` and `cargo xtask build-ptx` share one cache.
    pub fn nested_target_dir(&self) -> PathBuf {
        self.target_dir.join("ptx-build")
    }
}
