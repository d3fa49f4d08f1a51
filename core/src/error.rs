//! The core's one error type.
//!
//! Every fallible operation in `ibnet-core` returns [`Error`]. Each variant carries the context
//! an operator needs in a single log line: what failed, the capacity or value involved, and the
//! peer where there is one. The core does not know `ncclResult_t`; [`Error::kind`] classifies an
//! error so that `ibnet-ffi` maps it to the result code NCCL's plugin README prescribes.

use core::fmt;

use crate::verbs::{AsyncFailure, DevName, Gid, WcOpcode, WcStatus};

/// `Result` with the core's [`Error`].
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// How an error should be reported to NCCL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A network or system failure (NCCL: `ncclSystemError`).
    System,
    /// The caller broke the plugin contract, or an internal invariant failed
    /// (NCCL: `ncclInternalError`).
    Internal,
    /// A user or configuration error, e.g. mismatched collectives (NCCL: `ncclInvalidUsage`).
    InvalidUsage,
    /// An argument out of range (NCCL: `ncclInvalidArgument`).
    InvalidArgument,
    /// A completion or the peer reported an error (NCCL: `ncclRemoteError`).
    Remote,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::System => "system",
            Self::Internal => "internal",
            Self::InvalidUsage => "invalid usage",
            Self::InvalidArgument => "invalid argument",
            Self::Remote => "remote",
        })
    }
}

/// Who is on the other end of a comm, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerId {
    /// The peer's GID (RoCE) or all zeros (InfiniBand without GRH).
    pub gid: Gid,
    /// The peer's LID (InfiniBand) or 0.
    pub lid: u16,
    /// The peer's first QP number.
    pub qpn: u32,
    /// The peer's socket address (its end of the bootstrap connection), once known.
    pub addr: Option<core::net::SocketAddr>,
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(a) = self.addr {
            write!(f, "{a} ")?;
        }
        write!(
            f,
            "gid {} lid {} qpn {:#x}",
            core::net::Ipv6Addr::from(self.gid.0),
            self.lid,
            self.qpn
        )
    }
}

/// Which side of a comm a completion error hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqType {
    /// An `isend` request.
    Send,
    /// An `irecv` request.
    Recv,
    /// An `iflush` request.
    Flush,
}

impl fmt::Display for ReqType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Send => "Send",
            Self::Recv => "Recv",
            Self::Flush => "Flush",
        })
    }
}

