//! The hardware suite of the real mlx5 backend: ping-pong, PortChannel in every mode, and fault cases (a bad
//! rkey seen by device code's `flush`; host-side refusals),
//! on a ConnectX NIC. Every test is `#[ignore]`d (no machine of this project has a NIC) and skips with a
//! message when the host has no RDMA device. On a host with one (docs/mlx5.md):
//!
//! ```sh
//! cargo test -p gdaki-testkit --features mlx5 --test mlx5_hw -- --ignored --test-threads 1
//! ```
//!
//! `GDAKI_MLX5_NIC` picks the NIC (`DEVICE[:PORT[:GID_INDEX]]`, default `mlx5_0`), `GDAKI_MLX5_EXECUTOR` the
//! executor (`cpu` or `gpu`; default: the GPU if there is one). Both ranks of each test run in this process,
//! their QPs on the same port, connected to each other through the NIC (loopback through the HCA). With the
//! `gpu` executor the NIC takes the DevX path where it can (`GDAKI_MLX5_QUEUES` overrides; docs/mlx5.md);
//! `mlx5_devx_path_with_rings_in_gpu_memory` requires it.
#![cfg(feature = "mlx5")]

use std::sync::Arc;
use std::time::Duration;

#[path = "../../host/tests/ranks/mod.rs"]
mod ranks;

use gdaki::channel::Communicator;
use gdaki::exec::{Executor, ExecutorKind};
use gdaki::mem::{MemKind, MemLoc};
use gdaki::nic::emu::{QpState, WireConfig};
use gdaki::nic::mlx5::{self, LinkLayer};
use gdaki::nic::{Access, Endpoint, Nic, NicSpec};
use gdaki::Error;
use gdaki_testkit::pingpong::{PingPong, RunConfig};
use gdaki_testkit::porttest::{op, Mode, PortTest, RunConfig as PortRun};

const TIMEOUT: Duration = Duration::from_secs(10);

/// The NIC under test, or `None` (after saying why) when the host has none: the test then passes as skipped.
fn nic_spec() -> Option<NicSpec> {
    let text = std::env::var("GDAKI_MLX5_NIC").unwrap_or_else(|_| "mlx5_0".into());
    let spec: NicSpec = text.parse().unwrap_or_else(|e| panic!("GDAKI_MLX5_NIC: {e}"));
    match Nic::open(&spec, &Executor::Cpu, None) {
        Ok(_) => Some(spec),
        Err(Error::Unavailable(why)) => {
            eprintln!("skipped: {why}");
            None
        }
        Err(e) => panic!("opening {spec}: {e}"),
    }
}

fn executor() -> Executor {
    let kind = match std::env::var("GDAKI_MLX5_EXECUTOR").as_deref() {
        Ok("cpu") => Some(ExecutorKind::Cpu),
        Ok("gpu") => Some(ExecutorKind::Gpu),
        _ => None,
    };
    let (exec, note) = Executor::open(kind).expect("executor");
    if let Some(n) = note {
        eprintln!("note: {n}");
    }
    exec
}

#[test]
#[ignore = "needs a ConnectX NIC (docs/mlx5.md)"]
fn mlx5_devices_have_an_active_port_and_a_gid() {
    let Some(NicSpec::Mlx5(spec)) = nic_spec() else { return };
    let devices = mlx5::list().expect("list");
    let d = devices.iter().find(|d| d.name == spec.device).expect("the device is listed");
    eprint!("{d}");
    assert!(d.mlx5, "driven by the mlx5 provider");
    assert!(d.max_qp_wr >= 16 && d.max_cqe >= 16, "limits: {d:?}");
    let p = d.ports.iter().find(|p| p.num == spec.port).expect("the port is listed");
    assert_eq!(p.state, mlx5::PortState::Active);
    let link = p.link.expect("known link layer");
    let g = mlx5::gid::select(&p.gids, link, spec.gid_index).expect("a usable GID");
    if link == LinkLayer::InfiniBand {
        assert_ne!(p.lid, 0, "an active InfiniBand port has a LID");
    } else {
        assert_eq!(g.kind, mlx5::GidType::RoceV2);
    }
}

