//! The engine through its public faces, in memory: the core's rules and properties, pools,
//! permits and budgets, streaming, retries, errors, GPU pools on a fake device, and the
//! reason a task waits.
//!
//! One test binary for all these files, so that the crate is linked once for them; each file
//! is a module, so its tests are named `file::test` (`cargo test --test engine permits::`).

#[path = "../support/mod.rs"]
mod support;

mod budgets;
mod busy_workers;
mod core_fair_share;
mod core_properties;
mod dependencies;
mod errors;
mod estimates;
mod fair_by_use;
mod fleet_budget_properties;
mod gpu_pools;
mod mailbox_groups;
mod not_before;
mod permits;
mod permits_fast_path;
mod result_gap;
mod retries;
mod retrieve_give_up;
mod runtime;
mod schedules;
mod several_kinds;
mod streaming;
mod why_waiting;
