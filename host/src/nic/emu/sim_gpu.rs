//! [`SimGpu`]: GPU memory simulated in host memory, to run the emulated NIC's GPU-memory paths where there is
//! no GPU.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::mem::{check_atomic, check_write, AtomicOp, GpuCopier, GpuMem, HostQueueMemory, MappedBuf, MemKind, MemLoc};
use crate::mem::{PeerExport, PeerMapping, QueueMemory, SqMirror, SqWatch, EXPORT_HANDLE_BYTES, WRITE_ASYNC_MAX};
use crate::{EmuError, Result};

use super::guard::lock;
use super::hostmem;

/// A [`GpuCopier`] whose "GPU memory" is host memory: [`GpuCopier::alloc`] returns zeroed host memory, and
/// copies, writes and atomics run later, in the order they were enqueued, on a thread of its own, as the CUDA
/// copier runs them after the call has returned. [`GpuCopier::synchronize`] waits for every operation
/// enqueued before it.
///
/// It lets the `cpu` executor keep the emulated NIC's queues "in GPU memory" (`GDAKI_QUEUES=gpu`, see
/// [`EmuConfig::for_executor`](super::EmuConfig::for_executor)), so that the NIC reaches them only through
/// copies and the ordering of those copies is tested without a GPU. Device code on host threads still
/// reads and writes the same bytes directly, as device code on a GPU does. Every byte is moved with
/// atomic word accesses, so device threads that spin on it see no data race.
pub struct SimGpu {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
    /// Handles [`GpuCopier::import`] accepted, and the memory each names (see
    /// [`SimGpu::export`](GpuCopier::export)).
    imports: Mutex<HashMap<[u8; EXPORT_HANDLE_BYTES], PeerMapping>>,
}

/// First bytes of a simulated export handle; then the process id, the address, the length and a random word
/// (little-endian).
const SIM_EXPORT_TAG: &[u8; 16] = b"gdaki-sim-export";

/// The handles [`GpuCopier::export`] made in this process (any simulator's) and not withdrawn since
/// ([`GpuCopier::unexport`]), each with the count of copies out of it enqueued and not yet run:
/// [`GpuCopier::import`] takes no other, so a handle a peer made up (its address and length guessed) names
/// nothing; the random word in each makes them unguessable. A copy out of a handle is counted when it is
/// enqueued, only while the handle is exported, and the withdrawal waits for the count to drop to zero: a
/// handle's memory, which is the application's own, is never read once its MR's deregistration returned.
static SIM_EXPORTS: Mutex<Option<HashMap<[u8; EXPORT_HANDLE_BYTES], u32>>> = Mutex::new(None);

/// Signalled when a copy out of an exported handle has run ([`SIM_EXPORTS`]'s counts).
static SIM_EXPORT_COPIED: Condvar = Condvar::new();

/// How long a withdrawal waits for the copies out of its handle (the simulator's thread runs them without
/// ever blocking, so only a thread that died leaves one waiting).
const UNEXPORT_BOUND: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    /// Signalled when a copy is enqueued or the simulator stops (the worker waits on it).
    work: Condvar,
    /// Signalled when the worker finished an operation (synchronizers wait on it).
    done: Condvar,
}

/// One enqueued operation.
enum Op {
    Copy {
        dst: MemLoc,
        src: MemLoc,
        len: usize,
    },
    /// A copy out of a peer's mapping ([`GpuCopier::copy_from_peer_async`]): `src` lies in the memory the
    /// handle names, counted in [`SIM_EXPORTS`] until it has run.
    CopyFromPeer {
        dst: MemLoc,
        src: MemLoc,
        len: usize,
        handle: Box<[u8; EXPORT_HANDLE_BYTES]>,
    },
    /// A copy from host memory, its bytes taken when it was enqueued.
    Upload {
        dst: MemLoc,
        data: Vec<u8>,
    },
    Write {
        dst: MemLoc,
        data: [u8; WRITE_ASYNC_MAX],
        len: usize,
        publish: bool,
    },
    Atomic {
        at: MemLoc,
        op: AtomicOp,
        result: MemLoc,
    },
}

