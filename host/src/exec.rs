//! Executors: where device code runs. `gpu` launches PTX kernels through the CUDA driver; `cpu` runs the same
//! kernels' host builds on host threads ([`crate::launch`]). Each provides the memory the emulated NIC needs.

use std::sync::Arc;

use gdaki_device::launch::{DevPtr, DeviceRepr};

use crate::cuda::{DeviceBuffer, Gpu};
use crate::mem::{GpuCopier, HostQueueMemory, MappedBuf, MemKind, MemLoc, QueueMemory};
use crate::{Error, Result};

/// Which executor to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExecutorKind {
    /// Host threads.
    Cpu,
    /// A CUDA GPU.
    Gpu,
}

impl std::str::FromStr for ExecutorKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "gpu" => Ok(Self::Gpu),
            _ => Err(Error::InvalidArgument(format!("executor must be cpu or gpu, not {s:?}"))),
        }
    }
}

/// The GPU that a rank with local rank `local_rank` takes when nothing names one: GPU `local_rank % n` of the
/// `n` GPUs this process sees (`CUDA_VISIBLE_DEVICES` applies), so that each rank of a host with as many GPUs
/// as ranks has its own, the choice NCCL's and NVSHMEM's users make with `cudaSetDevice`; 0 when the process
/// sees no GPU (opening it then fails with the reason).
pub fn default_gpu(local_rank: u32) -> usize {
    spread(local_rank, Gpu::count().unwrap_or(0))
}

/// `local_rank` round robin over `count` GPUs (0 when there are none).
fn spread(local_rank: u32, count: usize) -> usize {
    local_rank as usize % count.max(1)
}

/// The name [`FromStr`](std::str::FromStr) takes: `cpu` or `gpu` (as the programs' `--executor` flag).
impl std::fmt::Display for ExecutorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Cpu => "cpu",
            Self::Gpu => "gpu",
        })
    }
}

/// An opened executor.
#[derive(Clone, Debug)]
pub enum Executor {
    /// Host threads; queue and data memory are plain host memory.
    Cpu,
    /// One GPU; data buffers are GPU memory, queue memory is where the emulated NIC's placement puts it.
    Gpu(Arc<Gpu>),
}

impl Executor {
    /// Opens `kind` on GPU 0: [`Executor::open_on`] with ordinal 0.
    ///
    /// # Errors
    /// As [`Executor::open_on`].
    pub fn open(kind: Option<ExecutorKind>) -> Result<(Self, Option<String>)> {
        Self::open_on(kind, 0)
    }

    /// Opens `kind`, or, when `None`, the GPU if there is one and else the CPU; a GPU executor runs on GPU
    /// `gpu` (0-based, in `cuDeviceGet` order; ignored by the CPU). The second value is a one-line notice to
    /// print when the automatic choice fell back to the CPU.
    ///
    /// # Errors
    /// [`Error::Unavailable`] (one line) when `Some(Gpu)` was asked for and there is no usable GPU `gpu`.
    pub fn open_on(kind: Option<ExecutorKind>, gpu: usize) -> Result<(Self, Option<String>)> {
        match kind {
            Some(ExecutorKind::Cpu) => Ok((Self::Cpu, None)),
            Some(ExecutorKind::Gpu) => Ok((Self::Gpu(Gpu::open(gpu)?), None)),
            None => match Gpu::open(gpu) {
                Ok(gpu) => Ok((Self::Gpu(gpu), None)),
                Err(Error::Unavailable(why)) => Ok((Self::Cpu, Some(format!("{why}; using the cpu executor")))),
                Err(e) => Err(e),
            },
        }
    }

    /// The executor's kind.
    pub fn kind(&self) -> ExecutorKind {
        match self {
            Self::Cpu => ExecutorKind::Cpu,
            Self::Gpu(_) => ExecutorKind::Gpu,
        }
    }

    /// Queue memory for NIC queues and for small control words (semaphores, reports): host memory that
    /// device code can reach.
    pub fn queue_memory(&self) -> Arc<dyn QueueMemory> {
        match self {
            Self::Cpu => Arc::new(HostQueueMemory),
            Self::Gpu(g) => g.clone(),
        }
    }

    /// The copier the emulated NIC uses for GPU-memory MRs (`None` on the CPU).
    ///
    /// # Errors
    /// The CUDA driver's error creating its stream.
    pub fn gpu_copier(&self) -> Result<Option<Arc<dyn GpuCopier>>> {
        match self {
            Self::Cpu => Ok(None),
            Self::Gpu(g) => Ok(Some(Arc::new(g.copier()?))),
        }
    }

    /// Allocates a zeroed data buffer of `len` bytes where device code keeps payloads: host memory on the
    /// CPU, GPU memory on the GPU.
    ///
    /// # Errors
    /// Out of memory or the CUDA driver's error.
    pub fn alloc_data(&self, len: usize) -> Result<DataBuf> {
        match self {
            Self::Cpu => Ok(DataBuf::Host(HostQueueMemory.alloc(len)?)),
            Self::Gpu(g) => Ok(DataBuf::Gpu(g.alloc_device(len)?)),
        }
    }

