//! One set of NIC objects over both backends, so that the ping-pong and the port channels run on either: the
//! emulated NIC or a real mlx5 NIC (feature `mlx5`). Each type is an enum with a variant per backend and the
//! calls both backends have, with the same meaning (they make the same device handles); objects of different
//! backends never mix.

use std::sync::Arc;

use gdaki_shared::handle::{CqHandle, MrHandle, QpHandle, RemoteMr};

use super::emu::{self, Access, EmuConfig, EmuNic, QpState, WireConfig};
use super::mlx5;
use super::spec::NicSpec;
use crate::exec::Executor;
use crate::mem::MemLoc;
use crate::{Error, Result};

/// An open NIC of either backend.
#[derive(Clone, Debug)]
pub enum Nic {
    /// The emulated NIC.
    Emu(Arc<EmuNic>),
    /// A real mlx5 NIC.
    #[cfg(feature = "mlx5")]
    Mlx5(Arc<mlx5::Mlx5Nic>),
}

/// A protection domain of either backend.
#[derive(Debug)]
pub enum Pd {
    /// Of the emulated NIC.
    Emu(emu::Pd),
    /// Of a real mlx5 NIC.
    #[cfg(feature = "mlx5")]
    Mlx5(mlx5::Pd),
}

/// A CQ of either backend.
#[derive(Debug)]
pub enum Cq {
    /// Of the emulated NIC.
    Emu(emu::Cq),
    /// Of a real mlx5 NIC.
    #[cfg(feature = "mlx5")]
    Mlx5(mlx5::Cq),
}

/// An RC QP of either backend.
#[derive(Debug)]
pub enum Qp {
    /// Of the emulated NIC.
    Emu(emu::Qp),
    /// Of a real mlx5 NIC (boxed: it holds a copy of its 256-byte `QpHandle`, several times the emulated
    /// NIC's variant).
    #[cfg(feature = "mlx5")]
    Mlx5(Box<mlx5::Qp>),
}

/// A memory region of either backend.
#[derive(Debug)]
pub enum Mr {
    /// Of the emulated NIC.
    Emu(emu::Mr),
    /// Of a real mlx5 NIC.
    #[cfg(feature = "mlx5")]
    Mlx5(mlx5::Mr),
}

/// A QP's connection info of either backend, as peers exchange it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// Of the emulated NIC.
    Emu(emu::Endpoint),
    /// Of a real mlx5 NIC (the type exists in every build, so that a build without the `mlx5` feature can
    /// decode a peer's endpoint and say why it cannot connect).
    Mlx5(mlx5::Endpoint),
}

/// Bytes of [`Endpoint::to_bytes`]: a backend byte (1 = emu, 2 = mlx5), then the backend's own encoding,
/// zero-padded to the longer one.
pub const ENDPOINT_BYTES: usize = 1 + max(emu::ENDPOINT_BYTES, mlx5::ENDPOINT_BYTES);

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// Applies `$body` to the backend object inside `$value` (an enum of this module), whatever the backend.
macro_rules! each {
    ($ty:ident, $value:expr, $x:ident => $body:expr) => {
        match $value {
            $ty::Emu($x) => $body,
            #[cfg(feature = "mlx5")]
            $ty::Mlx5($x) => $body,
        }
    };
}

/// The error for objects of two backends used together.
#[cfg(feature = "mlx5")]
fn mixed(what: &str) -> Error {
    Error::InvalidArgument(format!("{what} of one NIC backend used with a NIC of the other"))
}

