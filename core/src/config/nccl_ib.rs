//! NCCL's variables: `NCCL_IB_*`, the bootstrap's `NCCL_SOCKET_*`, `NCCL_GDR_FLUSH_DISABLE`,
//! `NCCL_DMABUF_ENABLE`, `NCCL_IBVERBS_LIB`, the 2.29/2.30 resiliency ones, and those 2.29–2.32
//! added that ibnet refuses (one WARN naming each, [`super::var::Why`]). Defaults are NCCL 2.28's
//! (and 2.29–2.32's for the new ones), except where the doc line says otherwise.

use super::var::Kind::{Flag, Int, Opaque, Path, Text, Word};
use super::var::Reader::{Loader, Nccl, Refused};
use super::var::Since::{Nccl as V, NcclBinary, NcclUpTo, Rccl};
use super::var::Why::{Mlx5Only, NotPublic, OwnScheme};
use super::var::{Kind, Var};

/// Longest accepted `NCCL_IB_HCA` value, in bytes.
pub const HCA_MAX_LEN: usize = 512;
/// Longest accepted `NCCL_SOCKET_IFNAME` value, in bytes.
pub const IFNAME_MAX_LEN: usize = 256;
/// Longest accepted `NCCL_IB_ADDR_RANGE` value, in bytes.
pub const RANGE_MAX_LEN: usize = 64;

const FAMILIES: Kind = Word(&["AF_INET", "AF_INET6"]);
const U32: Kind = Int {
    min: 0,
    max: u32::MAX as i64,
};
const MS: Kind = Int {
    min: 0,
    max: i32::MAX as i64,
};
const ANY_INT: Kind = Int {
    min: i64::MIN,
    max: i64::MAX,
};

