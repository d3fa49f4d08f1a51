//! Small value types shared by the probes: [`Decision`], [`Vendor`], [`PointerKind`].

use std::fmt;

/// A yes/no capability decision with the reason it was taken, for the plugin's INFO log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the capability is enabled.
    pub enabled: bool,
    /// Why, in words (names the file, variable or call that decided it).
    pub reason: String,
}

impl Decision {
    /// An enabling decision.
    pub fn yes(reason: impl Into<String>) -> Self {
        Self {
            enabled: true,
            reason: reason.into(),
        }
    }

    /// A disabling decision.
    pub fn no(reason: impl Into<String>) -> Self {
        Self {
            enabled: false,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = if self.enabled { "enabled" } else { "disabled" };
        write!(f, "{word}: {}", self.reason)
    }
}

/// Which GPU stack a runtime belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// NVIDIA, through the CUDA driver API (`libcuda.so.1`).
    Nvidia,
    /// AMD, through HIP (`libamdhip64.so`) and HSA (`libhsa-runtime64.so`).
    Amd,
}

impl fmt::Display for Vendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Nvidia => "CUDA",
            Self::Amd => "ROCm",
        })
    }
}

/// What kind of memory an address points at, as the GPU runtime sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointerKind {
    /// Not known to the runtime: ordinary pageable host memory (or garbage).
    Unregistered,
    /// Host memory the runtime knows (pinned with `cuMemHostAlloc`/`hipHostMalloc` or registered).
    Host,
    /// Device memory of GPU `device`.
    Device {
        /// Device ordinal, `-1` if the runtime did not report it.
        device: i32,
    },
    /// Managed (unified) memory that migrates between host and device.
    Managed,
    /// The runtime reported a memory type this crate does not know (raw value kept).
    Other(u32),
}

impl PointerKind {
    /// Whether NCCL would call this `NCCL_PTR_CUDA` memory (device, not host).
    pub fn is_device(self) -> bool {
        matches!(self, Self::Device { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_display() {
        assert_eq!(Decision::yes("x").to_string(), "enabled: x");
        assert_eq!(Decision::no("y").to_string(), "disabled: y");
    }

    #[test]
    fn pointer_kind_device() {
        assert!(PointerKind::Device { device: 0 }.is_device());
        assert!(!PointerKind::Managed.is_device());
        assert!(!PointerKind::Host.is_device());
    }
}
