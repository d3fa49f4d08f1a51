//! Compiles the C shim that turns NCCL's variadic logger call into a formatted string
//! (stable Rust cannot define a C-variadic function).
fn main() {
    println!("cargo:rerun-if-changed=src/logshim.c");
    cc::Build::new()
        .file("src/logshim.c")
        .warnings(true)
        .compile("ibnet_tools_logshim");
}
