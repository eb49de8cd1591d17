//! The proxy thread (MSCCL++ `ProxyService`): pops triggers, posts their WQEs through the NIC's host path —
//! the same Exclusive [`Qp`] code device code runs, on the connection's own SQ ring — rings doorbells in
//! batches, polls the CQs, and reports completions and errors back to device code.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_utils::Backoff;
use gdaki_device::error::CqeError;
use gdaki_device::onesided::{atomic_target, local, remote};
use gdaki_device::qp::Qp;
use gdaki_device::wqe;
use gdaki_shared::channel::PortChannelHandle;
use gdaki_shared::handle::QpHandle;
use gdaki_shared::prm::opcode::syndrome;
use gdaki_shared::proxy::{mode, FifoHandle, Trigger};

use crate::exec::Executor;
use crate::mem::MappedBuf;
use crate::{Error, Result};

use super::fifo::Fifo;

/// Vendor syndrome of the error the proxy reports, with syndrome `WR_FLUSH_ERR` (0x05), when it could not
/// post a trigger's WQEs at all (e.g. no room in the SQ within the timeout): not a NIC's code.
pub const VENDOR_PROXY_POST: u8 = 0x80;

/// Vendor syndrome of the error the proxy reports, with syndrome `WR_FLUSH_ERR` (0x05), on every QP it serves
/// when a trigger names no channel registered with it (a handle made or edited by hand): it cannot tell whose
/// work was lost, so every channel's next flush says that some was. (A hand-made id that some channel of this
/// proxy has goes to that channel: nothing tells them apart.) Not a NIC's code.
pub const VENDOR_PROXY_UNKNOWN_CHANNEL: u8 = 0x81;

/// Triggers the proxy handles before it rings the doorbells of the QPs it posted to, when the FIFO does not
/// run empty first (MSCCL++'s proxy also posts several work requests per doorbell).
const DOORBELL_BATCH: u32 = 32;

/// One channel as the proxy knows it.
#[derive(Clone, Copy, Debug)]
struct ChannelEntry {
    handle: PortChannelHandle,
    /// Index of its QP in the registry.
    qp: usize,
    no_atomic: bool,
    /// Index of its semaphore's outbound counter (HostNoAtomic signals write the counter's new value).
    counter: usize,
}

/// A QP the proxy is to post to: its handle as the NIC made it (nothing posted yet), and what keeps the QP
/// and its queue memory alive while the proxy may use them.
pub(crate) struct ProxyQp {
    /// Tells QPs apart: equal for channels on one QP.
    pub key: usize,
    /// The QP's handle (ring, dbrec, doorbell register and CQ at host-usable addresses; counters at zero).
    pub handle: QpHandle,
    /// Dropped when the proxy is.
    pub _keep: Arc<dyn std::any::Any + Send + Sync>,
}

/// One QP the proxy posts to.
struct QpEntry {
    qp: ProxyQp,
    /// The sticky error word device code reads (see [`PortChannelHandle::proxy_err`]).
    err: MappedBuf,
}

impl std::fmt::Debug for QpEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpEntry").field("qpn", &self.qp.handle.qpn).finish_non_exhaustive()
    }
}

/// What the proxy learns of while it runs: registrations, and the request to stop.
#[derive(Debug, Default)]
struct Registry {
    channels: Vec<ChannelEntry>,
    qps: Vec<QpEntry>,
    counters: usize,
}

#[derive(Debug)]
struct Shared {
    registry: Mutex<Registry>,
    /// Channels registered so far, for `Debug` (which takes no lock).
    registered: AtomicUsize,
    stop: AtomicBool,
    /// Triggers done so far, for [`ProxyService::done`].
    done: AtomicU64,
}

