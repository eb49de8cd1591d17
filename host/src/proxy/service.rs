//! The proxy thread (MSCCL++ `ProxyService`): pops triggers, posts their WQEs through the NIC's host path —
//! the same Exclusive [`Qp`] code device code runs, on the connection's own SQ ring — rings doorbells in
//! batches, polls the CQs, and reports completions and errors back to device code.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use gdaki_device::error::CqeError;
use gdaki_device::onesided::{atomic_target, local, remote};
use gdaki_device::qp::Qp;
use gdaki_device::sq::{free_wqebbs, valid_ring};
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
/// post a trigger's WQEs at all (e.g. no room in the SQ within the timeout, or a put whose range is outside the
/// channel's memories as registered, of which it posts nothing), and when the proxy gives up on a QP whose CQ
/// holds a CQE of none of its WQEs (nothing behind that CQE can be polled; someone else posted to the QP or
/// its CQ): not a NIC's code.
pub const VENDOR_PROXY_POST: u8 = 0x80;

/// Vendor syndrome of the error the proxy reports, with syndrome `WR_FLUSH_ERR` (0x05), on every QP it serves
/// when a trigger names no channel registered with it (a handle made or edited by hand): it cannot tell whose
/// work was lost, so every channel's next flush says that some was. (A hand-made id that some channel of this
/// proxy has goes to that channel: nothing tells them apart.) Not a NIC's code.
pub const VENDOR_PROXY_UNKNOWN_CHANNEL: u8 = 0x81;

/// Vendor syndrome of the error the proxy reports, with syndrome `WR_FLUSH_ERR` (0x05), on a QP whose WQEs had
/// not completed by the stopping proxy's deadline (see [`ProxyService`]'s drop; while it runs, a FLUSH waits
/// for them however long the NIC takes, since a FLUSH is done only once they have), and for every trigger on
/// that QP it handles after: it posts nothing more there. Not a NIC's code.
pub const VENDOR_PROXY_FLUSH: u8 = 0x82;

/// A proxy failure of its own, reported as a flushed WQE (syndrome `WR_FLUSH_ERR`) with vendor syndrome
/// `vendor`; the lane's QPN is added when it is reported.
fn flushed(vendor: u8) -> CqeError {
    CqeError { syndrome: syndrome::WR_FLUSH_ERR, vendor_err_synd: vendor, wqe_counter: 0, qpn: 0 }
}

/// Triggers the proxy handles before it rings the doorbells of the QPs it posted to, when the FIFO does not
/// run empty first (MSCCL++'s proxy also posts several work requests per doorbell).
const DOORBELL_BATCH: u32 = 32;

/// One channel as the proxy knows it.
#[derive(Clone, Debug)]
struct ChannelEntry {
    handle: PortChannelHandle,
    /// Slot of its QP in the registry (and of its lane in the worker).
    qp: usize,
    no_atomic: bool,
    /// Its semaphore's outbound count (HostNoAtomic signals write the count's new value): the semaphore's own,
    /// shared by every channel on it and by nothing else, so that a semaphore made later, even one whose peer
    /// word has the address and key of a dropped one, counts from 0 as its peer's inbound word does.
    counter: Arc<AtomicU64>,
}

/// A QP the proxy is to post to: its handle as the NIC made it (nothing posted yet), and what keeps the QP
/// and its queue memory alive while the proxy may use them.
pub(crate) struct ProxyQp {
    /// Tells QPs apart: equal for channels on one QP, and unique among the QPs the proxy serves (the address of
    /// what `_keep` holds, which lives as long as the proxy serves the QP).
    pub key: usize,
    /// The QP's handle (ring, dbrec, doorbell register and CQ at host-usable addresses; counters at zero).
    pub handle: QpHandle,
    /// Dropped when the proxy releases the QP ([`Worker::retire`]) or stops.
    pub _keep: Arc<dyn std::any::Any + Send + Sync>,
}

/// One QP the proxy posts to.
struct QpEntry {
    qp: ProxyQp,
    /// The sticky error word device code reads (see [`PortChannelHandle::proxy_err`]).
    err: MappedBuf,
    /// Ids registered on this QP and not yet given back.
    channels: usize,
    /// Whether the connection's own handles are gone ([`QpUse`]'s drop): no channel can be registered on it
    /// again, so the proxy releases it once `channels` is 0.
    orphaned: bool,
}

impl std::fmt::Debug for QpEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpEntry").field("qpn", &self.qp.handle.qpn).finish_non_exhaustive()
    }
}

/// What the proxy learns of while it runs: registrations, and the request to stop.
#[derive(Debug, Default)]
struct Registry {
    /// By channel id; `None` for an id given back.
    channels: Vec<Option<ChannelEntry>>,
    /// By slot; `None` for a slot released and free to take again.
    qps: Vec<Option<QpEntry>>,
    /// Slots of `qps` released and free to take again.
    free_qps: Vec<usize>,
    /// Slots of QPs whose connection's handles went since the worker last looked ([`Worker::retire`]).
    orphans: Vec<usize>,
    /// Ids given back and free to take again.
    free: Vec<u32>,
    /// Ids of channels dropped since the worker last looked ([`Worker::retire`]).
    retiring: Vec<u32>,
    /// Ids dropped and not yet free (in `retiring` or the worker's `draining`).
    pending: usize,
}

/// Most channels a proxy serves at a time: ids are 16 bits in a trigger.
const MAX_CHANNELS: usize = 1 << 16;

#[derive(Debug)]
struct Shared {
    registry: Mutex<Registry>,
    /// Channels registered now, for `Debug` (which takes no lock).
    registered: AtomicUsize,
    /// QPs served now ([`ProxyService::qps`]).
    qps: AtomicUsize,
    /// Set when a channel is dropped, for the worker to give its id back, and when a connection's handles are
    /// gone, for it to release the QP.
    retire: AtomicBool,
    /// Bound of [`ProxyService::register`]'s wait for an id being given back.
    timeout: Duration,
    stop: AtomicBool,
    /// When the drop set `stop`: the stopping worker's waits count their timeout from there
    /// ([`Worker::stopping`]), not from when it first looks, which a wait begun before the stop may delay by
    /// up to a timeout.
    stopped_at: OnceLock<Instant>,
    /// Triggers done so far, for [`ProxyService::done`].
    done: AtomicU64,
}

