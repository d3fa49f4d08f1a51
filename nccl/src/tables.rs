//! `ncclNet_v6_t` … `ncclNet_v12_t`, each defined once by `net_table!` and used in both
//! directions: ibnet exports one of each (ibnet-ffi's `abi/exports.rs`), and [`crate::foreign`] reads whichever a
//! plugin `.so` exports (ibnet's own included).
//!
//! Every entry is an `Option<unsafe extern "C" fn …>`: the NULL niche gives it the layout of
//! the C function pointer, and a plugin that leaves an entry NULL is read as `None` (reading
//! NULL into a non-nullable Rust `fn` would be undefined behaviour). Results are
//! [`ncclResult_t`], a transparent C `int`, so any value a foreign plugin returns is sound.
//!
//! ```text
//!  entry            v6    v7    v8     v9     v10               v11 (= v12)
//!  init(…)          log   log   log    log    log, prof         ctx*, commId, cfg, log, prof
//!  getProperties    P6    P7    P8     P9     P9                P11 (v12: P12)
//!  listen/connect   dev   dev   dev    dev    dev (+cfg)        ctx, dev
//!  connect/accept   -     +devHandle ──────────────────────────────────────────▶
//!  regMr size       int   int   size_t ──────────────────────────────────────▶
//!  isend/irecv      int   int   int    size_t size_t, phandles ──────────────▶
//!  tail             -     getDeviceMr, irecvConsumed; v9+ makeVDevice; v11 finalize, setNetAttr
//!  makeVDevice      -     -     -      4 devs 4 devs            4 devs (v12: 8 devs)
//! ```
//! v12 (NCCL 2.30.7 `net_v12.h`) has v11's entries with the same signatures but for two
//! types: `getProperties` takes [`Props12`] (`railId`, `planeId`) and `makeVDevice` a
//! `ncclNetVDeviceProps_v12_t` of up to 8 devices.
//! The sizes and a few offsets are asserted at compile time (8 bytes per entry on LP64).
#![allow(non_camel_case_types)]
#![allow(unsafe_code)] // `unsafe impl Sync` for the tables (plain data; see the SAFETY comment).

use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

use super::props::{Props11, Props12, Props6, Props7, Props8, Props9};
use super::types::{
    ncclDebugLogger_t, ncclNetAttr_t, ncclNetCommConfig_t, ncclNetDeviceHandle_t,
    ncclNetVDeviceProps_t, ncclNetVDeviceProps_v12_t, ncclProfilerCallback_t, ncclResult_t,
};

type R = ncclResult_t;
type V = *mut c_void;
type PV = *mut *mut c_void;
type DevH = *mut *mut ncclNetDeviceHandle_t;

/// The entry signatures that differ between versions, each named once (`_dev`: no ctx,
/// `_dh`: with a device handle, `_int`/`_size`: `int`/`size_t` sizes, `_ph`: profiler
/// handles).
#[allow(missing_docs)]
pub mod sig {
    use super::*;
    pub type InitLog = unsafe extern "C" fn(ncclDebugLogger_t) -> R;
    pub type InitLogProf = unsafe extern "C" fn(ncclDebugLogger_t, ncclProfilerCallback_t) -> R;
    pub type InitV11 = unsafe extern "C" fn(
        PV,
        u64,
        *mut ncclNetCommConfig_t,
        ncclDebugLogger_t,
        ncclProfilerCallback_t,
    ) -> R;
    pub type ListenDev = unsafe extern "C" fn(c_int, V, PV) -> R;
    pub type ListenV11 = unsafe extern "C" fn(V, c_int, V, PV) -> R;
    pub type ConnectV6 = unsafe extern "C" fn(c_int, V, PV) -> R;
    pub type ConnectDh = unsafe extern "C" fn(c_int, V, PV, DevH) -> R;
    pub type ConnectV10 = unsafe extern "C" fn(c_int, *mut ncclNetCommConfig_t, V, PV, DevH) -> R;
    pub type ConnectV11 = unsafe extern "C" fn(V, c_int, V, PV, DevH) -> R;
    pub type AcceptV6 = unsafe extern "C" fn(V, PV) -> R;
    pub type AcceptDh = unsafe extern "C" fn(V, PV, DevH) -> R;
    pub type RegMrInt = unsafe extern "C" fn(V, V, c_int, c_int, PV) -> R;
    pub type RegMrSize = unsafe extern "C" fn(V, V, usize, c_int, PV) -> R;
    pub type IsendInt = unsafe extern "C" fn(V, V, c_int, c_int, V, PV) -> R;
    pub type IsendSize = unsafe extern "C" fn(V, V, usize, c_int, V, PV) -> R;
    pub type IsendPh = unsafe extern "C" fn(V, V, usize, c_int, V, V, PV) -> R;
    pub type IrecvInt = unsafe extern "C" fn(V, c_int, PV, *mut c_int, *mut c_int, PV, PV) -> R;
    pub type IrecvSize = unsafe extern "C" fn(V, c_int, PV, *mut usize, *mut c_int, PV, PV) -> R;
    pub type IrecvPh = unsafe extern "C" fn(V, c_int, PV, *mut usize, *mut c_int, PV, PV, PV) -> R;
    pub type GetDeviceMr = unsafe extern "C" fn(V, V, PV) -> R;
    pub type IrecvConsumed = unsafe extern "C" fn(V, c_int, V) -> R;
    pub type MakeVDevice = unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_t) -> R;
    pub type MakeVDevice12 = unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v12_t) -> R;
    pub type Finalize = unsafe extern "C" fn(V) -> R;
    pub type SetNetAttr = unsafe extern "C" fn(V, *mut ncclNetAttr_t) -> R;
}
use sig::*;

