//! Checks the hand-written `include/ibnet.h` against the Rust code of the proxy engine's C API
//! (`proxy/src/capi/entry.rs`, `proxy/src/capi/mem.rs`):
//!
//! * every `ibnet_proxy_*` function: the header declares exactly the functions the library
//!   exports, and each declaration's type (return and parameter types, pointer constness) is
//!   compatible with the type spelled from the Rust `extern "C"` signature;
//! * every struct of that API: size, alignment, and each field's offset, size and type; the
//!   Rust field lists must tile their structs (no field forgotten here);
//! * the API's constants; and the NCCL table structs' sizes and key offsets (NCCL 2.28's
//!   figures, and 2.30.7's for v12, which `nccl/src/tables.rs` and `props.rs` assert at
//!   compile time on the Rust side).
//!
//! A generated C program prints one value per check; each must equal Rust's. Type checks use
//! GCC/Clang's `__builtin_types_compatible_p`. The header must also compile as C++.
//! Outside CI a missing C compiler skips (loudly); with `CI` set it fails.

use std::collections::BTreeSet;
use std::ffi::{c_char, c_int, c_void};
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use ibnet_nccl::log;
use ibnet_nccl::props::Props12;
use ibnet_nccl::tables::ncclNet_v12_t;
use ibnet_nccl::types::DebugLogFn;
use ibnet_nccl::types::{ncclResult_t, NCCL_NET_ID_UNDEF};
use ibnet_proxy::capi::entry::*;
use ibnet_proxy::capi::entry_xproc::*;
use ibnet_proxy::capi::CMemTable;
use ibnet_proxy::xmap::XMap;
use ibnet_proxy::{ConnFifo, Protocol, MAX_RECVS, NUM_PROTOCOLS, STEPS};
use ibnet_proxy::{HandleKind, OpEvent, StepEvent};
use nccl_net_ibnet::proxy::ibnet_proxy_create;

/// A Rust FFI type's spelling in `ibnet.h`'s terms (a C type name usable in `__typeof__`).
trait CType {
    fn c() -> String;
}

macro_rules! named {
    ($($t:ty => $c:expr),* $(,)?) => {
        $(impl CType for $t { fn c() -> String { $c.into() } })*
    };
}
named! {
    c_void => "void", c_char => "char", c_int => "int", u32 => "uint32_t", u64 => "uint64_t",
    usize => "size_t", ncclResult_t => "ibnet_result_t", CConfig => "ibnet_proxy_config_t",
    CSetup => "ibnet_proxy_setup_t", CDeviceView => "ibnet_proxy_device_view_t",
    CMemTable => "ibnet_proxy_mem_t", CProxy => "ibnet_proxy_t", COp => "ibnet_proxy_op_t",
    u8 => "uint8_t", () => "void", CEvent => "ibnet_proxy_event_t",
    CProfiler => "ibnet_proxy_profiler_t", CAttach => "ibnet_proxy_attach_t",
    DebugLogFn => "ibnet_logger_t",
}

impl<T: CType> CType for *const T {
    fn c() -> String {
        format!("{} const*", T::c())
    }
}
impl<T: CType> CType for *mut T {
    fn c() -> String {
        format!("{}*", T::c())
    }
}
impl<T: CType, const N: usize> CType for [T; N] {
    fn c() -> String {
        format!("__typeof__({}[{N}])", T::c())
    }
}
impl<F: CType> CType for Option<F> {
    /// A nullable function pointer is the function pointer in C.
    fn c() -> String {
        F::c()
    }
}

/// `unsafe extern "C" fn(A, ..) -> R` as `__typeof__(R (*)(A, ..))`.
macro_rules! fn_ptr {
    ($($a:ident),*) => {
        impl<R: CType, $($a: CType),*> CType for unsafe extern "C" fn($($a),*) -> R {
            fn c() -> String {
                let args: Vec<String> = vec![$($a::c()),*];
                let args = if args.is_empty() { "void".to_string() } else { args.join(", ") };
                format!("__typeof__({} (*)({args}))", R::c())
            }
        }
    };
}
fn_ptr!(A);
fn_ptr!(A, B);
fn_ptr!(A, B, C);
fn_ptr!(A, B, C, D);
fn_ptr!(A, B, C, D, E);
fn_ptr!(A, B, C, D, E, G);
fn_ptr!(A, B, C, D, E, G, H);
fn_ptr!(A, B, C, D, E, G, H, I);
fn_ptr!(A, B, C, D, E, G, H, I, J);

/// The C spelling of a value's type (used on fn pointers cast from the Rust functions).
fn spell<T: CType>(_: T) -> String {
    T::c()
}

