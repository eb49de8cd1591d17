//! Faults on the emulated NIC: one test per case of `gdaki_testkit::faults::catalogue()`, each
//! asserting the exact outcome device code sees (syndrome and vendor syndrome of the error CQE, or the
//! completion, timeout or overrun), the QP state, that no byte outside the permitted range changed, and that
//! the waiter returned within its bound. The expected outcomes are written here a second time, from the PRM
//! syndromes, so that the catalogue cannot drift from what the PRM says.
//!
//! The SIGKILL case runs its peer in a child process: this test binary again, running only the ignored test
//! `peer_child`, which is the peer's body when `GDAKI_FAULTS_PEER` is set and returns at once otherwise.

use std::process::Command;
use std::sync::Mutex;

use gdaki::nic::emu::{vendor, QpState};
use gdaki_shared::prm::opcode::syndrome::*;
use gdaki_testkit::faults::{self, Ctx, Outcome, WaitKind};

/// Set in the peer process's environment.
const PEER_ENV: &str = "GDAKI_FAULTS_PEER";

/// One case at a time: cases measure how long waits take, and each one runs NIC threads of its own.
static SERIAL: Mutex<()> = Mutex::new(());

fn ctx() -> Ctx {
    Ctx::new(|| {
        let mut c = Command::new(std::env::current_exe().expect("path of the test binary"));
        c.args(["--exact", "peer_child", "--ignored", "--nocapture", "--test-threads=1"]).env(PEER_ENV, "1");
        c
    })
}

const fn cqe(syndrome: u8, vendor: u8) -> Outcome {
    Outcome::Cqe { syndrome, vendor }
}

/// Runs case `name` and asserts that it expects `expected` and `state`, and that it passed.
fn check(name: &str, expected: Outcome, state: QpState) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let case = faults::find(name).unwrap_or_else(|| panic!("the catalogue has no case {name:?}"));
    assert_eq!((&case.expected, case.state), (&expected, state), "the catalogue's expectation for {name:?}");
    let r = case.run(&ctx());
    let why = format!("{name}:\n  {}", r.failures().join("\n  "));
    assert_eq!(r.observed, expected, "{why}");
    assert_eq!(r.qp_state, Some(state), "{why}");
    assert_eq!(r.outside_changed, Some(0), "{why}");
    assert!(r.waited <= r.bound, "{why}");
    assert!(r.pass, "{why}");
}

