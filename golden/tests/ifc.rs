//! gdaki-shared's firmware command layouts (`prm::cmd`) against rdma-core's DEVX macros over the C declarations
//! of the same `mlx5_ifc_*_bits` structs (`c/ifc.c`): every field's bit offset and width, every layout's size,
//! every embedded layout's place, and values written by one side and read by the other.

use gdaki_golden::ifc::{self, Kind, Row};
use gdaki_shared::prm::cmd::*;
use proptest::prelude::*;

/// One Rust layout: its mlx5_ifc name, its size in bytes, its fields, its embedded layouts (member name, bit
/// offset, the embedded layout's name) and its byte strings.
struct Layout {
    name: &'static str,
    size: usize,
    fields: &'static [(&'static str, Field)],
    subs: &'static [(&'static str, u32, &'static str)],
    bytes: &'static [(&'static str, Bytes)],
}

/// A layout with neither embedded layouts nor byte strings.
const fn flat(name: &'static str, size: usize, fields: &'static [(&'static str, Field)]) -> Layout {
    Layout { name, size, fields, subs: &[], bytes: &[] }
}

/// Every layout of `prm::cmd`.
const LAYOUTS: &[Layout] = &[
    flat("mbox_in", mbox_in::SIZE, mbox_in::FIELDS),
    flat("mbox_out", mbox_out::SIZE, mbox_out::FIELDS),
    flat("cqc", cqc::SIZE, cqc::FIELDS),
    Layout {
        name: "create_cq_in",
        size: create_cq_in::SIZE,
        fields: create_cq_in::FIELDS,
        subs: &[("cq_context", create_cq_in::CQ_CONTEXT, "cqc")],
        bytes: &[],
    },
    flat("create_cq_out", create_cq_out::SIZE, create_cq_out::FIELDS),
    flat("destroy_cq_in", destroy_cq_in::SIZE, destroy_cq_in::FIELDS),
    flat("destroy_cq_out", destroy_cq_out::SIZE, destroy_cq_out::FIELDS),
    Layout { name: "ads", size: ads::SIZE, fields: ads::FIELDS, subs: &[], bytes: &[("rgid_rip", ads::RGID_RIP)] },
    Layout {
        name: "qpc",
        size: qpc::SIZE,
        fields: qpc::FIELDS,
        subs: &[
            ("primary_address_path", qpc::PRIMARY_ADDRESS_PATH, "ads"),
            ("secondary_address_path", qpc::SECONDARY_ADDRESS_PATH, "ads"),
        ],
        bytes: &[],
    },
    Layout {
        name: "create_qp_in",
        size: create_qp_in::SIZE,
        fields: create_qp_in::FIELDS,
        subs: &[("qpc", create_qp_in::QPC, "qpc")],
        bytes: &[],
    },
    flat("create_qp_out", create_qp_out::SIZE, create_qp_out::FIELDS),
    flat("destroy_qp_in", destroy_qp_in::SIZE, destroy_qp_in::FIELDS),
    flat("destroy_qp_out", destroy_qp_out::SIZE, destroy_qp_out::FIELDS),
    Layout {
        name: "rst2init_qp_in",
        size: rst2init_qp_in::SIZE,
        fields: rst2init_qp_in::FIELDS,
        subs: &[("qpc", rst2init_qp_in::QPC, "qpc")],
        bytes: &[],
    },
    flat("rst2init_qp_out", rst2init_qp_out::SIZE, rst2init_qp_out::FIELDS),
    Layout {
        name: "init2rtr_qp_in",
        size: init2rtr_qp_in::SIZE,
        fields: init2rtr_qp_in::FIELDS,
        subs: &[("qpc", init2rtr_qp_in::QPC, "qpc")],
        bytes: &[],
    },
    flat("init2rtr_qp_out", init2rtr_qp_out::SIZE, init2rtr_qp_out::FIELDS),
    Layout {
        name: "rtr2rts_qp_in",
        size: rtr2rts_qp_in::SIZE,
        fields: rtr2rts_qp_in::FIELDS,
        subs: &[("qpc", rtr2rts_qp_in::QPC, "qpc")],
        bytes: &[],
    },
    flat("rtr2rts_qp_out", rtr2rts_qp_out::SIZE, rtr2rts_qp_out::FIELDS),
    flat("qp_2err_in", qp_2err_in::SIZE, qp_2err_in::FIELDS),
    flat("qp_2err_out", qp_2err_out::SIZE, qp_2err_out::FIELDS),
    flat("query_qp_in", query_qp_in::SIZE, query_qp_in::FIELDS),
    Layout {
        name: "query_qp_out",
        size: query_qp_out::SIZE,
        fields: query_qp_out::FIELDS,
        subs: &[("qpc", query_qp_out::QPC, "qpc")],
        bytes: &[],
    },
    flat("cmd_hca_cap", cmd_hca_cap::SIZE, cmd_hca_cap::FIELDS),
    flat("query_hca_cap_in", query_hca_cap_in::SIZE, query_hca_cap_in::FIELDS),
    Layout {
        name: "query_hca_cap_out",
        size: query_hca_cap_out::SIZE,
        fields: query_hca_cap_out::FIELDS,
        // The capability page is a union; its general-device member is checked in `capability_page`.
        subs: &[("capability", query_hca_cap_out::CAPABILITY, "hca_cap_union")],
        bytes: &[],
    },
];

fn rust_layout(name: &str) -> &'static Layout {
    LAYOUTS.iter().find(|l| l.name == name).unwrap_or_else(|| panic!("no Rust layout {name}"))
}

fn c_layout(name: &str) -> &'static Row {
    ifc::layout(name).unwrap_or_else(|| panic!("c/ifc.c declares no layout {name}"))
}

