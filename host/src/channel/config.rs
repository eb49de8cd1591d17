//! How a connection is made: MSCCL++'s `EndpointConfig`, with its `Transport` and `EndpointConfig::Ib`.

use crate::nic::emu::{MAX_CQE, MAX_WQE_CNT, MIN_WQE_CNT};
use crate::{Error, Result};

/// Which NIC a connection goes through (MSCCL++ `Transport`, its IB members).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transport {
    /// An RC QP on the communicator's NIC, which is chosen when the communicator is made
    /// ([`Communicator::with_nic`](super::Communicator::with_nic)): the emulated mlx5 NIC ([`crate::nic::emu`];
    /// peers in this process are reached directly, peers in other processes or hosts over the NIC's wire) or
    /// a ConnectX through [`crate::nic`]'s `mlx5` backend (the name is older than that backend). The only
    /// transport: a connection's NIC is always its communicator's.
    #[default]
    EmuRc,
}

/// Who posts the WQEs of a connection's QP (MSCCL++ `EndpointConfig::Ib::Mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IbMode {
    /// A CPU proxy thread ([`crate::proxy::ProxyService`], one per communicator) posts WQEs on behalf of device
    /// code, which pushes 16-byte triggers into a FIFO in pinned host memory (MSCCL++'s default `Host` mode).
    /// Signals are RDMA fetch-adds, as in Device mode.
    Host,
    /// As [`IbMode::Host`], with signals sent as an RDMA WRITE of the semaphore's new value instead of an
    /// atomic, for fabrics without RDMA atomics (MSCCL++ `HostNoAtomic`); `put_with_accumulate` is refused.
    HostNoAtomic,
    /// Device code builds WQEs, writes the dbrec, rings the doorbell and polls the CQ itself, with no CPU on
    /// the data path (MSCCL++'s GPUNetIO backend, DOCA GPUNetIO, NVSHMEM IBGDA). The default here (MSCCL++'s
    /// default is `Host`), since GPU-initiated posting is what this crate is for.
    #[default]
    Device,
}

impl IbMode {
    /// The mode's name as MSCCL++ spells it (`"Host"`, `"HostNoAtomic"`, `"Device"`), for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Host => "Host",
            Self::HostNoAtomic => "HostNoAtomic",
            Self::Device => "Device",
        }
    }

    /// The mode whose [`IbMode::code`] is `code`, if any.
    pub(super) fn from_code(code: u8) -> Option<Self> {
        [Self::Host, Self::HostNoAtomic, Self::Device].into_iter().find(|m| m.code() == code)
    }

    pub(super) fn code(self) -> u8 {
        match self {
            Self::Host => 1,
            Self::HostNoAtomic => 2,
            Self::Device => 3,
        }
    }
}

/// The IB part of an [`EndpointConfig`] (MSCCL++ `EndpointConfig::Ib`). MSCCL++'s `deviceIndex`, `port` and
/// `gidIndex` are not here: the device, port and GID index are the communicator's NIC's
/// ([`NicSpec`](crate::nic::NicSpec), `--nic mlx5_0:PORT:GID_INDEX`). `maxCqPollNum` and `maxWrPerSend` belong
/// to the CPU proxy, which has no such settings here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IbConfig {
    /// Who posts the WQEs.
    pub mode: IbMode,
    /// SQ size in WQEBBs (64-byte basic blocks; an RDMA WRITE or a fetch-add takes one): a power of two in
    /// [`MIN_WQE_CNT`]`..=`[`MAX_WQE_CNT`] (16 ..= 32768). Default [`IbConfig::DEFAULT_MAX_SEND_WR`]. Unlike
    /// MSCCL++'s `maxSendWr` (work requests, any number) it counts ring slots, since device code indexes the
    /// ring itself.
    pub max_send_wr: u32,
    /// CQ size in CQEs: a power of two up to [`MAX_CQE`]. A value below `max_send_wr` is raised to it (every
    /// WQEBB may ask for a CQE, and shared scopes ask for one per WQE). Default
    /// [`IbConfig::DEFAULT_MAX_CQ_SIZE`], as MSCCL++'s `maxCqSize`.
    pub max_cq_size: u32,
}

