//! comm_cycle benchmark (placeholder).
fn main() {}
