//! The emulated NIC's operations on GPU memory: small ones on the engine warp, large copies on the copy
//! engines, in one order.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::Duration;

use cudarc::driver::sys;
use rustc_hash::FxHashMap;

use super::driver::check;
use super::engine::{Cmd, Engine, Op, FLAG_GPU_SCOPE, FLAG_PUBLISH};
use super::stream::Stream;
use super::{DeviceBuffer, Gpu};
use crate::mem::{check_atomic, check_write, AtomicOp, GpuCopier, GpuMem, MemKind, MemLoc, SqMirror, SqWatch};
use crate::mem::{PeerExport, PeerMapping, EXPORT_HANDLE_BYTES};
use crate::{Error, Result};

/// Copies of at most this many bytes between GPU memories, or from GPU memory into host memory, run on the
/// engine warp; longer ones on the copy engines (a CUDA copy costs microseconds of host time and latency
/// whatever its size; one warp copies more slowly than a copy engine once the copy is long).
const ENGINE_COPY_MAX: usize = 16 * 1024;
/// Copies out of another process's GPU memory on this same GPU ([`GpuCopier::copy_from_peer_async`]) into GPU
/// memory, of at most this many bytes and 16-byte aligned (the engine's fast copy), run on the engine warp.
/// Measured with two processes on one H100, which runs their contexts in time slices: a copy-engine copy out
/// of the peer's mapping waited for a slice of about 4.5 ms, the engine warp's did not (in an experiment
/// that raised the engine's limit for every GPU-to-GPU copy: one WRITE of 64 KiB 4,497 -> 32 µs, 1 MiB
/// 4,502 -> 256 µs, 4 MiB 4,535 -> 990 µs, about 4.2 GB/s). 4 MiB is the largest size tried, not a measured
/// crossover (128 MiB took 5.6 ms on the copy engines). A peer on another GPU shares no slices: its copies
/// keep the copy engines past 16 KiB.
const PEER_ENGINE_COPY_MAX: usize = 4 << 20;
/// Copies from host memory of at most this many bytes become engine writes, their bytes taken at once.
const ENGINE_UPLOAD_MAX: usize = 256;
/// Bytes of the pinned bounce buffer that engine copies into host memory land in until the synchronize.
const BOUNCE_BYTES: usize = 64 * 1024;
/// Bytes of the pinned buffer that longer copies from host memory are taken into before the stream copies
/// them (a full buffer synchronizes first).
const UPLOAD_BYTES: usize = 1 << 20;
/// Bytes of GPU memory for the two hand-off words: the copy-engine flag at [`CE_FLAG`], the gate at [`GATE`].
const HANDOFF_BYTES: usize = 64;
/// Offset of the 32-bit flag the stream writes (`cuStreamWriteValue32`) and the engine waits for
/// ([`Op::Wait`]) when the order goes from stream copies to engine commands.
const CE_FLAG: usize = 0;
/// Offset of the 64-bit gate the engine writes (its low word counting hand-offs) and the stream waits for
/// when the order goes from engine commands to stream copies.
const GATE: usize = 8;
/// How long a synchronize waits for the copy-engine stream.
const STREAM_LIMIT: Duration = Duration::from_secs(20);
/// A wait on the stream longer than this is logged as a warning.
const SLOW: Duration = Duration::from_millis(500);

