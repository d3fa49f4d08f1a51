//! handshake (in progress).
