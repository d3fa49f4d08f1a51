//! Connects in progress between NCCL's `connect` calls, keyed by a token the connector writes
//! into its handle.
//!
//! NCCL calls `connect` with the same handle until it returns a comm, and keeps the handle
//! between calls; [`ConnectHandle`](ibnet_core::wire::ConnectHandle) leaves a scratch area to
//! the connecting side. A connect that has to wait is [`park`]ed here under a random token
//! written at [`TOKEN_OFF`] (8 bytes, little-endian; 0 = no connect yet), and the next call
//! [`take`]s it back. An unknown token is a corrupt, reused or timed-out handle. Connects NCCL
//! gave up on (never called again) are dropped once past their deadline ([`prune`]), and the
//! last `finalize` drops them all ([`drop_all`]), closing their sockets and comms.
//!
//! This sits below both `api` (which drives the connects) and `plugin` (whose teardown drops
//! them), so neither imports the other for it. Control path only: one mutex.

use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Instant;

use ibnet_core::error::PeerId;
use ibnet_core::handshake::Connector;
use ibnet_core::wire::{HANDLE_SCRATCH_LEN, HANDLE_SCRATCH_OFFSET};
use ibnet_core::Error;

use crate::dev::{AnySend, Infos};
use ibnet_nccl::types::NCCL_NET_HANDLE_MAXSIZE;

/// Offset of the connector's progress token in the handle: the first 8 bytes of the scratch
/// area, which the handle leaves to the connecting side.
pub const TOKEN_OFF: usize = HANDLE_SCRATCH_OFFSET;
const _: () = assert!(TOKEN_OFF + 8 <= HANDLE_SCRATCH_OFFSET + HANDLE_SCRATCH_LEN);
const _: () = assert!(HANDLE_SCRATCH_OFFSET + HANDLE_SCRATCH_LEN <= NCCL_NET_HANDLE_MAXSIZE);

/// Where a connect stands.
pub enum ConnectStage {
    /// The TCP connect is in progress.
    Tcp(TcpStream),
    /// The comm exists; the handshake machine runs over the socket.
    Shake {
        /// The bootstrap socket.
        stream: TcpStream,
        /// The send comm being connected.
        send: Box<AnySend>,
        /// The core's connector machine.
        machine: Box<Connector>,
        /// The peer (GID, LID, QP), once its QP info arrived.
        remote: PeerId,
        /// The acceptor's rail infos received so far (rail order).
        peers: Box<Infos>,
    },
}

/// A connect in progress between NCCL's `connect` calls.
pub struct Connecting {
    /// `None` only while a step runs (a failed step leaves it so, and the connect is dropped).
    pub stage: Option<ConnectStage>,
    /// The listener's nonce from the handle.
    pub nonce: u64,
    /// When the handshake gives up (`IBNET_HANDSHAKE_TIMEOUT`).
    pub deadline: Instant,
}

static CONNECTING: Mutex<Option<HashMap<u64, Connecting>>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut HashMap<u64, Connecting>) -> R) -> R {
    let mut reg = CONNECTING.lock().unwrap_or_else(|e| e.into_inner());
    f(reg.get_or_insert_with(HashMap::new))
}

/// The token in `handle` (0: this handle has no connect in progress).
pub fn token(handle: &[u8; NCCL_NET_HANDLE_MAXSIZE]) -> u64 {
    let mut t = [0u8; 8];
    t.copy_from_slice(&handle[TOKEN_OFF..TOKEN_OFF + 8]);
    u64::from_le_bytes(t)
}

/// Writes `token` into `handle` (0 clears it).
pub fn set_token(handle: &mut [u8; NCCL_NET_HANDLE_MAXSIZE], token: u64) {
    handle[TOKEN_OFF..TOKEN_OFF + 8].copy_from_slice(&token.to_le_bytes());
}

/// Drops the connects whose deadline is before `now`.
pub fn prune(now: Instant) {
    with(|m| m.retain(|_, c| c.deadline >= now));
}

/// Takes the connect parked under `token`.
pub fn take(token: u64) -> Result<Connecting, Error> {
    with(|m| m.remove(&token)).ok_or(Error::Wire {
        what: "connect handle progress token (corrupt, reused or timed-out handle)",
        value: token,
    })
}

/// Parks `c` under `token` until the next `connect` call.
pub fn park(token: u64, c: Connecting) {
    with(|m| m.insert(token, c));
}

/// Whether no connect is in progress.
pub fn is_empty() -> bool {
    with(|m| m.is_empty())
}

/// Drops every connect in progress (the last `finalize`), closing their comms and sockets.
pub fn drop_all() {
    let old = CONNECTING.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(old);
}
