//! Who am I, how many are we, where is the root, and the session secret: from flags or from the launcher's
//! environment.

use std::fmt;
use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The session secret: 16 random bytes that every rank of one launch carries and the root checks in each
/// hello, so that a process of another session (or a port scanner) cannot join. It mirrors NCCL's
/// `ncclUniqueId` and the unique id of MSCCL++'s `TcpBootstrap`, which rank 0 creates and the launcher hands to
/// the others. It is compared in constant time, and `Debug` never prints it.
#[derive(Clone, Copy, Eq)]
pub struct Secret([u8; 16]);

impl Secret {
    /// A fresh secret from the OS's random source (`getrandom`).
    ///
    /// # Errors
    /// [`Error::Bootstrap`] when the OS has no random source to give.
    pub fn random() -> Result<Secret> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| Error::Bootstrap(format!("cannot draw a session secret from the OS random source: {e}")))?;
        Ok(Secret(bytes))
    }

    /// Parses the form [`to_hex`](Self::to_hex) writes: exactly 32 hex digits (either case; surrounding
    /// whitespace is ignored).
    ///
    /// # Errors
    /// [`Error::Bootstrap`] naming the length or the first character that is not a hex digit.
    pub fn from_hex(s: &str) -> Result<Secret> {
        parse_hex(s).map(Secret).map_err(Error::Bootstrap)
    }

    /// The secret as 32 lowercase hex digits, for handing to other ranks (e.g. through `GDAKI_SECRET`).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A deterministic session id for launches that passed no secret: a hash of the root address (as spelled)
    /// and the world size, so that every rank of one launch computes the same value, and two sessions on
    /// different ports or of different sizes do not join each other by mistake.
    ///
    /// It separates sessions; it does not authenticate: anyone who knows the root address and world size can
    /// compute it. So [`Launch::resolve`] uses it only for a root on a loopback address (where only this
    /// host's processes can connect), and refuses a launch with any other root that has no secret. Ranks must
    /// spell the root identically (`localhost:29500` and `127.0.0.1:29500` give
    /// different ids). The hash is our own (FNV-1a 64, twice with different offset bases, each through
    /// splitmix64's finalizer), not std's `DefaultHasher`, so it is the same in every build and Rust version;
    /// a unit test pins its value.
    pub fn derived(root: &str, world_size: u32) -> Secret {
        let parts: [&[u8]; 4] = [b"gdaki-bootstrap-derived-v1\0", root.as_bytes(), b"\0", &world_size.to_le_bytes()];
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&fnv1a_mixed(FNV_OFFSET, &parts).to_le_bytes());
        bytes[8..].copy_from_slice(&fnv1a_mixed(FNV_OFFSET ^ 0x9e37_79b9_7f4a_7c15, &parts).to_le_bytes());
        Secret(bytes)
    }

    /// Wraps 16 bytes the caller already has (e.g. received out of band).
    pub fn from_bytes(bytes: [u8; 16]) -> Secret {
        Secret(bytes)
    }

    /// The 16 bytes, as sent in the hello.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl PartialEq for Secret {
    /// Constant time: how many leading bytes of a guess match must not show in the root's reply time.
    fn eq(&self, other: &Secret) -> bool {
        self.0.iter().zip(other.0.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a_mixed(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut h = seed;
    for &b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    // splitmix64's finalizer: FNV-1a leaves the last bytes' influence in few bits; this spreads every input
    // bit over the whole word.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn parse_hex(s: &str) -> Result<[u8; 16], String> {
    let s = s.trim();
    if s.len() != 32 {
        return Err(format!("session secret must be 32 hex digits, got {} characters", s.chars().count()));
    }
    if let Some(c) = s.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(format!("session secret must be 32 hex digits, found {c:?}"));
    }
    let mut bytes = [0u8; 16];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("checked hex digits");
    }
    Ok(bytes)
}

/// What the command line said; each field overrides the environment. Mirrors the flags `--rank`,
/// `--world-size`, `--bootstrap HOST:PORT`, `--secret HEX` and `--secret-file PATH` of the examples.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchFlags {
    /// `--rank`: this process's rank, 0-based.
    pub rank: Option<u32>,
    /// `--world-size`: how many ranks the session has.
    pub world_size: Option<u32>,
    /// `--bootstrap HOST:PORT`: the root's (rank 0's) listening address.
    pub bootstrap: Option<String>,
    /// `--secret`: the session secret as 32 hex digits ([`Secret::to_hex`]).
    pub secret: Option<String>,
    /// `--secret-file PATH`: a file holding the session secret as 32 hex digits (surrounding whitespace, such
    /// as a final newline, is ignored). Like an ssh private key, it must not be accessible by group or others
    /// (`chmod 600`).
    pub secret_file: Option<PathBuf>,
}

