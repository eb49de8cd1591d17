//! The CUDA layer (`gdaki::cuda`). Without a GPU only the first two tests run; the others are ignored and run
//! on the GPU machine with `--ignored` (build here with `cargo test --no-run`, carry the test binary).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gdaki::cuda::{Gpu, KernelArg, LaunchConfig};
use gdaki::mem::{GpuCopier, MappedBuf, MemKind, MemLoc, QueueMemory};
use gdaki::Error;

/// Kernels for these tests, written by hand so that they do not depend on the device crate's PTX build.
/// Pointers are generic addresses (mapped pinned memory or `cuMemAlloc` memory), converted to global.
const TEST_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

// *out = *in + 1 (u32)
.visible .entry gdaki_test_echo(.param .u64 in_ptr, .param .u64 out_ptr)
{
    .reg .u64 %rd<5>;
    .reg .u32 %r<3>;
    ld.param.u64 %rd1, [in_ptr];
    ld.param.u64 %rd2, [out_ptr];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    ld.volatile.global.u32 %r1, [%rd3];
    add.u32 %r2, %r1, 1;
    st.volatile.global.u32 [%rd4], %r2;
    membar.sys;
    ret;
}

// spins until *flag != 0, then *ack = *flag (u32)
.visible .entry gdaki_test_spin(.param .u64 flag_ptr, .param .u64 ack_ptr)
{
    .reg .u64 %rd<5>;
    .reg .u32 %r<2>;
    .reg .pred %p;
    ld.param.u64 %rd1, [flag_ptr];
    ld.param.u64 %rd2, [ack_ptr];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
SPIN:
    ld.volatile.global.u32 %r1, [%rd3];
    setp.eq.u32 %p, %r1, 0;
    @%p bra SPIN;
    st.volatile.global.u32 [%rd4], %r1;
    membar.sys;
    ret;
}

// *out = a + pair.x + pair.y (u64), with a u32, pair a 16-byte struct by value
.visible .entry gdaki_test_args(.param .u32 a, .param .align 8 .b8 pair[16], .param .u64 out_ptr)
{
    .reg .u64 %rd<7>;
    .reg .u32 %r<2>;
    ld.param.u32 %r1, [a];
    ld.param.u64 %rd1, [pair];
    ld.param.u64 %rd2, [pair+8];
    ld.param.u64 %rd3, [out_ptr];
    cvta.to.global.u64 %rd4, %rd3;
    cvt.u64.u32 %rd5, %r1;
    add.u64 %rd6, %rd5, %rd1;
    add.u64 %rd6, %rd6, %rd2;
    st.volatile.global.u64 [%rd4], %rd6;
    membar.sys;
    ret;
}
"#;

const LIMIT: Duration = Duration::from_secs(10);

/// GPU tests run one at a time: a free (`cuMemFree`, `cuMemFreeHost`) or a module load in one test waits for a
/// kernel that spins in another (measured on the H200, see `cuda_probe.rs`), which would stall the test that
/// checks that copies do not wait for a spinning kernel.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn gpu() -> Arc<Gpu> {
    match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(e) => panic!("this test needs a GPU: {e}"),
    }
}

/// xorshift64* bytes: reproducible, different per seed.
fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

fn word(buf: &MappedBuf, index: usize) -> &AtomicU32 {
    assert!((index + 1) * 4 <= buf.len());
    // SAFETY: in bounds (checked), 4-aligned (the buffer is page aligned), and the mapped memory lives as long
    // as `buf`; device code and this thread share it only through atomic/volatile accesses.
    unsafe { &*buf.host_ptr().cast::<AtomicU32>().add(index) }
}

fn host_loc(ptr: *const u8) -> MemLoc {
    MemLoc { kind: MemKind::Host, addr: ptr as u64 }
}

#[test]
fn open_gives_a_gpu_or_one_line_unavailable() {
    let _serial = serial();
    for _ in 0..2 {
        match Gpu::open(0) {
            Ok(gpu) => {
                assert!(!gpu.name().is_empty());
                // nvidia-smi's form: 8 hex digits of domain, 2 of bus, 2 of device, function 0.
                let pci = gpu.pci_address();
                let hex = |s: &str, n: usize| s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit());
                let parts: Vec<&str> = pci.split([':', '.']).collect();
                assert!(
                    parts.len() == 4 && hex(parts[0], 8) && hex(parts[1], 2) && hex(parts[2], 2) && parts[3] == "0",
                    "{pci}"
                );
                assert!(Gpu::count().expect("a GPU was opened") >= 1);
            }
            Err(Error::Unavailable(msg)) => {
                eprintln!("Gpu::open(0): {msg}");
                assert!(matches!(Gpu::count(), Err(Error::Unavailable(_)) | Ok(0)), "{:?}", Gpu::count());
                assert!(!msg.is_empty() && !msg.contains('\n'), "not one line: {msg:?}");
                assert!(msg.starts_with("no "), "{msg}");
            }
            Err(e) => panic!("expected Ok or Unavailable, got {e:?}"),
        }
    }
}

