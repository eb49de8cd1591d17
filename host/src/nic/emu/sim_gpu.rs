//! [`SimGpu`]: GPU memory simulated in host memory, to run the emulated NIC's GPU-memory paths where there is
//! no GPU.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::mem::{GpuCopier, GpuMem, HostQueueMemory, MappedBuf, MemLoc, QueueMemory};
use crate::{EmuError, Result};

use super::fabric::lock;
use super::hostmem;

/// A [`GpuCopier`] whose "GPU memory" is host memory: [`GpuCopier::alloc`] returns zeroed host memory, and
/// copies run later, in the order they were enqueued, on a thread of its own, as a CUDA stream runs them
/// after `copy_async` has returned. [`GpuCopier::synchronize`] waits for every copy enqueued before it.
///
/// It lets the `cpu` executor keep the emulated NIC's queues "in GPU memory" (`GDAKI_QUEUES=gpu`, see
/// [`EmuConfig::for_executor`](super::EmuConfig::for_executor)), so that the NIC reaches them only through
/// copies and the ordering of those copies is tested without a GPU. Device code on host threads still
/// reads and writes the same bytes directly, as device code on a GPU does. Every byte is moved with
/// atomic word accesses, so device threads that spin on it see no data race.
pub struct SimGpu {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    /// Signalled when a copy is enqueued or the simulator stops (the worker waits on it).
    work: Condvar,
    /// Signalled when the worker finished a copy (synchronizers wait on it).
    done: Condvar,
}

#[derive(Default)]
struct State {
    queue: VecDeque<(MemLoc, MemLoc, usize)>,
    /// Copies enqueued so far.
    enqueued: u64,
    /// Copies completed so far.
    completed: u64,
    stop: bool,
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
            if let Some((dst, src, len)) = s.queue.pop_front() {
                drop(s);
                // SAFETY: `copy_async`'s contract: both ranges stay valid until a synchronize returns, and
                // no synchronize returns before this copy is counted below.
                unsafe { hostmem::copy(dst.addr, src.addr, len as u64) };
                s = lock(&self.state);
                s.completed += 1;
                self.done.notify_all();
            } else if s.stop {
                return;
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
        Ok(Self { inner, thread: Some(thread) })
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

impl GpuCopier for SimGpu {
    /// Enqueues the copy for the simulator's thread. Either side may be host or simulated GPU memory.
    ///
    /// # Errors
    /// None.
    unsafe fn copy_async(&self, dst: MemLoc, src: MemLoc, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let mut s = lock(&self.inner.state);
        s.queue.push_back((dst, src, len));
        s.enqueued += 1;
        self.inner.work.notify_one();
        Ok(())
    }

    /// Waits until every copy enqueued so far has run.
    ///
    /// # Errors
    /// None.
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize();
        Ok(())
    }

    /// Zeroed host memory, 4096-byte aligned, standing for GPU memory.
    ///
    /// # Errors
    /// Out of memory.
    fn alloc(&self, len: usize) -> Result<GpuMem> {
        let buf = HostQueueMemory.alloc(len)?;
        let addr = buf.host_ptr() as u64;
        Ok(GpuMem::new(addr, len, Box::new(SimAlloc { buf: Some(buf), inner: self.inner.clone() })))
    }
}