/// A CPU proxy (MSCCL++ `ProxyService`) for the Host and HostNoAtomic modes of port channels: one dedicated
/// thread that polls one FIFO of triggers, which device code pushes to, and posts RDMA WRITEs, fetch-adds
/// and (HostNoAtomic) semaphore WRITEs on the channels' QPs, with no sleeps or locks on its hot path.
///
/// It holds each QP it serves (the connection's innards: QP, CQ, queue and state memory) from the first channel
/// registered on it until it releases it: once every channel registered on the QP has been dropped and every
/// trigger pushed before has been done, the connection's own handles are gone (no clone of it is left: channels
/// and semaphores hold one), and the WQEs it posted there have completed or one failed. Then it stops polling
/// the QP and lets go of it, which destroys the QP and its CQ ([`qps`](Self::qps) counts the QPs it holds).
///
/// Dropping it drains it: the thread handles every trigger already pushed, rings, waits for every WQE it posted
/// to complete or fail, then exits. From the drop on, every wait of the thread (for room in an SQ, for a FLUSH
/// trigger's WQEs, for the final drain) ends by one deadline shared by all its QPs: its timeout after the drop
/// began, put back to its timeout after each CQE it polls. A QP still waited on when that deadline passes is
/// given up: it gets [`VENDOR_PROXY_FLUSH`], and the triggers left for it post nothing. So a NIC that completes
/// nothing costs one timeout in all (and the time to post what the FIFO holds for live QPs), however many QPs,
/// FLUSH triggers or full SQs wait on it. A QP whose CQ holds a CQE of none of its WQEs, which stops every
/// poll of it, is given up at once with [`VENDOR_PROXY_POST`], while the proxy runs as well: device code that
/// posts on a Host-mode channel's QP handle itself puts such CQEs there.
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
            qps: AtomicUsize::new(0),
            retire: AtomicBool::new(false),
            timeout,
            stop: AtomicBool::new(false),
            stopped_at: OnceLock::new(),
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
    /// the channel id and the QP's error word, and the registration, which gives the id back when dropped. `handle` is the channel's Device-mode handle; `proxy_mode` is
    /// [`mode::HOST`] or [`mode::HOST_NO_ATOMIC`]; `sem_count` is the outbound count of the channel's
    /// semaphore (HostNoAtomic), which every channel on that semaphore passes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when 65,536 channels are registered at once (ids are 16 bits) and none of
    /// those dropped is given back within the proxy's timeout; allocation errors.
    pub(crate) fn register(
        &self,
        qp: ProxyQp,
        mut handle: PortChannelHandle,
        proxy_mode: u32,
        sem_count: Arc<AtomicU64>,
    ) -> Result<(PortChannelHandle, Registration)> {
        let mut reg = self.shared.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let deadline = crate::deadline::after(self.shared.timeout);
        let id = loop {
            if let Some(id) = reg.free.pop() {
                break id as usize;
            }
            if reg.channels.len() < MAX_CHANNELS {
                reg.channels.push(None);
                break reg.channels.len() - 1;
            }
            // Every id is taken: wait for the worker to give back one of a dropped channel, if any.
            if reg.pending == 0 || std::time::Instant::now() > deadline {
                return Err(Error::InvalidArgument(format!(
                    "a proxy serves at most {MAX_CHANNELS} channels at a time ({} dropped ones not yet given back)",
                    reg.pending
                )));
            }
            drop(reg);
            std::thread::sleep(Duration::from_micros(50));
            reg = self.shared.registry.lock().unwrap_or_else(PoisonError::into_inner);
        };
        let slot = match reg.qps.iter().position(|q| q.as_ref().is_some_and(|q| q.qp.key == qp.key)) {
            Some(q) => q,
            None => {
                let err = match self.exec.queue_memory().alloc(8) {
                    Ok(err) => err,
                    Err(e) => {
                        // The id taken above goes back at once: nothing can have used it.
                        reg.free.push(id as u32);
                        return Err(e);
                    }
                };
                let entry = Some(QpEntry { qp, err, channels: 0, orphaned: false });
                self.shared.qps.fetch_add(1, Ordering::Relaxed);
                match reg.free_qps.pop() {
                    Some(q) => {
                        reg.qps[q] = entry;
                        q
                    }
                    None => {
                        reg.qps.push(entry);
                        reg.qps.len() - 1
                    }
                }
            }
        };
        let entry = reg.qps[slot].as_mut().expect("a QP slot just found or filled");
        entry.channels += 1;
        handle.fifo = self.fifo;
        handle.proxy = proxy_mode;
        handle.channel_id = id as u32;
        handle.proxy_err = entry.err.device_addr();
        let qp = slot;
        let no_atomic = proxy_mode == mode::HOST_NO_ATOMIC;
        reg.channels[id] = Some(ChannelEntry { handle, qp, no_atomic, counter: sem_count });
        self.shared.registered.fetch_add(1, Ordering::Relaxed);
        Ok((handle, Registration { shared: self.shared.clone(), id: id as u32 }))
    }

    /// The FIFO's device handle.
    pub fn fifo(&self) -> FifoHandle {
        self.fifo
    }

    /// Triggers the proxy has done so far.
    pub fn done(&self) -> u64 {
        self.shared.done.load(Ordering::Acquire)
    }

    /// QPs the proxy serves now: those a channel has been registered on, until the proxy releases them. The
    /// proxy releases a connection's QP once every channel registered on it has been dropped and every trigger
    /// pushed before has been done, the connection's own handles are gone, and the WQEs it posted there have
    /// completed (or one failed); the QP and its CQ are destroyed then. Released QPs leave the count when the
    /// proxy is idle (it looks each time its FIFO runs empty), once they are destroyed.
    pub fn qps(&self) -> usize {
        self.shared.qps.load(Ordering::Acquire)
    }

    /// Tells the proxy that the handles of the connection whose QP has `key` are gone ([`QpUse`]).
    fn orphan(&self, key: usize) {
        let mut reg = self.shared.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(slot) = reg.qps.iter().position(|q| q.as_ref().is_some_and(|q| q.qp.key == key)) else {
            // No channel was ever registered on it: the proxy holds nothing of it.
            return;
        };
        if let Some(e) = reg.qps[slot].as_mut() {
            e.orphaned = true;
        }
        reg.orphans.push(slot);
        self.shared.retire.store(true, Ordering::Release);
    }
}

