//! Which CUDA calls wait for a kernel that spins (docs/guide.md, "GPU hazards"). Prints a table; run on the GPU machine
//! with `--ignored --nocapture`. Asserts only what the emulated NIC relies on: copier copies do not wait.
//!
//! `cuda_ipc_calls_while_a_kernel_spins` asks the same of CUDA IPC (`cuIpcGetMemHandle` in one process,
//! `cuIpcOpenMemHandle`, a copy out of the peer's memory and `cuIpcCloseMemHandle` in another, each while a
//! kernel of that process spins) and times a copy through the mapping against a copy inside one process: the
//! facts a same-host path of the wire would rest on (the NIC's thread would make these calls while users'
//! kernels wait for it).

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
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

/// The child's environment variable: the exporter's handle, as hex.
const IPC_CHILD: &str = "GDAKI_PROBE_IPC_HANDLE";

/// Bytes of the exported buffer: large enough to time a copy of it.
const IPC_BYTES: usize = 256 << 20;

fn hex(h: &sys::CUipcMemHandle) -> String {
    h.reserved.iter().map(|b| format!("{:02x}", *b as u8)).collect()
}

fn unhex(s: &str) -> sys::CUipcMemHandle {
    let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
    for (i, b) in h.reserved.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap() as std::ffi::c_char;
    }
    h
}

fn row(name: &str, before: bool, took: Duration) {
    println!("| {name} | {} | {:.1} |", if before { "yes" } else { "NO (waited)" }, took.as_secs_f64() * 1e3);
}

/// GB/s of `reps` copies of `n` bytes from `src` to `dst` through `copier`, waited for once.
fn copy_rate(copier: &gdaki::cuda::CudaCopier, dst: MemLoc, src: MemLoc, n: usize, reps: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..reps {
        // SAFETY: both ranges are `n` bytes of live GPU memory until the synchronize below.
        unsafe { copier.copy_async(dst, src, n) }.unwrap();
    }
    copier.synchronize().unwrap();
    (n as f64 * reps as f64) / t.elapsed().as_secs_f64() / 1e9
}

/// The importing process: opens the handle, copies out of the mapping, closes it, each while a kernel spins.
fn ipc_child(handle: &str) {
    // The harness's "test ... " has no line end yet: the first row starts a line of its own.
    println!();
    let gpu = Gpu::open(0).unwrap();
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let handle = unhex(handle);
    let mut peer: sys::CUdeviceptr = 0;
    let (before, took) = probe(&gpu, || {
        ctx.bind_to_thread().unwrap();
        // SAFETY: the handle came from the parent's `cuIpcGetMemHandle`; the call writes one pointer.
        let r = unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut peer,
                handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuIpcOpenMemHandle");
    });
    row("cuIpcOpenMemHandle (importer)", before, took);
    let mine = gpu.alloc_device(IPC_BYTES).unwrap();
    let copier = gpu.copier().unwrap();
    let from_peer = MemLoc { kind: MemKind::Gpu, addr: peer };
    let (before, took) = probe(&gpu, || {
        // SAFETY: the mapping and `mine` hold IPC_BYTES bytes until the synchronize.
        unsafe { copier.copy_async(mine.loc(), from_peer, IPC_BYTES) }.unwrap();
        copier.synchronize().unwrap();
    });
    row("copier copy out of the mapping + synchronize (importer)", before, took);
    let got = mine.to_vec().unwrap();
    let bad = got.iter().enumerate().filter(|(i, b)| **b != (*i as u32 % 251) as u8).count();
    println!("| bytes differing from the exporter's pattern | {bad} | |");
    let local = gpu.alloc_device(IPC_BYTES).unwrap();
    let reps = 8;
    let ipc = copy_rate(&copier, mine.loc(), from_peer, IPC_BYTES, reps);
    let d2d = copy_rate(&copier, mine.loc(), local.loc(), IPC_BYTES, reps);
    println!("| copy rate, GB/s: from the peer's mapping {ipc:.1}, inside this process {d2d:.1} | | |");
    let (before, took) = probe(&gpu, || {
        ctx.bind_to_thread().unwrap();
        // SAFETY: `peer` came from `cuIpcOpenMemHandle` and every copy out of it was waited for.
        let r = unsafe { sys::cuIpcCloseMemHandle(peer) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuIpcCloseMemHandle");
    });
    row("cuIpcCloseMemHandle (importer)", before, took);
    assert_eq!(bad, 0, "the copy through the mapping differs from the exporter's bytes");
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn cuda_ipc_calls_while_a_kernel_spins() {
    if let Ok(h) = std::env::var(IPC_CHILD) {
        return ipc_child(&h);
    }
    let gpu = Gpu::open(0).unwrap();
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let buf = gpu.alloc_device(IPC_BYTES).unwrap();
    let pattern: Vec<u8> = (0..IPC_BYTES).map(|i| (i as u32 % 251) as u8).collect();
    buf.copy_from_host(0, &pattern).unwrap();
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    let (before, took) = probe(&gpu, || {
        ctx.bind_to_thread().unwrap();
        // SAFETY: `buf` is a live `cuMemAlloc` allocation; the call writes the 64-byte handle.
        let r = unsafe { sys::cuIpcGetMemHandle(&mut handle, buf.device_addr()) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuIpcGetMemHandle");
    });
    println!("\n| CUDA IPC call made while a kernel spins | done before release | total ms |\n|---|---|---|");
    row("cuIpcGetMemHandle (exporter)", before, took);
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "cuda_ipc_calls_while_a_kernel_spins", "--ignored", "--nocapture", "--test-threads=1"])
        .env(IPC_CHILD, hex(&handle))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for l in text.lines().filter(|l| l.starts_with('|')) {
        println!("{l}");
    }
    assert!(out.status.success(), "the importing process failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    drop(buf);
}
