//! params (in progress).
