//! The `result` level over rdma-core: how a failed call becomes an [`Error::Verbs`] naming the call and its
//! errno, and the device context every other object hangs from.

use std::ffi::CStr;

use gdaki_mlx5_sys as sys;

use crate::{Error, Result};

/// The calling thread's `errno`, for a call that just failed.
pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `Ok` for a verbs return code of 0. Verbs calls return either -1 with `errno` set or a positive errno
/// (`ibv_modify_qp(3)`: "returns 0 on success, or the value of errno on failure"); both are reported.
pub(super) fn check(ret: i32, call: impl Into<String>) -> Result<()> {
    match ret {
        0 => Ok(()),
        -1 => Err(Error::Verbs { call: call.into(), errno: errno() }),
        e => Err(Error::Verbs { call: call.into(), errno: e.abs() }),
    }
}

/// `Ok(p)` for a non-null pointer from a verbs constructor, else the errno it set.
pub(super) fn nonnull<T>(p: *mut T, call: impl Into<String>) -> Result<*mut T> {
    if p.is_null() {
        Err(Error::Verbs { call: call.into(), errno: errno() })
    } else {
        Ok(p)
    }
}

/// An open device (`ibv_open_device`); closed on drop. The parent of PDs, CQs, QPs and MRs (they hold an
/// `Arc` of the NIC that owns it).
#[derive(Debug)]
pub(super) struct Context {
    pub(super) ptr: *mut sys::ibv_context,
    /// The device's name (`ibv_get_device_name`), e.g. `mlx5_0`.
    pub(super) name: String,
    /// Opened with `mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)`: DevX commands may be sent through it.
    pub(super) devx: bool,
}

// SAFETY: verbs objects may be used from any thread (rdma-core's providers lock internally); the pointer is
// only freed by `Drop`, once.
unsafe impl Send for Context {}
// SAFETY: as above; the calls made through a shared `Context` are thread-safe verbs calls.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device named `name`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] (one line) when the host has no RDMA device or none of that name (the line lists
    /// those there are); [`Error::Verbs`] when `ibv_open_device` fails.
    pub(super) fn open(name: &str) -> Result<Self> {
        Ok(Self::open_as(name, false)?.0)
    }

    /// Opens the device named `name`, with `devx`: first with `mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)`,
    /// and when that fails with `ibv_open_device`; the second value is then the DevX attempt's error text
    /// (`None` when DevX was not asked for or worked).
    ///
    /// # Errors
    /// As [`Context::open`].
    pub(super) fn open_as(name: &str, devx: bool) -> Result<(Self, Option<String>)> {
        let list = DeviceList::get()?;
        let dev = list.iter().find(|(_, n)| n == name).map(|(d, _)| d).ok_or_else(|| {
            let names: Vec<String> = list.iter().map(|(_, n)| n).collect();
            Error::Unavailable(format!("no RDMA device named {name} (this host has: {})", names.join(", ")))
        })?;
        let mut devx_error = None;
        if devx {
            let mut attr = sys::mlx5dv_context_attr { flags: sys::MLX5DV_CONTEXT_FLAGS_DEVX, comp_mask: 0 };
            // SAFETY: `dev` is an entry of the live device list; `attr` is filled (no optional fields).
            let p = unsafe { sys::mlx5dv_open_device(dev, &mut attr) };
            match nonnull(p, format!("mlx5dv_open_device({name}, DEVX)")) {
                Ok(ptr) => return Ok((Self { ptr, name: name.to_string(), devx: true }, None)),
                Err(e) => devx_error = Some(e.to_string()),
            }
        }
        // SAFETY: `dev` is an entry of the live device list.
        let ptr = nonnull(unsafe { sys::ibv_open_device(dev) }, format!("ibv_open_device({name})"))?;
        Ok((Self { ptr, name: name.to_string(), devx: false }, devx_error))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `ibv_open_device`; every child holds an `Arc` of the owner, so none is left.
        let ret = unsafe { sys::ibv_close_device(self.ptr) };
        if let Err(e) = check(ret, "ibv_close_device") {
            // The NIC itself is going: nobody is left to take the error, so it is only logged.
            tracing::warn!("dropping an mlx5 device context: {e}");
        }
    }
}

/// The host's RDMA devices (`ibv_get_device_list`), freed on drop.
pub(super) struct DeviceList {
    ptr: *mut *mut sys::ibv_device,
    len: usize,
}

/// What the one line says when there is no RDMA device at all.
pub(super) const NO_DEVICES: &str = "no RDMA devices found: ibv_get_device_list found none (no ConnectX NIC here, \
     or the kernel modules mlx5_core, mlx5_ib and ib_uverbs are not loaded); --nic emu runs on the emulated NIC";

impl DeviceList {
    /// The list; never empty.
    ///
    /// # Errors
    /// [`Error::Unavailable`] with [`NO_DEVICES`] (and the errno when the call itself failed, e.g. ENOSYS
    /// without the kernel's verbs support) when there is no device.
    pub(super) fn get() -> Result<Self> {
        let mut n = 0i32;
        // SAFETY: `n` is a valid out-parameter; the list is freed by `Drop`.
        let ptr = unsafe { sys::ibv_get_device_list(&mut n) };
        if ptr.is_null() {
            let e = std::io::Error::from_raw_os_error(errno());
            return Err(Error::Unavailable(format!("{NO_DEVICES} (ibv_get_device_list: {e})")));
        }
        let list = Self { ptr, len: usize::try_from(n).unwrap_or(0) };
        if list.len == 0 {
            return Err(Error::Unavailable(NO_DEVICES.into()));
        }
        Ok(list)
    }

    /// The devices and their names, in the list's order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (*mut sys::ibv_device, String)> + '_ {
        (0..self.len).map(|i| {
            // SAFETY: `i < len` entries of the list are valid device pointers.
            let dev = unsafe { *self.ptr.add(i) };
            // SAFETY: `dev` is a live device; the name is a NUL-terminated string owned by it.
            let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) }.to_string_lossy().into_owned();
            (dev, name)
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `ibv_get_device_list` and is freed once; opened contexts stay valid.
        unsafe { sys::ibv_free_device_list(self.ptr) };
    }
}