impl Nic {
    /// Opens the NIC `spec` names for `exec`: the emulated NIC as [`EmuConfig::for_executor`] configures it
    /// (queues in GPU memory on the `gpu` executor and in host memory on the `cpu` executor unless
    /// `GDAKI_QUEUES` says otherwise), with `wire` for peers in other
    /// processes, or a real mlx5 NIC (queues mapped into the GPU for
    /// the `gpu` executor; `wire` is not used: peers are reached through the fabric).
    ///
    /// # Errors
    /// [`Error::Unavailable`] (one line) for a real NIC in a build without the `mlx5` feature, or on a host
    /// without RDMA devices ("no RDMA devices found: ..."), or one that cannot serve; what
    /// [`EmuNic::open`] or the mlx5 backend's `Mlx5Nic::open` returns otherwise.
    pub fn open(spec: &NicSpec, exec: &Executor, wire: Option<WireConfig>) -> Result<Nic> {
        match spec {
            NicSpec::Emu => {
                let cfg = EmuConfig { wire, ..EmuConfig::for_executor(exec)? };
                Ok(Nic::Emu(EmuNic::open(cfg)?))
            }
            #[cfg(feature = "mlx5")]
            NicSpec::Mlx5(m) => {
                let gpu = match exec {
                    Executor::Gpu(g) => Some(g.clone()),
                    Executor::Cpu => None,
                };
                Ok(Nic::Mlx5(mlx5::Mlx5Nic::open(m, gpu)?))
            }
            #[cfg(not(feature = "mlx5"))]
            NicSpec::Mlx5(m) => Err(Error::Unavailable(format!(
                "--nic {}: this build has no mlx5 backend (rebuild with --features mlx5; it needs rdma-core's \
                 libibverbs-dev and libclang-dev)",
                m.device
            ))),
        }
    }

    /// The emulated NIC, if this is one (its statistics, wire address).
    pub fn as_emu(&self) -> Option<&Arc<EmuNic>> {
        match self {
            Nic::Emu(n) => Some(n),
            #[cfg(feature = "mlx5")]
            Nic::Mlx5(_) => None,
        }
    }

    /// One line naming the NIC: `emulated NIC 0x…` or `mlx5_0 port 1`.
    pub fn describe(&self) -> String {
        match self {
            Nic::Emu(n) => format!("emulated NIC {:#x}", n.id()),
            #[cfg(feature = "mlx5")]
            Nic::Mlx5(n) => format!("{} port {}", n.name(), n.port()),
        }
    }

    /// Takes the first failure the drops of this NIC's resources met since the last call, if any: each backend
    /// logs such a failure with `tracing` when it happens and keeps the first ([`EmuNic::take_drop_error`],
    /// the mlx5 NIC's `take_drop_error`), as the GPU's objects do (`Gpu::take_drop_error`).
    pub fn take_drop_error(&self) -> Option<crate::Error> {
        match self {
            Nic::Emu(n) => n.take_drop_error(),
            #[cfg(feature = "mlx5")]
            Nic::Mlx5(n) => n.take_drop_error(),
        }
    }

    /// Whether `self` and `other` are the same NIC.
    pub fn same(&self, other: &Nic) -> bool {
        match (self, other) {
            (Nic::Emu(a), Nic::Emu(b)) => Arc::ptr_eq(a, b),
            #[cfg(feature = "mlx5")]
            (Nic::Mlx5(a), Nic::Mlx5(b)) => Arc::ptr_eq(a, b),
            #[cfg(feature = "mlx5")]
            _ => false,
        }
    }

    /// Allocates a protection domain.
    ///
    /// # Errors
    /// The backend's.
    pub fn alloc_pd(&self) -> Result<Pd> {
        match self {
            Nic::Emu(n) => n.alloc_pd().map(Pd::Emu),
            #[cfg(feature = "mlx5")]
            Nic::Mlx5(n) => n.alloc_pd().map(Pd::Mlx5),
        }
    }

    /// Creates a CQ of `ncqe` 64-byte CQEs (a power of two).
    ///
    /// # Errors
    /// The backend's (sizes out of its range, allocation).
    pub fn create_cq(&self, ncqe: u32) -> Result<Cq> {
        match self {
            Nic::Emu(n) => n.create_cq(ncqe).map(Cq::Emu),
            #[cfg(feature = "mlx5")]
            Nic::Mlx5(n) => n.create_cq(ncqe).map(Cq::Mlx5),
        }
    }

