//! "env.rs is the only reader" and "every variable is declared once", checked on the sources:
//! no code in the crates' `src` outside `nccl/src/env.rs` reads the process environment, and
//! every variable name the sources spell is declared in `ibnet_core::config`.

use std::path::{Path, PathBuf};

const CRATES: &[&str] = &[
    "core/src",
    "nccl/src",
    "verbs/src",
    "proxy/src",
    "atomics/src",
    "testkit/src",
    "ffi/src",
    "soft/src",
    "hip-shim/src",
    "tools/src",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("source dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn all_sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for c in CRATES {
        sources(&root.join(c), &mut files);
    }
    files
        .into_iter()
        .map(|f| {
            let rel = f
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (rel, std::fs::read_to_string(&f).expect("source"))
        })
        .collect()
}

#[test]
fn only_the_env_reader_reads_the_environment() {
    let mut readers = Vec::new();
    for (file, text) in all_sources() {
        if file == "nccl/src/env.rs" {
            continue;
        }
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if ["env::var(", "env::var_os(", "env::vars("]
                .iter()
                .any(|r| code.contains(&format!("std::{r}")))
            {
                readers.push(format!("{file}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        readers.is_empty(),
        "reads the environment outside nccl/src/env.rs:\n{}",
        readers.join("\n")
    );
}

#[test]
fn every_variable_the_sources_name_is_declared() {
    let mut undeclared = Vec::new();
    for (file, text) in all_sources() {
        for piece in text.split('"').skip(1).step_by(2) {
            let is_var = ["NCCL_", "IBNET_", "RCCL_"]
                .iter()
                .any(|p| piece.starts_with(p))
                && piece.len() > 6
                && piece
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
            // Made-up names of tests, and the soft test's prefix.
            let test_only = ["NCCL_IB_NOPE", "NCCL_NO_SUCH", "IBNET_SOFT_"].contains(&piece);
            if is_var && !test_only && ibnet_core::config::find(piece).is_none() {
                undeclared.push(format!("{file}: {piece}"));
            }
        }
    }
    assert!(
        undeclared.is_empty(),
        "not in ibnet_core::config:\n{}",
        undeclared.join("\n")
    );
}
