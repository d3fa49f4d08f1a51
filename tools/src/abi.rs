//! The plugin tables as ibnet-perf reads them from a foreign `.so`: `ncclNet_v8_t` …
//! `ncclNet_v11_t` (NCCL 2.28.9 `src/include/plugin/net/net_v*.h`), with **every** function
//! pointer an `Option`, since a plugin may leave any member NULL and reading NULL into a
//! non-nullable Rust `fn` is undefined behaviour. Property structs and constants come from
//! ibnet-ffi's `abi` (plain data); the sizes are checked against ibnet-ffi's own tables.

#![allow(missing_docs)]

use core::ffi::{c_char, c_int, c_void};
use core::mem::size_of;

pub use ibnet_ffi::abi::types::{
    ncclNetCommConfig_t, ncclNetDeviceHandle_t, NCCL_NET_HANDLE_MAXSIZE, NCCL_PTR_CUDA,
    NCCL_PTR_DMABUF, NCCL_PTR_HOST,
};
pub use ibnet_ffi::abi::v11::Props11;
pub use ibnet_ffi::abi::v8::Props8;
pub use ibnet_ffi::abi::v9::Props9;

type V = *mut c_void;
type PV = *mut *mut c_void;
/// Return values are read as raw `int`: a foreign plugin may return any value, and an
/// out-of-range value in a Rust enum would be undefined behaviour.
type R = c_int;
type DevH = *mut *mut ncclNetDeviceHandle_t;
/// The logger as passed to `init` (the C-variadic shim, as an opaque function pointer).
pub type Logger = Option<unsafe extern "C" fn()>;