/// [`GpuCopier`] of the `gpu` executor ([`super::Gpu::copier`]). Two ways to reach GPU memory, kept in one
/// order:
/// - the engine: one warp of a small kernel, resident while there is work, for writes, CQEs, atomics and
///   copies up to 16 KiB (up to 4 MiB out of a peer process's memory on this GPU: `PEER_ENGINE_COPY_MAX`):
///   no CUDA call, no host wait, about a PCIe round trip of latency;
/// - the copier's own `CU_STREAM_NON_BLOCKING` stream (copy engines) for longer copies.
///
/// When the order switches from one to the other, the second waits for the first without the host: after
/// engine commands, the engine writes a gate word (a last, fenced command) that the stream waits for
/// (`cuStreamWaitValue32`); after stream copies the stream writes a flag (`cuStreamWriteValue32`) that the
/// engine waits for. Both words are in GPU memory, where the stream's front end and the engine each poll
/// them without crossing PCIe (in pinned host memory every poll was a PCIe read, about a microsecond).
/// Nothing goes to the legacy default stream and no synchronous `cuMemcpy` is used, so no operation waits
/// for a user kernel.
///
/// An operation waits on the other way only for what it must follow there ([`GpuCopier::order_by`]): every
/// earlier operation by default, only those of its own QP (and those enqueued without one) for the
/// operations the NIC's thread tags with a QP. So one QP's long copy does not wait for another QP's atomic
/// on the engine, and the copies of several QPs go to the copy engines back to back.
///
/// Host memory in a stream copy should be pinned ([`super::Gpu::alloc_mapped`]): then the copy is
/// asynchronous. With pageable host memory the driver stages the bytes through its own pinned buffers, so the
/// call may return only after the copy; it is still correct and still does not wait for kernels.
pub struct CudaCopier {
    stream: Arc<Stream>,
    state: Mutex<State>,
    /// Changes between the engine and the stream so far ([`GpuCopier::way_changes`]): counted under the
    /// state's lock, read without it (the NIC's thread reads it twice per WQE).
    changes: AtomicU64,
    /// Whether engine commands were given since the last [`GpuCopier::submit`] (set and cleared under the
    /// state's lock, read without it: the NIC's thread submits after every pass, most of which gave nothing).
    given: AtomicBool,
    /// Other processes' allocations mapped by [`GpuCopier::import`], by handle; closed when the copier is
    /// dropped (`cuIpcCloseMemHandle` waits for running kernels, as `cuMemFree` does).
    imports: Mutex<FxHashMap<[u8; EXPORT_HANDLE_BYTES], Import>>,
    /// This copier's GPU, in this process's numbering (`cuDeviceGet`), to tell a peer's allocation on the same
    /// GPU from one on another.
    ordinal: i32,
    /// Held by one [`GpuCopier::import`] at a time (which may wait in the driver), so that one handle is
    /// opened once; [`GpuCopier::imported`] takes only `imports`, and never waits for an open.
    importing: Mutex<()>,
}

/// A peer's allocation mapped here ([`GpuCopier::import`]).
#[derive(Clone, Copy)]
struct Import {
    mapping: PeerMapping,
    /// Whether the allocation lies in this copier's GPU (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` of the mapping):
    /// then the peer process shares the GPU's time slices with this one (`PEER_ENGINE_COPY_MAX`).
    same_gpu: bool,
}

struct State {
    engine: Engine,
    /// Which way the last operation went.
    last: Last,
    /// The last value the stream was asked to write into the copy-engine flag.
    ce_seq: u32,
    /// The last value the engine was asked to write into the gate word.
    gate_seq: u32,
    /// GPU memory: the copy-engine flag (a `u32` at [`CE_FLAG`]) and the gate word (a `u64` at [`GATE`]).
    handoff: DeviceBuffer,
    /// Whether stream work was enqueued since the last synchronize.
    stream_dirty: bool,
    /// The QP that [`GpuCopier::order_by`] named, with the thread that named it (only that thread's
    /// operations are the QP's).
    order: Option<(ThreadId, u32)>,
    /// Where each order is, as positions: operations enqueued on the stream so far, and the engine's
    /// commands given so far ([`Engine::head`]).
    pos: Positions,
    /// Pinned memory engine copies into host memory land in: `(offset, host destination, length)` of each
    /// pending one, copied out by the synchronize.
    bounce: crate::mem::MappedBuf,
    bounced: Vec<(usize, u64, usize)>,
    bounce_used: usize,
    /// Pinned memory host bytes of longer copies are taken into; the first `upload_used` bytes are in use
    /// until the synchronize.
    upload: crate::mem::MappedBuf,
    upload_used: usize,
}

/// Positions in the two ways' queues (see [`State::pos`]): what a wait on the other way has covered, and
/// where each QP's (and the untagged operations') last operation on each way is.
#[derive(Default)]
struct Positions {
    /// Operations enqueued on the stream so far.
    stream_ops: u64,
    /// The stream position the engine has already waited for (its last [`Op::Wait`] follows those).
    flag_covers: u64,
    /// The engine position the stream has already waited for (its last gate follows those commands).
    gate_covers: u64,
    /// Each QP's last stream position and last engine position (looked up on every operation of the NIC's
    /// thread: Fx hashing, as the QP number is no attacker's input).
    qps: FxHashMap<u32, (u64, u64)>,
    /// The last stream and engine positions of operations enqueued without a QP (everyone follows them).
    untagged: (u64, u64),
}

impl Positions {
    /// The stream position an engine operation of `qp` must follow (`None`: every stream operation so far).
    fn stream_need(&self, qp: Option<u32>) -> u64 {
        match qp {
            Some(q) => self.qps.get(&q).map_or(0, |p| p.0).max(self.untagged.0),
            None => self.stream_ops,
        }
    }