/// NCCL's variables, in README's order.
pub const VARS: &[Var] = &[
    Var::new("NCCL_NET_PLUGIN", Path, "", NcclUpTo(21), "plugin file or suffix; use an absolute path")
        .shown("(unset: `libnccl-net.so`)")
        .by(Nccl),
    Var::new("NCCL_NET", Text(64), "", NcclUpTo(21), "`IBNet` forces ibnet")
        .shown("(unset)")
        .by(Nccl),
    Var::new("NCCL_IB_DISABLE", Flag, "0", NcclUpTo(21), "1: no verbs devices"),
    Var::new(
        "NCCL_IB_HCA",
        Text(HCA_MAX_LEN),
        "",
        NcclUpTo(21),
        "`[^][=]dev[:port[:rail[:plane]]],…` filter as NCCL 2.30 reads it (`^` exclude, `=` exact names; an empty field is unset; rail/plane are v12's `railId`/`planeId`); a malformed entry is one WARN naming it and the rest of the list applies",
    )
    .shown("all"),
    Var::new("NCCL_IB_GID_INDEX", Int { min: -1, max: 255 }, "-1", NcclUpTo(21), "RoCE GID index")
        .shown("-1 (auto)"),
    Var::new(
        "NCCL_IB_ROCE_VERSION_NUM",
        Int { min: 1, max: 2 },
        "2",
        V(21),
        "RoCE version preferred by auto-selection",
    ),
    // No table default: `Params` keeps whether the user set it (unset: AF_INET and NCCL's
    // fallback to GID index 0 when no GID matches; set: no GID outside it).
    Var::new(
        "NCCL_IB_ADDR_FAMILY",
        FAMILIES,
        "",
        V(21),
        "GID family for auto-selection. When it or `NCCL_IB_ADDR_RANGE` is set, ibnet never uses a GID outside them: a RoCE port with no valid GID of the family inside the range is not used, and a connection whose GID there has gone fails (`connect` and `accept`; one WARN each). Both unset: NCCL's fallback to GID index 0 (one INFO)",
    )
    .shown("AF_INET"),
    Var::new(
        "NCCL_IB_ADDR_RANGE",
        Text(RANGE_MAX_LEN),
        "",
        V(21),
        "GID subnet for auto-selection (`a.b.c.d/n`, or IPv6)",
    )
    .shown("(any)"),
    Var::new(
        "NCCL_IB_TIMEOUT",
        Int { min: 0, max: 31 },
        "20",
        NcclUpTo(21),
        "ack timeout exponent (4.096 µs × 2^t; 20 since NCCL 2.23)",
    ),
    Var::new("NCCL_IB_RETRY_CNT", Int { min: 0, max: 7 }, "7", NcclUpTo(21), "retry count"),
    Var::new(
        "NCCL_IB_QPS_PER_CONNECTION",
        Int { min: 1, max: 128 },
        "1",
        NcclUpTo(10),
        "QPs per connection",
    ),
    Var::new(
        "NCCL_IB_SPLIT_DATA_ON_QPS",
        Flag,
        "0",
        NcclUpTo(21),
        "split each message across QPs (default 0 since NCCL 2.20)",
    ),
    Var::new(
        "NCCL_IB_AR_THRESHOLD",
        Int { min: 0, max: i64::MAX },
        "8192",
        V(16),
        "adaptive-routing threshold (bytes): larger sends write data and immediate apart",
    ),
    Var::new("NCCL_IB_ADAPTIVE_ROUTING", ANY_INT, "-2", V(16), "adaptive routing")
        .shown("-2 (on for IB, off for RoCE)"),
    Var::new(
        "NCCL_IB_PCI_RELAXED_ORDERING",
        Int { min: 0, max: 2 },
        "2",
        V(12),
        "relaxed-ordering registrations (0 off, 1 on, 2 when supported)",
    )
    .shown("2 (auto)"),
    Var::new("NCCL_IB_USE_INLINE", Flag, "0", NcclUpTo(21), "inline FIFO posts"),
    Var::new(
        "NCCL_IB_SL",
        Int { min: -1, max: 15 },
        "-1",
        NcclUpTo(21),
        "service level; -1: the communicator's traffic class (v10/v11 config), else 0 (-1 since NCCL 2.26)",
    ),
    Var::new(
        "NCCL_IB_TC",
        Int { min: -1, max: 255 },
        "-1",
        NcclUpTo(21),
        "traffic class; -1: the communicator's traffic class (v10/v11 config), else 0 (-1 since NCCL 2.26)",
    ),
    Var::new(
        "NCCL_IB_FIFO_TC",
        Int { min: -1, max: 255 },
        "-1",
        V(22),
        "RoCE: traffic class (GRH) of the receiver's QPs, which post the clear-to-send writes (a traffic class is per QP in verbs, as in NCCL 2.28); -1: the data traffic class",
    ),
    Var::new(
        "NCCL_IB_ECE_ENABLE",
        Flag,
        "1",
        V(23),
        "Enhanced Connection Establishment (`ibv_query_ece`/`ibv_set_ece` when libibverbs has them), exchanged in the handshake; unsupported: logged once, not fatal",
    ),
    Var::new(
        "NCCL_IB_MQP_RETRY_ALL",
        Flag,
        "0",
        V(24),
        "retry every failed `ibv_modify_qp`, not only ETIMEDOUT",
    ),
    Var::new(
        "NCCL_IB_MQP_RETRY_CNT",
        U32,
        "34",
        V(24),
        "retries of an `ibv_modify_qp` that failed with ETIMEDOUT",
    ),
    Var::new(
        "NCCL_IB_MQP_RETRY_SLEEP_MSEC",
        U32,
        "100",
        V(24),
        "the n-th `ibv_modify_qp` retry sleeps n times this (ms)",
    ),
    Var::new(
        "NCCL_IB_ROUTABLE_FLID_GID_INDEX",
        Int { min: 0, max: 255 },
        "1",
        V(22),
        "InfiniBand: GID index used for FLID routing (GRH when subnets differ)",
    ),
    Var::new(
        "NCCL_IB_RETURN_ASYNC_EVENTS",
        Flag,
        "1",
        V(23),
        "report fatal async events as errors of the comms they hit",
    ),
    Var::new(
        "NCCL_IB_SOCK_CLIENT_PORT_REUSE",
        Flag,
        "0",
        Rccl,
        "1: connects reuse one local port per thread (RCCL)",
    ),
    Var::new(
        "NCCL_IB_SOCK_SERVER_PORT_REUSE",
        Flag,
        "0",
        Rccl,
        "the listen comms of one thread share one listening port (as RCCL); connections are routed to their listen comm by the nonce of its handle",
    ),
    Var::new("NCCL_IB_PKEY", Int { min: 0, max: 0xFFFF }, "0", NcclUpTo(21), "partition key index"),
    Var::new(
        "NCCL_IB_MERGE_VFS",
        Flag,
        "1",
        NcclUpTo(21),
        "merge virtual functions into one NIC",
    ),
    Var::new(
        "NCCL_IB_MERGE_NICS",
        Flag,
        "1",
        NcclUpTo(21),
        "allow a virtual NIC of several devices (`makeVDevice`, v9–v12); 0: a fusion is refused (`ncclInvalidUsage`, one INFO), as NCCL 2.28",
    ),
    Var::new(
        "NCCL_IB_WARN_RAIL_LOCAL",
        Flag,
        "0",
        V(24),
        "1: one INFO on the accepting side of each connection whose peer's physical device numbers are not this side's (the devices both share are fewer than the longer list has; plain devices too), as NCCL 2.28",
    ),
    Var::new("NCCL_GDR_FLUSH_DISABLE", Flag, "0", NcclUpTo(21), "skip the GPU-direct flush"),
    Var::new(
        "NCCL_DMABUF_ENABLE",
        Flag,
        "1",
        V(13),
        "DMA-BUF registrations; with an AMD GPU, DMA-BUF is used only when this is set to 1",
    )
    .shown("1 (AMD GPUs: 0, as RCCL)"),
    Var::new(
        "NCCL_SOCKET_IFNAME",
        Text(IFNAME_MAX_LEN),
        "",
        NcclUpTo(21),
        "bootstrap interface (`NCCL_IB_HCA`'s grammar without ports)",
    )
    .shown("auto"),
    Var::new("NCCL_SOCKET_FAMILY", FAMILIES, "", NcclUpTo(21), "bootstrap address family")
        .shown("auto"),
    // 2.29–2.32 (issue 28 point 5).
    Var::new(
        "NCCL_IB_DEVICE_PCI_ORDER",
        Flag,
        "1",
        V(29),
        "as NCCL: number the verbs devices in PCI-path order (1, devices without a path last) or libibverbs' order (0); `realPort` is counted in that order",
    ),
    Var::new(
        "NCCL_IB_QUERY_PORT_SPEED",
        Flag,
        "1",
        V(30),
        "as NCCL: a port's speed from `ibv_query_port_speed` where libibverbs has it (1), else (or 0) from `ibv_query_port`'s width × lane speed",
    ),
    Var::new(
        "NCCL_IBVERBS_LIB",
        Path,
        "",
        V(30),
        "the libibverbs to `dlopen` (`IBNET_IBVERBS_PATH` wins when both are set); as NCCL, one that cannot be loaded falls back to the system's (`libibverbs.so.1`, then `libibverbs.so`) with one INFO naming it; none loadable is one WARN naming it and 0 verbs devices",
    )
    .shown("(unset)")
    .by(Loader),
    Var::new(
        "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS",
        Int { min: -2, max: 1 },
        "-2",
        V(29),
        "ibnet posts one receive WR per `irecv` (as -2 and 0 do); 1 is refused with one WARN",
    )
    .by(Refused {
        why: OwnScheme,
        keeps: &["-2", "0"],
    }),
    Var::new(
        "NCCL_IB_RECEIVER_SIDE_MATCHING_SCHEME",
        ANY_INT,
        "-2",
        V(29),
        "ibnet matches receive completions by request index (NCCL's -2); any other value is refused with one WARN",
    )
    .shown("-2 (by index)")
    .by(Refused {
        why: OwnScheme,
        keeps: &["-2"],
    }),
    Var::new(
        "NCCL_IB_OOO_RQ",
        Flag,
        "0",
        V(30),
        "mlx5 out-of-order receive queue: refused (mlx5-only) with one WARN when set to 1",
    )
    .by(Refused {
        why: Mlx5Only,
        keeps: &["0"],
    }),
    Var::new(
        "NCCL_IB_DATA_DIRECT",
        Int { min: 0, max: 2 },
        "1",
        V(27),
        "mlx5 Data Direct: ibnet never uses it (as 0); 1 or 2 set explicitly is refused (mlx5-only) with one WARN",
    )
    .shown("1 (ibnet: as 0)")
    .by(Refused {
        why: Mlx5Only,
        keeps: &["0"],
    }),
    Var::new(
        "NCCL_IB_SUBNET_AWARE_ROUTING",
        Flag,
        "0",
        V(30),
        "RoCE subnet-aware routing: `listen`'s handle carries the GIDs of the device's first 2 RoCE rails; `connect` keeps NCCL's device when all its RoCE rails share a subnet with one of them, else uses the first device that does (one INFO), else NCCL's (InfiniBand: no change)",
    ),
    Var::new(
        "NCCL_IB_SUBNET_PREFIX_LEN",
        Int { min: 1, max: 32 },
        "24",
        V(30),
        "subnet-aware routing: the bits of an IPv4-mapped GID that make its subnet (IPv6 GIDs compare their 64-bit prefix); out of range: one WARN, the default stands (NCCL fails the connect)",
    ),
    Var::new(
        "NCCL_IB_RAIL_POLICY",
        Word(&["CX", "NONE", "CX9_BLOCK", "CX9_ALT", "CX9_FLIP"]),
        "",
        NcclBinary(31, 32),
        "meaning not public: ibnet applies no rail policy (`NONE`, no WARN); `CX`, `CX9_BLOCK`, `CX9_ALT`, `CX9_FLIP` are refused with one WARN; another word is one WARN (unrecognized), as NCCL",
    )
    .shown("(unset)")
    .by(Refused {
        why: NotPublic,
        keeps: &["NONE"],
    }),
    Var::new(
        "NCCL_IB_EVENT_BASED_LB",
        Opaque,
        "",
        NcclBinary(31, 32),
        "meaning not public: any value is refused with one WARN",
    )
    .shown("(unset)")
    .by(Refused {
        why: NotPublic,
        keeps: &[],
    }),
    Var::new(
        "NCCL_IB_EVENT_BASED_LB_REMOTE",
        Opaque,
        "",
        NcclBinary(31, 32),
        "meaning not public: any value is refused with one WARN",
    )
    .shown("(unset)")
    .by(Refused {
        why: NotPublic,
        keeps: &[],
    }),
    Var::new(
        "NCCL_IB_SORT_MERGE_NICS",
        Opaque,
        "",
        NcclBinary(31, 32),
        "meaning not public: any value is refused with one WARN",
    )
    .shown("(unset)")
    .by(Refused {
        why: NotPublic,
        keeps: &[],
    }),
    Var::new(
        "NCCL_IB_VR_RAILS_PER_SOCKET",
        Opaque,
        "",
        NcclBinary(31, 32),
        "meaning not public: any value is refused with one WARN",
    )
    .shown("(unset)")
    .by(Refused {
        why: NotPublic,
        keeps: &[],
    }),
    Var::new(
        "NCCL_IB_VR_SOCKET_COUNT",
        Opaque,
        "",
        NcclBinary(31, 32),
        "meaning not public: any value is refused with one WARN",
    )
    .shown("(unset)")
    .by(Refused {
        why: NotPublic,
        keeps: &[],
    }),
    Var::new(
        "NCCL_IB_WQE_LATENCY_REPORT",
        Opaque,
        "",
        NcclBinary(31, 32),
        "meaning not public: any value is refused with one WARN",
    )
    .shown("(unset)")
    .by(Refused {
        why: NotPublic,
        keeps: &[],
    }),
    Var::new(
        "NCCL_IB_WQE_LATENCY_THRESHOLD_NS",
        Opaque,
        "",
        NcclBinary(31, 32),
        "meaning not public: any value is refused with one WARN",
    )
    .shown("(unset)")
    .by(Refused {
        why: NotPublic,
        keeps: &[],
    }),
    // Resiliency (2.29/2.30): stored by the failover/failback work (`Params`' resiliency block).
    Var::new(
        "NCCL_IB_RESILIENCY_PORT_FAILOVER",
        Flag,
        "1",
        V(29),
        "a virtual NIC's failed rail hands its traffic to the other rails; 0: a rail failure fails the comm, as NCCL without failover (and as a plain comm). **Differs from NCCL**, whose default is off: in ibnet failover came with fusion and costs nothing until a rail fails, and a fused NIC that dies with any one of its rails is less reliable than one plain device. Only failures that say the path is gone fail over (`IBV_WC_RETRY_EXC_ERR`, `IBV_WC_WR_FLUSH_ERR` as in NCCL, plus `IBV_WC_RNR_RETRY_EXC_ERR`, `IBV_WC_LOC_QP_OP_ERR` (soft-RoCE's status for a send whose own link went down), a failed post and a fatal device event); any other completion error (access, protection, length) fails the comm, as NCCL",
    )
    .shown("1 (NCCL: 0)"),
    Var::new(
        "NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS",
        MS,
        "",
        V(29),
        "failed attempts at one message (a moved part or notice whose carrier rail failed too: NCCL's failed probe) before the comm fails; unset: no limit but the rails",
    )
    .shown("unlimited (NCCL: 1)"),
    Var::new(
        "NCCL_IB_RESILIENCY_PORT_FAILOVER_PROBE_DELAY",
        MS,
        "",
        V(29),
        "ms from a rail's failure until the parts it lost are written again on another rail (ibnet needs no probe: the failed rail's completions are drained, so what it had acknowledged is known); unset: at once",
    )
    .shown("0 (NCCL: 10)"),
    Var::new(
        "NCCL_IB_RESILIENCY_PORT_RECOVERY",
        Flag,
        "0",
        V(30),
        "1: failback: a virtual NIC's failed rail is brought back once both ends see it healthy (the sender resets its QPs and says READY; the receiver reads that over a live rail, resets its own, proves the rail with an RDMA READ over it, and names the receive from which the rail carries parts again), then carries its share again, no byte lost or written twice; one INFO per side when a rail returns, naming rail, device and peer (protocol: `ibnet_core::fused::heal`)",
    ),
    Var::new(
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY",
        MS,
        "200",
        V(30),
        "ms from a rail's going out of use to its first return attempt, and between attempts",
    ),
    Var::new(
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX",
        MS,
        "5",
        V(30),
        "failed return attempts of a rail in a row before it stays out for good",
    ),
    Var::new(
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ACK_TIMEOUT",
        MS,
        "5000",
        V(30),
        "ms one return attempt waits for the peer (its READY, the probe's completion) before it counts as failed",
    ),
    Var::new(
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_INTERVAL",
        MS,
        "500",
        V(30),
        "NCCL: failback's ms between batches of alive messages; ibnet proves a returning rail with one RDMA READ over it instead: any value is refused with one WARN",
    )
    .by(Refused {
        why: OwnScheme,
        keeps: &[],
    }),
    Var::new(
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_SIZE",
        MS,
        "5",
        V(30),
        "NCCL: failback's alive messages per batch; ibnet proves a returning rail with one RDMA READ over it instead: any value is refused with one WARN",
    )
    .by(Refused {
        why: OwnScheme,
        keeps: &[],
    }),
    Var::new(
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_SEQUENCE_SIZE",
        MS,
        "5",
        V(30),
        "NCCL: failback's alive messages a port must answer in sequence; ibnet proves a returning rail with one RDMA READ over it instead: any value is refused with one WARN",
    )
    .by(Refused {
        why: OwnScheme,
        keeps: &[],
    }),
    Var::new(
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_TIMEOUT",
        MS,
        "4000",
        V(30),
        "NCCL: failback's ms an alive message may go unanswered; ibnet proves a returning rail with one RDMA READ over it instead: any value is refused with one WARN",
    )
    .by(Refused {
        why: OwnScheme,
        keeps: &[],
    }),
];