    /// Creates an RC QP in `pd` with an SQ of `wqe_cnt` WQEBBs completing into `cq`, in RESET.
    ///
    /// A poster in device code takes only its own QP's CQEs: it leaves another QP's in the CQ and reports
    /// `UnexpectedCqe` (`gdaki_device::error::Error`). So each QP whose CQ device code polls needs a CQ of its
    /// own (as DOCA GPUNetIO pairs each QP with its CQ), a QP replacing a failed one included: a flush returns
    /// at the failed QP's first error CQE, and the flush CQEs of its later WQEs may reach the CQ after that.
    /// A dropped QP's CQEs stay in the CQ (no CQ clean, as rdma-core's `ibv_destroy_qp` does).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a PD or CQ of the other backend; the backend's.
    pub fn create_qp(&self, pd: &Pd, cq: &Cq, wqe_cnt: u32) -> Result<Qp> {
        self.create_qp_for(pd, cq, wqe_cnt, false)
    }

    /// [`Nic::create_cq`], with the ring in host memory when `host_polled` (host code polls it: the proxy of
    /// the Host modes), whatever the emulated NIC's queue placement or the real NIC's queue path (a real NIC
    /// then takes its verbs path, and QPs completing into the CQ follow it).
    ///
    /// # Errors
    /// As [`Nic::create_cq`].
    pub fn create_cq_for(&self, ncqe: u32, host_polled: bool) -> Result<Cq> {
        match self {
            Nic::Emu(n) if host_polled => n.create_cq_in(ncqe, crate::mem::MemKind::Host).map(Cq::Emu),
            #[cfg(feature = "mlx5")]
            Nic::Mlx5(n) if host_polled => n.create_cq_host(ncqe).map(Cq::Mlx5),
            _ => self.create_cq(ncqe),
        }
    }

    /// [`Nic::create_qp`], with the SQ in host memory when `host_posted` (host code posts to it: the proxy of
    /// the Host modes), whatever the emulated NIC's queue placement.
    ///
    /// # Errors
    /// As [`Nic::create_qp`].
    pub fn create_qp_for(&self, pd: &Pd, cq: &Cq, wqe_cnt: u32, host_posted: bool) -> Result<Qp> {
        match (self, pd, cq) {
            (Nic::Emu(n), Pd::Emu(p), Cq::Emu(c)) if host_posted => {
                n.create_qp_in(p, c, wqe_cnt, crate::mem::MemKind::Host).map(Qp::Emu)
            }
            (Nic::Emu(n), Pd::Emu(p), Cq::Emu(c)) => n.create_qp(p, c, wqe_cnt).map(Qp::Emu),
            #[cfg(feature = "mlx5")]
            (Nic::Mlx5(n), Pd::Mlx5(p), Cq::Mlx5(c)) => n.create_qp(p, c, wqe_cnt).map(|q| Qp::Mlx5(Box::new(q))),
            #[cfg(feature = "mlx5")]
            _ => Err(mixed("PD or CQ")),
        }
    }

    /// Registers `len` bytes at `loc` in `pd` with rights `access`.
    ///
    /// # Safety
    /// As the backend's `reg_mr` ([`EmuNic::reg_mr`]): the range stays allocated until the MR is dropped.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a PD of the other backend; the backend's.
    pub unsafe fn reg_mr(&self, pd: &Pd, loc: MemLoc, len: u64, access: Access) -> Result<Mr> {
        match (self, pd) {
            // SAFETY: the caller's promise is the backend's.
            (Nic::Emu(n), Pd::Emu(p)) => unsafe { n.reg_mr(p, loc, len, access) }.map(Mr::Emu),
            #[cfg(feature = "mlx5")]
            // SAFETY: as above.
            (Nic::Mlx5(n), Pd::Mlx5(p)) => unsafe { n.reg_mr(p, loc, len, access) }.map(Mr::Mlx5),
            #[cfg(feature = "mlx5")]
            _ => Err(mixed("PD")),
        }
    }
}