/// One check: a C expression (printed as a `long long`) and the value Rust says it must have.
struct Check {
    c: String,
    rust: i64,
}

/// `true` as a check value (a `__builtin_types_compatible_p`).
fn compatible(a: &str, b: &str) -> Check {
    Check {
        c: format!("__builtin_types_compatible_p({a}, {b})"),
        rust: 1,
    }
}

/// Every `ibnet_proxy_*` function: name and the type spelled from its Rust signature.
fn functions() -> Vec<(&'static str, String)> {
    macro_rules! f {
        ($name:ident($($a:tt),*)) => {
            (stringify!($name), spell($name as unsafe extern "C" fn($($a),*) -> _))
        };
    }
    vec![
        f!(ibnet_proxy_create(_, _, _, _)),
        f!(ibnet_proxy_setup(_, _, _, _, _)),
        f!(ibnet_proxy_connect_send(_, _, _, _)),
        f!(ibnet_proxy_connect_recv(_, _, _, _)),
        f!(ibnet_proxy_device_view(_, _, _)),
        f!(ibnet_proxy_op_create(_, _, _, _, _)),
        f!(ibnet_proxy_op_add(_, _, _, _, _)),
        f!(ibnet_proxy_progress(_, _, _, _)),
        f!(ibnet_proxy_op_bytes(_, _, _)),
        f!(ibnet_proxy_op_abort(_, _)),
        f!(ibnet_proxy_op_destroy(_)),
        f!(ibnet_proxy_free(_, _)),
        f!(ibnet_proxy_destroy(_)),
        f!(ibnet_proxy_set_profiler(_, _)),
        f!(ibnet_proxy_set_logger(_)),
        f!(ibnet_proxy_process_id(_)),
        f!(ibnet_proxy_export_map(_, _, _, _)),
        f!(ibnet_proxy_attach(_, _, _, _, _)),
        f!(ibnet_proxy_detach(_)),
    ]
}

