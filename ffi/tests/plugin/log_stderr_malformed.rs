//! A malformed `IBNET_LOG_STDERR` is one WARN naming it (README: "a malformed value is one WARN
//! naming it, and the default stands"): with no NCCL logger, that WARN is written to stderr
//! once and nothing else is (the default, off, stands); `env::load` returns it as a note, which
//! the plugin logs through NCCL's logger when it has one. The test runs itself as a child with
//! the variable set and reads the child's stderr.

use std::process::Command;

use ibnet_nccl::env::{self, Note};

const CHILD: &str = "IBNET_TEST_LOG_STDERR_CHILD";
const TEST: &str = "a_malformed_log_stderr_is_one_warn_on_stderr";

#[test]
fn a_malformed_log_stderr_is_one_warn_on_stderr() {
    if std::env::var_os(CHILD).is_some() {
        // No logger was installed: every line below goes to stderr or nowhere.
        for i in 0..3 {
            ibnet_nccl::warn!("line {i} that stderr must not show");
        }
        let (_, notes) = env::load();
        let bad: Vec<_> = notes
            .iter()
            .filter(|n| {
                matches!(
                    n,
                    Note::Malformed {
                        name: "IBNET_LOG_STDERR",
                        ..
                    }
                )
            })
            .collect();
        assert_eq!(bad.len(), 1, "{notes:?}");
        // As plugin::create logs its notes.
        ibnet_nccl::warn!("{}", bad[0]);
        return;
    }
    let name = crate::util::test_path(module_path!(), TEST);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("IBNET_LOG_STDERR", "yes")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("NET/IBNET")).collect();
    assert_eq!(lines.len(), 1, "exactly one WARN on stderr: {stderr}");
    assert!(
        lines[0].contains("IBNET_LOG_STDERR=\"yes\"") && lines[0].contains("the default stands"),
        "{}",
        lines[0]
    );
}