impl Cq {
    /// The device handle.
    pub fn handle(&self) -> CqHandle {
        each!(Cq, self, c => c.handle())
    }

    /// The CQ number.
    pub fn cqn(&self) -> u32 {
        each!(Cq, self, c => c.cqn())
    }

    /// Entries in the ring.
    pub fn ncqe(&self) -> u32 {
        each!(Cq, self, c => c.ncqe())
    }
}

impl Qp {
    /// The QP number (24 bits).
    pub fn qpn(&self) -> u32 {
        each!(Qp, self, q => q.qpn())
    }

    /// SQ size in WQEBBs.
    pub fn wqe_cnt(&self) -> u32 {
        each!(Qp, self, q => q.wqe_cnt())
    }

    /// The device handle (same layout on both backends).
    pub fn handle(&self) -> QpHandle {
        each!(Qp, self, q => q.handle())
    }

    /// What a peer passes to its [`Qp::connect`].
    pub fn endpoint(&self) -> Endpoint {
        match self {
            Qp::Emu(q) => Endpoint::Emu(q.endpoint()),
            #[cfg(feature = "mlx5")]
            Qp::Mlx5(q) => Endpoint::Mlx5(q.endpoint()),
        }
    }

    /// Connects to `remote` (RESET → INIT → RTR → RTS).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an endpoint of the other backend; the backend's. A transition refused
    /// after RESET → INIT leaves the QP in ERR (best effort: a failure of that move is logged), where every WQE
    /// posted later completes with a flush error (0x05) instead of never running: create a new QP to retry.
    pub fn connect(&self, remote: &Endpoint) -> Result<()> {
        match (self, remote) {
            (Qp::Emu(q), Endpoint::Emu(e)) => q.connect(e),
            #[cfg(feature = "mlx5")]
            (Qp::Mlx5(q), Endpoint::Mlx5(e)) => q.connect(e),
            (q, e) => Err(Error::InvalidArgument(format!(
                "QP {:#x} cannot connect to {}: the peer uses the other NIC backend (give both ranks the same --nic kind)",
                q.qpn(),
                e.describe()
            ))),
        }
    }

    /// The QP's state. On a real NIC it is queried (`ibv_query_qp`); a failed query reads as
    /// [`QpState::Error`] (and is logged).
    pub fn state(&self) -> QpState {
        match self {
            Qp::Emu(q) => q.state(),
            #[cfg(feature = "mlx5")]
            Qp::Mlx5(q) => q.state().unwrap_or_else(|e| {
                tracing::warn!("mlx5: {e}");
                QpState::Error
            }),
        }
    }

    /// The emulated NIC's QP, if this is one (WQEBBs consumed, for tests).
    pub fn as_emu(&self) -> Option<&emu::Qp> {
        match self {
            Qp::Emu(q) => Some(q),
            #[cfg(feature = "mlx5")]
            Qp::Mlx5(_) => None,
        }
    }
}

impl Mr {
    /// The local key, host order.
    pub fn lkey(&self) -> u32 {
        each!(Mr, self, m => m.lkey())
    }

    /// The remote key, host order.
    pub fn rkey(&self) -> u32 {
        each!(Mr, self, m => m.rkey())
    }

    /// Where the region starts.
    pub fn loc(&self) -> MemLoc {
        each!(Mr, self, m => m.loc())
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        each!(Mr, self, m => m.len())
    }

    /// Whether the region is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device handle for local use.
    pub fn handle(&self) -> MrHandle {
        each!(Mr, self, m => m.handle())
    }

    /// What a peer needs to target this region.
    pub fn remote(&self) -> RemoteMr {
        each!(Mr, self, m => m.remote())
    }
}

