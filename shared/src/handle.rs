//! Device handles: what the host builds and passes to device code (by pointer), for either executor.
//!
//! Addresses are `u64` device-visible virtual addresses: for the `gpu` executor, pointers valid in the kernel
//! (pinned host memory mapped into the GPU, or GPU memory); for the `cpu` executor, host pointers. Keys that go
//! into WQEs verbatim are stored big-endian, precomputed by the host (as DOCA GPUNetIO does).

use crate::be::Be32;
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

/// An RC QP's send side as device code drives it (`mlx5dv_qp` + UAR + software counters). 128 bytes.
///
/// Software state (`sq_*` counters, the sticky error, `cq.cons_index`) is written by the one thread that owns
/// the handle (Exclusive mode); the host sets it where the NIC is when it builds the handle (zero for a new
/// QP). All indices are 64-bit WQEBB counts; the wire carries their low 16 bits. Posters of the shared scopes
/// keep their counters in a [`SharedQpState`](crate::channel::SharedQpState) instead and write only
/// [`QpHandle::sharing`] here.
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
    /// The send CQ.
    pub cq: CqHandle,
    /// Software state: WQEBBs produced (the next WQE starts here).
    pub sq_pi: u64,
    /// Software state: WQEBBs retired. A CQE for the WQE at index `w` retires up to `w + 1` (its first
    /// WQEBB; the rest of a multi-WQEBB WQE is retired by a later CQE).
    pub sq_ci: u64,
    /// Software state: first WQEBB index + 1 of the last WQE that requested a CQE; that WQE has completed when
    /// `sq_ci >= sq_sig_first`.
    pub sq_sig_first: u64,
    /// Software state: `sq_pi` just after the last WQE that requested a CQE (equal to `sq_pi` when the last
    /// posted WQE requested one).
    pub sq_sig_end: u64,
    /// Software state: WQEBB index + 1 of the first WQE that completed in error, 0 while none has. The QP is
    /// in the error state from then on, and waits on that WQE or any later one report [`QpHandle::sq_err`].
    pub sq_err_idx: u64,
    /// Software state: that error CQE, packed `syndrome << 24 | vendor_err_synd << 16 | wqe_counter`.
    pub sq_err: u32,
    /// Where the SQ ring and the dbrec are (the doorbell register is always in the UAR page).
    pub placement: Placement,
    /// Bytes one BlueFlame write may carry to `bf_reg` (`mlx5dv_qp.bf.size`; rdma-core uses BlueFlame only
    /// for a WQE no larger): 0 for a doorbell-only UAR, where device code rings by doorbell whatever it is
    /// asked. The emulated NIC's register takes one WQEBB ([`crate::prm::uar::BF_WRITE_SIZE`]).
    pub bf_size: u32,
    /// Which kind of poster has posted to this QP, one of [`sharing`]: [`sharing::NONE`] until the first post
    /// (what the host builds), then [`sharing::EXCLUSIVE`] or [`sharing::SHARED`], set by that post. The two
    /// kinds keep their counters in different places (here, or a `SharedQpState`), so a poster of the other
    /// kind would reuse WQEBBs still in flight: it refuses the QP instead (`InvalidArgument::Sharing`).
    pub sharing: u32,
}

/// Values of [`QpHandle::sharing`]: which kind of poster a QP has been posted to by.
pub mod sharing {
    /// Nobody has posted yet.
    pub const NONE: u32 = 0;
    /// Exclusive posters (`gdaki_device::qp::Qp`, `gdaki_device::warp_qp::WarpQp`), whose counters are the
    /// handle's.
    pub const EXCLUSIVE: u32 = 1;
    /// Shared posters (`gdaki_device::shared_qp::SharedQp` of Block or Device scope), whose counters are in a
    /// [`SharedQpState`](crate::channel::SharedQpState).
    pub const SHARED: u32 = 2;
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
    /// What a wait expected (a semaphore value, a WQE index, a payload word...).
    pub expected: u64,
    /// What it saw last.
    pub seen: u64,
    /// Nanoseconds waited, or the iteration number for payload errors.
    pub detail: u64,
    /// The address (a semaphore) or byte offset (a payload word) the error concerns, or 0.
    pub addr: u64,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<CqHandle>() == 40);
    assert!(size_of::<QpHandle>() == 128);
    assert!(offset_of!(QpHandle, cq) == 32);
    assert!(offset_of!(QpHandle, sq_pi) == 72);
    assert!(offset_of!(QpHandle, sharing) == 124);
    assert!(size_of::<MrHandle>() == 24);
    assert!(size_of::<RemoteMr>() == 24);
    assert!(size_of::<ErrorReport>() == 40);
};