    /// The engine position a stream operation of `qp` must follow (`head`: the engine's commands so far).
    fn engine_need(&self, qp: Option<u32>, head: u64) -> u64 {
        match qp {
            Some(q) => self.qps.get(&q).map_or(0, |p| p.1).max(self.untagged.1),
            None => head,
        }
    }

    /// Records an operation of `qp` at stream position `stream` or engine position `engine` (0: unchanged).
    fn record(&mut self, qp: Option<u32>, stream: u64, engine: u64) {
        let at = match qp {
            Some(q) => self.qps.entry(q).or_default(),
            None => &mut self.untagged,
        };
        at.0 = at.0.max(stream);
        at.1 = at.1.max(engine);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Last {
    None,
    Engine,
    Stream,
}

impl fmt::Debug for CudaCopier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaCopier").field("stream", &self.stream).finish_non_exhaustive()
    }
}

impl Drop for CudaCopier {
    /// Closes the mappings of other processes' memory ([`GpuCopier::import`]), after every copy that read them.
    fn drop(&mut self) {
        let imports = std::mem::take(self.imports.get_mut().unwrap_or_else(|e| e.into_inner()));
        if imports.is_empty() {
            return;
        }
        let _ = self.synchronize();
        for i in imports.into_values() {
            self.stream.shared.release("cuIpcCloseMemHandle", || {
                // SAFETY: the base came from `cuIpcOpenMemHandle`; the copies that read it are done.
                unsafe { sys::cuIpcCloseMemHandle(i.mapping.base) }
            });
        }
    }
}

impl CudaCopier {
    pub(crate) fn new(gpu: &Gpu, stream: Stream) -> Result<Self> {
        let engine = Engine::new(gpu)?;
        let bounce = gpu.alloc_mapped(BOUNCE_BYTES)?;
        let upload = gpu.alloc_mapped(UPLOAD_BYTES)?;
        let handoff = gpu.alloc_device(HANDOFF_BYTES)?;
        let state = State {
            engine,
            last: Last::None,
            ce_seq: 0,
            gate_seq: 0,
            handoff,
            order: None,
            pos: Positions::default(),
            stream_dirty: false,
            bounce,
            bounced: Vec::new(),
            bounce_used: 0,
            upload,
            upload_used: 0,
        };
        Ok(CudaCopier {
            stream: Arc::new(stream),
            state: Mutex::new(state),
            changes: AtomicU64::new(0),
            given: AtomicBool::new(false),
            imports: Mutex::new(FxHashMap::default()),
            ordinal: i32::try_from(gpu.ordinal()).unwrap_or(-1),
            importing: Mutex::new(()),
        })
    }

    /// The copier's stream, e.g. to wait for its copies with a time limit ([`Stream::wait`]).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a small operation goes to the engine: not while the stream is the way in use (so that long
    /// copies and the small operations behind them do not switch ways at every WQE), nor while the engine
    /// cannot start (every SM taken: the copy engines need none).
    fn engine_turn(&self, st: &mut State) -> Result<bool> {
        Ok(st.last != Last::Stream && st.engine.available()?)
    }

    /// The QP the calling thread's operations belong to ([`GpuCopier::order_by`]), if any.
    fn qp(st: &State) -> Option<u32> {
        st.order.filter(|(t, _)| *t == this_thread()).map(|(_, q)| q)
    }

    /// Puts `cmd` on the engine, after the stream's earlier copies that it must follow.
    fn engine(&self, st: &mut State, cmd: &Cmd) -> Result<()> {
        let qp = Self::qp(st);
        if st.pos.stream_need(qp) > st.pos.flag_covers {
            st.ce_seq = st.ce_seq.wrapping_add(1);
            let flag = st.handoff.device_addr() + CE_FLAG as u64;
            self.stream.shared.bind()?;
            // SAFETY: `flag` is a word of the copier's GPU memory, alive as long as the copier; the stream is
            // live. DEFAULT flags: the write follows the stream's earlier work, fenced.
            let status = unsafe { sys::cuStreamWriteValue32_v2(self.stream.raw, flag, st.ce_seq, 0) };
            check(status, "cuStreamWriteValue32")?;
            let mut w = Cmd::new(Op::Wait);
            w.dst = flag;
            w.a = u64::from(st.ce_seq);
            st.engine.push(&w)?;
            st.pos.flag_covers = st.pos.stream_ops;
        }
        st.engine.push(cmd)?;
        self.given.store(true, Ordering::Relaxed);
        let head = st.engine.head();
        st.pos.record(qp, 0, head);
        if st.last == Last::Stream {
            self.changes.fetch_add(1, Ordering::Relaxed);
        }
        st.last = Last::Engine;
        Ok(())
    }