/// A struct's fields: (C name, offset, size, C type spelled from the Rust field).
type Fields = Vec<(&'static str, usize, usize, String)>;

/// Size, alignment and field checks of one struct; the Rust fields must tile it.
fn struct_checks<S>(c_name: &str, fields: Fields, out: &mut Vec<Check>) {
    let (size, align) = (size_of::<S>(), align_of::<S>());
    let mut sorted = fields.clone();
    sorted.sort_by_key(|f| f.1);
    let mut end = 0;
    for (name, off, sz, _) in &sorted {
        assert!(
            *off >= end && *off - end < align,
            "{c_name}: a field is missing before {name} (Rust padding {end}..{off})"
        );
        end = off + sz;
    }
    assert!(
        size - end < align,
        "{c_name}: a field is missing at the end (Rust {end}..{size})"
    );
    out.push(Check {
        c: format!("sizeof({c_name})"),
        rust: size as i64,
    });
    out.push(Check {
        c: format!("_Alignof({c_name})"),
        rust: align as i64,
    });
    for (name, off, sz, ty) in fields {
        out.push(Check {
            c: format!("offsetof({c_name}, {name})"),
            rust: off as i64,
        });
        out.push(Check {
            c: format!("sizeof((({c_name}*)0)->{name})"),
            rust: sz as i64,
        });
        out.push(compatible(
            &format!("__typeof__((({c_name}*)0)->{name})"),
            &ty,
        ));
    }
}

/// The size and C spelling of a field's type, from an accessor closure.
fn field_info<S, F: CType>(_: fn(&S) -> &F) -> (usize, String) {
    (size_of::<F>(), F::c())
}

/// `(C field name, offset, size, C type)` of a Rust field.
macro_rules! fld {
    ($s:ty, $f:ident => $c:literal) => {{
        let (size, ty) = field_info(|s: &$s| &s.$f);
        ($c, offset_of!($s, $f), size, ty)
    }};
}

/// Layout checks of the proxy API's structs.
fn layout() -> Vec<Check> {
    let mut v = Vec::new();
    struct_checks::<CConfig>(
        "ibnet_proxy_config_t",
        vec![
            fld!(CConfig, buff_sizes => "buffSizes"),
            fld!(CConfig, p2p_chunk_size => "p2pChunkSize"),
            fld!(CConfig, p2p_nchannels => "p2pNChannels"),
            fld!(CConfig, shared_comms => "sharedComms"),
            fld!(CConfig, gdr_copy_flush => "gdrCopyFlush"),
            fld!(CConfig, max_net_size => "maxNetSize"),
        ],
        &mut v,
    );
    struct_checks::<CSetup>(
        "ibnet_proxy_setup_t",
        vec![
            fld!(CSetup, tp_rank => "tpRank"),
            fld!(CSetup, tp_local_rank => "tpLocalRank"),
            fld!(CSetup, tp_remote_rank => "tpRemoteRank"),
            fld!(CSetup, net_dev => "netDev"),
            fld!(CSetup, channel => "channel"),
            fld!(CSetup, conn_index => "connIndex"),
            fld!(CSetup, shared => "shared"),
            fld!(CSetup, use_gdr => "useGdr"),
            fld!(CSetup, need_flush => "needFlush"),
            fld!(CSetup, gpu_process => "gpuProcess"),
        ],
        &mut v,
    );
    struct_checks::<CDeviceView>(
        "ibnet_proxy_device_view_t",
        vec![
            fld!(CDeviceView, head => "head"),
            fld!(CDeviceView, tail => "tail"),
            fld!(CDeviceView, recv_mem => "recvMem"),
            fld!(CDeviceView, buffs => "buffs"),
            fld!(CDeviceView, buff_sizes => "buffSizes"),
            fld!(CDeviceView, dir => "dir"),
            fld!(CDeviceView, shared => "shared"),
        ],
        &mut v,
    );
    struct_checks::<CMemTable>(
        "ibnet_proxy_mem_t",
        vec![
            fld!(CMemTable, ctx => "ctx"),
            fld!(CMemTable, alloc => "alloc"),
            fld!(CMemTable, free => "free"),
            fld!(CMemTable, gdc_alloc => "gdcAlloc"),
            fld!(CMemTable, store_fence => "storeFence"),
            fld!(CMemTable, flush_read => "flushRead"),
            fld!(CMemTable, dmabuf_fd => "dmabufFd"),
            fld!(CMemTable, export_mem => "exportMem"),
            fld!(CMemTable, import_mem => "importMem"),
            fld!(CMemTable, unimport_mem => "unimportMem"),
        ],
        &mut v,
    );
    struct_checks::<CEvent>(
        "ibnet_proxy_event_t",
        vec![
            fld!(CEvent, kind => "kind"),
            fld!(CEvent, dir => "dir"),
            fld!(CEvent, state => "state"),
            fld!(CEvent, sub => "sub"),
            fld!(CEvent, from => "from"),
            fld!(CEvent, to => "to"),
            fld!(CEvent, bytes => "bytes"),
            fld!(CEvent, nsteps => "nsteps"),
        ],
        &mut v,
    );
    struct_checks::<CProfiler>(
        "ibnet_proxy_profiler_t",
        vec![
            fld!(CProfiler, ctx => "ctx"),
            fld!(CProfiler, event => "event"),
        ],
        &mut v,
    );
    // ConnFifo's fields are private to ibnet-core: its size and alignment.
    v.push(Check {
        c: "sizeof(ibnet_conn_fifo_t)".into(),
        rust: size_of::<ConnFifo>() as i64,
    });
    v.push(Check {
        c: "_Alignof(ibnet_conn_fifo_t)".into(),
        rust: align_of::<ConnFifo>() as i64,
    });
    v
}

/// Constants and NCCL's table layouts (NCCL 2.28's figures; Rust asserts the same ones).
fn constants() -> Vec<Check> {
    let k = |c: &str, rust: i64| Check { c: c.into(), rust };
    vec![
        k("IBNET_PROXY_STEPS", STEPS as i64),
        k("IBNET_PROTO_LL", Protocol::Ll as i64),
        k("IBNET_PROTO_LL128", Protocol::Ll128 as i64),
        k("IBNET_PROTO_SIMPLE", Protocol::Simple as i64),
        k(
            "sizeof(((ibnet_proxy_config_t*)0)->buffSizes) / sizeof(size_t)",
            NUM_PROTOCOLS as i64,
        ),
        k("IBNET_MAX_RECVS", MAX_RECVS as i64),
        k(
            "IBNET_HANDLE_MAXSIZE",
            ibnet_nccl::types::NCCL_NET_HANDLE_MAXSIZE as i64,
        ),
        k("sizeof(ibnet_result_t)", size_of::<ncclResult_t>() as i64),
        k("IBNET_PROXY_MAP_BYTES", XMap::BYTES as i64),
        k("IBNET_HANDLE_PROCESS_FD", HandleKind::ProcessFd as i64),
        k("IBNET_HANDLE_CUMEM_FD", HandleKind::CuMemFd as i64),
        k("IBNET_HANDLE_CUDA_IPC", HandleKind::CudaIpc as i64),
        k("IBNET_HANDLE_PROVIDER", HandleKind::Provider as i64),
        k("IBNET_LOG_WARN", log::Level::Warn as i64),
        k("IBNET_LOG_INFO", log::Level::Info as i64),
        k("IBNET_LOG_TRACE", log::Level::Trace as i64),
        k("(long long)IBNET_LOG_FLAG_INIT", log::INIT as i64),
        k("(long long)IBNET_LOG_FLAG_NET", log::NET as i64),
        k("(long long)IBNET_LOG_FLAG_ENV", log::ENV as i64),
        k("(long long)IBNET_LOG_FLAG_ALL", log::ALL as i64),
        k("IBNET_PROF_OP_SEND_POSTED", OpEvent::SendPosted as i64),
        k(
            "IBNET_PROF_OP_SEND_REM_FIFO_WAIT",
            OpEvent::SendRemFifoWait as i64,
        ),
        k(
            "IBNET_PROF_OP_SEND_TRANSMITTED",
            OpEvent::SendTransmitted as i64,
        ),
        k("IBNET_PROF_OP_SEND_DONE", OpEvent::SendDone as i64),
        k("IBNET_PROF_OP_RECV_POSTED", OpEvent::RecvPosted as i64),
        k("IBNET_PROF_OP_RECV_RECEIVED", OpEvent::RecvReceived as i64),
        k(
            "IBNET_PROF_OP_RECV_TRANSMITTED",
            OpEvent::RecvTransmitted as i64,
        ),
        k("IBNET_PROF_OP_RECV_DONE", OpEvent::RecvDone as i64),
        k(
            "IBNET_PROF_STEP_SEND_GPU_WAIT",
            StepEvent::SendGpuWait as i64,
        ),
        k("IBNET_PROF_STEP_SEND_WAIT", StepEvent::SendWait as i64),
        k("IBNET_PROF_STEP_RECV_WAIT", StepEvent::RecvWait as i64),
        k(
            "IBNET_PROF_STEP_RECV_FLUSH_WAIT",
            StepEvent::RecvFlushWait as i64,
        ),
        k(
            "IBNET_PROF_STEP_RECV_GPU_WAIT",
            StepEvent::RecvGpuWait as i64,
        ),
        // NCCL 2.30.7's net_v12.h figures (`nccl/src/props.rs` asserts them on the Rust side).
        k(
            "sizeof(ibnet_properties_v12_t)",
            size_of::<Props12>() as i64,
        ),
        k("sizeof(ibnet_properties_v12_t)", 128),
        k(
            "offsetof(ibnet_properties_v12_t, vProps)",
            offset_of!(Props12, vprops) as i64,
        ),
        k("offsetof(ibnet_properties_v12_t, maxP2pBytes)", 104),
        k("offsetof(ibnet_properties_v12_t, maxCollBytes)", 112),
        k("offsetof(ibnet_properties_v12_t, maxMultiRequestSize)", 120),
        k(
            "offsetof(ibnet_properties_v12_t, railId)",
            offset_of!(Props12, rail_id) as i64,
        ),
        k("offsetof(ibnet_properties_v12_t, railId)", 124),
        k("offsetof(ibnet_properties_v12_t, planeId)", 126),
        k("sizeof(ibnet_vdevice_props_v12_t)", 36),
        k("IBNET_NET_ID_UNDEF", i64::from(NCCL_NET_ID_UNDEF)),
        k("sizeof(ibnet_net_v12_t)", size_of::<ncclNet_v12_t>() as i64),
        k(
            "offsetof(ibnet_net_v12_t, makeVDevice)",
            offset_of!(ncclNet_v12_t, make_vdevice) as i64,
        ),
        k("offsetof(ibnet_net_v12_t, setNetAttr)", 21 * 8),
        k("sizeof(ibnet_properties_v11_t)", 112),
        k("offsetof(ibnet_properties_v11_t, vProps)", 64),
        k("offsetof(ibnet_properties_v11_t, maxP2pBytes)", 88),
        k("offsetof(ibnet_properties_v11_t, maxMultiRequestSize)", 104),
        k("sizeof(ibnet_net_v11_t)", 22 * 8),
        k("offsetof(ibnet_net_v11_t, setNetAttr)", 21 * 8),
        k("sizeof(ibnet_properties_v8_t)", 64),
        k("sizeof(ibnet_net_v8_t)", 19 * 8),
        k("offsetof(ibnet_net_v8_t, irecvConsumed)", 18 * 8),
        k("sizeof(ibnet_device_handle_t)", 32),
        k("sizeof(ibnet_net_attr_t)", 44),
        k("offsetof(ibnet_net_attr_t, proto)", 40),
        k("sizeof(ibnet_vdevice_props_t)", 20),
    ]
}

/// Outside CI a missing compiler skips (with a loud line); with `CI` set it fails.
fn skip_or_fail(why: String) {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("header check cannot run under CI: {why}");
    }
    eprintln!("SKIP header check: {why}");
}

