//! `NCCL_IBVERBS_LIB` (NCCL 2.30's name for the libibverbs to load) as NCCL does it: the named
//! library first, then the system's; naming a library that cannot be loaded is one INFO naming
//! the variable and the path, and the system's libibverbs is used (`IBNET_IBVERBS_PATH`, ibnet's
//! own variable, stays strict: verbs_named_lib.rs). Where the system has no libibverbs either,
//! `init` succeeds with 0 devices and one WARN names the variable and the path.
//! (A process of its own: the library is resolved once per process.)

use crate::util;

use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use ibnet_verbs::loader;
use nccl_net_ibnet::api;

/// Whether this host's dynamic loader finds a system libibverbs (what the fallback loads).
fn system_libibverbs() -> bool {
    [c"libibverbs.so.1", c"libibverbs.so"].iter().any(|n| {
        // SAFETY: a NUL-terminated name; the handle is deliberately kept (never unloaded, as
        // the plugin's own).
        !unsafe { libc::dlopen(n.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }.is_null()
    })
}

#[test]
fn nccl_ibverbs_lib_falls_back_to_the_system_libibverbs() {
    if util::ran_in_child() {
        return;
    }
    let path = "/nonexistent/ibnet-test/nccl-libibverbs-missing.so.1";
    std::env::remove_var("IBNET_PROVIDER");
    std::env::remove_var("IBNET_IBVERBS_PATH");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    std::env::set_var("NCCL_IBVERBS_LIB", path);
    ibnet_nccl::log::set_sink(util::note);
    assert_eq!(api::init(None, -1, None, None), ncclResult_t::Success);
    let mut n = -1;
    assert_eq!(api::devices(&mut n), ncclResult_t::Success);
    assert!(n >= 0);
    let log = util::take_log();
    let naming = |level: Level| -> Vec<&String> {
        log.iter()
            .filter(|(l, s)| *l == level && s.contains("NCCL_IBVERBS_LIB") && s.contains(path))
            .map(|(_, s)| s)
            .collect()
    };
    if system_libibverbs() {
        assert!(
            loader::get().is_ok(),
            "the system's libibverbs replaces the missing one: {:?}",
            loader::get().err()
        );
        let infos = naming(Level::Info);
        assert_eq!(infos.len(), 1, "{log:?}");
        assert!(infos[0].contains("system's libibverbs"), "{}", infos[0]);
        assert!(naming(Level::Warn).is_empty(), "{log:?}");
    } else {
        eprintln!("NOTE: no system libibverbs here; checking the no-library path only");
        assert_eq!(n, 0);
        assert_eq!(naming(Level::Warn).len(), 1, "{log:?}");
    }
}
