//! Device handles: what the host builds and passes to device code (by pointer), for either executor.
//!
//! Addresses are `u64` device-visible virtual addresses: for the `gpu` executor, pointers valid in the kernel
//! (pinned host memory mapped into the GPU, or GPU memory); for the `cpu` executor, host pointers. Keys that go
//! into WQEs verbatim are stored big-endian, precomputed by the host (as DOCA GPUNetIO does).

/// The big-endian field type of [`RemoteMr::rkey`] and [`MrHandle`]'s key, named here so that code that reads or
/// changes a key (`Be32::new(key)`, `rkey.get()`) needs no dependency beyond the module it takes the handles
/// from (`gdaki_device::handle`).
pub use crate::be::Be32;
use bytemuck::{Pod, Zeroable};

/// Where a NIC queue's memory (SQ ring, CQ ring, doorbell records) lives, as the host placed it: device code
/// chooses its fence scope from it. Host memory (pinned, mapped into the GPU) is read by the NIC over PCIe and
/// needs system-scope ordering before the doorbell; GPU memory (DOCA GPUNetIO's and NVSHMEM IBGDA's default)
/// is ordered with GPU-scope fences, the doorbell being the only store that leaves the GPU. The UAR page
/// (doorbell and BlueFlame register) is never GPU memory. A `u32` newtype, so that handles stay plain data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(transparent)]
pub struct Placement(pub u32);

impl Placement {
    /// Host memory: plain host memory for the `cpu` executor, pinned host memory mapped into the GPU for
    /// the `gpu` executor.
    pub const HOST: Placement = Placement(0);
    /// GPU memory (the `gpu` executor only).
    pub const GPU: Placement = Placement(1);

    /// Whether the queues are in GPU memory.
    pub const fn is_gpu(self) -> bool {
        self.0 == Self::GPU.0
    }
}

/// A completion queue as device code polls it (`mlx5dv_cq` plus the software consumer index). 40 bytes.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C)]
pub struct CqHandle {
    /// Address of the CQE ring: `ncqe` × 64-byte [`crate::prm::cqe::Cqe64`], 64-byte aligned.
    pub buf: u64,
    /// Address of the CQ's [`crate::prm::dbrec::CqDbrec`] (8-byte aligned).
    pub dbrec: u64,
    /// Entries in the ring; a power of two.
    pub ncqe: u32,
    /// CQ number (24 bits), for error reports.
    pub cqn: u32,
    /// Software state: CQEs consumed so far (64-bit; the dbrec carries the low 24 bits).
    pub cons_index: u64,
    /// Where the ring and the dbrec are.
    pub placement: Placement,
    /// Padding, zero.
    pub pad: u32,
}

/// An RC QP's send side as device code drives it (`mlx5dv_qp` + UAR + the send-queue state). 256 bytes.
///
/// The fixed fields (ring, dbrec, doorbell register, CQ, placement) are written by the host before the QP is
/// used. The software state is [`QpHandle::sq`] and [`CqHandle::cons_index`], one layout for every kind of
/// poster: an Exclusive poster (one thread) keeps it in registers and writes it back, shared posters (Block and
/// Device scopes) update it with atomics, and each keeps every word the other reads, so a QP may be posted to
/// by one kind of poster, then another (kernel after kernel, or through two channels of one connection), and
/// the ring stays consistent. The host sets the state where the NIC is when it builds the handle
/// ([`SqState::at`]; zero for a new QP). All indices are 64-bit WQEBB counts; the wire carries their low 16
/// bits.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C)]
pub struct QpHandle {
    /// Address of the SQ ring: `wqe_cnt` × 64-byte WQEBBs, 64-byte aligned.
    pub sq_buf: u64,
    /// Address of the QP's [`crate::prm::dbrec::QpDbrec`] (word 1 = SQ counter).
    pub dbrec: u64,
    /// Address of the doorbell/BlueFlame register: UAR page + [`crate::prm::uar::BF_OFFSET`], 64-byte aligned.
    pub bf_reg: u64,
    /// SQ size in WQEBBs; a power of two, at least 16.
    pub wqe_cnt: u32,
    /// QP number (24 bits).
    pub qpn: u32,
    /// The send CQ (its `cons_index` is the QP's CQ consumer index, for every kind of poster).
    pub cq: CqHandle,
    /// Where the SQ ring and the dbrec are (the doorbell register is always in the UAR page).
    pub placement: Placement,
    /// Bytes one BlueFlame write may carry to `bf_reg` (`mlx5dv_qp.bf.size`; rdma-core uses BlueFlame only
    /// for a WQE no larger): 0 for a doorbell-only UAR, where device code rings by doorbell whatever it is
    /// asked. The emulated NIC's register takes one WQEBB ([`crate::prm::uar::BF_WRITE_SIZE`]).
    pub bf_size: u32,
    /// Padding, zero: the state starts at byte 128, in a cache line of its own (shared posters' atomics on it
    /// then do not share a 64-byte line with the fixed fields every poster reads).
    pub pad: [u32; 12],
    /// The send-queue state.
    pub sq: SqState,
}