#[test]
fn open_of_a_missing_ordinal_is_unavailable() {
    let _serial = serial();
    match Gpu::open(usize::MAX) {
        Err(Error::Unavailable(msg)) => {
            eprintln!("Gpu::open(usize::MAX): {msg}");
            assert!(!msg.contains('\n'), "{msg:?}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn mapped_memory_is_shared_between_host_and_kernel() {
    let _serial = serial();
    let gpu = gpu();
    let buf = gpu.alloc_mapped(8192 + 12).unwrap();
    let q = QueueMemory::alloc(&*gpu, 100).unwrap();
    for b in [&buf, &q] {
        assert_eq!(b.host_ptr() as usize % 4096, 0);
        assert_eq!(b.device_addr() % 4096, 0);
        // SAFETY: nothing else uses the fresh buffer.
        let bytes = unsafe { std::slice::from_raw_parts(b.host_ptr(), b.len()) };
        assert!(bytes.iter().all(|&x| x == 0), "not zeroed");
    }
    let kernel = gpu.kernel(TEST_PTX, "gdaki_test_echo").unwrap();
    let stream = gpu.new_stream().unwrap();
    for (i, value) in [41u32, 0xffff_fffe, 7].into_iter().enumerate() {
        word(&buf, 2 * i).store(value, Ordering::Release);
        let (inp, out) = (buf.device_addr() + 8 * i as u64, buf.device_addr() + 8 * i as u64 + 4);
        // SAFETY: both addresses are inside `buf`, alive until the wait below.
        unsafe { kernel.launch(&stream, &LaunchConfig::linear(1, 1), &[inp.into(), out.into()]) }.unwrap();
        stream.wait(LIMIT).unwrap();
        assert_eq!(word(&buf, 2 * i + 1).load(Ordering::Acquire), value.wrapping_add(1));
    }
    assert!(gpu.take_drop_error().is_none(), "a drop failed");
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn kernel_sees_host_store_while_it_runs() {
    let _serial = serial();
    let gpu = gpu();
    let buf = gpu.alloc_mapped(4096).unwrap();
    let kernel = gpu.kernel(TEST_PTX, "gdaki_test_spin").unwrap();
    let stream = gpu.new_stream().unwrap();
    let (flag, ack) = (buf.device_addr(), buf.device_addr() + 4);
    // SAFETY: both addresses are inside `buf`, alive until the kernel ends (waited for below).
    unsafe { kernel.launch(&stream, &LaunchConfig::linear(1, 1), &[flag.into(), ack.into()]) }.unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(!stream.is_idle().unwrap(), "kernel ended before the flag was set");
    word(&buf, 0).store(0x5eed, Ordering::Release);
    stream.wait(LIMIT).unwrap();
    assert_eq!(word(&buf, 1).load(Ordering::Acquire), 0x5eed);
    assert!(!gpu.is_hung());
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn device_buffer_round_trip() {
    let _serial = serial();
    let gpu = gpu();
    for (seed, n) in [(1u64, 1usize), (2, 4097), (3, (1 << 20) + 3)] {
        let buf = gpu.alloc_device(n).unwrap();
        assert_eq!(buf.len(), n);
        assert_eq!(buf.device_addr() % 256, 0);
        assert!(buf.to_vec().unwrap().iter().all(|&b| b == 0), "not zeroed");
        let data = random_bytes(seed, n);
        buf.copy_from_host(0, &data).unwrap();
        assert_eq!(buf.to_vec().unwrap(), data);
        // A partial copy at an offset.
        let part = random_bytes(seed + 100, n / 2);
        buf.copy_from_host(n - part.len(), &part).unwrap();
        let mut back = vec![0u8; part.len()];
        buf.copy_to_host(n - part.len(), &mut back).unwrap();
        assert_eq!(back, part);
        // Out of range is an error, not a fault.
        assert!(matches!(buf.copy_from_host(n, &[1]), Err(Error::InvalidArgument(_))));
        assert!(matches!(buf.copy_to_host(1, &mut vec![0; n]), Err(Error::InvalidArgument(_))));
    }
    let empty = gpu.alloc_device(0).unwrap();
    assert!(empty.is_empty() && empty.to_vec().unwrap().is_empty());
    assert!(gpu.take_drop_error().is_none(), "a drop failed");
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn copier_copies_htod_dtod_dtoh() {
    let _serial = serial();
    let gpu = gpu();
    let copier = gpu.copier().unwrap();
    let n = (1 << 20) + 13;
    let data = random_bytes(7, n);
    let pinned = gpu.alloc_mapped(n).unwrap();
    // SAFETY: nothing else uses the fresh buffer.
    unsafe { std::slice::from_raw_parts_mut(pinned.host_ptr(), n) }.copy_from_slice(&data);
    let (d1, d2) = (gpu.alloc_device(n).unwrap(), gpu.alloc_device(n).unwrap());
    let mut pageable = vec![0u8; n];
    let mut host_copy = vec![0u8; n];
    // SAFETY: every range is valid for `n` bytes and outlives the `synchronize` below.
    unsafe {
        copier.copy_async(d1.loc(), host_loc(pinned.host_ptr()), n).unwrap(); // HtoD from pinned
        copier.copy_async(d2.loc(), d1.loc(), n).unwrap(); // DtoD
        copier.copy_async(host_loc(pageable.as_mut_ptr()), d2.loc(), n).unwrap(); // DtoH to pageable
        copier.copy_async(host_loc(host_copy.as_mut_ptr()), host_loc(pinned.host_ptr()), n).unwrap(); // HtoH
        copier.copy_async(d1.loc(), d1.loc(), 0).unwrap(); // nothing
    }
    copier.synchronize().unwrap();
    assert_eq!(pageable, data);
    assert_eq!(host_copy, data);
    assert_eq!(d2.to_vec().unwrap(), data);
    // Pageable HtoD into the middle of d2, then DtoH into pinned memory.
    let part = random_bytes(8, 4096);
    // SAFETY: as above.
    unsafe {
        copier
            .copy_async(MemLoc { kind: MemKind::Gpu, addr: d2.device_addr() + 1000 }, host_loc(part.as_ptr()), 4096)
            .unwrap();
        copier
            .copy_async(host_loc(pinned.host_ptr()), MemLoc { kind: MemKind::Gpu, addr: d2.device_addr() + 1000 }, 4096)
            .unwrap();
    }
    copier.synchronize().unwrap();
    // SAFETY: the copies into `pinned` have completed.
    assert_eq!(unsafe { std::slice::from_raw_parts(pinned.host_ptr(), 4096) }, &part[..]);
    // SAFETY: a null address is rejected before any copy.
    let bad = unsafe { copier.copy_async(d1.loc(), host_loc(std::ptr::null()), 8) };
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    assert!(gpu.take_drop_error().is_none(), "a drop failed");
}

/// The hazard of docs/guide.md, "GPU hazards": copies made while a kernel spins must not wait for it.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn copier_does_not_wait_for_a_spinning_kernel() {
    let _serial = serial();
    let gpu = gpu();
    let flags = gpu.alloc_mapped(4096).unwrap();
    let n = 64 * 1024;
    let data = random_bytes(9, n);
    let dev = gpu.alloc_device(n).unwrap();
    let copier = gpu.copier().unwrap();
    let kernel = gpu.kernel(TEST_PTX, "gdaki_test_spin").unwrap();
    let stream = gpu.new_stream().unwrap();
    let (flag, ack) = (flags.device_addr(), flags.device_addr() + 4);
    // SAFETY: both addresses are inside `flags`, alive until the kernel ends (released and waited for below).
    unsafe { kernel.launch(&stream, &LaunchConfig::linear(1, 1), &[flag.into(), ack.into()]) }.unwrap();

    let (tx, rx) = mpsc::channel();
    let copies = std::thread::scope(|s| {
        s.spawn(|| {
            let mut back = vec![0u8; n];
            // SAFETY: `data`, `dev` and `back` outlive the `synchronize` below.
            let r = unsafe {
                copier
                    .copy_async(dev.loc(), host_loc(data.as_ptr()), n)
                    .and_then(|()| copier.copy_async(host_loc(back.as_mut_ptr()), dev.loc(), n))
            }
            .and_then(|()| copier.synchronize())
            .map(|()| back);
            let _ = tx.send(r);
        });
        let got = rx.recv_timeout(LIMIT);
        let ack_before_release = word(&flags, 1).load(Ordering::Acquire);
        // Release the kernel whatever happened, so that the scope can end.
        word(&flags, 0).store(1, Ordering::Release);
        (got, ack_before_release)
    });
    stream.wait(LIMIT).unwrap();
    let (got, ack_before_release) = copies;
    let back = got.expect("copies waited for the spinning kernel").unwrap();
    assert_eq!(back, data);
    assert_eq!(ack_before_release, 0, "the kernel ended before it was released");
    assert_eq!(word(&flags, 1).load(Ordering::Acquire), 1);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn launch_and_bounded_wait() {
    let _serial = serial();
    let gpu = gpu();
    let buf = gpu.alloc_mapped(4096).unwrap();
    let module = gpu.load_module(TEST_PTX).unwrap();
    assert!(Arc::ptr_eq(&module, &gpu.load_module(TEST_PTX).unwrap()), "PTX loaded twice");
    let stream = gpu.new_stream().unwrap();

    // Scalars and a struct by value.
    let args = module.kernel("gdaki_test_args").unwrap();
    eprintln!("{gpu:?}: gdaki_test_args params {:?}, {} registers", args.param_sizes(), args.num_regs().unwrap());
    if gpu.driver_version() >= (12, 4) {
        assert_eq!(args.param_sizes(), Some(&[4, 16, 8][..]), "cuFuncGetParamInfo should be there");
    }
    assert!(args.num_regs().unwrap() > 0);
    let pair: [u64; 2] = [1 << 40, 12345];
    let pair_bytes: Vec<u8> = pair.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let out = buf.device_addr() + 64;
    // SAFETY: `out` is inside `buf`, alive until the wait below.
    unsafe {
        args.launch(
            &stream,
            &LaunchConfig::linear(1, 32),
            &[KernelArg::U32(7), KernelArg::Bytes(&pair_bytes), out.into()],
        )
    }
    .unwrap();
    stream.wait(LIMIT).unwrap();
    // SAFETY: the kernel has completed; offset 64 is 8-aligned and inside `buf`.
    let got = unsafe { std::ptr::read_volatile(buf.host_ptr().add(64).cast::<u64>()) };
    assert_eq!(got, 7 + (1 << 40) + 12345);

    // A spinning kernel: the bounded wait times out with an error naming it, quickly.
    let spin = module.kernel("gdaki_test_spin").unwrap();
    let (flag, ack) = (buf.device_addr(), buf.device_addr() + 4);
    // SAFETY: both addresses are inside `buf`, alive until the kernel ends (released and waited for below).
    unsafe { spin.launch(&stream, &LaunchConfig::linear(1, 1), &[flag.into(), ack.into()]) }.unwrap();
    let start = Instant::now();
    match stream.wait(Duration::from_millis(200)) {
        Err(Error::Device(msg)) => assert!(msg.contains("gdaki_test_spin"), "{msg}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(gpu.is_hung());
    // The kernel ends once released; the wait then succeeds.
    word(&buf, 0).store(3, Ordering::Release);
    stream.wait(LIMIT).unwrap();
    assert_eq!(word(&buf, 1).load(Ordering::Acquire), 3);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn bad_launches_and_modules_are_errors() {
    let _serial = serial();
    let gpu = gpu();
    let stream = gpu.new_stream().unwrap();
    let echo = gpu.kernel(TEST_PTX, "gdaki_test_echo").unwrap();
    let buf = gpu.alloc_mapped(4096).unwrap();
    let a = buf.device_addr();
    // SAFETY: rejected before reaching the GPU (grid of 0 blocks).
    let zero_grid = unsafe { echo.launch(&stream, &LaunchConfig::linear(0, 1), &[a.into(), a.into()]) };
    assert!(matches!(zero_grid, Err(Error::InvalidArgument(_))), "{zero_grid:?}");
    if echo.param_sizes().is_some() {
        // SAFETY: rejected before reaching the GPU (parameter sizes differ).
        let missing = unsafe { echo.launch(&stream, &LaunchConfig::linear(1, 1), &[a.into()]) };
        assert!(matches!(missing, Err(Error::InvalidArgument(_))), "{missing:?}");
        // SAFETY: rejected before reaching the GPU (parameter sizes differ).
        let narrow = unsafe { echo.launch(&stream, &LaunchConfig::linear(1, 1), &[a.into(), KernelArg::U32(0)]) };
        assert!(matches!(narrow, Err(Error::InvalidArgument(_))), "{narrow:?}");
    }
    // SAFETY: as above: the driver rejects 2048 threads per block before running anything.
    let too_big = unsafe { echo.launch(&stream, &LaunchConfig::linear(1, 2048), &[a.into(), a.into()]) };
    assert!(matches!(too_big, Err(Error::Cuda { status: Some(_), .. })), "{too_big:?}");
    assert!(matches!(gpu.kernel(TEST_PTX, "no_such_kernel"), Err(Error::InvalidArgument(_))));
    match gpu.load_module(".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry broken() { bogus; }\n") {
        Err(Error::Cuda { message, status }) => {
            assert!(message.contains("cuModuleLoadDataEx"), "{message}");
            assert_eq!(status, Some(gdaki::cuda::CUresult::CUDA_ERROR_INVALID_PTX), "{message}");
        }
        other => panic!("expected a JIT error, got {other:?}"),
    }
    assert!(matches!(gpu.load_module("a\0b"), Err(Error::InvalidArgument(_))));
    stream.wait(LIMIT).unwrap();
}

fn gpu_loc(addr: u64) -> MemLoc {
    MemLoc { kind: MemKind::Gpu, addr }
}

/// The copier's two ways to GPU memory (engine commands for small operations, the copy-engine stream for
/// large copies) keep one order: each step below reads what the step before wrote, switching ways at every
/// step, at aligned and unaligned offsets and lengths (the engine's 16-byte, 8-byte and byte paths).
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn copier_keeps_one_order_across_the_engine_and_the_stream() {
    let _serial = serial();
    let gpu = gpu();
    let copier = gpu.copier().unwrap();
    let n = 1 << 20;
    let (a, b, c) = (gpu.alloc_device(n).unwrap(), gpu.alloc_device(n).unwrap(), gpu.alloc_device(n).unwrap());
    // Every shape several times over: the engine takes up to eight commands at once, so a switch between
    // the two ways lands at different places within its batches.
    let shapes = [(0usize, 64usize), (3, 13), (8, 200), (16, 4096 + 16), (5, 16 * 1024), (0, 300_000)];
    for (round, &(off, len)) in shapes.iter().cycle().take(6 * shapes.len()).enumerate() {
        let data = random_bytes(100 + round as u64, len);
        let small = random_bytes(200 + round as u64, 40);
        let mut back = vec![0u8; len];
        let mut tail = vec![0u8; 40];
        // SAFETY: every range is inside its buffer (1 MiB each) and outlives the synchronize below; no host
        // source is written by an earlier pending copy.
        unsafe {
            copier.copy_async(gpu_loc(a.device_addr() + off as u64), host_loc(data.as_ptr()), len).unwrap();
            // Small engine writes over the first 40 bytes of what was just uploaded.
            for (i, chunk) in small.chunks(16).enumerate() {
                copier.write_async(gpu_loc(a.device_addr() + (off + i * 16) as u64), chunk, false).unwrap();
            }
            // A large stream copy (or an engine copy for the short lengths) of the result, then its reverse way.
            copier.copy_async(gpu_loc(b.device_addr() + 1), gpu_loc(a.device_addr() + off as u64), len).unwrap();
            copier.copy_async(gpu_loc(c.device_addr() + off as u64), gpu_loc(b.device_addr() + 1), len).unwrap();
            copier.copy_async(host_loc(back.as_mut_ptr()), gpu_loc(c.device_addr() + off as u64), len).unwrap();
            copier.copy_async(host_loc(tail.as_mut_ptr()), gpu_loc(c.device_addr() + off as u64), 40).unwrap();
        }
        copier.synchronize().unwrap();
        let mut want = data.clone();
        let k = len.min(40);
        want[..k].copy_from_slice(&small[..k]);
        assert!(back == want, "round {round}: offset {off}, {len} bytes");
        assert_eq!(&tail[..k], &want[..k], "round {round}");
    }
    assert!(gpu.take_drop_error().is_none(), "a drop failed");
}

/// Operations tagged with a QP (`order_by`) keep their own QP's order across the engine and the stream while
/// two QPs' steps interleave: QP 2's long copy is enqueued between QP 1's copy and QP 1's atomic, and each
/// QP's atomic must still see its own copy, and its next copy the atomic's result. Untagged operations after
/// them (the read-back) follow everything.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn copier_keeps_each_qps_order_when_qps_interleave() {
    use gdaki::mem::AtomicOp;
    let _serial = serial();
    let gpu = gpu();
    let copier = gpu.copier().unwrap();
    let n = 300_000;
    let bufs: Vec<_> = (0..6).map(|_| gpu.alloc_device(n).unwrap()).collect();
    let olds = gpu.alloc_device(64).unwrap();
    for round in 0..8u64 {
        let data: Vec<Vec<u8>> = (0..2).map(|q| random_bytes(300 + 2 * round + q, n)).collect();
        let a = |q: usize| bufs[q].device_addr();
        let b = |q: usize| bufs[2 + q].device_addr();
        let c = |q: usize| bufs[4 + q].device_addr();
        let step = |q: usize, f: &dyn Fn()| {
            copier.order_by(Some(q as u32 + 1));
            f();
        };
        // SAFETY: every range is inside its buffer and outlives the synchronize below; the host sources are
        // taken when enqueued.
        unsafe {
            step(0, &|| copier.copy_async(gpu_loc(a(0)), host_loc(data[0].as_ptr()), n).unwrap());
            step(0, &|| copier.copy_async(gpu_loc(b(0)), gpu_loc(a(0)), n).unwrap());
            step(1, &|| copier.copy_async(gpu_loc(a(1)), host_loc(data[1].as_ptr()), n).unwrap());
            step(0, &|| {
                copier.atomic_async(gpu_loc(b(0)), AtomicOp::FetchAdd(5), gpu_loc(olds.device_addr())).unwrap()
            });
            step(1, &|| copier.copy_async(gpu_loc(b(1)), gpu_loc(a(1)), n).unwrap());
            step(0, &|| copier.copy_async(gpu_loc(c(0)), gpu_loc(b(0)), n).unwrap());
            step(1, &|| {
                copier.atomic_async(gpu_loc(b(1)), AtomicOp::FetchAdd(7), gpu_loc(olds.device_addr() + 8)).unwrap()
            });
            step(1, &|| copier.copy_async(gpu_loc(c(1)), gpu_loc(b(1)), n).unwrap());
        }
        copier.order_by(None);
        let mut back = vec![vec![0u8; n]; 2];
        let mut old = [0u8; 16];
        // SAFETY: as above; untagged, so after every operation enqueued before.
        unsafe {
            for (q, out) in back.iter_mut().enumerate() {
                copier.copy_async(host_loc(out.as_mut_ptr()), gpu_loc(c(q)), n).unwrap();
            }
            copier.copy_async(host_loc(old.as_mut_ptr()), gpu_loc(olds.device_addr()), 16).unwrap();
        }
        copier.synchronize().unwrap();
        for (q, add) in [(0usize, 5u64), (1, 7)] {
            let first = u64::from_ne_bytes(data[q][..8].try_into().unwrap());
            assert_eq!(u64::from_ne_bytes(old[8 * q..8 * q + 8].try_into().unwrap()), first, "round {round}, QP {q}");
            let mut want = data[q].clone();
            want[..8].copy_from_slice(&first.wrapping_add(add).to_ne_bytes());
            assert!(back[q] == want, "round {round}, QP {q}: the last copy missed the copy or the atomic before it");
        }
    }
    assert!(gpu.take_drop_error().is_none(), "a drop failed");
}

/// The copier reaches pinned host memory mapped into the GPU (`device_view`: the device address of the range,
/// here the same as the host address under unified addressing) and not pageable memory; fetch-adds on such a
/// word through the view are the GPU's, in order, and their old values land in pinned memory too.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn copier_runs_atomics_on_mapped_host_memory() {
    use gdaki::mem::AtomicOp;
    let _serial = serial();
    let gpu = gpu();
    let copier = gpu.copier().unwrap();
    let pinned = gpu.alloc_mapped(4096).unwrap();
    let pageable = vec![0u64; 512];
    assert_eq!(copier.device_view(pageable.as_ptr() as u64, 8), None, "pageable memory is not the GPU's");
    let host = pinned.host_ptr() as u64;
    let view = copier.device_view(host + 64, 8 * 101).expect("pinned mapped memory has a device view");
    assert_eq!(view, pinned.device_addr() + 64);
    assert_eq!(copier.device_view(host + 4000, 200), None, "a range past the allocation's end");
    let start = 0x0fed_cba9_8765_4321u64;
    // SAFETY: `pinned` is ours and not otherwise accessed until the synchronize.
    unsafe { (pinned.host_ptr().add(64) as *mut u64).write_volatile(start) };
    // SAFETY: the word and the results are inside `pinned` (4 KiB), alive until the synchronize below.
    unsafe {
        for i in 0..100u64 {
            copier.atomic_async(gpu_loc(view), AtomicOp::FetchAdd(i + 1), gpu_loc(view + 8 + 8 * i)).unwrap();
        }
    }
    copier.synchronize().unwrap();
    let read = |i: usize| {
        // SAFETY: inside `pinned`; the GPU's operations are complete.
        unsafe { (pinned.host_ptr().add(64 + 8 * i) as *const u64).read_volatile() }
    };
    let mut expect = start;
    for i in 0..100u64 {
        assert_eq!(read(1 + i as usize), expect, "old value of fetch-add {i}");
        expect = expect.wrapping_add(i + 1);
    }
    assert_eq!(read(0), expect, "the word after 100 fetch-adds");
}

/// Engine atomics: fetch-adds and compare-and-swaps on GPU memory, old values written to GPU memory (aligned
/// and not), each after the writes enqueued before it; a published write puts its last word after the rest.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn copier_atomics_and_published_writes() {
    use gdaki::mem::AtomicOp;
    let _serial = serial();
    let gpu = gpu();
    let copier = gpu.copier().unwrap();
    let dev = gpu.alloc_device(4096).unwrap();
    let (word, results) = (dev.device_addr(), dev.device_addr() + 1024);
    let start = 0x1234_5678_9abc_def0u64;
    let mut olds = vec![0u8; 8 * 100 + 1];
    // SAFETY: every address is inside `dev` (4 KiB) or `olds`, alive until the synchronize below.
    unsafe {
        copier.write_async(gpu_loc(word), &start.to_ne_bytes(), false).unwrap();
        for i in 0..100u64 {
            copier.atomic_async(gpu_loc(word), AtomicOp::FetchAdd(i), gpu_loc(results + 1 + 8 * i)).unwrap();
        }
        copier.copy_async(host_loc(olds.as_mut_ptr()), gpu_loc(results), olds.len()).unwrap();
    }
    copier.synchronize().unwrap();
    let mut expect = start;
    for i in 0..100u64 {
        let at = 1 + 8 * i as usize;
        assert_eq!(u64::from_ne_bytes(olds[at..at + 8].try_into().unwrap()), expect, "fetch-add {i}");
        expect = expect.wrapping_add(i);
    }
    let mut got = [0u8; 24];
    // SAFETY: as above.
    unsafe {
        let miss = AtomicOp::CompareSwap { compare: 1, swap: 2 };
        copier.atomic_async(gpu_loc(word), miss, gpu_loc(results)).unwrap();
        let hit = AtomicOp::CompareSwap { compare: expect, swap: 77 };
        copier.atomic_async(gpu_loc(word), hit, gpu_loc(results + 8)).unwrap();
        copier.copy_async(host_loc(got.as_mut_ptr()), gpu_loc(word), 8).unwrap();
        copier.copy_async(host_loc(got.as_mut_ptr().add(8)), gpu_loc(results), 16).unwrap();
    }
    copier.synchronize().unwrap();
    let w = |i: usize| u64::from_ne_bytes(got[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!((w(0), w(1), w(2)), (77, expect, expect));
    // A published 64-byte write, then its bytes read back.
    let cqe = random_bytes(5, 64);
    let mut seen = [0u8; 64];
    // SAFETY: as above.
    unsafe {
        copier.write_async(gpu_loc(dev.device_addr() + 2048), &cqe, true).unwrap();
        copier.copy_async(host_loc(seen.as_mut_ptr()), gpu_loc(dev.device_addr() + 2048), 64).unwrap();
    }
    copier.synchronize().unwrap();
    assert_eq!(&seen[..], &cqe[..]);
    // SAFETY: rejected before anything is enqueued.
    unsafe {
        assert!(matches!(copier.write_async(gpu_loc(word), &[0; 65], false), Err(Error::InvalidArgument(_))));
        assert!(matches!(copier.write_async(gpu_loc(word + 1), &[0; 16], true), Err(Error::InvalidArgument(_))));
        let bad = copier.atomic_async(gpu_loc(word + 4), AtomicOp::FetchAdd(1), gpu_loc(results));
        assert!(matches!(bad, Err(Error::InvalidArgument(_))));
    }
}

/// Engine writes given in batches of one to eight (each batch published at once: the engine takes a batch of up
/// to four from the slots it read with its count, a larger one after it), over more than four laps of its
/// 256-slot command ring, half of them with every bit set (so every word's bit 63, which the ring's lap tag
/// takes, is set) and half random, some published: every byte lands, the later write of a place last.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn copier_engine_batches_keep_every_bit_across_laps() {
    let _serial = serial();
    let gpu = gpu();
    let copier = gpu.copier().unwrap();
    const PLACES: usize = 1024;
    let dev = gpu.alloc_device(PLACES * 64).unwrap();
    let mut expect = vec![0u8; PLACES * 64];
    // One write and a wait first: the engine then runs, and the writes below go to it, not to the copy engines.
    // SAFETY: 8 bytes inside `dev`, alive until the synchronize.
    unsafe { copier.write_async(gpu_loc(dev.device_addr()), &[0; 8], false) }.unwrap();
    copier.synchronize().unwrap();
    let mut n = 0usize;
    while n < 5 * 256 {
        for batch in 1..=8 {
            for _ in 0..batch {
                let data = if n.is_multiple_of(2) { vec![0xff; 64] } else { random_bytes(n as u64, 64) };
                let at = (n * 7 % PLACES) * 64;
                // SAFETY: 64 bytes inside `dev`, alive until the synchronize below.
                unsafe { copier.write_async(gpu_loc(dev.device_addr() + at as u64), &data, n.is_multiple_of(3)) }
                    .unwrap();
                expect[at..at + 64].copy_from_slice(&data);
                n += 1;
            }
            copier.submit().unwrap();
        }
    }
    copier.synchronize().unwrap();
    let got = dev.to_vec().unwrap();
    let first_bad = got.chunks(64).zip(expect.chunks(64)).position(|(g, e)| g != e);
    assert_eq!(first_bad, None, "64-byte place {first_bad:?} differs after {n} writes");
}

/// The engine leaves the GPU after a few idle milliseconds, so that a call that waits for every running
/// kernel (`cuMemFree`) returns soon while the copier is open, and comes back for the next operation.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn copier_engine_leaves_when_idle_and_comes_back() {
    let _serial = serial();
    let gpu = gpu();
    let copier = gpu.copier().unwrap();
    let dev = gpu.alloc_device(4096).unwrap();
    for round in 0..3u8 {
        let mut back = [0u8; 16];
        // SAFETY: inside `dev`; `back` outlives the synchronize.
        unsafe {
            copier.write_async(dev.loc(), &[round; 16], false).unwrap();
            copier.copy_async(host_loc(back.as_mut_ptr()), dev.loc(), 16).unwrap();
        }
        copier.synchronize().unwrap();
        assert_eq!(back, [round; 16]);
        // The engine is still resident here: freeing GPU memory, and loading a module (a new one each
        // round), wait for it to leave, a few ms at most.
        let other = gpu.alloc_device(1 << 20).unwrap();
        let start = Instant::now();
        drop(other);
        let took = start.elapsed();
        assert!(took < Duration::from_millis(500), "cuMemFree took {took:?} with the copier open");
        // SAFETY: the same bytes as the copy above (the engine's write has been waited for).
        unsafe { copier.write_async(dev.loc(), &[round; 16], false) }.unwrap();
        let start = Instant::now();
        gpu.load_module(&format!("{TEST_PTX}\n// round {round}\n")).unwrap();
        let took = start.elapsed();
        assert!(took < Duration::from_millis(500), "a module load took {took:?} with the copier open");
        copier.synchronize().unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gpu.take_drop_error().is_none(), "a drop failed");
}

/// A grid that takes every SM and spins leaves the engine no room: the copier finds out within its short
/// wait for the engine to start and runs writes, copies and atomics on the copy engines instead, while the
/// grid still spins; once the grid ends the engine comes back.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn copier_works_when_kernels_take_every_sm() {
    use gdaki::mem::AtomicOp;
    let _serial = serial();
    let gpu = gpu();
    let copier = gpu.copier().unwrap();
    let flags = gpu.alloc_mapped(4096).unwrap();
    let dev = gpu.alloc_device(4096).unwrap();
    let spin = gpu.kernel(TEST_PTX, "gdaki_test_spin").unwrap();
    let stream = gpu.new_stream().unwrap();
    let (flag, ack) = (flags.device_addr(), flags.device_addr() + 4);
    // Far more 1024-thread blocks than fit at once: every SM is full of spinning threads.
    // SAFETY: both addresses are inside `flags`, alive until the kernel ends (released and waited for below).
    unsafe { spin.launch(&stream, &LaunchConfig::linear(4096, 1024), &[flag.into(), ack.into()]) }.unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let (word_at, result_at) = (gpu_loc(dev.device_addr() + 64), gpu_loc(dev.device_addr() + 128));
    let mut back = [0u8; 24];
    let start = Instant::now();
    // SAFETY: inside `dev`; `back` outlives the synchronize below.
    let r = unsafe {
        copier
            .write_async(dev.loc(), &[9; 8], false)
            .and_then(|()| copier.write_async(word_at, &40u64.to_ne_bytes(), false))
            .and_then(|()| copier.atomic_async(word_at, AtomicOp::FetchAdd(2), result_at))
            .and_then(|()| copier.copy_async(host_loc(back.as_mut_ptr()), dev.loc(), 8))
            .and_then(|()| copier.copy_async(host_loc(back.as_mut_ptr().add(8)), word_at, 8))
            .and_then(|()| copier.copy_async(host_loc(back.as_mut_ptr().add(16)), result_at, 8))
    }
    .and_then(|()| copier.synchronize());
    let took = start.elapsed();
    let still_spinning = word(&flags, 1).load(Ordering::Acquire) == 0;
    word(&flags, 0).store(1, Ordering::Release);
    r.unwrap();
    assert!(still_spinning, "the grid ended before the copier's work was done");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let w = |i: usize| u64::from_ne_bytes(back[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!((w(0), w(1), w(2)), (u64::from_ne_bytes([9; 8]), 42, 40));
    stream.wait(Duration::from_secs(30)).unwrap();
    // The engine comes back once the grid has ended.
    let mut again = [0u8; 8];
    // SAFETY: as above.
    unsafe {
        copier.write_async(dev.loc(), &[7; 8], false).unwrap();
        copier.copy_async(host_loc(again.as_mut_ptr()), dev.loc(), 8).unwrap();
    }
    copier.synchronize().unwrap();
    assert_eq!(again, [7; 8]);
}

/// A copier dropped while its engine runs: the drop lets the engine run what it was given, waits for it to
/// leave (bounded), and only then frees its memory.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn copier_dropped_while_its_engine_runs() {
    let _serial = serial();
    let gpu = gpu();
    let dev = gpu.alloc_device(4096).unwrap();
    let copier = gpu.copier().unwrap();
    for i in 0..2000u32 {
        let v = [(i % 251) as u8; 64];
        // SAFETY: inside `dev`, which outlives the copier.
        unsafe {
            copier.write_async(MemLoc { kind: MemKind::Gpu, addr: dev.device_addr() + 64 * (i % 64) as u64 }, &v, false)
        }
        .unwrap();
    }
    let start = Instant::now();
    drop(copier);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "the drop took {took:?}");
    // Every write ran before the engine left: slot k holds the last value written to it.
    let got = dev.to_vec().unwrap();
    for k in 0..64usize {
        let last = (0..2000u32).rev().find(|i| (i % 64) as usize == k).unwrap();
        assert!(got[64 * k..64 * k + 64].iter().all(|&b| b == (last % 251) as u8), "slot {k}");
    }
    assert!(gpu.take_drop_error().is_none(), "a drop failed");
}

/// The engine mirrors an SQ ring in GPU memory into host memory as its dbrec moves, without being asked:
/// random WQEBBs and a dbrec advanced past them (written through the copier, as device code would store them)
/// appear in the mirror, each with its own tag, and then its count, including a batch that wraps the ring and one longer than the ring
/// (only its last ring's worth is copied). A stopped mirror's slot serves the next one.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn copier_mirrors_sq_rings_as_their_dbrec_moves() {
    use gdaki::mem::{MirrorRead, SqWatch};
    let _serial = serial();
    let gpu = gpu();
    let copier = gpu.copier().unwrap();
    let wqebbs = 16u32;
    let ring = copier.alloc(wqebbs as usize * 64).unwrap();
    let dbrec = copier.alloc(64).unwrap();
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut pi = 0u64;
    for round in 0..2 {
        let m = copier
            .mirror_sq(SqWatch { ring: ring.addr(), wqebbs, dbrec: dbrec.addr() + 4, base: pi })
            .expect("a free mirror slot");
        for batch in [3u64, 13, 40] {
            let mut expect = vec![0u8; wqebbs as usize * 64];
            for idx in pi..pi + batch {
                let words: Vec<u8> = (0..8).flat_map(|_| next().to_ne_bytes()).collect();
                let off = (idx % u64::from(wqebbs)) as usize * 64;
                expect[off..off + 64].copy_from_slice(&words);
                // SAFETY: 64 bytes inside the ring, alive until the synchronize.
                unsafe { copier.write_async(gpu_loc(ring.addr() + off as u64), &words, false).unwrap() };
            }
            // As device code: the WQEs are in place before the dbrec (big-endian, low 16 bits of the count).
            copier.synchronize().unwrap();
            pi += batch;
            let word = ((pi & 0xffff) as u32).to_be_bytes();
            let mut dbrec_words = [0u8; 8];
            dbrec_words[4..].copy_from_slice(&word);
            // SAFETY: the dbrec's 8 bytes, alive until the synchronize.
            unsafe { copier.write_async(gpu_loc(dbrec.addr()), &dbrec_words, false).unwrap() };
            copier.synchronize().unwrap();
            // Every WQEBB the dbrec passed (the ring's last `wqebbs` at most) shows its own tag, then the count.
            let from = pi - batch.min(u64::from(wqebbs));
            let mut seen = vec![0u8; expect.len()];
            let t0 = std::time::Instant::now();
            loop {
                let r = m.read(from, pi, &mut seen);
                if r == MirrorRead::Done {
                    break;
                }
                assert!(t0.elapsed() < std::time::Duration::from_secs(1), "round {round}, batch of {batch}: {r:?}");
                std::hint::spin_loop();
            }
            for idx in from..pi {
                let off = (idx % u64::from(wqebbs)) as usize * 64;
                assert_eq!(seen[off..off + 64], expect[off..off + 64], "round {round}, WQEBB {idx}");
            }
            while m.count() < pi {
                assert!(t0.elapsed() < std::time::Duration::from_secs(1), "count {} of {pi}", m.count());
                std::hint::spin_loop();
            }
            assert_eq!(m.count(), pi, "round {round}, batch of {batch}");
            // The WQEBB after the last one rung is not in the mirror (its slot holds an older lap or nothing).
            assert_eq!(m.read(pi, pi + 1, &mut seen), MirrorRead::Behind(pi));
        }
        copier.unmirror_sq(m);
    }
}