/// Where this process stands in a multi-rank launch: its rank, the world size, the root's address and the
/// session secret. Built by [`Launch::resolve`] from flags or from the environment of mpirun, srun or
/// torchrun (as NCCL's and PyTorch's launch integration read it), and consumed by
/// [`Bootstrap::connect`](super::Bootstrap::connect).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank, `0..world_size`; rank 0 is the root.
    pub rank: u32,
    /// This process's rank among the ranks on its host, from the launcher that gave the rank
    /// (`OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID`, `SLURM_LOCALID`, `LOCAL_RANK`); the rank itself
    /// when the rank came from flags or the launcher did not set it (every rank on one host). It picks the
    /// rank's GPU on a host with several ([`crate::channel::RankSetup::gpu`]), as NCCL's and NVSHMEM's users
    /// pick `local_rank % device_count`.
    pub local_rank: u32,
    /// Number of ranks in the session, ≥ 1.
    pub world_size: u32,
    /// The root's address, `HOST:PORT` (IPv6 hosts in brackets). Rank 0 binds exactly this address, so the
    /// default `127.0.0.1:29500` keeps the session on loopback unless told otherwise.
    pub root: String,
    /// The session secret the root checks in every hello.
    pub secret: Secret,
    /// Where rank and world size came from: `"flags"`, `"mpirun (OMPI_*)"`, `"PMI"`, `"srun"` or
    /// `"torchrun"` (or whatever a caller building a `Launch` by hand writes), for messages.
    pub source: &'static str,
}

/// Rank, world-size and local-rank variables of the launchers we understand, in precedence order, with the
/// name used in messages. Open MPI's mpirun sets `OMPI_COMM_WORLD_*`; MPICH/Intel MPI's hydra sets `PMI_*`
/// and `MPI_LOCALRANKID`; Slurm's srun sets `SLURM_PROCID`/`SLURM_NTASKS`/`SLURM_LOCALID`; torchrun sets
/// `RANK`/`WORLD_SIZE`/`LOCAL_RANK`.
const LAUNCHERS: [(&str, &str, &str, &str); 4] = [
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "mpirun (OMPI_*)"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "srun"),
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"),
];

/// The root address when nothing names one: loopback, on torchrun's default port.
pub const DEFAULT_ROOT: &str = "127.0.0.1:29500";

/// Longest secret file read, in bytes: 32 hex digits and some whitespace fit many times over, and a path that
/// names something endless (`/dev/zero`) is not read forever.
const SECRET_FILE_MAX: u64 = 4096;

impl Launch {
    /// Rank 0 of a world of one, with `secret`: a session that [`Bootstrap::connect`](super::Bootstrap::connect)
    /// joins without binding or dialing anything (its root address, [`DEFAULT_ROOT`], is never used), for a
    /// single-process [`crate::channel::Communicator`].
    pub fn solo(secret: Secret) -> Launch {
        Launch { rank: 0, world_size: 1, local_rank: 0, root: DEFAULT_ROOT.into(), secret, source: "solo" }
    }

