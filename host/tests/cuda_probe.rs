//! Which CUDA calls wait for a kernel that spins (docs/guide.md, "GPU hazards"). Prints a table; run on the GPU machine
//! with `--ignored --nocapture`. Asserts only what the emulated NIC relies on: copier copies do not wait.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use gdaki::cuda::{Gpu, LaunchConfig};
use gdaki::mem::{GpuCopier, MappedBuf, MemKind, MemLoc};

const SPIN_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64
.visible .entry gdaki_probe_spin(.param .u64 flag_ptr)
{
    .reg .u64 %rd<3>;
    .reg .u32 %r<2>;
    .reg .pred %p;
    ld.param.u64 %rd1, [flag_ptr];
    cvta.to.global.u64 %rd2, %rd1;
SPIN:
    ld.volatile.global.u32 %r1, [%rd2];
    setp.eq.u32 %p, %r1, 0;
    @%p bra SPIN;
    ret;
}
"#;

fn flag(buf: &MappedBuf) -> &AtomicU32 {
    // SAFETY: the buffer is page aligned, at least 4 bytes, and lives as long as the borrow.
    unsafe { &*buf.host_ptr().cast::<AtomicU32>() }
}

/// Runs `op` on another thread while a kernel spins; returns whether it finished within 1 s (before the
/// kernel was released) and how long it took in all.
fn probe(gpu: &Arc<Gpu>, op: impl FnOnce() + Send) -> (bool, Duration) {
    let buf = gpu.alloc_mapped(4096).unwrap();
    let spin = gpu.kernel(SPIN_PTX, "gdaki_probe_spin").unwrap();
    let stream = gpu.new_stream().unwrap();
    // SAFETY: the flag lives in `buf` until the kernel ends (released and waited for below).
    unsafe { spin.launch(&stream, &LaunchConfig::linear(1, 1), &[buf.device_addr().into()]) }.unwrap();
    std::thread::sleep(Duration::from_millis(10));
    let start = Instant::now();
    let (tx, rx) = mpsc::channel();
    let before = std::thread::scope(|s| {
        s.spawn(move || {
            op();
            let _ = tx.send(());
        });
        let before = rx.recv_timeout(Duration::from_secs(1)).is_ok();
        flag(&buf).store(1, Ordering::Release);
        before
    });
    stream.wait(Duration::from_secs(10)).unwrap();
    (before, start.elapsed())
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn which_calls_wait_for_a_spinning_kernel() {
    let gpu = Gpu::open(0).unwrap();
    let n = 1 << 20;
    let pinned = gpu.alloc_mapped(n).unwrap();
    let dev = gpu.alloc_device(n).unwrap();
    let copier = gpu.copier().unwrap();
    let host = |p: *const u8| MemLoc { kind: MemKind::Host, addr: p as u64 };
    let mut rows: Vec<(&str, bool, Duration)> = Vec::new();
    let mut run = |name: &'static str, op: &mut (dyn FnMut() + Send)| {
        let (before, took) = probe(&gpu, op);
        rows.push((name, before, took));
    };
    run("copier HtoD+DtoH pinned + synchronize", &mut || {
        // SAFETY: both buffers outlive the synchronize.
        unsafe {
            copier.copy_async(dev.loc(), host(pinned.host_ptr()), n).unwrap();
            copier.copy_async(host(pinned.host_ptr()), dev.loc(), n).unwrap();
        }
        copier.synchronize().unwrap();
    });
    run("copier HtoD+DtoH pageable + synchronize", &mut || {
        let mut v = vec![1u8; n];
        // SAFETY: `v` and `dev` outlive the synchronize.
        unsafe {
            copier.copy_async(dev.loc(), host(v.as_ptr()), n).unwrap();
            copier.copy_async(host(v.as_mut_ptr()), dev.loc(), n).unwrap();
        }
        copier.synchronize().unwrap();
    });
    run("DeviceBuffer::copy_from_host/to_host", &mut || {
        dev.copy_from_host(0, &[7u8; 4096]).unwrap();
        dev.to_vec().unwrap();
    });
    run("alloc_device (cuMemAlloc + memset)", &mut || std::mem::forget(gpu.alloc_device(4096).unwrap()));
    let spare = std::sync::Mutex::new(Some(gpu.alloc_device(4096).unwrap()));
    run("drop DeviceBuffer (cuMemFree)", &mut || drop(spare.lock().unwrap().take()));
    run("alloc_mapped (cuMemHostAlloc)", &mut || std::mem::forget(gpu.alloc_mapped(4096).unwrap()));
    let spare_pinned = std::sync::Mutex::new(Some(gpu.alloc_mapped(4096).unwrap()));
    run("drop MappedBuf (cuMemFreeHost)", &mut || drop(spare_pinned.lock().unwrap().take()));
    run("new_stream + drop (cuStreamCreate/Destroy)", &mut || drop(gpu.new_stream().unwrap()));
    run("load_module (new PTX, cuModuleLoadDataEx)", &mut || {
        gpu.load_module(&format!("{SPIN_PTX}\n// another module\n")).unwrap();
    });
    println!("\n| call made while a kernel spins | done before release | total ms |\n|---|---|---|");
    for (name, before, took) in &rows {
        println!("| {name} | {} | {:.1} |", if *before { "yes" } else { "NO (waited)" }, took.as_secs_f64() * 1e3);
    }
    assert!(rows[0].1 && rows[1].1, "copier copies waited for a spinning kernel");
}
