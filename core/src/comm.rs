//! Send and receive comms (in progress).