/// A connection's use of a proxy, shared by the connection's clones (so by its channels and semaphores): when
/// the last goes, the proxy learns that no channel can be registered on the QP again, and releases it once the
/// channels registered on it are given back ([`ProxyService::qps`]).
#[derive(Debug)]
pub(crate) struct QpUse {
    proxy: Arc<ProxyService>,
    /// The connection's [`ProxyQp::key`]. Its owner must drop this before the connection's innards, so that
    /// the key names no other QP when the drop tells the proxy.
    key: usize,
}

impl QpUse {
    /// The use of `proxy` by the connection whose QP will register with `key`.
    pub(crate) fn new(proxy: Arc<ProxyService>, key: usize) -> Self {
        Self { proxy, key }
    }

    /// The proxy.
    pub(crate) fn proxy(&self) -> &Arc<ProxyService> {
        &self.proxy
    }
}

impl Drop for QpUse {
    fn drop(&mut self) {
        self.proxy.orphan(self.key);
    }
}

/// A channel's registration with a proxy ([`ProxyService::register`]). Dropping it gives the channel's id back
/// once every trigger pushed for it before has been done: the worker takes the id, reads the FIFO's `head`, and
/// frees the id once it has done every trigger below that index ([`Worker::retire`]). Until then the channel's
/// triggers are still posted as registered; after, a trigger with its id (from a kernel still using a dropped
/// channel) names no channel, or a newer channel that took the id. The last id of a QP freed this way lets the
/// proxy release the QP, once its connection's handles are gone too ([`QpUse`]).
#[derive(Debug)]
pub(crate) struct Registration {
    shared: Arc<Shared>,
    id: u32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut reg = self.shared.registry.lock().unwrap_or_else(PoisonError::into_inner);
        reg.retiring.push(self.id);
        reg.pending += 1;
        self.shared.registered.fetch_sub(1, Ordering::Relaxed);
        self.shared.retire.store(true, Ordering::Release);
    }
}

impl Drop for ProxyService {
    fn drop(&mut self) {
        // Before the flag: a worker that sees the flag finds the time set.
        let _ = self.shared.stopped_at.set(Instant::now());
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
    /// Whether the worker stopped waiting on this QP for good (stopping, its deadline passed; or, running or
    /// stopping, its CQ holds a CQE that stops every poll): the QP counts as settled, and the triggers left
    /// for it post nothing.
    given_up: bool,
}

/// How a running proxy's flush of a lane ended ([`Lane::flush`]).
enum Flush {
    /// Every WQE posted has completed, or the failure is reported.
    Done,
    /// A wait timed out with the proxy stopping, the WQEs not all completed: the worker waits on against its
    /// stop deadline. `moved`: that wait took CQEs.
    Stopping { moved: bool },
}

/// What a stopping worker waits for on a lane ([`Worker::settle`]).
#[derive(Clone, Copy)]
enum Until {
    /// Every WQE posted has completed, or one failed ([`Lane::settled`]).
    Settled,
    /// Room for one more WQE in the SQ ([`Lane::has_room`]).
    Room,
}

/// Why a trigger's WQEs were not all posted ([`Worker::post`]).
enum PostError {
    /// As the device code's post says.
    Device(gdaki_device::Error),
    /// The worker gave up on the QP ([`Lane::given_up`]), which is reported already.
    GivenUp,
}

impl From<gdaki_device::Error> for PostError {
    fn from(e: gdaki_device::Error) -> Self {
        Self::Device(e)
    }
}

impl Lane {
    fn new(e: &QpEntry, timeout_ns: u64) -> Self {
        let handle = Box::into_raw(Box::new(e.qp.handle));
        // SAFETY: `handle` is a live QP's handle (the registry's entry keeps the QP alive, and the worker drops
        // this lane before that entry: `Worker::release`, or the worker's own drop before the registry's), used
        // by this lane only, and freed only after `qp` (Drop below).
        let qp = unsafe { Qp::new(&mut *handle, timeout_ns) };
        Self { qp, handle, err: e.err.host_ptr() as *mut u64, unrung: false, given_up: false }
    }

    fn ring(&mut self) {
        if self.unrung {
            self.qp.ring_db();
            self.unrung = false;
        }
    }

    /// Records `e` in the error word, with this lane's QPN, unless an earlier error is there.
    fn report(&self, e: CqeError) {
        // SAFETY: the QP's 8-byte error word (queue memory kept by the registry); device code only loads it.
        let w = unsafe { AtomicU64::from_ptr(self.err) };
        let qpn = u64::from(self.qp.handle().qpn & 0x00ff_ffff);
        let word = (1 << 24 | qpn) << 32 | u64::from(e.pack());
        let _ = w.compare_exchange(0, word, Ordering::Release, Ordering::Relaxed);
    }

    /// Stops waiting on this QP for good ([`Lane::given_up`]), reporting `vendor`.
    fn give_up(&mut self, vendor: u8) {
        self.given_up = true;
        self.report(flushed(vendor));
    }

    /// Whether a WQE the proxy posts (one WQEBB each) is posted without waiting for room. A ring of a size
    /// device code cannot post to says yes: its post fails at once.
    fn has_room(&self) -> bool {
        let h = self.qp.handle();
        !valid_ring(h.wqe_cnt) || free_wqebbs(h.wqe_cnt, h.sq.pi, h.sq.ci) > 0
    }

