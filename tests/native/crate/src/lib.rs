//! Nothing torch-specific: the crate exists to exercise the build command and link flags.

/// Whether the command line asks for the GPU, the way the tch-rs examples read it.
pub fn wants_cuda(args: &[String]) -> bool {
    args.iter().any(|a| a == "--cuda")
}
