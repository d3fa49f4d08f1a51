//! `ibnet_proxy_create`, the one function of the proxy engine's C API (feature `capi`, on by
//! default) that ffi exports itself: with a NULL plugin path the engine runs over this
//! library's own `ncclNetPlugin_v11`, which only this crate can name. The rest of the C API is
//! ibnet-proxy's (`ibnet_proxy::capi`, its `capi` feature), in the same `.so`/`.a`.
#![allow(unsafe_code)] // An exported function taking C's pointers; the call has a SAFETY comment.

use core::ffi::c_char;

use ibnet_nccl::foreign::Table;
use ibnet_nccl::types::ncclResult_t;
use ibnet_proxy::capi::entry::{create, CConfig, CProxy};
use ibnet_proxy::capi::CMemTable;

/// `ibnet_proxy_create` (see `include/ibnet.h`): a proxy over the plugin at `plugin_path`, or
/// over this library's own plugin when it is NULL.
///
/// # Safety
/// Pointers are valid or NULL; `plugin_path` is NUL-terminated; `mem` callbacks follow
/// [`CMemTable`]'s contract while the proxy lives.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_create(
    plugin_path: *const c_char,
    cfg: *const CConfig,
    mem: *const CMemTable,
    px: *mut *mut CProxy,
) -> ncclResult_t {
    let own = Table::V11(crate::abi::exports::ncclNetPlugin_v11);
    // SAFETY: `own` is a copy of this library's own static v11 table; the pointers are the
    // caller's, under the contract above, which is `create`'s.
    unsafe { create(own, plugin_path, cfg, mem, px) }
}
