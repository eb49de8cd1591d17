//! The emulated NIC's engine on the GPU: one CTA of two warps (`engine.ptx`). The first runs the NIC's small
//! operations on GPU memory (copies, writes, CQEs, atomics) in the order the NIC's thread enqueues them, so
//! that none of them costs a CUDA call or a host synchronize; the second keeps the SQ mirrors (copies of
//! rings in GPU memory that the NIC's thread reads in pinned host memory), following each dbrec at
//! GPU-memory speed.
//!
//! The host writes 128-byte commands ([`Cmd`]) into a ring in pinned host memory and advances `HEAD` once per
//! batch ([`Engine::publish`]: at the end of the NIC's pass, before the CQE of a lone doorbell's last WQE, at
//! a synchronize, before a hand-off to the copy engines, or at eight commands); the first warp polls `HEAD`
//! over PCIe, executes up to eight commands per round trip and stores `DONE`. It reads the next [`SPEC`]
//! command slots in the same round trip as `HEAD`, ahead of their publication, so that a batch of that
//! many costs no second PCIe read: each word of a slot carries its lap's tag ([`tagged`]), by which the
//! engine knows a slot read ahead holds the command `HEAD` announced and not the lap before (or half of
//! each: a 128-byte read is not single-copy atomic, an 8-byte word is). The engine
//! leaves the GPU after [`IDLE`] without work (so that calls which wait for every running kernel, such as
//! `cuMemFree`, wait at most that long for it) and is launched again by the next command. Leaving and
//! relaunching race only through two words: the engine stores `STATE = EXITING`, fences, and reads `HEAD`
//! once more; the host stores `HEAD`, fences, and reads `STATE`. One of the two sees the other's store, so no
//! command is left without a running engine. The mirror warp leaves before `STATE` says `STOPPED`.
//!
//! Hazard: when every SM is taken by kernels that spin (waiting on this NIC), a relaunched engine cannot
//! start. [`Engine::available`] says so within [`START_WAIT`], before anything is given to it, and the
//! copier takes the copy engines instead; a command given just as an idle engine left (the only other way
//! to meet an engine that cannot start) fails [`Engine::wait`] after [`START_LIMIT`] with a message that
//! says so, instead of hanging.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::pinned::alloc_mapped_in;
use super::{Gpu, Kernel, KernelArg, LaunchConfig, Stream};
use crate::mem::{MappedBuf, SqMirror, SqWatch};
use crate::{Error, Result};

/// Commands in the ring (a power of two).
const SLOTS: u64 = 256;
/// Commands the engine takes in one turn (`engine.ptx`: eight, eight lanes each, four to a load).
const TURN: u64 = 8;
/// Command slots the engine reads with `HEAD`, ahead of their publication: a pass of the NIC's thread
/// makes two (a BlueFlame WRITE: its data and its CQE) to three (a WRITE and a fetch-add) as a rule, and
/// each slot read ahead is 128 more bytes on every idle turn's PCIe read.
const SPEC: u32 = 4;
// One load per lane reads four slots: the engine reads ahead only what that load covers.
const _: () = assert!(SPEC <= 4);
/// log2 of [`SLOTS`]: the lap of command `i` is `i >> LAP_SHIFT`.
const LAP_SHIFT: u32 = SLOTS.trailing_zeros();
/// The word of a [`Cmd`] ([`Cmd::reserved`]) that carries the other words' bit 63 in the ring (see
/// [`tagged`]).
const SPARE_WORD: usize = 7;
/// Bytes per command.
const CMD_BYTES: usize = 128;
/// How long the engine stays on the GPU without work before it exits.
pub(crate) const IDLE: Duration = Duration::from_millis(5);
/// How long a relaunched engine may take to start before [`Engine::wait`] says the GPU has no room for it.
const START_LIMIT: Duration = Duration::from_secs(2);
/// How long [`Engine::available`] waits for a launched engine to start (a start takes a few µs when an SM
/// has room) before its caller takes another way.
const START_WAIT: Duration = Duration::from_micros(200);
/// How long [`Engine::wait`] waits for the engine to execute what it was given.
const WAIT_LIMIT: Duration = Duration::from_secs(20);
/// How long the engine waits for a copy-engine flag ([`Op::Wait`]) before it fails.
const FLAG_LIMIT: Duration = Duration::from_secs(10);
/// How long [`Engine::wait`] waits before it logs a warning saying what it waits for (a wait this long
/// already holds up the NIC's thread, its wire peers included).
const SLOW: Duration = Duration::from_millis(500);

