//! CLI tests: argument errors, ibnet-info on this host, and a short verified loopback run of
//! ibnet-perf through ibnet's plugin (the soft provider when there is no RDMA NIC).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn bin(name: &str) -> Command {
    let exe = match name {
        "ibnet-perf" => env!("CARGO_BIN_EXE_ibnet-perf"),
        _ => env!("CARGO_BIN_EXE_ibnet-info"),
    };
    Command::new(exe)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Runs `cmd` with stdout a pipe whose reading end is closed before the tool writes (as
/// `| head -3` does once it has its lines): every stdout write fails with EPIPE.
fn closed_stdout(cmd: &mut Command) -> Output {
    let mut c = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(c.stdout.take());
    c.wait_with_output().unwrap()
}

/// A tool whose stdout reader went away ends quietly: status 0, no panic, no error line.
fn assert_quiet_end(what: &str, o: &Output) {
    let err = text(o).1;
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(!err.contains("error"), "{what}: {err}");
    assert_eq!(o.status.code(), Some(0), "{what}: {err}");
}

fn plugin() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ibnet-perf"));
    ibnet_tools::locate::find_near(&exe).expect("ibnet-ffi's cdylib is built with ibnet-tools")
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        &["--window", "0"][..],
        &["--window", "33"],
        &["--multirecv", "9"],
        &["--max-bytes", "12X"],
        &["--server", "--client", "h:1"],
        &["--json", "--csv"],
        &["--no-such-flag"],
    ] {
        let o = bin("ibnet-perf").args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {:?}", text(&o));
        assert!(text(&o).1.contains("error"), "{args:?}");
    }
}

