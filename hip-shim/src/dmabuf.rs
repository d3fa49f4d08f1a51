//! DMA-BUF support decisions (`NCCL_PTR_DMABUF` in `ptrSupport`), per vendor.
//!
//! The decision chains mirror the client libraries, in order; the first failing step decides:
//!
//! ```text
//! CUDA (NCCL 2.28 ncclDmaBufSupported)          ROCm (RCCL rocmLibraryInit)
//! 1 NCCL_DMABUF_ENABLE (default 1) != 0         1 NCCL_DMABUF_ENABLE (RCCL default 0) != 0
//! 2 cuDriverGetVersion >= 11070 (CUDA 11.7)     2 libhsa-runtime64.so loaded
//! 3 cuMemGetHandleForAddressRange resolved      3 hsa_system_get_info(0x204) reports true
//! 4 CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED != 0  4 hsa_amd_portable_export_dmabuf resolved
//!                                               5 kernel: CONFIG_DMABUF_MOVE_NOTIFY=y and
//!                                                 CONFIG_PCI_P2PDMA=y (or config unreadable)
//! ```
//!
//! Both NCCL and RCCL then probe the NIC with `ibv_reg_dmabuf_mr(fd = -1)` (EOPNOTSUPP /
//! EPROTONOSUPPORT = unsupported); that step needs a verbs context and belongs to the plugin.
//!
//! The chains are written against small probe traits so they can be tested without GPUs.

use crate::decision::Decision;
use crate::error::Error;
use crate::host::Host;
use crate::kconfig;

/// `CUDA_VERSION` 11.7, the first driver with DMA-BUF export.
pub const CUDA_MIN_DRIVER: i32 = 11070;