/// A QP's send-queue state (byte 128 of its [`QpHandle`]), in memory every poster reaches (GPU memory for the
/// `gpu` executor). 128 bytes. Indices are 64-bit WQEBB counts.
///
/// An Exclusive poster (`gdaki_device::qp::Qp`, one thread) reads it when it starts and after each of its
/// slow paths (which write the counters back first), posts with the counters in registers, rings whatever it
/// left unrung when it is dropped and writes back `pi` and `ready` (equal: it
/// publishes as it stores) and `rung`; `sig_first` and `sig_end` it stores when a WQE asks for a CQE, `ci`
/// when its CQ polls (which also move `cq.cons_index`) retire WQEs. Shared posters
/// (`gdaki_device::shared_qp::SharedQp`) run this protocol: posting a WQE of `n` WQEBBs, `pi += n` (atomic)
/// reserves `[idx, idx + n)`; the poster waits until `idx + n - ci <= wqe_cnt`, stores the WQE, waits until
/// `ready == idx` and moves it to `idx + n` (a release fence, then a compare-and-swap `idx` → `idx + n`; a WQE
/// that asked for a CQE: an acquire load of `ready`, stores of `sig_first`/`sig_end`, a release store), so
/// `ready` only moves over complete WQEs, in order. Doorbells are rung under `db_lock` with the producer index
/// `ready` (the ctrl fields of no WQE), which covers every WQE published before it, so dbrec values never go
/// backwards and one doorbell may cover many WQEs: a poster that sees a later
/// reservation leaves the doorbell to the later poster; the last one rings, and so does any thread that waits
/// on unrung WQEs (for room or in `flush`). A shared WQE asks for a CQE when its poster asks, and when it
/// covers the last WQEBB of an aligned quarter of the ring (less on rings too small for a warp's batch beside a
/// quarter), decided from its own index alone; `flush` posts a signaled NOP when the last published WQE asked
/// for none (`sig_end != ready`). CQEs are polled by whichever waiter holds `poll_lock`, which moves `ci` and
/// `cq.cons_index` forward (a CQE completes every earlier WQE, so `ci` jumps to its WQE index + 1) and records
/// the first error CQE, which the NIC writes for unsignaled WQEs too.
///
/// A team post (the threads of one CTA together, one WQEBB each) makes one reservation: its leader adds the
/// whole batch to `pi` and waits for room; a CTA barrier hands the base to the members (through the CTA's
/// shared memory, never this state), every member stores its WQE (only the last asks for a CQE), and after
/// another barrier the leader publishes the batch as one poster would and rings once.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C)]
pub struct SqState {
    /// WQEBBs reserved (the producer index): the next WQE starts here.
    pub pi: u64,
    /// WQEBBs published in order: every WQE below is complete in the ring.
    pub ready: u64,
    /// WQEBBs retired (the SQ consumer index). A CQE for the WQE at index `w` retires up to `w + 1` (its first
    /// WQEBB; the rest of a multi-WQEBB WQE is retired by a later CQE).
    pub ci: u64,
    /// First WQEBB index + 1 of the last published WQE that asked for a CQE (0 while none has); that WQE has
    /// completed when `ci >= sig_first`.
    pub sig_first: u64,
    /// `ready` just after that WQE: equal to `ready` when the last published WQE asked for a CQE.
    pub sig_end: u64,
    /// WQEBB index + 1 of the first WQE that completed in error, 0 while none has. The QP is in the error
    /// state from then on, and waits on that WQE or any later one report [`SqState::err`].
    pub err_idx: u64,
    /// Producer index the last doorbell announced (WQEBBs below it are rung).
    pub rung: u64,
    /// That error CQE, packed `syndrome << 24 | vendor_err_synd << 16 | wqe_counter`.
    pub err: u32,
    /// 1 while a thread polls the CQ, else 0.
    pub poll_lock: u32,
    /// 1 while a thread writes the dbrec and rings the doorbell, else 0.
    pub db_lock: u32,
    /// The next ticket of the host threads' turns on this QP through a warp's poster: on the `cpu` executor
    /// each thread is a warp of one lane, so the threads that are one warp on the GPU (and share its
    /// Warp-sharing handle) take turns, served in ticket order (`host_serving`). Unused on the GPU.
    pub host_next: u32,
    /// The ticket whose host thread has its turn (see `host_next`); equal to `host_next` when none has.
    pub host_serving: u32,
    /// Tickets whose host threads gave up waiting for their turn, as bits: bit `k` is ticket
    /// `host_serving + k`, so that the turn passes over them. Read and written with `host_serving` as one
    /// 8-byte word (the serving ticket in its low half on a little-endian host). Unused on the GPU.
    pub host_given_up: u32,
    /// On the `cpu` executor, the launch (high half) and the CTA (Block scope) or warp (Warp sharing) of it
    /// that posts to this QP (low half): another CTA or warp of the same launch is refused, as the GPU would
    /// corrupt the QP. 0 for none. Unused on the GPU.
    pub host_owner: u64,
    /// On the `cpu` executor, the Exclusive posters (device `Qp`s) of this handle alive now: a second one while
    /// the first lives keeps its own counters, so both would write the same WQEBBs; its calls and the first's
    /// are refused while both live, and so are a shared poster's (Block or Device scope) while any lives. A
    /// `WarpQp`'s leader for one turn is not counted here (its `WarpQp` is, in `host_warps`). 0 for none.
    /// Unused on the GPU.
    pub host_posters: u64,
    /// On the `cpu` executor, the calls of shared posters (Block or Device scope) of this handle under way now:
    /// an Exclusive `Qp` made meanwhile is refused for its life, and a live one's calls are refused while any
    /// is under way (its counters, kept apart, would overwrite theirs). 0 for none. Unused on the GPU.
    pub host_shared: u64,
    /// On the `cpu` executor, the Warp-sharing posters (device `WarpQp`s, one per host thread of a warp) of this
    /// handle alive now: on the GPU the warp's leader keeps the QP's counters from the `WarpQp`'s making to its
    /// drop, so an Exclusive `Qp` or a shared poster's call meanwhile is refused. 0 for none. Unused on the GPU.
    pub host_warps: u64,
    /// Zero: keeps the state 128 bytes (the handle's second half).
    pub pad: [u64; 2],
}

