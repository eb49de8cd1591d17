//! What the objects of one communicator share.

use super::departed::Departed;
use crate::exec::Executor;
use crate::nic::{Nic, Pd};

/// What every object a communicator makes shares: the NIC, its PD and the executor. Held by `Arc` by the
/// communicator and by each connection, registered memory and semaphore, so that the NIC and PD outlive
/// them whatever order they are dropped in.
#[derive(Debug)]
pub(super) struct Resources {
    pub(super) pd: Pd,
    pub(super) nic: Nic,
    pub(super) exec: Executor,
    pub(super) rank: u32,
    pub(super) world_size: u32,
    /// The words that tell device code a peer is gone.
    pub(super) departed: Departed,
}