/// A CPU proxy (MSCCL++ `ProxyService`) for the Host and HostNoAtomic modes of port channels: one dedicated
/// thread that polls one FIFO of triggers, which device code pushes to, and posts RDMA WRITEs, fetch-adds
/// and (HostNoAtomic) semaphore WRITEs on the channels' QPs, with no sleeps or locks on its hot path.
///
/// Dropping it drains it: the thread handles every trigger already pushed, rings, waits (bounded) for every
/// WQE it posted to complete, then exits.
pub struct ProxyService {
    shared: Arc<Shared>,
    fifo: FifoHandle,
    exec: Executor,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ProxyService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyService")
            .field("fifo_size", &self.fifo.size)
            .field("channels", &self.shared.registered.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl ProxyService {
    /// Starts a proxy with a FIFO of `fifo_size` slots for device code of `exec`; its waits for room in an SQ
    /// and for completions are bounded by `timeout`.
    ///
    /// # Errors
    /// As the FIFO's allocation ([`Error::InvalidArgument`] for a size that is not a power of two in
    /// 2 ..= 2^20); [`Error::Unavailable`] when the thread cannot be started.
    pub fn start(exec: &Executor, fifo_size: u32, timeout: Duration) -> Result<Self> {
        let fifo = Fifo::new(exec, fifo_size)?;
        let handle = fifo.handle();
        let shared = Arc::new(Shared {
            registry: Mutex::new(Registry::default()),
            registered: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            done: AtomicU64::new(0),
        });
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("gdaki-proxy".into())
            .spawn(move || Worker::new(s, fifo, timeout_ns).run())
            .map_err(|e| Error::Unavailable(format!("cannot start the proxy thread: {e}")))?;
        Ok(Self { shared, fifo: handle, exec: exec.clone(), thread: Some(thread) })
    }

    /// Registers a channel whose WQEs this proxy posts; returns its device handle completed with the FIFO,
    /// the channel id and the QP's error word. `handle` is the channel's Device-mode handle; `proxy_mode` is
    /// [`mode::HOST`] or [`mode::HOST_NO_ATOMIC`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] past 65,536 channels (ids are 16 bits); allocation errors.
    pub(crate) fn register(
        &self,
        qp: ProxyQp,
        mut handle: PortChannelHandle,
        proxy_mode: u32,
    ) -> Result<PortChannelHandle> {
        let mut reg = self.shared.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let id = reg.channels.len();
        if id > u16::MAX as usize {
            return Err(Error::InvalidArgument("a proxy serves at most 65,536 channels".into()));
        }
        let qp = match reg.qps.iter().position(|q| q.qp.key == qp.key) {
            Some(q) => q,
            None => {
                let err = self.exec.queue_memory().alloc(8)?;
                reg.qps.push(QpEntry { qp, err });
                reg.qps.len() - 1
            }
        };
        // Channels that signal one semaphore share its counter, so that HostNoAtomic values keep counting.
        let same_sem =
            |c: &ChannelEntry| bytemuck::bytes_of(&c.handle.remote_sem) == bytemuck::bytes_of(&handle.remote_sem);
        let counter = match reg.channels.iter().find(|c| same_sem(c)) {
            Some(c) => c.counter,
            None => {
                reg.counters += 1;
                reg.counters - 1
            }
        };
        handle.fifo = self.fifo;
        handle.proxy = proxy_mode;
        handle.channel_id = id as u32;
        handle.proxy_err = reg.qps[qp].err.device_addr();
        reg.channels.push(ChannelEntry { handle, qp, no_atomic: proxy_mode == mode::HOST_NO_ATOMIC, counter });
        self.shared.registered.store(reg.channels.len(), Ordering::Release);
        Ok(handle)
    }

    /// The FIFO's device handle.
    pub fn fifo(&self) -> FifoHandle {
        self.fifo
    }

    /// Triggers the proxy has done so far.
    pub fn done(&self) -> u64 {
        self.shared.done.load(Ordering::Acquire)
    }
}

impl Drop for ProxyService {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::warn!("the proxy thread panicked");
            }
        }
    }
}