/// Ping-pong (RDMA WRITE + fetch-add each way), every payload checked, at a small, a middle and a large size.
#[test]
#[ignore = "needs a ConnectX NIC (docs/mlx5.md)"]
fn mlx5_pingpong_checks_every_payload() {
    let Some(spec) = nic_spec() else { return };
    let mut pp = PingPong::new_on(&spec, executor(), 1 << 20, 220).expect("set up");
    for (i, size) in [8usize, 4096, 1 << 20].into_iter().enumerate() {
        let cfg =
            RunConfig { size, iters: 200, warmup: 20, seed: 0x5eed + i as u64, timeout: TIMEOUT, blueflame: false };
        let r = pp.run(&cfg).unwrap_or_else(|e| panic!("{size} bytes: {e}"));
        assert_eq!(r.checked, 2 * 220, "{size} bytes: both ranks check every payload");
        assert_eq!(r.round_trip_ns.len(), 200);
    }
}

/// Runs `f(rank, communicator)` on two ranks of this process, both on the NIC under test.
fn two_ranks<T: Send>(spec: &NicSpec, f: impl Fn(u32, Communicator) -> T + Sync) -> Vec<T> {
    ranks::two_ranks(
        |boot| Communicator::with_nic(boot, executor(), spec, WireConfig::loopback()).expect("communicator"),
        |rank, comm, _| f(rank, comm),
    )
}

/// MSCCL++'s one-to-one PortChannel tests, every operation in Exclusive, Block and Device sharing.
#[test]
#[ignore = "needs a ConnectX NIC (docs/mlx5.md)"]
fn mlx5_port_channel_every_op_every_mode() {
    let Some(spec) = nic_spec() else { return };
    let cases = [
        (op::PINGPONG, 1, 4096, 50),
        (op::BW, 1, 64 << 10, 20),
        (op::BW, 4, 4096, 20),
        (op::BIBW, 1, 1024, 20),
        (op::FLUSH_STRESS, 4, 1024, 30),
        (op::SAME_CHANNEL_FLUSH, 1, 1024, 30),
    ];
    for mode in Mode::ALL {
        for (opc, nch, size, iters) in cases {
            let results = two_ranks(&spec, |rank, comm| {
                let team = if comm.executor().kind() == ExecutorKind::Gpu { 128 } else { 4 };
                let mut t = PortTest::new(Arc::new(comm), mode, nch, size, iters as usize).expect("set up");
                let cfg = PortRun { op: opc, size, iters, team, seed: 0x5eed ^ opc as u64, timeout: TIMEOUT };
                t.run(&cfg).unwrap_or_else(|e| panic!("{} op {opc} x{nch} rank {rank}: {e}", mode.name()))
            });
            let checked: u64 = results.iter().map(|r| r.checked).sum();
            assert!(checked > 0, "{} op {opc}: payloads checked", mode.name());
        }
    }
}

/// The benchmark suite (`gdaki-perf all --quick`'s rows, through the same `porttest::bench` code) on the NIC, every
/// test in every mode, every payload checked; the tables themselves come from `gdaki-perf all --nic mlx5_0`
/// (docs/mlx5.md).
#[test]
#[ignore = "needs a ConnectX NIC (docs/mlx5.md)"]
fn mlx5_benchmark_suite_every_test_every_mode() {
    use gdaki_testkit::porttest::bench::{run_test, Plan, Test};
    let Some(spec) = nic_spec() else { return };
    let results = two_ranks(&spec, |rank, comm| {
        let comm = Arc::new(comm);
        let team = if comm.executor().kind() == ExecutorKind::Gpu { 128 } else { 4 };
        let plan =
            Plan { iters: 50, warmup: 5, byte_budget: 16 << 20, team, timeout: TIMEOUT, blue_flame_limit: 512 << 10 };
        let mut checked = 0;
        for mode in Mode::ALL {
            for test in Test::ALL {
                let size = if test.channels() > 1 { 4096 } else { 1024 };
                let rows = run_test(&comm, mode, test, &[size], &plan, |_| {})
                    .unwrap_or_else(|e| panic!("{} {} rank {rank}: {e}", mode.name(), test.name()));
                checked += rows.iter().map(|r| r.checked).sum::<u64>();
            }
        }
        checked
    });
    assert!(results.iter().sum::<u64>() > 0, "payloads checked: {results:?}");
}