macro_rules! cases {
    ($($(#[$m:meta])* $test:ident: $name:literal => $expected:expr, $state:ident;)*) => {
        $(
            $(#[$m])*
            #[test]
            fn $test() {
                check($name, $expected, QpState::$state);
            }
        )*
        /// Every case name with a test above.
        const TESTED: &[&str] = &[$($name),*];
    };
}

cases! {
    bad_lkey_wire: "bad lkey (wire)" => cqe(LOCAL_PROT_ERR, vendor::BAD_LKEY), Error;
    bad_lkey_direct: "bad lkey (direct)" => cqe(LOCAL_PROT_ERR, vendor::BAD_LKEY), Error;
    bad_rkey_wire: "bad rkey (wire)" => cqe(REMOTE_ACCESS_ERR, vendor::BAD_RKEY), Error;
    bad_rkey_direct: "bad rkey (direct)" => cqe(REMOTE_ACCESS_ERR, vendor::BAD_RKEY), Error;
    past_mr_end_wire: "remote address past MR end (wire)" => cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_BOUNDS), Error;
    past_mr_end_direct: "remote address past MR end (direct)" => cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_BOUNDS), Error;
    no_remote_write_wire: "MR without REMOTE_WRITE (wire)" => cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS), Error;
    no_remote_write_direct: "MR without REMOTE_WRITE (direct)" =>
        cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS), Error;
    no_remote_read_wire: "MR without REMOTE_READ (wire)" => cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS), Error;
    no_remote_read_direct: "MR without REMOTE_READ (direct)" => cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS), Error;
    no_remote_atomic_wire: "MR without REMOTE_ATOMIC (wire)" => cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS), Error;
    no_remote_atomic_direct: "MR without REMOTE_ATOMIC (direct)" =>
        cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS), Error;
    unaligned_atomic_wire: "unaligned atomic (wire)" => cqe(REMOTE_INVAL_REQ_ERR, vendor::ATOMIC_ALIGN), Error;
    unaligned_atomic_direct: "unaligned atomic (direct)" => cqe(REMOTE_INVAL_REQ_ERR, vendor::ATOMIC_ALIGN), Error;
    zero_byte_inline_wire: "zero-byte WRITE, empty inline (wire)" => Outcome::Completed, Rts;
    zero_byte_inline_direct: "zero-byte WRITE, empty inline (direct)" => Outcome::Completed, Rts;
    zero_byte_no_data_seg_wire: "zero-byte WRITE, no data seg (wire)" => Outcome::Completed, Rts;
    zero_byte_no_data_seg_direct: "zero-byte WRITE, no data seg (direct)" => Outcome::Completed, Rts;
    sq_full: "SQ full (silent peer)" => Outcome::Timeout(WaitKind::SqSpace), Rts;
    cq_overrun: "CQ overrun" => Outcome::CqOverrun, Error;
    doorbell_never_rung: "doorbell never rung" => Outcome::Timeout(WaitKind::Cqe), Rts;
    doorbell_past_the_ring_wire: "doorbell past the ring (wire)" => cqe(LOCAL_QP_OP_ERR, vendor::BAD_DOORBELL), Error;
    doorbell_past_the_ring_direct: "doorbell past the ring (direct)" =>
        cqe(LOCAL_QP_OP_ERR, vendor::BAD_DOORBELL), Error;
    doorbell_naming_another_qp_wire: "doorbell naming another QP (wire)" =>
        cqe(LOCAL_QP_OP_ERR, vendor::BAD_QPN), Error;
    doorbell_naming_another_qp_direct: "doorbell naming another QP (direct)" =>
        cqe(LOCAL_QP_OP_ERR, vendor::BAD_QPN), Error;
    wrong_qpn_wire: "WQE with wrong QPN (wire)" => cqe(LOCAL_QP_OP_ERR, vendor::BAD_QPN), Error;
    wrong_qpn_direct: "WQE with wrong QPN (direct)" => cqe(LOCAL_QP_OP_ERR, vendor::BAD_QPN), Error;
    wrong_ds_wire: "WQE with wrong ds (wire)" => cqe(LOCAL_QP_OP_ERR, vendor::BAD_DS), Error;
    wrong_ds_direct: "WQE with wrong ds (direct)" => cqe(LOCAL_QP_OP_ERR, vendor::BAD_DS), Error;
    peer_killed_mid_transfer: "peer killed (SIGKILL) mid 64 MiB" =>
        cqe(TRANSPORT_RETRY_EXC_ERR, vendor::NO_PEER), Error;
    peer_unreachable: "peer unreachable" => cqe(TRANSPORT_RETRY_EXC_ERR, vendor::NO_PEER), Error;
    error_cqe_during_semaphore_wait: "error CQE during semaphore wait" =>
        cqe(REMOTE_ACCESS_ERR, vendor::BAD_RKEY), Error;
}

#[test]
fn every_case_of_the_catalogue_has_a_test() {
    let names: Vec<&str> = faults::catalogue().iter().map(|c| c.name).collect();
    assert_eq!(names, TESTED, "catalogue and tests differ");
}

/// The peer process of the SIGKILL case (see the module docs).
#[test]
#[ignore = "the peer process of the SIGKILL case: runs only when that case starts it"]
fn peer_child() {
    if std::env::var_os(PEER_ENV).is_none() {
        return;
    }
    faults::run_peer(std::io::stdin().lock(), std::io::stdout()).expect("faults peer");
}