/// A QP as the proxy thread drives it: an Exclusive device-code [`Qp`] over the proxy's own copy of the
/// QP's handle (the proxy is the only poster of a Host-mode QP).
struct Lane {
    qp: Qp<'static>,
    /// The handle `qp` borrows, freed after it (see `Drop`).
    handle: *mut QpHandle,
    err: *mut u64,
    /// Posted since the last doorbell.
    unrung: bool,
}

impl Lane {
    fn new(e: &QpEntry, timeout_ns: u64) -> Self {
        let handle = Box::into_raw(Box::new(e.qp.handle));
        // SAFETY: `handle` is a live QP's handle (the registry keeps the QP alive as long as the worker, which
        // owns this lane), used by this lane only, and freed only after `qp` (Drop below).
        let qp = unsafe { Qp::new(&mut *handle, timeout_ns) };
        Self { qp, handle, err: e.err.host_ptr() as *mut u64, unrung: false }
    }

    fn ring(&mut self) {
        if self.unrung {
            self.qp.ring_db();
            self.unrung = false;
        }
    }

    /// Records `e` in the error word unless an earlier error is there.
    fn report(&self, e: CqeError) {
        // SAFETY: the QP's 8-byte error word (queue memory kept by the registry); device code only loads it.
        let w = unsafe { AtomicU64::from_ptr(self.err) };
        let _ = w.compare_exchange(0, 1 << 32 | e.pack() as u64, Ordering::Release, Ordering::Relaxed);
    }

    /// Reports the QP's sticky error CQE, if it has one.
    fn report_cqe(&self) {
        if let Some(e) = self.qp.error() {
            self.report(e);
        }
    }

    fn outstanding(&self) -> bool {
        let h = self.qp.handle();
        h.sq.ci < h.sq.pi
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // SAFETY: from `Box::into_raw` in `new`; `qp`, its only user, is not used after this.
        drop(unsafe { Box::from_raw(self.handle) });
    }
}

/// The proxy thread's state: everything here is its own, so the hot path takes no lock.
struct Worker {
    shared: Arc<Shared>,
    fifo: Fifo,
    timeout_ns: u64,
    channels: Vec<ChannelEntry>,
    lanes: Vec<Lane>,
    counters: Vec<u64>,
}

impl Worker {
    fn new(shared: Arc<Shared>, fifo: Fifo, timeout_ns: u64) -> Self {
        Self { shared, fifo, timeout_ns, channels: Vec::new(), lanes: Vec::new(), counters: Vec::new() }
    }

    /// Takes the registrations made since the last look (the only place that locks).
    fn refresh(&mut self) {
        let reg = self.shared.registry.lock().unwrap_or_else(PoisonError::into_inner);
        self.channels.clone_from(&reg.channels);
        for e in &reg.qps[self.lanes.len()..] {
            self.lanes.push(Lane::new(e, self.timeout_ns));
        }
        self.counters.resize(reg.counters, 0);
    }

    fn run(mut self) {
        let backoff = Backoff::new();
        let mut batch = 0;
        loop {
            if let Some(t) = self.fifo.peek() {
                self.handle(t);
                self.fifo.pop();
                self.shared.done.store(self.fifo.popped(), Ordering::Release);
                batch += 1;
                if batch == DOORBELL_BATCH {
                    self.ring_all();
                    batch = 0;
                }
                backoff.reset();
                continue;
            }
            // The FIFO ran empty: ring what is pending, look at the CQs, then spin and yield.
            self.ring_all();
            batch = 0;
            self.progress();
            if self.shared.stop.load(Ordering::Acquire) && self.fifo.peek().is_none() {
                self.drain();
                return;
            }
            backoff.snooze();
        }
    }

    fn ring_all(&mut self) {
        for l in &mut self.lanes {
            l.ring();
        }
    }

