//! `#[kernel]` on the host: the function stays callable, the descriptor names its entry, and the `cpu`
//! launcher runs it with the launch's shape, its pointer and value parameters, and its error report.

use std::sync::atomic::{AtomicU64, Ordering};

use gdaki_device::launch::{run_on_host, DevPtr};
use gdaki_device::{kernel, Dim3, Error, Thread};
use gdaki_shared::handle::ErrorReport;

/// Adds `add` and the thread's global id to `*sum`; the thread whose id is `fail_at` fails with a timeout.
#[kernel]
pub fn accumulate(t: &Thread, sum: &AtomicU64, add: u64, fail_at: u64) -> Result<(), Error> {
    sum.fetch_add(t.global_id() + add, Ordering::Relaxed);
    t.sync_threads();
    if t.global_id() == fail_at {
        return Err(Error::Timeout(gdaki_device::error::Timeout {
            on: gdaki_device::error::WaitOn::Cqe { qpn: 0x42, wqe_index: 7 },
            waited_ns: 5,
        }));
    }
    Ok(())
}

/// Writes its block index to `out[block]` from thread 0 (a raw pointer parameter).
#[kernel]
pub fn blocks(t: &Thread, out: *mut u64) {
    if t.tid() == 0 {
        // SAFETY: the test passes room for one word per block.
        unsafe { out.add(t.block() as usize).write_volatile(t.block() + 100) };
    }
}

#[test]
fn the_descriptor_names_the_entry_and_runs_the_function_on_host_threads() {
    assert_eq!((ACCUMULATE.name, BLOCKS.name), ("accumulate", "blocks"));
    let sum = AtomicU64::new(0);
    let mut report = ErrorReport::default();
    let args = (DevPtr::new(&sum as *const _ as u64), 10, u64::MAX);
    // SAFETY: `sum` and `report` outlive the launch.
    unsafe { run_on_host(&ACCUMULATE, Dim3::x(2), Dim3::new(8, 2, 1), args, &mut report as *mut _ as u64) }.unwrap();
    assert_eq!(sum.load(Ordering::Relaxed), (0..32).sum::<u64>() + 32 * 10);
    assert_eq!(report.kind, 0);
    // SAFETY: as above.
    unsafe { run_on_host(&ACCUMULATE, Dim3::x(2), Dim3::x(4), (args.0, 0, 5), &mut report as *mut _ as u64) }.unwrap();
    assert_eq!(
        Error::from_report(&report),
        Some(Error::Timeout(gdaki_device::error::Timeout {
            on: gdaki_device::error::WaitOn::Cqe { qpn: 0x42, wqe_index: 7 },
            waited_ns: 5
        }))
    );
    let mut out = [0u64; 3];
    // SAFETY: `out` has a word per block.
    unsafe { run_on_host(&BLOCKS, Dim3::x(3), Dim3::x(32), (DevPtr::new(out.as_mut_ptr() as u64),), 0) }.unwrap();
    assert_eq!(out, [100, 101, 102]);
    // The function is still an ordinary function.
    let _: fn(&Thread, &AtomicU64, u64, u64) -> Result<(), Error> = accumulate;
}