/// Byte offsets of the control words, each a `u64` in pinned host memory.
mod ctrl {
    /// Commands the host has published (host writes).
    pub const HEAD: usize = 0;
    /// Commands the engine has executed (engine writes).
    pub const DONE: usize = 64;
    /// [`super::STOPPED`], [`super::RUNNING`] or [`super::EXITING`].
    pub const STATE: usize = 128;
    /// The launch generation the running engine was started with (engine writes when it starts).
    pub const STARTED: usize = 192;
    /// Set by the host to make the engine exit once it has run every published command.
    pub const STOP: usize = 256;
    /// Why the engine stopped on its own (engine writes): 0 none, [`super::ERR_WAIT`].
    pub const ERROR: usize = 320;
    /// Generation of the SQ-mirror table (host writes, after the entries it changed).
    pub const WATCH_GEN: usize = 448;
    /// The table generation the running engine has loaded (engine writes).
    pub const WATCH_ACK: usize = 512;
    /// The SQ-mirror table: [`super::WATCH_SLOTS`] entries of [`super::watch::BYTES`].
    pub const WATCHES: usize = 576;
    /// Bytes of the control block.
    pub const BYTES: usize = WATCHES + super::WATCH_SLOTS * super::watch::BYTES;
}

/// SQ mirrors one engine keeps at most: one per lane of its mirror warp.
pub(crate) const WATCH_SLOTS: usize = 32;

/// Byte offsets of the words of one SQ-mirror table entry (each a `u64`).
mod watch {
    /// Device address of the dbrec's SQ counter word; 0 for an empty slot. Stored last.
    pub const DBREC: usize = 0;
    /// Device address of the ring.
    pub const RING: usize = 8;
    /// WQEBBs in the ring minus one.
    pub const MASK: usize = 16;
    /// Device address of the mirror's copy of the ring.
    pub const MIRROR: usize = 24;
    /// Device address of the mirror's count.
    pub const COUNT: usize = 32;
    /// Producer count the mirror starts at, at least (see [`super::Engine::rebase`]).
    pub const BASE: usize = 40;
    /// Bytes of one entry.
    pub const BYTES: usize = 64;
}

const STOPPED: u64 = 0;
const RUNNING: u64 = 1;
const EXITING: u64 = 2;
/// [`ctrl::ERROR`]: a copy-engine flag did not arrive within [`FLAG_LIMIT`].
const ERR_WAIT: u64 = 1;

/// What a command does (word 0, low half).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Op {
    /// `len` bytes from `src` to `dst`, both device-addressable.
    Copy = 1,
    /// `len` (at most 64) payload bytes to `dst`; [`FLAG_PUBLISH`]: the last word after the rest, fenced.
    Write = 2,
    /// `*dst += a` (64-bit, system scope); the old value to `result`.
    FetchAdd = 3,
    /// `*dst = (*dst == a) ? b : *dst`; the old value to `result`.
    CompareSwap = 4,
    /// Waits until the 32-bit word at `dst` reaches `a` (wrapping compare).
    Wait = 5,
}

/// [`Op::Write`]: store the last 8 bytes after the others and a fence.
pub(crate) const FLAG_PUBLISH: u32 = 1;
/// [`Op::Write`] with [`FLAG_PUBLISH`], [`Op::FetchAdd`], [`Op::CompareSwap`]: the destination is GPU memory,
/// which only threads of this GPU read, so the fence before the published word or the atomic is at GPU scope
/// (`fence.release.gpu`) instead of system scope. Whatever reaches the host (the executed count) still
/// follows a system-scope fence.
pub(crate) const FLAG_GPU_SCOPE: u32 = 2;

/// One command, as the engine reads it: lane `8j + m` of the first warp loads bytes `16m..16m + 16` of command
/// `j` of a turn (and of command `j + 4`).
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct Cmd {
    pub op: u32,
    pub flags: u32,
    pub len: u64,
    pub dst: u64,
    pub src: u64,
    pub a: u64,
    pub b: u64,
    pub result: u64,
    /// Zero: carries the other words' bit 63 in the ring ([`tagged`]).
    pub reserved: u64,
    pub payload: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<Cmd>() == CMD_BYTES);

