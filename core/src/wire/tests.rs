//! Round trips and corruption tests for every wire message.

use super::*;

fn info(nqps: usize, addr: &[u8], fifo: bool) -> QpInfo {
    let mut qpn = heapless::Vec::new();
    for i in 0..nqps {
        qpn.push(0x00AB_CD00 + i as u32).unwrap();
    }
    QpInfo {
        port: 1,
        link_layer: LinkLayer::Ethernet,
        mtu: Mtu::M4096,
        lid: 0x1234,
        gid: Gid([0xFE, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]),
        sl: 3,
        tc: 106,
        qpn,
        fifo: fifo.then_some(RemoteBuf {
            addr: 0x7F00_1234_5640,
            rkey: 0xDEAD_BEEF,
        }),
        addr: ProviderAddr::new(addr).unwrap(),
        ece: heapless::Vec::new(),
    }
}

fn enc(i: &QpInfo) -> heapless::Vec<u8, QP_INFO_MAX_LEN> {
    let mut b = [0u8; QP_INFO_MAX_LEN];
    let n = i.encode(&mut b).unwrap();
    assert_eq!(n, i.encoded_len());
    heapless::Vec::from_slice(&b[..n]).unwrap()
}

fn wire_err(r: Result<impl core::fmt::Debug>) -> &'static str {
    match r {
        Err(Error::Wire { what, .. }) => what,
        other => panic!("expected Error::Wire, got {other:?}"),
    }
}

#[test]
fn qp_info_round_trips() {
    for (n, a, f) in [
        (1, &b""[..], true),
        (4, &b"soft:host:42"[..], false),
        (MAX_QPS, &[7u8; 64][..], true),
    ] {
        let i = info(n, a, f);
        let b = enc(&i);
        assert_eq!(QpInfo::frame_len(&b[..QP_INFO_HEADER_LEN]), Ok(b.len()));
        assert_eq!(QpInfo::decode(&b), Ok(i));
    }
    let mut i = info(2, b"", false);
    i.link_layer = LinkLayer::Infiniband;
    i.mtu = Mtu::M256;
    i.sl = 15;
    i.port = 255;
    i.qpn[1] = MAX_QPN;
    assert_eq!(QpInfo::decode(&enc(&i)), Ok(i));
    let mut full = info(MAX_QPS, &[0; 64], true);
    for q in 0..MAX_QPS as u32 {
        full.ece
            .push(Ece {
                vendor_id: 0x02c9,
                options: q,
                comp_mask: 0,
            })
            .unwrap();
    }
    assert_eq!(full.encoded_len(), QP_INFO_MAX_LEN);
    assert_eq!(QpInfo::decode(&enc(&full)), Ok(full));
}

#[test]
fn qp_info_ece_is_one_entry_per_qp() {
    let mut i = info(2, b"ab", false);
    let e = Ece {
        vendor_id: 0x15b3,
        options: 0x3000_0000,
        comp_mask: 0,
    };
    i.ece.push(e).unwrap();
    // One entry for two QPs: refused locally, never sent.
    assert!(matches!(
        i.encode(&mut [0u8; QP_INFO_MAX_LEN]),
        Err(Error::OutOfRange { .. })
    ));
    i.ece.push(e).unwrap();
    let b = enc(&i);
    assert_eq!(b[13], 2, "ECE flag");
    assert_eq!(b.len(), QP_INFO_HEADER_LEN + 2 * 4 + 2 + 2 * 12);
    assert_eq!(&b[b.len() - 12..b.len() - 8], &0x15b3u32.to_le_bytes());
    assert_eq!(QpInfo::decode(&b), Ok(i.clone()));
    // The flag without the entries (or the entries without the flag) is a length error.
    let mut no_flag = b.clone();
    no_flag[13] = 0;
    assert_eq!(wire_err(QpInfo::decode(&no_flag)), "QpInfo length");
    let mut short = enc(&info(2, b"ab", false));
    short[13] = 2;
    assert_eq!(wire_err(QpInfo::decode(&short)), "QpInfo length");
}

#[test]
fn qp_info_layout_is_little_endian() {
    let b = enc(&info(1, b"xy", true));
    assert_eq!(&b[..4], b"IBNQ");
    assert_eq!(&b[4..6], &[6, 0]);
    assert_eq!(&b[6..8], &(b.len() as u16).to_le_bytes());
    assert_eq!(&b[14..16], &[0x34, 0x12]);
    assert_eq!(&b[48..52], &0x00AB_CD00u32.to_le_bytes());
    assert_eq!(&b[52..], b"xy");
}

