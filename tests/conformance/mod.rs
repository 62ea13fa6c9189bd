//! Behavioural conformance suites for the backend traits, shared by every backend's tests.
//!
//! Each suite is a set of `pub async fn` cases, one behaviour each, plus a `run_all` that runs
//! every case against a fresh backend from a factory. A backend's test file declares
//! `mod conformance;` and calls [`queue::run_all`] (local queues), [`shared_queue::run_all`]
//! (shared queues) and [`mailbox::run_all`] with its own factory, so in-memory, embedded and
//! database backends are held to one contract per trait.
//!
//! This module holds what the suites share: the payload type and time constants.

pub mod dependencies;
pub mod mailbox;
pub mod queue;
pub mod shared_queue;

use serde::{Deserialize, Serialize};

/// A realistic epoch time (milliseconds, late 2023) that the suites offset from, so durable
/// backends are exercised with values that do not fit 32 bits.
pub const EPOCH_MS: u64 = 1_700_000_000_000;

/// The payload the queue suite parks. Durable backends serialize it, so it carries a string
/// with non-ASCII text and a nested collection to make a lossy round trip visible.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Job {
    /// A name derived from the task id.
    pub name: String,
    /// Some numbers derived from the task id.
    pub inputs: Vec<u32>,
}

impl Job {
    /// The payload the suites give task `id`, distinct for every id.
    pub fn for_task(id: u64) -> Self {
        Self {
            name: format!("job-{id} ✓"),
            inputs: vec![id as u32, (id as u32).wrapping_mul(31), u32::MAX],
        }
    }
}
