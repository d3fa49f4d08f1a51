//! The six exported tables. Entries ibnet leaves NULL: `getDeviceMr`/`irecvConsumed` (no
//! device offload) and `makeVDevice` (ibnet does not fuse NICs; NCCL then uses each physical
//! device as its own NIC). NCCL reads these tables in place.
#![allow(unsafe_code)] // `#[no_mangle]` statics: the exported symbols NCCL looks up by name.

use super::shims::*;
use crate::nccl::props::{Props11, Props6, Props7, Props8, Props9};
use crate::nccl::tables::{
    ncclNet_v10_t, ncclNet_v11_t, ncclNet_v6_t, ncclNet_v7_t, ncclNet_v8_t, ncclNet_v9_t,
};

/// Exports table `$name` of type `$ty`: the entries every version shares with one shim are
/// filled here, the version's own ones are given.
macro_rules! export {
    ($(#[$doc:meta])* $name:ident: $ty:ident { $($f:ident: $v:expr),* $(,)? }) => {
        $(#[$doc])*
        #[no_mangle]
        #[used]
        pub static $name: $ty = $ty {
            name: c"IBNet".as_ptr(),
            devices: Some(devices),
            reg_mr_dma_buf: Some(reg_mr_dma_buf),
            dereg_mr: Some(dereg_mr),
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
    ncclNetPlugin_v6: ncclNet_v6_t {
        init: Some(init_log), get_properties: Some(get_properties::<Props6>),
        listen: Some(listen_dev), connect: Some(connect_v6), accept: Some(accept_v6),
        reg_mr: Some(reg_mr_int), isend: Some(isend_int), irecv: Some(irecv_int),
    }
);
export!(
    /// `ncclNetPlugin_v7` (NCCL 2.14–2.18).
    ncclNetPlugin_v7: ncclNet_v7_t {
        init: Some(init_log), get_properties: Some(get_properties::<Props7>),
        listen: Some(listen_dev), connect: Some(connect_dev), accept: Some(accept),
        reg_mr: Some(reg_mr_int), isend: Some(isend_int), irecv: Some(irecv_int),
        get_device_mr: None, irecv_consumed: None,
    }
);
export!(
    /// `ncclNetPlugin_v8` (NCCL 2.19–2.23).
    ncclNetPlugin_v8: ncclNet_v8_t {
        init: Some(init_log), get_properties: Some(get_properties::<Props8>),
        listen: Some(listen_dev), connect: Some(connect_dev), accept: Some(accept),
        reg_mr: Some(reg_mr), isend: Some(isend_int), irecv: Some(irecv_int),
        get_device_mr: None, irecv_consumed: None,
    }
);
export!(
    /// `ncclNetPlugin_v9` (NCCL 2.24–2.25).
    ncclNetPlugin_v9: ncclNet_v9_t {
        init: Some(init_log), get_properties: Some(get_properties::<Props9>),
        listen: Some(listen_dev), connect: Some(connect_dev), accept: Some(accept),
        reg_mr: Some(reg_mr), isend: Some(isend_size), irecv: Some(irecv_size),
        get_device_mr: None, irecv_consumed: None, make_vdevice: None,
    }
);
export!(
    /// `ncclNetPlugin_v10` (NCCL 2.26–2.27).
    ncclNetPlugin_v10: ncclNet_v10_t {
        init: Some(init_log_prof), get_properties: Some(get_properties::<Props9>),
        listen: Some(listen_dev), connect: Some(connect_v10), accept: Some(accept),
        reg_mr: Some(reg_mr), isend: Some(isend_ph), irecv: Some(irecv_ph),
        get_device_mr: None, irecv_consumed: None, make_vdevice: None,
    }
);
export!(
    /// `ncclNetPlugin_v11` (NCCL 2.28).
    ncclNetPlugin_v11: ncclNet_v11_t {
        init: Some(init_v11), get_properties: Some(get_properties::<Props11>),
        listen: Some(listen_v11), connect: Some(connect_v11), accept: Some(accept),
        reg_mr: Some(reg_mr), isend: Some(isend_ph), irecv: Some(irecv_ph),
        get_device_mr: None, irecv_consumed: None, make_vdevice: None,
        finalize: Some(finalize), set_net_attr: Some(set_net_attr),
    }
);