fn c_member(layout: &str, member: &str) -> &'static Row {
    ifc::member(layout, member).unwrap_or_else(|| panic!("c/ifc.c: {layout} has no member {member}"))
}

#[test]
fn every_rust_layout_is_the_c_layout() {
    for l in LAYOUTS {
        let c = c_layout(l.name);
        assert_eq!(c.kind, Kind::Struct, "{}", l.name);
        assert_eq!(l.size * 8, c.bit_sz as usize, "{}: SIZE vs DEVX_ST_SZ_BYTES", l.name);

        for &(name, f) in l.fields {
            let m = c_member(l.name, name);
            assert_eq!((f.off(), f.width()), (m.bit_off, m.bit_sz), "{}.{name}: (offset, width) in bits", l.name);
            let kind = if f.width() == 64 { Kind::U64 } else { Kind::Scalar };
            assert_eq!(m.kind, kind, "{}.{name}", l.name);
        }
        for &(name, off, sub) in l.subs {
            let m = c_member(l.name, name);
            assert_eq!(m.kind, Kind::Sub, "{}.{name}", l.name);
            assert_eq!(off, m.bit_off, "{}.{name}: bit offset of the embedded {sub}", l.name);
            assert_eq!(m.bit_sz, c_layout(sub).bit_sz, "{}.{name}: size of the embedded {sub}", l.name);
        }
        for &(name, b) in l.bytes {
            let m = c_member(l.name, name);
            assert_eq!(m.kind, Kind::Bytes, "{}.{name}", l.name);
            assert_eq!((b.off(), b.len() * 8), (m.bit_off, m.bit_sz as usize), "{}.{name}", l.name);
        }

        // Nothing the C file names is missing on the Rust side, so the two lists are the same.
        for m in ifc::members(l.name) {
            let name = m.member.unwrap();
            let known = match m.kind {
                Kind::Scalar | Kind::U64 => l.fields.iter().any(|&(n, _)| n == name),
                Kind::Sub => l.subs.iter().any(|&(n, _, _)| n == name),
                Kind::Bytes => l.bytes.iter().any(|&(n, _)| n == name),
                Kind::Reserved => true,
                Kind::Struct | Kind::Union => false,
            };
            assert!(known, "c/ifc.c names {}.{name}, prm::cmd does not", l.name);
        }
    }
    // And every layout the C file declares is one of the Rust layouts (or the capability union).
    for c in ifc::layouts() {
        assert!(c.layout == "hca_cap_union" || LAYOUTS.iter().any(|l| l.name == c.layout), "{}", c.layout);
    }
}

