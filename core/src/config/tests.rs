use super::*;

#[test]
fn every_name_is_declared_once_with_a_known_prefix() {
    let names: Vec<&str> = all().map(|v| v.name).collect();
    for (i, n) in names.iter().enumerate() {
        assert!(!names[..i].contains(n), "{n} declared twice");
        assert!(
            n.starts_with("NCCL_") || n.starts_with("IBNET_") || n.starts_with("RCCL_"),
            "{n}"
        );
    }
}

/// Refused variables whose NCCL default is itself a value ibnet does not behave like, and why
/// that default is still refused when a user sets it explicitly.
const DEFAULT_REFUSED: &[(&str, &str)] = &[
    (
        "NCCL_IB_DATA_DIRECT",
        "NCCL's 1 means use mlx5 Data Direct where the NIC has it; ibnet never does (it behaves \
         as 0), so a user who sets 1 asks for what ibnet lacks: one WARN (unset: none)",
    ),
    // Failback's alive messages: ibnet proves a returning rail with one RDMA READ instead, so
    // every value, NCCL's default included, tunes a scheme ibnet does not run.
    (
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_INTERVAL",
        "ibnet's failback sends no alive messages (one RDMA READ proves the rail)",
    ),
    (
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_SIZE",
        "ibnet's failback sends no alive messages (one RDMA READ proves the rail)",
    ),
    (
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_SEQUENCE_SIZE",
        "ibnet's failback sends no alive messages (one RDMA READ proves the rail)",
    ),
    (
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_TIMEOUT",
        "ibnet's failback sends no alive messages (one RDMA READ proves the rail)",
    ),
];

#[test]
fn every_default_and_kept_value_parses_with_its_kind() {
    // (name, default, refused at its default) where that disagrees with DEFAULT_REFUSED.
    let mut wrong = Vec::new();
    for v in all() {
        if !v.default.is_empty() {
            assert!(v.kind.parse(v.default).is_ok(), "{}={}", v.name, v.default);
        }
        if let Reader::Refused { keeps, .. } = v.reader {
            for k in keeps {
                assert!(v.kind.parse(k).is_ok(), "{}={k}", v.name);
            }
            // The default (when known) is a value ibnet behaves like (refusal: none), or its
            // refusal is deliberate and listed in DEFAULT_REFUSED with why.
            if !v.default.is_empty() {
                let refused = v.refusal(v.default) != Ok(None);
                if refused != DEFAULT_REFUSED.iter().any(|(n, _)| *n == v.name) {
                    wrong.push((v.name, v.default, refused));
                }
            }
        }
        assert!(!v.doc.is_empty(), "{} has no doc line", v.name);
    }
    assert_eq!(
        wrong,
        [],
        "refused at the default but not listed, or listed but kept"
    );
    for (n, why) in DEFAULT_REFUSED {
        assert!(find(n).is_some() && !why.is_empty(), "{n}");
    }
}

#[test]
fn kinds_parse_as_nccl_reads_and_refuse_the_rest() {
    let int = Kind::Int { min: -1, max: 31 };
    assert_eq!(int.parse(" 0x1F "), Ok(Value::Int(31)));
    assert_eq!(int.parse("-1"), Ok(Value::Int(-1)));
    assert_eq!(int.parse("32"), Err("out of range"));
    assert_eq!(
        int.parse("12abc"),
        Err("trailing characters after the number")
    );
    assert_eq!(int.parse("  "), Err("empty value"));
    assert_eq!(Kind::Flag.parse("7"), Ok(Value::Flag(true)));
    assert_eq!(Kind::Flag.parse("yes"), Err("not a number"));
    let w = Kind::Word(&["CX", "NONE"]);
    assert_eq!(w.parse("NONE"), Ok(Value::Word("NONE")));
    assert_eq!(w.parse("none"), Err("unrecognized value"));
    assert_eq!(Kind::Text(3).parse("abcd"), Err("too long"));
    assert_eq!(Kind::Opaque.parse(" x "), Ok(Value::Text("x")));
}

