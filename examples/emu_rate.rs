//! How many WQEs per second one emulated-NIC executor thread sustains: device code on a host thread (the `cpu`
//! executor) posts 8-byte RDMA WRITEs or 8-byte fetch-adds back to back on one RC QP, ringing the doorbell
//! every `--batch` WQEs, then flushes; the rate is WQEs over the time to the flush's completion. Paths:
//! `direct` (both QPs on one NIC: its executor is requester and responder) and `wire` (two NICs over loopback
//! TCP, as between processes: the requester's executor builds request packets, the responder's answers).
//!
//! `cargo run --release --example emu_rate -- --wqes 200000`
//!
//! Prints one row per (operation, path) with the median, best and worst of `--reps` runs, and, last,
//! `N passed, M failed` (a run passes when the flush reports no error and the destination holds the last
//! payload, or the semaphore the exact sum).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use gdaki::mem::{MemKind, MemLoc};
use gdaki::nic::emu::{Access, Cq, EmuConfig, EmuNic, Mr, Pd, Qp, WireConfig};
use gdaki_device::qp::Qp as DeviceQp;
use gdaki_device::wqe::{self, Raddr, Sge};
use gdaki_shared::handle::QpHandle;

#[derive(Parser, Debug)]
#[command(about = "WQEs per second one emulated-NIC executor thread sustains (8-byte WRITE, fetch-add)")]
struct Args {
    /// WQEs per run.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    wqes: u64,
    /// WQEs per doorbell.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1024))]
    batch: u64,
    /// Runs per row (the table gives their median, best and worst).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    reps: u32,
}

/// SQ size, WQEBBs: deep enough that the poster rarely waits for room.
const WQE_CNT: u32 = 4096;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Write8,
    FetchAdd,
}

/// One requester QP and its peer, with an 8-byte source, destination/semaphore and result word.
/// Field order is drop order: MRs first, then QPs, CQs, PDs, NICs, buffers.
struct Rig {
    src_mr: Mr,
    dst_mr: Mr,
    res_mr: Mr,
    qp: Qp,
    _peer: Qp,
    _cqs: (Cq, Cq),
    _pds: (Pd, Pd),
    nics: Vec<Arc<EmuNic>>,
    /// Words: [0] source, [8] destination / semaphore, [16] fetch-add result (8-aligned heap memory).
    words: Box<[u64; 4]>,
}

impl Rig {
    fn new(wire: bool) -> gdaki::Result<Self> {
        let cfg = || if wire { EmuConfig::host().with_wire(WireConfig::loopback()) } else { EmuConfig::host() };
        let a = EmuNic::open(cfg())?;
        let b = if wire { EmuNic::open(cfg())? } else { a.clone() };
        let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
        let (ca, cb) = (a.create_cq(WQE_CNT)?, b.create_cq(WQE_CNT)?);
        let qp = a.create_qp(&pa, &ca, WQE_CNT)?;
        let peer = b.create_qp(&pb, &cb, WQE_CNT)?;
        qp.connect(&peer.endpoint())?;
        peer.connect(&qp.endpoint())?;
        let words = Box::new([0u64; 4]);
        let at = |i: usize| MemLoc { kind: MemKind::Host, addr: &words[i] as *const u64 as u64 };
        // SAFETY: `words` is boxed (it does not move) and dropped after the MRs (field order).
        let (src_mr, dst_mr, res_mr) = unsafe {
            (
                a.reg_mr(&pa, at(0), 8, Access::NONE)?,
                b.reg_mr(&pb, at(1), 8, Access::ALL)?,
                a.reg_mr(&pa, at(2), 8, Access::LOCAL_WRITE)?,
            )
        };
        let nics = if wire { vec![a, b] } else { vec![a] };
        Ok(Self { src_mr, dst_mr, res_mr, qp, _peer: peer, _cqs: (ca, cb), _pds: (pa, pb), nics, words })
    }

    fn word(&self, i: usize) -> u64 {
        // SAFETY: an aligned word of `words`; the NIC is quiescent after the flush.
        unsafe { std::ptr::read_volatile(&self.words[i]) }
    }

    fn set_word(&mut self, i: usize, v: u64) {
        // SAFETY: as above; written before any WQE that reads it is posted.
        unsafe { std::ptr::write_volatile(&mut self.words[i], v) }
    }
}