    /// Whether what `until` names is there (or the QP is given up).
    fn done(&mut self, until: Until) -> bool {
        match until {
            Until::Settled => self.settled(),
            Until::Room => self.given_up || self.has_room(),
        }
    }

    /// Polls the CQ once; returns whether it took a CQE. A CQE of none of this QP's WQEs (another poster
    /// used the QP or its CQ behind the proxy's back, e.g. device code posting on a Host-mode channel's QP
    /// handle) stays in the CQ and stops every later poll, so nothing the proxy posted there can complete: the
    /// lane is given up at once with [`VENDOR_PROXY_POST`], which every wait of its channels then reports,
    /// rather than their waits running out for signals that cannot come.
    fn poll(&mut self) -> bool {
        match self.qp.poll_cq() {
            None => false,
            Some(Ok(_) | Err(gdaki_device::Error::Cqe(_))) => true,
            Some(Err(e)) => {
                tracing::warn!(qpn = self.qp.handle().qpn, "the proxy gives up on a QP: {e}");
                self.give_up(VENDOR_PROXY_POST);
                false
            }
        }
    }

    /// Reports the QP's sticky error CQE, if it has one.
    fn report_cqe(&self) {
        if let Some(e) = self.qp.error() {
            self.report(e);
        }
    }

    /// Waits until every WQE posted on this QP has completed (ringing what is unrung), reporting an error CQE,
    /// for a proxy that runs. A wait that times out is tried again: the NIC has not completed the WQEs yet (a
    /// stalled peer; a dead one ends in an error CQE after the transport's retries), and a FLUSH may be
    /// counted done only once it has. One that times out with the proxy stopping returns
    /// [`Flush::Stopping`], for the worker to wait on against its stop deadline ([`Worker::settle`]). Any other
    /// failure is reported as [`VENDOR_PROXY_POST`].
    fn flush(&mut self, stop: &AtomicBool) -> Flush {
        self.unrung = false;
        let vendor = loop {
            let ci = self.qp.handle().sq.ci;
            match self.qp.flush() {
                Ok(()) => break None,
                Err(gdaki_device::Error::Cqe(e)) => {
                    self.report(e);
                    break None;
                }
                Err(gdaki_device::Error::Timeout(_)) if !stop.load(Ordering::Acquire) => {
                    tracing::debug!(qpn = self.qp.handle().qpn, "proxy flush still waiting for the NIC");
                }
                Err(gdaki_device::Error::Timeout(_)) => {
                    return Flush::Stopping { moved: self.qp.handle().sq.ci != ci };
                }
                Err(e) => {
                    tracing::warn!(qpn = self.qp.handle().qpn, "proxy flush failed: {e}");
                    break Some(VENDOR_PROXY_POST);
                }
            }
        };
        if let Some(vendor_err_synd) = vendor {
            self.report(flushed(vendor_err_synd));
        }
        self.report_cqe();
        Flush::Done
    }

    fn outstanding(&self) -> bool {
        let h = self.qp.handle();
        h.sq.ci < h.sq.pi
    }

    /// Whether the QP may be released: every WQE posted on it has completed, or one failed (the NIC then
    /// completes the rest in error, and nothing more of them can land), or the worker gave up on it.
    /// Asks for a CQE first when the last WQE posted did not (the proxy posts unsignaled), so that
    /// [`Worker::progress`] sees them complete.
    fn settled(&mut self) -> bool {
        if self.given_up || self.qp.error().is_some() || !self.outstanding() {
            return true;
        }
        let h = self.qp.handle();
        // Only when the ring has room for it: a full ring would make the post wait for room (up to the
        // timeout), and its outstanding WQEs include signaled ones, whose CQEs make that room.
        if h.sq.sig_end != h.sq.pi && free_wqebbs(h.wqe_cnt, h.sq.pi, h.sq.ci) > 0 {
            if let Err(e) = self.qp.post(true, wqe::nop()) {
                // No room for the NOP within the timeout: tried again at the next look.
                tracing::debug!(qpn = h.qpn, "proxy could not ask for the CQE of a QP it releases: {e}");
                return false;
            }
            self.unrung = true;
            self.ring();
        }
        false
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // SAFETY: from `Box::into_raw` in `new`; `qp`, its only user, is not used after this.
        drop(unsafe { Box::from_raw(self.handle) });
    }
}

/// The lane of a channel's QP slot, for a channel the worker knows: registered on a QP whose lane the worker made
/// at the same look, and the QP is released only after the channel's id has been freed.
fn lane(lanes: &mut [Option<Lane>], slot: usize) -> &mut Lane {
    lanes[slot].as_mut().expect("a registered channel's QP has a lane")
}

/// The proxy thread's state: everything here is its own, so the hot path takes no lock.
struct Worker {
    shared: Arc<Shared>,
    fifo: Fifo,
    timeout_ns: u64,
    /// The registry's channels as of the last look.
    channels: Vec<Option<ChannelEntry>>,
    /// By the registry's QP slot; `None` for a slot released (or filled since the last look).
    lanes: Vec<Option<Lane>>,
    /// Ids of dropped channels taken from the registry, each with the FIFO's `head` read after it was taken:
    /// freed once the proxy has done every trigger below that index ([`Worker::retire`]).
    draining: Vec<(u32, u64)>,
    /// Slots of QPs with no channel left whose connection's handles are gone: released once their WQEs have
    /// settled ([`Lane::settled`]).
    releasing: Vec<usize>,
    /// Once the worker has seen the stop ([`Worker::stopping`]): the deadline every wait of it ends by.
    stop_by: Option<Instant>,
}

impl Worker {
    fn new(shared: Arc<Shared>, fifo: Fifo, timeout_ns: u64) -> Self {
        Self {
            shared,
            fifo,
            timeout_ns,
            channels: Vec::new(),
            lanes: Vec::new(),
            draining: Vec::new(),
            releasing: Vec::new(),
            stop_by: None,
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns)
    }