    /// Resolves the launch from `flags` and the environment `env` (a lookup, so tests pass a map).
    ///
    /// - Rank and world size: the flags (both or neither); else the first launcher whose variables are set:
    ///   `OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE`, then `PMI_RANK`/`PMI_SIZE`, then
    ///   `SLURM_PROCID`/`SLURM_NTASKS`, then `RANK`/`WORLD_SIZE`.
    /// - Local rank: that launcher's `OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID`, `SLURM_LOCALID` or
    ///   `LOCAL_RANK`; the rank when it is unset or the rank came from flags.
    /// - Root address: `--bootstrap`; else `GDAKI_BOOTSTRAP`; else `MASTER_ADDR:MASTER_PORT` when either is set
    ///   (torchrun's defaults `127.0.0.1` and `29500` fill the other); else [`DEFAULT_ROOT`].
    /// - Secret: `--secret`; else `--secret-file`; else `GDAKI_SECRET`; else the file `GDAKI_SECRET_FILE`
    ///   names; else, only when the root's host is a loopback address (`127.0.0.0/8`, `::1`, or the name
    ///   `localhost`), [`Secret::derived`] from the root address and world size. A root bound anywhere else
    ///   could be reached by other hosts, and a derived secret authenticates nothing, so such a launch without
    ///   a secret is refused. Other names are not resolved (no DNS lookup here): they count as not loopback.
    ///   A secret file must hold 32 hex digits and must not be accessible by group or others.
    ///
    /// Empty variables count as unset. Note that a Slurm batch script runs with `SLURM_PROCID`/`SLURM_NTASKS`
    /// set: pass the flags to override them.
    ///
    /// Returns `Ok(None)` when neither flags nor environment give a world size: a single-process run.
    ///
    /// # Errors
    /// [`Error::Bootstrap`], naming the flag or variable, for: a rank without a world size or the reverse, a
    /// value that is not a number, a world size of 0, a rank ≥ the world size, a root address that is not
    /// `HOST:PORT` with a port in 1..=65535, a secret that is not 32 hex digits, a secret file that cannot be
    /// read or that group or others may access, no secret for a root that is not on a loopback address, and
    /// `--bootstrap`/`--secret`/`--secret-file` given without any rank and world size.
    pub fn resolve(flags: LaunchFlags, env: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
        let get = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let (rank, world_size, local_rank, source) = match (flags.rank, flags.world_size) {
            (Some(rank), Some(world_size)) => (rank, world_size, None, "flags"),
            (Some(_), None) => return Err(bad("--rank given without --world-size".into())),
            (None, Some(_)) => return Err(bad("--world-size given without --rank".into())),
            (None, None) => {
                let mut found = None;
                for (rank_var, size_var, local_var, source) in LAUNCHERS {
                    match (get(rank_var), get(size_var)) {
                        (None, None) => continue,
                        (Some(r), Some(w)) => {
                            let local = get(local_var).map(|l| parse_u32(local_var, &l)).transpose()?;
                            found = Some((parse_u32(rank_var, &r)?, parse_u32(size_var, &w)?, local, source));
                            break;
                        }
                        (Some(_), None) => return Err(bad(format!("{rank_var} is set but {size_var} is not"))),
                        (None, Some(_)) => return Err(bad(format!("{size_var} is set but {rank_var} is not"))),
                    }
                }
                match found {
                    Some(found) => found,
                    None if flags.bootstrap.is_some() || flags.secret.is_some() || flags.secret_file.is_some() => {
                        return Err(bad("--bootstrap, --secret or --secret-file given, but no rank and world size \
                                        (flags or launcher)"
                            .into()))
                    }
                    None => return Ok(None),
                }
            }
        };
        if world_size == 0 {
            return Err(bad(format!("world size 0 (from {source})")));
        }
        if rank >= world_size {
            return Err(bad(format!("rank {rank} is out of range for world size {world_size} (from {source})")));
        }
        // A local rank counts the ranks of one host, so it is below the world size too.
        if let Some(l) = local_rank.filter(|&l| l >= world_size) {
            return Err(bad(format!("local rank {l} is out of range for world size {world_size} (from {source})")));
        }

        let (root, root_source) = if let Some(root) = flags.bootstrap {
            (root, "--bootstrap")
        } else if let Some(root) = get("GDAKI_BOOTSTRAP") {
            (root, "GDAKI_BOOTSTRAP")
        } else if get("MASTER_ADDR").is_some() || get("MASTER_PORT").is_some() {
            let host = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
            let host = host.trim();
            // An IPv6 literal needs brackets before the port is appended; any other colon is a port that
            // belongs in MASTER_PORT (checked below, with the brackets, as an IPv6 literal it is not).
            let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.into() };
            (
                format!("{host}:{}", get("MASTER_PORT").unwrap_or_else(|| "29500".into()).trim()),
                "MASTER_ADDR/MASTER_PORT",
            )
        } else {
            (DEFAULT_ROOT.to_string(), "default")
        };
        let root = root.trim().to_string();
        check_host_port(&root)
            .map_err(|why| bad(format!("bad bootstrap address {root:?} from {root_source}: {why}")))?;

        let secret = if let Some(hex) = flags.secret {
            Secret(parse_hex(&hex).map_err(|why| bad(format!("--secret: {why}")))?)
        } else if let Some(path) = flags.secret_file {
            read_secret_file(&path).map_err(|why| bad(format!("--secret-file {}: {why}", path.display())))?
        } else if let Some(hex) = get("GDAKI_SECRET") {
            Secret(parse_hex(&hex).map_err(|why| bad(format!("GDAKI_SECRET: {why}")))?)
        } else if let Some(path) = get("GDAKI_SECRET_FILE") {
            let path = PathBuf::from(path.trim());
            read_secret_file(&path).map_err(|why| bad(format!("GDAKI_SECRET_FILE={}: {why}", path.display())))?
        } else if is_loopback_host(&root) {
            Secret::derived(&root, world_size)
        } else {
            return Err(bad(format!(
                "root {root} (from {root_source}) is not a loopback address: pass a session secret with --secret \
                 HEX, --secret-file PATH, GDAKI_SECRET=HEX or GDAKI_SECRET_FILE=PATH (32 hex digits, e.g. from \
                 `openssl rand -hex 16`); mpirun -x GDAKI_SECRET / srun --export / torchrun pass the environment on"
            )));
        };
        let local_rank = local_rank.unwrap_or(rank);
        Ok(Some(Launch { rank, world_size, local_rank, root, secret, source }))
    }

    /// [`Launch::resolve`] with this process's environment.
    ///
    /// # Errors
    /// As [`Launch::resolve`]; [`Error::Bootstrap`] naming the first variable it read whose value is not
    /// UTF-8 (no value these variables take), rather than taking it for unset.
    pub fn resolve_from_process_env(flags: LaunchFlags) -> Result<Option<Launch>> {
        let not_utf8 = std::cell::RefCell::new(None);
        let r = Launch::resolve(flags, |name| match std::env::var(name) {
            Ok(v) => Some(v),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(_)) => {
                not_utf8.borrow_mut().get_or_insert_with(|| name.to_string());
                None
            }
        });
        match not_utf8.into_inner() {
            Some(name) => Err(bad(format!("{name} is set to a value that is not UTF-8"))),
            None => r,
        }
    }
}

