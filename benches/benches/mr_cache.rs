//! mr_cache benchmark (placeholder).
fn main() {}
