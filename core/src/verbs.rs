//! The values a provider's verbs exchange: addresses, port facts, registrations, work requests
//! and completions. [`crate::provider`] re-exports all of them next to the `Provider` trait; they
//! live apart so that [`crate::error`] can name them without importing the trait's module (which
//! imports `error` for its `Result`).

use core::fmt;

/// A 16-byte GID (RoCE) or port GID (InfiniBand).
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Gid(pub [u8; 16]);

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", core::net::Ipv6Addr::from(self.0))
    }
}

/// The link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkLayer {
    /// InfiniBand (addressed by LID).
    Infiniband = 1,
    /// Ethernet: RoCE (addressed by GID).
    Ethernet = 2,
}

/// Path MTU, with the numbering of `enum ibv_mtu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    M256 = 1,
    /// 512 bytes.
    M512 = 2,
    /// 1024 bytes.
    M1024 = 3,
    /// 2048 bytes.
    M2048 = 4,
    /// 4096 bytes.
    M4096 = 5,
}

impl Mtu {
    /// From the `ibv_mtu` number; `None` outside 1..=5.
    pub fn from_raw(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::M256,
            2 => Self::M512,
            3 => Self::M1024,
            4 => Self::M2048,
            5 => Self::M4096,
            _ => return None,
        })
    }
    /// Bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// The largest provider address that travels in the handshake.
pub const PROVIDER_ADDR_MAX: usize = 64;

/// A provider's opaque address, exchanged in the handshake (soft: host id, pid, ring name;
/// verbs: unused).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ProviderAddr {
    len: u8,
    bytes: [u8; PROVIDER_ADDR_MAX],
}

impl ProviderAddr {
    /// The empty address.
    pub const EMPTY: Self = Self {
        len: 0,
        bytes: [0; PROVIDER_ADDR_MAX],
    };
    /// Copies `b`; `None` when longer than [`PROVIDER_ADDR_MAX`].
    pub fn new(b: &[u8]) -> Option<Self> {
        if b.len() > PROVIDER_ADDR_MAX {
            return None;
        }
        let mut a = Self::EMPTY;
        a.bytes[..b.len()].copy_from_slice(b);
        a.len = b.len() as u8;
        Some(a)
    }
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl Default for ProviderAddr {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl fmt::Debug for ProviderAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProviderAddr({} bytes)", self.len)
    }
}

/// What a provider reports about its port, for the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (1-based).
    pub port: u8,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// LID (InfiniBand).
    pub lid: u16,
    /// The GID in use (selected by `NCCL_IB_GID_INDEX` or auto-selection).
    pub gid: Gid,
    /// The GID's index.
    pub gid_index: u8,
    /// Active MTU.
    pub mtu: Mtu,
    /// Opaque provider address.
    pub addr: ProviderAddr,
}

/// Memory access rights of a registration (the `IBV_ACCESS_*` subset we use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    /// The local side may write (receive into) the region.
    pub local_write: bool,
    /// Peers may RDMA-WRITE into the region.
    pub remote_write: bool,
    /// Peers may RDMA-READ from the region.
    pub remote_read: bool,
    /// Ask for PCIe relaxed ordering (`IBV_ACCESS_RELAXED_ORDERING`).
    pub relaxed_ordering: bool,
}

impl Access {
    /// Local write, remote write and remote read: what data buffers and FIFOs get.
    pub const ALL: Self = Self {
        local_write: true,
        remote_write: true,
        remote_read: true,
        relaxed_ordering: false,
    };
}

/// How memory is registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegKind {
    /// Host or peer-memory-visible device memory by virtual address (`ibv_reg_mr[_iova2]`).
    Plain,
    /// A DMA-BUF: `fd` plus `offset` into it (`ibv_reg_dmabuf_mr`). The provider never keeps
    /// the fd past the call.
    DmaBuf {
        /// The DMA-BUF file descriptor.
        fd: i32,
        /// Offset of `addr` inside the DMA-BUF.
        offset: u64,
    },
}

/// The keys of a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MrKeys {
    /// Local key (for SGEs).
    pub lkey: u32,
    /// Remote key (for peers' RDMA access).
    pub rkey: u32,
}

/// Attributes for creating a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Largest inline payload (0: no inline sends).
    pub max_inline: u32,
    /// What the remote side may do to this QP's memory.
    pub access: Access,
}

