//! The NIC's listener: it accepts connections from other NICs' dialers ([`super::link`]), checks each hello
//! against the local QP it names in the NIC's registry, answers, and hands the connection to a reader thread.
//! Like every wire thread it holds only a `Weak` reference to the NIC's shared state, and touches no QP state:
//! it finds the QP's [`Link`] and brings it up.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::link::{
    read_frame, read_loop, send_packet, socket_timeout, why_text, Inbound, Link, Mailbox, HELLO_TIMEOUT, RETRY_PAUSE,
};
use super::packet::{self, reject, Packet, VERSION};
use crate::deadline::{self, ReadBy};
use crate::nic::emu::fabric::Fabric;
use crate::nic::emu::guard::read;
use crate::nic::emu::qp::QpState;

/// Binds the NIC's listener.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let l = TcpListener::bind(addr)?;
    // Non-blocking, so that the acceptor notices the NIC's drop without a connection to wake it.
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Starts the NIC's acceptor thread: each connection gets its own thread for the hello, which then reads
/// its frames. Stops when the NIC is dropped.
pub(crate) fn spawn_acceptor(
    listener: TcpListener,
    fab: Weak<Fabric>,
    mb: Mailbox,
    timeout: Duration,
) -> io::Result<JoinHandle<()>> {
    let id = fab.upgrade().map_or(0, |f| f.id);
    thread::Builder::new().name(format!("emu-listen-{:x}", id & 0xffff)).spawn(move || loop {
        match fab.upgrade() {
            Some(f) if !f.stop.load(Ordering::Acquire) => {}
            _ => return,
        }
        match listener.accept() {
            Ok((stream, from)) => {
                let (fab, mb) = (fab.clone(), mb.clone());
                let spawned = thread::Builder::new()
                    .name("emu-wire-in".into())
                    .spawn(move || accept(stream, from, fab, mb, timeout));
                if let Err(e) = spawned {
                    tracing::warn!("emulated NIC: no thread for a connection from {from}: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(2)),
            Err(e) => {
                tracing::warn!("emulated NIC: accept failed: {e}");
                thread::sleep(Duration::from_millis(2));
            }
        }
    })
}

/// The accepting end of a connection: checks the hello against the local QP it names (waiting up to
/// `timeout` for that QP to be connected), answers, then reads frames.
fn accept(mut stream: TcpStream, from: SocketAddr, fab: Weak<Fabric>, mb: Mailbox, timeout: Duration) {
    let setup = || -> io::Result<Option<Packet<'static>>> {
        stream.set_nonblocking(false)?;
        stream.set_nodelay(true)?;
        let mut body = Vec::new();
        // The whole hello within HELLO_TIMEOUT, however its bytes are spaced.
        read_frame(&mut ReadBy { stream: &stream, deadline: deadline::after(HELLO_TIMEOUT) }, &mut body)?;
        Ok(match packet::decode(&body) {
            Ok(Packet::Hello { src_nic, src_qpn, dst_nic, dst_qpn, version }) => {
                Some(Packet::Hello { src_nic, src_qpn, dst_nic, dst_qpn, version })
            }
            _ => None,
        })
    };
    let hello = match setup() {
        Ok(Some(h)) => h,
        Ok(None) => {
            tracing::warn!("emulated NIC: connection from {from} did not start with a hello; closed");
            return;
        }
        Err(e) => {
            tracing::warn!("emulated NIC: connection from {from} sent no valid hello ({e}); closed");
            return;
        }
    };
    let Packet::Hello { src_nic, src_qpn, dst_nic, dst_qpn, version } = hello else { return };
    let verdict = if version != VERSION {
        Err(reject::VERSION)
    } else {
        find_link(&fab, src_nic, src_qpn, dst_nic, dst_qpn, timeout)
    };
    let link = match verdict {
        Ok(link) => link,
        Err(why) => {
            tracing::warn!(
                "emulated NIC: refused a connection from {from} (QP {src_qpn:#x} → {dst_qpn:#x}): {}",
                why_text(why)
            );
            let _ = send_packet(&mut stream, &Packet::Reject { why });
            return;
        }
    };
    // The answer goes out before the link is up, so that it is the first frame the dialer reads. (Later
    // writes are the executor's, and never block: `Link::try_send`.)
    let ok = send_packet(&mut stream, &Packet::HelloAck)
        .and_then(|()| stream.set_read_timeout(None))
        .and_then(|()| stream.try_clone());
    match ok {
        Ok(writer) => {
            if link.set_up(writer) {
                read_loop(stream, link, mb, socket_timeout(timeout));
            }
        }
        Err(e) => {
            link.set_down();
            mb.post(Inbound::Down { qpn: dst_qpn, reason: format!("answering the hello of {from} failed: {e}") });
        }
    }
}

/// The link of local QP `dst_qpn` if it is connected to `src_qpn` of NIC `src_nic` and not up yet, waiting
/// up to `timeout` for its INIT2RTR to run; claimed for this hello ([`Link::claim`]), so that any other hello
/// for it is refused as busy.
fn find_link(
    fab: &Weak<Fabric>,
    src_nic: u64,
    src_qpn: u32,
    dst_nic: u64,
    dst_qpn: u32,
    timeout: Duration,
) -> Result<Arc<Link>, u8> {
    let start = Instant::now();
    loop {
        let fab = fab.upgrade().ok_or(reject::NO_QP)?;
        if dst_nic != fab.id {
            return Err(reject::WRONG_NIC);
        }
        let qp = read(&fab.qps).get(&dst_qpn).cloned().ok_or(reject::NO_QP)?;
        // INIT2RTR sets the link before RTR: answer only once the QP takes requests.
        let ready = matches!(qp.state(), QpState::Rtr | QpState::Rts);
        if let (Some(link), true) = (qp.link.get(), ready) {
            if (link.remote.nic, link.remote.qpn) != (src_nic, src_qpn) {
                return Err(reject::OTHER_PEER);
            }
            if link.dials() || !link.claim() {
                return Err(reject::BUSY);
            }
            return Ok(link.clone());
        }
        // Not connected (back to the sender) yet: the sender dials again, so answer within a few seconds.
        if start.elapsed() > timeout.min(HELLO_TIMEOUT) {
            return Err(reject::NOT_CONNECTED);
        }
        drop((qp, fab));
        thread::sleep(RETRY_PAUSE);
    }
}
