//! Finding ibnet's own plugin when `--plugin` is not given: next to the executable (cargo puts
//! binaries in `target/<profile>/`, tests in `target/<profile>/deps/`), under the names
//! `scripts/ffi-artifacts.sh` gives it (`libnccl-net-ibnet.so`) and the one cargo builds
//! (`libnccl_net_ibnet.so`, also produced when ibnet-tools is built, as ibnet-ffi is a
//! dependency). `IBNET_PLUGIN` overrides.

use std::path::{Path, PathBuf};

use crate::Error;

/// File names tried in each directory, in order.
pub const NAMES: [&str; 2] = ["libnccl-net-ibnet.so", "libnccl_net_ibnet.so"];

/// Directories to search for a binary at `exe`: its directory, its parent (for `deps/`), and
/// `deps/` under its directory.
pub fn search_dirs(exe: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(d) = exe.parent() {
        v.push(d.to_path_buf());
        if d.file_name().is_some_and(|n| n == "deps") {
            if let Some(p) = d.parent() {
                v.push(p.to_path_buf());
            }
        } else {
            v.push(d.join("deps"));
        }
    }
    v
}

/// The newest existing candidate for `exe` (ties: the first in search order). Newest, not
/// first: `cargo test` and `cargo build` of a dependent crate refresh the plugin in `deps/`
/// but not the copy cargo lifted into `target/<profile>/` at the last `cargo build -p ibnet-ffi`,
/// which would otherwise shadow it with old code.
pub fn find_near(exe: &Path) -> Option<PathBuf> {
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for p in search_dirs(exe)
        .into_iter()
        .flat_map(|d| NAMES.iter().map(move |n| d.join(n)))
    {
        let Ok(m) = std::fs::metadata(&p) else {
            continue;
        };
        if !m.is_file() {
            continue;
        }
        let t = m.modified().unwrap_or(std::time::UNIX_EPOCH);
        if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
            best = Some((t, p));
        }
    }
    best.map(|(_, p)| p)
}

/// ibnet's plugin: `IBNET_PLUGIN`, else next to the running executable; an error telling how
/// to build it otherwise.
pub fn default_plugin() -> Result<PathBuf, Error> {
    if let Some(p) = ibnet_nccl::env::var_os("IBNET_PLUGIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    find_near(&exe).ok_or_else(|| {
        let dirs: Vec<String> = search_dirs(&exe)
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        Error(format!(
            "ibnet's plugin (libnccl-net-ibnet.so) not found in {}: build it with \
             `scripts/ffi-artifacts.sh` (or `cargo build --release -p ibnet-ffi`), or pass --plugin PATH",
            dirs.join(", ")
        ))
    })
}

/// Makes `p` absolute (the peer process and NCCL need absolute paths).
pub fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirs_for_bin_and_test() {
        let d = search_dirs(Path::new("/t/release/ibnet-perf"));
        assert_eq!(
            d,
            vec![
                PathBuf::from("/t/release"),
                PathBuf::from("/t/release/deps")
            ]
        );
        let d = search_dirs(Path::new("/t/debug/deps/cli-123"));
        assert_eq!(
            d,
            vec![PathBuf::from("/t/debug/deps"), PathBuf::from("/t/debug")]
        );
    }

    #[test]
    fn finds_either_name() {
        let t = tempfile::tempdir().unwrap();
        let exe = t.path().join("ibnet-perf");
        assert_eq!(find_near(&exe), None);
        std::fs::create_dir(t.path().join("deps")).unwrap();
        std::fs::write(t.path().join("deps/libnccl_net_ibnet.so"), b"").unwrap();
        assert_eq!(
            find_near(&exe),
            Some(t.path().join("deps/libnccl_net_ibnet.so"))
        );
        std::fs::write(t.path().join("libnccl-net-ibnet.so"), b"").unwrap();
        assert_eq!(find_near(&exe), Some(t.path().join("libnccl-net-ibnet.so")));
    }
}
