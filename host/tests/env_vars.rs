//! The environment variables the library reads, set to what a careless shell leaves in them: those that place
//! the NICs' queues (`GDAKI_QUEUES`, `GDAKI_MLX5_QUEUES`) and the launchers' (`RANK`, `GDAKI_SECRET`, ...). A
//! test binary of its own: it sets the process's environment, which other tests would read. Each test here sets
//! variables no other test of this binary reads.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use gdaki::bootstrap::{Launch, LaunchFlags};
use gdaki::exec::Executor;
use gdaki::mem::MemKind;
use gdaki::nic::emu::{EmuConfig, QUEUES_ENV};
use gdaki::nic::mlx5::path::{PathRequest, PATH_ENV};
use gdaki::nic::{Nic, NicSpec};
use gdaki::Error;

/// A value that is not UTF-8: `gpu` with a stray Latin-1 byte, as a shell in another locale may leave it.
fn not_utf8() -> &'static OsStr {
    OsStr::from_bytes(b"gpu\xe9")
}

/// Asserts that `r` is an `InvalidArgument` of one line naming `var`.
fn refused<T: std::fmt::Debug>(r: gdaki::Result<T>, var: &str) {
    match r {
        Err(e @ Error::InvalidArgument(_)) => {
            let m = e.to_string();
            assert!(m.contains(var) && !m.contains('\n'), "{m:?}");
        }
        other => panic!("{var} not UTF-8: expected InvalidArgument naming it, got {other:?}"),
    }
}

/// A value that is not UTF-8 is a value other than the ones the variables take: refused with the variable
/// named, as a misspelled one is, not taken for an unset variable (which would place the queues by default,
/// unlike what was asked).
#[test]
fn queue_variables_that_are_not_utf8_are_refused_not_ignored() {
    std::env::set_var(QUEUES_ENV, not_utf8());
    refused(EmuConfig::host_or_env(), QUEUES_ENV);
    refused(Nic::open(&NicSpec::Emu, &Executor::Cpu, None), QUEUES_ENV);
    std::env::set_var(QUEUES_ENV, "gpu");
    assert_eq!(EmuConfig::host_or_env().unwrap().queues, MemKind::Gpu, "a good value still works");
    std::env::remove_var(QUEUES_ENV);
    assert_eq!(EmuConfig::host_or_env().unwrap().queues, MemKind::Host, "unset: the cpu executor's default");

    std::env::set_var(PATH_ENV, not_utf8());
    refused(PathRequest::from_env(), PATH_ENV);
    std::env::set_var(PATH_ENV, "verbs");
    assert_eq!(PathRequest::from_env().unwrap(), PathRequest::Verbs);
    std::env::remove_var(PATH_ENV);
    assert_eq!(PathRequest::from_env().unwrap(), PathRequest::Auto);
}

/// Every variable `Launch::resolve_from_process_env` reads: the launchers' rank, size and local rank, the
/// root's address, the secret.
const LAUNCH_VARS: [&str; 17] = [
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "GDAKI_BOOTSTRAP",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GDAKI_SECRET",
    "GDAKI_SECRET_FILE",
];

/// Asserts that `r` is a bootstrap error of one line naming `var` as not UTF-8.
fn bootstrap_refused(r: gdaki::Result<Option<Launch>>, var: &str) {
    match r {
        Err(e @ Error::Bootstrap(_)) => {
            let m = e.to_string();
            assert!(m.contains(var) && m.contains("UTF-8") && !m.contains('\n'), "{m:?}");
        }
        other => panic!("{var} not UTF-8: expected a bootstrap error naming it, got {other:?}"),
    }
}

/// A launcher's variable that is not UTF-8 is named as such, not taken for an unset one: that would blame
/// another variable (`RANK is set but WORLD_SIZE is not`), ask for a secret that was given, or quietly fall
/// back to the secret derived from a loopback root.
#[test]
fn launch_variables_that_are_not_utf8_are_named() {
    let resolve = || Launch::resolve_from_process_env(LaunchFlags::default());
    // Whatever launched the tests (a CI job under Slurm or mpirun, a torchrun shell) leaves none of its own: the
    // expectations below are for these variables alone.
    for v in LAUNCH_VARS {
        std::env::remove_var(v);
    }
    std::env::set_var("RANK", "0");
    std::env::set_var("WORLD_SIZE", OsStr::from_bytes(b"2\xff"));
    bootstrap_refused(resolve(), "WORLD_SIZE");
    std::env::set_var("WORLD_SIZE", "2");
    let ok = resolve().unwrap().expect("a torchrun launch");
    assert_eq!((ok.rank, ok.world_size, ok.source), (0, 2, "torchrun"));

    std::env::set_var("GDAKI_SECRET", OsStr::from_bytes(b"00112233445566778899aabbccddeef\xff"));
    bootstrap_refused(resolve(), "GDAKI_SECRET");
    std::env::set_var("GDAKI_BOOTSTRAP", "10.0.0.1:29500");
    bootstrap_refused(resolve(), "GDAKI_SECRET");
    // Flags that override the variable leave it unread.
    let flags = LaunchFlags { secret: Some("00112233445566778899aabbccddeeff".into()), ..LaunchFlags::default() };
    assert_eq!(Launch::resolve_from_process_env(flags).unwrap().unwrap().root, "10.0.0.1:29500");
    for v in ["RANK", "WORLD_SIZE", "GDAKI_SECRET", "GDAKI_BOOTSTRAP"] {
        std::env::remove_var(v);
    }
    assert_eq!(resolve().unwrap(), None, "nothing set: one process");
}