impl Op {
    /// Runs the operation.
    ///
    /// # Safety
    /// The contracts of [`GpuCopier::copy_async`], [`GpuCopier::write_async`] and [`GpuCopier::atomic_async`]
    /// (checked where they were enqueued): every range is valid until a synchronize returns, and none returns
    /// before this operation is counted.
    unsafe fn run(&self) {
        match *self {
            // SAFETY: the caller's contract.
            Op::Copy { dst, src, len } => unsafe { hostmem::copy(dst.addr, src.addr, len as u64) },
            Op::CopyFromPeer { dst, src, len, ref handle } => {
                // SAFETY: `dst` as the caller promises; the source is the exporter's memory, which its
                // application keeps until the MR's deregistration returns, and that waits for this copy
                // (counted in `SIM_EXPORTS` since it was enqueued, uncounted below).
                unsafe { hostmem::copy(dst.addr, src.addr, len as u64) };
                if let Some(n) = lock(&SIM_EXPORTS).as_mut().and_then(|e| e.get_mut(&**handle)) {
                    *n -= 1;
                }
                SIM_EXPORT_COPIED.notify_all();
            }
            // SAFETY: the caller's contract.
            Op::Upload { dst, ref data } => unsafe { hostmem::write(dst.addr, data) },
            Op::Write { dst, ref data, len, publish } => {
                let (body, last) = if publish { data[..len].split_at(len - 8) } else { (&data[..len], &[][..]) };
                // SAFETY: the caller's contract.
                unsafe { hostmem::write(dst.addr, body) };
                if publish {
                    let w = u64::from_ne_bytes(last.try_into().unwrap_or([0; 8]));
                    // SAFETY: the caller's contract; `write_async` checked that the last word is aligned.
                    unsafe { hostmem::atomic_u64(dst.addr + body.len() as u64) }.store(w, Ordering::Release);
                }
            }
            Op::Atomic { at, op, result } => {
                // Earlier operations' bytes are visible before the atomic, as on the GPU.
                fence(Ordering::Release);
                // SAFETY: the caller's contract; `atomic_async` checked alignment.
                let word = unsafe { hostmem::atomic_u64(at.addr) };
                let old = match op {
                    AtomicOp::FetchAdd(add) => word.fetch_add(add, Ordering::SeqCst),
                    AtomicOp::CompareSwap { compare, swap } => {
                        match word.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                            Ok(v) | Err(v) => v,
                        }
                    }
                };
                // SAFETY: the caller's contract.
                unsafe { hostmem::write(result.addr, &old.to_ne_bytes()) };
            }
        }
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Op>,
    /// Copies enqueued so far.
    enqueued: u64,
    /// Copies completed so far.
    completed: u64,
    stop: bool,
    /// SQ mirrors, by slot, when the simulator keeps them ([`SimGpu::with_sq_mirrors`]); `None`: it does not.
    mirrors: Option<Vec<Option<SimMirror>>>,
}

/// How often the simulator's thread looks at the mirrored dbrecs while it has nothing else to do.
const MIRROR_POLL: Duration = Duration::from_micros(200);

/// SQ mirrors one simulator keeps at most (as many as the CUDA engine's lanes).
const MIRROR_SLOTS: usize = 32;

/// One SQ mirror of the simulator: what the CUDA engine's lane keeps in registers, and the mirror's memory.
struct SimMirror {
    watch: SqWatch,
    /// The tagged copy of the ring, then the 64-bit count ([`SqMirror`]'s layout).
    buf: MappedBuf,
    /// Producer count copied so far.
    copied: u64,
}