    /// Readies the stream for a copy: after the engine's earlier commands that it must follow. The caller
    /// enqueues one stream operation next and then calls [`CudaCopier::stream_done`].
    fn stream_turn(&self, st: &mut State) -> Result<()> {
        self.stream.shared.bind()?;
        let qp = Self::qp(st);
        if st.pos.engine_need(qp, st.engine.head()) > st.pos.gate_covers {
            // The engine writes the gate after every command given so far (a published write: fenced at
            // system scope, so that the copy engines see those commands' bytes), and the stream waits for it.
            st.gate_seq = st.gate_seq.wrapping_add(1);
            let gate = st.handoff.device_addr() + GATE as u64;
            let mut c = Cmd::new(Op::Write);
            (c.dst, c.len, c.flags) = (gate, 8, FLAG_PUBLISH);
            c.payload[0] = u64::from(st.gate_seq);
            st.engine.push(&c)?;
            st.engine.publish()?;
            let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
            // SAFETY: `gate` is a word of the copier's GPU memory, alive as long as the copier; the stream is
            // live. GEQ compares wrapping 32-bit values (the gate's low word).
            let status = unsafe { sys::cuStreamWaitValue32_v2(self.stream.raw, gate, st.gate_seq, flags) };
            check(status, "cuStreamWaitValue32")?;
            st.pos.gate_covers = st.engine.head();
        }
        if st.last == Last::Engine {
            self.changes.fetch_add(1, Ordering::Relaxed);
        }
        st.last = Last::Stream;
        st.stream_dirty = true;
        Ok(())
    }

    /// Records the stream operation just enqueued after [`CudaCopier::stream_turn`].
    fn stream_done(st: &mut State) {
        st.pos.stream_ops += 1;
        let (qp, at) = (Self::qp(st), st.pos.stream_ops);
        st.pos.record(qp, at, 0);
    }

    fn synchronize_locked(&self, st: &mut State) -> Result<()> {
        let head = st.engine.head();
        if let Err(e) = st.engine.wait(head) {
            // Who waited for whom: the last flag value the stream was asked to write (an engine waiting for a
            // copy-engine flag waits for it) and whether the stream still has work.
            tracing::warn!(
                ce_seq = st.ce_seq,
                gate_seq = st.gate_seq,
                stream_idle = ?self.stream.is_idle(),
                stream_dirty = st.stream_dirty,
                "emulated NIC: the GPU engine did not finish: {e}"
            );
            return Err(e);
        }
        if st.stream_dirty {
            let t0 = std::time::Instant::now();
            let r = self.stream.wait(STREAM_LIMIT);
            if t0.elapsed() > SLOW {
                // A copy-engine copy this slow holds up the NIC's thread (and its wire peers): say so.
                tracing::warn!("emulated NIC: its copy-engine copies took {} ms", t0.elapsed().as_millis());
            }
            r?;
            st.stream_dirty = false;
        }
        for &(off, dst, len) in &st.bounced {
            // SAFETY: the engine has executed the copy into the bounce buffer (waited for above); `dst` is the
            // host range the caller of `copy_async` keeps valid until this synchronize returns.
            unsafe { std::ptr::copy_nonoverlapping(st.bounce.host_ptr().add(off), dst as *mut u8, len) };
        }
        st.bounced.clear();
        st.bounce_used = 0;
        st.upload_used = 0;
        st.last = Last::None;
        // Everything enqueued has completed: no later operation needs to wait for it.
        let (stream_ops, head) = (st.pos.stream_ops, st.engine.head());
        st.pos = Positions { stream_ops, flag_covers: stream_ops, gate_covers: head, ..Positions::default() };
        Ok(())
    }

    /// Takes `len` bytes at host address `src` into the pinned upload buffer now and enqueues their copy to
    /// `dst` on the stream, piece by piece (a full buffer synchronizes first).
    ///
    /// # Safety
    /// `src` valid for `len` bytes during the call; `dst` GPU memory valid for them until the synchronize.
    unsafe fn stream_upload(&self, st: &mut State, dst: MemLoc, src: *const u8, len: usize) -> Result<()> {
        let mut done = 0;
        while done < len {
            if st.upload_used == UPLOAD_BYTES {
                self.synchronize_locked(st)?;
            }
            let off = st.upload_used;
            let n = (len - done).min(UPLOAD_BYTES - off);
            // SAFETY: `src` is valid for `len` bytes (the caller's contract); the upload buffer has `n` bytes
            // free at `off` (no pending copy reads them: they are past `upload_used`).
            unsafe { std::ptr::copy_nonoverlapping(src.add(done), st.upload.host_ptr().add(off), n) };
            st.upload_used = (off + n).next_multiple_of(16).min(UPLOAD_BYTES);
            let from = MemLoc { kind: MemKind::Host, addr: st.upload.host_ptr() as u64 + off as u64 };
            let to = MemLoc { kind: MemKind::Gpu, addr: dst.addr + done as u64 };
            // SAFETY: `to` is inside `dst`; `from` stays untouched until the synchronize.
            unsafe { self.stream_copy(st, to, from, n) }?;
            done += n;
        }
        Ok(())
    }