/// Every error the core can report. Variants carry context; `Display` writes one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A fixed-capacity structure is full.
    Full {
        /// What is full ("request pool", "MR cache", …).
        what: &'static str,
        /// Its capacity.
        cap: usize,
    },
    /// An argument is out of range.
    OutOfRange {
        /// Which argument.
        what: &'static str,
        /// The value given.
        value: i64,
        /// Smallest accepted value.
        min: i64,
        /// Largest accepted value.
        max: i64,
    },
    /// A list names the same value twice (a physical device twice in one virtual NIC).
    Repeated {
        /// What the value is ("physical device").
        what: &'static str,
        /// The list ("the virtual NIC's devs").
        list: &'static str,
        /// The value named twice.
        value: i64,
        /// Where the list first names it.
        first: usize,
        /// Where the list names it again.
        again: usize,
    },
    /// A required argument is missing (a NULL pointer from C, an empty list).
    Missing {
        /// Which argument.
        what: &'static str,
    },
    /// An operation was called in a state that does not allow it.
    BadState {
        /// The operation.
        op: &'static str,
        /// The state it found.
        state: &'static str,
    },
    /// A request handle that is not (or no longer) live on this comm.
    StaleRequest {
        /// The pool index the handle named.
        idx: u16,
    },
    /// A send is larger than the receive the peer posted for it (a collective mismatch).
    SizeMismatch {
        /// Bytes the local side sends.
        send: u64,
        /// Bytes the peer posted to receive.
        recv: u64,
        /// The tag both sides used.
        tag: u32,
        /// The receive's index inside its multi-receive.
        index: u8,
        /// How many receives the multi-receive had.
        nreqs: u8,
        /// The peer.
        peer: PeerId,
    },
    /// The peer posted a FIFO element that cannot be valid.
    BadFifoElem {
        /// Which field is wrong.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The peer.
        peer: PeerId,
    },
    /// The peer reported a received size that cannot be (larger than the buffer posted, or
    /// disagreeing with its immediate).
    BadSize {
        /// The receive's index inside its multi-receive.
        index: u8,
        /// The size the peer reported.
        size: u64,
        /// The size this side posted.
        posted: u64,
        /// The peer.
        peer: PeerId,
    },
    /// A work completion with an error status.
    Completion {
        /// The completion status.
        status: WcStatus,
        /// The completion opcode.
        opcode: WcOpcode,
        /// Vendor error code.
        vendor_err: u32,
        /// The request type the completion belongs to.
        req: ReqType,
        /// The peer.
        peer: PeerId,
        /// The local GID (for RoCE diagnostics).
        local_gid: Gid,
        /// The local device (HCA) name.
        hca: DevName,
        /// The local QP the completion belongs to.
        local_qpn: u32,
        /// The request's size: a send's size, else the completion's byte length (NCCL 2.28's
        /// `reqSize`).
        size: u64,
    },
    /// A completion named a request that is not live: the provider or the peer is confused.
    BogusCompletion {
        /// The completion's `wr_id`.
        wr_id: u64,
    },
    /// A provider call failed.
    Provider {
        /// The call that failed (`"ibv_create_qp"`, `"process_vm_writev"`, …).
        call: &'static str,
        /// The OS error number, or 0.
        errno: i32,
    },
    /// The peer's handshake message is malformed or hostile.
    Wire {
        /// The field or check that failed.
        what: &'static str,
        /// The offending value.
        value: u64,
    },
    /// A configuration value (environment variable) is malformed.
    Param {
        /// The variable's name.
        name: &'static str,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The comm has failed earlier (a fatal completion or async event, a dead peer) and accepts
    /// no more work; reported as its first failure was (`cause`).
    Poisoned {
        /// The operation refused.
        op: &'static str,
        /// The first failure's kind: this refusal is reported the same way.
        cause: ErrorKind,
    },
    /// The peer took a rail of a comm of several rails out of use (it failed at its end, or
    /// its traffic went to another rail there): this end takes the rail out of use too.
    RailDroppedByPeer {
        /// What the peer did, as a phrase ("the sender moved this rail's traffic to another
        /// rail").
        what: &'static str,
    },
    /// The peer closed or stopped responding.
    PeerGone {
        /// The peer.
        peer: PeerId,
    },
    /// An asynchronous event made the device (or this comm's QP or CQ) unusable; found by a
    /// data call (NCCL checks its fatal-event counter in every data call too).
    AsyncEvent {
        /// What failed.
        what: AsyncFailure,
        /// The comm's device.
        dev: DevName,
        /// The comm's peer.
        peer: PeerId,
    },
    /// No valid GID of a RoCE port is of `NCCL_IB_ADDR_FAMILY` and inside
    /// `NCCL_IB_ADDR_RANGE`, which the user set (`crate::policy::gid`): the port is not used,
    /// or a connection on it fails.
    NoGid {
        /// The device.
        dev: DevName,
        /// The port.
        port: u8,
        /// The family asked for is `AF_INET6` (else `AF_INET`).
        inet6: bool,
        /// The range asked for, in that family (IPv4 in the first 4 bytes), and its prefix
        /// length; `None`: unset.
        range: Option<(Gid, u8)>,
    },
}