/// The C declarations are what the labels say: each layout's members follow one another from bit 0 to its
/// end, and each reserved run starts where its name (`reserved_at_<hex>`) says. That ties the hand-written
/// offsets of the Rust constants and the C widths together: one typo in either shows up here or above.
#[test]
fn c_layouts_tile_and_reserved_labels_are_their_offsets() {
    for c in ifc::layouts() {
        let members = ifc::members(c.layout);
        assert!(!members.is_empty(), "{}", c.layout);
        if c.kind == Kind::Union {
            for m in &members {
                assert_eq!(m.bit_off, 0, "{}.{:?}", c.layout, m.member);
            }
            assert_eq!(members.iter().map(|m| m.bit_sz).max(), Some(c.bit_sz), "{}", c.layout);
            continue;
        }
        let mut end = 0;
        for m in &members {
            assert_eq!(m.bit_off, end, "{}.{}: starts where the member before ends", c.layout, m.member.unwrap());
            end += m.bit_sz;
        }
        assert_eq!(end, c.bit_sz, "{}: the members fill the layout", c.layout);
        for m in members.iter().filter(|m| m.kind == Kind::Reserved) {
            let name = m.member.unwrap();
            let hex = name.strip_prefix("reserved_at_").unwrap();
            assert_eq!(u32::from_str_radix(hex, 16).unwrap(), m.bit_off, "{}.{name}", c.layout);
        }
        // Layouts are whole dwords, as DEVX_ST_SZ_DW assumes.
        assert_eq!(c.bit_sz % 32, 0, "{}", c.layout);
    }
}

#[test]
fn capability_page() {
    let cap = c_member("query_hca_cap_out", "capability");
    assert_eq!(query_hca_cap_out::SIZE * 8 - query_hca_cap_out::CAPABILITY as usize, cap.bit_sz as usize);
    assert_eq!(cap.bit_sz, 4096 * 8);
    let general = c_member("hca_cap_union", "cmd_hca_cap");
    assert_eq!((general.bit_off, general.bit_sz as usize), (0, cmd_hca_cap::SIZE * 8));
}

/// The two fields that `FIELDS` leaves out because they overlap others.
#[test]
fn overlapping_fields() {
    // c_eqn_or_apu_element: the whole dword whose low byte is c_eqn.
    let rsv = c_member("cqc", "reserved_at_a0");
    let c_eqn = c_member("cqc", "c_eqn");
    assert_eq!(rsv.bit_off + rsv.bit_sz, c_eqn.bit_off);
    let wide = cqc::C_EQN_OR_APU_ELEMENT;
    assert_eq!((wide.off(), wide.width()), (rsv.bit_off, rsv.bit_sz + c_eqn.bit_sz));
    let mut a = [0u8; cqc::SIZE];
    let mut b = [0u8; cqc::SIZE];
    wide.set(&mut a, 0xab).unwrap();
    c_eqn.devx_set(&mut b, 0xab);
    assert_eq!(a, b, "an EQ number below 256 is the same bytes through either field");

    // The remote MAC: rmac_47_32 then rmac_31_0, 6 bytes in wire order.
    let hi = c_member("ads", "rmac_47_32");
    let lo = c_member("ads", "rmac_31_0");
    assert_eq!(hi.bit_off + hi.bit_sz, lo.bit_off);
    assert_eq!((ads::RMAC.off(), ads::RMAC.len() * 8), (hi.bit_off, (hi.bit_sz + lo.bit_sz) as usize));
    let mut buf = [0u8; ads::SIZE];
    ads::RMAC.set(&mut buf, &[0x02, 0x11, 0x22, 0x33, 0x44, 0x55]).unwrap();
    assert_eq!((hi.devx_get(&buf), lo.devx_get(&buf)), (0x0211, 0x2233_4455));
}

/// DEVX_SET64/DEVX_GET64 address 64-bit words from the start of the buffer they are given, so a 64-bit field
/// must sit on a 64-bit boundary of its layout and of every layout that embeds it (as mlx5_ifc.h places them).
#[test]
fn sixty_four_bit_fields_are_on_qword_boundaries() {
    for (layout, f, base, _) in cases() {
        if f.width() == 64 {
            assert_eq!(f.off() % 64, 0, "{layout}: 64-bit field at bit {:#x}", f.off());
            assert_eq!(base % 8, 0, "{layout}: embedded layout at byte {base}");
        }
    }
}

