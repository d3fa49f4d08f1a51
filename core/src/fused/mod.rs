//! NIC fusion (multi-rail): one virtual NIC over up to [`MAX_DEVS_PER_NIC`] physical devices.
//!
//! A *virtual NIC* ([`VNic`]) names the physical devices it fuses, in rail order. NCCL asks for
//! one with `makeVDevice` (the plugin refuses it with `NCCL_IB_MERGE_NICS=0`); its properties
//! are those of rail 0 with the speeds summed.
//!
//! ```text
//!  makeVDevice({2, [mlx5_0, mlx5_1]}) ─▶ VNic [0, 1] ─▶ vNIC "mlx5_0+mlx5_1", speed = sum
//! ```
//!
//! What is checked here is the value itself (1..=4 distinct devices in range); the rules that
//! need the devices' descriptions (same link layer, PCI paths) are the plugin's
//! (`ibnet_ffi::vdev::merge`).

mod vnic;

pub use vnic::{VNic, MAX_DEVS_PER_NIC};

#[cfg(test)]
mod tests;