impl SimMirror {
    /// Copies the WQEBBs the dbrec has passed since the last look (the ring's last `wqebbs` at most), then
    /// stores the new count, as the engine's lane does.
    fn advance(&mut self) {
        let w = self.watch;
        // SAFETY: the dbrec word is simulated GPU memory that its QP keeps alive until `unmirror_sq`, 4-byte
        // aligned; device code on host threads stores it atomically.
        let raw = unsafe { AtomicU32::from_ptr(w.dbrec as *mut u32) }.load(Ordering::Acquire);
        let delta = u64::from((u32::from_be(raw) as u16).wrapping_sub(self.copied as u16));
        if delta == 0 {
            return;
        }
        let end = self.copied + delta;
        let mask = u64::from(w.wqebbs) - 1;
        for idx in end - delta.min(mask + 1)..end {
            let off = (idx & mask) * 64;
            let mut wqebb = [0u8; 64];
            // SAFETY: 64 bytes inside the ring (`wqebbs` WQEBBs), alive as above, read with atomic word loads.
            unsafe { hostmem::read(w.ring + off, &mut wqebb) };
            for (k, word) in SqMirror::encode(idx, &wqebb).into_iter().enumerate() {
                self.word((idx & mask) as usize * 16 + k).store(word, Ordering::Relaxed);
            }
        }
        self.copied = end;
        self.count().store(end, Ordering::Relaxed);
    }

    /// Word `i` of the mirror's memory (its tagged copy, then the count).
    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i * 8 < self.buf.len());
        // SAFETY: an aligned word inside `buf` (checked above; the buffer is page aligned), accessed atomically.
        unsafe { AtomicU64::from_ptr(self.buf.host_ptr().add(i * 8).cast()) }
    }

    fn count(&self) -> &AtomicU64 {
        self.word(self.watch.wqebbs as usize * 16)
    }
}