    /// Enqueues a copy on the stream (after the engine's earlier commands).
    ///
    /// # Safety
    /// As [`GpuCopier::copy_async`].
    unsafe fn stream_copy(&self, st: &mut State, dst: MemLoc, src: MemLoc, len: usize) -> Result<()> {
        self.stream_turn(st)?;
        let s = self.stream.raw;
        // The caller guarantees both ranges are valid for `len` bytes until `synchronize` returns, and `s` is a
        // live stream of the bound context: that is all each call below needs.
        let (status, call) = match (dst.kind, src.kind) {
            (MemKind::Gpu, MemKind::Host) => {
                // SAFETY: see above; `src.addr` is a host pointer, `dst.addr` GPU memory.
                let st = unsafe { sys::cuMemcpyHtoDAsync_v2(dst.addr, src.addr as *const _, len, s) };
                (st, "cuMemcpyHtoDAsync")
            }
            (MemKind::Host, MemKind::Gpu) => {
                // SAFETY: see above; `dst.addr` is a host pointer, `src.addr` GPU memory.
                let st = unsafe { sys::cuMemcpyDtoHAsync_v2(dst.addr as *mut _, src.addr, len, s) };
                (st, "cuMemcpyDtoHAsync")
            }
            (MemKind::Gpu, MemKind::Gpu) => {
                // SAFETY: see above; both are GPU memory.
                let st = unsafe { sys::cuMemcpyDtoDAsync_v2(dst.addr, src.addr, len, s) };
                (st, "cuMemcpyDtoDAsync")
            }
            (MemKind::Host, MemKind::Host) => {
                // SAFETY: see above; both are host pointers, which unified addressing lets `cuMemcpyAsync` take.
                let st = unsafe { sys::cuMemcpyAsync(dst.addr, src.addr, len, s) };
                (st, "cuMemcpyAsync")
            }
        };
        check(status, call)?;
        Self::stream_done(st);
        Ok(())
    }
}

thread_local! {
    /// The thread's id, read once: `thread::current()` clones the thread's handle (two atomic operations),
    /// and the NIC's thread asks on every operation it enqueues.
    static THREAD: ThreadId = thread::current().id();
}

/// The calling thread's id (see [`THREAD`]).
fn this_thread() -> ThreadId {
    THREAD.with(|t| *t)
}

fn check_range(loc: MemLoc, len: usize, side: &str) -> Result<()> {
    if loc.addr == 0 || loc.addr.checked_add(len as u64).is_none() {
        return Err(Error::InvalidArgument(format!(
            "copy {side} {:?} address {:#x} for {len} bytes",
            loc.kind, loc.addr
        )));
    }
    Ok(())
}