/// Defines one `ncclNet_vN_t`: the entries that differ between versions are given as
/// [`sig`] types, those every version shares with one signature are written here once, then
/// the version's tail.
macro_rules! net_table {
    (
        $(#[$doc:meta])* $name:ident, $props:ty,
        [$init:ty, $listen:ty, $connect:ty, $accept:ty, $reg:ty, $isend:ty, $irecv:ty],
        tail { $($tail:ident: $tty:ty),* }
    ) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy)]
        #[allow(missing_docs)]
        pub struct $name {
            pub name: *const c_char,
            pub init: Option<$init>,
            pub devices: Option<unsafe extern "C" fn(*mut c_int) -> R>,
            pub get_properties: Option<unsafe extern "C" fn(c_int, *mut $props) -> R>,
            pub listen: Option<$listen>,
            pub connect: Option<$connect>,
            pub accept: Option<$accept>,
            pub reg_mr: Option<$reg>,
            pub reg_mr_dma_buf: Option<unsafe extern "C" fn(V, V, usize, c_int, u64, c_int, PV) -> R>,
            pub dereg_mr: Option<unsafe extern "C" fn(V, V) -> R>,
            pub isend: Option<$isend>,
            pub irecv: Option<$irecv>,
            pub iflush: Option<unsafe extern "C" fn(V, c_int, PV, *mut c_int, PV, PV) -> R>,
            pub test: Option<unsafe extern "C" fn(V, *mut c_int, *mut c_int) -> R>,
            pub close_send: Option<unsafe extern "C" fn(V) -> R>,
            pub close_recv: Option<unsafe extern "C" fn(V) -> R>,
            pub close_listen: Option<unsafe extern "C" fn(V) -> R>,
            $(pub $tail: Option<$tty>,)*
        }
        // SAFETY: the table is plain data (a static string and function pointers), never
        // written after it is built (exported statics) or copied (foreign tables).
        unsafe impl Sync for $name {}
    };
}

net_table!(
    /// `ncclNet_v6_t` (NCCL 2.12–2.13): no device handles, `int` sizes.
    ncclNet_v6_t, Props6,
    [InitLog, ListenDev, ConnectV6, AcceptV6, RegMrInt, IsendInt, IrecvInt], tail {}
);
net_table!(
    /// `ncclNet_v7_t` (NCCL 2.14–2.18): device handles, `getDeviceMr`, `irecvConsumed`.
    ncclNet_v7_t, Props7, [InitLog, ListenDev, ConnectDh, AcceptDh, RegMrInt, IsendInt, IrecvInt],
    tail { get_device_mr: GetDeviceMr, irecv_consumed: IrecvConsumed }
);
net_table!(
    /// `ncclNet_v8_t` (NCCL 2.19–2.23): `size_t` on regMr, properties with `regIsGlobal`.
    ncclNet_v8_t, Props8, [InitLog, ListenDev, ConnectDh, AcceptDh, RegMrSize, IsendInt, IrecvInt],
    tail { get_device_mr: GetDeviceMr, irecv_consumed: IrecvConsumed }
);
net_table!(
    /// `ncclNet_v9_t` (NCCL 2.24–2.25): `size_t` sizes on isend/irecv, `makeVDevice`.
    ncclNet_v9_t, Props9,
    [InitLog, ListenDev, ConnectDh, AcceptDh, RegMrSize, IsendSize, IrecvSize],
    tail { get_device_mr: GetDeviceMr, irecv_consumed: IrecvConsumed, make_vdevice: MakeVDevice }
);
net_table!(
    /// `ncclNet_v10_t` (NCCL 2.26–2.27): `init(log, prof)`, the comm config on `connect`,
    /// profiler handles on isend/irecv.
    ncclNet_v10_t, Props9,
    [InitLogProf, ListenDev, ConnectV10, AcceptDh, RegMrSize, IsendPh, IrecvPh],
    tail { get_device_mr: GetDeviceMr, irecv_consumed: IrecvConsumed, make_vdevice: MakeVDevice }
);
net_table!(
    /// `ncclNet_v11_t` (NCCL 2.28): per-communicator `init(ctx, commId, config)`, `finalize`,
    /// `setNetAttr`.
    ncclNet_v11_t, Props11,
    [InitV11, ListenV11, ConnectV11, AcceptDh, RegMrSize, IsendPh, IrecvPh],
    tail {
        get_device_mr: GetDeviceMr, irecv_consumed: IrecvConsumed, make_vdevice: MakeVDevice,
        finalize: Finalize, set_net_attr: SetNetAttr
    }
);

net_table!(
    /// `ncclNet_v12_t` (NCCL 2.30+): v11 with [`Props12`] and vNICs of up to 8 devices.
    ncclNet_v12_t, Props12,
    [InitV11, ListenV11, ConnectV11, AcceptDh, RegMrSize, IsendPh, IrecvPh],
    tail {
        get_device_mr: GetDeviceMr, irecv_consumed: IrecvConsumed, make_vdevice: MakeVDevice12,
        finalize: Finalize, set_net_attr: SetNetAttr
    }
);

const _: () = assert!(size_of::<ncclNet_v6_t>() == 17 * 8);
const _: () = assert!(size_of::<ncclNet_v12_t>() == 22 * 8);
const _: () = assert!(offset_of!(ncclNet_v12_t, make_vdevice) == 19 * 8);
const _: () = assert!(offset_of!(ncclNet_v12_t, set_net_attr) == 21 * 8);
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