/// Members shared by v8..v11 with identical signatures (after the version-specific ones).
macro_rules! table {
    ($(#[$m:meta])* $name:ident, $props:ty, { $($pre:tt)* }, { $($mid:tt)* }, { $($post:tt)* }) => {
        $(#[$m])*
        #[repr(C)]
        pub struct $name {
            pub name: *const c_char,
            $($pre)*
            pub devices: Option<unsafe extern "C" fn(*mut c_int) -> R>,
            pub get_properties: Option<unsafe extern "C" fn(c_int, *mut $props) -> R>,
            $($mid)*
            pub reg_mr_dma_buf: Option<unsafe extern "C" fn(V, V, usize, c_int, u64, c_int, PV) -> R>,
            pub dereg_mr: Option<unsafe extern "C" fn(V, V) -> R>,
            $($post)*
            pub iflush: Option<unsafe extern "C" fn(V, c_int, PV, *mut c_int, PV, PV) -> R>,
            pub test: Option<unsafe extern "C" fn(V, *mut c_int, *mut c_int) -> R>,
            pub close_send: Option<unsafe extern "C" fn(V) -> R>,
            pub close_recv: Option<unsafe extern "C" fn(V) -> R>,
            pub close_listen: Option<unsafe extern "C" fn(V) -> R>,
            pub get_device_mr: Option<unsafe extern "C" fn(V, V, PV) -> R>,
            pub irecv_consumed: Option<unsafe extern "C" fn(V, c_int, V) -> R>,
        }
    };
}

table!(
    /// `ncclNet_v11_t` (tail: makeVDevice, finalize, setNetAttr follow in [`Net11`]).
    Net11Head, Props11,
    { pub init: Option<unsafe extern "C" fn(PV, u64, *mut ncclNetCommConfig_t, Logger, Logger) -> R>, },
    {
        pub listen: Option<unsafe extern "C" fn(V, c_int, V, PV) -> R>,
        pub connect: Option<unsafe extern "C" fn(V, c_int, V, PV, DevH) -> R>,
        pub accept: Option<unsafe extern "C" fn(V, PV, DevH) -> R>,
        pub reg_mr: Option<unsafe extern "C" fn(V, V, usize, c_int, PV) -> R>,
    },
    {
        pub isend: Option<unsafe extern "C" fn(V, V, usize, c_int, V, V, PV) -> R>,
        pub irecv: Option<unsafe extern "C" fn(V, c_int, PV, *mut usize, *mut c_int, PV, PV, PV) -> R>,
    }
);

/// `ncclNet_v11_t`.
#[repr(C)]
pub struct Net11 {
    pub head: Net11Head,
    pub make_vdevice: Option<unsafe extern "C" fn(*mut c_int, V) -> R>,
    pub finalize: Option<unsafe extern "C" fn(V) -> R>,
    pub set_net_attr: Option<unsafe extern "C" fn(V, V) -> R>,
}

table!(
    /// `ncclNet_v10_t` (tail: makeVDevice).
    Net10, Props9,
    { pub init: Option<unsafe extern "C" fn(Logger, Logger) -> R>, },
    {
        pub listen: Option<unsafe extern "C" fn(c_int, V, PV) -> R>,
        pub connect: Option<unsafe extern "C" fn(c_int, *mut ncclNetCommConfig_t, V, PV, DevH) -> R>,
        pub accept: Option<unsafe extern "C" fn(V, PV, DevH) -> R>,
        pub reg_mr: Option<unsafe extern "C" fn(V, V, usize, c_int, PV) -> R>,
    },
    {
        pub isend: Option<unsafe extern "C" fn(V, V, usize, c_int, V, V, PV) -> R>,
        pub irecv: Option<unsafe extern "C" fn(V, c_int, PV, *mut usize, *mut c_int, PV, PV, PV) -> R>,
    }
);

table!(
    /// `ncclNet_v9_t` (tail: makeVDevice).
    Net9, Props9,
    { pub init: Option<unsafe extern "C" fn(Logger) -> R>, },
    {
        pub listen: Option<unsafe extern "C" fn(c_int, V, PV) -> R>,
        pub connect: Option<unsafe extern "C" fn(c_int, V, PV, DevH) -> R>,
        pub accept: Option<unsafe extern "C" fn(V, PV, DevH) -> R>,
        pub reg_mr: Option<unsafe extern "C" fn(V, V, usize, c_int, PV) -> R>,
    },
    {
        pub isend: Option<unsafe extern "C" fn(V, V, usize, c_int, V, PV) -> R>,
        pub irecv: Option<unsafe extern "C" fn(V, c_int, PV, *mut usize, *mut c_int, PV, PV) -> R>,
    }
);

table!(
    /// `ncclNet_v8_t`: `int` sizes for isend/irecv.
    Net8, Props8,
    { pub init: Option<unsafe extern "C" fn(Logger) -> R>, },
    {
        pub listen: Option<unsafe extern "C" fn(c_int, V, PV) -> R>,
        pub connect: Option<unsafe extern "C" fn(c_int, V, PV, DevH) -> R>,
        pub accept: Option<unsafe extern "C" fn(V, PV, DevH) -> R>,
        pub reg_mr: Option<unsafe extern "C" fn(V, V, usize, c_int, PV) -> R>,
    },
    {
        pub isend: Option<unsafe extern "C" fn(V, V, c_int, c_int, V, PV) -> R>,
        pub irecv: Option<unsafe extern "C" fn(V, c_int, PV, *mut c_int, *mut c_int, PV, PV) -> R>,
    }
);

const _: () = assert!(size_of::<Net11>() == size_of::<ibnet_ffi::abi::v11::NetV11>());
const _: () = assert!(size_of::<Net11>() == 22 * 8);
const _: () = assert!(size_of::<Net10>() == 19 * 8);
const _: () = assert!(size_of::<Net9>() == 19 * 8);
const _: () = assert!(size_of::<Net8>() == size_of::<ibnet_ffi::abi::v8::NetV8>());

/// `ncclResult_t`'s name for a raw value (a foreign plugin may return anything).
pub fn result_name(v: i32) -> &'static str {
    match v {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "unknown ncclResult_t",
    }
}
