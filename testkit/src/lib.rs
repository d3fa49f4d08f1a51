//! Test doubles for ibnet-core (in progress).