    /// Whether the proxy is stopping (its drop set `stop`). The first time it says so it sets the stop
    /// deadline: the proxy's timeout after the drop began.
    fn stopping(&mut self) -> bool {
        if self.stop_by.is_none() && self.shared.stop.load(Ordering::Acquire) {
            let timeout = self.timeout();
            let from = self.shared.stopped_at.get().copied().unwrap_or_else(Instant::now);
            self.stop_by = Some(from.checked_add(timeout).unwrap_or_else(|| crate::deadline::after(timeout)));
        }
        self.stop_by.is_some()
    }

    /// Puts the stop deadline, if set, back to the proxy's timeout from now: a CQE was polled.
    fn moved(&mut self) {
        if self.stop_by.is_some() {
            self.stop_by = Some(crate::deadline::after(self.timeout()));
        }
    }

    /// Takes the registrations made since the last look (the only place on the trigger path that locks; it
    /// runs for a trigger whose channel the worker does not know yet).
    fn refresh(&mut self) {
        let reg = self.shared.registry.lock().unwrap_or_else(PoisonError::into_inner);
        self.channels.clone_from(&reg.channels);
        self.lanes.resize_with(reg.qps.len(), || None);
        for (lane, e) in self.lanes.iter_mut().zip(&reg.qps) {
            if let (None, Some(e)) = (&lane, e) {
                *lane = Some(Lane::new(e, self.timeout_ns));
            }
        }
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
            self.retire();
            if self.shared.stop.load(Ordering::Acquire) && self.fifo.peek().is_none() {
                self.drain();
                return;
            }
            backoff.snooze();
        }
    }

    fn ring_all(&mut self) {
        for l in self.lanes.iter_mut().flatten() {
            l.ring();
        }
    }

    /// Polls one CQE of each QP with WQEs outstanding, so that errors (a dead peer, a bad key) reach device
    /// code's waits without a flush.
    fn progress(&mut self) {
        let mut moved = false;
        for l in self.lanes.iter_mut().flatten() {
            if l.outstanding() && !l.given_up {
                moved |= l.poll();
                l.report_cqe();
            }
        }
        if moved {
            self.moved();
        }
    }

    /// Gives back the ids of dropped channels, called when the FIFO is empty: an id is freed once the proxy has
    /// done every trigger whose index was taken before the id was taken from the registry (the FIFO's `head`,
    /// read then), so every trigger pushed for the channel before its drop has been done, even one behind an
    /// index another pusher took and had not stored yet. (The FIFO looking empty says nothing of such an
    /// index: its slot is empty until its pusher stores it, and the triggers after it wait behind it.)
    ///
    /// A QP goes the same way: once its last id has been freed and its connection's handles are gone
    /// ([`QpUse`]), in either order, it is released ([`Worker::release`]).
    fn retire(&mut self) {
        let popped = self.fifo.popped();
        if self.draining.iter().any(|&(_, mark)| mark <= popped) {
            let mut guard = self.shared.registry.lock().unwrap_or_else(PoisonError::into_inner);
            let reg = &mut *guard;
            let (channels, releasing) = (&mut self.channels, &mut self.releasing);
            self.draining.retain(|&(id, mark)| {
                if mark > popped {
                    return true;
                }
                let slot = reg.channels[id as usize].take().map(|c| c.qp);
                if let Some(c) = channels.get_mut(id as usize) {
                    *c = None;
                }
                reg.pending -= 1;
                reg.free.push(id);
                if let Some(slot) = slot {
                    if let Some(q) = reg.qps[slot].as_mut() {
                        q.channels -= 1;
                        if q.channels == 0 && q.orphaned && !releasing.contains(&slot) {
                            releasing.push(slot);
                        }
                    }
                }
                false
            });
        }
        if self.shared.retire.swap(false, Ordering::AcqRel) {
            let ids = {
                let mut reg = self.shared.registry.lock().unwrap_or_else(PoisonError::into_inner);
                for slot in std::mem::take(&mut reg.orphans) {
                    if reg.qps[slot].as_ref().is_some_and(|q| q.channels == 0) && !self.releasing.contains(&slot) {
                        self.releasing.push(slot);
                    }
                }
                std::mem::take(&mut reg.retiring)
            };
            match self.fifo.head() {
                Ok(mark) => self.draining.extend(ids.into_iter().map(|id| (id, mark))),
                Err(e) => {
                    // Looked at again at the next empty moment; until then the ids stay taken.
                    tracing::warn!("the proxy could not read its FIFO's head to give dropped channels' ids back: {e}");
                    let mut reg = self.shared.registry.lock().unwrap_or_else(PoisonError::into_inner);
                    reg.retiring.extend(ids);
                    self.shared.retire.store(true, Ordering::Release);
                }
            }
        }
        self.release();
    }

    /// Releases the QPs in `releasing` whose WQEs have settled ([`Lane::settled`]; looked at each time the FIFO
    /// runs empty, [`Worker::progress`] polling their CQs meanwhile): drops their lanes, then the registry's
    /// entries, whose hold on the connection's innards was the last one, so the QP and its CQ are destroyed
    /// (after the lock is let go).
    fn release(&mut self) {
        if self.releasing.is_empty() {
            return;
        }
        let lanes = &mut self.lanes;
        let mut settled = Vec::new();
        self.releasing.retain(|&slot| {
            // A QP whose channels pushed no trigger has no lane: nothing was posted on it.
            if lanes.get_mut(slot).and_then(Option::as_mut).is_none_or(Lane::settled) {
                settled.push(slot);
                return false;
            }
            true
        });
        if settled.is_empty() {
            return;
        }
        let mut gone = Vec::with_capacity(settled.len());
        {
            let mut reg = self.shared.registry.lock().unwrap_or_else(PoisonError::into_inner);
            for slot in settled {
                if let Some(l) = lanes.get_mut(slot) {
                    *l = None;
                }
                gone.push(reg.qps[slot].take());
                reg.free_qps.push(slot);
            }
        }
        let released = gone.len();
        drop(gone);
        // The QPs leave the count once destroyed: a caller that reads it as dropped finds them gone (before, the
        // count fell first, and a peer's WRITE sent after that read could still land on a QP not yet destroyed).
        self.shared.qps.fetch_sub(released, Ordering::Release);
    }