    /// A data buffer holding `value`, for a kernel parameter that points to it (`&T` in the kernel,
    /// [`DataBuf::dev_ptr`] at launch): e.g. a channel's `PortChannelHandle`.
    ///
    /// # Errors
    /// As [`Executor::alloc_data`].
    pub fn upload<T: DeviceRepr>(&self, value: &T) -> Result<DataBuf> {
        let b = self.alloc_data(size_of::<T>())?;
        // SAFETY: `DeviceRepr` promises every byte of `T` is initialized.
        let bytes = unsafe { std::slice::from_raw_parts(value as *const T as *const u8, size_of::<T>()) };
        b.write(0, bytes)?;
        Ok(b)
    }
}

/// A data buffer of either executor.
#[derive(Debug)]
pub enum DataBuf {
    /// Host memory.
    Host(MappedBuf),
    /// GPU memory.
    Gpu(DeviceBuffer),
}

impl DataBuf {
    /// Where it lives, as the NIC addresses it.
    pub fn loc(&self) -> MemLoc {
        match self {
            Self::Host(b) => MemLoc { kind: MemKind::Host, addr: b.device_addr() },
            Self::Gpu(b) => b.loc(),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Host(b) => b.len(),
            Self::Gpu(b) => b.len(),
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes `bytes` at byte `off` (host memory: a copy; GPU memory: a synchronous copy). Only while no
    /// device code uses those bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the buffer; the CUDA driver's error.
    pub fn write(&self, off: usize, bytes: &[u8]) -> Result<()> {
        match self {
            Self::Host(b) => {
                host_range(off, bytes.len(), b.len())?;
                // SAFETY: in bounds (checked); nobody else writes these bytes now (the caller's contract).
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.host_ptr().add(off), bytes.len()) };
                Ok(())
            }
            Self::Gpu(b) => b.copy_from_host(off, bytes),
        }
    }

    /// Fills `dst` with the bytes from byte `off` on (host memory: a copy; GPU memory: a synchronous copy):
    /// [`DataBuf::write`]'s reverse, which checks one range of a large buffer without copying all of it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the buffer; the CUDA driver's error.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<()> {
        match self {
            Self::Host(b) => {
                host_range(off, dst.len(), b.len())?;
                // SAFETY: in bounds (checked); `dst` is a distinct, exclusively borrowed slice. Readers racing
                // with the NIC see some bytes.
                unsafe { std::ptr::copy_nonoverlapping(b.host_ptr().add(off), dst.as_mut_ptr(), dst.len()) };
                Ok(())
            }
            Self::Gpu(b) => b.copy_to_host(off, dst),
        }
    }

    /// The buffer's start as a kernel parameter pointing to `T`s (see [`Executor::upload`]).
    pub fn dev_ptr<T>(&self) -> DevPtr<T> {
        DevPtr::new(self.loc().addr)
    }

    /// Copies its bytes out (for checks in tests).
    ///
    /// # Errors
    /// The CUDA driver's error.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut out = vec![0; self.len()];
        self.read(0, &mut out)?;
        Ok(out)
    }
}

/// `Ok` when `len` bytes at byte `off` fit in a host buffer of `total` bytes.
fn host_range(off: usize, len: usize, total: usize) -> Result<()> {
    if off.checked_add(len).is_none_or(|end| end > total) {
        return Err(Error::InvalidArgument(format!("{len} bytes at {off} do not fit in a buffer of {total}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn an_array_of_handles_uploads_as_its_bytes() {
        use gdaki_shared::channel::PortChannelHandle;
        let exec = super::Executor::Cpu;
        let hs: [PortChannelHandle; 3] =
            core::array::from_fn(|i| PortChannelHandle { channel_id: 7 + i as u32, ..Default::default() });
        let buf = exec.upload(&hs).unwrap();
        assert_eq!(buf.to_vec().unwrap(), bytemuck::bytes_of(&hs));
    }

    /// `read` returns exactly the bytes `write` put at that offset and refuses a range past the end (an
    /// offset plus length that wraps included).
    #[test]
    fn read_returns_a_written_range_and_refuses_one_outside() {
        let exec = super::Executor::Cpu;
        let buf = exec.alloc_data(4096).unwrap();
        let payload: Vec<u8> = (0..1000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        buf.write(3000, &payload[..1000]).unwrap();
        let mut got = vec![0u8; 1000];
        buf.read(3000, &mut got).unwrap();
        assert_eq!(got, payload);
        let mut one = [0u8; 1];
        buf.read(3999, &mut one).unwrap();
        assert_eq!(one[0], payload[999]);
        assert_eq!(&buf.to_vec().unwrap()[3000..4000], &payload[..]);
        for (off, len) in [(3097, 1000), (4096, 1), (usize::MAX, 2)] {
            let e = buf.read(off, &mut vec![0u8; len]).unwrap_err();
            assert!(matches!(e, crate::Error::InvalidArgument(_)), "{off}+{len}: {e}");
        }
    }

    #[test]
    fn ranks_spread_over_the_gpus() {
        assert_eq!((0..4).map(|r| spread(r, 8)).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!((0..4).map(|r| spread(r, 2)).collect::<Vec<_>>(), [0, 1, 0, 1]);
        assert_eq!(spread(3, 0), 0);
    }
}