#[test]
fn a_refused_variable_is_refused_only_off_the_values_ibnet_behaves_like() {
    let f = |n: &str, v: &str| find(n).unwrap().refusal(v);
    assert_eq!(f("NCCL_IB_OOO_RQ", "0"), Ok(None));
    assert_eq!(f("NCCL_IB_OOO_RQ", "1"), Ok(Some(Why::Mlx5Only)));
    assert_eq!(f("NCCL_IB_OOO_RQ", "yes"), Err("not a number"));
    assert_eq!(f("NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS", "0x0"), Ok(None));
    assert_eq!(f("NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS", "-2"), Ok(None));
    assert_eq!(
        f("NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS", "1"),
        Ok(Some(Why::OwnScheme))
    );
    assert_eq!(
        f("NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS", "-3"),
        Err("out of range")
    );
    assert_eq!(
        f("NCCL_IB_SUBNET_PREFIX_LEN", "16"),
        Ok(None),
        "implemented: not a refused variable"
    );
    assert_eq!(f("NCCL_IB_RAIL_POLICY", "NONE"), Ok(None));
    assert_eq!(
        f("NCCL_IB_RAIL_POLICY", "CX9_FLIP"),
        Ok(Some(Why::NotPublic))
    );
    assert_eq!(f("NCCL_IB_RAIL_POLICY", "ROUND"), Err("unrecognized value"));
    assert_eq!(
        f("NCCL_IB_WQE_LATENCY_REPORT", "0"),
        Ok(Some(Why::NotPublic))
    );
    assert_eq!(f("NCCL_IB_DATA_DIRECT", "0"), Ok(None));
    assert_eq!(f("NCCL_IB_DATA_DIRECT", "1"), Ok(Some(Why::Mlx5Only)));
    assert_eq!(
        f("NCCL_IB_TIMEOUT", "3"),
        Ok(None),
        "not a refused variable"
    );
}

#[test]
fn issue_28_variables_are_all_declared() {
    for n in [
        "NCCL_IB_DEVICE_PCI_ORDER",
        "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS",
        "NCCL_IB_RECEIVER_SIDE_MATCHING_SCHEME",
        "NCCL_IB_OOO_RQ",
        "NCCL_IB_SUBNET_AWARE_ROUTING",
        "NCCL_IB_SUBNET_PREFIX_LEN",
        "NCCL_IB_QUERY_PORT_SPEED",
        "NCCL_IB_EVENT_BASED_LB",
        "NCCL_IB_EVENT_BASED_LB_REMOTE",
        "NCCL_IB_RAIL_POLICY",
        "NCCL_IB_SORT_MERGE_NICS",
        "NCCL_IB_VR_RAILS_PER_SOCKET",
        "NCCL_IB_VR_SOCKET_COUNT",
        "NCCL_IB_WQE_LATENCY_REPORT",
        "NCCL_IB_WQE_LATENCY_THRESHOLD_NS",
        "NCCL_IB_DATA_DIRECT",
        "NCCL_IBVERBS_LIB",
        "NCCL_IB_RESILIENCY_PORT_FAILOVER",
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX",
    ] {
        let v = find(n).unwrap_or_else(|| panic!("{n} not declared"));
        assert!(
            matches!(v.since, Since::Nccl(27..) | Since::NcclBinary(..)),
            "{n}"
        );
    }
    assert_eq!(find("NCCL_NO_SUCH"), None);
}

#[test]
fn since_reads_as_readme_writes_it() {
    assert_eq!(Since::Nccl(29).to_string(), "NCCL 2.29");
    assert_eq!(Since::NcclUpTo(21).to_string(), "NCCL ≤ 2.21");
    assert_eq!(Since::NcclBinary(31, 32).to_string(), "NCCL 2.31–2.32");
    assert_eq!(Since::Ibnet.to_string(), "ibnet");
}
