//! `ncclNet_v6_t` … `ncclNet_v11_t`, each defined once by [`net_table!`] and used in both
//! directions: ibnet exports one of each (`abi/vN`), and [`crate::foreign`] reads whichever a
//! plugin `.so` exports (ibnet's own included).
//!
//! Every entry is an `Option<unsafe extern "C" fn …>`: the NULL niche gives it the layout of
//! the C function pointer, and a plugin that leaves an entry NULL is read as `None` (reading
//! NULL into a non-nullable Rust `fn` would be undefined behaviour). Results are
//! [`ncclResult_t`], a transparent C `int`, so any value a foreign plugin returns is sound.
//!
//! ```text
//!  entry            v6    v7    v8     v9     v10               v11
//!  init(…)          log   log   log    log    log, prof         ctx*, commId, cfg, log, prof
//!  getProperties    P6    P7    P8     P9     P9                P11
//!  listen/connect   dev   dev   dev    dev    dev (+cfg)        ctx, dev
//!  connect/accept   -     +devHandle ──────────────────────────────────────────▶
//!  regMr size       int   int   size_t ──────────────────────────────────────▶
//!  isend/irecv      int   int   int    size_t size_t, phandles ──────────────▶
//!  tail             -     getDeviceMr, irecvConsumed; v9+ makeVDevice; v11 finalize, setNetAttr
//! ```
//! The sizes and a few offsets are asserted at compile time (8 bytes per entry on LP64).
#![allow(non_camel_case_types)]
#![allow(unsafe_code)] // `unsafe impl Sync` for the tables (plain data; see the SAFETY comment).

use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

use super::props::{Props11, Props6, Props7, Props8, Props9};
use super::types::{
    ncclDebugLogger_t, ncclNetAttr_t, ncclNetCommConfig_t, ncclNetDeviceHandle_t,
    ncclNetVDeviceProps_t, ncclProfilerCallback_t, ncclResult_t,
};

type R = ncclResult_t;
type V = *mut c_void;
type PV = *mut *mut c_void;
type DevH = *mut *mut ncclNetDeviceHandle_t;

/// Defines one `ncclNet_vN_t`: the entries that differ between versions are given, those
/// every version shares with one signature are written here once, then the version's tail.
macro_rules! net_table {
    (
        $(#[$doc:meta])* $name:ident, $props:ty,
        init($($init:ty),*), listen($($listen:ty),*), connect($($connect:ty),*),
        accept($($accept:ty),*), reg_mr($($reg:ty),*), isend($($isend:ty),*),
        irecv($($irecv:ty),*), tail { $($tail:ident($($targ:ty),*)),* }
    ) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy)]
        #[allow(missing_docs)]
        pub struct $name {
            pub name: *const c_char,
            pub init: Option<unsafe extern "C" fn($($init),*) -> R>,
            pub devices: Option<unsafe extern "C" fn(*mut c_int) -> R>,
            pub get_properties: Option<unsafe extern "C" fn(c_int, *mut $props) -> R>,
            pub listen: Option<unsafe extern "C" fn($($listen),*) -> R>,
            pub connect: Option<unsafe extern "C" fn($($connect),*) -> R>,
            pub accept: Option<unsafe extern "C" fn($($accept),*) -> R>,
            pub reg_mr: Option<unsafe extern "C" fn($($reg),*) -> R>,
            pub reg_mr_dma_buf: Option<unsafe extern "C" fn(V, V, usize, c_int, u64, c_int, PV) -> R>,
            pub dereg_mr: Option<unsafe extern "C" fn(V, V) -> R>,
            pub isend: Option<unsafe extern "C" fn($($isend),*) -> R>,
            pub irecv: Option<unsafe extern "C" fn($($irecv),*) -> R>,
            pub iflush: Option<unsafe extern "C" fn(V, c_int, PV, *mut c_int, PV, PV) -> R>,
            pub test: Option<unsafe extern "C" fn(V, *mut c_int, *mut c_int) -> R>,
            pub close_send: Option<unsafe extern "C" fn(V) -> R>,
            pub close_recv: Option<unsafe extern "C" fn(V) -> R>,
            pub close_listen: Option<unsafe extern "C" fn(V) -> R>,
            $(pub $tail: Option<unsafe extern "C" fn($($targ),*) -> R>,)*
        }
        // SAFETY: the table is plain data (a static string and function pointers), never
        // written after it is built (exported statics) or copied (foreign tables).
        unsafe impl Sync for $name {}
    };
}