impl Error {
    /// How this error is reported to NCCL.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Full { .. } | Self::BadState { .. } | Self::StaleRequest { .. } => {
                ErrorKind::Internal
            }
            Self::BogusCompletion { .. } | Self::Missing { .. } => ErrorKind::Internal,
            // The peer broke the protocol: reported like any other failure of the remote side.
            Self::BadFifoElem { .. } | Self::BadSize { .. } => ErrorKind::Remote,
            Self::OutOfRange { .. } | Self::Repeated { .. } => ErrorKind::InvalidArgument,
            Self::SizeMismatch { .. } | Self::Param { .. } | Self::NoGid { .. } => {
                ErrorKind::InvalidUsage
            }
            Self::Completion { .. } | Self::PeerGone { .. } => ErrorKind::Remote,
            Self::RailDroppedByPeer { .. } => ErrorKind::Remote,
            // NCCL's `ncclIbStatsCheckFatalCount` returns `ncclSystemError`.
            Self::Provider { .. } | Self::Wire { .. } | Self::AsyncEvent { .. } => {
                ErrorKind::System
            }
            Self::Poisoned { cause, .. } => *cause,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Full { what, cap } => write!(f, "{what} full (capacity {cap})"),
            Self::OutOfRange {
                what,
                value,
                min,
                max,
            } => {
                write!(f, "{what} = {value} is out of range [{min}, {max}]")
            }
            Self::Repeated {
                what,
                list,
                value,
                first,
                again,
            } => write!(
                f,
                "{what} {value} is listed twice in {list} (at [{first}] and [{again}])"
            ),
            Self::Missing { what } => write!(f, "{what} is missing (NULL)"),
            Self::BadState { op, state } => write!(f, "{op} called in state {state}"),
            Self::StaleRequest { idx } => write!(f, "request {idx} is not live on this comm"),
            Self::SizeMismatch {
                send,
                recv,
                tag,
                index,
                nreqs,
                peer,
            } => write!(
                f,
                "collective mismatch: req {index}/{nreqs} tag {tag:#x} peer {peer}: \
                 local send size {send} > remote receive size {recv}"
            ),
            Self::BadFifoElem { field, value, peer } => write!(
                f,
                "peer {peer} posted incorrect receive info: {field} = {value:#x}"
            ),
            Self::BadSize {
                index,
                size,
                posted,
                peer,
            } => write!(
                f,
                "peer {peer} reported {size} bytes for receive {index} of {posted} bytes posted \
                 (sizes FIFO or immediate)"
            ),
            Self::BogusCompletion { wr_id } => {
                write!(f, "completion names no live request (wr_id {wr_id:#x})")
            }
            Self::Provider { call, errno } => write!(f, "{call} failed (errno {errno})"),
            Self::Completion { .. } | Self::AsyncEvent { .. } => self.fmt_provider_event(f),
            Self::Wire { what, value } => {
                write!(
                    f,
                    "malformed handshake from peer: {what} (value {value:#x})"
                )
            }
            Self::Param { name, reason } => write!(f, "{name}: {reason}"),
            Self::Poisoned { op, cause } => {
                write!(
                    f,
                    "{op} refused: the comm failed earlier ({cause} error) and accepts no more \
                     work"
                )
            }
            Self::PeerGone { peer } => write!(f, "peer {peer} is gone"),
            Self::RailDroppedByPeer { what } => f.write_str(what),
            Self::NoGid {
                dev,
                port,
                inet6,
                range,
            } => no_gid(f, dev, *port, *inet6, range.as_ref()),
        }
    }
}

impl Error {
    /// [`fmt::Display`] of what the provider reported: a failed completion, an async event
    /// (`fmt` for every other variant).
    fn fmt_provider_event(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Completion {
                status,
                opcode,
                vendor_err,
                req,
                peer,
                local_gid,
                hca,
                local_qpn,
                size,
            } => write!(
                f,
                "got completion from peer {peer} with status={}({}) opcode={}({}) reqSize={size} \
                 vendor_err={vendor_err} req_type={req} localGid {} hca {hca} \
                 qpn {local_qpn:#x}",
                status.name(),
                *status as u32,
                opcode.name(),
                *opcode as u32 as i32,
                core::net::Ipv6Addr::from(local_gid.0)
            ),
            Self::AsyncEvent {
                what: AsyncFailure::Device,
                dev,
                peer,
            } => write!(
                f,
                "device {dev} reported a fatal async event (IBV_EVENT_DEVICE_FATAL): the comm \
                 with peer {peer} is unusable"
            ),
            Self::AsyncEvent {
                what: AsyncFailure::Comm,
                dev,
                peer,
            } => write!(
                f,
                "device {dev} reported an async error event on this comm's QP or CQ: the comm \
                 with peer {peer} is unusable"
            ),
            // `fmt` sends only the two variants above here.
            other => write!(f, "{other:?}"),
        }
    }
}

/// [`Error::NoGid`]'s line.
fn no_gid(
    f: &mut fmt::Formatter<'_>,
    dev: &DevName,
    port: u8,
    inet6: bool,
    range: Option<&(Gid, u8)>,
) -> fmt::Result {
    let fam = if inet6 { "AF_INET6" } else { "AF_INET" };
    write!(
        f,
        "{dev}:{port}: no valid GID of NCCL_IB_ADDR_FAMILY={fam} inside NCCL_IB_ADDR_RANGE="
    )?;
    match range {
        None => f.write_str("(unset)")?,
        Some((g, len)) if inet6 => write!(f, "{}/{len}", core::net::Ipv6Addr::from(g.0))?,
        Some((g, len)) => write!(
            f,
            "{}/{len}",
            core::net::Ipv4Addr::new(g.0[0], g.0[1], g.0[2], g.0[3])
        )?,
    }
    f.write_str(
        " (ibnet never falls back to a GID outside the family and range you set); set them to \
         the port's addresses, or choose one GID with NCCL_IB_GID_INDEX",
    )
}

impl core::error::Error for Error {}
