//! Can this process use the cross-process fabric? One clear answer for the ffi's init.
//!
//! Cross-memory attach (`process_vm_writev`/`readv`) into another process needs the same
//! permission as `ptrace` attach (`PTRACE_MODE_ATTACH_REALCREDS`):
//! * seccomp profiles (Docker's default before 20.10, some sandboxes) refuse the syscalls;
//! * Yama `kernel.yama.ptrace_scope`: 0 allows any same-user process; 1 allows only
//!   descendants, unless the target called `prctl(PR_SET_PTRACER, …)` — the provider does that
//!   for itself (see the crate doc); 2 needs `CAP_SYS_PTRACE`; 3 forbids it entirely;
//! * other LSMs (AppArmor `ptrace` rules) can still refuse at connect time; `connect_qp` then
//!   fails with the same explanation.

use std::fmt;

use crate::sys;

/// Why the soft provider cannot run its cross-process fabric here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// Cause and fix, in one line.
    pub reason: String,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ibnet-soft unavailable: {}", self.reason)
    }
}

impl std::error::Error for Unavailable {}

/// The fix to print whenever cross-memory attach is refused.
pub const FIX: &str = "allow cross-memory attach between processes of one user: \
    `sysctl kernel.yama.ptrace_scope=0` (or 1, with IBNET_SOFT_PTRACER left at 1), or run all \
    ranks in one container/PID namespace with CAP_SYS_PTRACE, and allow process_vm_readv/writev \
    in the seccomp profile";

fn cap_sys_ptrace() -> bool {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 19) != 0) // CAP_SYS_PTRACE = 19
}

/// The Yama ptrace scope, or `None` without Yama.
pub fn ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Checks that the cross-process fabric can work: the syscalls are allowed (a self-read), and
/// the Yama policy lets same-user peers attach (given `set_ptracer`, see
/// [`crate::Config::set_ptracer`]). The in-process fabric always works.
pub fn probe_with(set_ptracer: bool) -> Result<(), Unavailable> {
    match sys::cma_self_test() {
        Ok(true) => {}
        Ok(false) => {
            return Err(Unavailable {
                reason: format!("process_vm_readv self-test copied wrong bytes; {FIX}"),
            })
        }
        Err(e) => {
            return Err(Unavailable {
                reason: format!(
                    "process_vm_readv is refused ({e}): seccomp or a kernel without \
                     CONFIG_CROSS_MEMORY_ATTACH; {FIX}"
                ),
            })
        }
    }
    let cap = cap_sys_ptrace();
    match ptrace_scope() {
        Some(3) => Err(Unavailable {
            reason: format!("kernel.yama.ptrace_scope = 3 forbids cross-memory attach until reboot; {FIX}"),
        }),
        Some(2) if !cap => Err(Unavailable {
            reason: format!("kernel.yama.ptrace_scope = 2 needs CAP_SYS_PTRACE, which this process lacks; {FIX}"),
        }),
        Some(1) if !set_ptracer && !cap => Err(Unavailable {
            reason: format!(
                "kernel.yama.ptrace_scope = 1 and IBNET_SOFT_PTRACER=0: sibling processes cannot \
                 attach to each other; {FIX}"
            ),
        }),
        _ => Ok(()),
    }
}

/// [`probe_with`] with the default configuration (`IBNET_SOFT_PTRACER` on).
pub fn probe() -> Result<(), Unavailable> {
    probe_with(crate::config::Config::default().set_ptracer)
}
