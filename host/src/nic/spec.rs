//! Which NIC to use, as the examples' `--nic` flag names it: `emu` (the emulated NIC, the default) or an RDMA
//! device (`mlx5_0`, optionally `:PORT` and `:GID_INDEX`). Parsed in every build, so that a build without the
//! `mlx5` feature can say why it cannot open a real NIC.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// A real NIC: device, port and (optionally) GID index.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mlx5Spec {
    /// RDMA device name as `ibv_devices` lists it (`mlx5_0`).
    pub device: String,
    /// Port number, from 1 (default 1).
    pub port: u8,
    /// GID table index QPs send from; `None`: chosen by `gdaki::nic::mlx5::gid::select` (RoCE v2 with an
    /// IPv4 address first).
    pub gid_index: Option<u32>,
}

/// What `--nic` names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum NicSpec {
    /// The emulated mlx5 NIC ([`crate::nic::emu`]).
    #[default]
    Emu,
    /// A real NIC through rdma-core ([`crate::nic`]'s `mlx5` backend, feature `mlx5`).
    Mlx5(Mlx5Spec),
}

impl FromStr for NicSpec {
    type Err = Error;

    /// `emu`, or `DEVICE[:PORT[:GID_INDEX]]` where DEVICE is an RDMA device name (letters, digits, `_`, `-`,
    /// `.`; at most 63 bytes, `IBV_SYSFS_NAME_MAX`), PORT is 1..=255 and GID_INDEX a number.
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::InvalidArgument(format!("--nic {s:?}: {why} (give emu, or DEVICE[:PORT[:GID_INDEX]] e.g. mlx5_0:1)"))
        };
        if s == "emu" {
            return Ok(Self::Emu);
        }
        let mut parts = s.split(':');
        let device = parts.next().unwrap_or_default();
        if device.is_empty()
            || device.len() > 63
            || !device.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        {
            return Err(bad("not an RDMA device name"));
        }
        let port = match parts.next() {
            None => 1,
            Some(p) => p.parse::<u8>().ok().filter(|&p| p >= 1).ok_or_else(|| bad("port must be 1..=255"))?,
        };
        let gid_index = match parts.next() {
            None => None,
            Some(g) => Some(g.parse::<u32>().map_err(|_| bad("GID index must be a number"))?),
        };
        if parts.next().is_some() {
            return Err(bad("too many ':' parts"));
        }
        Ok(Self::Mlx5(Mlx5Spec { device: device.to_string(), port, gid_index }))
    }
}

impl fmt::Display for NicSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Emu => f.write_str("emu"),
            Self::Mlx5(m) => {
                write!(f, "{}:{}", m.device, m.port)?;
                match m.gid_index {
                    Some(g) => write!(f, ":{g}"),
                    None => Ok(()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mlx5(device: &str, port: u8, gid_index: Option<u32>) -> NicSpec {
        NicSpec::Mlx5(Mlx5Spec { device: device.into(), port, gid_index })
    }

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!("emu".parse::<NicSpec>().unwrap(), NicSpec::Emu);
        assert_eq!("mlx5_0".parse::<NicSpec>().unwrap(), mlx5("mlx5_0", 1, None));
        assert_eq!("mlx5_1:2".parse::<NicSpec>().unwrap(), mlx5("mlx5_1", 2, None));
        assert_eq!("rocep65s0f0:1:3".parse::<NicSpec>().unwrap(), mlx5("rocep65s0f0", 1, Some(3)));
        assert_eq!(NicSpec::default(), NicSpec::Emu);
    }

    #[test]
    fn rejects_bad_forms() {
        for s in ["", ":1", "mlx5_0:0", "mlx5_0:256", "mlx5_0:x", "mlx5_0:1:-1", "mlx5_0:1:2:3", "a b", "mlx5_0:"] {
            assert!(matches!(s.parse::<NicSpec>(), Err(Error::InvalidArgument(_))), "{s:?} must be rejected");
        }
    }

    proptest! {
        #[test]
        fn display_round_trips(device in "[a-z][a-z0-9_]{0,20}", port in 1u8..=255, gid in proptest::option::of(0u32..256)) {
            prop_assume!(device != "emu");
            let spec = mlx5(&device, port, gid);
            prop_assert_eq!(spec.to_string().parse::<NicSpec>().unwrap(), spec);
        }

        #[test]
        fn never_panics(s in ".{0,80}") {
            let _ = s.parse::<NicSpec>();
        }
    }
}