impl IbConfig {
    /// Default [`IbConfig::max_send_wr`]: 1024 WQEBBs (64 KiB of ring).
    pub const DEFAULT_MAX_SEND_WR: u32 = 1024;
    /// Default [`IbConfig::max_cq_size`]: 1024 CQEs (MSCCL++'s `DefaultMaxCqSize`).
    pub const DEFAULT_MAX_CQ_SIZE: u32 = 1024;

    /// Checks the sizes; returns `(wqe_cnt, ncqe)` as the QP and CQ are created.
    pub(super) fn sizes(&self) -> Result<(u32, u32)> {
        let w = self.max_send_wr;
        if !w.is_power_of_two() || !(MIN_WQE_CNT..=MAX_WQE_CNT).contains(&w) {
            return Err(Error::InvalidArgument(format!(
                "ib.max_send_wr {w} must be a power of two in {MIN_WQE_CNT}..={MAX_WQE_CNT} (SQ WQEBBs)"
            )));
        }
        let c = self.max_cq_size;
        if !c.is_power_of_two() || c > MAX_CQE {
            return Err(Error::InvalidArgument(format!("ib.max_cq_size {c} must be a power of two up to {MAX_CQE}")));
        }
        Ok((w, c.max(w)))
    }
}

impl Default for IbConfig {
    fn default() -> Self {
        Self { mode: IbMode::default(), max_send_wr: Self::DEFAULT_MAX_SEND_WR, max_cq_size: Self::DEFAULT_MAX_CQ_SIZE }
    }
}

/// How [`Communicator::connect`](super::Communicator::connect) makes a connection (MSCCL++ `EndpointConfig`).
/// `EndpointConfig::default()` is an emulated-NIC RC QP in [`IbMode::Device`] with the default sizes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EndpointConfig {
    /// Which NIC.
    pub transport: Transport,
    /// QP and CQ settings.
    pub ib: IbConfig,
}

impl EndpointConfig {
    /// The default configuration with `ib.mode = mode`.
    pub fn with_mode(mode: IbMode) -> Self {
        Self { ib: IbConfig { mode, ..IbConfig::default() }, ..Self::default() }
    }

    /// Checks the sizes; returns `(wqe_cnt, ncqe)`.
    pub(super) fn check(&self) -> Result<(u32, u32)> {
        match self.transport {
            Transport::EmuRc => {}
        }
        self.ib.sizes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_config_defaults_and_sizes() {
        let c = EndpointConfig::default();
        assert_eq!(c.transport, Transport::EmuRc);
        assert_eq!(c.ib.mode, IbMode::Device);
        assert_eq!(c.check().unwrap(), (1024, 1024));
        let big = EndpointConfig { ib: IbConfig { max_send_wr: 4096, ..IbConfig::default() }, ..c };
        assert_eq!(big.check().unwrap(), (4096, 4096), "a CQ smaller than the SQ is raised to it");
        for w in [0, 8, 24, 65536] {
            let bad = EndpointConfig { ib: IbConfig { max_send_wr: w, ..IbConfig::default() }, ..c };
            let e = bad.check().unwrap_err().to_string();
            assert!(e.contains("max_send_wr"), "{e}");
        }
        let bad = EndpointConfig { ib: IbConfig { max_cq_size: 1000, ..IbConfig::default() }, ..c };
        assert!(bad.check().unwrap_err().to_string().contains("max_cq_size"));
    }

    #[test]
    fn channel_config_every_mode_is_accepted() {
        for m in [IbMode::Host, IbMode::HostNoAtomic, IbMode::Device] {
            assert_eq!(EndpointConfig::with_mode(m).check().unwrap(), (1024, 1024), "{m:?}");
        }
    }
}