/// What `connect_qp` needs to take a QP through INIT → RTR → RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectAttr {
    /// The remote QP number.
    pub remote_qpn: u32,
    /// The remote LID (InfiniBand).
    pub remote_lid: u16,
    /// The remote GID (RoCE, or InfiniBand with GRH).
    pub remote_gid: Gid,
    /// The remote provider address.
    pub remote_addr: ProviderAddr,
    /// Link layer (both sides must agree).
    pub link_layer: LinkLayer,
    /// Negotiated path MTU.
    pub mtu: Mtu,
    /// Local GID index for the GRH.
    pub gid_index: u8,
    /// Local ack timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// Service level.
    pub sl: u8,
    /// Traffic class.
    pub tc: u8,
    /// Partition key index.
    pub pkey_index: u16,
}

/// Enhanced connection establishment options of a QP (`struct ibv_ece`), as
/// `ibv_query_ece` reports them and `ibv_set_ece` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ece {
    /// The vendor (PCI vendor id).
    pub vendor_id: u32,
    /// Vendor-specific option bits.
    pub options: u32,
    /// Must be 0 (reserved by verbs).
    pub comp_mask: u32,
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrOpcode {
    /// RDMA WRITE: local SGE → remote address.
    Write,
    /// RDMA WRITE with immediate: consumes one posted receive at the target.
    WriteWithImm,
    /// RDMA READ: remote address → local SGE.
    Read,
}

/// One scatter-gather element (the local side of a WR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Local virtual address.
    pub addr: u64,
    /// Length in bytes (0: the WR carries no payload).
    pub len: u32,
    /// Local key of the registration covering `[addr, addr + len)`.
    pub lkey: u32,
}

/// A send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: WrOpcode,
    /// The local buffer; `len == 0` means no payload.
    pub sge: Sge,
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Immediate (only for `WriteWithImm`).
    pub imm: u32,
    /// Generate a completion on the initiator.
    pub signaled: bool,
    /// Copy the payload at post time (`IBV_SEND_INLINE`); the SGE may be reused at once.
    pub inline: bool,
}

impl SendWr {
    /// A zeroed WR (opcode `Write`, no payload, unsignaled).
    pub const EMPTY: Self = Self {
        wr_id: 0,
        opcode: WrOpcode::Write,
        sge: Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        },
        remote_addr: 0,
        rkey: 0,
        imm: 0,
        signaled: false,
        inline: false,
    };
}

/// Completion status, numbered as `enum ibv_wc_status` (every value verbs defines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum WcStatus {
    /// Success.
    Success = 0,
    /// Local length error (e.g. a receive too small).
    LocalLengthError = 1,
    /// Local QP operation error.
    LocalQpOpError = 2,
    /// Local EE context operation error.
    LocalEecOpError = 3,
    /// Local protection error (bad lkey).
    LocalProtectionError = 4,
    /// Flushed: the QP was in the error state.
    WrFlushError = 5,
    /// Memory window bind error.
    MwBindError = 6,
    /// Bad response.
    BadResponseError = 7,
    /// Local access error.
    LocalAccessError = 8,
    /// Remote invalid request.
    RemoteInvalidRequest = 9,
    /// Remote access error (bad rkey, out of range).
    RemoteAccessError = 10,
    /// Remote operation error.
    RemoteOperationError = 11,
    /// Transport retry counter exceeded (the peer is unreachable or dead).
    RetryExceeded = 12,
    /// RNR retry counter exceeded (no receive posted at the peer).
    RnrRetryExceeded = 13,
    /// Local RDD violation.
    LocalRddViolation = 14,
    /// Remote invalid RD request.
    RemoteInvalidRdRequest = 15,
    /// Remote aborted.
    RemoteAbortError = 16,
    /// Invalid EE context number.
    InvalidEecn = 17,
    /// Invalid EE context state.
    InvalidEecState = 18,
    /// Fatal error.
    Fatal = 19,
    /// Response timeout.
    ResponseTimeout = 20,
    /// General error (also any value verbs does not define).
    General = 21,
}

impl WcStatus {
    /// From the raw `ibv_wc_status`; unknown values map to `General`.
    pub fn from_raw(v: u32) -> Self {
        use WcStatus::*;
        const ALL: [WcStatus; 22] = [
            Success,
            LocalLengthError,
            LocalQpOpError,
            LocalEecOpError,
            LocalProtectionError,
            WrFlushError,
            MwBindError,
            BadResponseError,
            LocalAccessError,
            RemoteInvalidRequest,
            RemoteAccessError,
            RemoteOperationError,
            RetryExceeded,
            RnrRetryExceeded,
            LocalRddViolation,
            RemoteInvalidRdRequest,
            RemoteAbortError,
            InvalidEecn,
            InvalidEecState,
            Fatal,
            ResponseTimeout,
            General,
        ];
        ALL.get(v as usize).copied().unwrap_or(General)
    }

