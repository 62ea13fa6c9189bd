//! The reliability sweep: what a pool withstands. Tasks' identities, its lifecycle and
//! shutdown, panicking executors, results that go wrong, tenants that misbehave.
//!
//! One test binary for all these files, so that the crate is linked once for them; each file
//! is a module, so its tests are named `file::test` (`cargo test --test hardening
//! hardening_panics::`).

#[path = "../support/mod.rs"]
mod support;

mod hardening_identity;
mod hardening_lifecycle;
mod hardening_panics;
mod hardening_results;
mod hardening_tenancy;
