//! Registered memory (MSCCL++ `RegisteredMemory`), its peer-side view ([`RemoteMemory`]), and the small words
//! channels keep where device code reaches them.

use std::sync::Arc;

use gdaki_shared::handle::{MrHandle, RemoteMr};

use crate::exec::DataBuf;
use crate::mem::MemLoc;
use crate::nic::Mr;
use crate::{Error, Result};

use super::resources::Resources;

/// Memory registered with a [`Communicator`](super::Communicator)'s NIC for channels (MSCCL++
/// `RegisteredMemory`): an MR with `LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC`, so that it can
/// be a channel's source, a peer's destination, or a target of atomics. Made by
/// [`Communicator::register_memory`](super::Communicator::register_memory) or
/// [`Communicator::register_buffer`](super::Communicator::register_buffer); handed to peers with
/// [`Communicator::send_memory`](super::Communicator::send_memory).
///
/// Cloning is cheap and shares the registration. It is deregistered when the last clone (channels hold one)
/// is dropped; deregistration waits until no WQE uses it, so the NIC never touches the memory afterwards. A
/// WQE posted before and executed after fails with a local protection error (syndrome 0x04), as on hardware:
/// flush the channels that read or write it before their last clone goes. A buffer given to `register_buffer`
/// is freed after that.
#[derive(Clone, Debug)]
pub struct RegisteredMemory {
    pub(super) inner: Arc<RegInner>,
}

/// Field order is drop order: the MR before the buffer it covers.
#[derive(Debug)]
pub(super) struct RegInner {
    pub(super) mr: Mr,
    pub(super) buf: Option<DataBuf>,
    pub(super) res: Arc<Resources>,
}

impl RegisteredMemory {
    /// The handle device code names it with as a local source or destination (address, length in bytes,
    /// lkey and rkey big-endian): a [`PortChannelHandle`](gdaki_shared::channel::PortChannelHandle)'s `src`.
    pub fn handle(&self) -> MrHandle {
        self.inner.mr.handle()
    }

    /// What a peer needs to target it (address, length, rkey big-endian); what
    /// [`Communicator::send_memory`](super::Communicator::send_memory) sends.
    pub fn remote(&self) -> RemoteMr {
        self.inner.mr.remote()
    }

    /// Where it is (host or GPU memory, device-visible address).
    pub fn loc(&self) -> MemLoc {
        self.inner.mr.loc()
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.inner.mr.len()
    }

    /// Whether it has no bytes (never: registration rejects zero lengths).
    pub fn is_empty(&self) -> bool {
        self.inner.mr.is_empty()
    }

    /// The buffer it was registered from, when it came from
    /// [`register_buffer`](super::Communicator::register_buffer) (for filling and checking payloads).
    pub fn buffer(&self) -> Option<&DataBuf> {
        self.inner.buf.as_ref()
    }

    /// The rank that registered it.
    pub fn rank(&self) -> u32 {
        self.inner.res.rank
    }
}

/// A peer's registered memory as this rank targets it (MSCCL++'s `RegisteredMemory` received with
/// `recvMemory`): the rank it belongs to and its [`RemoteMr`] (address in the peer's address space, length in
/// bytes, rkey). Plain data: it keeps nothing alive on the peer, whose memory stays valid only while the peer
/// keeps its [`RegisteredMemory`].
#[derive(Clone, Copy, Debug)]
pub struct RemoteMemory {
    pub(super) rank: u32,
    pub(super) mr: RemoteMr,
}

impl RemoteMemory {
    /// The rank whose memory it is.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Address, length and rkey, as a [`PortChannelHandle`](gdaki_shared::channel::PortChannelHandle)'s `dst`
    /// carries them.
    pub fn remote(&self) -> RemoteMr {
        self.mr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.mr.length
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.mr.length == 0
    }
}

/// Reads `len` bytes at byte `off` of `buf` (a snapshot while device code may be writing them).
pub(super) fn read_words(buf: &DataBuf, off: usize, len: usize) -> Result<Vec<u8>> {
    match buf {
        DataBuf::Host(b) => {
            check_range(b.len(), off, len)?;
            // SAFETY: in bounds (checked); volatile byte loads, since device code on host threads may store.
            Ok((0..len).map(|i| unsafe { b.host_ptr().add(off + i).read_volatile() }).collect())
        }
        DataBuf::Gpu(b) => {
            let mut v = vec![0u8; len];
            b.copy_to_host(off, &mut v)?;
            Ok(v)
        }
    }
}

fn check_range(buf_len: usize, off: usize, len: usize) -> Result<()> {
    match off.checked_add(len) {
        Some(end) if end <= buf_len => Ok(()),
        _ => Err(Error::InvalidArgument(format!("{len} bytes at {off} do not fit in a buffer of {buf_len}"))),
    }
}

/// The device-visible address of byte `off` of `buf`.
pub(super) fn addr_of(buf: &DataBuf, off: usize) -> u64 {
    buf.loc().addr + off as u64
}
