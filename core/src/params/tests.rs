//! Unit tests of NCCL's variables: every accepted syntax, every refusal and its message.

use super::*;

fn bad(name: &'static str, value: &str) {
    let mut p = Params::default();
    let before = p.clone();
    match p.set(name, value) {
        Err(Error::Param { name: n, .. }) => assert_eq!(n, name, "{value:?}"),
        other => panic!("{name}={value:?}: expected Param error, got {other:?}"),
    }
    assert_eq!(p, before, "{name}={value:?} changed params on error");
}

fn good(name: &str, value: &str) -> Params {
    let mut p = Params::default();
    assert_eq!(p.set(name, value), Ok(true), "{name}={value:?}");
    p
}

#[test]
fn defaults_are_nccl_2_28() {
    let p = Params::default();
    assert_eq!(p.ib_hca.as_str(), "");
    assert_eq!(p.ib_gid_index, None);
    assert_eq!(p.ib_roce_version_num, 2);
    assert_eq!(p.ib_addr_family, None, "unset (not set by the default)");
    assert_eq!(p.addr_family(), AddrFamily::Inet);
    assert_eq!(p.ib_addr_range, None);
    assert_eq!(p.ib_timeout, 20);
    assert_eq!(p.ib_retry_cnt, 7);
    assert_eq!(p.ib_pkey, 0);
    assert!(!p.ib_use_inline);
    assert_eq!(p.ib_sl, None);
    assert_eq!(p.ib_tc, None);
    assert_eq!(p.ib_fifo_tc, None);
    assert_eq!(p.ib_ar_threshold, 8192);
    assert_eq!(p.ib_adaptive_routing, None);
    assert_eq!(p.ib_pci_relaxed_ordering, RelaxedOrdering::Auto);
    assert_eq!(p.ib_qps_per_connection, 1);
    assert!(!p.ib_split_data_on_qps);
    assert!(!p.ib_disable);
    assert!(p.ib_merge_vfs);
    assert!(!p.ib_sock_client_port_reuse);
    assert!(!p.ib_sock_server_port_reuse);
    assert!(p.ib_return_async_events);
    assert!(p.ib_ece_enable);
    assert!(!p.ib_mqp_retry_all);
    assert_eq!(p.ib_mqp_retry_cnt, 34);
    assert_eq!(p.ib_mqp_retry_sleep_msec, 100);
    assert_eq!(p.ib_routable_flid_gid_index, 1);
    assert!(!p.ib_subnet_aware_routing);
    assert_eq!(p.ib_subnet_prefix_len, 24);
    assert!(!p.gdr_flush_disable);
    assert!(p.dmabuf_enable);
    assert_eq!(p.socket_ifname.as_str(), "");
    assert_eq!(p.socket_family, None);
    assert_eq!(p.provider, ProviderKind::Auto);
    // Derived defaults.
    assert!(p.adaptive_routing(LinkLayer::Infiniband));
    assert!(!p.adaptive_routing(LinkLayer::Ethernet));
    assert_eq!(p.sl(None), 0);
    assert_eq!(p.tc(None), 0);
    assert_eq!(p.gid_addr_range(), None);
}

/// A valid value of `v`'s kind other than its declared default (for `Text`, one each text
/// variable's own parser accepts).
fn non_default(v: &crate::config::Var) -> &'static str {
    use crate::config::Kind;
    let d = v.kind.parse(v.default).ok();
    match v.kind {
        Kind::Int { min, max } => {
            // Both ends of the range as text (leaked once per test run: a test, not core).
            let ends = [min, max, min.saturating_add(1)].map(|x| {
                let s: &'static str = std::boxed::Box::leak(std::format!("{x}").into_boxed_str());
                s
            });
            ends.into_iter()
                .find(|e| v.kind.parse(e).ok() != d)
                .expect("an Int range of one value")
        }
        Kind::Flag if d.and_then(|x| x.flag()) == Some(true) => "0",
        Kind::Flag => "1",
        Kind::Word(words) => words
            .iter()
            .find(|w| v.kind.parse(w).ok() != d)
            .expect("a Word of one value"),
        Kind::Text(_) | Kind::Path | Kind::Opaque => match v.name {
            "NCCL_IB_HCA" => "=mlx5_0:1",
            "NCCL_IB_ADDR_RANGE" => "10.0.0.0/8",
            "NCCL_SOCKET_IFNAME" => "^docker",
            _ => "x",
        },
    }
}

