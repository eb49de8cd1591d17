//! Port channels (MSCCL++'s `PortChannel`): what the host builds so that device code can `put`, `signal`,
//! `flush` and `wait` on a connection. In Device mode (MSCCL++'s GPUNetIO backend) device code posts the WQEs
//! itself, with no proxy thread; in the Host modes the handle also names the CPU proxy's FIFO
//! ([`PortChannelHandle::fifo`]), and device code pushes triggers there instead.
//!
//! A channel names a QP (shared by any number of channels), the peer's memory and the local memory it moves
//! data between, the peer's inbound semaphore it signals and its own inbound semaphore it waits on. Device code
//! uses it at one of three concurrency scopes: `Exclusive` (one thread owns the QP and updates the counters in
//! its [`QpHandle`](crate::handle::QpHandle)), `Block` (the threads of one CTA share the QP) and `Device` (any
//! thread of the grid). The shared scopes keep the QP's counters in a [`SharedQpState`] that every poster
//! updates with atomics; the [`QpHandle`](crate::handle::QpHandle)'s counters are then unused. Since neither
//! set of counters follows the other, a QP is posted to in one of the two ways for its whole life:
//! [`QpHandle::sharing`](crate::handle::QpHandle::sharing) records which, and posters of the other way refuse
//! the QP.

use crate::handle::{MrHandle, RemoteMr};
use crate::proxy::FifoHandle;
use bytemuck::{Pod, Zeroable};

/// The counters of a QP posted to by many threads (Block and Device scopes), in memory all of them reach
/// (GPU memory for the `gpu` executor). 128 bytes, 64-byte aligned; all zero for a new QP whose NIC has
/// consumed nothing (else every index at the NIC's consumer count, as [`QpHandle`](crate::handle::QpHandle)'s
/// counters are set). Indices are 64-bit WQEBB counts.
///
/// Posting a WQE of `n` WQEBBs: `resv += n` (atomic) reserves `[idx, idx + n)`; the poster waits until
/// `idx + n - retired <= wqe_cnt`, stores the WQE, waits until `ready == idx`, stores `last_db` (its ctrl
/// segment's doorbell bits, release) and `ready = idx + n` (release), so `ready` only moves over complete WQEs,
/// in order. Doorbells are rung under `db_lock` with the newest `last_db`, which covers every WQE published
/// before it, so dbrec values never go backwards and one doorbell may cover many WQEs: a poster that sees a
/// later reservation leaves the doorbell to the later poster; the last one rings, and so does any thread that
/// waits on unrung WQEs (for room or in `flush`). A WQE asks for a CQE when its poster asks, and when it covers
/// the last WQEBB of an aligned quarter of the ring (less on rings too small for a warp's batch beside a
/// quarter), decided from its own index alone; `flush` posts a signaled NOP when the last published WQE asked for
/// none. CQEs are polled by whichever waiter holds `poll_lock`, which moves `retired` and `cq_ci` forward (a
/// CQE completes every earlier WQE, so `retired` jumps to its WQE index + 1) and records the first error CQE,
/// which the NIC writes for unsignaled WQEs too.
///
/// A team post (the threads of one CTA together, one WQEBB each) makes one reservation: its leader takes
/// `team_lock`, adds the whole batch to `resv`, waits for room and leaves the base in `team_base`; after a
/// CTA barrier every member stores its WQE (only the last asks for a CQE), and after another the leader
/// publishes the batch as one poster would (`last_db`, `ready`) and rings once.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C, align(64))]
pub struct SharedQpState {
    /// WQEBBs reserved so far: the next WQE starts here.
    pub resv: u64,
    /// WQEBBs published in order: every WQE below is complete in the ring.
    pub ready: u64,
    /// WQEBBs retired by CQEs (the SQ consumer index).
    pub retired: u64,
    /// CQEs consumed from the QP's CQ (64-bit; the CQ dbrec carries the low 24 bits).
    pub cq_ci: u64,
    /// WQEBB index + 1 of the first WQE that completed in error, 0 while none has.
    pub err_idx: u64,
    /// WQEBB index + 1 of the last published WQE (stored before `ready`), with bit 63 set when that WQE asked
    /// for no CQE: `flush` waits until `retired` reaches it, after posting a signaled NOP when bit 63 is set.
    pub last_start: u64,
    /// Doorbell bits (the ctrl segment's first 8 bytes, as stored) of the last published WQE.
    pub last_db: u64,
    /// Producer index the last doorbell announced (64-bit; WQEBBs below it are rung).
    pub rung: u64,
    /// That error CQE, packed `syndrome << 24 | vendor_err_synd << 16 | wqe_counter`.
    pub err: u32,
    /// 1 while a thread polls the CQ, else 0.
    pub poll_lock: u32,
    /// 1 while a thread writes the dbrec and rings the doorbell, else 0.
    pub db_lock: u32,
    /// 1 while a team post (the threads of one CTA posting together) owns the three `team_*` words below,
    /// else 0: its leader takes it before its reservation and releases it once every member has read them.
    pub team_lock: u32,
    /// The team post's first WQEBB index, which its leader reserved for all members.
    pub team_base: u64,
    /// The doorbell bits of the team post's last WQE (stored by the member that built it).
    pub team_bits: u64,
    /// The leader's error while reserving, for the other members: words 0, 1, 3 and 4 of its `ErrorReport`
    /// (kind and CQE fields, `expected`, `detail`, `addr`; no error it can meet there has a `seen`); word 0 is
    /// 0 when there was none.
    pub team_err: [u64; 4],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<SharedQpState>() == 128);
    assert!(offset_of!(SharedQpState, team_lock) == 76);
    assert!(offset_of!(SharedQpState, team_base) == 80);
    assert!(offset_of!(SharedQpState, team_err) == 96);
};

