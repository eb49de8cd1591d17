//! Host side of the collectives' tests: one rank's [`Collectives`] and launches of the
//! `gdaki_testkit_kernels` collective kernels (thread 0 of one block makes the call) on either executor.

use std::sync::Arc;
use std::time::Duration;

use gdaki_device::coll::Broadcast;
use gdaki_device::launch::DevPtr;
use gdaki_shared::coll::CollHandle;
use gdaki_testkit_kernels::entries;

use gdaki::channel::Communicator;
use gdaki::coll::{CollConfig, Collectives};
use gdaki::exec::DataBuf;
use gdaki::launch::{Kernel, LaunchConfig, Module};
use gdaki::Result;

/// One rank's collectives and their kernels, loaded.
pub struct CollRank {
    /// Field order is drop order: the uploaded handle before what it names.
    handle: DataBuf,
    coll: Collectives,
    comm: Arc<Communicator>,
    broadcast: Kernel<(DevPtr<CollHandle>, u32, u32, u64, u64, u64)>,
    launch_timeout: Duration,
}

impl CollRank {
    /// Sets up `comm`'s collectives with `cfg` (every rank at once) and loads the kernels.
    ///
    /// # Errors
    /// As [`Collectives::new`]; module load and upload errors.
    pub fn new(comm: Arc<Communicator>, cfg: &CollConfig) -> Result<Self> {
        let coll = Collectives::new(&comm, cfg)?;
        let exec = comm.executor();
        let handle = exec.upload(coll.handle())?;
        // Loaded before any rank launches: loading a module waits for running kernels.
        let broadcast = Module::load(exec, crate::ptx::PTX)?.kernel(&entries::GDAKI_COLL_BROADCAST)?;
        let launch_timeout = cfg.timeout.saturating_mul(4).saturating_add(Duration::from_secs(10));
        Ok(Self { handle, coll, comm, broadcast, launch_timeout })
    }

    /// The collectives (buffer, acknowledgment counter).
    pub fn collectives(&self) -> &Collectives {
        &self.coll
    }

    /// The communicator.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// Waits at the bootstrap barrier with every rank, so that all kernels start together (none waits out
    /// its bound for a peer still setting up). A rank that sits a call out passes it too.
    ///
    /// # Errors
    /// Bootstrap errors.
    pub fn barrier(&self) -> Result<()> {
        self.comm.bootstrap().barrier()
    }

    /// [`CollRank::barrier`], then one broadcast `b` on this rank (every rank calls it with the same `b`).
    ///
    /// # Errors
    /// [`gdaki::Error::Kernel`] with what device code returned; launch and bootstrap errors.
    pub fn broadcast(&self, b: &Broadcast) -> Result<()> {
        self.barrier()?;
        let args = (self.handle.dev_ptr(), b.algorithm as u32, b.root, b.offset, b.bytes, b.chunk);
        // SAFETY: the uploaded handle names this rank's live collectives (owned by `self`); one thread of
        // the launch uses their channels; the launch is waited for here.
        unsafe { self.broadcast.launch(&LaunchConfig::linear(1, 1), args, self.launch_timeout) }
    }
}
