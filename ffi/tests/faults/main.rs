//! Faults through the plugin, one test binary: peers killed in every state ([`dead_peer`]),
//! hostile connections to `accept` ([`accept_hostile`]), bootstrap errors naming the peer
//! ([`messages`]), a completion error's WARN ([`warn_completion`]) and NCCL's data-path
//! semantics: truncation, `deregMr(NULL)`, a device-fatal event ([`datapath`]). Each test sets
//! its environment, initialises the plugin and reads its log (some count the process's fds), so
//! each runs in a process of its own ([`util::isolate`]); `dead_peer` re-executes this binary
//! again for its peer (`dead_peer::child`).

mod accept_hostile;
mod datapath;
mod dead_peer;
mod messages;
#[path = "../util/mod.rs"]
mod util;
mod warn_completion;