net_table!(
    /// `ncclNet_v6_t` (NCCL 2.12–2.13): no device handles, `int` sizes.
    ncclNet_v6_t, Props6,
    init(ncclDebugLogger_t), listen(c_int, V, PV), connect(c_int, V, PV), accept(V, PV),
    reg_mr(V, V, c_int, c_int, PV), isend(V, V, c_int, c_int, V, PV),
    irecv(V, c_int, PV, *mut c_int, *mut c_int, PV, PV), tail {}
);
net_table!(
    /// `ncclNet_v7_t` (NCCL 2.14–2.18): device handles, `getDeviceMr`, `irecvConsumed`.
    ncclNet_v7_t, Props7,
    init(ncclDebugLogger_t), listen(c_int, V, PV), connect(c_int, V, PV, DevH),
    accept(V, PV, DevH), reg_mr(V, V, c_int, c_int, PV), isend(V, V, c_int, c_int, V, PV),
    irecv(V, c_int, PV, *mut c_int, *mut c_int, PV, PV),
    tail { get_device_mr(V, V, PV), irecv_consumed(V, c_int, V) }
);
net_table!(
    /// `ncclNet_v8_t` (NCCL 2.19–2.23): `size_t` on regMr, properties with `regIsGlobal`.
    ncclNet_v8_t, Props8,
    init(ncclDebugLogger_t), listen(c_int, V, PV), connect(c_int, V, PV, DevH),
    accept(V, PV, DevH), reg_mr(V, V, usize, c_int, PV), isend(V, V, c_int, c_int, V, PV),
    irecv(V, c_int, PV, *mut c_int, *mut c_int, PV, PV),
    tail { get_device_mr(V, V, PV), irecv_consumed(V, c_int, V) }
);
net_table!(
    /// `ncclNet_v9_t` (NCCL 2.24–2.25): `size_t` sizes on isend/irecv, `makeVDevice`.
    ncclNet_v9_t, Props9,
    init(ncclDebugLogger_t), listen(c_int, V, PV), connect(c_int, V, PV, DevH),
    accept(V, PV, DevH), reg_mr(V, V, usize, c_int, PV), isend(V, V, usize, c_int, V, PV),
    irecv(V, c_int, PV, *mut usize, *mut c_int, PV, PV),
    tail {
        get_device_mr(V, V, PV), irecv_consumed(V, c_int, V),
        make_vdevice(*mut c_int, *mut ncclNetVDeviceProps_t)
    }
);
net_table!(
    /// `ncclNet_v10_t` (NCCL 2.26–2.27): `init(log, prof)`, the comm config on `connect`,
    /// profiler handles on isend/irecv.
    ncclNet_v10_t, Props9,
    init(ncclDebugLogger_t, ncclProfilerCallback_t), listen(c_int, V, PV),
    connect(c_int, *mut ncclNetCommConfig_t, V, PV, DevH), accept(V, PV, DevH),
    reg_mr(V, V, usize, c_int, PV), isend(V, V, usize, c_int, V, V, PV),
    irecv(V, c_int, PV, *mut usize, *mut c_int, PV, PV, PV),
    tail {
        get_device_mr(V, V, PV), irecv_consumed(V, c_int, V),
        make_vdevice(*mut c_int, *mut ncclNetVDeviceProps_t)
    }
);
net_table!(
    /// `ncclNet_v11_t` (NCCL 2.28): per-communicator `init(ctx, commId, config)`, `finalize`,
    /// `setNetAttr`.
    ncclNet_v11_t, Props11,
    init(PV, u64, *mut ncclNetCommConfig_t, ncclDebugLogger_t, ncclProfilerCallback_t),
    listen(V, c_int, V, PV), connect(V, c_int, V, PV, DevH), accept(V, PV, DevH),
    reg_mr(V, V, usize, c_int, PV), isend(V, V, usize, c_int, V, V, PV),
    irecv(V, c_int, PV, *mut usize, *mut c_int, PV, PV, PV),
    tail {
        get_device_mr(V, V, PV), irecv_consumed(V, c_int, V),
        make_vdevice(*mut c_int, *mut ncclNetVDeviceProps_t), finalize(V),
        set_net_attr(V, *mut ncclNetAttr_t)
    }
);

const _: () = assert!(size_of::<ncclNet_v6_t>() == 17 * 8);
const _: () = assert!(size_of::<ncclNet_v7_t>() == 19 * 8);
const _: () = assert!(size_of::<ncclNet_v8_t>() == 19 * 8);
const _: () = assert!(size_of::<ncclNet_v9_t>() == 20 * 8);
const _: () = assert!(size_of::<ncclNet_v10_t>() == 20 * 8);
const _: () = assert!(size_of::<ncclNet_v11_t>() == 22 * 8);
const _: () = assert!(offset_of!(ncclNet_v6_t, close_listen) == 16 * 8);
const _: () = assert!(offset_of!(ncclNet_v8_t, irecv_consumed) == 18 * 8);
const _: () = assert!(offset_of!(ncclNet_v10_t, make_vdevice) == 19 * 8);
const _: () = assert!(offset_of!(ncclNet_v11_t, finalize) == 20 * 8);
const _: () = assert!(offset_of!(ncclNet_v11_t, set_net_attr) == 21 * 8);
