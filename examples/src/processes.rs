//! `--processes N`: a program starts N copies of itself, one rank each, as `torchrun --nproc-per-node N`
//! does, and waits for them.

/// How long the other ranks of a `--processes` launch may run on after one failed ([`spawn`]).
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// [`LaunchArgs::spawn_processes`](crate::LaunchArgs::spawn_processes) after its checks: `Err` when a
/// process could not be started.
pub(crate) fn spawn(n: u32) -> Result<std::process::ExitCode, String> {
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().map_err(|e| format!("the path of this program: {e}"))?;
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    let mut given = std::env::args_os().skip(1);
    while let Some(a) = given.next() {
        if a == "--processes" {
            given.next();
        } else if !a.to_string_lossy().starts_with("--processes=") {
            args.push(a);
        }
    }
    // The loopback root needs no secret, but a fresh one keeps this session apart from any other on the
    // same port.
    let secret = gdaki::bootstrap::Secret::random().map_err(|e| e.to_string())?;
    let port = root_port()?;
    let mut children = Vec::new();
    for rank in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .args(["--world-size", &n.to_string(), "--rank", &rank.to_string()])
            .arg("--bootstrap")
            .arg(format!("127.0.0.1:{port}"))
            .env("GDAKI_SECRET", secret.to_hex())
            .stdin(Stdio::null());
        // SAFETY: the hook runs in the child between fork and exec and makes one async-signal-safe call.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                // A launcher that ends (a signal, a crash) takes its ranks with it, as torchrun's do.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            })
        };
        let child = cmd.spawn();
        match child {
            Ok(c) => children.push(c),
            Err(e) => {
                for mut c in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(format!("starting rank {rank}: {e}"));
            }
        }
    }
    Ok(wait_all(children))
}

/// A loopback port free now, which rank 0 binds a moment later. Tried first: ports below the OS's ephemeral
/// range (`ip_local_port_range`), from a random start, since a port the OS hands out meanwhile (to a
/// `bind` to port 0 or to an outgoing connection, as tests running beside do by the hundred) is always taken
/// from that range; only another program that binds that very port in between could take it. Else any port
/// the OS picks.
fn root_port() -> Result<u16, String> {
    use std::hash::{BuildHasher, Hasher};
    let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).and_then(|l| l.local_addr());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    // Below the range, above the ports of well-known services (most below 10000).
    let (low, high) = (10_000u16, ephemeral_low);
    if high > low {
        let span = u32::from(high - low);
        // std's hasher keys are random per process: a start no other launch shares, without a crate for it.
        let start = (std::collections::hash_map::RandomState::new().build_hasher().finish() % u64::from(span)) as u32;
        for i in 0..64u32 {
            let port = low + ((start + i * 7919) % span) as u16;
            if free(port).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(free(0).map_err(|e| format!("no free loopback port for the bootstrap: {e}"))?.port())
}

/// Waits for the ranks `children` (by rank), stopping the others `STOP_GRACE` after one fails, and names
/// each rank that failed or was stopped; returns the first failed rank's code, success when none failed.
fn wait_all(mut children: Vec<std::process::Child>) -> std::process::ExitCode {
    // As torchrun: once a rank fails, the others get `STOP_GRACE` to end by themselves (and say what they
    // saw), then are stopped, so that a rank stuck waiting for the failed one does not hold the launch.
    let mut ended: Vec<Option<String>> = vec![None; children.len()];
    let (mut code, mut first_failure) = (None, None::<(usize, std::time::Instant)>);
    loop {
        for (rank, c) in children.iter_mut().enumerate() {
            if ended[rank].is_some() {
                continue;
            }
            let failed = match c.try_wait() {
                Ok(None) => continue,
                Ok(Some(s)) if s.success() => {
                    ended[rank] = Some(String::new());
                    continue;
                }
                // "exit status: 1", or "signal: 9 (SIGKILL)".
                Ok(Some(s)) => {
                    ended[rank] = Some(format!("ended with {s}"));
                    s.code().map_or(1, |c| c.clamp(1, 255) as u8)
                }
                Err(e) => {
                    let _ = c.kill();
                    ended[rank] = Some(format!("could not be waited for: {e}"));
                    1
                }
            };
            code = code.or(Some(failed));
            first_failure = first_failure.or(Some((rank, std::time::Instant::now())));
        }
        if ended.iter().all(Option::is_some) {
            break;
        }
        if let Some((failed, at)) = first_failure.filter(|(_, at)| at.elapsed() >= STOP_GRACE) {
            for (rank, c) in children.iter_mut().enumerate() {
                if ended[rank].is_none() {
                    let _ = c.kill();
                    let _ = c.wait();
                    ended[rank] = Some(format!("was stopped {:?} after rank {failed} failed", at.elapsed()));
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for (rank, how) in ended.iter().enumerate() {
        if let Some(how) = how.as_deref().filter(|h| !h.is_empty()) {
            // One write per line: the ranks may still be writing to the same stream.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("--processes: rank {rank} {how}\n").as_bytes(),
            );
        }
    }
    code.map_or(std::process::ExitCode::SUCCESS, std::process::ExitCode::from)
}

#[cfg(test)]
mod tests {
    /// The port is below the OS's ephemeral range (where no `bind` to port 0 or outgoing connection takes it)
    /// and free; two picks start at random places, so a run of picks is not one port.
    #[test]
    fn the_root_port_is_below_the_ephemeral_range_and_free() {
        let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse().ok())
            .unwrap_or(32768);
        let picks: Vec<u16> = (0..8).map(|_| super::root_port().expect("a free port")).collect();
        for &p in &picks {
            assert!((10_000..low).contains(&p), "port {p}, ephemeral range from {low}");
            std::net::TcpListener::bind(("127.0.0.1", p)).unwrap_or_else(|e| panic!("port {p} is not free: {e}"));
        }
        assert!(picks.iter().any(|&p| p != picks[0]), "eight picks, one port: {picks:?}");
    }
}