#[test]
fn every_plugin_variable_of_the_table_is_settable() {
    let plugin = || crate::config::all().filter(|v| v.reader == crate::config::Reader::Plugin);
    // Plugin variables whose non-default value leaves `Params` as it is: none today. A name
    // here must say why (a variable Params accepts but does not store is a dead variable).
    const STORES_NOTHING: &[&str] = &[];
    for v in plugin() {
        // A blank value is refused naming the variable, and changes nothing.
        bad(v.name, "");
        bad(v.name, "   ");
        // A valid non-default value reaches its arm and is stored: Params changes.
        let other = non_default(v);
        let p = good(v.name, other);
        if STORES_NOTHING.contains(&v.name) {
            assert_eq!(p, Params::default(), "{}={other}", v.name);
            continue;
        }
        assert_ne!(p, Params::default(), "{}={other} changed nothing", v.name);
        // Its declared default, set over that value, gives the default params back.
        if !v.default.is_empty() {
            let mut q = p.clone();
            assert_eq!(q.set(v.name, v.default), Ok(true), "{}", v.name);
            assert_eq!(
                q,
                Params::default(),
                "{}={} over {other}",
                v.name,
                v.default
            );
        }
    }
    // Read by someone else than the plugin: not Params'.
    for n in [
        "IBNET_SOFT_WORKERS",
        "NCCL_IBVERBS_LIB",
        "IBNET_GPU",
        "NCCL_IB_OOO_RQ",
    ] {
        assert_eq!(Params::default().set(n, "1"), Ok(false), "{n}");
    }
    let mut p = Params::default();
    assert_eq!(p.set("NCCL_IB_NOPE", "1"), Ok(false));
    assert_eq!(
        p.set("nccl_ib_timeout", "1"),
        Ok(false),
        "names are case-sensitive"
    );
    assert_eq!(p, Params::default());
}

#[test]
fn integer_syntax_follows_strtoll_base_0() {
    assert_eq!(parse_int("0"), Ok(0));
    assert_eq!(parse_int("22"), Ok(22));
    assert_eq!(parse_int("+22"), Ok(22));
    assert_eq!(parse_int("-2"), Ok(-2));
    assert_eq!(parse_int("0x1F"), Ok(31));
    assert_eq!(parse_int("0X1f"), Ok(31));
    assert_eq!(parse_int("017"), Ok(15));
    assert_eq!(parse_int("-0x10"), Ok(-16));
    assert_eq!(parse_int("9223372036854775807"), Ok(i64::MAX));
    assert_eq!(parse_int("-9223372036854775808"), Ok(i64::MIN));
    assert!(parse_int("9223372036854775808").is_err());
    assert!(parse_int("-9223372036854775809").is_err());
    assert!(parse_int("99999999999999999999999").is_err());
    for junk in [
        "", "-", "+", "0x", "abc", "12abc", "08", "0x1g", "1 2", "1.5", "--1", " 1",
    ] {
        assert!(parse_int(junk).is_err(), "{junk:?}");
    }
}

