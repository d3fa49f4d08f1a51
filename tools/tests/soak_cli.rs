//! `ibnet-soak` end to end: a short two-process run through ibnet's plugin (the soft provider)
//! verifies every byte and reports its figures; bad arguments are usage errors.

use std::process::{Command, Stdio};

fn soak() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ibnet-soak"))
}

#[test]
fn short_run_verifies_and_reports() {
    let o = soak()
        .args(["--seconds", "2", "--threads", "2", "--comms", "3"])
        .args(["--max-bytes", "256K", "--seed", "12345", "--timeout", "30"])
        .env_remove("IBNET_PROVIDER")
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("ibnet-soak: seed 12345, 2 s"), "{out}");
    assert!(out.contains("provider soft"), "soft by default: {out}");
    for who in ["driver", "peer"] {
        for phase in ["start", "end", "closed"] {
            let l = out
                .lines()
                .find(|l| l.starts_with(&format!("ibnet-soak {who}: {phase}:")))
                .unwrap_or_else(|| panic!("no {who} {phase} line: {out}"));
            assert!(l.contains("MiB, ") && l.contains(" fds, "), "{l}");
        }
    }
    let total = out
        .lines()
        .find(|l| l.starts_with("ibnet-soak: total"))
        .unwrap_or_else(|| panic!("no total: {out}"));
    assert!(total.contains(" 0 errors, 0 corruptions"), "{total}");
    let messages: u64 = total
        .split("receives): ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(messages > 0, "no message verified: {total}");
    assert!(out.trim_end().ends_with("ibnet-soak: OK"), "{out}");
}

#[test]
fn bad_arguments() {
    for args in [
        &["--max-width", "9"][..],
        &["--window", "0"],
        &["--seconds", "0"],
        &["--max-bytes", "3T"],
    ] {
        let o = soak().args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?} is a usage error");
    }
    let o = soak()
        .args(["--plugin", "/nonexistent/libx.so", "--seconds", "1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("plugin /nonexistent/libx.so does not exist"),
        "{err}"
    );
}

#[test]
fn closed_stdout_ends_quietly() {
    // stdout a pipe whose reader is gone before the first line: the write fails with EPIPE.
    let mut c = soak()
        .args(["--seconds", "1", "--threads", "1", "--comms", "1"])
        .args(["--max-bytes", "4K", "--timeout", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(c.stdout.take());
    let o = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("error"), "{err}");
    assert_eq!(o.status.code(), Some(0), "{err}");
}