    /// Polls one CQE of each QP with WQEs outstanding, so that errors (a dead peer, a bad key) reach device
    /// code's waits without a flush.
    fn progress(&mut self) {
        for l in &mut self.lanes {
            if l.outstanding() {
                let _ = l.qp.poll_cq();
                l.report_cqe();
            }
        }
    }

    /// On stop: waits until every WQE posted has completed, reporting errors.
    fn drain(&mut self) {
        for l in &mut self.lanes {
            if let Err(gdaki_device::Error::Cqe(e)) = l.qp.flush() {
                l.report(e);
            }
        }
    }

    fn handle(&mut self, t: Trigger) {
        let id = t.channel() as usize;
        if id >= self.channels.len() {
            // A channel registered since the last look, or none: either way the QPs registered so far are the
            // ones an unknown channel's error goes to.
            self.refresh();
        }
        let Some(&ch) = self.channels.get(id) else {
            tracing::warn!(channel = id, "proxy trigger for an unknown channel dropped: every QP of the proxy fails");
            let e = CqeError {
                syndrome: syndrome::WR_FLUSH_ERR,
                vendor_err_synd: VENDOR_PROXY_UNKNOWN_CHANNEL,
                wqe_counter: 0,
            };
            for l in &self.lanes {
                l.report(e);
            }
            return;
        };
        let ops = t.ops();
        let result = self.post(&ch, t);
        let lane = &mut self.lanes[ch.qp];
        if let Err(e) = result {
            lane.report(match e {
                gdaki_device::Error::Cqe(c) => c,
                _ => CqeError { syndrome: syndrome::WR_FLUSH_ERR, vendor_err_synd: VENDOR_PROXY_POST, wqe_counter: 0 },
            });
            tracing::warn!(channel = id, "proxy could not post a trigger: {e}");
        }
        if ops & Trigger::FLUSH != 0 {
            lane.ring();
            lane.unrung = false;
            if let Err(gdaki_device::Error::Cqe(e)) = lane.qp.flush() {
                lane.report(e);
            }
            lane.report_cqe();
        }
    }

    /// Posts the WQEs of `t`'s put, accumulate and signal (not rung).
    fn post(&mut self, ch: &ChannelEntry, t: Trigger) -> gdaki_device::Result<()> {
        let h = &ch.handle;
        let lane = &mut self.lanes[ch.qp];
        let ops = t.ops();
        if ops & Trigger::PUT != 0 {
            let (dst, src, bytes) = (t.dst_offset(), t.src_offset(), t.size());
            let max = h.max_wqe_bytes.clamp(1, i32::MAX as u64);
            let mut done = 0;
            while done < bytes {
                let n = (bytes - done).min(max);
                let (r, l) = (remote(&h.dst, dst + done, n)?, local(&h.src, src + done, n)?);
                let _ = lane.qp.post(false, wqe::rdma_write(r, l))?;
                lane.unrung = true;
                done += n;
            }
        }
        if ops & Trigger::ACCUMULATE != 0 {
            let (r, l) = atomic_target(&h.dst, t.dst_offset(), &h.scratch, 0)?;
            let _ = lane.qp.post(false, wqe::atomic_fetch_add(r, l, t.addend())?)?;
            lane.unrung = true;
        }
        if ops & Trigger::SIGNAL != 0 {
            if ch.no_atomic {
                // HostNoAtomic: the semaphore's new value, inline in the WQE (MSCCL++ writes its outbound token).
                let n = &mut self.counters[ch.counter];
                *n += 1;
                let r = remote(&h.remote_sem, 0, 8)?;
                let _ = lane.qp.post_write_inline(false, r, &n.to_ne_bytes())?;
            } else {
                let (r, l) = atomic_target(&h.remote_sem, 0, &h.scratch, 0)?;
                let _ = lane.qp.post(false, wqe::atomic_fetch_add(r, l, 1)?)?;
            }
            lane.unrung = true;
        }
        Ok(())
    }
}