/// The functions `ibnet.h` declares: its lines `ibnet_result_t ibnet_proxy_NAME(`.
fn declared(header: &str) -> BTreeSet<String> {
    header
        .lines()
        .filter_map(|l| l.strip_prefix("ibnet_result_t "))
        .filter_map(|l| l.split_once('(').map(|(n, _)| n.trim().to_string()))
        .filter(|n| n.starts_with("ibnet_proxy_"))
        .collect()
}

/// The `ibnet_proxy_*` symbols the built cdylib exports (`nm -D`), or `None` without `nm`.
fn exported() -> Option<BTreeSet<String>> {
    let exe = std::env::current_exe().expect("current exe");
    let so = exe.parent().expect("deps dir").join("libnccl_net_ibnet.so");
    assert!(so.exists(), "cdylib not built: {}", so.display());
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&so)
        .output()
        .ok()?;
    assert!(out.status.success(), "nm -D {} failed", so.display());
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        text.lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            .filter(|s| s.starts_with("ibnet_proxy_"))
            .map(str::to_string)
            .collect(),
    )
}

/// Compiles `src` with `cc` (extra `args`), returning the compiler's stderr on failure.
fn compile(cc: &str, args: &[&str], src: &Path, out: &Path, inc: &Path) -> Result<(), String> {
    let o = Command::new(cc)
        .args(args)
        .arg(format!("-I{}", inc.display()))
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()
        .map_err(|e| format!("cannot run {cc}: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

#[test]
fn header_matches_rust() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let inc = root.join("include");
    let header = std::fs::read_to_string(inc.join("ibnet.h")).expect("include/ibnet.h");
    let funcs = functions();
    let listed: BTreeSet<String> = funcs.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(
        declared(&header),
        listed,
        "ibnet.h's ibnet_proxy_* declarations vs this test's list"
    );
    match exported() {
        Some(e) => assert_eq!(
            e, listed,
            "the library's exported ibnet_proxy_* vs this test's list"
        ),
        None => skip_or_fail("no nm: the exported symbol list was not compared".into()),
    }

    let mut checks: Vec<Check> = funcs
        .iter()
        .map(|(n, ty)| compatible(&format!("__typeof__(&{n})"), ty))
        .collect();
    checks.extend(layout());
    checks.extend(constants());

    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc).arg("--version").output().is_err() {
        skip_or_fail(format!("no C compiler ({cc})"));
        return;
    }
    let dir = std::env::temp_dir().join(format!("ibnet-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"ibnet.h\"\nint main(void) {\n",
    );
    for c in &checks {
        src.push_str(&format!("  printf(\"%lld\\n\", (long long)({}));\n", c.c));
    }
    src.push_str("  return 0;\n}\n");
    let (c_src, exe) = (dir.join("header_check.c"), dir.join("header_check"));
    std::fs::write(&c_src, &src).unwrap();
    let flags = ["-std=gnu11", "-Wall", "-Wextra", "-Werror"];
    if let Err(e) = compile(&cc, &flags, &c_src, &exe, &inc) {
        panic!("the header check does not compile:\n{e}\n{src}");
    }
    let out = Command::new(&exe).output().expect("run the header check");
    assert!(out.status.success());
    let got: Vec<i64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(got.len(), checks.len());
    let bad: Vec<String> = checks
        .iter()
        .zip(&got)
        .filter(|(c, g)| c.rust != **g)
        .map(|(c, g)| format!("{}: C {g}, Rust {}", c.c, c.rust))
        .collect();
    assert!(
        bad.is_empty(),
        "ibnet.h differs from the Rust code:\n{}",
        bad.join("\n")
    );

    // The header is also C++ (static_test.cpp and the CMake consumer include it).
    let cpp = dir.join("header_check.cpp");
    std::fs::write(&cpp, "#include \"ibnet.h\"\nint main() { return 0; }\n").unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if let Err(e) = compile(
        &cxx,
        &["-std=c++11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"],
        &cpp,
        &dir.join("x"),
        &inc,
    ) {
        panic!("ibnet.h does not compile as C++:\n{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "ibnet.h: {} functions, {} checks match the Rust code",
        funcs.len(),
        checks.len()
    );
}