#[test]
fn integers_good_and_bad() {
    assert_eq!(good("NCCL_IB_TIMEOUT", "22").ib_timeout, 22);
    assert_eq!(good("NCCL_IB_TIMEOUT", " 0x16\n").ib_timeout, 22);
    assert_eq!(good("NCCL_IB_TIMEOUT", "026").ib_timeout, 22);
    assert_eq!(good("NCCL_IB_TIMEOUT", "0").ib_timeout, 0);
    assert_eq!(good("NCCL_IB_TIMEOUT", "31").ib_timeout, 31);
    bad("NCCL_IB_TIMEOUT", "32");
    bad("NCCL_IB_TIMEOUT", "-1");
    bad("NCCL_IB_TIMEOUT", "20x");
    bad("NCCL_IB_TIMEOUT", "twenty");
    assert_eq!(good("NCCL_IB_RETRY_CNT", "0").ib_retry_cnt, 0);
    bad("NCCL_IB_RETRY_CNT", "8");
    assert_eq!(good("NCCL_IB_PKEY", "0xffff").ib_pkey, 0xFFFF);
    bad("NCCL_IB_PKEY", "65536");
    bad("NCCL_IB_PKEY", "-1");
    assert_eq!(good("NCCL_IB_ROCE_VERSION_NUM", "1").ib_roce_version_num, 1);
    bad("NCCL_IB_ROCE_VERSION_NUM", "3");
    bad("NCCL_IB_ROCE_VERSION_NUM", "0");
    assert_eq!(good("NCCL_IB_AR_THRESHOLD", "0").ib_ar_threshold, 0);
    assert_eq!(
        good("NCCL_IB_AR_THRESHOLD", "1048576").ib_ar_threshold,
        1 << 20
    );
    bad("NCCL_IB_AR_THRESHOLD", "-1");
    assert_eq!(
        good("NCCL_IB_QPS_PER_CONNECTION", "128").ib_qps_per_connection,
        128
    );
    assert_eq!(
        good("NCCL_IB_QPS_PER_CONNECTION", "4").ib_qps_per_connection,
        4
    );
    bad("NCCL_IB_QPS_PER_CONNECTION", "0");
    bad("NCCL_IB_QPS_PER_CONNECTION", "129");
    bad("NCCL_IB_QPS_PER_CONNECTION", "-1");
    assert_eq!(good("NCCL_IB_MQP_RETRY_CNT", "0").ib_mqp_retry_cnt, 0);
    assert_eq!(
        good("NCCL_IB_MQP_RETRY_SLEEP_MSEC", "4294967295").ib_mqp_retry_sleep_msec,
        u32::MAX
    );
    bad("NCCL_IB_MQP_RETRY_SLEEP_MSEC", "4294967296");
    bad("NCCL_IB_MQP_RETRY_CNT", "-5");
}

#[test]
fn auto_sentinels() {
    assert_eq!(good("NCCL_IB_GID_INDEX", "3").ib_gid_index, Some(3));
    assert_eq!(good("NCCL_IB_GID_INDEX", "-1").ib_gid_index, None);
    bad("NCCL_IB_GID_INDEX", "-2");
    bad("NCCL_IB_GID_INDEX", "256");
    assert_eq!(good("NCCL_IB_SL", "15").ib_sl, Some(15));
    bad("NCCL_IB_SL", "16");
    bad("NCCL_IB_SL", "-3");
    assert_eq!(good("NCCL_IB_TC", "106").ib_tc, Some(106));
    bad("NCCL_IB_TC", "256");
    assert_eq!(good("NCCL_IB_FIFO_TC", "0").ib_fifo_tc, Some(0));
    assert_eq!(good("NCCL_IB_FIFO_TC", "-1").ib_fifo_tc, None);
    bad("NCCL_IB_FIFO_TC", "300");
}

#[test]
fn booleans_are_nonzero_like_nccl() {
    for name in [
        "NCCL_IB_USE_INLINE",
        "NCCL_IB_SPLIT_DATA_ON_QPS",
        "NCCL_IB_DISABLE",
        "NCCL_IB_SOCK_CLIENT_PORT_REUSE",
        "NCCL_IB_SOCK_SERVER_PORT_REUSE",
        "NCCL_IB_MQP_RETRY_ALL",
        "NCCL_IB_WARN_RAIL_LOCAL",
        "NCCL_GDR_FLUSH_DISABLE",
    ] {
        let on = good(name, "1");
        let two = good(name, "2");
        assert_ne!(on, Params::default(), "{name}");
        assert_eq!(on, two, "{name}");
        assert_eq!(good(name, "0"), Params::default(), "{name}");
        bad(name, "yes");
        bad(name, "1x");
    }
    for name in [
        "NCCL_IB_MERGE_VFS",
        "NCCL_IB_MERGE_NICS",
        "NCCL_IB_RETURN_ASYNC_EVENTS",
        "NCCL_IB_ECE_ENABLE",
        "NCCL_DMABUF_ENABLE",
    ] {
        assert_ne!(good(name, "0"), Params::default(), "{name}");
        assert_eq!(good(name, "1"), Params::default(), "{name}");
        bad(name, "true");
    }
    assert!(good("NCCL_IB_SPLIT_DATA_ON_QPS", "1").ib_split_data_on_qps);
    assert!(good("NCCL_IB_DISABLE", "0x1").ib_disable);
    assert!(!good("NCCL_IB_ECE_ENABLE", "0").ib_ece_enable);
}