/// Posts `n` WQEs of `op`, a doorbell every `batch`, then flushes. Returns the elapsed time.
fn run(rig: &mut Rig, h: &mut QpHandle, op: Op, n: u64, batch: u64) -> Result<Duration, String> {
    let src = Sge::new(rig.src_mr.loc().addr, 8, rig.src_mr.handle().lkey).map_err(|e| format!("SGE: {e}"))?;
    let res = Sge::new(rig.res_mr.loc().addr, 8, rig.res_mr.handle().lkey).map_err(|e| format!("SGE: {e}"))?;
    let dst = Raddr { addr: rig.dst_mr.loc().addr, rkey: rig.dst_mr.remote().rkey };
    // SAFETY: `h` is this rig's QP handle, used by this thread only.
    let mut qp = unsafe { DeviceQp::new(h, 10_000_000_000) };
    let t = Instant::now();
    for i in 0..n {
        let posted = match op {
            Op::Write8 => qp.post(false, wqe::rdma_write(dst, src)),
            Op::FetchAdd => wqe::atomic_fetch_add(dst, res, 1).and_then(|w| qp.post(false, w)),
        };
        // Unsignaled: the flush below covers them.
        let _ticket = posted.map_err(|e| format!("post {i}: {e}"))?;
        if (i + 1) % batch == 0 {
            qp.ring_db();
        }
    }
    qp.flush().map_err(|e| format!("flush: {e}"))?;
    Ok(t.elapsed())
}

fn main() -> ExitCode {
    let args = Args::parse();
    gdaki_examples::apply_queues(None);
    gdaki_examples::outln!(
        "gdaki emu_rate: one executor thread per NIC, cpu executor ({} host threads), {} WQEs per run, doorbell every {}, {} runs per row",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        args.wqes,
        args.batch,
        args.reps
    );
    gdaki_examples::outln!(
        "{:<10} {:<7} {:>10} {:>12} {:>12} {:>12} {:>12}",
        "op",
        "path",
        "WQEs",
        "Mwqe/s med",
        "ns/WQE med",
        "ns/WQE best",
        "ns/WQE worst"
    );
    let (mut passed, mut failed) = (0u64, 0u64);
    for op in [Op::Write8, Op::FetchAdd] {
        for wire in [false, true] {
            let path = if wire { "wire" } else { "direct" };
            let mut rig = match Rig::new(wire) {
                Ok(r) => r,
                Err(e) => {
                    gdaki_examples::eprintln_line!("error: {op:?} {path}: {e}");
                    failed += 1;
                    continue;
                }
            };
            let mut h = rig.qp.handle();
            let mut ns = Vec::new();
            for rep in 0..args.reps {
                let payload = 0x5eed_0000_0000 + rep as u64;
                rig.set_word(0, payload);
                rig.set_word(1, 0);
                let verdict = run(&mut rig, &mut h, op, args.wqes, args.batch).and_then(|t| {
                    let want = if op == Op::Write8 { payload } else { args.wqes };
                    let got = rig.word(1);
                    (got == want).then_some(t).ok_or(format!("destination holds {got:#x}, expected {want:#x}"))
                });
                match verdict {
                    Ok(t) => {
                        passed += 1;
                        ns.push(t.as_nanos() as f64 / args.wqes as f64);
                    }
                    Err(e) => {
                        gdaki_examples::eprintln_line!("error: {op:?} {path} run {rep}: {e}");
                        failed += 1;
                        break;
                    }
                }
            }
            if ns.is_empty() {
                continue;
            }
            ns.sort_by(f64::total_cmp);
            let med = ns[ns.len() / 2];
            let name = if op == Op::Write8 { "write 8B" } else { "fetch-add" };
            gdaki_examples::outln!(
                "{:<10} {:<7} {:>10} {:>12.2} {:>12.1} {:>12.1} {:>12.1}",
                name,
                path,
                args.wqes,
                1e3 / med,
                med,
                ns[0],
                ns[ns.len() - 1]
            );
            let wqes: u64 = rig.nics.iter().map(|n| n.stats().wqes).sum();
            if wqes < args.wqes * ns.len() as u64 {
                gdaki_examples::eprintln_line!("error: {op:?} {path}: the NIC executed {wqes} WQEs");
                failed += 1;
            }
        }
    }
    gdaki_examples::outln!("{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