impl Endpoint {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        match self {
            Endpoint::Emu(e) => e.qpn,
            Endpoint::Mlx5(e) => e.qpn,
        }
    }

    /// A few words for error messages.
    pub fn describe(&self) -> String {
        match self {
            Endpoint::Emu(e) => format!("emulated-NIC QP {:#x}", e.qpn),
            Endpoint::Mlx5(e) => format!("mlx5 QP {:#x} ({:?})", e.qpn, e.link),
        }
    }

    /// The fixed [`ENDPOINT_BYTES`]-byte encoding.
    pub fn to_bytes(&self) -> [u8; ENDPOINT_BYTES] {
        let mut b = [0u8; ENDPOINT_BYTES];
        match self {
            Endpoint::Emu(e) => {
                b[0] = 1;
                b[1..1 + emu::ENDPOINT_BYTES].copy_from_slice(&e.to_bytes());
            }
            Endpoint::Mlx5(e) => {
                b[0] = 2;
                b[1..1 + mlx5::ENDPOINT_BYTES].copy_from_slice(&e.to_bytes());
            }
        }
        b
    }

    /// Decodes [`Endpoint::to_bytes`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another length, an unknown backend byte, nonzero padding, or what the
    /// backend's decoder rejects.
    pub fn from_bytes(b: &[u8]) -> Result<Endpoint> {
        let bad = |what: String| Error::InvalidArgument(format!("endpoint bytes: {what}"));
        if b.len() != ENDPOINT_BYTES {
            return Err(bad(format!("{} bytes, not {ENDPOINT_BYTES}", b.len())));
        }
        let body = |n: usize| -> Result<&[u8]> {
            if b[1 + n..].iter().any(|&x| x != 0) {
                return Err(bad("padding not zero".into()));
            }
            Ok(&b[1..1 + n])
        };
        match b[0] {
            1 => Ok(Endpoint::Emu(emu::Endpoint::from_bytes(body(emu::ENDPOINT_BYTES)?)?)),
            2 => Ok(Endpoint::Mlx5(mlx5::Endpoint::from_bytes(body(mlx5::ENDPOINT_BYTES)?)?)),
            k => Err(bad(format!("unknown NIC backend {k}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::mlx5::{LinkLayer, Mtu};

    #[test]
    fn endpoints_of_both_backends_round_trip() {
        let e = Endpoint::Emu(emu::Endpoint { nic: 7, qpn: 0x42, psn: 9, wire: None });
        assert_eq!(Endpoint::from_bytes(&e.to_bytes()).unwrap(), e);
        let m = Endpoint::Mlx5(mlx5::Endpoint {
            link: LinkLayer::InfiniBand,
            qpn: 0x99,
            psn: 1,
            lid: 3,
            gid: [1; 16],
            gid_index: 0,
            mtu: Mtu::M4096,
        });
        let b = m.to_bytes();
        assert_eq!(b[0], 2);
        assert_eq!(Endpoint::from_bytes(&b).unwrap(), m);
        let mut bad = b;
        bad[ENDPOINT_BYTES - 1] = 1;
        assert!(Endpoint::from_bytes(&bad).is_err(), "padding");
        bad = b;
        bad[0] = 3;
        assert!(Endpoint::from_bytes(&bad).is_err(), "backend byte");
        assert!(Endpoint::from_bytes(&b[1..]).is_err(), "length");
    }

    #[test]
    fn emu_qp_refuses_an_mlx5_endpoint() {
        let nic = Nic::open(&NicSpec::Emu, &Executor::Cpu, None).unwrap();
        let pd = nic.alloc_pd().unwrap();
        let cq = nic.create_cq(64).unwrap();
        let qp = nic.create_qp(&pd, &cq, 64).unwrap();
        let m = Endpoint::Mlx5(mlx5::Endpoint {
            link: LinkLayer::Ethernet,
            qpn: 1,
            psn: 1,
            lid: 0,
            gid: [0; 16],
            gid_index: 0,
            mtu: Mtu::M1024,
        });
        let e = qp.connect(&m).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(ref s) if s.contains("other NIC backend")), "{e}");
        assert_eq!(qp.state(), QpState::Reset, "nothing changed");
    }
}