impl Cmd {
    pub(crate) fn new(op: Op) -> Self {
        Cmd { op: op as u32, ..bytemuck::Zeroable::zeroed() }
    }
}

/// The 16 words command number `index` (counted from the engine's start) takes in the ring: bit 63 of each
/// word is the lap's tag, the inverse of bit 0 of `index >> LAP_SHIFT` (so that a ring of zeros holds no
/// command of lap 0), and word [`SPARE_WORD`] keeps the words' own bits 63 (bit `w` for word `w`), from
/// which the engine restores them after it has checked the tags. Requires `cmd.reserved == 0`.
fn tagged(cmd: &Cmd, index: u64) -> [u64; CMD_BYTES / 8] {
    debug_assert_eq!(cmd.reserved, 0);
    let mut w: [u64; CMD_BYTES / 8] = bytemuck::cast(*cmd);
    let spare = w.iter().enumerate().fold(0, |acc, (i, v)| acc | (v >> 63) << i);
    w[SPARE_WORD] = spare;
    let tag = (!(index >> LAP_SHIFT) & 1) << 63;
    w.iter_mut().for_each(|v| *v = (*v & !(1 << 63)) | tag);
    w
}

/// The mirror warp's pause per round, ns (`nanosleep`).
const WATCH_PAUSE_NS: u32 = 100;
/// The first warp reads `STOP` and `WATCH_GEN` on one turn of this many (a power of two), `HEAD` on every
/// turn: a table change or a stop is seen within this many PCIe round trips (about 10 µs).
const SLOW_TURNS: u32 = 8;