#[test]
fn qp_info_encode_rejects_bad_local_values() {
    let mut small = [0u8; QP_INFO_HEADER_LEN + 3];
    assert!(matches!(
        info(1, b"", true).encode(&mut small),
        Err(Error::Full { .. })
    ));
    let mut buf = [0u8; QP_INFO_MAX_LEN];
    let mut i = info(1, b"", true);
    i.qpn.clear();
    assert!(matches!(
        i.encode(&mut buf),
        Err(Error::OutOfRange {
            what: "local nqps",
            ..
        })
    ));
    let mut i = info(1, b"", true);
    i.port = 0;
    assert!(matches!(i.encode(&mut buf), Err(Error::OutOfRange { .. })));
    let mut i = info(1, b"", true);
    i.sl = 16;
    assert!(matches!(i.encode(&mut buf), Err(Error::OutOfRange { .. })));
    let mut i = info(1, b"", true);
    i.qpn[0] = MAX_QPN + 1;
    assert!(matches!(i.encode(&mut buf), Err(Error::OutOfRange { .. })));
    let mut i = info(1, b"", true);
    i.fifo = Some(RemoteBuf { addr: 0, rkey: 1 });
    assert!(matches!(i.encode(&mut buf), Err(Error::Missing { .. })));
}

#[test]
fn qp_info_truncated_at_every_length() {
    let b = enc(&info(3, b"abc", true));
    for n in 0..b.len() {
        assert!(
            matches!(QpInfo::decode(&b[..n]), Err(Error::Wire { .. })),
            "len {n}"
        );
    }
    let mut long = b.clone();
    long.push(0).unwrap();
    assert_eq!(
        wire_err(QpInfo::decode(&long)),
        "trailing bytes after message"
    );
}

/// Patches one header byte and checks the named rejection.
fn patched(off: usize, v: u8) -> &'static str {
    let mut b = enc(&info(2, b"ab", true));
    b[off] = v;
    wire_err(QpInfo::decode(&b))
}

#[test]
fn qp_info_every_field_is_validated() {
    assert_eq!(patched(0, b'X'), "QpInfo magic");
    // A version-2 peer (no sizes FIFO in the answer) is refused.
    assert_eq!(patched(4, 2), "wire version");
    // A version-5 peer (no GIDs in the handle, scratch at 64) is refused.
    assert_eq!(patched(4, 5), "wire version");
    assert_eq!(patched(5, 1), "wire version");
    assert_eq!(patched(6, 0), "QpInfo length");
    assert_eq!(patched(7, 1), "QpInfo length");
    assert_eq!(patched(8, 0), "port");
    assert_eq!(patched(9, 0), "link layer");
    assert_eq!(patched(9, 3), "link layer");
    assert_eq!(patched(10, 0), "mtu");
    assert_eq!(patched(10, 6), "mtu");
    assert_eq!(patched(11, 16), "sl");
    assert_eq!(patched(13, 4), "flags");
    assert_eq!(patched(13, 0x81), "flags");
    assert_eq!(patched(32, 0), "nqps");
    assert_eq!(patched(32, MAX_QPS as u8 + 1), "nqps");
    assert_eq!(
        patched(32, 3),
        "QpInfo length",
        "count disagrees with length"
    );
    assert_eq!(
        patched(33, PROVIDER_ADDR_MAX as u8 + 1),
        "provider address length"
    );
    assert_eq!(patched(33, 3), "QpInfo length");
    assert_eq!(patched(34, 1), "reserved byte not zero (offset)");
    assert_eq!(patched(35, 1), "reserved byte not zero (offset)");
    assert_eq!(patched(51, 1), "qpn", "qpn above 24 bits");
    // FIFO flag consistency.
    let mut b = enc(&info(1, b"", false));
    b[36] = 1;
    assert_eq!(
        wire_err(QpInfo::decode(&b)),
        "fifo address without FIFO flag"
    );
    let mut b = enc(&info(1, b"", false));
    b[44] = 1;
    assert_eq!(wire_err(QpInfo::decode(&b)), "fifo rkey without FIFO flag");
    let mut b = enc(&info(1, b"", false));
    b[13] = 1;
    assert_eq!(wire_err(QpInfo::decode(&b)), "fifo address");
    // A short header cannot be framed.
    let b = enc(&info(1, b"", true));
    assert!(QpInfo::frame_len(&b[..QP_INFO_HEADER_LEN - 1]).is_err());
}