#[test]
fn runtime_errors_are_one_line() {
    let o = bin("ibnet-perf")
        .args(["--min-bytes", "1M", "--max-bytes", "8"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("--min-bytes"), "{:?}", text(&o));

    let o = bin("ibnet-perf")
        .args(["--plugin", "/nonexistent/x.so"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("does not exist"));

    // A library that is not a net plugin.
    let o = bin("ibnet-perf")
        .args(["--plugin", "/lib/x86_64-linux-gnu/libc.so.6"])
        .output();
    if let Ok(o) = o {
        if std::path::Path::new("/lib/x86_64-linux-gnu/libc.so.6").exists() {
            assert_eq!(o.status.code(), Some(1));
            assert!(
                text(&o).1.contains("none of ncclNetPlugin_v12"),
                "{:?}",
                text(&o)
            );
        }
    }

    let o = bin("ibnet-perf")
        .args([
            "--plugin",
            plugin().to_str().unwrap(),
            "--dev",
            "5",
            "--max-bytes",
            "8",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("--dev 5"), "{:?}", text(&o));
}

#[test]
fn info_reports_providers() {
    let o = bin("ibnet-info")
        .args(["--plugin", plugin().to_str().unwrap()])
        .env_remove("IBNET_PROVIDER")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(out.contains("verbs provider"), "{out}");
    assert!(out.contains("soft provider"), "{out}");
    assert!(out.contains("RLIMIT_MEMLOCK"), "{out}");
    assert!(out.contains("ncclNetPlugin_v12, name IBNet"), "{out}");
    let no_nic = out.contains("  0 devices:");
    if no_nic {
        // No RDMA NIC here: the plugin alone reports nothing usable, one line says why.
        assert_eq!(o.status.code(), Some(1), "{out}{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("no usable device: 0 verbs devices ("), "{err}");
        // With the soft provider asked for, the plugin shows soft0.
        let o = bin("ibnet-info")
            .args(["--plugin", plugin().to_str().unwrap()])
            .env("IBNET_PROVIDER", "soft")
            .output()
            .unwrap();
        let (out, err) = text(&o);
        if out.contains("soft provider (ibnet-soft, same host only, host memory): usable") {
            assert_eq!(o.status.code(), Some(0), "{out}{err}");
            assert!(out.contains("0: soft0"), "{out}");
        }
    }
}

/// ibnet-info reads the v12 table: the rail and plane NCCL 2.30's `NCCL_IB_HCA` form gives a
/// device are shown (one malformed entry is one WARN and does not undo the rest).
#[test]
fn info_shows_v12_rail_and_plane() {
    let o = bin("ibnet-info")
        .args(["--plugin", plugin().to_str().unwrap()])
        .env("IBNET_PROVIDER", "soft")
        .env("NCCL_IB_HCA", "soft0:1:3:2,soft1:x")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    if !out.contains("soft provider (ibnet-soft, same host only, host memory): usable") {
        eprintln!("SKIP: soft provider unusable here");
        return;
    }
    assert!(out.contains("ncclNetPlugin_v12, name IBNet"), "{out}");
    let dev0 = out.lines().find(|l| l.contains("0: soft0")).expect(&out);
    assert!(dev0.ends_with("rail 3  plane 2"), "{dev0}");
    assert_eq!(
        err.matches("entry \"soft1:x\"").count(),
        1,
        "one WARN: {err}"
    );
}

#[test]
fn loopback_verified_run_and_formats() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("perf.png");
    let mut c = bin("ibnet-perf");
    c.args([
        "--loopback",
        "-c",
        "--max-bytes",
        "1M",
        "-n",
        "50",
        "--warmup",
        "4",
        "--csv",
    ])
    .args(["--multirecv", "2", "--window", "4"])
    .arg("--plugin")
    .arg(plugin());
    let have_font = ibnet_tools::plot::FONT_PATHS
        .iter()
        .any(|p| std::path::Path::new(p).exists());
    if have_font {
        c.arg("--png").arg(&png);
    }
    let o = c.output().unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let mut lines = out.lines();
    assert!(lines.next().unwrap().starts_with("size,lat_p50_us,"));
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 18, "8 B..1 MiB: {out}"); // 2^3 ..= 2^20
    for r in &rows {
        assert!(r.ends_with(",ok"), "every size verified: {r}");
        assert!(r.contains(",2,"), "multirecv 2: {r}");
    }
    assert!(
        err.contains("ibnet-perf: IBNet (ncclNetPlugin_v12)"),
        "{err}"
    );
    if have_font {
        let b = std::fs::read(&png).unwrap();
        assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n");
    }
}

#[test]
fn loopback_json() {
    let o = bin("ibnet-perf")
        .args([
            "--max-bytes",
            "64",
            "--min-bytes",
            "32",
            "-n",
            "20",
            "--json",
            "-c",
        ])
        .arg("--plugin")
        .arg(plugin())
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["meta"]["plugin_name"], "IBNet");
    assert_eq!(v["results"].as_array().unwrap().len(), 2);
    assert_eq!(v["results"][1]["size"], 64);
    assert_eq!(v["results"][1]["check"], "ok");
    assert!(v["results"][0]["lat_p50_us"].as_f64().unwrap() > 0.0);
}

#[test]
fn closed_stdout_ends_quietly() {
    let small = [
        "--min-bytes",
        "32",
        "--max-bytes",
        "64",
        "-n",
        "5",
        "--warmup",
        "1",
    ];
    // The table run: its first stdout line (the header) fails.
    let o = closed_stdout(bin("ibnet-perf").args(small).arg("--plugin").arg(plugin()));
    assert_quiet_end("ibnet-perf", &o);
    // --json: the header goes to stderr, the run completes, then the report's write fails.
    let o = closed_stdout(
        bin("ibnet-perf")
            .args(small)
            .arg("--json")
            .arg("--plugin")
            .arg(plugin()),
    );
    assert_quiet_end("ibnet-perf --json", &o);
    assert!(
        text(&o).1.contains("ibnet-perf: IBNet (ncclNetPlugin_v12)"),
        "the run went as far as the report: {:?}",
        text(&o)
    );
    let o = closed_stdout(bin("ibnet-info").arg("--plugin").arg(plugin()));
    assert_quiet_end("ibnet-info", &o);
}

/// ibnet-info shows what the plugin will WARN about its environment (a malformed value, a
/// refused variable, a rejected `IBNET_SOFT_*`), and judges the soft provider as the plugin
/// configures it (`IBNET_SOFT_PTRACER=0` included).
#[test]
fn info_shows_the_environment_notes_and_honours_soft_settings() {
    let o = bin("ibnet-info")
        .args(["--plugin", plugin().to_str().unwrap()])
        .env_remove("IBNET_PROVIDER")
        .env("NCCL_IB_TIMEOUT", "40")
        .env("NCCL_IB_OOO_RQ", "1")
        .env("IBNET_SOFT_WORKERS", "999")
        .env("IBNET_SOFT_PTRACER", "0")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    let env = out.split("RLIMIT_MEMLOCK").next().unwrap();
    for want in [
        "  WARN ignoring NCCL_IB_TIMEOUT=\"40\": out of range",
        "  WARN NCCL_IB_OOO_RQ=\"1\" refused",
        "  WARN soft provider: IBNET_SOFT_WORKERS",
    ] {
        assert!(env.contains(want), "{want:?} missing from:\n{out}{err}");
    }
    // Where the plugin (IBNET_SOFT_PTRACER=0) finds the soft provider unusable, so does
    // ibnet-info (only on a host with Yama ptrace_scope 1 and no CAP_SYS_PTRACE).
    if let Err(u) = ibnet_soft::probe_with(false) {
        assert!(
            out.contains(&format!("soft provider (ibnet-soft): not usable here: {u}")),
            "{out}"
        );
    }
}
