//! The environment variables that place the NICs' queues (`GDAKI_QUEUES`, `GDAKI_MLX5_QUEUES`), set to what a
//! careless shell leaves in them. A test binary of its own: it sets the process's environment, which other
//! tests of the same binary would read.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

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
