//! Capacity, one test binary (heavy: thousands of comms and QPs): `maxComms` comms fit and the
//! one after the soft memory budget is refused ([`capacity`]), and the cost of opening comms up
//! to it ([`comm_open_cost`]). Each test runs in a process of its own ([`util::isolate`]), so
//! its environment and RSS are its alone; `comm_open_cost`'s measurements re-execute this binary
//! for their rows.

mod capacity;
mod comm_open_cost;
#[path = "../util/mod.rs"]
mod util;
