//! Failures met in `Drop`, which cannot return them. Every backend (the GPU's objects, the emulated NIC, the
//! mlx5 NIC) reports them the same way: a `tracing` warning when it happens, and the first one kept as an
//! [`Error`] value for the owner's `take_drop_error` (`Gpu`, `EmuNic`, `Mlx5Nic`, `Nic`), so that a program or
//! a test can check at the end that nothing failed silently.

use std::sync::Mutex;

use crate::Error;

/// The first failure of the drops of one owner's objects.
#[derive(Debug, Default)]
pub(crate) struct DropErrors {
    first: Mutex<Option<Error>>,
}

impl DropErrors {
    /// Records `e`, met while dropping `what` (e.g. `"QP 0x1c"`): logged now, kept if it is the first.
    pub(crate) fn record(&self, what: &str, e: Error) {
        tracing::warn!("dropping {what}: {e}");
        // A panic while the lock was held leaves a valid slot (one assignment).
        self.first.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
    }

    /// Takes the first failure recorded since the last call.
    pub(crate) fn take(&self) -> Option<Error> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_failure_until_taken() {
        let d = DropErrors::default();
        assert!(d.take().is_none());
        d.record("a QP", Error::InvalidArgument("first".into()));
        d.record("a CQ", Error::InvalidArgument("second".into()));
        assert!(matches!(d.take(), Some(Error::InvalidArgument(m)) if m == "first"));
        assert!(d.take().is_none(), "taken once");
        d.record("an MR", Error::InvalidArgument("third".into()));
        assert!(matches!(d.take(), Some(Error::InvalidArgument(m)) if m == "third"));
    }
}