fn bad(msg: String) -> Error {
    Error::Bootstrap(msg)
}

fn parse_u32(var: &str, value: &str) -> Result<u32> {
    value.trim().parse().map_err(|_| bad(format!("{var}={value:?} is not a number in 0..=4294967295")))
}

/// Whether the host of `root` (`HOST:PORT`, checked by [`check_host_port`]) is a loopback address: an IPv4
/// literal in `127.0.0.0/8`, `::1` (also as `::ffff:127.x.y.z`), or the name `localhost` (any case, with or
/// without a final dot), which RFC 6761 reserves for loopback. Any other name counts as not loopback: it is
/// not resolved, so neither DNS nor a hosts file can make a reachable root pass for a private one.
fn is_loopback_host(root: &str) -> bool {
    let Some((host, _port)) = root.rsplit_once(':') else { return false };
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => v4.is_loopback(),
        Ok(IpAddr::V6(v6)) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        Err(_) => host.strip_suffix('.').unwrap_or(host).eq_ignore_ascii_case("localhost"),
    }
}

/// Reads a secret file: refused when group or others have any access to it (as ssh refuses such a private
/// key), else its first [`SECRET_FILE_MAX`] bytes must be 32 hex digits and whitespace.
fn read_secret_file(path: &Path) -> Result<Secret, String> {
    use std::os::unix::fs::MetadataExt;
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    // The mode of what was opened (after symlinks), not of a path that may have changed since.
    let meta = file.metadata().map_err(|e| format!("cannot stat it: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "permissions {mode:04o} are too open: group or others may access it (run `chmod 600 {}`)",
            path.display()
        ));
    }
    let mut text = String::new();
    (&mut file).take(SECRET_FILE_MAX).read_to_string(&mut text).map_err(|e| format!("cannot read it: {e}"))?;
    parse_hex(&text).map(Secret)
}