impl SqState {
    /// The state of a QP whose NIC has consumed `consumed` WQEBBs and which has nothing outstanding: every
    /// index at `consumed` (a new QP: 0).
    pub const fn at(consumed: u64) -> SqState {
        SqState {
            pi: consumed,
            ready: consumed,
            ci: consumed,
            sig_first: consumed,
            sig_end: consumed,
            err_idx: 0,
            rung: consumed,
            err: 0,
            poll_lock: 0,
            db_lock: 0,
            host_next: 0,
            host_serving: 0,
            host_given_up: 0,
            host_owner: 0,
            host_posters: 0,
            host_shared: 0,
            host_warps: 0,
            pad: [0; 2],
        }
    }
}

/// A local memory region as device code names it in data segments. 24 bytes.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C)]
pub struct MrHandle {
    /// Start address (device-visible), bytes; any alignment (atomics need 8-byte aligned targets).
    pub addr: u64,
    /// Length, bytes.
    pub length: u64,
    /// Local key, big-endian as a data segment carries it.
    pub lkey: Be32,
    /// Remote key, big-endian as a raddr segment carries it (what the peer uses).
    pub rkey: Be32,
}

/// A peer's memory region as device code targets it in raddr segments. 24 bytes.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C)]
pub struct RemoteMr {
    /// Start address in the peer's address space, bytes.
    pub addr: u64,
    /// Length, bytes.
    pub length: u64,
    /// Remote key, big-endian.
    pub rkey: Be32,
    /// Padding, zero.
    pub pad: u32,
}

/// What device code reports to the host when it fails (written once into memory the host reads after the
/// kernel ends). 40 bytes. `kind` 0 means no error; see `gdaki_device::error` for the other kinds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct ErrorReport {
    /// Error kind code; 0 = none.
    pub kind: u32,
    /// Error CQE syndrome, or 0.
    pub syndrome: u8,
    /// Error CQE vendor syndrome, or 0.
    pub vendor_err_synd: u8,
    /// WQE index of the failed WQE (host order), or 0.
    pub wqe_counter: u16,
    /// What a wait expected (a semaphore value, a WQE index, a payload word...), an invalid argument's code,
    /// or a range error's memory length.
    pub expected: u64,
    /// What it saw last, or a range error's length in bytes.
    pub seen: u64,
    /// Nanoseconds waited, the iteration number for payload errors, or 1 for a range error in the peer's
    /// memory (0: local).
    pub detail: u64,
    /// The address (a semaphore) or byte offset (a payload word, a range) the error concerns, or 0.
    pub addr: u64,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<CqHandle>() == 40);
    assert!(size_of::<QpHandle>() == 256);
    assert!(offset_of!(QpHandle, cq) == 32);
    assert!(offset_of!(QpHandle, sq) == 128);
    assert!(size_of::<SqState>() == 128);
    assert!(offset_of!(SqState, host_next) == 68);
    assert!(offset_of!(SqState, host_serving) == 72);
    assert!(offset_of!(SqState, host_given_up) == 76);
    assert!(offset_of!(SqState, host_owner) == 80);
    assert!(offset_of!(SqState, host_posters) == 88);
    assert!(offset_of!(SqState, host_shared) == 96);
    assert!(offset_of!(SqState, host_warps) == 104);
    assert!(offset_of!(SqState, pad) == 112);
    assert!(size_of::<MrHandle>() == 24);
    assert!(size_of::<RemoteMr>() == 24);
    assert!(size_of::<ErrorReport>() == 40);
};