#[test]
fn adaptive_routing() {
    let p = good("NCCL_IB_ADAPTIVE_ROUTING", "-2");
    assert!(p.adaptive_routing(LinkLayer::Infiniband));
    assert!(!p.adaptive_routing(LinkLayer::Ethernet));
    let p = good("NCCL_IB_ADAPTIVE_ROUTING", "0");
    assert!(!p.adaptive_routing(LinkLayer::Infiniband));
    let p = good("NCCL_IB_ADAPTIVE_ROUTING", "1");
    assert!(p.adaptive_routing(LinkLayer::Ethernet));
    bad("NCCL_IB_ADAPTIVE_ROUTING", "on");
}

#[test]
fn relaxed_ordering() {
    assert_eq!(
        good("NCCL_IB_PCI_RELAXED_ORDERING", "0").ib_pci_relaxed_ordering,
        RelaxedOrdering::Off
    );
    assert_eq!(
        good("NCCL_IB_PCI_RELAXED_ORDERING", "1").ib_pci_relaxed_ordering,
        RelaxedOrdering::On
    );
    assert_eq!(
        good("NCCL_IB_PCI_RELAXED_ORDERING", "2").ib_pci_relaxed_ordering,
        RelaxedOrdering::Auto
    );
    bad("NCCL_IB_PCI_RELAXED_ORDERING", "3");
    bad("NCCL_IB_PCI_RELAXED_ORDERING", "-1");
}

#[test]
fn sl_tc_resolution() {
    let p = Params::default();
    assert_eq!(p.sl(Some(3)), 3);
    assert_eq!(p.tc(Some(106)), 106);
    assert_eq!(p.sl(Some(106)), 106 & 0x0F);
    let p = good("NCCL_IB_SL", "5");
    assert_eq!(p.sl(Some(3)), 5);
    assert_eq!(p.sl(None), 5);
    let p = good("NCCL_IB_TC", "0");
    assert_eq!(p.tc(Some(106)), 0);
    assert_eq!(config_traffic_class(-1), Ok(None));
    assert_eq!(config_traffic_class(0), Ok(Some(0)));
    assert_eq!(config_traffic_class(255), Ok(Some(255)));
    assert!(matches!(
        config_traffic_class(256),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        config_traffic_class(-2),
        Err(Error::OutOfRange { .. })
    ));
    // FIFO TC: only on RoCE, only when set.
    let p = Params::default();
    assert_eq!(p.fifo_tc(LinkLayer::Ethernet, 7), 7);
    let p = good("NCCL_IB_FIFO_TC", "96");
    assert_eq!(p.fifo_tc(LinkLayer::Ethernet, 7), 96);
    assert_eq!(p.fifo_tc(LinkLayer::Infiniband, 7), 7);
}