/// Device-side faults on the NIC: a put with a wrong rkey completes in error with syndrome 0x13 (remote access
/// error), and the sender's `flush` returns it, in every Device-mode sharing; the receiver, whose signal never
/// comes, fails as well instead of hanging. (Host modes: the proxy keeps its own keys, so an edited device
/// handle does not reach it.)
#[test]
#[ignore = "needs a ConnectX NIC (docs/mlx5.md)"]
fn mlx5_flush_reports_a_bad_rkey_in_every_device_mode() {
    let Some(spec) = nic_spec() else { return };
    for mode in Mode::DEVICE {
        let results = two_ranks(&spec, |rank, comm| {
            let team = mode.fit_team(if comm.executor().kind() == ExecutorKind::Gpu { 128 } else { 4 });
            let mut t = PortTest::new(Arc::new(comm), mode, 1, 1024, 4).expect("set up");
            if rank == 0 {
                t.edit_handles(|_, h| h.dst.rkey = gdaki_shared::Be32::new(h.dst.rkey.get() ^ 0x100)).unwrap();
            }
            let cfg = PortRun {
                op: op::FLUSH_STRESS,
                size: 1024,
                iters: 4,
                team,
                seed: 0xbad,
                timeout: Duration::from_secs(2),
            };
            (t.run(&cfg).is_err(), t.device_error())
        });
        assert!(results[0].0 && results[1].0, "{}: both ranks fail: {results:?}", mode.name());
        assert!(
            matches!(results[0].1, Some(gdaki_device::Error::Cqe(c)) if c.syndrome == 0x13),
            "{}: the sender's flush reported {:?}",
            mode.name(),
            results[0].1
        );
    }
}

/// Faults the host side must report, not hide: a second connect of a QP (ibv_modify_qp refuses RESET→INIT
/// from RTS: EINVAL, named), an endpoint of the other link layer, a GID index that is not in the table, a
/// zero-length MR.
#[test]
#[ignore = "needs a ConnectX NIC (docs/mlx5.md)"]
fn mlx5_host_faults_are_errors_naming_the_call() {
    let Some(spec) = nic_spec() else { return };
    let nic = Nic::open(&spec, &executor(), None).expect("open");
    let pd = nic.alloc_pd().expect("pd");
    let cq = nic.create_cq(64).expect("cq");
    let (a, b) = (nic.create_qp(&pd, &cq, 64).expect("qp a"), nic.create_qp(&pd, &cq, 64).expect("qp b"));
    assert_eq!(a.state(), QpState::Reset);
    a.connect(&b.endpoint()).expect("connect a");
    b.connect(&a.endpoint()).expect("connect b");
    assert_eq!((a.state(), b.state()), (QpState::Rts, QpState::Rts));
    match a.connect(&b.endpoint()) {
        // The verbs path.
        Err(Error::Verbs { call, errno }) => {
            assert!(call.contains("ibv_modify_qp(RESET→INIT)"), "{call}");
            assert_ne!(errno, 0);
        }
        // The DevX path: the firmware refuses RST2INIT of a QP in RTS.
        Err(Error::DevxCmd { opcode, via: Some((call, _)), .. }) => {
            assert_eq!(opcode, gdaki_shared::prm::cmd::opcode::RST2INIT_QP);
            assert_eq!(call, "mlx5dv_devx_obj_modify");
        }
        other => panic!("second connect: {other:?}"),
    }
    let Endpoint::Mlx5(mut other) = b.endpoint() else { panic!("an mlx5 endpoint") };
    other.link = match other.link {
        LinkLayer::InfiniBand => LinkLayer::Ethernet,
        LinkLayer::Ethernet => LinkLayer::InfiniBand,
    };
    let c = nic.create_qp(&pd, &cq, 64).expect("qp c");
    assert!(matches!(c.connect(&Endpoint::Mlx5(other)), Err(Error::InvalidArgument(_))));
    assert_eq!(c.state(), QpState::Reset, "a refused connect changes nothing");
    let mut buf = vec![0u8; 64];
    let loc = MemLoc { kind: MemKind::Host, addr: buf.as_mut_ptr() as u64 };
    // SAFETY: `buf` outlives the (refused) registration.
    assert!(unsafe { nic.reg_mr(&pd, loc, 0, Access::ALL) }.is_err());
    if let NicSpec::Mlx5(mut s) = spec {
        s.gid_index = Some(100_000);
        assert!(matches!(Nic::open(&NicSpec::Mlx5(s), &Executor::Cpu, None), Err(Error::InvalidArgument(_))));
    }
}