/// One port channel as device code uses it (MSCCL++ `PortChannelDeviceHandle`). 208 bytes,
/// 8-byte aligned; built by the host's `PortChannel::device_handle`.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C)]
pub struct PortChannelHandle {
    /// Address of the QP's [`QpHandle`](crate::handle::QpHandle) (ring, dbrec, doorbell register, CQ; in
    /// Exclusive scope also the counters its one owner updates; in every scope the `sharing` word that the
    /// first post sets).
    pub qp: u64,
    /// Address of the QP's [`SharedQpState`] (Block and Device scopes); 0 when only Exclusive use is set up.
    pub shared: u64,
    /// The peer's memory that `put` writes into (`dst_offset` counts from its start).
    pub dst: RemoteMr,
    /// The local memory that `put` reads from (`src_offset` counts from its start).
    pub src: MrHandle,
    /// The peer's inbound semaphore for this channel: one 8-byte host-order word, advanced by `signal` with
    /// an RDMA fetch-add of 1 (host-endian atomics: the emulated NIC's, and ConnectX's in the mode mlx5_core
    /// enables), or in HostNoAtomic by the proxy's RDMA WRITE of the new count.
    pub remote_sem: RemoteMr,
    /// Address of this side's inbound semaphore (the word the peer's `signal` advances), 8-byte aligned.
    pub local_sem: u64,
    /// Address of this side's expected inbound count (8 bytes, device memory): `wait` adds 1 and waits until
    /// the inbound semaphore reaches it (MSCCL++ `expectedInboundSemaphore`).
    pub expected: u64,
    /// The QP's atomic scratch word (8 bytes, 8-byte aligned, `LOCAL_WRITE`): where fetch-add results land,
    /// so that they never overwrite user data. Shared by the QP's channels; nobody reads it.
    pub scratch: MrHandle,
    /// Largest payload of one RDMA WRITE, bytes: longer puts are split (at most 2^31, mlx5's `max_msg_sz`).
    pub max_wqe_bytes: u64,
    /// Bound of every device-side wait, ns.
    pub timeout_ns: u64,
    /// Puts of up to this many bytes ring by BlueFlame in Device mode with Exclusive sharing (default
    /// 512 KiB): their last WQE's one WQEBB is written to the BlueFlame register (the payload is read from
    /// memory as for any WRITE). A signal or an accumulate counts as its 8 bytes, so 0 means no BlueFlame at
    /// all. Unused by Block and Device sharing and by the proxy.
    pub blue_flame_limit: u64,
    /// The proxy's FIFO (Host and HostNoAtomic modes; all zero in Device mode).
    pub fifo: FifoHandle,
    /// Address of the proxy's sticky error word for this channel's QP (8 bytes, pinned host memory): 0 while
    /// no WQE the proxy posted has failed, else `1 << 32 |` the packed error CQE (`syndrome << 24 |
    /// vendor_err_synd << 16 | wqe_counter`). 0 in Device mode.
    pub proxy_err: u64,
    /// Who posts this channel's WQEs: one of [`crate::proxy::mode`].
    pub proxy: u32,
    /// The proxy's number of this channel, carried by its triggers.
    pub channel_id: u32,
}

const _: () = assert!(core::mem::size_of::<PortChannelHandle>() == 208);
