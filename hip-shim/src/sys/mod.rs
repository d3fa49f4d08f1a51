//! The only module with `unsafe`: `dlopen`ed GPU runtimes behind safe wrappers.
//!
//! ```text
//! cuda.rs  libcuda.so.1          fn-pointer table + safe methods (cuInit … cuMemGetHandleForAddressRange)
//! hip.rs   libamdhip64.so        fn-pointer table + safe methods (hipPointerGetAttributes, hipMalloc …)
//!          libhsa-runtime64.so   hsa_init, hsa_system_get_info, hsa_amd_portable_export_dmabuf
//! mod.rs   library opening, symbol lookup, page size
//! ```
//!
//! Rules kept here:
//! * Every function-pointer type is the C prototype from the vendor header, written out by hand
//!   and checked against `cuda.h` / `hip_runtime_api.h` / `hsa.h` / `hsa_ext_amd.h`.
//! * A table owns its [`Library`], so its pointers cannot outlive the mapping; tables are
//!   `Send + Sync` (the runtimes are thread-safe; fn pointers and `Library` are both).
//! * Out-parameters are zero-initialised and larger than the C type where the runtime might
//!   write more than we expect (pointer attributes), so an ABI drift cannot write past them.
//! * Optional symbols are `Option<fn>`; a missing one is a capability, not an error.
#![allow(unsafe_code)]

pub(crate) mod cuda;
pub(crate) mod hip;

use libloading::Library;

/// Opens the first loadable library of `names`; on failure, says why for each one.
pub(crate) fn open_first(names: &[String]) -> Result<(Library, String), String> {
    let mut why = Vec::with_capacity(names.len());
    for name in names {
        // SAFETY: loading a GPU runtime runs its ELF initialisers. These libraries are built to
        // be dlopen'ed by NCCL/RCCL and the frameworks, and we load them with RTLD_LOCAL, so
        // no symbol of ours is interposed; nothing else is assumed about them.
        match unsafe { Library::new(name) } {
            Ok(lib) => return Ok((lib, name.clone())),
            // libloading's message already names the file.
            Err(e) => why.push(e.to_string()),
        }
    }
    Err(why.join("; "))
}

/// Whether a library of this file name is already mapped into the process (`RTLD_NOLOAD`);
/// used to prefer the runtime the host application (NCCL or RCCL) already uses.
pub(crate) fn is_loaded(name: &str) -> bool {
    use libloading::os::unix::{Library as UnixLibrary, RTLD_LAZY};
    // SAFETY: with RTLD_NOLOAD nothing is loaded and no initialiser runs; a hit only bumps the
    // reference count of an already-initialised library, which dropping the handle undoes.
    unsafe { UnixLibrary::open(Some(name), RTLD_LAZY | libc::RTLD_NOLOAD) }.is_ok()
}

/// Looks up a required symbol; the fn-pointer type comes from the field it is assigned to.
macro_rules! required {
    ($lib:expr, $libname:expr, $name:literal) => {{
        // SAFETY: the target field's fn-pointer type is the symbol's C prototype (see the
        // module rules); the pointer is copied out and stored next to `$lib`, which keeps the
        // library mapped for as long as the pointer exists.
        match unsafe { $lib.get(concat!($name, "\0").as_bytes()) } {
            Ok(sym) => *sym,
            Err(_) => {
                return Err($crate::error::Error::MissingSymbol {
                    lib: $libname,
                    symbol: $name,
                })
            }
        }
    }};
}

/// Looks up an optional symbol (`None` if absent).
macro_rules! optional {
    ($lib:expr, $name:literal) => {{
        // SAFETY: as for `required!`: the prototype is the C one and the library outlives it.
        unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
            .ok()
            .map(|sym| *sym)
    }};
}

pub(crate) use {optional, required};

/// The host page size (`sysconf(_SC_PAGESIZE)`), 4096 if the call fails.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions; it only reads a constant.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(v)
        .ok()
        .filter(|&p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// Copies a NUL-terminated string owned by a runtime (error names), or empty if NULL.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string that stays valid during the call.
unsafe fn c_str(p: *const libc::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller promises a valid NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_libraries_are_reported_by_name() {
        let names = vec![
            "libibnet-surely-missing-1.so".to_string(),
            "libnope-2.so".to_string(),
        ];
        let err = open_first(&names).unwrap_err();
        assert!(err.contains("libibnet-surely-missing-1.so"), "{err}");
        assert!(err.contains("libnope-2.so"), "{err}");
    }

    #[test]
    fn noload_sees_only_mapped_libraries() {
        assert!(is_loaded("libc.so.6"), "the test binary links libc");
        assert!(!is_loaded("libibnet-surely-missing-1.so"));
    }

    #[test]
    fn page_size_is_sane() {
        let p = page_size();
        assert!(p.is_power_of_two() && p >= 4096, "{p}");
    }

    #[test]
    fn c_str_null_is_empty() {
        // SAFETY: NULL is explicitly allowed.
        assert_eq!(unsafe { c_str(std::ptr::null()) }, "");
        let s = c"CUDA_ERROR_NO_DEVICE";
        // SAFETY: a literal C string is NUL-terminated and static.
        assert_eq!(unsafe { c_str(s.as_ptr()) }, "CUDA_ERROR_NO_DEVICE");
    }
}
