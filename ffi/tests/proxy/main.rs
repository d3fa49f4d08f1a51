//! The proxy engine's C API, one test binary: the header's complete C example
//! ([`proxy_c_example`]), the C API's hooks over this library ([`proxy_capi_hooks`]) and the
//! engine over ibnet's own `dlopen`ed `.so` ([`proxy_foreign_net`]). Each module sets the same
//! environment (`IBNET_PROVIDER=soft`, `NCCL_SOCKET_IFNAME=lo`); the linked library and the
//! `dlopen`ed one are two separate plugin instances.

mod proxy_c_example;
mod proxy_capi_hooks;
mod proxy_foreign_net;