/// Every single-bit flip of a message is rejected, or decodes to a value that re-encodes to
/// exactly the flipped bytes (a flip in a free field such as the GID). Never a panic.
#[test]
fn qp_info_every_bit_flip() {
    for i in [info(2, b"addr", true), info(1, b"", false)] {
        let b = enc(&i);
        for byte in 0..b.len() {
            for bit in 0..8 {
                let mut c = b.clone();
                c[byte] ^= 1 << bit;
                if let Ok(d) = QpInfo::decode(&c) {
                    assert_eq!(&enc(&d)[..], &c[..], "byte {byte} bit {bit}");
                }
            }
        }
    }
}

/// Small deterministic generator (xorshift64*) for the random-bytes test below.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let valid = enc(&info(4, b"soft", true));
    let mut buf = [0u8; QP_INFO_MAX_LEN + 8];
    for round in 0..20_000 {
        let len = (rng.next() as usize) % buf.len();
        if round % 2 == 0 {
            // Pure noise, with the right magic half of the time so deeper checks are reached.
            for x in buf.iter_mut() {
                *x = rng.next() as u8;
            }
            if round % 4 == 0 {
                buf[..8].copy_from_slice(&valid[..8]);
            }
        } else {
            // A valid message with a few random byte mutations.
            buf[..valid.len()].copy_from_slice(&valid);
            for _ in 0..1 + rng.next() % 4 {
                let at = rng.next() as usize % valid.len();
                buf[at] = rng.next() as u8;
            }
        }
        let b = &buf[..len];
        if let Ok(d) = QpInfo::decode(b) {
            assert_eq!(&enc(&d)[..], b);
        }
        let _ = QpInfo::frame_len(b);
        let _ = Hello::decode(b);
        let _ = check_ready(b);
        if let Ok(h) = ConnectHandle::decode(b) {
            let mut o = [0u8; NCCL_NET_HANDLE_MAXSIZE];
            h.encode(&mut o).unwrap();
            assert_eq!(ConnectHandle::decode(&o), Ok(h));
        }
    }
}

#[test]
fn hello_and_ready() {
    let h = Hello {
        nonce: 0x0123_4567_89AB_CDEF,
    };
    let b = h.encode();
    assert_eq!(Hello::decode(&b), Ok(h));
    for n in 0..HELLO_LEN {
        assert!(matches!(Hello::decode(&b[..n]), Err(Error::Wire { .. })));
    }
    let mut c = b;
    c[0] ^= 1;
    assert_eq!(wire_err(Hello::decode(&c)), "Hello magic");
    let mut c = b;
    c[4] = 9;
    assert_eq!(wire_err(Hello::decode(&c)), "wire version");
    let mut c = b;
    c[6] = 1;
    assert_eq!(
        wire_err(Hello::decode(&c)),
        "reserved byte not zero (offset)"
    );
    let mut long = [0u8; HELLO_LEN + 1];
    long[..HELLO_LEN].copy_from_slice(&b);
    assert_eq!(
        wire_err(Hello::decode(&long)),
        "trailing bytes after message"
    );

    let r = ready_bytes();
    assert_eq!(check_ready(&r), Ok(()));
    for n in 0..READY_LEN {
        assert!(matches!(check_ready(&r[..n]), Err(Error::Wire { .. })));
    }
    let mut c = r;
    c[3] ^= 0x20;
    assert_eq!(wire_err(check_ready(&c)), "Ready magic");
    let mut c = r;
    c[7] = 1;
    assert!(check_ready(&c).is_err());
    // Messages are not interchangeable.
    assert_eq!(wire_err(check_ready(&b[..READY_LEN])), "Ready magic");
    assert_eq!(
        wire_err(QpInfo::decode(&enc(&info(1, b"", true))[..]).and(Hello::decode(&r))),
        "Hello magic"
    );
}

fn handles() -> [ConnectHandle; 3] {
    [
        ConnectHandle {
            addr: "10.1.2.3:40123".parse().unwrap(),
            nonce: 7,
            provider: 1,
            gids: [Gid::default(); HANDLE_GIDS],
        },
        ConnectHandle {
            addr: "[fe80::1%3]:5".parse().unwrap(),
            nonce: u64::MAX,
            provider: 2,
            gids: [Gid([0xA5; 16]), Gid::default()],
        },
        ConnectHandle {
            addr: SocketAddr::V6(SocketAddrV6::new(
                "2001:db8::9".parse().unwrap(),
                65535,
                0xABCDE,
                0,
            )),
            nonce: 0,
            provider: 0,
            gids: [
                Gid(core::array::from_fn(|i| i as u8 + 1)),
                Gid(core::array::from_fn(|i| 0xF0 - i as u8)),
            ],
        },
    ]
}

