//! The host library's error type.

/// Errors of the gdaki host library.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument is out of range or inconsistent; the message names it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An allocation of this many bytes failed.
    #[error("out of memory allocating {0} bytes")]
    OutOfMemory(usize),
    /// The requested executor or device is not available here (no GPU, no libcuda, no NIC); one line.
    #[error("{0}")]
    Unavailable(String),
    /// A CUDA driver call failed, or returned what the driver's contract rules out.
    #[error("CUDA: {message}")]
    Cuda {
        /// The call and what for, with the status's name and text (and a JIT log's first lines).
        message: String,
        /// The driver's status (e.g. `CUDA_ERROR_OUT_OF_MEMORY`), `None` when the call succeeded but its
        /// result was unusable (a null or unaligned pointer).
        status: Option<crate::cuda::CUresult>,
    },
    /// Device code reported an error (error CQE, timed-out wait, payload mismatch), or a kernel outlived its
    /// bound; the message says which and where.
    #[error("device code failed: {0}")]
    Device(String),
    /// A kernel returned this error (the first of its launch), as a value: its error CQE's syndrome, the wait
    /// that ran out, the argument it refused.
    #[error("kernel `{kernel}` failed: {error}")]
    Kernel {
        /// The kernel's name.
        kernel: &'static str,
        /// What its device code returned.
        error: gdaki_device::Error,
    },
    /// Device code called on the host (the `cpu` executor, or host code using `gdaki_device` directly)
    /// returned this error.
    #[error("device code failed: {0}")]
    DeviceCode(#[from] gdaki_device::Error),
    /// The emulated NIC could not do what was asked.
    #[error("emulated NIC: {0}")]
    Emu(#[from] EmuError),
    /// An rdma-core call (verbs or mlx5dv) of the mlx5 backend failed: the call (with the step it served, e.g.
    /// `ibv_modify_qp(INIT→RTR)`) and the errno it left.
    #[error("{call}: {}", std::io::Error::from_raw_os_error(*errno))]
    Verbs {
        /// The C call, and what for.
        call: String,
        /// `errno` after the call (or the negative return value of calls that return one, negated).
        errno: i32,
    },
    /// A firmware command (a DevX mailbox, `gdaki_shared::prm::cmd`) completed with a status other than OK:
    /// the command, the status and the syndrome from its output mailbox, and for the emulated NIC what the
    /// syndrome means (`nic::emu::cmd_syndrome`; ConnectX syndromes are undocumented). On a ConnectX, also the
    /// rdma-core call that carried the command and the errno it left (`via`).
    #[error("{}", devx_cmd_text(*opcode, *status, *syndrome, *detail, via.as_ref()))]
    DevxCmd {
        /// The command's opcode (`mbox_in.opcode`).
        opcode: u16,
        /// `mbox_out.status` (`prm::cmd::status`).
        status: u8,
        /// `mbox_out.syndrome`.
        syndrome: u32,
        /// What the syndrome means, where the NIC documents it.
        detail: Option<&'static str>,
        /// The rdma-core call that sent the command (`mlx5dv_devx_obj_create`, ...) and the `errno` it left
        /// (the kernel's EREMOTEIO or EIO when the firmware refused); `None` for the emulated NIC, which takes
        /// the mailbox itself.
        via: Option<(String, i32)>,
    },
    /// Ranks could not find each other, or a peer broke the bootstrap protocol; the message names the rank,
    /// the address and what was wrong.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
}

/// The text of [`Error::DevxCmd`]: `CREATE_QP failed: status BAD_RES (0x5), syndrome 0x40006 (cqn_snd names no
/// CQ)`, prefixed on a ConnectX with the call and followed by its errno (`mlx5dv_devx_obj_create: CREATE_QP
/// failed: status BAD_PARAM (0x3), syndrome 0x1234 (errno 121: Remote I/O error)`).
fn devx_cmd_text(opcode: u16, status: u8, syndrome: u32, detail: Option<&str>, via: Option<&(String, i32)>) -> String {
    use gdaki_shared::prm::cmd;
    let command = cmd::opcode::name(opcode).map_or_else(|| format!("command {opcode:#x}"), str::to_string);
    let status = cmd::status::name(status).map_or_else(|| format!("{status:#x}"), |n| format!("{n} ({status:#x})"));
    let text = match detail {
        Some(d) => format!("{command} failed: status {status}, syndrome {syndrome:#x} ({d})"),
        None => format!("{command} failed: status {status}, syndrome {syndrome:#x}"),
    };
    match via {
        Some((call, errno)) => {
            format!("{call}: {text} (errno {errno}: {})", std::io::Error::from_raw_os_error(*errno))
        }
        None => text,
    }
}

/// What the emulated NIC could not do (inside [`Error::Emu`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmuError {
    /// A number space or table of the NIC is full; the value names it ("PD numbers", "MR keys", ...).
    #[error("out of {0}")]
    Exhausted(&'static str),
    /// An operating-system call failed: starting a thread, binding the wire's listener, the random source.
    #[error("{what}: {source}")]
    Os {
        /// What it was for, e.g. `cannot listen on 127.0.0.1:29510 for the wire`.
        what: String,
        /// The OS's error.
        source: std::io::Error,
    },
    /// The NIC's executor thread is gone (it panicked: a bug of the emulator, logged when it happened).
    #[error("the executor thread is gone")]
    NoExecutor,
    /// The executor thread did not acknowledge a QP's removal within this time (a QP's drop waits for it, so
    /// that the QP's queue memory is freed by the dropping thread); it may free that memory itself.
    #[error("the executor did not acknowledge a QP's removal within {0:?}; it may free the QP's queue memory")]
    Unresponsive(std::time::Duration),
}

impl EmuError {
    /// An [`EmuError::Os`] for `what`.
    pub(crate) fn os(what: impl Into<String>, source: impl Into<std::io::Error>) -> Error {
        Error::Emu(EmuError::Os { what: what.into(), source: source.into() })
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
