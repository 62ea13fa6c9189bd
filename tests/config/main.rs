//! The configuration files: what loads, every error a user can meet and its wording, random
//! documents that must never panic, and hostile values (environment references, oversized
//! fields).
//!
//! One test binary for all these files, so that the crate is linked once for them; each file
//! is a module, so its tests are named `file::test` (`cargo test --test config
//! config_files::`).

mod config_files;
mod config_fuzz;
mod config_order;
mod config_schedules;
mod fleet_section;
mod hardening_config;
mod reference;
