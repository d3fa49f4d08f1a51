//! Writes every target's seed inputs to `seeds/<target>/<name>` (run from `fuzz/`; see
//! README.md). The seeds come from the real encoders through `ibnet_fuzz`'s builders.

fn main() -> std::io::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    for (target, seeds) in ibnet_fuzz::all_seeds() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in seeds {
            std::fs::write(dir.join(name), bytes)?;
        }
    }
    println!("seeds written under {}", root.display());
    Ok(())
}
