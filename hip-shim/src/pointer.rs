//! Mapping raw runtime answers to [`PointerKind`], and the DMA-BUF export window.
//!
//! ```text
//! CUDA  CU_POINTER_ATTRIBUTE_MEMORY_TYPE    1 HOST  2 DEVICE  3 ARRAY  4 UNIFIED
//!       status CUDA_ERROR_INVALID_VALUE     → Unregistered (plain pageable memory)
//!       IS_MANAGED = 1                      → Managed (overrides the type)
//! HIP   ROCm ≥ 6  hipMemoryType   0 Unregistered 1 Host 2 Device 3 Managed 10 Array 11 Unified
//!       ROCm 5    hipMemoryType   0 Host 1 Device 2 Array 3 Unified
//!                 (unknown host memory: hipErrorInvalidValue → Unregistered)
//!       HIP_VERSION = major·10⁷ + minor·10⁵ + patch decides which table applies
//! ```

use crate::decision::PointerKind;
use crate::error::{Error, Result};

/// Maps CUDA's memory type / managed flag / device ordinal.
pub(crate) fn cuda_kind(mem_type: u32, is_managed: bool, device: i32) -> PointerKind {
    if is_managed {
        return PointerKind::Managed;
    }
    match mem_type {
        1 => PointerKind::Host,
        2 => PointerKind::Device { device },
        4 => PointerKind::Managed,
        other => PointerKind::Other(other),
    }
}

/// Maps HIP's pointer attributes, given the runtime's `HIP_VERSION`.
pub(crate) fn hip_kind(
    runtime_version: i32,
    mem_type: u32,
    is_managed: bool,
    device: i32,
) -> PointerKind {
    if is_managed {
        return PointerKind::Managed;
    }
    if runtime_version / 10_000_000 >= 6 {
        match mem_type {
            0 => PointerKind::Unregistered,
            1 => PointerKind::Host,
            2 => PointerKind::Device { device },
            3 | 11 => PointerKind::Managed,
            other => PointerKind::Other(other),
        }
    } else {
        match mem_type {
            0 => PointerKind::Host,
            1 => PointerKind::Device { device },
            3 => PointerKind::Managed,
            other => PointerKind::Other(other),
        }
    }
}

/// The page-aligned window `[start, stop)` to export for `[addr, addr + len)` inside the
/// allocation `[base, base + size)`: `addr` rounded down and the end rounded up to `page`,
/// clamped to the allocation. `cuMemGetHandleForAddressRange` wants page-aligned ranges; the
/// caller registers at `offset = addr - start` inside the DMA-BUF.
pub(crate) fn export_window(
    addr: u64,
    len: usize,
    base: u64,
    size: usize,
    page: u64,
) -> Result<(u64, u64)> {
    let len = u64::try_from(len).map_err(|_| Error::InvalidArgument {
        what: "length too large",
    })?;
    let size = u64::try_from(size).map_err(|_| Error::InvalidArgument {
        what: "allocation too large",
    })?;
    if len == 0 {
        return Err(Error::InvalidArgument {
            what: "zero-length range",
        });
    }
    if !page.is_power_of_two() {
        return Err(Error::InvalidArgument {
            what: "page size not a power of two",
        });
    }
    let end = addr.checked_add(len).ok_or(Error::InvalidArgument {
        what: "range wraps",
    })?;
    let alloc_end = base.checked_add(size).ok_or(Error::InvalidArgument {
        what: "allocation wraps",
    })?;
    if addr < base || end > alloc_end {
        return Err(Error::InvalidArgument {
            what: "range is not inside one device allocation",
        });
    }
    let start = (addr & !(page - 1)).max(base);
    let stop = end
        .checked_add(page - 1)
        .map_or(alloc_end, |e| e & !(page - 1))
        .min(alloc_end);
    Ok((start, stop))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_kinds() {
        assert_eq!(cuda_kind(1, false, 0), PointerKind::Host);
        assert_eq!(cuda_kind(2, false, 1), PointerKind::Device { device: 1 });
        assert_eq!(cuda_kind(2, true, 1), PointerKind::Managed);
        assert_eq!(cuda_kind(4, false, 0), PointerKind::Managed);
        assert_eq!(cuda_kind(3, false, 0), PointerKind::Other(3));
    }

    #[test]
    fn hip_kinds_by_version() {
        let v6 = 60_200_000; // ROCm 6.2
        let v5 = 50_700_000; // ROCm 5.7
        assert_eq!(hip_kind(v6, 0, false, 0), PointerKind::Unregistered);
        assert_eq!(hip_kind(v6, 1, false, 0), PointerKind::Host);
        assert_eq!(hip_kind(v6, 2, false, 3), PointerKind::Device { device: 3 });
        assert_eq!(hip_kind(v6, 3, false, 0), PointerKind::Managed);
        assert_eq!(hip_kind(v6, 10, false, 0), PointerKind::Other(10));
        assert_eq!(hip_kind(v5, 0, false, 0), PointerKind::Host);
        assert_eq!(hip_kind(v5, 1, false, 2), PointerKind::Device { device: 2 });
        assert_eq!(hip_kind(v5, 1, true, 2), PointerKind::Managed);
        assert_eq!(hip_kind(v5, 2, false, 0), PointerKind::Other(2));
    }

    #[test]
    fn window_rounds_and_clamps() {
        let base = 0x7f00_0020_0000;
        let page = 4096;
        // Unaligned sub-range: rounded out to pages.
        assert_eq!(
            export_window(base + 5000, 100, base, 1 << 21, page).unwrap(),
            (base + 4096, base + 8192)
        );
        // Whole allocation with a non-page size: end clamped to the allocation.
        assert_eq!(
            export_window(base, 1000, base, 1000, page).unwrap(),
            (base, base + 1000)
        );
        // Allocation base not page aligned (sub-allocators): start clamped to the base.
        let odd = base + 256;
        assert_eq!(
            export_window(odd + 8, 8, odd, 4096, page).unwrap(),
            (odd, odd + 4096 - 256)
        );
    }

    #[test]
    fn window_rejects_bad_ranges() {
        let base = 1 << 30;
        for (addr, len) in [
            (base, 0usize),
            (base - 1, 8),
            (base + 10, 1 << 21),
            (u64::MAX - 2, 8),
        ] {
            assert!(
                matches!(
                    export_window(addr, len, base, 1 << 21, 4096),
                    Err(Error::InvalidArgument { .. })
                ),
                "{addr:#x}+{len}"
            );
        }
        assert!(export_window(base, 8, base, 1 << 21, 3000).is_err());
        assert!(export_window(base, 8, u64::MAX - 4, 1 << 21, 4096).is_err());
    }
}