/// The engine's PTX, with its constants filled in from this file and each `@SHFL64 dst, src, lane@` line
/// expanded into the two 32-bit shuffles of a 64-bit register.
pub(crate) fn ptx() -> String {
    let subs: [(&str, String); 31] = [
        ("@SPEC@", SPEC.to_string()),
        ("@SLOTS@", SLOTS.to_string()),
        ("@LAP_SHIFT@", LAP_SHIFT.to_string()),
        ("@WATCH_GEN@", ctrl::WATCH_GEN.to_string()),
        ("@WATCH_ACK@", ctrl::WATCH_ACK.to_string()),
        ("@W_BYTES@", watch::BYTES.to_string()),
        ("@W_DBREC@", (ctrl::WATCHES + watch::DBREC).to_string()),
        ("@W_RING@", (ctrl::WATCHES + watch::RING).to_string()),
        ("@W_MASK@", (ctrl::WATCHES + watch::MASK).to_string()),
        ("@W_MIRROR@", (ctrl::WATCHES + watch::MIRROR).to_string()),
        ("@W_COUNT@", (ctrl::WATCHES + watch::COUNT).to_string()),
        ("@W_BASE@", (ctrl::WATCHES + watch::BASE).to_string()),
        ("@HEAD@", ctrl::HEAD.to_string()),
        ("@DONE@", ctrl::DONE.to_string()),
        ("@STATE@", ctrl::STATE.to_string()),
        ("@STARTED@", ctrl::STARTED.to_string()),
        ("@STOP@", ctrl::STOP.to_string()),
        ("@ERROR@", ctrl::ERROR.to_string()),
        ("@STOPPED@", STOPPED.to_string()),
        ("@RUNNING@", RUNNING.to_string()),
        ("@EXITING@", EXITING.to_string()),
        ("@ERR_WAIT@", ERR_WAIT.to_string()),
        ("@WAIT_NS@", FLAG_LIMIT.as_nanos().to_string()),
        ("@OP_COPY@", (Op::Copy as u32).to_string()),
        ("@OP_WRITE@", (Op::Write as u32).to_string()),
        ("@OP_FETCH_ADD@", (Op::FetchAdd as u32).to_string()),
        ("@OP_COMPARE_SWAP@", (Op::CompareSwap as u32).to_string()),
        ("@OP_WAIT@", (Op::Wait as u32).to_string()),
        ("@WATCH_PAUSE_NS@", WATCH_PAUSE_NS.to_string()),
        ("@SLOW_TURNS@", SLOW_TURNS.to_string()),
        ("@SLOW_TURNS_MASK@", (SLOW_TURNS - 1).to_string()),
    ];
    let mut out = String::new();
    for line in include_str!("engine.ptx").lines() {
        let t = line.trim();
        if let Some(args) = t.strip_prefix("@SHFL64 ").and_then(|r| r.strip_suffix('@')) {
            let a: Vec<&str> = args.split(',').map(str::trim).collect();
            let (dst, src, lane) = (a[0], a[1], a[2]);
            out.push_str(&format!(
                "\tmov.b64 {{%r32, %r33}}, {src};\n\
                 \tshfl.sync.idx.b32 %r32, %r32, {lane}, 31, 0xffffffff;\n\
                 \tshfl.sync.idx.b32 %r33, %r33, {lane}, 31, 0xffffffff;\n\
                 \tmov.b64 {dst}, {{%r32, %r33}};\n"
            ));
            continue;
        }
        let mut l = line
            .replace("@FLAG_PUBLISH@", &FLAG_PUBLISH.to_string())
            .replace("@FLAG_GPU_SCOPE@", &FLAG_GPU_SCOPE.to_string());
        for (k, v) in &subs {
            l = l.replace(k, v);
        }
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// The host side of one engine: its ring, control words, kernel and stream. Not shared: its owner
/// ([`super::CudaCopier`]) serializes every call.
pub(crate) struct Engine {
    kernel: Kernel,
    stream: Stream,
    ring: MappedBuf,
    ctrl: MappedBuf,
    /// Commands given so far.
    head: u64,
    /// Commands published to the engine so far (`HEAD`).
    published: u64,
    /// `DONE` as last read, a lower bound of it: the engine rewrites `DONE` on every turn, so each read of it
    /// misses in the host's caches; [`Engine::push`] reads it again only when this bound says the ring is full.
    done_seen: u64,
    /// Launches so far (the generation the last launch was given).
    gen: u64,
    /// When the last launch was made, until the engine says it started.
    launched: Option<Instant>,
    /// The mirror buffer of each SQ-mirror slot in use (the ring's copy, then its 64-bit count).
    mirrors: [Option<MappedBuf>; WATCH_SLOTS],
    /// Mirror buffers of stopped mirrors, for later ones: freeing pinned memory (`cuMemFreeHost`) waits
    /// for every running kernel, so they are freed only with the engine.
    spare: Vec<MappedBuf>,
    /// The SQ-mirror table's generation.
    watch_gen: u64,
}

impl Engine {
    /// Loads the engine's module on `gpu` (once per GPU) and allocates its ring and control words. The
    /// engine is launched by the first command.
    ///
    /// # Errors
    /// The driver's error loading the PTX, creating the stream or pinning the memory.
    pub(crate) fn new(gpu: &Gpu) -> Result<Self> {
        let kernel = gpu.kernel(&ptx(), "gdaki_emu_engine")?;
        let stream = gpu.new_stream()?;
        let ring = gpu.alloc_mapped(SLOTS as usize * CMD_BYTES)?;
        let ctrl = gpu.alloc_mapped(ctrl::BYTES)?;
        let (mirrors, spare) = (std::array::from_fn(|_| None), Vec::new());
        Ok(Engine {
            kernel,
            stream,
            ring,
            ctrl,
            head: 0,
            published: 0,
            done_seen: 0,
            gen: 0,
            launched: None,
            mirrors,
            spare,
            watch_gen: 0,
        })
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= ctrl::BYTES && off.is_multiple_of(8));
        // SAFETY: an aligned word inside the control block (4096-byte aligned, `ctrl::BYTES` long), which
        // lives as long as `self`; the engine and this thread access it only atomically.
        unsafe { AtomicU64::from_ptr(self.ctrl.host_ptr().add(off).cast()) }
    }

    /// Starts mirroring `sq` in a free slot of the table (see [`GpuCopier::mirror_sq`]): the entry's words,
    /// its dbrec word last, then a new generation, which the engine loads within `SLOW_TURNS` turns (or at
    /// its start). `None` when every slot is taken.
    ///
    /// # Errors
    /// The driver's error pinning the mirror's memory.
    ///
    /// [`GpuCopier::mirror_sq`]: crate::mem::GpuCopier::mirror_sq
    pub(crate) fn watch(&mut self, sq: SqWatch) -> Result<Option<SqMirror>> {
        let Some(slot) = self.mirrors.iter().position(Option::is_none) else { return Ok(None) };
        let len = SqMirror::bytes(sq.wqebbs);
        let buf = match self.spare.iter().position(|b| b.len() == len) {
            Some(i) => self.spare.swap_remove(i),
            None => alloc_mapped_in(&self.stream.shared, len)?,
        };
        let copy = len - 64;
        // SAFETY: the buffer's `len` bytes are pinned host memory that no engine uses now (a free slot's buffer
        // is not in the table, and an earlier engine's stores to it landed before its slot was freed); zero
        // tags say "never written", so that a reused buffer's old tags are never taken for this ring's.
        unsafe { std::ptr::write_bytes(buf.host_ptr(), 0, copy) };
        // SAFETY: the count word is the aligned word after the copy (page-aligned buffer of `len` bytes).
        let count = unsafe { buf.host_ptr().add(copy) }.cast::<u64>();
        // SAFETY: as above: an aligned word of the live buffer, accessed atomically.
        unsafe { AtomicU64::from_ptr(count) }.store(sq.base, Ordering::Release);
        let e = ctrl::WATCHES + slot * watch::BYTES;
        self.word(e + watch::RING).store(sq.ring, Ordering::Relaxed);
        self.word(e + watch::MASK).store(u64::from(sq.wqebbs) - 1, Ordering::Relaxed);
        self.word(e + watch::MIRROR).store(buf.device_addr(), Ordering::Relaxed);
        self.word(e + watch::COUNT).store(buf.device_addr() + copy as u64, Ordering::Relaxed);
        self.word(e + watch::BASE).store(sq.base, Ordering::Relaxed);
        self.word(e + watch::DBREC).store(sq.dbrec, Ordering::Release);
        self.bump_watch_gen();
        // SAFETY: the copy and the count live in `buf`, kept in `mirrors[slot]` until `unwatch` (or the
        // engine's drop), and the engine writes them with aligned 8-byte stores only.
        let m = unsafe { SqMirror::new(slot as u32, buf.host_ptr(), sq.wqebbs) };
        self.mirrors[slot] = Some(buf);
        Ok(Some(m))
    }

    /// Sets the lower bound of the mirror's count (see [`GpuCopier::rebase_sq_mirror`]); the engine takes it
    /// within `SLOW_TURNS` turns.
    ///
    /// [`GpuCopier::rebase_sq_mirror`]: crate::mem::GpuCopier::rebase_sq_mirror
    pub(crate) fn rebase(&mut self, m: &SqMirror, base: u64) {
        let slot = m.slot() as usize;
        if self.mirrors.get(slot).is_some_and(Option::is_some) {
            self.word(ctrl::WATCHES + slot * watch::BYTES + watch::BASE).store(base, Ordering::Relaxed);
            self.bump_watch_gen();
        }
    }

    /// Empties the mirror's slot and waits (at most [`START_LIMIT`]) until no engine can still use it: the
    /// running engine has loaded the new table, or none runs. Its buffer is then kept for a later mirror; if
    /// the engine did not settle in time it is leaked instead.
    pub(crate) fn unwatch(&mut self, m: SqMirror) {
        let slot = m.slot() as usize;
        let Some(buf) = self.mirrors.get_mut(slot).and_then(Option::take) else { return };
        self.word(ctrl::WATCHES + slot * watch::BYTES + watch::DBREC).store(0, Ordering::Release);
        let gen = self.bump_watch_gen();
        let start = Instant::now();
        while start.elapsed() < START_LIMIT {
            let started = self.launched.is_none() || self.word(ctrl::STARTED).load(Ordering::Acquire) == self.gen;
            let state = self.word(ctrl::STATE).load(Ordering::Acquire);
            // A launched engine that has not started loads the new table before anything else.
            if self.word(ctrl::WATCH_ACK).load(Ordering::Acquire) >= gen || state == STOPPED || !started {
                self.spare.push(buf);
                return;
            }
            std::hint::spin_loop();
        }
        tracing::warn!(
            "emulated NIC: the GPU engine did not take a stopped SQ mirror within 2 s; its memory is leaked"
        );
        std::mem::forget(buf);
    }

    /// Whether the engine runs (and so advances the mirrors).
    pub(crate) fn running(&self) -> bool {
        self.launched.is_none() && self.word(ctrl::STATE).load(Ordering::Acquire) == RUNNING
    }

    fn bump_watch_gen(&mut self) -> u64 {
        self.watch_gen += 1;
        self.word(ctrl::WATCH_GEN).store(self.watch_gen, Ordering::Release);
        fence(Ordering::SeqCst);
        self.watch_gen
    }

    /// Commands given so far (published or not yet: see [`Engine::publish`]).
    pub(crate) fn head(&self) -> u64 {
        self.head
    }

    fn done(&self) -> u64 {
        self.word(ctrl::DONE).load(Ordering::Acquire)
    }

    /// Writes `cmd` into the ring (after waiting for a free slot). It is published with the commands given
    /// after it, as one batch, by [`Engine::publish`] (or here, once a whole engine turn's worth, [`TURN`],
    /// waits): the engine takes every published command in one turn, where commands published one at a time
    /// would cost it a turn each.
    ///
    /// # Errors
    /// As [`Engine::wait`], when the ring stays full; the driver's error when a launch fails.
    pub(crate) fn push(&mut self, cmd: &Cmd) -> Result<()> {
        if self.head - self.done_seen >= SLOTS {
            self.done_seen = self.done();
            if self.head - self.done_seen >= SLOTS {
                self.wait(self.head - SLOTS + 1)?;
                self.done_seen = self.done();
            }
        }
        let slot = (self.head & (SLOTS - 1)) as usize * CMD_BYTES;
        let words = tagged(cmd, self.head);
        // SAFETY: the slot lies inside the ring; the engine has executed whatever it held (checked above).
        // It may read the slot before the Release store of HEAD in `publish` (ahead, with HEAD), and takes
        // what it read then only when every word carries this lap's tag: 8-byte aligned stores here, which
        // a reader sees whole or not at all.
        unsafe {
            let dst = self.ring.host_ptr().add(slot).cast::<u64>();
            for (i, &v) in words.iter().enumerate() {
                AtomicU64::from_ptr(dst.add(i)).store(v, Ordering::Relaxed);
            }
        };
        self.head += 1;
        if self.head - self.published >= TURN {
            self.publish()?;
        }
        Ok(())
    }

    /// Publishes every command given so far (a Release store of `HEAD`) and makes sure an engine runs to
    /// execute them. Nothing to do when all are published.
    ///
    /// # Errors
    /// The driver's error when a launch fails.
    pub(crate) fn publish(&mut self) -> Result<()> {
        if self.published == self.head {
            return Ok(());
        }
        self.word(ctrl::HEAD).store(self.head, Ordering::Release);
        self.published = self.head;
        self.ensure_running()
    }

    /// Whether commands given now run: the engine runs, or starts within [`START_WAIT`] of a launch made or
    /// found pending here. `false` while a launched engine cannot start (every SM taken); nothing is given
    /// to it then, and it leaves again, idle, once it does start.
    ///
    /// # Errors
    /// As [`Engine::push`].
    pub(crate) fn available(&mut self) -> Result<bool> {
        if self.word(ctrl::STATE).load(Ordering::Acquire) != RUNNING {
            self.ensure_running()?;
        }
        let Some(at) = self.launched else { return Ok(true) };
        loop {
            if self.word(ctrl::STARTED).load(Ordering::Acquire) == self.gen {
                self.launched = None;
                return Ok(true);
            }
            if at.elapsed() > START_WAIT {
                tracing::debug!(
                    "emulated NIC: the GPU engine did not start within {START_WAIT:?}: copy engines instead"
                );
                return Ok(false);
            }
            std::hint::spin_loop();
        }
    }

    /// Launches the engine if it has left (or is leaving) the GPU; see the module docs for the race.
    fn ensure_running(&mut self) -> Result<()> {
        fence(Ordering::SeqCst);
        let start = Instant::now();
        loop {
            match self.word(ctrl::STATE).load(Ordering::Acquire) {
                RUNNING => return Ok(()),
                EXITING if start.elapsed() < START_LIMIT => std::hint::spin_loop(),
                EXITING => {
                    return Err(Error::Device(
                        "the emulated NIC's GPU engine neither left nor went on within 2 s".into(),
                    ))
                }
                _ => return self.launch(),
            }
        }
    }

    fn launch(&mut self) -> Result<()> {
        if self.word(ctrl::ERROR).load(Ordering::Acquire) != 0 {
            return Err(self.failed());
        }
        // The engine that left stored DONE before STATE: the new one starts where it stopped.
        let tail = self.done();
        self.word(ctrl::STATE).store(RUNNING, Ordering::Release);
        self.gen += 1;
        let args = [
            KernelArg::U64(self.ring.device_addr()),
            KernelArg::U64(self.ctrl.device_addr()),
            KernelArg::U64(SLOTS - 1),
            KernelArg::U64(IDLE.as_nanos() as u64),
            KernelArg::U64(tail),
            KernelArg::U64(self.gen),
        ];
        // SAFETY: the ring and control block are pinned, mapped and live until `Drop` has seen the engine
        // leave; the arguments are the six the kernel declares, in order.
        let r = unsafe { self.kernel.launch(&self.stream, &LaunchConfig::linear(1, 64), &args) };
        if r.is_err() {
            self.word(ctrl::STATE).store(STOPPED, Ordering::Release);
        }
        self.launched = Some(Instant::now());
        r
    }

    fn failed(&self) -> Error {
        Error::Device(format!(
            "the emulated NIC's GPU engine stopped: a copy it had to follow did not finish within {} s",
            FLAG_LIMIT.as_secs()
        ))
    }

    /// Waits until the engine has executed the first `target` commands: spins, then yields, for at most
    /// [`WAIT_LIMIT`].
    ///
    /// # Errors
    /// [`Error::Device`] when the engine did not start within [`START_LIMIT`] of its launch (every SM is
    /// busy: leave one free for it), stopped on an error, or did not finish in time.
    pub(crate) fn wait(&mut self, target: u64) -> Result<()> {
        self.publish()?;
        let start = Instant::now();
        let mut spins = 0u32;
        let mut warned = false;
        while self.done() < target {
            if !warned && start.elapsed() > SLOW {
                warned = true;
                tracing::warn!(
                    done = self.done(),
                    target,
                    head = self.head,
                    state = self.word(ctrl::STATE).load(Ordering::Acquire),
                    started = self.word(ctrl::STARTED).load(Ordering::Acquire),
                    gen = self.gen,
                    launched_ms = self.launched.map(|at| at.elapsed().as_millis() as u64),
                    "emulated NIC: waiting for the GPU engine for {} ms",
                    SLOW.as_millis()
                );
            }
            if self.word(ctrl::ERROR).load(Ordering::Acquire) != 0 {
                return Err(self.failed());
            }
            if self.word(ctrl::STATE).load(Ordering::Acquire) == STOPPED {
                // Left between a push's check and now with work pending cannot happen (see the module
                // docs), but a failed launch can: try once more.
                self.launch()?;
            }
            if let Some(at) = self.launched {
                if self.word(ctrl::STARTED).load(Ordering::Acquire) == self.gen {
                    self.launched = None;
                } else if at.elapsed() > START_LIMIT {
                    return Err(Error::Device(format!(
                        "the emulated NIC's GPU engine could not start within {} s: kernels occupy every SM \
                         (leave one SM free for the engine, a CTA of two warps)",
                        START_LIMIT.as_secs()
                    )));
                }
            }
            if start.elapsed() > WAIT_LIMIT {
                return Err(Error::Device(format!(
                    "the emulated NIC's GPU engine executed {} of {target} commands in {} s",
                    self.done(),
                    WAIT_LIMIT.as_secs()
                )));
            }
            spins += 1;
            if spins < 4096 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

impl Drop for Engine {
    /// Publishes what was given, tells the engine to leave once it has run it, and waits (bounded) until it
    /// has, so that its memory is freed only when no kernel reads it; if it does not leave in time, the
    /// memory is leaked instead.
    fn drop(&mut self) {
        // What was given runs before the engine leaves (STOP waits for every published command).
        if let Err(e) = self.publish() {
            tracing::warn!("emulated NIC: the GPU engine's last commands were not started: {e}");
        }
        self.word(ctrl::STOP).store(1, Ordering::Release);
        let start = Instant::now();
        let mut left = self.word(ctrl::STATE).load(Ordering::Acquire) == STOPPED && self.launched.is_none();
        while !left && start.elapsed() < START_LIMIT {
            left = self.stream.is_idle().unwrap_or(false);
            std::thread::yield_now();
        }
        if !left {
            tracing::warn!("emulated NIC: the GPU engine did not leave; its memory is leaked");
            std::mem::forget(std::mem::replace(&mut self.ring, dummy()));
            std::mem::forget(std::mem::replace(&mut self.ctrl, dummy()));
            self.mirrors.iter_mut().filter_map(Option::take).chain(self.spare.drain(..)).for_each(std::mem::forget);
        }
    }
}

/// An empty buffer that frees nothing, to stand in for one that is leaked.
fn dummy() -> MappedBuf {
    // SAFETY: zero bytes at a dangling, aligned address that nothing dereferences; the owner frees nothing.
    unsafe { MappedBuf::from_raw(std::ptr::NonNull::<u64>::dangling().as_ptr().cast(), 0, 0, Box::new(())) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The PTX reads the command's fields by lane and register: lane 8j + m holds words 2m and 2m + 1, so
    /// lanes 8j and 8j + 1 op and flags, len, dst and src, lanes 8j + 2 and 8j + 3 a, b, result and the
    /// word with the tagged bits, lanes 8j + 4 to 8j + 7 the payload.
    #[test]
    fn command_fields_sit_where_the_engine_reads_them() {
        assert_eq!(offset_of!(Cmd, op), 0);
        assert_eq!(offset_of!(Cmd, flags), 4);
        assert_eq!(offset_of!(Cmd, len), 8);
        assert_eq!(offset_of!(Cmd, dst), 16);
        assert_eq!(offset_of!(Cmd, src), 24);
        assert_eq!(offset_of!(Cmd, a), 32);
        assert_eq!(offset_of!(Cmd, b), 40);
        assert_eq!(offset_of!(Cmd, result), 48);
        assert_eq!(offset_of!(Cmd, reserved), SPARE_WORD * 8);
        assert_eq!(offset_of!(Cmd, payload), 64);
    }

    #[test]
    fn ptx_has_every_constant_filled_in_and_every_shuffle_expanded() {
        let p = ptx();
        // An at-sign is left only as a predicate guard at the start of an instruction.
        for l in p.lines() {
            let code = l.split("//").next().unwrap_or("").trim_start();
            let guard = code.starts_with("@%p") || code.starts_with("@!%p");
            assert_eq!(code.matches('@').count(), usize::from(guard), "unfilled name in `{l}`");
        }
        assert!(!p.contains("SHFL64"));
        // ptxas and the driver's JIT refuse anything but ASCII, comments included.
        assert!(p.is_ascii());
        assert_eq!(p.matches(".entry gdaki_emu_engine").count(), 1);
        // 15 64-bit shuffles in the command decoder and the write path, 2 restoring the tagged bits, 3 in
        // the polling loop and the exit offer, 1 when STOP is seen, 1 in the mirror table's load, 5 in the
        // mirror's copy (one ring's addresses and range, to the whole warp).
        assert_eq!(p.matches("shfl.sync.idx.b32 %r32").count(), 27);
    }

    /// What `engine.ptx` does with a slot's 16 words read ahead (WORK, then LOADED), written again from its
    /// description: the slot counts only when every word's bit 63 is the inverse of bit 0 of the expected
    /// lap; then each word's bit 63 comes back from bit `w` of word 7.
    fn engine_reads(words: &[u64; 16], index: u64) -> Option<Cmd> {
        let want = u64::from((index >> LAP_SHIFT) & 1 == 0);
        if words.iter().any(|v| v >> 63 != want) {
            return None;
        }
        let spare = words[7];
        let out: [u64; 16] = std::array::from_fn(|w| (words[w] & !(1 << 63)) | ((spare >> w) & 1) << 63);
        let mut cmd: Cmd = bytemuck::cast(out);
        cmd.reserved = 0;
        Some(cmd)
    }

    proptest::proptest! {
        /// A tagged command reads back whole at its own index, and never at the same slot one lap on or
        /// back; a slot never written (zeros) holds no command of lap 0.
        #[test]
        fn a_tagged_slot_is_taken_only_in_its_own_lap(
            words in proptest::array::uniform16(proptest::num::u64::ANY),
            index in 0u64..1 << 40,
        ) {
            let mut cmd: Cmd = bytemuck::cast(words);
            cmd.reserved = 0;
            let t = tagged(&cmd, index);
            let back = engine_reads(&t, index).expect("taken in its lap");
            proptest::prop_assert_eq!(bytemuck::bytes_of(&back), bytemuck::bytes_of(&cmd));
            proptest::prop_assert!(engine_reads(&t, index + SLOTS).is_none());
            proptest::prop_assert!(engine_reads(&t, index.wrapping_sub(SLOTS)).is_none() || index < SLOTS);
            proptest::prop_assert!(engine_reads(&[0; 16], index % SLOTS).is_none());
        }
    }
}
