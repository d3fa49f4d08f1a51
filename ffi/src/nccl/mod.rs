//! NCCL's net plugin ABI as data: the ground floor of ibnet-ffi (it imports nothing else of
//! the crate). Layouts from NCCL 2.28.9 and 2.30.7 (v12) `src/include/plugin/net/net_v*.h`.
//!
//! * [`types`]: `ncclResult_t`, constants, the device handle, comm config, net attributes,
//!   the logger type;
//! * [`props`]: `ncclNetProperties_vN_t` and the version-agnostic [`props::Props`];
//! * [`tables`]: `ncclNet_v6_t` … `ncclNet_v12_t`, each defined once, exported by
//!   [`crate::abi`] and read from any plugin by [`crate::foreign`].

pub mod props;
pub mod tables;
pub mod types;
