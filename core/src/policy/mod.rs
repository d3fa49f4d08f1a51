//! NCCL's policy decisions as pure functions over plain values: no I/O, no clock, no
//! allocation. ffi reads sysfs, queries verbs, reads the clock and peeks at sockets, then
//! hands what it saw to these functions and acts on their answer.
//!
//! | module | decides |
//! |---|---|
//! | [`merge`] | which devices share a NIC (`realPort`), whether a virtual NIC may be fused and its properties |
//! | [`gid`] | which GID a port uses (`NCCL_IB_GID_INDEX`, `_ADDR_FAMILY`, `_ADDR_RANGE`, `_ROCE_VERSION_NUM`) |
//! | [`props`] | `maxComms`, the pointer kinds and the exported port of a device |
//! | [`order`] | the order verbs devices are numbered in (`NCCL_IB_DEVICE_PCI_ORDER`) |
//! | [`nonce`] | a listen comm's single-use nonce, which failures fail `accept`, eviction of idle handshakes |
//! | [`watch`] | when a waiting call looks at its peer's socket, when the peer is dead or stalled |
//! | [`subnet`] | which local device a connect uses (`NCCL_IB_SUBNET_AWARE_ROUTING`, `_SUBNET_PREFIX_LEN`) |

pub mod gid;
pub mod merge;
pub mod nonce;
pub mod order;
pub mod props;
pub mod subnet;
pub mod watch;