/// Every field as it sits in a layout: the layout's name and size, the field there (moved into embedding
/// layouts), the byte offset of the field's own layout in it and the C row of the field in its own layout.
fn cases() -> &'static [(String, Field, usize, &'static Row)] {
    static CASES: std::sync::LazyLock<Vec<(String, Field, usize, &'static Row)>> = std::sync::LazyLock::new(placements);
    &CASES
}

fn placements() -> Vec<(String, Field, usize, &'static Row)> {
    fn walk(
        out: &mut Vec<(String, Field, usize, &'static Row)>,
        path: &str,
        l: &'static Layout,
        base: u32,
        top: &'static Layout,
    ) {
        for &(name, f) in l.fields {
            out.push((format!("{}: {path}{name}", top.name), f.at(base), base as usize / 8, c_member(l.name, name)));
        }
        for &(name, off, sub) in l.subs {
            if sub != "hca_cap_union" {
                walk(out, &format!("{path}{name}."), rust_layout(sub), base + off, top);
            }
        }
        if l.name == "query_hca_cap_out" {
            walk(out, "capability.cmd_hca_cap.", rust_layout("cmd_hca_cap"), base + query_hca_cap_out::CAPABILITY, top);
        }
    }
    let mut out = Vec::new();
    for l in LAYOUTS {
        walk(&mut out, "", l, 0, l);
    }
    out
}

fn layout_size(layout_path: &str) -> usize {
    rust_layout(layout_path.split(':').next().unwrap()).size
}

/// A small deterministic generator for buffer contents.
fn fill(buf: &mut [u8], mut seed: u64) {
    for b in buf {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        *b = seed as u8;
    }
}

/// One value through one field both ways, over a buffer that starts as `seed`'s bytes: Rust's `set` and
/// DEVX_SET leave the same bytes, and each side reads what the other wrote.
fn check_one(path: &str, f: Field, base: usize, row: &Row, v: u64, seed: u64) -> Result<(), TestCaseError> {
    let size = layout_size(path);
    let mut rust = vec![0u8; size];
    fill(&mut rust, seed);
    let mut c = rust.clone();
    f.set(&mut rust, v).map_err(|e| TestCaseError::fail(format!("{path}: {e}")))?;
    row.devx_set(&mut c[base..], v);
    let diff = rust.iter().zip(&c).position(|(a, b)| a != b);
    prop_assert!(diff.is_none(), "{}: set({:#x}) differs from DEVX_SET at byte {:?}", path, v, diff);
    prop_assert_eq!(row.devx_get(&rust[base..]), v, "{}: DEVX_GET of what Rust wrote", path);
    prop_assert_eq!(f.get(&c), v, "{}: Rust get of what DEVX_SET wrote", path);
    Ok(())
}

#[test]
fn every_field_round_trips_through_devx() {
    let cases = cases();
    assert!(cases.len() > 200, "only {} field placements", cases.len());
    for (i, (path, f, base, row)) in cases.iter().enumerate() {
        let max = f.max();
        for v in [0, 1, max, max >> 1, 0x5555_5555_5555_5555 & max, 0xaaaa_aaaa_aaaa_aaaa & max] {
            for seed in [0, 0x9e37_79b9_7f4a_7c15 ^ i as u64] {
                check_one(path, *f, *base, row, v, seed).unwrap();
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn random_values_round_trip_through_devx(i in any::<prop::sample::Index>(), v in any::<u64>(), seed in any::<u64>()) {
        let cases = cases();
        let (path, f, base, row) = &cases[i.index(cases.len())];
        check_one(path, *f, *base, row, v & f.max(), seed)?;
    }
}

/// Where DEVX_SET drops the bits above a field's width, `set` refuses the value and writes nothing.
#[test]
fn too_wide_values_are_refused() {
    for (path, f, base, row) in cases() {
        if f.width() == 64 {
            continue;
        }
        let (f, base) = (*f, *base);
        let mut rust = vec![0u8; layout_size(path)];
        let too_wide = f.max() + 1;
        assert_eq!(f.set(&mut rust, too_wide), Err(FieldError::TooWide { width: f.width(), value: too_wide }));
        assert!(rust.iter().all(|&b| b == 0), "{path}: a refused set wrote");
        let mut c = vec![0u8; layout_size(path)];
        if f.width() < 32 {
            row.devx_set(&mut c[base..], too_wide);
            assert_eq!(row.devx_get(&c[base..]), 0, "{path}: DEVX_SET masks to the width");
        }
    }
}

/// A CREATE_QP input built with the helpers, read back field by field with DEVX_GET.
#[test]
fn a_create_qp_input_reads_back_through_devx() {
    let mut buf = [0xffu8; create_qp_in::SIZE];
    mbox_in::start(&mut buf, opcode::CREATE_QP, 0, 0).unwrap();
    let set = |buf: &mut [u8], f: Field, v: u64| f.set(buf, v).unwrap();
    set(&mut buf, create_qp_in::qpc(qpc::ST), qpc::st::RC.into());
    set(&mut buf, create_qp_in::qpc(qpc::PM_STATE), qpc::pm_state::MIGRATED.into());
    set(&mut buf, create_qp_in::qpc(qpc::PD), 0x12_3456);
    set(&mut buf, create_qp_in::qpc(qpc::LOG_SQ_SIZE), 10);
    set(&mut buf, create_qp_in::qpc(qpc::CQN_SND), 0xab_cdef);
    set(&mut buf, create_qp_in::qpc(qpc::DBR_ADDR), 0x40);
    set(&mut buf, create_qp_in::qpc(qpc::primary_address_path(ads::VHCA_PORT_NUM)), 1);
    set(&mut buf, create_qp_in::WQ_UMEM_OFFSET, 0x1_0000_2000);
    set(&mut buf, create_qp_in::WQ_UMEM_VALID, 1);

    let get = |layout: &str, member: &str, at: usize| c_member(layout, member).devx_get(&buf[at..]);
    let qpc_at = create_qp_in::QPC as usize / 8;
    let path_at = qpc_at + qpc::PRIMARY_ADDRESS_PATH as usize / 8;
    assert_eq!(get("create_qp_in", "opcode", 0), 0x500);
    assert_eq!(get("qpc", "st", qpc_at), 0);
    assert_eq!(get("qpc", "pm_state", qpc_at), 3);
    assert_eq!(get("qpc", "pd", qpc_at), 0x12_3456);
    assert_eq!(get("qpc", "log_sq_size", qpc_at), 10);
    assert_eq!(get("qpc", "cqn_snd", qpc_at), 0xab_cdef);
    assert_eq!(get("qpc", "dbr_addr", qpc_at), 0x40);
    assert_eq!(get("ads", "vhca_port_num", path_at), 1);
    assert_eq!(get("create_qp_in", "wq_umem_offset", 0), 0x1_0000_2000);
    assert_eq!(get("create_qp_in", "wq_umem_valid", 0), 1);
    // Everything else is zero: the one bits are those of the values above.
    let ones: u32 = buf.iter().map(|b| b.count_ones()).sum();
    let values = [0x500u64, 3, 0x12_3456, 10, 0xab_cdef, 0x40, 1, 0x1_0000_2000, 1];
    assert_eq!(ones, values.iter().map(|v| v.count_ones()).sum::<u32>(), "only the fields set have one bits");
}

/// The numbers of `prm::cmd`, written down a second time from mlx5_ifc.h, and the MTU encoding against verbs.
#[test]
fn constants() {
    let opcodes = [
        (opcode::QUERY_HCA_CAP, 0x100),
        (opcode::CREATE_CQ, 0x400),
        (opcode::DESTROY_CQ, 0x401),
        (opcode::CREATE_QP, 0x500),
        (opcode::DESTROY_QP, 0x501),
        (opcode::RST2INIT_QP, 0x502),
        (opcode::INIT2RTR_QP, 0x503),
        (opcode::RTR2RTS_QP, 0x504),
        (opcode::QP_2ERR, 0x507),
        (opcode::QUERY_QP, 0x50b),
    ];
    for (rust, ifc) in opcodes {
        assert_eq!(rust, ifc);
    }
    let statuses = [
        (status::OK, 0x0, "OK"),
        (status::INTERNAL_ERR, 0x1, "INTERNAL_ERR"),
        (status::BAD_OP, 0x2, "BAD_OP"),
        (status::BAD_PARAM, 0x3, "BAD_PARAM"),
        (status::BAD_SYS_STATE, 0x4, "BAD_SYS_STATE"),
        (status::BAD_RES, 0x5, "BAD_RES"),
        (status::RES_BUSY, 0x6, "RES_BUSY"),
        (status::LIM, 0x8, "LIM"),
        (status::BAD_RES_STATE, 0x9, "BAD_RES_STATE"),
        (status::BAD_INDEX, 0xa, "BAD_INDEX"),
        (status::NO_RES, 0xf, "NO_RES"),
        (status::BAD_QP_STATE, 0x10, "BAD_QP_STATE"),
        (status::BAD_PKT, 0x30, "BAD_PKT"),
        (status::BAD_SIZE, 0x40, "BAD_SIZE"),
        (status::BAD_INP_LEN, 0x50, "BAD_INP_LEN"),
        (status::BAD_OUTP_LEN, 0x51, "BAD_OUTP_LEN"),
    ];
    for (rust, ifc, name) in statuses {
        assert_eq!(rust, ifc, "{name}");
        assert_eq!(status::name(rust), Some(name));
    }
    let named = (0..=255u8).filter(|&s| status::name(s).is_some()).count();
    assert_eq!(named, statuses.len(), "status::name knows exactly the statuses above");

    assert_eq!([qpc::state::RST, qpc::state::INIT, qpc::state::RTR, qpc::state::RTS, qpc::state::ERR], [0, 1, 2, 3, 6]);
    assert_eq!([qpc::state::SQER, qpc::state::SQDRAINED, qpc::state::SQD, qpc::state::SUSPENDED], [4, 5, 7, 9]);
    assert_eq!([qpc::st::RC, qpc::st::UC, qpc::st::UD, qpc::st::XRC, qpc::st::DCI], [0, 1, 2, 3, 5]);
    assert_eq!([qpc::pm_state::ARMED, qpc::pm_state::REARM, qpc::pm_state::MIGRATED], [0, 1, 3]);
    assert_eq!([qpc::rq_type::NON_ZERO, qpc::rq_type::SRQ, qpc::rq_type::ZERO_LEN], [0, 1, 3]);
    assert_eq!([qpc::ts_format::FREE_RUNNING, qpc::ts_format::DEFAULT, qpc::ts_format::REAL_TIME], [0, 1, 2]);
    assert_eq!([qpc::atomic_mode::IB_SPEC, qpc::atomic_mode::ONLY_8B, qpc::atomic_mode::UP_TO_8B], [1, 2, 3]);
    assert_eq!(qpc::mtu::RAW_ETHERNET_QP, 7);
    let mtus = [
        (qpc::mtu::MTU_256, "IBV_MTU_256"),
        (qpc::mtu::MTU_512, "IBV_MTU_512"),
        (qpc::mtu::MTU_1K, "IBV_MTU_1024"),
        (qpc::mtu::MTU_2K, "IBV_MTU_2048"),
        (qpc::mtu::MTU_4K, "IBV_MTU_4096"),
    ];
    for (rust, verbs) in mtus {
        assert_eq!(Some(i64::from(rust)), ifc::c_const(verbs), "qpc mtu vs {verbs}");
    }
    assert_eq!([cqc::cqe_sz::BYTES_64, cqc::cqe_sz::BYTES_128], [0, 1]);
    assert_eq!([cqc::status::OK, cqc::status::CQ_OVERFLOW, cqc::status::CQ_WRITE_FAIL], [0, 9, 0xa]);
    assert_eq!(
        [cqc::st::SOLICITED_NOTIFICATION_REQUEST_ARMED, cqc::st::NOTIFICATION_REQUEST_ARMED, cqc::st::FIRED],
        [6, 9, 0xa]
    );
    assert_eq!([cmd_hca_cap::port_type::IB, cmd_hca_cap::port_type::ETH], [0, 1]);
    assert_eq!(
        [
            cmd_hca_cap::ts_format_cap::FREE_RUNNING,
            cmd_hca_cap::ts_format_cap::REAL_TIME,
            cmd_hca_cap::ts_format_cap::FREE_RUNNING_AND_REAL_TIME
        ],
        [0, 1, 2]
    );
    assert_eq!(query_hca_cap_in::op_mod(query_hca_cap_in::CAP_GENERAL, query_hca_cap_in::GET_CUR), 1);
    assert_eq!(query_hca_cap_in::op_mod(4, query_hca_cap_in::GET_MAX), 4 << 1);
}
