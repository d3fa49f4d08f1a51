//! Interim handshake message encoding of [`QpInfo`] (replaced by `ibnet_core::wire` when it
//! lands). Every length and count from the peer is validated before use.
//!
//! ```text
//!  u8 port | u8 link | u8 mtu | u8 sl | u8 tc | u8 has_fifo | u16 lid | gid[16]
//!  u64 fifo.addr | u32 fifo.rkey | u16 nqps | u16 addr_len | u32 qpn × nqps | addr bytes
//! ```

use ibnet_core::provider::{Gid, LinkLayer, Mtu, ProviderAddr, PROVIDER_ADDR_MAX};
use ibnet_core::wire::{QpInfo, RemoteBuf, MAX_QPS};
use ibnet_core::Error;

/// Largest encoded message.
pub const MAX_LEN: usize = 40 + 4 * MAX_QPS + PROVIDER_ADDR_MAX;

/// Encodes `q`.
pub fn encode(q: &QpInfo) -> Vec<u8> {
    let mut b = Vec::with_capacity(MAX_LEN);
    let fifo = q.fifo.unwrap_or_default();
    b.extend_from_slice(&[
        q.port,
        q.link_layer as u8,
        q.mtu as u8,
        q.sl,
        q.tc,
        q.fifo.is_some() as u8,
    ]);
    b.extend_from_slice(&q.lid.to_le_bytes());
    b.extend_from_slice(&q.gid.0);
    b.extend_from_slice(&fifo.addr.to_le_bytes());
    b.extend_from_slice(&fifo.rkey.to_le_bytes());
    b.extend_from_slice(&(q.qpn.len() as u16).to_le_bytes());
    b.extend_from_slice(&(q.addr.as_bytes().len() as u16).to_le_bytes());
    for n in &q.qpn {
        b.extend_from_slice(&n.to_le_bytes());
    }
    b.extend_from_slice(q.addr.as_bytes());
    b
}

fn bad(what: &'static str, value: u64) -> Error {
    Error::Wire { what, value }
}

/// Decodes and validates a peer's message.
pub fn decode(b: &[u8]) -> Result<QpInfo, Error> {
    if b.len() < 40 {
        return Err(bad("message length", b.len() as u64));
    }
    let u16at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let link_layer = match b[1] {
        1 => LinkLayer::Infiniband,
        2 => LinkLayer::Ethernet,
        v => return Err(bad("link layer", v as u64)),
    };
    let mtu = Mtu::from_raw(b[2]).ok_or(bad("mtu", b[2] as u64))?;
    let nqps = u16at(36) as usize;
    let alen = u16at(38) as usize;
    if nqps == 0 || nqps > MAX_QPS {
        return Err(bad("qp count", nqps as u64));
    }
    if alen > PROVIDER_ADDR_MAX {
        return Err(bad("provider address length", alen as u64));
    }
    if b.len() != 40 + 4 * nqps + alen {
        return Err(bad("message length", b.len() as u64));
    }
    let mut qpn = heapless::Vec::new();
    for i in 0..nqps {
        let o = 40 + 4 * i;
        let _ = qpn.push(u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]));
    }
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&b[8..24]);
    let mut a8 = [0u8; 8];
    a8.copy_from_slice(&b[24..32]);
    let rkey = u32::from_le_bytes([b[32], b[33], b[34], b[35]]);
    let fifo = match b[5] {
        0 => None,
        1 => Some(RemoteBuf {
            addr: u64::from_le_bytes(a8),
            rkey,
        }),
        v => return Err(bad("fifo flag", v as u64)),
    };
    let ao = 40 + 4 * nqps;
    Ok(QpInfo {
        port: b[0],
        link_layer,
        mtu,
        lid: u16at(6),
        gid: Gid(gid),
        sl: b[3],
        tc: b[4],
        qpn,
        fifo,
        addr: ProviderAddr::new(&b[ao..ao + alen]).ok_or(bad("provider address", alen as u64))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_rejects() {
        let mut qpn = heapless::Vec::new();
        qpn.push(7).unwrap();
        qpn.push(9).unwrap();
        let q = QpInfo {
            port: 1,
            link_layer: LinkLayer::Ethernet,
            mtu: Mtu::M4096,
            lid: 3,
            gid: Gid([5; 16]),
            sl: 1,
            tc: 106,
            qpn,
            fifo: Some(RemoteBuf {
                addr: 0x1000,
                rkey: 42,
            }),
            addr: ProviderAddr::new(b"abc").unwrap(),
        };
        let b = encode(&q);
        assert_eq!(decode(&b).unwrap(), q);
        assert!(matches!(decode(&b[..b.len() - 1]), Err(Error::Wire { .. })));
        let mut c = b.clone();
        c[36] = 0;
        c[37] = 0;
        assert!(matches!(
            decode(&c),
            Err(Error::Wire {
                what: "qp count",
                ..
            })
        ));
        let mut c = b.clone();
        c[2] = 9;
        assert!(matches!(decode(&c), Err(Error::Wire { what: "mtu", .. })));
    }
}