impl CudaCopier {
    /// [`GpuCopier::copy_async`]'s work, with copies GPU to GPU of at most `engine_max` bytes on the engine
    /// warp (when it is the way in use).
    ///
    /// # Safety
    /// As [`GpuCopier::copy_async`].
    unsafe fn copy_with(&self, dst: MemLoc, src: MemLoc, len: usize, engine_max: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        check_range(dst, len, "to")?;
        check_range(src, len, "from")?;
        let mut st = self.lock();
        match (dst.kind, src.kind) {
            // Small operations follow the stream while it is the way in use, so that a batch of long copies
            // and the CQEs behind them do not switch ways (a round trip each) at every WQE.
            (MemKind::Gpu, MemKind::Gpu) if len <= engine_max && self.engine_turn(&mut st)? => {
                let mut c = Cmd::new(Op::Copy);
                (c.dst, c.src, c.len) = (dst.addr, src.addr, len as u64);
                self.engine(&mut st, &c)
            }
            (MemKind::Host, MemKind::Gpu) if len <= ENGINE_COPY_MAX && self.engine_turn(&mut st)? => {
                if st.bounce_used + len > BOUNCE_BYTES {
                    self.synchronize_locked(&mut st)?;
                }
                let off = st.bounce_used;
                st.bounce_used = (off + len).next_multiple_of(16);
                st.bounced.push((off, dst.addr, len));
                let mut c = Cmd::new(Op::Copy);
                (c.dst, c.src, c.len) = (st.bounce.device_addr() + off as u64, src.addr, len as u64);
                self.engine(&mut st, &c)
            }
            (MemKind::Gpu, MemKind::Host) if len <= ENGINE_UPLOAD_MAX => {
                let mut bytes = vec![0u8; len];
                // SAFETY: `src` is valid for `len` bytes (the caller's contract), and no earlier pending copy
                // writes it (the trait's contract), so its bytes now are the bytes the copy would read.
                unsafe { std::ptr::copy_nonoverlapping(src.addr as *const u8, bytes.as_mut_ptr(), len) };
                drop(st);
                for (i, chunk) in bytes.chunks(crate::mem::WRITE_ASYNC_MAX).enumerate() {
                    let to = MemLoc { kind: MemKind::Gpu, addr: dst.addr + (i * crate::mem::WRITE_ASYNC_MAX) as u64 };
                    // SAFETY: inside `dst`, which the caller keeps valid.
                    unsafe { self.write_async(to, chunk, false) }?;
                }
                Ok(())
            }
            // SAFETY: `src` is valid for `len` bytes during this call (the caller's contract).
            (MemKind::Gpu, MemKind::Host) => unsafe { self.stream_upload(&mut st, dst, src.addr as *const u8, len) },
            // SAFETY: the caller's contract.
            _ => unsafe { self.stream_copy(&mut st, dst, src, len) },
        }
    }
}