    /// The verbs name (`IBV_WC_RETRY_EXC_ERR`), as NCCL 2.28 prints it.
    pub fn name(self) -> &'static str {
        use WcStatus::*;
        match self {
            Success => "IBV_WC_SUCCESS",
            LocalLengthError => "IBV_WC_LOC_LEN_ERR",
            LocalQpOpError => "IBV_WC_LOC_QP_OP_ERR",
            LocalEecOpError => "IBV_WC_LOC_EEC_OP_ERR",
            LocalProtectionError => "IBV_WC_LOC_PROT_ERR",
            WrFlushError => "IBV_WC_WR_FLUSH_ERR",
            MwBindError => "IBV_WC_MW_BIND_ERR",
            BadResponseError => "IBV_WC_BAD_RESP_ERR",
            LocalAccessError => "IBV_WC_LOC_ACCESS_ERR",
            RemoteInvalidRequest => "IBV_WC_REM_INV_REQ_ERR",
            RemoteAccessError => "IBV_WC_REM_ACCESS_ERR",
            RemoteOperationError => "IBV_WC_REM_OP_ERR",
            RetryExceeded => "IBV_WC_RETRY_EXC_ERR",
            RnrRetryExceeded => "IBV_WC_RNR_RETRY_EXC_ERR",
            LocalRddViolation => "IBV_WC_LOC_RDD_VIOL_ERR",
            RemoteInvalidRdRequest => "IBV_WC_REM_INV_RD_REQ_ERR",
            RemoteAbortError => "IBV_WC_REM_ABORT_ERR",
            InvalidEecn => "IBV_WC_INV_EECN_ERR",
            InvalidEecState => "IBV_WC_INV_EEC_STATE_ERR",
            Fatal => "IBV_WC_FATAL_ERR",
            ResponseTimeout => "IBV_WC_RESP_TIMEOUT_ERR",
            General => "IBV_WC_GENERAL_ERR",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// An asynchronous event that made a device, or one comm's QP or CQ, unusable (verbs:
/// `IBV_EVENT_DEVICE_FATAL`; a QP or CQ error event), as [`crate::provider::Provider::async_failure`]
/// reports it to the data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncFailure {
    /// A device-fatal event: every comm on the device fails.
    Device,
    /// An error event on this comm's QP or CQ.
    Comm,
}

/// Completion opcode, numbered as `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum WcOpcode {
    /// A send.
    Send = 0,
    /// An RDMA WRITE (with or without immediate) on the initiator.
    RdmaWrite = 1,
    /// An RDMA READ on the initiator.
    RdmaRead = 2,
    /// A receive consumed by a plain send.
    Recv = 128,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
    /// Not one of the above: only in a failed completion, whose opcode verbs leaves undefined.
    Unknown = u32::MAX,
}

impl WcOpcode {
    /// The verbs name (`IBV_WC_RDMA_WRITE`), as NCCL 2.28 prints it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Send => "IBV_WC_SEND",
            Self::RdmaWrite => "IBV_WC_RDMA_WRITE",
            Self::RdmaRead => "IBV_WC_RDMA_READ",
            Self::Recv => "IBV_WC_RECV",
            Self::RecvRdmaWithImm => "IBV_WC_RECV_RDMA_WITH_IMM",
            Self::Unknown => "UNKNOWN_OPCODE",
        }
    }
}

/// A device name for error messages (`mlx5_0`): up to [`DevName::MAX`] bytes, `Copy`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DevName {
    len: u8,
    bytes: [u8; DevName::MAX],
}

impl DevName {
    /// Longest name kept (longer ones are cut at a character boundary).
    pub const MAX: usize = 16;
    /// No name.
    pub const EMPTY: Self = Self {
        len: 0,
        bytes: [0; Self::MAX],
    };
    /// Copies `s`, cut to [`DevName::MAX`] bytes.
    pub fn new(s: &str) -> Self {
        let mut n = s.len().min(Self::MAX);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        let mut d = Self::EMPTY;
        d.bytes[..n].copy_from_slice(&s.as_bytes()[..n]);
        d.len = n as u8;
        d
    }
    /// The name.
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("?")
    }
}

impl Default for DevName {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl fmt::Debug for DevName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for DevName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The WR's `wr_id`.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: the length of the write with immediate).
    pub byte_len: u32,
    /// The immediate (receives of `WriteWithImm`).
    pub imm: u32,
    /// Vendor error code.
    pub vendor_err: u32,
    /// The local QP number the completion belongs to.
    pub qp_num: u32,
}

impl Completion {
    /// A zeroed successful completion, for initialising arrays.
    pub const EMPTY: Self = Self {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: 0,
        vendor_err: 0,
        qp_num: 0,
    };
}
