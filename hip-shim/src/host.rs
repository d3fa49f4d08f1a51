//! The host being probed: a filesystem root and an environment.
//!
//! All sysfs/procfs/boot reads go through [`Host`], so tests can point the probes at a fake
//! tree (`Host::with_root(tmpdir)`) and a fixed environment instead of the real machine.

use std::io;
use std::path::{Path, PathBuf};

use crate::env::Env;

/// Filesystem root plus environment that the probes read.
#[derive(Debug, Clone)]
pub struct Host {
    root: PathBuf,
    env: Env,
}

impl Default for Host {
    fn default() -> Self {
        Self::system()
    }
}

impl Host {
    /// The real machine: root `/`, and no variable set until [`Host::with_env`] gives the
    /// caller's environment (the plugin's one reader).
    pub fn system() -> Self {
        Self {
            root: PathBuf::from("/"),
            env: Env::default(),
        }
    }

    /// Probes under `root` (e.g. a test directory), no variable set.
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            env: Env::default(),
        }
    }

    /// Replaces the environment.
    #[must_use]
    pub fn with_env(mut self, env: Env) -> Self {
        self.env = env;
        self
    }

    /// The environment the probes read.
    pub fn env(&self) -> &Env {
        &self.env
    }

    /// The filesystem root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `abs` (an absolute path such as `/sys/module/x`) re-rooted under [`Host::root`].
    pub fn path(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }

    /// Whether `abs` exists (like `access(path, F_OK) == 0`).
    pub fn exists(&self, abs: &str) -> bool {
        self.path(abs).exists()
    }

    /// Reads `abs` as UTF-8 text (lossily: kernel files are ASCII, but never fail on bytes).
    pub fn read_text(&self, abs: &str) -> io::Result<String> {
        std::fs::read(self.path(abs)).map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// Reads `abs` as raw bytes.
    pub fn read_bytes(&self, abs: &str) -> io::Result<Vec<u8>> {
        std::fs::read(self.path(abs))
    }

    /// Names of the subdirectories of `abs`, sorted; empty if it is missing or unreadable.
    pub fn subdirs(&self, abs: &str) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.path(abs)) else {
            return Vec::new();
        };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// The running kernel's release string (`uname -r`), from `/proc/sys/kernel/osrelease`.
    pub fn kernel_release(&self) -> Option<String> {
        let s = self.read_text("/proc/sys/kernel/osrelease").ok()?;
        let s = s.trim();
        (!s.is_empty()).then(|| s.to_owned())
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    //! A throw-away directory tree for probe tests (no extra crates needed).
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A temporary directory removed on drop.
    pub(crate) struct TempTree(PathBuf);

    impl TempTree {
        pub(crate) fn new(tag: &str) -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            // Relaxed: the counter only has to hand out distinct numbers; nothing pairs with it.
            let n = N.fetch_add(1, Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("ibnet-hip-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create temp dir");
            Self(dir)
        }

        pub(crate) fn root(&self) -> &Path {
            &self.0
        }

        /// Writes `contents` at `abs` (absolute path re-rooted), creating parents.
        pub(crate) fn file(&self, abs: &str, contents: &[u8]) -> &Self {
            let p = self.0.join(abs.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, contents).expect("write");
            self
        }

        /// Creates the directory `abs`.
        pub(crate) fn dir(&self, abs: &str) -> &Self {
            std::fs::create_dir_all(self.0.join(abs.trim_start_matches('/'))).expect("mkdir");
            self
        }
    }

    impl Drop for TempTree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::TempTree;
    use super::*;

    #[test]
    fn paths_are_rerooted() {
        let t = TempTree::new("host");
        t.file("/proc/sys/kernel/osrelease", b"6.8.0-test\n")
            .dir("/sys/a/b")
            .dir("/sys/a/c");
        t.file("/sys/a/file", b"x");
        let h = Host::with_root(t.root());
        assert!(h.exists("/sys/a/b"));
        assert!(!h.exists("/sys/a/zz"));
        assert_eq!(h.kernel_release().as_deref(), Some("6.8.0-test"));
        assert_eq!(h.subdirs("/sys/a"), vec!["b".to_string(), "c".to_string()]);
        assert!(h.subdirs("/nope").is_empty());
        assert_eq!(h.read_text("/sys/a/file").unwrap(), "x");
    }

    #[test]
    fn missing_release_is_none() {
        let t = TempTree::new("host-norel");
        assert_eq!(Host::with_root(t.root()).kernel_release(), None);
    }
}