    /// On stop: waits until the WQEs posted on every QP have settled ([`Lane::settled`]: completed, or one
    /// failed), reporting errors, against the stop deadline ([`Worker::settle`]).
    fn drain(&mut self) {
        self.stopping();
        self.settle(None, Until::Settled);
    }

    /// For a stopping worker: waits until what `until` names is there on the lane of slot `only`, or on every
    /// lane for `None`, polling their CQs in turn and reporting errors, until the stop deadline
    /// ([`Worker::stopping`]), which every CQE polled puts back to the proxy's timeout from then. So a NIC
    /// that completes slowly gets the time it uses, and one that completes nothing costs one timeout in all,
    /// however many QPs and waits (this one and those before and after it) wait on it. A lane still waited on
    /// when the deadline passes is given up with [`VENDOR_PROXY_FLUSH`]. A lane whose CQ holds a CQE of none
    /// of its WQEs is given up at once with [`VENDOR_PROXY_POST`]: the poll leaves that CQE there and fails
    /// on it every time, so nothing behind it can complete, and counted as progress it would put the deadline
    /// back forever.
    fn settle(&mut self, only: Option<usize>, until: Until) {
        let timeout = self.timeout();
        let backoff = Backoff::new();
        let mut deadline = self.stop_by.unwrap_or_else(|| crate::deadline::after(timeout));
        loop {
            let (mut waiting, mut moved) = (false, false);
            for (slot, l) in self.lanes.iter_mut().enumerate() {
                let Some(l) = l.as_mut().filter(|_| only.is_none_or(|o| o == slot)) else {
                    continue;
                };
                if !l.done(until) {
                    waiting = true;
                    // Anything unrung would never complete.
                    l.ring();
                    moved |= l.poll();
                }
                l.report_cqe();
            }
            if !waiting {
                break;
            }
            if moved {
                deadline = crate::deadline::after(timeout);
                backoff.reset();
            } else if Instant::now() >= deadline {
                for (slot, l) in self.lanes.iter_mut().enumerate() {
                    let Some(l) = l.as_mut().filter(|_| only.is_none_or(|o| o == slot)) else {
                        continue;
                    };
                    if !l.done(until) {
                        tracing::warn!(qpn = l.qp.handle().qpn, "the stopping proxy's WQEs did not all complete");
                        l.give_up(VENDOR_PROXY_FLUSH);
                    }
                }
                break;
            }
            backoff.snooze();
        }
        self.stop_by = Some(deadline);
    }

    /// The lane of slot `slot`, ready for one more WQE: once the proxy is stopping, a full SQ is waited on here
    /// against the stop deadline (a running proxy's post waits for room itself, for up to its timeout).
    ///
    /// # Errors
    /// [`PostError::GivenUp`] for a lane the worker gave up on.
    fn lane_to_post(&mut self, slot: usize) -> std::result::Result<&mut Lane, PostError> {
        if self.stopping() && !lane(&mut self.lanes, slot).done(Until::Room) {
            self.settle(Some(slot), Until::Room);
        }
        let l = lane(&mut self.lanes, slot);
        if l.given_up {
            return Err(PostError::GivenUp);
        }
        Ok(l)
    }

    fn handle(&mut self, t: Trigger) {
        let id = t.channel() as usize;
        if self.channels.get(id).is_none_or(Option::is_none) {
            // A channel registered since the last look, or none: either way the QPs registered so far are the
            // ones an unknown channel's error goes to.
            self.refresh();
        }
        let Some(ch) = self.channels.get(id).cloned().flatten() else {
            tracing::warn!(channel = id, "proxy trigger for an unknown channel dropped: every QP of the proxy fails");
            for l in self.lanes.iter().flatten() {
                l.report(flushed(VENDOR_PROXY_UNKNOWN_CHANNEL));
            }
            return;
        };
        let l = lane(&mut self.lanes, ch.qp);
        if l.given_up {
            // The worker gave up on the QP: what is posted there may never complete.
            l.report(flushed(VENDOR_PROXY_FLUSH));
            return;
        }
        let ops = t.ops();
        match self.post(&ch, t) {
            Ok(()) | Err(PostError::GivenUp) => {}
            Err(PostError::Device(e)) => {
                lane(&mut self.lanes, ch.qp).report(match e {
                    gdaki_device::Error::Cqe(c) => c,
                    _ => flushed(VENDOR_PROXY_POST),
                });
                tracing::warn!(channel = id, "proxy could not post a trigger: {e}");
            }
        }
        if ops & Trigger::FLUSH != 0 {
            if !self.stopping() {
                let l = lane(&mut self.lanes, ch.qp);
                l.ring();
                match l.flush(&self.shared.stop) {
                    Flush::Done => return,
                    Flush::Stopping { moved } => {
                        self.stopping();
                        if moved {
                            self.moved();
                        }
                    }
                }
            }
            self.settle(Some(ch.qp), Until::Settled);
        }
    }