/// What the CUDA chain needs to ask the driver.
pub(crate) trait CudaProbe {
    /// `cuDriverGetVersion`.
    fn driver_version(&self) -> Result<i32, Error>;
    /// Whether `cuMemGetHandleForAddressRange` was resolved.
    fn has_export(&self) -> bool;
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` of device `dev`.
    fn dmabuf_attribute(&self, dev: i32) -> Result<i32, Error>;
}

/// What the ROCm chain needs to ask HSA.
pub(crate) trait RocmProbe {
    /// `Ok` if `libhsa-runtime64.so` is loaded, else why not.
    fn hsa(&self) -> Result<(), String>;
    /// `hsa_system_get_info(HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED)`.
    fn dmabuf_supported(&self) -> Result<bool, Error>;
    /// Whether `hsa_amd_portable_export_dmabuf` was resolved.
    fn has_export(&self) -> bool;
}

/// The CUDA chain for device `dev`.
pub(crate) fn cuda_decision(host: &Host, probe: &dyn CudaProbe, dev: i32) -> Decision {
    let enable = host.env().int_param("NCCL_DMABUF_ENABLE", 1);
    if enable.value == 0 {
        return Decision::no(format!("{enable}"));
    }
    match probe.driver_version() {
        Ok(v) if v >= CUDA_MIN_DRIVER => {}
        Ok(v) => {
            return Decision::no(format!(
                "CUDA driver {v} older than {CUDA_MIN_DRIVER} (11.7) lacks DMA-BUF export"
            ))
        }
        Err(e) => return Decision::no(format!("cannot read CUDA driver version: {e}")),
    }
    if !probe.has_export() {
        return Decision::no("libcuda lacks cuMemGetHandleForAddressRange");
    }
    match probe.dmabuf_attribute(dev) {
        Ok(0) => Decision::no(format!(
            "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED=0 on GPU {dev}"
        )),
        Ok(_) => Decision::yes(format!(
            "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED=1 on GPU {dev}, {enable}"
        )),
        Err(e) => Decision::no(format!("DMA-BUF attribute query failed on GPU {dev}: {e}")),
    }
}

/// The ROCm chain (system-wide; RCCL does not ask per device).
pub(crate) fn rocm_decision(host: &Host, probe: &dyn RocmProbe) -> Decision {
    let enable = host.env().int_param("NCCL_DMABUF_ENABLE", 0);
    if enable.value == 0 {
        return Decision::no(format!(
            "{enable}; RCCL needs NCCL_DMABUF_ENABLE=1 for DMA-BUF"
        ));
    }
    if let Err(why) = probe.hsa() {
        return Decision::no(format!("HSA runtime unavailable: {why}"));
    }
    match probe.dmabuf_supported() {
        Ok(true) => {}
        Ok(false) => {
            return Decision::no("HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED is false (KFD < 1.12?)")
        }
        Err(e) => return Decision::no(format!("HSA DMA-BUF query failed: {e}")),
    }
    if !probe.has_export() {
        return Decision::no("libhsa-runtime64 lacks hsa_amd_portable_export_dmabuf");
    }
    let kernel = kconfig::check(host);
    let k = kernel.describe();
    if kernel.allows_dmabuf() {
        Decision::yes(format!("HSA reports DMA-BUF support; {k}; {enable}"))
    } else {
        Decision::no(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Env;
    use crate::host::testutil::TempTree;

    struct FakeCuda {
        version: Result<i32, Error>,
        export: bool,
        attr: Result<i32, Error>,
    }

    impl CudaProbe for FakeCuda {
        fn driver_version(&self) -> Result<i32, Error> {
            self.version.clone()
        }
        fn has_export(&self) -> bool {
            self.export
        }
        fn dmabuf_attribute(&self, _dev: i32) -> Result<i32, Error> {
            self.attr.clone()
        }
    }

    fn good_cuda() -> FakeCuda {
        FakeCuda {
            version: Ok(13000),
            export: true,
            attr: Ok(1),
        }
    }

    fn env_host(t: &TempTree, vars: &[(&str, &str)]) -> Host {
        Host::with_root(t.root()).with_env(Env::fixed(vars.iter().copied()))
    }

    #[test]
    fn cuda_chain() {
        let t = TempTree::new("db-cuda");
        let h = env_host(&t, &[]);
        let d = cuda_decision(&h, &good_cuda(), 0);
        assert!(d.enabled, "{d}");
        assert!(d.reason.contains("NCCL_DMABUF_ENABLE=1 (default)"), "{d}");

        let off = env_host(&t, &[("NCCL_DMABUF_ENABLE", "0")]);
        let d = cuda_decision(&off, &good_cuda(), 0);
        assert_eq!(d, Decision::no("NCCL_DMABUF_ENABLE=0"));

        let old = FakeCuda {
            version: Ok(11060),
            ..good_cuda()
        };
        assert!(cuda_decision(&h, &old, 0).reason.contains("11060"));
        let nosym = FakeCuda {
            export: false,
            ..good_cuda()
        };
        assert!(!cuda_decision(&h, &nosym, 0).enabled);
        let attr0 = FakeCuda {
            attr: Ok(0),
            ..good_cuda()
        };
        let d = cuda_decision(&h, &attr0, 3);
        assert!(!d.enabled && d.reason.contains("=0 on GPU 3"), "{d}");
        let err = FakeCuda {
            attr: Err(Error::Call {
                call: "cuDeviceGetAttribute",
                code: 101,
                name: String::new(),
            }),
            ..good_cuda()
        };
        assert!(!cuda_decision(&h, &err, 0).enabled);
        // Malformed env falls back to the default (1) and says so.
        let bad = env_host(&t, &[("NCCL_DMABUF_ENABLE", "on")]);
        let d = cuda_decision(&bad, &good_cuda(), 0);
        assert!(d.enabled && d.reason.contains("malformed"), "{d}");
    }

    struct FakeRocm {
        hsa: Result<(), String>,
        supported: Result<bool, Error>,
        export: bool,
    }

    impl RocmProbe for FakeRocm {
        fn hsa(&self) -> Result<(), String> {
            self.hsa.clone()
        }
        fn dmabuf_supported(&self) -> Result<bool, Error> {
            self.supported.clone()
        }
        fn has_export(&self) -> bool {
            self.export
        }
    }

    fn good_rocm() -> FakeRocm {
        FakeRocm {
            hsa: Ok(()),
            supported: Ok(true),
            export: true,
        }
    }

    #[test]
    fn rocm_chain_default_is_off() {
        let t = TempTree::new("db-rocm-off");
        let d = rocm_decision(&env_host(&t, &[]), &good_rocm());
        assert!(!d.enabled);
        assert!(d.reason.contains("NCCL_DMABUF_ENABLE=0 (default)"), "{d}");
    }

    #[test]
    fn rocm_chain_kernel_config() {
        let t = TempTree::new("db-rocm-k");
        t.file("/proc/sys/kernel/osrelease", b"6.8.0\n").file(
            "/boot/config-6.8.0",
            b"CONFIG_DMABUF_MOVE_NOTIFY=y\nCONFIG_PCI_P2PDMA=y\n",
        );
        let on = [("NCCL_DMABUF_ENABLE", "1")];
        let d = rocm_decision(&env_host(&t, &on), &good_rocm());
        assert!(d.enabled, "{d}");
        assert!(d.reason.contains("/boot/config-6.8.0"), "{d}");

        t.file("/boot/config-6.8.0", b"CONFIG_DMABUF_MOVE_NOTIFY=y\n");
        let d = rocm_decision(&env_host(&t, &on), &good_rocm());
        assert!(!d.enabled && d.reason.contains("CONFIG_PCI_P2PDMA"), "{d}");

        // No config anywhere: the check is skipped, DMA-BUF stays on.
        let bare = TempTree::new("db-rocm-bare");
        let d = rocm_decision(&env_host(&bare, &on), &good_rocm());
        assert!(d.enabled && d.reason.contains("skipped"), "{d}");
    }

    #[test]
    fn rocm_chain_runtime_steps() {
        let t = TempTree::new("db-rocm-rt");
        let h = env_host(&t, &[("NCCL_DMABUF_ENABLE", "1")]);
        let nohsa = FakeRocm {
            hsa: Err("libhsa-runtime64.so: not found".into()),
            ..good_rocm()
        };
        assert!(rocm_decision(&h, &nohsa).reason.contains("not found"));
        let nosup = FakeRocm {
            supported: Ok(false),
            ..good_rocm()
        };
        assert!(!rocm_decision(&h, &nosup).enabled);
        let qerr = FakeRocm {
            supported: Err(Error::Call {
                call: "hsa_system_get_info",
                code: 4096,
                name: String::new(),
            }),
            ..good_rocm()
        };
        assert!(rocm_decision(&h, &qerr)
            .reason
            .contains("hsa_system_get_info"));
        let nosym = FakeRocm {
            export: false,
            ..good_rocm()
        };
        assert!(rocm_decision(&h, &nosym)
            .reason
            .contains("hsa_amd_portable_export_dmabuf"));
    }
}
