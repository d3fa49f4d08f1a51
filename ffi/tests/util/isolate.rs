//! A process of its own for each test of a grouped test binary.
//!
//! Most plugin tests must not share a process: each sets its environment and then initialises
//! the one plugin of the process (the first `init` fixes it until exit), reads the one log sink,
//! or counts the fds and RSS of the whole process. A test that starts with
//!
//! ```ignore
//! if ran_in_child() {
//!     return;
//! }
//! ```
//!
//! runs its body in a child: in the test binary's own process, [`ran_in_child`] re-executes the
//! binary for this one test (`--exact <name>`, [`CHILD`] set in the child's environment), waits
//! for it (at most [`limit`], then kills it), forwards its output and fails unless it passed;
//! in the child, it returns false and the body runs there, alone.

use std::io::Read;
use std::process::{Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Set in the child's environment (to the test's name): this process runs one test's body.
/// Processes the child starts inherit it, so a test's own re-executed peer runs as it did.
pub const CHILD: &str = "IBNET_TEST_ISOLATED";

/// Overrides [`limit`] (seconds).
pub const LIMIT_VAR: &str = "IBNET_TEST_ISOLATED_TIMEOUT";

/// How long a child may run before it is killed and its test fails: a hang guard, generous
/// for a loaded 2-core host (`IBNET_TEST_ISOLATED_TIMEOUT` seconds, default 900).
pub fn limit() -> Duration {
    let s = std::env::var(LIMIT_VAR).ok().and_then(|v| v.parse().ok());
    Duration::from_secs(s.unwrap_or(900))
}

/// True when the calling test ran (and passed) in a child process of its own: the caller
/// returns at once. False in that child: the caller goes on with the test's body. Call it
/// first thing in a `#[test]` function, on the thread libtest runs it on (named after the
/// test). Panics, with the child's output, when the child failed, ran no test or hung.
pub fn ran_in_child() -> bool {
    if std::env::var_os(CHILD).is_some() {
        return false;
    }
    let me = std::thread::current();
    let name = me
        .name()
        .filter(|n| *n != "main")
        .expect("ran_in_child: call it on the test's own thread (libtest names it)");
    run_child(name);
    true
}

/// The libtest name of test `f` in the module whose `module_path!()` is `module`: the path
/// without the crate's name (`fusion::fused_api`, `f` → `fused_api::f`). For tests that
/// re-execute their binary for one of their own (role) tests.
pub fn test_path(module: &str, f: &str) -> String {
    match module.split_once("::") {
        Some((_, m)) => format!("{m}::{f}"),
        None => f.to_string(),
    }
}

/// Runs test `name` in a child of this binary; panics unless it passed.
fn run_child(name: &str) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let (reader, writer) = std::io::pipe().expect("a pipe for the child's output");
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--include-ignored", "--nocapture"])
        .args(["--test-threads=1", "--color", "never"])
        .env(CHILD, name)
        .stdout(writer.try_clone().expect("a second end for stderr"))
        .stderr(writer);
    let mut child = cmd.spawn().expect("spawn the test binary again");
    // The command holds the pipe's write ends: dropped, only the child (and what it starts)
    // keeps them, and the reader sees the end of the output when they exit.
    drop(cmd);
    let out = Arc::new(Mutex::new(Vec::new()));
    let reading = read_all(reader, out.clone());
    let limit = limit();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the child") {
            break Some(s);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // A peer the child started and left running may hold the pipe open: wait a little only.
    let t1 = Instant::now();
    while !reading.is_finished() && t1.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = String::from_utf8_lossy(&out.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    // Captured by libtest in this process: shown when the test fails or with --nocapture.
    eprint!("{text}");
    check(name, status, &text, limit);
}

/// Reads `r` to its end into `out`, on a thread of its own.
fn read_all(mut r: std::io::PipeReader, out: Arc<Mutex<Vec<u8>>>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(&buf[..n]);
        }
    })
}

/// Panics unless the child exited successfully after running exactly test `name`.
fn check(name: &str, status: Option<ExitStatus>, text: &str, limit: Duration) {
    let Some(status) = status else {
        panic!("{name}: its process ran past {limit:?} ({LIMIT_VAR}) and was killed");
    };
    assert!(status.success(), "{name}: its process failed ({status})");
    assert!(
        text.contains("test result: ok. 1 passed"),
        "{name}: its process did not run the test (no \"1 passed\" line)"
    );
}