#[test]
fn address_family_and_range() {
    assert_eq!(
        good("NCCL_IB_ADDR_FAMILY", "AF_INET6").ib_addr_family,
        Some(AddrFamily::Inet6)
    );
    assert_eq!(
        good("NCCL_IB_ADDR_FAMILY", "AF_INET").ib_addr_family,
        Some(AddrFamily::Inet)
    );
    bad("NCCL_IB_ADDR_FAMILY", "inet");
    assert_eq!(
        good("NCCL_SOCKET_FAMILY", "AF_INET6").socket_family,
        Some(AddrFamily::Inet6)
    );
    bad("NCCL_SOCKET_FAMILY", "AF_UNIX");

    let p = good("NCCL_IB_ADDR_RANGE", "10.1.0.0/16");
    let r = p.ib_addr_range.unwrap();
    assert_eq!((r.family, r.prefix_len), (AddrFamily::Inet, 16));
    assert_eq!(p.gid_addr_range(), Some(r));
    let mut gid = Gid([0; 16]);
    gid.0[10] = 0xFF;
    gid.0[11] = 0xFF;
    gid.0[12..].copy_from_slice(&[10, 1, 200, 3]);
    assert!(r.contains_gid(&gid));
    gid.0[13] = 2;
    assert!(!r.contains_gid(&gid));
    // A prefix that ends inside a byte: 10.0.0.0/15 is 10.0.x.x and 10.1.x.x.
    let r = AddrRange::parse("10.0.0.0/15").unwrap();
    assert!(!r.contains_gid(&gid), "10.2 is outside 10.0/15");
    gid.0[13] = 3;
    assert!(!r.contains_gid(&gid));
    gid.0[13] = 1;
    assert!(r.contains_gid(&gid));

    let p = good("NCCL_IB_ADDR_RANGE", "fd00:1::/32");
    let r = p.ib_addr_range.unwrap();
    assert_eq!(r.family, AddrFamily::Inet6);
    assert_eq!(
        p.gid_addr_range(),
        None,
        "family mismatch: NCCL ignores the range"
    );
    let v6: Ipv6Addr = "fd00:1:2::5".parse().unwrap();
    assert!(r.contains_gid(&Gid(v6.octets())));
    let v6: Ipv6Addr = "fd00:2::5".parse().unwrap();
    assert!(!r.contains_gid(&Gid(v6.octets())));
    assert!(AddrRange::parse("::/0")
        .unwrap()
        .contains_gid(&Gid([0xAB; 16])));
    assert!(AddrRange::parse("1.2.3.4/0")
        .unwrap()
        .contains_gid(&Gid([0xAB; 16])));
    assert!(AddrRange::parse("1.2.3.4/32").unwrap().contains_gid(&{
        let mut g = Gid([0; 16]);
        g.0[12..].copy_from_slice(&[1, 2, 3, 4]);
        g
    }));

    for b in [
        "10.0.0.0",
        "10.0.0.0/33",
        "::/129",
        "10.0.0/8",
        "10.0.0.0/x",
        "10.0.0.0/",
        "/8",
        "10.0.0.0/8/8",
        "10.0.0.0/+8",
        "host/8",
        "10.0.0.0/0008",
    ] {
        bad("NCCL_IB_ADDR_RANGE", b);
    }
}

/// NCCL_IB_HCA and NCCL_SOCKET_IFNAME keep their entries as written: only ASCII whitespace at
/// the ends of the value is dropped (a vertical tab or a no-break space is part of a name), so
/// ffi, which applies the stored value with the same grammar, selects what was validated.
#[test]
fn filter_lists_are_kept_as_written() {
    let p = good("NCCL_IB_HCA", " \tmlx5_0, mlx5_1:1\n");
    assert_eq!(p.ib_hca.as_str(), "mlx5_0, mlx5_1:1");
    let f = p.hca_filter();
    assert!(!f.matches("mlx5_1", 1) && f.matches(" mlx5_1", 1));
    let p = good("NCCL_SOCKET_IFNAME", "\u{b}eth0,ib\u{a0} ");
    assert_eq!(p.socket_ifname.as_str(), "\u{b}eth0,ib\u{a0}");
    let i = p.socket_ifname_filter();
    assert!(i.matches_name("\u{b}eth0") && !i.matches_name("eth0"));
    assert!(i.matches_name("ib\u{a0}0") && !i.matches_name("ib0"));
}

