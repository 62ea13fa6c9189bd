//! What users' code and files rely on: code written for the upstream crate and an inference
//! server (candle-vllm) compiles and runs unchanged, upstream's configuration files load (or
//! are refused with the form to write), the shipped configs load and build, and the examples'
//! flag reader answers as documented.
//!
//! One test binary for all these files, so that the crate is linked once for them; each file
//! is a module, so its tests are named `file::test` (`cargo test --test compat
//! compat_upstream::`).

mod compat_inference_server;
mod compat_upstream;
mod example_flags;
mod inference_server_gives_up;
mod shipped_configs;
mod upstream_configs;
