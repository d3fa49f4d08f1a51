//! The complete C example of the proxy engine's API in `include/ibnet.h` compiles against the
//! header, links against the built `libnccl_net_ibnet.so` and runs (with `IBNET_PROVIDER=soft`),
//! so the documentation cannot drift from the library.

use std::path::PathBuf;
use std::process::Command;

/// The example: the header comment's lines after "Complete example", up to the comment's end,
/// without the leading " * ".
fn example() -> String {
    let h = include_str!("../../../include/ibnet.h");
    let start = h.find("Complete example").expect("example in ibnet.h");
    let body = &h[start..];
    let body = &body[..body.find("*/").expect("end of the comment")];
    body.lines()
        .skip_while(|l| !l.contains("#include <stdarg.h>"))
        .map(|l| l.strip_prefix(" *").unwrap_or(l))
        .map(|l| l.strip_prefix("   ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn header_example_compiles_and_runs() {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc).arg("--version").output().is_err() {
        eprintln!("SKIPPED: no C compiler ({cc})");
        return;
    }
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    assert!(
        deps.join("libnccl_net_ibnet.so").exists(),
        "cdylib not built"
    );
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("ibnet-proxy-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("example.c");
    std::fs::write(&src, example()).unwrap();
    let bin = dir.join("example");
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg(format!("-I{}", root.join("include").display()))
        .arg(format!("-L{}", deps.display()))
        // RPATH (not RUNPATH) and no LD_LIBRARY_PATH below: load exactly this build's library
        // (cargo's LD_LIBRARY_PATH may name a stale copy in target/<profile>/).
        .arg("-Wl,--disable-new-dtags")
        .arg(format!("-Wl,-rpath,{}", deps.display()))
        .arg("-lnccl_net_ibnet")
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "example does not compile:\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        example()
    );
    let run = Command::new(&bin)
        .env_remove("LD_LIBRARY_PATH")
        .env("IBNET_PROVIDER", "soft")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "example failed: {stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("3 steps of 65536 bytes verified in another process"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