#[test]
fn strings() {
    let p = good("NCCL_IB_HCA", "^=mlx5_0:1,mlx5_1");
    assert_eq!(p.ib_hca.as_str(), "^=mlx5_0:1,mlx5_1");
    let f = p.hca_filter();
    assert!(!f.matches("mlx5_0", 1));
    assert!(f.matches("mlx5_0", 2));
    // NCCL 2.30's reading: never refused, a malformed entry is listed once and the rest applies.
    let p = good("NCCL_IB_HCA", "mlx5_0:x,,mlx5_1:1:2:3");
    assert_eq!(p.hca_filter().malformed().len(), 1);
    assert!(!p.hca_filter().matches("mlx5_0", 1) && !p.hca_filter().matches("mlx5_2", 1));
    assert_eq!(
        p.hca_filter()
            .select("mlx5_1", 1)
            .map(|i| (i.rail, i.plane)),
        Some((2, 3))
    );
    let long = "m".repeat(HCA_MAX_LEN + 1);
    bad("NCCL_IB_HCA", &long);
    let p = good("NCCL_SOCKET_IFNAME", "=eth0,ib0");
    assert!(p.socket_ifname_filter().matches_name("ib0"));
    assert!(!p.socket_ifname_filter().matches_name("eth01"));
    let long = "e".repeat(IFNAME_MAX_LEN + 1);
    bad("NCCL_SOCKET_IFNAME", &long);
    assert_eq!(good("IBNET_PROVIDER", "soft").provider, ProviderKind::Soft);
    assert_eq!(
        good("IBNET_PROVIDER", "verbs").provider,
        ProviderKind::Verbs
    );
    assert_eq!(good("IBNET_PROVIDER", "auto").provider, ProviderKind::Auto);
    bad("IBNET_PROVIDER", "Verbs");
    bad("IBNET_PROVIDER", "tcp");
}

#[test]
fn error_names_variable() {
    let mut p = Params::default();
    let e = p.set("NCCL_IB_TIMEOUT", "99").unwrap_err();
    let mut s = String::new();
    core::fmt::write(&mut s, format_args!("{e}")).unwrap();
    assert!(s.starts_with("NCCL_IB_TIMEOUT: "), "{s}");
}

#[test]
fn nccl_2_29_and_2_30_discovery_variables_parse_with_their_defaults_kept_on_error() {
    let p = Params::default();
    assert!(
        p.device_pci_order() && p.query_port_speed(),
        "NCCL's defaults: on"
    );
    assert!(!good("NCCL_IB_DEVICE_PCI_ORDER", "0").device_pci_order());
    assert!(!good("NCCL_IB_QUERY_PORT_SPEED", " 0 ").query_port_speed());
    for v in ["x", "1a", "", "0x"] {
        bad("NCCL_IB_DEVICE_PCI_ORDER", v);
        bad("NCCL_IB_QUERY_PORT_SPEED", v);
    }
    // ibnet's own knobs now live here too, with the table's ranges.
    assert_eq!(good("IBNET_HANDSHAKE_TIMEOUT", "5").handshake_timeout_s, 5);
    bad("IBNET_HANDSHAKE_TIMEOUT", "0");
    assert_eq!(good("IBNET_STALL_WARN", "0").stall_warn_s, 0);
    bad("IBNET_STALL_WARN", "-1");
    assert_eq!(good("IBNET_SOFT_FAULTS_DEV", "7").soft_faults_dev, Some(7));
    bad("IBNET_SOFT_FAULTS_DEV", "8");
    bad("IBNET_SOFT_DEVICES", "9");
    bad("IBNET_FORCE_FLUSH", "2");
    assert_eq!(
        (p.handshake_timeout_s, p.stall_warn_s, p.soft_devices),
        (60, 60, 1)
    );
}

#[test]
fn subnet_routing_variables_are_stored_and_the_prefix_len_range_is_nccls() {
    let mut p = Params::default();
    assert_eq!(p.set("NCCL_IB_SUBNET_AWARE_ROUTING", "1"), Ok(true));
    assert!(p.ib_subnet_aware_routing);
    assert_eq!(p.set("NCCL_IB_SUBNET_PREFIX_LEN", "16"), Ok(true));
    assert_eq!(p.ib_subnet_prefix_len, 16);
    assert_eq!(p.set("NCCL_IB_SUBNET_PREFIX_LEN", "32"), Ok(true));
    assert_eq!(p.set("NCCL_IB_SUBNET_PREFIX_LEN", "1"), Ok(true));
    for bad in ["0", "33", "64", "-1"] {
        assert_eq!(
            p.set("NCCL_IB_SUBNET_PREFIX_LEN", bad),
            Err(crate::Error::Param {
                name: "NCCL_IB_SUBNET_PREFIX_LEN",
                reason: "out of range"
            }),
            "{bad}"
        );
    }
    assert_eq!(p.ib_subnet_prefix_len, 1, "a refused value changes nothing");
}
