//! One-rank checks (a world of one, every connection a loopback QP); two ranks are in
//! `host/tests/channel_host.rs`.

use std::time::Duration;

use gdaki_device::qp::Qp as DevQp;
use gdaki_shared::handle::QpHandle;

use super::*;
use crate::bootstrap::{Bootstrap, Launch, Secret};
use crate::exec::{DataBuf, Executor};
use crate::nic::emu::{QpState, WireConfig};
use crate::Error;

const TIMEOUT_NS: u64 = 10_000_000_000;

fn solo() -> Communicator {
    let launch = Launch::solo(Secret::random().unwrap());
    let boot = Bootstrap::connect(&launch, Duration::from_secs(5)).unwrap();
    Communicator::new(boot, Executor::Cpu, WireConfig::loopback()).unwrap()
}

fn host_ptr(m: &RegisteredMemory) -> *mut u8 {
    match m.buffer() {
        Some(DataBuf::Host(b)) => b.host_ptr(),
        other => panic!("expected a host buffer, got {other:?}"),
    }
}

#[test]
fn channel_types_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<Communicator>();
    both::<Connection>();
    both::<Semaphore>();
    both::<RegisteredMemory>();
    both::<PortChannel>();
}

#[test]
fn channel_loopback_put_and_signal_outlive_the_communicator() {
    let comm = solo();
    let src = comm.register_buffer(comm.executor().alloc_data(4096).unwrap()).unwrap();
    let dst_mem = comm.register_buffer(comm.executor().alloc_data(4096).unwrap()).unwrap();
    comm.send_memory(&dst_mem, 0, 0).unwrap();
    let dst = comm.recv_memory(0, 0).unwrap();
    assert_eq!((dst.rank(), dst.remote().addr, dst.len()), (0, dst_mem.loc().addr, 4096));
    let conn = comm.connect(&EndpointConfig::default(), 0, 1).unwrap();
    assert_eq!(conn.qp().state(), QpState::Rts);
    assert_eq!(conn.remote_endpoint().qpn(), conn.qpn(), "a loopback QP is its own peer");
    let sem = comm.semaphore(&conn, 0, 2).unwrap();
    assert_eq!(sem.remote_inbound().addr, sem.inbound_addr(), "a loopback semaphore signals itself");
    let chan = PortChannel::new(&conn, &sem, dst, &src).unwrap();
    let h = chan.device_handle();
    drop(comm);

    // SAFETY: the buffer is 4096 bytes of host memory owned by `src`; no device code runs yet.
    unsafe { std::ptr::write_bytes(host_ptr(&src), 0xa5, 4096) };
    let before = conn.qp_handle().unwrap();
    assert_eq!((before.sq.pi, before.cq.cons_index), (0, 0));
    {
        // SAFETY: `h.qp` is the connection's handle in host memory, alive while `chan` is; this thread alone
        // posts to the QP.
        let mut qp = unsafe { DevQp::new(&mut *(h.qp as *mut QpHandle), TIMEOUT_NS) };
        qp.put(&h.dst, 100, &h.src, 100, 200).unwrap();
        let _ = qp.signal(&h.remote_sem, 0, &h.scratch, 0).unwrap();
        let _ = qp.signal(&h.remote_sem, 0, &h.scratch, 0).unwrap();
        qp.flush().unwrap();
        // SAFETY: `local_sem` is the semaphore's inbound word, 8-aligned, alive while `chan` is.
        assert_eq!(unsafe { qp.wait_semaphore(h.local_sem as *const u64, 2) }.unwrap(), 2);
    }
    assert_eq!(sem.inbound().unwrap(), 2);
    assert_eq!(conn.scratch_value().unwrap(), 1, "the second fetch-add returned 1");
    assert_eq!(sem.expected().unwrap(), 0, "nobody waited through the channel");
    let got = dst_mem.buffer().unwrap().to_vec().unwrap();
    assert!(got[..100].iter().chain(&got[300..]).all(|&b| b == 0));
    assert!(got[100..300].iter().all(|&b| b == 0xa5));
    let after = conn.qp_handle().unwrap();
    let sq = after.sq;
    assert!(sq.pi >= 3 && sq.ci == sq.pi, "{after:?}");
    assert_eq!((sq.ready, sq.rung), (sq.pi, sq.pi), "Exclusive use publishes and rings what it posts: {sq:?}");
}

#[test]
fn channel_peer_out_of_range_and_foreign_objects() {
    let comm = solo();
    let other = solo();
    let msg = |e: Error| match e {
        Error::InvalidArgument(m) => m,
        e => panic!("expected InvalidArgument, got {e:?}"),
    };
    let m = msg(comm.connect(&EndpointConfig::default(), 1, 0).unwrap_err());
    assert!(m.contains("peer rank 1 is out of range for world size 1"), "{m}");
    let m = msg(comm.recv_memory(3, 0).unwrap_err());
    assert!(m.contains("recv_memory from rank 3") && m.contains("out of range"), "{m}");
    let mem = other.register_buffer(other.executor().alloc_data(64).unwrap()).unwrap();
    let m = msg(comm.send_memory(&mem, 0, 0).unwrap_err());
    assert!(m.contains("another communicator"), "{m}");
    let conn = other.connect(&EndpointConfig::default(), 0, 0).unwrap();
    let m = msg(comm.semaphore(&conn, 0, 0).unwrap_err());
    assert!(m.contains("another communicator"), "{m}");
    let own = comm.connect(&EndpointConfig::default(), 0, 0).unwrap();
    let sem = comm.semaphore(&own, 0, 0).unwrap();
    other.send_memory(&mem, 0, 5).unwrap();
    let dst = other.recv_memory(0, 5).unwrap();
    let m = msg(PortChannel::new(&own, &sem, dst, &mem).unwrap_err());
    assert!(m.contains("source memory was registered by another communicator"), "{m}");
    let chan =
        PortChannel::new(&own, &sem, dst, &comm.register_buffer(comm.executor().alloc_data(8).unwrap()).unwrap())
            .unwrap();
    assert!(msg(chan.clone().with_max_wqe_bytes(0).unwrap_err()).contains("max_wqe_bytes 0"));
    assert!(msg(chan.clone().with_max_wqe_bytes((1 << 31) + 1).unwrap_err()).contains("max_msg_sz"));
    assert!(msg(chan.clone().with_timeout(Duration::ZERO).unwrap_err()).contains("timeout"));
    let h =
        chan.with_max_wqe_bytes(4096).unwrap().with_timeout(Duration::from_millis(3)).unwrap().with_blue_flame_limit(0);
    let d = h.device_handle();
    assert_eq!((d.max_wqe_bytes, d.timeout_ns, d.blue_flame_limit), (4096, 3_000_000, 0));
}