    /// Posts the WQEs of `t`'s put, accumulate and signal (not rung). A put whose range is not inside both of
    /// the channel's memories (as the proxy registered them) posts nothing.
    fn post(&mut self, ch: &ChannelEntry, t: Trigger) -> std::result::Result<(), PostError> {
        let h = &ch.handle;
        let ops = t.ops();
        if ops & Trigger::PUT != 0 {
            let (dst, src, bytes) = (t.dst_offset(), t.src_offset(), t.size());
            // The whole range first, so that a trigger reaching past either memory posts none of it (the pieces
            // below are each inside it). Offsets and size are 32-bit fields: no sum overflows.
            remote(&h.dst, dst, bytes)?;
            if src + bytes > h.src.length {
                let e = gdaki_device::error::RangeError::local(src, bytes, h.src.length);
                return Err(gdaki_device::Error::from(e).into());
            }
            let max = h.max_wqe_bytes.clamp(1, i32::MAX as u64);
            let mut done = 0;
            while done < bytes {
                let n = (bytes - done).min(max);
                let (r, l) = (remote(&h.dst, dst + done, n)?, local(&h.src, src + done, n)?);
                let lane = self.lane_to_post(ch.qp)?;
                let _ = lane.qp.post(false, wqe::rdma_write(r, l))?;
                lane.unrung = true;
                done += n;
            }
        }
        if ops & Trigger::ACCUMULATE != 0 {
            let (r, l) = atomic_target(&h.dst, t.dst_offset(), &h.scratch, 0)?;
            let w = wqe::atomic_fetch_add(r, l, t.addend())?;
            let lane = self.lane_to_post(ch.qp)?;
            let _ = lane.qp.post(false, w)?;
            lane.unrung = true;
        }
        if ops & Trigger::SIGNAL != 0 {
            if ch.no_atomic {
                // HostNoAtomic: the semaphore's new value, inline in the WQE (MSCCL++ writes its outbound token).
                // Only this thread writes the count; the semaphore's other holders only keep it alive.
                let n = ch.counter.load(Ordering::Relaxed) + 1;
                let r = remote(&h.remote_sem, 0, 8)?;
                let lane = self.lane_to_post(ch.qp)?;
                let _ = lane.qp.post_write_inline(false, r, &n.to_ne_bytes())?;
                ch.counter.store(n, Ordering::Relaxed);
            } else {
                let (r, l) = atomic_target(&h.remote_sem, 0, &h.scratch, 0)?;
                let w = wqe::atomic_fetch_add(r, l, 1)?;
                let lane = self.lane_to_post(ch.qp)?;
                let _ = lane.qp.post(false, w)?;
            }
            lane(&mut self.lanes, ch.qp).unrung = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdaki_device::channel::{Exclusive, PortChannel};
    use gdaki_shared::handle::{CqHandle, MrHandle, RemoteMr};
    use gdaki_shared::prm::cqe::Cqe64;
    use gdaki_shared::prm::opcode;
    use gdaki_shared::{Be16, Be32};

    /// One QP's queue memory that no NIC serves: WQEs posted there never complete.
    #[repr(C, align(64))]
    struct DeadQueues {
        sq: [[u64; 8]; 64],
        cq: [[u64; 8]; 64],
        bf: [u64; 8],
        dbrec: [u64; 2],
        cq_dbrec: [u64; 2],
        /// What the proxy's puts read and (would) write, 64 bytes each.
        data: [u64; 16],
    }

    impl DeadQueues {
        fn new() -> Box<Self> {
            let mut q = Box::new(DeadQueues {
                sq: [[0; 8]; 64],
                cq: [[0; 8]; 64],
                bf: [0; 8],
                dbrec: [0; 2],
                cq_dbrec: [0; 2],
                data: [0; 16],
            });
            for c in q.cq.iter_mut() {
                c[7] = 0xf1u64 << 56; // op_own: invalid opcode, owned by the hardware.
            }
            q
        }

        /// Puts a requester CQE of QP `qpn` for WQE index `counter` in the CQ's first entry, owned by software:
        /// what the proxy finds there, when it names no WQE it posted, fails every poll of the CQ.
        fn stray_cqe(&mut self, qpn: u32, counter: u16) {
            let mut c = Cqe64::INVALID;
            c.sop_drop_qpn = Be32::new(qpn);
            c.wqe_counter = Be16::new(counter);
            // Owner bit 0: software's in the CQ's first lap.
            c.op_own = opcode::cqe::REQ << 4;
            self.cq[0] = bytemuck::cast(c);
        }

        fn qp(&self) -> QpHandle {
            let cq = CqHandle {
                buf: self.cq.as_ptr() as u64,
                dbrec: self.cq_dbrec.as_ptr() as u64,
                ncqe: 64,
                cqn: 1,
                ..Default::default()
            };
            QpHandle {
                sq_buf: self.sq.as_ptr() as u64,
                dbrec: self.dbrec.as_ptr() as u64,
                bf_reg: self.bf.as_ptr() as u64,
                wqe_cnt: 64,
                qpn: 7,
                cq,
                ..Default::default()
            }
        }
    }

    /// Asserts that a drop of a proxy with eight QPs waiting (`what`) took about one `timeout`: at least one,
    /// and less than four (a timeout per QP would be eight).
    fn about_one_timeout(took: Duration, timeout: Duration, what: &str) {
        assert!(
            took >= timeout && took < 4 * timeout,
            "the proxy's drop took {took:?}, about one timeout ({timeout:?}) expected for eight {what}"
        );
    }

    /// A proxy serving one Host-mode channel (puts of up to 64 bytes) on the QP of each of `queues`, with
    /// `timeout`; the QP handles the channels name, and the registrations with the channels' device handles.
    /// The queues must outlive the proxy; the QP handles (which `qps` never moves), the channels.
    fn serve(
        exec: &Executor,
        queues: &[Box<DeadQueues>],
        timeout: Duration,
    ) -> (ProxyService, Vec<QpHandle>, Vec<(PortChannelHandle, Registration)>) {
        let proxy = ProxyService::start(exec, 64, timeout).unwrap();
        // The handles a channel names (the proxy posts through its own copies).
        let qps: Vec<_> = queues.iter().map(|q| q.qp()).collect();
        let mut handles = Vec::new();
        for (i, q) in queues.iter().enumerate() {
            let qp = ProxyQp { key: i + 1, handle: q.qp(), _keep: Arc::new(()) };
            let data = q.data.as_ptr() as u64;
            let chan = PortChannelHandle {
                qp: &raw const qps[i] as u64,
                dst: RemoteMr { addr: data, length: 64, ..Default::default() },
                src: MrHandle { addr: data + 64, length: 64, ..Default::default() },
                max_wqe_bytes: 64,
                timeout_ns: 1_000_000_000,
                ..Default::default()
            };
            handles.push(proxy.register(qp, chan, mode::HOST, Arc::default()).unwrap());
        }
        (proxy, qps, handles)
    }

    /// Pushes a put of 64 bytes on each channel, and waits until the proxy has posted them all.
    fn put_each(proxy: &ProxyService, handles: &[(PortChannelHandle, Registration)]) {
        for (h, _) in handles {
            // SAFETY: a Host-mode handle of a live proxy, used by this thread only.
            unsafe { PortChannel::<Exclusive>::new(h) }.put(0, 0, 64).unwrap();
        }
        let t = Instant::now();
        while proxy.done() < handles.len() as u64 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the proxy did {} of {} triggers",
                proxy.done(),
                handles.len()
            );
            std::thread::yield_now();
        }
    }

