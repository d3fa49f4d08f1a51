//! Handshake messages on the wire.
//!
//! (Encoding and validation: see the helper's work; the types below are the contract that
//! `comm` and `handshake` share.)

use crate::provider::{Gid, LinkLayer, Mtu, ProviderAddr};

/// Most QPs one comm may use (`NCCL_IB_QPS_PER_CONNECTION` ≤ 128, as NCCL's `NCCL_IB_MAX_QPS`).
pub const MAX_QPS: usize = 128;

/// Where a peer may write: a registered buffer's address and rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteBuf {
    /// Address in the peer's memory.
    pub addr: u64,
    /// The registration's rkey.
    pub rkey: u32,
}

/// What one side of a comm tells the other: its QPs and how to reach them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpInfo {
    /// Port number.
    pub port: u8,
    /// Link layer of the port.
    pub link_layer: LinkLayer,
    /// Active MTU (the acceptor answers with the negotiated minimum).
    pub mtu: Mtu,
    /// LID (InfiniBand).
    pub lid: u16,
    /// GID in use.
    pub gid: Gid,
    /// Service level the sender asks for.
    pub sl: u8,
    /// Traffic class the sender asks for.
    pub tc: u8,
    /// QP numbers, one per QP of the comm.
    pub qpn: heapless::Vec<u32, MAX_QPS>,
    /// The sender's FIFO (set by the connecting/sending side only).
    pub fifo: Option<RemoteBuf>,
    /// The provider's opaque address.
    pub addr: ProviderAddr,
}
