//! The version-agnostic plugin API every `ncclNetPlugin_vN` shim calls, one concern per file:
//!
//! ```text
//!  entry     catch_unwind, one WARN, error kind → ncclResult_t; a caught panic poisons its comm
//!  common    argument checks, the plugin and its devices
//!  init      init / finalize (v11 contexts), devices, properties, makeVDevice, setNetAttr
//!  listen    listen, accept, closeListen
//!  accepting the acceptor side of the handshake: all queued connections concurrently, bad
//!            ones dropped (never failing accept), the nonce single-use
//!  connect   connect (the connector side; progress parked in crate::connect_registry)
//!  comm      comm boxes behind crate::handles tokens, closeSend / closeRecv
//!  mr        regMr / regMrDmaBuf / deregMr through the device's registration cache
//!  data      isend, irecv, iflush, test
//! ```
//!
//! Every entry point runs inside [`entry()`]: it catches panics (none may cross `extern "C"`),
//! logs one WARN with the call's name and the error, and maps the error's kind to the
//! `ncclResult_t` of NCCL's plugin README (system/network → SystemError, misuse →
//! InternalError, configuration → InvalidUsage, completion errors → RemoteError).
//!
//! Comms and requests handed to NCCL are not pointers but tokens of [`crate::handles`]: an
//! index and generation into a fixed table of comm slots (a request token adds the core's
//! [`ReqId`](ibnet_core::request::ReqId)). A stale token (its comm closed), a token of the
//! wrong kind, or any other value is rejected without dereferencing anything;
//! `isend`/`irecv`/`test` never allocate nor lock.
//!
//! Sharing: NCCL calls `regMr`/`deregMr` from its proxy service thread while its progress
//! thread runs `isend`/`irecv`/`test` on the same comm. A comm box therefore keeps what both
//! need (`dev`, `cache`, written once at creation, never mutated) outside an `UnsafeCell`
//! that holds the provider comm; only the data-path calls (serialised by NCCL on one thread)
//! borrow the cell mutably, and registrations take only a shared reference to the box. A
//! panic caught in a call on a comm poisons it (its slot's [`Life`](crate::handles::Life);
//! later calls but close fail with `Poisoned`). So does any failure of the comm itself (the
//! core's `Life::Poisoned`, and a peer `crate::watch` found gone): every later data call is
//! refused with the first error's kind.
//!
//! Connection setup (never blocks; NCCL calls connect/accept until they return a comm). The
//! handle is the core's [`ConnectHandle`](ibnet_core::wire::ConnectHandle) (listener address,
//! nonce, provider tag); the talking is the core's `Connector`/`Acceptor` machines, driven over
//! the socket by [`crate::handshake_io::pump`]:
//! ```text
//!  connect (handle from listen)                  accept (listenComm)
//!  TCP connect ──────────────────────────────▶   accept queued TCP connection
//!  SendComm::new; Connector::new(nonce, info)    Acceptor::new(nonce, port)
//!      Hello{nonce} · QpInfo{qpns, fifo} ────▶   PeerInfo: RecvComm::new(info) (QPs to RTS);
//!                                                handle_local_info(recv.local_info())
//!      ◀────────────────────────────────────── QpInfo{qpns, mtu = min}
//!  PeerInfo: SendComm::connect(info);
//!  handle_qps_connected
//!      Ready ────────────────────────────────▶   Done → recvComm
//!  Done → sendComm
//! ```
//! The connector's in-progress state is kept in [`crate::connect_registry`] under a token it
//! writes into the scratch area of the handle (NCCL keeps the handle between calls); an
//! unknown token is a corrupt handle. A peer that closes mid-handshake is an error
//! (`PeerGone`); one that stalls past `IBNET_HANDSHAKE_TIMEOUT` seconds is an error. Either
//! drops the half-built comm; its WARN names the peer's socket address and the handshake state
//! (`handshake_io::AtPeer`: "timed out waiting for ADDR in state …"). On the accepting side
//! such a connection is dropped and `accept` goes on, unless it was the one carrying the
//! listener's nonce and no other such one is in progress: then `accept` fails (see
//! `accepting`).

mod accepting;
pub mod comm;
pub mod common;
pub mod connect;
pub mod data;
pub mod entry;
pub mod init;
pub mod listen;
pub mod mr;
mod shared_listen;
#[cfg(test)]
mod tests;

pub use comm::{close_recv, close_send, rail_stats, CommBox, RecvCommBox, SendCommBox};
pub use connect::connect;
pub use data::{iflush, irecv, isend, test, Sizes};
pub use entry::{entry, entry_at, entry_on, to_nccl};
pub use init::{devices, finalize, init, make_vdevice, properties, set_net_attr, NetCtx};
pub use listen::{accept, close_listen, listen, ListenComm};
pub use mr::{dereg_mr, reg_mr};