/// `HOST:PORT` with a non-empty host (bracketed when it is an IPv6 literal) and a port in 1..=65535. The host
/// is not resolved here: resolving is the bootstrap's job, with retries.
fn check_host_port(s: &str) -> Result<(), String> {
    // A bracketed IPv6 host must be followed by its port (`[::1]` alone would split at its last colon).
    if let Some(rest) = s.strip_prefix('[') {
        if !rest.split_once(']').is_some_and(|(_, tail)| tail.starts_with(':')) {
            return Err("expected [IPV6]:PORT, e.g. [::1]:29500".into());
        }
    }
    let (host, port) = s.rsplit_once(':').ok_or("expected HOST:PORT")?;
    if host.is_empty() {
        return Err("empty host".into());
    }
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    if host.contains(':') && bare.is_none() {
        return Err("IPv6 hosts need brackets, e.g. [::1]:29500".into());
    }
    // Between brackets only an IPv6 address, with a numeric zone if any (`[fe80::1%2]`, as sockets take it):
    // the brackets are for its colons, and a name needs none.
    if let Some(ip) = bare.filter(|ip| format!("[{ip}]:1").parse::<std::net::SocketAddrV6>().is_err()) {
        return Err(format!(
            "[{ip}] is not an IPv6 address (brackets hold one, e.g. [::1]:29500; a zone is the interface's number)"
        ));
    }
    match port.parse::<u16>() {
        Ok(0) => Err("port 0 (the other ranks could not know which port the root got)".into()),
        Ok(_) => Ok(()),
        Err(_) => Err(format!("port {port:?} is not a number in 1..=65535")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve(flags: LaunchFlags, vars: &[(&str, &str)]) -> Result<Option<Launch>> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Launch::resolve(flags, |k| map.get(k).cloned())
    }

    fn ok(flags: LaunchFlags, vars: &[(&str, &str)]) -> Launch {
        resolve(flags, vars).unwrap().expect("a launch")
    }

    fn err(flags: LaunchFlags, vars: &[(&str, &str)]) -> String {
        match resolve(flags, vars) {
            Err(Error::Bootstrap(m)) => m,
            other => panic!("expected a bootstrap error, got {other:?}"),
        }
    }

    fn flags(rank: u32, world_size: u32) -> LaunchFlags {
        LaunchFlags { rank: Some(rank), world_size: Some(world_size), ..LaunchFlags::default() }
    }

    const HEX: &str = "00112233445566778899aabbccddeeff";

    #[test]
    fn nothing_set_is_single_process() {
        assert_eq!(resolve(LaunchFlags::default(), &[]).unwrap(), None);
        // Root and secret variables alone do not make a multi-rank launch.
        assert_eq!(
            resolve(LaunchFlags::default(), &[("GDAKI_BOOTSTRAP", "10.0.0.1:1"), ("MASTER_PORT", "5")]).unwrap(),
            None
        );
    }

    #[test]
    fn mpirun_openmpi() {
        let l = ok(LaunchFlags::default(), &[("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4")]);
        assert_eq!((l.rank, l.world_size, l.source), (3, 4, "mpirun (OMPI_*)"));
        assert_eq!(l.root, "127.0.0.1:29500");
        assert_eq!(l.secret, Secret::derived("127.0.0.1:29500", 4));
    }

    #[test]
    fn local_rank_from_each_launcher_else_the_rank() {
        let cases: [(&[(&str, &str)], u32); 6] = [
            (&[("OMPI_COMM_WORLD_RANK", "5"), ("OMPI_COMM_WORLD_SIZE", "8"), ("OMPI_COMM_WORLD_LOCAL_RANK", "1")], 1),
            (&[("PMI_RANK", "5"), ("PMI_SIZE", "8"), ("MPI_LOCALRANKID", "2")], 2),
            (&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "3")], 3),
            (&[("RANK", "5"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "0")], 0),
            // Unset: every rank on one host.
            (&[("RANK", "5"), ("WORLD_SIZE", "8")], 5),
            // Another launcher's local rank does not count.
            (&[("RANK", "5"), ("WORLD_SIZE", "8"), ("SLURM_LOCALID", "3")], 5),
        ];
        for (vars, local) in cases {
            assert_eq!(ok(LaunchFlags::default(), vars).local_rank, local, "{vars:?}");
        }
        // Flags give the rank: the launcher's local rank belongs to another numbering.
        let flags = LaunchFlags { rank: Some(1), world_size: Some(2), ..LaunchFlags::default() };
        assert_eq!(ok(flags, &[("LOCAL_RANK", "7")]).local_rank, 1);
        // A local rank counts the ranks of a host: at most the world's.
        assert_eq!(
            err(LaunchFlags::default(), &[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "4000000000")]),
            "local rank 4000000000 is out of range for world size 2 (from torchrun)"
        );
    }

    #[test]
    fn pmi_with_gdaki_root_and_secret() {
        let l = ok(
            LaunchFlags::default(),
            &[("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("GDAKI_BOOTSTRAP", "10.0.0.1:5000"), ("GDAKI_SECRET", HEX)],
        );
        assert_eq!((l.rank, l.world_size, l.source), (1, 2, "PMI"));
        assert_eq!(l.root, "10.0.0.1:5000");
        assert_eq!(l.secret.to_hex(), HEX);
    }

    #[test]
    fn srun() {
        let l = ok(LaunchFlags::default(), &[("SLURM_PROCID", "7"), ("SLURM_NTASKS", "8")]);
        assert_eq!((l.rank, l.world_size, l.source), (7, 8, "srun"));
    }

    #[test]
    fn torchrun_with_master_addr_and_port() {
        let vars = [
            ("RANK", "2"),
            ("WORLD_SIZE", "3"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "1234"),
            ("GDAKI_SECRET", HEX),
        ];
        let l = ok(LaunchFlags::default(), &vars);
        assert_eq!((l.rank, l.world_size, l.source), (2, 3, "torchrun"));
        assert_eq!(l.root, "node7:1234");
        assert_eq!(l.secret.to_hex(), HEX);
        // torchrun's defaults fill a missing half; IPv6 literals get brackets.
        assert_eq!(
            ok(LaunchFlags::default(), &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), vars[4]]).root,
            "h:29500"
        );
        let v6 = ok(
            LaunchFlags::default(),
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "::1"), ("MASTER_PORT", "9")],
        );
        assert_eq!(v6.root, "[::1]:9");
        assert_eq!(v6.secret, Secret::derived("[::1]:9", 2));
        // GDAKI_BOOTSTRAP wins over MASTER_*.
        let l = ok(LaunchFlags::default(), &[vars[0], vars[1], vars[2], vars[3], vars[4], ("GDAKI_BOOTSTRAP", "a:1")]);
        assert_eq!(l.root, "a:1");
    }

    #[test]
    fn precedence_flags_then_ompi_pmi_slurm_torchrun() {
        let mut vars = vec![
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "11"),
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "12"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "13"),
            ("RANK", "4"),
            ("WORLD_SIZE", "14"),
            ("GDAKI_BOOTSTRAP", "envhost:1"),
            ("GDAKI_SECRET", HEX),
        ];
        let f = LaunchFlags {
            bootstrap: Some("flaghost:2".into()),
            secret: Some("ffeeddccbbaa99887766554433221100".into()),
            ..flags(0, 10)
        };
        let l = ok(f, &vars);
        assert_eq!((l.rank, l.world_size, l.source, l.root.as_str()), (0, 10, "flags", "flaghost:2"));
        assert_eq!(l.secret.to_hex(), "ffeeddccbbaa99887766554433221100");
        for (rank, size, source) in [(1, 11, "mpirun (OMPI_*)"), (2, 12, "PMI"), (3, 13, "srun"), (4, 14, "torchrun")] {
            let l = ok(LaunchFlags::default(), &vars);
            assert_eq!((l.rank, l.world_size, l.source, l.root.as_str()), (rank, size, source, "envhost:1"));
            assert_eq!(l.secret.to_hex(), HEX);
            vars.drain(..2);
        }
        assert_eq!(resolve(LaunchFlags::default(), &vars).unwrap(), None);
    }

    #[test]
    fn errors_name_what_was_wrong() {
        assert_eq!(err(flags(4, 4), &[]), "rank 4 is out of range for world size 4 (from flags)");
        assert_eq!(err(flags(0, 0), &[]), "world size 0 (from flags)");
        assert_eq!(
            err(LaunchFlags::default(), &[("RANK", "5"), ("WORLD_SIZE", "5")]),
            "rank 5 is out of range for world size 5 (from torchrun)"
        );
        assert_eq!(
            err(LaunchFlags { rank: Some(1), ..LaunchFlags::default() }, &[]),
            "--rank given without --world-size"
        );
        assert_eq!(
            err(LaunchFlags { world_size: Some(2), ..LaunchFlags::default() }, &[]),
            "--world-size given without --rank"
        );
        assert_eq!(err(LaunchFlags::default(), &[("PMI_RANK", "1")]), "PMI_RANK is set but PMI_SIZE is not");
        assert_eq!(
            err(LaunchFlags::default(), &[("SLURM_NTASKS", "2")]),
            "SLURM_NTASKS is set but SLURM_PROCID is not"
        );
        assert_eq!(
            err(LaunchFlags::default(), &[("OMPI_COMM_WORLD_RANK", "x1"), ("OMPI_COMM_WORLD_SIZE", "2")]),
            "OMPI_COMM_WORLD_RANK=\"x1\" is not a number in 0..=4294967295",
        );
        assert_eq!(
            err(LaunchFlags::default(), &[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "x")]),
            "LOCAL_RANK=\"x\" is not a number in 0..=4294967295"
        );
        assert_eq!(
            err(LaunchFlags { secret: Some("abc".into()), ..flags(0, 2) }, &[]),
            "--secret: session secret must be 32 hex digits, got 3 characters"
        );
        assert_eq!(
            err(flags(0, 2), &[("GDAKI_SECRET", "g0112233445566778899aabbccddeeff")]),
            "GDAKI_SECRET: session secret must be 32 hex digits, found 'g'"
        );
        assert_eq!(
            err(LaunchFlags { bootstrap: Some("nohost".into()), ..flags(0, 2) }, &[]),
            "bad bootstrap address \"nohost\" from --bootstrap: expected HOST:PORT"
        );
        assert_eq!(
            err(flags(0, 2), &[("GDAKI_BOOTSTRAP", "h:http")]),
            "bad bootstrap address \"h:http\" from GDAKI_BOOTSTRAP: port \"http\" is not a number in 1..=65535"
        );
        assert_eq!(
            err(flags(0, 2), &[("MASTER_ADDR", "h"), ("MASTER_PORT", "0")]),
            "bad bootstrap address \"h:0\" from MASTER_ADDR/MASTER_PORT: port 0 (the other ranks could not know which port the root got)"
        );
        assert_eq!(
            err(LaunchFlags { bootstrap: Some("[::1]".into()), ..flags(0, 2) }, &[]),
            "bad bootstrap address \"[::1]\" from --bootstrap: expected [IPV6]:PORT, e.g. [::1]:29500"
        );
        assert_eq!(
            err(LaunchFlags { bootstrap: Some("::1:5".into()), ..flags(0, 2) }, &[]),
            "bad bootstrap address \"::1:5\" from --bootstrap: IPv6 hosts need brackets, e.g. [::1]:29500"
        );
        // Brackets hold an IPv6 address and nothing else; a MASTER_ADDR with a port is not one.
        for (var, val, root) in [
            ("GDAKI_BOOTSTRAP", "[]:29500", "[]:29500"),
            ("GDAKI_BOOTSTRAP", "[node-1]:29500", "[node-1]:29500"),
            ("MASTER_ADDR", "10.0.0.1:1234", "[10.0.0.1:1234]:29500"),
        ] {
            let source = if var == "MASTER_ADDR" { "MASTER_ADDR/MASTER_PORT" } else { var };
            let inner = &root[1..root.rfind(']').unwrap()];
            assert_eq!(
                err(flags(0, 2), &[(var, val)]),
                format!(
                    "bad bootstrap address \"{root}\" from {source}: [{inner}] is not an IPv6 address (brackets hold \
                     one, e.g. [::1]:29500; a zone is the interface's number)"
                )
            );
        }
        assert_eq!(ok(flags(0, 2), &[("GDAKI_BOOTSTRAP", "[::1]:29500")]).root, "[::1]:29500");
        let secret = ("GDAKI_SECRET", "00112233445566778899aabbccddeeff");
        assert_eq!(ok(flags(0, 2), &[("GDAKI_BOOTSTRAP", "[fe80::1%2]:29500"), secret]).root, "[fe80::1%2]:29500");
        let alone = "--bootstrap, --secret or --secret-file given, but no rank and world size (flags or launcher)";
        assert_eq!(err(LaunchFlags { bootstrap: Some("h:1".into()), ..LaunchFlags::default() }, &[]), alone);
        assert_eq!(err(LaunchFlags { secret_file: Some("/x".into()), ..LaunchFlags::default() }, &[]), alone);
    }

    /// The refusal for a root that is not on loopback and has no secret, as `resolve` words it.
    fn not_loopback(root: &str, source: &str) -> String {
        format!(
            "root {root} (from {source}) is not a loopback address: pass a session secret with --secret HEX, \
             --secret-file PATH, GDAKI_SECRET=HEX or GDAKI_SECRET_FILE=PATH (32 hex digits, e.g. from `openssl \
             rand -hex 16`); mpirun -x GDAKI_SECRET / srun --export / torchrun pass the environment on"
        )
    }

    #[test]
    fn loopback_roots_derive_the_secret() {
        for root in
            ["127.0.0.1:29500", "127.255.3.9:2", "[::1]:3", "localhost:4", "LocalHost.:5", "[::ffff:127.0.0.7]:6"]
        {
            let l = ok(LaunchFlags { bootstrap: Some(root.into()), ..flags(1, 2) }, &[]);
            assert_eq!(l.secret, Secret::derived(root, 2), "{root}");
        }
        // The default root is loopback too, and so is a MASTER_ADDR of localhost.
        assert_eq!(ok(flags(0, 3), &[]).secret, Secret::derived(DEFAULT_ROOT, 3));
        let l = ok(LaunchFlags::default(), &[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "localhost")]);
        assert_eq!(l.secret, Secret::derived("localhost:29500", 2));
    }

    #[test]
    fn other_roots_without_a_secret_are_refused_in_one_line() {
        let m = err(LaunchFlags { bootstrap: Some("10.0.0.5:29500".into()), ..flags(0, 2) }, &[]);
        assert_eq!(
            m,
            "root 10.0.0.5:29500 (from --bootstrap) is not a loopback address: pass a session secret with --secret \
             HEX, --secret-file PATH, GDAKI_SECRET=HEX or GDAKI_SECRET_FILE=PATH (32 hex digits, e.g. from \
             `openssl rand -hex 16`); mpirun -x GDAKI_SECRET / srun --export / torchrun pass the environment on"
        );
        assert!(!m.contains('\n'));
        // Names other than localhost are not resolved: they count as reachable, whatever they resolve to.
        for root in [
            "0.0.0.0:1",
            "[::]:1",
            "[fe80::1]:1",
            "192.168.1.2:1",
            "128.0.0.1:1",
            "node7:1",
            "127.0.0.1.example.com:1",
            "localhost.localdomain:1",
            "my-localhost:1",
            "127.1:1",
        ] {
            assert_eq!(
                err(LaunchFlags { bootstrap: Some(root.into()), ..flags(1, 2) }, &[]),
                not_loopback(root, "--bootstrap")
            );
        }
        let torchrun = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "node7"), ("MASTER_PORT", "5")];
        assert_eq!(err(LaunchFlags::default(), &torchrun), not_loopback("node7:5", "MASTER_ADDR/MASTER_PORT"));
        assert_eq!(
            err(
                LaunchFlags::default(),
                &[("PMI_RANK", "0"), ("PMI_SIZE", "2"), ("GDAKI_BOOTSTRAP", "[2001:db8::1]:7")]
            ),
            not_loopback("[2001:db8::1]:7", "GDAKI_BOOTSTRAP")
        );
    }

    /// A file in the temp directory holding `text`, with permissions `mode`; removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(text: &str, mode: u32) -> TempFile {
            use std::io::Write;
            use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("gdaki-secret-test-{}-{n}", std::process::id()));
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).unwrap();
            f.write_all(text.as_bytes()).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            TempFile(path)
        }
        fn path(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn secret_file_from_the_flag_or_the_environment() {
        let root = Some("10.0.0.5:29500".to_string());
        let file = TempFile::new(&format!("{HEX}\n"), 0o600);
        let by_flag = LaunchFlags { bootstrap: root.clone(), secret_file: Some(file.0.clone()), ..flags(0, 2) };
        assert_eq!(ok(by_flag, &[]).secret.to_hex(), HEX);
        let by_env = ok(LaunchFlags { bootstrap: root.clone(), ..flags(1, 2) }, &[("GDAKI_SECRET_FILE", file.path())]);
        assert_eq!(by_env.secret.to_hex(), HEX);
        // Owner read-only is fine too.
        let ro = TempFile::new(HEX, 0o400);
        assert_eq!(
            ok(LaunchFlags { bootstrap: root.clone(), ..flags(1, 2) }, &[("GDAKI_SECRET_FILE", ro.path())])
                .secret
                .to_hex(),
            HEX
        );
    }

    #[test]
    fn secret_file_open_to_group_or_others_is_refused() {
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o666] {
            let file = TempFile::new(HEX, mode);
            let path = file.path();
            let m = err(LaunchFlags { secret_file: Some(file.0.clone()), ..flags(0, 2) }, &[]);
            assert_eq!(
                m,
                format!(
                    "--secret-file {path}: permissions {mode:04o} are too open: group or others may access it (run \
                     `chmod 600 {path}`)"
                )
            );
            let m = err(flags(0, 2), &[("GDAKI_SECRET_FILE", path)]);
            assert_eq!(
                m,
                format!(
                    "GDAKI_SECRET_FILE={path}: permissions {mode:04o} are too open: group or others may access it \
                     (run `chmod 600 {path}`)"
                )
            );
        }
        let missing = std::env::temp_dir().join(format!("gdaki-secret-test-{}-missing", std::process::id()));
        assert_eq!(
            err(LaunchFlags { secret_file: Some(missing.clone()), ..flags(0, 2) }, &[]),
            format!("--secret-file {}: cannot open it: No such file or directory (os error 2)", missing.display())
        );
        let short = TempFile::new("abc\n", 0o600);
        assert_eq!(
            err(flags(0, 2), &[("GDAKI_SECRET_FILE", short.path())]),
            format!("GDAKI_SECRET_FILE={}: session secret must be 32 hex digits, got 3 characters", short.path())
        );
        let dir = std::env::temp_dir();
        assert_eq!(
            err(LaunchFlags { secret_file: Some(dir.clone()), ..flags(0, 2) }, &[]),
            format!("--secret-file {}: not a regular file", dir.display())
        );
    }

    #[test]
    fn secret_precedence_flag_file_flag_env_env_file_derived() {
        let hexes = [
            "11111111111111111111111111111111",
            "22222222222222222222222222222222",
            "33333333333333333333333333333333",
            "44444444444444444444444444444444",
        ];
        let (f2, f4) = (TempFile::new(hexes[1], 0o600), TempFile::new(hexes[3], 0o600));
        let mut f = LaunchFlags { secret: Some(hexes[0].into()), secret_file: Some(f2.0.clone()), ..flags(0, 2) };
        let mut vars = vec![("GDAKI_SECRET", hexes[2]), ("GDAKI_SECRET_FILE", f4.path())];
        assert_eq!(ok(f.clone(), &vars).secret.to_hex(), hexes[0]);
        f.secret = None;
        assert_eq!(ok(f.clone(), &vars).secret.to_hex(), hexes[1]);
        f.secret_file = None;
        assert_eq!(ok(f.clone(), &vars).secret.to_hex(), hexes[2]);
        vars.remove(0);
        assert_eq!(ok(f.clone(), &vars).secret.to_hex(), hexes[3]);
        vars.clear();
        assert_eq!(ok(f.clone(), &vars).secret, Secret::derived(DEFAULT_ROOT, 2));
        // A bad secret where a good one would win is an error, not a fall-through to the next source.
        let bad = LaunchFlags { secret: Some("xyz".into()), secret_file: Some(f2.0.clone()), ..flags(0, 2) };
        assert_eq!(err(bad, &[]), "--secret: session secret must be 32 hex digits, got 3 characters");
    }

    #[test]
    fn secret_hex_round_trip_and_redacted_debug() {
        let s = Secret::from_hex(&HEX.to_uppercase()).unwrap();
        assert_eq!(s.as_bytes()[..3], [0x00, 0x11, 0x22]);
        assert_eq!(s.to_hex(), HEX);
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
        let launch = Launch::solo(s);
        assert!(!format!("{launch:?}").contains("112233"));
        let a = Secret::random().unwrap();
        assert_ne!(a, Secret::random().unwrap());
        assert_eq!(Secret::from_hex(&a.to_hex()).unwrap(), a);
    }

    #[test]
    fn derived_secret_is_pinned_and_separates_sessions() {
        // Pinned (and checked against an independent Python FNV-1a + splitmix64): ranks built by different
        // compilers must agree.
        assert_eq!(Secret::derived("127.0.0.1:29500", 2).to_hex(), "8b43e880204b53a5c62f2eab8a11bb02");
        let a = Secret::derived("127.0.0.1:29500", 2);
        assert_eq!(a, Secret::derived("127.0.0.1:29500", 2));
        assert_ne!(a, Secret::derived("127.0.0.1:29501", 2));
        assert_ne!(a, Secret::derived("127.0.0.1:29500", 3));
        assert_ne!(a, Secret::derived("localhost:29500", 2));
    }
}