impl Inner {
    fn synchronize(&self) {
        let mut s = lock(&self.state);
        let target = s.enqueued;
        while s.completed < target {
            s = self.done.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn run(&self) {
        let mut s = lock(&self.state);
        loop {
            for m in s.mirrors.iter_mut().flatten().flatten() {
                m.advance();
            }
            if let Some(op) = s.queue.pop_front() {
                drop(s);
                // SAFETY: the enqueuing call's contract: every range stays valid until a synchronize returns,
                // and no synchronize returns before this operation is counted below.
                unsafe { op.run() };
                s = lock(&self.state);
                s.completed += 1;
                self.done.notify_all();
            } else if s.stop {
                return;
            } else if s.mirrors.iter().flatten().any(Option::is_some) {
                s = self.work.wait_timeout(s, MIRROR_POLL).unwrap_or_else(|e| e.into_inner()).0;
            } else {
                s = self.work.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        }
    }
}

impl SimGpu {
    /// Starts the simulator's copy thread.
    ///
    /// # Errors
    /// [`Error::Emu`](crate::Error::Emu) when the thread cannot be started.
    pub fn new() -> Result<Self> {
        let inner = Arc::new(Inner::default());
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name("gdaki-sim-gpu".into())
            .spawn(move || worker.run())
            .map_err(|e| EmuError::os("starting the simulated GPU's copy thread", e))?;
        Ok(Self { inner, thread: Some(thread), imports: Mutex::default() })
    }

    /// A simulator that also keeps SQ mirrors ([`GpuCopier::mirror_sq`]): its thread copies the WQEBBs a
    /// mirrored ring's dbrec passed whenever it runs an operation, and every 200 µs while it has no other work
    /// (the NIC does not wait for the simulator's mirrors: doorbells take both ways, read from the mirror
    /// when it is ahead, and fetched).
    ///
    /// # Errors
    /// As [`SimGpu::new`].
    pub fn with_sq_mirrors() -> Result<Self> {
        let sim = Self::new()?;
        lock(&sim.inner.state).mirrors = Some((0..MIRROR_SLOTS).map(|_| None).collect());
        Ok(sim)
    }
}

impl std::fmt::Debug for SimGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimGpu").finish_non_exhaustive()
    }
}

impl Drop for SimGpu {
    fn drop(&mut self) {
        lock(&self.inner.state).stop = true;
        self.inner.work.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A simulated GPU allocation: freed only after every copy enqueued before its drop has run, as `cuMemFree`
/// waits for the device.
struct SimAlloc {
    buf: Option<MappedBuf>,
    inner: Arc<Inner>,
}

impl Drop for SimAlloc {
    fn drop(&mut self) {
        self.inner.synchronize();
        drop(self.buf.take());
    }
}

impl SimGpu {
    fn enqueue(&self, op: Op) {
        let mut s = lock(&self.inner.state);
        s.queue.push_back(op);
        s.enqueued += 1;
        self.inner.work.notify_one();
    }
}

impl GpuCopier for SimGpu {
    /// Enqueues the copy for the simulator's thread. Either side may be host or simulated GPU memory.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the bytes of an upload cannot be held.
    unsafe fn copy_async(&self, dst: MemLoc, src: MemLoc, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if src.kind == MemKind::Host && dst.kind == MemKind::Gpu {
            let mut data = hostmem::zeroed::<u8>(len)?;
            // SAFETY: `src` is valid for `len` bytes during this call (the caller's contract).
            unsafe { hostmem::read(src.addr, &mut data) };
            self.enqueue(Op::Upload { dst, data });
        } else {
            self.enqueue(Op::Copy { dst, src, len });
        }
        Ok(())
    }

    /// Enqueues the write, with the bytes copied now.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] as the trait says.
    unsafe fn write_async(&self, dst: MemLoc, data: &[u8], publish: bool) -> Result<()> {
        check_write(dst, data.len(), publish)?;
        let mut bytes = [0u8; WRITE_ASYNC_MAX];
        bytes[..data.len()].copy_from_slice(data);
        self.enqueue(Op::Write { dst, data: bytes, len: data.len(), publish });
        Ok(())
    }

    /// Enqueues the atomic; on the simulator's thread it is a SeqCst host atomic, so atomic towards device
    /// code on host threads too.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] as the trait says.
    unsafe fn atomic_async(&self, at: MemLoc, op: AtomicOp, result: MemLoc) -> Result<()> {
        check_atomic(at, result)?;
        self.enqueue(Op::Atomic { at, op, result });
        Ok(())
    }

    /// Waits until every operation enqueued so far has run.
    ///
    /// # Errors
    /// None.
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize();
        Ok(())
    }

    /// A slot of the simulator's mirrors (see [`SimGpu::with_sq_mirrors`]; `None` without them).
    fn mirror_sq(&self, sq: SqWatch) -> Option<SqMirror> {
        let mut s = lock(&self.inner.state);
        let slots = s.mirrors.as_mut()?;
        let slot = slots.iter().position(Option::is_none)?;
        let buf = HostQueueMemory.alloc(SqMirror::bytes(sq.wqebbs)).ok()?;
        let m = SimMirror { watch: sq, buf, copied: sq.base };
        m.count().store(sq.base, Ordering::Release);
        // SAFETY: the zeroed copy and the count live in `m.buf`, kept in the slot until `unmirror_sq` or the
        // simulator's drop, and written with atomic word stores only.
        let mirror = unsafe { SqMirror::new(slot as u32, m.buf.host_ptr(), sq.wqebbs) };
        slots[slot] = Some(m);
        self.inner.work.notify_one();
        Some(mirror)
    }

    /// Never: the simulator's thread looks at the dbrecs every 200 µs, far later than the 20 µs a reader
    /// waits, so a reader takes what the mirror holds when it looks, or fetches.
    fn mirrors_running(&self) -> bool {
        false
    }

    fn rebase_sq_mirror(&self, mirror: &SqMirror, base: u64) {
        let mut s = lock(&self.inner.state);
        if let Some(Some(m)) = s.mirrors.as_mut().and_then(|v| v.get_mut(mirror.slot() as usize)) {
            m.copied = m.copied.max(base);
        }
    }

    /// Empties the slot; the simulator's thread looks at mirrors only under the lock this takes, so it no
    /// longer reads the ring when this returns.
    fn unmirror_sq(&self, mirror: SqMirror) {
        let mut s = lock(&self.inner.state);
        if let Some(slot) = s.mirrors.as_mut().and_then(|v| v.get_mut(mirror.slot() as usize)) {
            *slot = None;
        }
    }

    /// Zeroed host memory, 4096-byte aligned, standing for GPU memory.
    ///
    /// # Errors
    /// Out of memory.
    /// Host memory is the simulator's memory: its operations reach any of it at its own address.
    fn device_view(&self, addr: u64, _len: u64) -> Option<u64> {
        Some(addr)
    }

    /// `false`: device code on the `cpu` executor runs on host threads, which a spinning NIC thread would
    /// slow down.
    fn device_code_on_gpu(&self) -> bool {
        false
    }

    /// Simulated GPU memory is host memory of this process: the handle names the range itself (tag, process
    /// id, address, length), so that another NIC of the same process can read it, as a CUDA IPC mapping
    /// lets another process read an allocation; offset 0.
    fn export(&self, addr: u64, len: u64) -> Option<PeerExport> {
        let mut handle = [0u8; EXPORT_HANDLE_BYTES];
        handle[..16].copy_from_slice(SIM_EXPORT_TAG);
        handle[16..20].copy_from_slice(&std::process::id().to_le_bytes());
        handle[24..32].copy_from_slice(&addr.to_le_bytes());
        handle[32..40].copy_from_slice(&len.to_le_bytes());
        // No random source: no export (WRITEs stay on TCP).
        getrandom::fill(&mut handle[40..48]).ok()?;
        lock(&SIM_EXPORTS).get_or_insert_with(HashMap::new).insert(handle, 0);
        Some(PeerExport { handle, offset: 0 })
    }

    /// Withdraws the handle once the copies enqueued out of it have run (at most 10 s: a
    /// warning then): no simulator imports it, enqueues a copy out of it or reads its memory from then on.
    fn unexport(&self, export: &PeerExport) {
        let mut e = lock(&SIM_EXPORTS);
        let t = std::time::Instant::now();
        while e.as_ref().and_then(|e| e.get(&export.handle)).is_some_and(|&n| n > 0) {
            let Some(left) = UNEXPORT_BOUND.checked_sub(t.elapsed()) else {
                tracing::warn!("simulated GPU: copies out of a withdrawn export did not run within {UNEXPORT_BOUND:?}");
                break;
            };
            e = SIM_EXPORT_COPIED.wait_timeout(e, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        if let Some(e) = e.as_mut() {
            e.remove(&export.handle);
        }
    }

    /// Accepts a handle [`GpuCopier::export`] made in this process; refuses others, as the CUDA driver refuses
    /// a handle of another host (another process's host memory is not reachable from here, whatever its
    /// process id).
    fn import(&self, handle: &[u8; EXPORT_HANDLE_BYTES]) -> Result<PeerMapping> {
        let word = |at: usize| u64::from_le_bytes(handle[at..at + 8].try_into().expect("8 bytes"));
        if !lock(&SIM_EXPORTS).as_ref().is_some_and(|e| e.contains_key(handle)) {
            return Err(crate::Error::Unavailable(
                "simulated GPU: not a handle this process exported (simulated GPU memory is the process's own)".into(),
            ));
        }
        let m = PeerMapping { base: word(24), len: word(32) };
        lock(&self.imports).insert(*handle, m);
        Ok(m)
    }

    /// The mapping of a handle imported here and still exported (a withdrawn one names memory the
    /// application may have freed).
    fn imported(&self, handle: &[u8; EXPORT_HANDLE_BYTES]) -> Option<PeerMapping> {
        let m = lock(&self.imports).get(handle).copied()?;
        lock(&SIM_EXPORTS).as_ref().is_some_and(|e| e.contains_key(handle)).then_some(m)
    }

    /// Enqueues the copy, counted in its handle's export until it has run ([`GpuCopier::unexport`] waits).
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] for a handle not imported here, or withdrawn.
    unsafe fn copy_from_peer_async(
        &self,
        dst: MemLoc,
        (handle, offset): (&[u8; EXPORT_HANDLE_BYTES], u64),
        len: usize,
    ) -> Result<()> {
        let Some(m) = lock(&self.imports).get(handle).copied() else {
            return Err(crate::Error::InvalidArgument("a peer allocation this simulator has not mapped".into()));
        };
        if len == 0 {
            return Ok(());
        }
        match lock(&SIM_EXPORTS).as_mut().and_then(|e| e.get_mut(handle)) {
            Some(n) => *n += 1,
            None => return Err(crate::Error::InvalidArgument("a peer allocation withdrawn by its exporter".into())),
        }
        let src = MemLoc { kind: MemKind::Gpu, addr: m.base + offset };
        self.enqueue(Op::CopyFromPeer { dst, src, len, handle: Box::new(*handle) });
        Ok(())
    }

    fn alloc(&self, len: usize) -> Result<GpuMem> {
        let buf = HostQueueMemory.alloc(len)?;
        let addr = buf.host_ptr() as u64;
        Ok(GpuMem::new(addr, len, Box::new(SimAlloc { buf: Some(buf), inner: self.inner.clone() })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handle is mapped only if this process exported it: one made up from a guessed address and length
    /// (even with the right tag and process id) is refused.
    #[test]
    fn imports_only_what_this_process_exported() {
        let sim = SimGpu::new().unwrap();
        let buf = [0u8; 64];
        let x = sim.export(buf.as_ptr() as u64, 64).unwrap();
        assert_eq!(sim.imported(&x.handle), None, "not imported yet");
        assert_eq!(sim.import(&x.handle).unwrap(), PeerMapping { base: buf.as_ptr() as u64, len: 64 });
        assert_eq!(sim.imported(&x.handle), Some(PeerMapping { base: buf.as_ptr() as u64, len: 64 }));
        let mut forged = x.handle;
        forged[40] ^= 1;
        assert!(sim.import(&forged).is_err());
        assert_eq!(sim.imported(&forged), None);
    }

    /// A withdrawal waits for the copies out of its handle enqueued before it (here behind a long copy), and a
    /// withdrawn handle maps nothing and takes no copy.
    #[test]
    fn a_withdrawn_export_is_never_read() {
        const N: usize = 64 << 20;
        let sim = SimGpu::new().unwrap();
        let (src, big) = (vec![0x5au8; N], vec![1u8; N]);
        let (mut dst, mut small) = (vec![0u8; N], vec![0u8; N]);
        let at = |p: *const u8| MemLoc { kind: MemKind::Gpu, addr: p as u64 };
        let (to_dst, to_small) = (at(dst.as_mut_ptr()), at(small.as_mut_ptr()));
        let x = sim.export(src.as_ptr() as u64, N as u64).unwrap();
        sim.import(&x.handle).unwrap();
        // SAFETY: every buffer lives past the withdrawal and the synchronize below.
        unsafe { sim.copy_async(to_small, at(big.as_ptr()), N) }.unwrap();
        // SAFETY: as above.
        unsafe { sim.copy_from_peer_async(to_dst, (&x.handle, 0), N) }.unwrap();
        sim.unexport(&x);
        // Read right after the withdrawal, with no synchronize: the copy out of the handle has run.
        // SAFETY: the simulator's thread no longer writes `dst` (its one copy into it has run).
        let last = unsafe { std::ptr::read_volatile((to_dst.addr + N as u64 - 1) as *const u8) };
        assert_eq!(last, 0x5a, "the copy's last byte is in place when the withdrawal returns");
        sim.synchronize().unwrap();
        assert!(dst.iter().all(|&b| b == 0x5a), "the copy enqueued before the withdrawal ran whole");
        assert!(small.iter().all(|&b| b == 1));
        assert_eq!(sim.imported(&x.handle), None);
        assert!(sim.import(&x.handle).is_err());
        // SAFETY: as above.
        assert!(unsafe { sim.copy_from_peer_async(to_dst, (&x.handle, 0), 8) }.is_err(), "no copy after");
    }
}