/// The DevX path: the NIC opened for the GPU takes it (or the test fails with the probe that failed), the
/// firmware's capabilities read through the DevX transport, CQ and QPs with their rings in GPU memory
/// (placement GPU), RST → RTS through PRM commands, a refused transition reported with the call and the
/// firmware's status, then a ping-pong over NICs on that path, every payload checked.
#[test]
#[ignore = "needs a ConnectX NIC and a GPU (docs/mlx5.md)"]
fn mlx5_devx_path_with_rings_in_gpu_memory() {
    use gdaki::nic::devx;
    use gdaki_shared::handle::Placement;
    use gdaki_shared::prm::cmd::{cmd_hca_cap, opcode};

    let Some(spec) = nic_spec() else { return };
    let NicSpec::Mlx5(m) = &spec else { panic!("an mlx5 spec") };
    let Executor::Gpu(gpu) = executor() else {
        eprintln!("skipped: the DevX path puts the rings in GPU memory and needs the gpu executor");
        return;
    };
    let nic = mlx5::Mlx5Nic::open(m, Some(gpu)).expect("open");
    assert!(
        matches!(nic.queue_path(), mlx5::QueuePath::Devx(_)),
        "{spec} took {}: {}",
        nic.queue_path(),
        nic.queue_path_reason()
    );
    eprintln!("{spec}: {} ({})", nic.queue_path(), nic.queue_path_reason());
    let t = nic.devx().expect("a DevX context");
    let cap = devx::query_hca_cap(&t).expect("QUERY_HCA_CAP");
    assert_eq!(cap.get(cmd_hca_cap::RC), 1);
    assert!(cap.get(cmd_hca_cap::LOG_MAX_QP_SZ) >= 6, "an SQ of 64 WQEBBs fits");

    let pd = nic.alloc_pd().expect("pd");
    let cq = nic.create_cq(64).expect("DevX CQ");
    let h = cq.handle();
    assert_eq!((h.placement, h.ncqe, h.cons_index), (Placement::GPU, 64, 0));
    assert!(h.buf.is_multiple_of(4096) && h.dbrec.is_multiple_of(8) && h.cqn != 0, "{h:?}");
    let (a, b) = (nic.create_qp(&pd, &cq, 64).expect("DevX QP a"), nic.create_qp(&pd, &cq, 64).expect("QP b"));
    for q in [&a, &b] {
        let h = q.handle();
        assert_eq!((h.placement, h.wqe_cnt, h.cq.cqn), (Placement::GPU, 64, cq.cqn()));
        assert!(h.sq_buf.is_multiple_of(4096) && h.bf_reg.is_multiple_of(64) && h.bf_reg != 0, "{h:?}");
    }
    assert_eq!(a.state().expect("QUERY_QP"), QpState::Reset);
    a.connect(&b.endpoint()).expect("connect a");
    b.connect(&a.endpoint()).expect("connect b");
    assert_eq!((a.state().unwrap(), b.state().unwrap()), (QpState::Rts, QpState::Rts));
    match a.connect(&b.endpoint()) {
        Err(Error::DevxCmd { opcode: op, status, via: Some((call, _)), .. }) => {
            assert_eq!((op, call.as_str()), (opcode::RST2INIT_QP, "mlx5dv_devx_obj_modify"));
            assert_ne!(status, 0);
        }
        other => panic!("RST2INIT of a QP in RTS: {other:?}"),
    }
    drop((a, b, cq, pd));
    assert!(nic.take_drop_error().is_none(), "DevX objects, umems and memory freed without error");

    // The whole data path on NICs of the DevX path (the executor is the GPU, so Nic::open chooses it too).
    let mut pp = PingPong::new_on(&spec, executor(), 1 << 16, 120).expect("set up");
    for size in [8usize, 4096, 1 << 16] {
        let cfg = RunConfig { size, iters: 100, warmup: 20, seed: 0xde5, timeout: TIMEOUT, blueflame: false };
        let r = pp.run(&cfg).unwrap_or_else(|e| panic!("{size} bytes over DevX: {e}"));
        assert_eq!(r.checked, 2 * 120, "{size} bytes: both ranks check every payload");
    }
}