#[test]
fn handle_round_trips_and_fits() {
    const _: () = assert!(HANDLE_ENCODED_LEN <= NCCL_NET_HANDLE_MAXSIZE);
    for h in handles() {
        let mut b = [0xEEu8; NCCL_NET_HANDLE_MAXSIZE];
        assert_eq!(h.encode(&mut b), Ok(HANDLE_ENCODED_LEN));
        assert!(
            b[HANDLE_ENCODED_LEN..].iter().all(|&x| x == 0),
            "tail and scratch zeroed"
        );
        assert_eq!(ConnectHandle::decode(&b), Ok(h));
        assert_eq!(ConnectHandle::decode(&b[..HANDLE_ENCODED_LEN]), Ok(h));
        // The scratch area belongs to the connecting side and is ignored.
        b[HANDLE_SCRATCH_OFFSET..].fill(0x5A);
        assert_eq!(ConnectHandle::decode(&b), Ok(h));
    }
    let mut small = [0u8; HANDLE_ENCODED_LEN - 1];
    assert!(matches!(
        handles()[0].encode(&mut small),
        Err(Error::Full { .. })
    ));
    let zero_port = ConnectHandle {
        addr: "1.2.3.4:0".parse().unwrap(),
        nonce: 1,
        provider: 0,
        gids: [Gid::default(); HANDLE_GIDS],
    };
    assert!(matches!(
        zero_port.encode(&mut [0u8; 128]),
        Err(Error::OutOfRange { .. })
    ));
}

#[test]
fn handle_rejects_corruption() {
    let mut good = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    handles()[0].encode(&mut good).unwrap();
    for n in 0..HANDLE_ENCODED_LEN {
        assert!(
            matches!(ConnectHandle::decode(&good[..n]), Err(Error::Wire { .. })),
            "len {n}"
        );
    }
    let cases: [(usize, u8, &str); 9] = [
        (0, b'X', "handle magic"),
        (4, 0, "wire version"),
        (6, 5, "handle address family"),
        (6, 0, "handle address family"),
        (8, 0, "reserved byte not zero (offset)"), // port byte patched below instead
        (10, 1, "reserved byte not zero (offset)"),
        (16, 1, "IPv4 handle with IPv6 fields"),
        (28, 1, "IPv4 handle with IPv6 fields"),
        (78, 1, "reserved byte not zero (offset)"),
    ];
    for (off, v, what) in cases {
        if off == 8 {
            continue;
        }
        let mut b = good;
        b[off] = v;
        assert_eq!(wire_err(ConnectHandle::decode(&b)), what, "offset {off}");
    }
    let mut b = good;
    b[8] = 0;
    b[9] = 0;
    assert_eq!(wire_err(ConnectHandle::decode(&b)), "handle port");
    // A foreign handle (e.g. NCCL's own IB handle: a sockaddr first) is rejected.
    let mut foreign = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    foreign[0] = 2; // AF_INET
    assert_eq!(wire_err(ConnectHandle::decode(&foreign)), "handle magic");
}

#[test]
fn handle_carries_two_gids_before_the_scratch_area() {
    const _: () = assert!(HANDLE_ENCODED_LEN + 4 == HANDLE_SCRATCH_OFFSET);
    let h = handles()[2];
    let mut b = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    h.encode(&mut b).unwrap();
    assert_eq!(b[44..60], h.gids[0].0, "GID 0 at 44");
    assert_eq!(b[60..76], h.gids[1].0, "GID 1 at 60");
    assert_eq!(u16::from_le_bytes([b[4], b[5]]), WIRE_VERSION);
    // Bytes 64..80 were scratch before version 6: now they are GID 1 and reserved.
    let mut c = b;
    c[64] ^= 0xFF;
    assert_ne!(ConnectHandle::decode(&c).unwrap().gids[1], h.gids[1]);
    // A connector's token in the scratch area leaves the GIDs alone.
    let mut c = b;
    c[HANDLE_SCRATCH_OFFSET..HANDLE_SCRATCH_OFFSET + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(ConnectHandle::decode(&c), Ok(h));
}
