//! The seven exported tables. Entries ibnet leaves NULL: `getDeviceMr`/`irecvConsumed` (no
//! device offload). `makeVDevice` (v9–v12) fuses devices into a virtual NIC whose comms stripe
//! over every rail (`crate::nic`, `ibnet_core::fused`): up to 4 through v9–v11 (their struct
//! holds 4), up to 8 through v12. NCCL reads these tables in place; NCCL 2.30+ takes v12.
#![allow(unsafe_code)] // `#[no_mangle]` statics: the exported symbols NCCL looks up by name.

use super::shims::*;
use ibnet_nccl::props::{Props11, Props12, Props6, Props7, Props8, Props9};
use ibnet_nccl::tables::{
    ncclNet_v10_t, ncclNet_v11_t, ncclNet_v12_t, ncclNet_v6_t, ncclNet_v7_t, ncclNet_v8_t,
    ncclNet_v9_t,
};

/// Exports table `$name` of type `$ty`: the version's own shims are given in the order of
/// [`ibnet_nccl::tables::sig`] (init, listen, connect, accept, regMr, isend, irecv), then its
/// tail; the entries every version shares with one shim are filled here.
macro_rules! export {
    (
        $(#[$doc:meta])* $name:ident: $ty:ident, $props:ty,
        [$init:expr, $listen:expr, $connect:expr, $accept:expr, $reg:expr, $isend:expr, $irecv:expr]
        $(, $f:ident: $v:expr)* $(,)?
    ) => {
        $(#[$doc])*
        #[no_mangle]
        #[used]
        pub static $name: $ty = $ty {
            name: c"IBNet".as_ptr(),
            init: Some($init),
            devices: Some(devices),
            get_properties: Some(get_properties::<$props>),
            listen: Some($listen),
            connect: Some($connect),
            accept: Some($accept),
            reg_mr: Some($reg),
            reg_mr_dma_buf: Some(reg_mr_dma_buf),
            dereg_mr: Some(dereg_mr),
            isend: Some($isend),
            irecv: Some($irecv),
            iflush: Some(iflush),
            test: Some(test),
            close_send: Some(close_send),
            close_recv: Some(close_recv),
            close_listen: Some(close_listen),
            $($f: $v),*
        };
    };
}

export!(
    /// `ncclNetPlugin_v6` (NCCL 2.12–2.13).
    ncclNetPlugin_v6: ncclNet_v6_t, Props6,
    [init_log, listen_dev, connect_v6, accept_v6, reg_mr_int, isend_int, irecv_int]
);
export!(
    /// `ncclNetPlugin_v7` (NCCL 2.14–2.18).
    ncclNetPlugin_v7: ncclNet_v7_t, Props7,
    [init_log, listen_dev, connect_dev, accept, reg_mr_int, isend_int, irecv_int],
    get_device_mr: None, irecv_consumed: None
);
export!(
    /// `ncclNetPlugin_v8` (NCCL 2.19–2.23).
    ncclNetPlugin_v8: ncclNet_v8_t, Props8,
    [init_log, listen_dev, connect_dev, accept, reg_mr, isend_int, irecv_int],
    get_device_mr: None, irecv_consumed: None
);
export!(
    /// `ncclNetPlugin_v9` (NCCL 2.24–2.25).
    ncclNetPlugin_v9: ncclNet_v9_t, Props9,
    [init_log, listen_dev, connect_dev, accept, reg_mr, isend_size, irecv_size],
    get_device_mr: None, irecv_consumed: None, make_vdevice: Some(make_vdevice::<4>)
);
export!(
    /// `ncclNetPlugin_v10` (NCCL 2.26–2.27).
    ncclNetPlugin_v10: ncclNet_v10_t, Props9,
    [init_log_prof, listen_dev, connect_v10, accept, reg_mr, isend_ph, irecv_ph],
    get_device_mr: None, irecv_consumed: None, make_vdevice: Some(make_vdevice::<4>)
);
export!(
    /// `ncclNetPlugin_v11` (NCCL 2.28).
    ncclNetPlugin_v11: ncclNet_v11_t, Props11,
    [init_v11, listen_v11, connect_v11, accept, reg_mr, isend_ph, irecv_ph],
    get_device_mr: None, irecv_consumed: None, make_vdevice: Some(make_vdevice::<4>),
    finalize: Some(finalize), set_net_attr: Some(set_net_attr)
);
export!(
    /// `ncclNetPlugin_v12` (NCCL 2.30+, the first table it looks for).
    ncclNetPlugin_v12: ncclNet_v12_t, Props12,
    [init_v11, listen_v11, connect_v11, accept, reg_mr, isend_ph, irecv_ph],
    get_device_mr: None, irecv_consumed: None, make_vdevice: Some(make_vdevice::<8>),
    finalize: Some(finalize), set_net_attr: Some(set_net_attr)
);