    /// The vendor syndrome the proxy reported on a channel's QP (0 for none).
    fn vendor(h: &PortChannelHandle) -> u8 {
        // SAFETY: the QP's error word (the CPU executor's device addresses are host addresses), kept by the
        // channel's registration, which holds the proxy's registry; 8-byte aligned.
        let word = unsafe { AtomicU64::from_ptr(h.proxy_err as *mut u64) }.load(Ordering::Acquire);
        CqeError::unpack(word as u32, 0).vendor_err_synd
    }

    /// A stopping proxy whose QPs' NIC completes nothing waits one timeout in all, not one per QP: eight QPs
    /// with a put each, outstanding, and the drop returns after about one timeout (before, it waited a timeout
    /// on each QP in turn: eight here).
    #[test]
    fn a_stopping_proxy_waits_one_timeout_for_all_its_stalled_qps() {
        const QPS: usize = 8;
        let timeout = Duration::from_millis(300);
        let (exec, _) = Executor::open(Some(crate::exec::ExecutorKind::Cpu)).unwrap();
        let queues: Vec<_> = (0..QPS).map(|_| DeadQueues::new()).collect();
        let (proxy, qps, handles) = serve(&exec, &queues, timeout);
        put_each(&proxy, &handles);
        let t = Instant::now();
        drop(handles);
        drop(proxy);
        let took = t.elapsed();
        about_one_timeout(took, timeout, "stalled QPs");
        drop((qps, queues));
    }

    /// The FIFO's triggers left at the drop wait on one deadline with the drain: a put and a FLUSH trigger on
    /// each of eight QPs whose NIC completes nothing, pushed just before the drop, and the drop returns after
    /// about one timeout, each QP reporting `VENDOR_PROXY_FLUSH` (before, each FLUSH handled while stopping
    /// waited a timeout of its own: eight here).
    #[test]
    fn a_stopping_proxy_waits_one_timeout_for_the_flushes_left_in_its_fifo() {
        const QPS: usize = 8;
        let timeout = Duration::from_millis(300);
        let (exec, _) = Executor::open(Some(crate::exec::ExecutorKind::Cpu)).unwrap();
        let queues: Vec<_> = (0..QPS).map(|_| DeadQueues::new()).collect();
        let (proxy, qps, handles) = serve(&exec, &queues, timeout);
        for (h, _) in &handles {
            // SAFETY: a Host-mode handle of a live proxy, used by this thread only.
            unsafe { PortChannel::<Exclusive>::new(h) }.put(0, 0, 64).unwrap();
            // The FLUSH trigger a channel's `flush` pushes, without that call's wait for the proxy to do it
            // (which would block this thread for the channel's timeout).
            let flush = Trigger::new(Trigger::FLUSH, h.channel_id as u16, 0, 0, 0);
            // SAFETY: the FIFO of a live proxy.
            unsafe { gdaki_device::fifo::push(&h.fifo, flush, h.timeout_ns) }.unwrap();
        }
        let t = Instant::now();
        drop(proxy);
        let took = t.elapsed();
        about_one_timeout(took, timeout, "stalled FLUSHes");
        for (i, (h, _)) in handles.iter().enumerate() {
            assert_eq!(vendor(h), VENDOR_PROXY_FLUSH, "QP {i}");
        }
        drop(handles);
        drop((qps, queues));
    }

    /// A CQE that matches none of a QP's WQEs stays in its CQ and fails every poll: the stopping proxy gives
    /// that QP up at once (`VENDOR_PROXY_POST`) and waits one timeout for the others (`VENDOR_PROXY_FLUSH`).
    /// Before, the failed poll counted as progress, put the deadline back each time, and the drop never
    /// returned (the watchdog below fails the test instead of hanging it).
    #[test]
    fn a_stopping_proxy_gives_up_on_a_qp_whose_cq_holds_a_cqe_of_no_wqe() {
        const QPS: usize = 8;
        let timeout = Duration::from_millis(300);
        let (exec, _) = Executor::open(Some(crate::exec::ExecutorKind::Cpu)).unwrap();
        // QPs 0 and 4: a CQE of this QP naming a WQE index never posted; 2 and 6: a CQE of another QP.
        let stray = |i: usize| match i % 4 {
            0 => Some((7, 0x100)),
            2 => Some((8, 0)),
            _ => None,
        };
        let queues: Vec<_> = (0..QPS)
            .map(|i| {
                let mut q = DeadQueues::new();
                if let Some((qpn, counter)) = stray(i) {
                    q.stray_cqe(qpn, counter);
                }
                q
            })
            .collect();
        let (proxy, qps, handles) = serve(&exec, &queues, timeout);
        put_each(&proxy, &handles);
        let (tx, rx) = std::sync::mpsc::channel();
        let t = Instant::now();
        std::thread::spawn(move || {
            drop(proxy);
            let _ = tx.send(t.elapsed());
        });
        let Ok(took) = rx.recv_timeout(10 * timeout) else {
            // The proxy thread may still poll the queues, and write the error words: they must outlive it.
            std::mem::forget((handles, qps, queues));
            panic!("the proxy's drop did not return within {:?}", 10 * timeout);
        };
        assert!(took < 4 * timeout, "the proxy's drop took {took:?}, about one timeout ({timeout:?}) expected");
        for (i, (h, _)) in handles.iter().enumerate() {
            let expected = if stray(i).is_some() { VENDOR_PROXY_POST } else { VENDOR_PROXY_FLUSH };
            assert_eq!(vendor(h), expected, "QP {i}");
        }
        drop(handles);
        drop((qps, queues));
    }
}
