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
    /// A CUDA driver call failed.
    #[error("CUDA: {0}")]
    Cuda(String),
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
    /// The emulated NIC rejected a request or failed.
    #[error("emulated NIC: {0}")]
    Emu(String),
    /// An rdma-core call (verbs or mlx5dv) of the mlx5 backend failed: the call (with the step it served, e.g.
    /// `ibv_modify_qp(INIT→RTR)`) and the errno it left.
    #[error("{call}: {}", std::io::Error::from_raw_os_error(*errno))]
    Verbs {
        /// The C call, and what for.
        call: String,
        /// `errno` after the call (or the negative return value of calls that return one, negated).
        errno: i32,
    },
    /// Ranks could not find each other, or a peer broke the bootstrap protocol; the message names the rank,
    /// the address and what was wrong.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