impl GpuCopier for CudaCopier {
    /// Enqueues `len` bytes from `src` to `dst`. Up to 16 KiB GPU to GPU, or GPU to host (through a pinned
    /// bounce buffer, copied out by the synchronize), and up to 256 bytes host to GPU (the bytes taken now):
    /// engine commands, unless the last operation went to the stream (then they follow it there; writes
    /// too). Otherwise on the stream, by kind: `cuMemcpyHtoDAsync` (from a pinned buffer the host
    /// bytes are taken into now), `cuMemcpyDtoHAsync`, `cuMemcpyDtoDAsync`, or `cuMemcpyAsync` host to host.
    /// A `len` of 0 enqueues nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a null address or an address range that wraps; the driver's error as
    /// [`Error::Cuda`] (e.g. an address that is not GPU memory of this context); the engine's as
    /// [`Error::Device`].
    unsafe fn copy_async(&self, dst: MemLoc, src: MemLoc, len: usize) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.copy_with(dst, src, len, ENGINE_COPY_MAX) }
    }

    /// A copy out of the peer's mapping ([`GpuCopier::imported`]), as [`CudaCopier::copy_async`], but into GPU
    /// memory on the engine warp up to 4 MiB when the peer's allocation is on this GPU and the copy is
    /// 16-byte aligned (`PEER_ENGINE_COPY_MAX`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a handle not mapped here; as [`CudaCopier::copy_async`].
    unsafe fn copy_from_peer_async(
        &self,
        dst: MemLoc,
        (handle, offset): (&[u8; EXPORT_HANDLE_BYTES], u64),
        len: usize,
    ) -> Result<()> {
        let Some(i) = self.imports.lock().unwrap_or_else(|e| e.into_inner()).get(handle).copied() else {
            return Err(Error::InvalidArgument("a peer allocation this copier has not mapped".into()));
        };
        let src = MemLoc { kind: MemKind::Gpu, addr: i.mapping.base + offset };
        let aligned = (dst.addr | src.addr | len as u64).is_multiple_of(16);
        let engine_max = if i.same_gpu && aligned { PEER_ENGINE_COPY_MAX } else { ENGINE_COPY_MAX };
        // SAFETY: the caller's contract; the mapping lasts as long as this copier.
        unsafe { self.copy_with(dst, src, len, engine_max) }
    }

    /// Enqueues an engine write with the bytes in the command.
    ///
    /// # Errors
    /// As the trait says; the engine's as [`Error::Device`].
    unsafe fn write_async(&self, dst: MemLoc, data: &[u8], publish: bool) -> Result<()> {
        check_write(dst, data.len(), publish)?;
        let mut c = Cmd::new(Op::Write);
        (c.dst, c.len) = (dst.addr, data.len() as u64);
        if publish {
            c.flags = FLAG_PUBLISH;
        }
        if dst.kind == MemKind::Gpu {
            c.flags |= FLAG_GPU_SCOPE;
        }
        bytemuck::bytes_of_mut(&mut c.payload)[..data.len()].copy_from_slice(data);
        let mut st = self.lock();
        if !self.engine_turn(&mut st)? {
            // Behind stream copies, or with no engine: two stream copies (the rest, then the last word),
            // which the stream runs one after the other.
            let (body, last) = data.split_at(if publish { data.len() - 8 } else { data.len() });
            // SAFETY: both parts are inside `dst` (the caller's contract) and `data` lives during the call.
            unsafe {
                self.stream_upload(&mut st, dst, body.as_ptr(), body.len())?;
                let at = MemLoc { kind: MemKind::Gpu, addr: dst.addr + body.len() as u64 };
                return self.stream_upload(&mut st, at, last.as_ptr(), last.len());
            }
        }
        self.engine(&mut st, &c)
    }

    /// Enqueues an engine atomic (`atom.sys.global`, so atomic towards device code's atomics too).
    ///
    /// # Errors
    /// As the trait says; the engine's as [`Error::Device`].
    unsafe fn atomic_async(&self, at: MemLoc, op: AtomicOp, result: MemLoc) -> Result<()> {
        check_atomic(at, result)?;
        let mut c = match op {
            AtomicOp::FetchAdd(add) => Cmd { a: add, ..Cmd::new(Op::FetchAdd) },
            AtomicOp::CompareSwap { compare, swap } => Cmd { a: compare, b: swap, ..Cmd::new(Op::CompareSwap) },
        };
        (c.dst, c.result) = (at.addr, result.addr);
        if at.kind == MemKind::Gpu {
            c.flags = FLAG_GPU_SCOPE;
        }
        let mut st = self.lock();
        if st.engine.available()? {
            return self.engine(&mut st, &c);
        }
        // No engine (every SM taken): the old value read after the stream's earlier copies, the new one and
        // the result written behind it. Atomic towards this NIC's operations only, not device code's.
        let mut old = [0u8; 8];
        // SAFETY: `at` is valid for 8 bytes (the caller's contract); `old` outlives the synchronize below.
        unsafe { self.stream_copy(&mut st, MemLoc { kind: MemKind::Host, addr: old.as_mut_ptr() as u64 }, at, 8) }?;
        self.synchronize_locked(&mut st)?;
        let new = op.apply(u64::from_ne_bytes(old)).to_ne_bytes();
        // SAFETY: both are valid for 8 bytes (the caller's contract); the bytes are taken now.
        unsafe {
            self.stream_upload(&mut st, at, new.as_ptr(), 8)?;
            self.stream_upload(&mut st, result, old.as_ptr(), 8)
        }
    }

    /// Tags the calling thread's later operations with `qp` (see the trait).
    fn order_by(&self, qp: Option<u32>) {
        self.lock().order = qp.map(|q| (this_thread(), q));
    }

    /// Changes between the engine and the stream so far.
    fn way_changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// Publishes the engine commands given since the last publication, as one batch.
    ///
    /// # Errors
    /// The driver's error when the engine's launch fails.
    fn submit(&self) -> Result<()> {
        // A command given by another thread after this load is published by the next submit (or by that
        // thread's synchronize).
        if !self.given.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut st = self.lock();
        self.given.store(false, Ordering::Relaxed);
        st.engine.publish()
    }

    /// Waits until every operation enqueued so far has completed: the engine's (bounded spin on its executed
    /// count), then the stream's (bounded [`Stream::wait`]), then copies engine reads out of the bounce
    /// buffer into their host destinations.
    ///
    /// # Errors
    /// The engine's failure as [`Error::Device`] (it could not start, or did not finish in time); the
    /// driver's error as [`Error::Cuda`] (e.g. a copy faulted).
    fn synchronize(&self) -> Result<()> {
        let mut st = self.lock();
        self.synchronize_locked(&mut st)
    }

    /// A slot of the engine's SQ-mirror table (32 slots: one per lane of its second warp) and a pinned,
    /// mapped buffer for the copy. That warp watches the dbrec in a loop of GPU-memory loads and copies the
    /// WQEBBs it passed with its own loads and stores.
    /// `None` when every slot is taken or the memory cannot be pinned (the NIC then fetches, as without a
    /// mirror).
    fn mirror_sq(&self, sq: SqWatch) -> Option<SqMirror> {
        self.lock().engine.watch(sq).unwrap_or_else(|e| {
            tracing::warn!("emulated NIC: no SQ mirror: {e}");
            None
        })
    }

    /// Whether the engine is on the GPU (it leaves after 5 ms without work and starts again with the next
    /// command).
    fn mirrors_running(&self) -> bool {
        self.lock().engine.running()
    }

    fn rebase_sq_mirror(&self, mirror: &SqMirror, base: u64) {
        self.lock().engine.rebase(mirror, base);
    }

    /// Empties the slot and waits (at most 2 s) until the engine has loaded the table without it.
    fn unmirror_sq(&self, mirror: SqMirror) {
        self.lock().engine.unwatch(mirror);
    }

    /// `cuMemAlloc`, zeroed with `cuMemsetD8Async` on the copier's stream and waited for (so before any
    /// copy enqueued later); freed with `cuMemFree` when dropped ([`DeviceBuffer`]).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`], or the driver's error as [`Error::Cuda`].
    /// `cuMemHostGetDevicePointer` of the range's first and last byte: both must map, contiguously (one
    /// pinned allocation or registration).
    fn device_view(&self, addr: u64, len: u64) -> Option<u64> {
        let last = addr.checked_add(len.checked_sub(1)?)?;
        self.stream.shared.bind().ok()?;
        let view = |a: u64| {
            let mut dev: sys::CUdeviceptr = 0;
            // SAFETY: the call looks the address up and writes one word; it touches no memory at `a`.
            let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, a as *mut std::ffi::c_void, 0) };
            (r == sys::CUresult::CUDA_SUCCESS).then_some(dev)
        };
        let (first, end) = (view(addr)?, view(last)?);
        (end.checked_sub(first) == Some(last - addr)).then_some(first)
    }

    /// `cuMemGetAddressRange` of `addr` (the allocation holding it must hold the whole range), then
    /// `cuIpcGetMemHandle` of the allocation's base.
    fn export(&self, addr: u64, len: u64) -> Option<PeerExport> {
        self.stream.shared.bind().ok()?;
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: the call looks `addr` up and writes two words.
        let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr) };
        let end = addr.checked_add(len)?;
        if r != sys::CUresult::CUDA_SUCCESS || end > base + size as u64 {
            return None;
        }
        let mut h = sys::CUipcMemHandle { reserved: [0; EXPORT_HANDLE_BYTES] };
        // SAFETY: `base` is the base of a live allocation (just looked up); the call writes the 64-byte handle.
        let r = unsafe { sys::cuIpcGetMemHandle(&mut h, base) };
        (r == sys::CUresult::CUDA_SUCCESS)
            .then(|| PeerExport { handle: h.reserved.map(|b| b as u8), offset: addr - base })
    }

    /// `cuIpcOpenMemHandle` (peer access enabled lazily, for a peer on another GPU), then
    /// `cuMemGetAddressRange` of the mapping for its length; cached by handle.
    fn import(&self, handle: &[u8; EXPORT_HANDLE_BYTES]) -> Result<PeerMapping> {
        let _one = self.importing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = self.imported(handle) {
            return Ok(m);
        }
        self.stream.shared.bind()?;
        let h = sys::CUipcMemHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        let mut base: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: the driver checks the handle (one of another process on this host, or an error); the call
        // writes one pointer.
        check(unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, h, flags) }, "cuIpcOpenMemHandle")?;
        let (mut start, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: `base` was just mapped; the call writes two words.
        let r = check(unsafe { sys::cuMemGetAddressRange_v2(&mut start, &mut size, base) }, "cuMemGetAddressRange");
        if let Err(e) = r {
            self.stream.shared.release("cuIpcCloseMemHandle", || {
                // SAFETY: `base` came from `cuIpcOpenMemHandle` and nothing uses it yet.
                unsafe { sys::cuIpcCloseMemHandle(base) }
            });
            return Err(e);
        }
        let mapping = PeerMapping { base, len: (start + size as u64).saturating_sub(base) };
        let mut ordinal: i32 = -1;
        // SAFETY: `base` was just mapped; the call writes one int. On an error `ordinal` stays -1 (another GPU).
        let _ = unsafe {
            sys::cuPointerGetAttribute(
                (&raw mut ordinal).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                base,
            )
        };
        let i = Import { mapping, same_gpu: ordinal == self.ordinal };
        self.imports.lock().unwrap_or_else(|e| e.into_inner()).insert(*handle, i);
        Ok(mapping)
    }

    fn imported(&self, handle: &[u8; EXPORT_HANDLE_BYTES]) -> Option<PeerMapping> {
        self.imports.lock().unwrap_or_else(|e| e.into_inner()).get(handle).map(|i| i.mapping)
    }

    fn alloc(&self, len: usize) -> Result<GpuMem> {
        let buf = DeviceBuffer::alloc(&self.stream, len)?;
        Ok(GpuMem::new(buf.device_addr(), len, Box::new(buf)))
    }
}
