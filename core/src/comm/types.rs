//! The values comms take and give: their settings, receive buffers, completed requests.

use crate::fifo::MAX_RECVS;
use crate::provider::MrKeys;

/// Per-comm settings, resolved by the caller from NCCL's variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommConfig {
    /// QPs per connection (`NCCL_IB_QPS_PER_CONNECTION`), 1..=[`crate::wire::MAX_QPS`].
    pub nqps: u8,
    /// Split each message across all QPs (`NCCL_IB_SPLIT_DATA_ON_QPS`).
    pub split_data: bool,
    /// Adaptive routing in effect (`NCCL_IB_ADAPTIVE_ROUTING`, resolved for the link layer).
    pub adaptive_routing: bool,
    /// Above this size, adaptive routing sends the immediate separately (`NCCL_IB_AR_THRESHOLD`).
    pub ar_threshold: u64,
    /// Post FIFO elements inline (`NCCL_IB_USE_INLINE`).
    pub use_inline: bool,
    /// Receives land in GPU memory and need an RDMA READ flush (GPU-direct, not
    /// `NCCL_GDR_FLUSH_DISABLE`).
    pub gdr_flush: bool,
    /// Ack timeout exponent (`NCCL_IB_TIMEOUT`).
    pub timeout: u8,
    /// Retry count (`NCCL_IB_RETRY_CNT`).
    pub retry_cnt: u8,
    /// Service level the sender asks for (`NCCL_IB_SL`, resolved).
    pub sl: u8,
    /// Traffic class the sender asks for (`NCCL_IB_TC`, resolved).
    pub tc: u8,
    /// Partition key index (`NCCL_IB_PKEY`).
    pub pkey_index: u16,
    /// Traffic class of the receiver's QPs, which post the clear-to-send (FIFO) writes, on
    /// RoCE (`NCCL_IB_FIFO_TC`); `None`: the sender's traffic class, as for the data.
    pub fifo_tc: Option<u8>,
    /// Exchange and apply ECE options (`NCCL_IB_ECE_ENABLE`) where the provider has them.
    pub ece: bool,
}

impl Default for CommConfig {
    /// NCCL 2.28's defaults.
    fn default() -> Self {
        Self {
            nqps: 1,
            split_data: false,
            adaptive_routing: false,
            ar_threshold: 8192,
            use_inline: false,
            gdr_flush: false,
            timeout: 20,
            retry_cnt: 7,
            sl: 0,
            tc: 0,
            pkey_index: 0,
            fifo_tc: None,
            ece: true,
        }
    }
}

impl CommConfig {
    /// Resolves NCCL's variables for one comm: `link_layer` decides adaptive routing's `-2`
    /// default, `config_tc` is the v10/v11 comm config's traffic class (if set), and
    /// `gpu_direct` says whether receives land in GPU memory (a flush is then needed unless
    /// `NCCL_GDR_FLUSH_DISABLE`).
    pub fn from_params(
        p: &crate::params::Params,
        link_layer: crate::provider::LinkLayer,
        config_tc: Option<u8>,
        gpu_direct: bool,
    ) -> Self {
        Self {
            nqps: p.ib_qps_per_connection,
            split_data: p.ib_split_data_on_qps,
            adaptive_routing: p.adaptive_routing(link_layer),
            ar_threshold: p.ib_ar_threshold,
            use_inline: p.ib_use_inline,
            gdr_flush: gpu_direct && !p.gdr_flush_disable,
            timeout: p.ib_timeout,
            retry_cnt: p.ib_retry_cnt,
            sl: p.sl(config_tc),
            tc: p.tc(config_tc),
            pkey_index: p.ib_pkey,
            fifo_tc: p.ib_fifo_tc,
            ece: p.ib_ece_enable,
        }
    }
}

/// One receive buffer of a (multi-)receive, or of a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecvBuf {
    /// Address of the buffer.
    pub addr: u64,
    /// Its size: the largest send it accepts.
    pub size: u64,
    /// Tag the matching send must carry.
    pub tag: u32,
    /// Keys of the registration covering the buffer.
    pub mr: MrKeys,
}

/// A receive buffer as a comm of one rail reads it: its address, size, tag and the keys of
/// its registration on that rail. A [`RecvBuf`] is one; a buffer of a comm of several rails
/// ([`crate::rails::RailBuf`]) is one through its rail-0 keys, so a comm of one rail posts it
/// as it is, with no copy.
pub trait RecvView: Copy {
    /// Address of the buffer.
    fn addr(&self) -> u64;
    /// Its size: the largest send it accepts.
    fn size(&self) -> u64;
    /// Tag the matching send must carry.
    fn tag(&self) -> u32;
    /// Keys of the registration covering the buffer (on the comm's rail).
    fn mr(&self) -> MrKeys;
}

impl RecvView for RecvBuf {
    #[inline(always)]
    fn addr(&self) -> u64 {
        self.addr
    }
    #[inline(always)]
    fn size(&self) -> u64 {
        self.size
    }
    #[inline(always)]
    fn tag(&self) -> u32 {
        self.tag
    }
    #[inline(always)]
    fn mr(&self) -> MrKeys {
        self.mr
    }
}

/// A completed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    /// How many entries of `sizes` are meaningful (receives: the multi-receive's width;
    /// sends: 1; flushes: 0).
    pub n: u8,
    /// Bytes per buffer: received (receives, single or multi, as NCCL 2.19+'s `net_ib`, whose
    /// sender writes a multi-receive's sizes into the receiver's sizes FIFO) or sent (sends).
    pub sizes: [u64; MAX_RECVS],
}

/// A send larger than the receive the peer posted for it, cut to the receive's size (as NCCL
/// 2.30's `p2p.cc` does; a size mismatch is almost always a bug of the application). A comm
/// keeps its first one for its caller to log once ([`super::SendComm::take_truncation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncation {
    /// Bytes the caller asked to send.
    pub send: u64,
    /// Bytes the peer posted to receive (what was sent).
    pub recv: u64,
    /// The tag both sides used.
    pub tag: u32,
}

/// Where a comm stands with [`Truncation`]s: the first is kept until taken, then none is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TruncNote {
    /// No send truncated yet.
    #[default]
    None,
    /// The first truncated send, not taken yet.
    Pending(Truncation),
    /// The first was taken: later truncations are not noted (one report per comm).
    Taken,
}

impl TruncNote {
    /// Notes `t` if it is the comm's first truncation.
    #[cold]
    pub fn note(&mut self, t: Truncation) {
        if *self == Self::None {
            *self = Self::Pending(t);
        }
    }

    /// The first truncation, once (`None` before it and after it was taken).
    #[inline]
    pub fn take(&mut self) -> Option<Truncation> {
        match *self {
            Self::Pending(t) => {
                *self = Self::Taken;
                Some(t)
            }
            _ => None,
        }
    }
}
