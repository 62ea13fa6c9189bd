//! The packing study's workload (`packing_study.rs`), shared with the estimate's accuracy
//! bench (`estimate_accuracy.rs`) so that both measure the same tasks: sizes, priorities,
//! heavy-tailed run times, timeouts given as users give them, Poisson arrivals.

#![allow(dead_code)]

use prometheus_parking_lot::util::TaskId;
use prometheus_parking_lot::Priority;

/// One task of the workload.
#[derive(Debug, Clone, Copy)]
pub struct Task {
    /// Its id: 1 for the first to arrive.
    pub id: TaskId,
    /// When it arrives, ms from the start of the run.
    pub arrives_ms: u64,
    /// The VRAM it holds while it runs.
    pub gb: u32,
    /// Its priority.
    pub priority: Priority,
    /// How long it really runs.
    pub runs_ms: u64,
    /// The execution timeout the submitter gives: at least the run time.
    pub timeout_ms: u64,
    /// Its tenant (the fair-share study's; 0 in the main workload).
    pub tenant: u64,
}

/// SplitMix64: small, fast, and the same on every machine.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Sizes: 55% chat-sized (1–4 GB), 30% medium (5–12 GB), 15% long-context (13–20 GB).
pub fn size(rng: &mut Rng) -> u32 {
    let pick = rng.unit();
    if pick < 0.55 {
        1 + rng.below(4) as u32
    } else if pick < 0.85 {
        5 + rng.below(8) as u32
    } else {
        13 + rng.below(8) as u32
    }
}

/// Priorities: 5% critical, 20% high, 50% normal, 25% low.
pub fn priority(rng: &mut Rng) -> Priority {
    match rng.unit() {
        p if p < 0.05 => Priority::Critical,
        p if p < 0.25 => Priority::High,
        p if p < 0.75 => Priority::Normal,
        _ => Priority::Low,
    }
}

/// Run times: Pareto with shape 1.5 from 1 s (heavy tail: mean 3 s, a few runs of
/// minutes), cut at 10 minutes.
pub fn run_time_ms(rng: &mut Rng) -> u64 {
    let u = 1.0 - rng.unit();
    let seconds = u.powf(-1.0 / 1.5).min(600.0);
    (seconds * 1_000.0) as u64
}

/// The main workload: `tasks` tasks arriving as a Poisson process that offers `load` times
/// the work a card of `card_gb` can do.
pub fn workload(tasks: usize, seed: u64, card_gb: u32, load: f64) -> Vec<Task> {
    let mut rng = Rng(seed);
    let mut drafts: Vec<(u32, Priority, u64, u64)> = (0..tasks)
        .map(|_| {
            let gb = size(&mut rng);
            let runs_ms = run_time_ms(&mut rng);
            // The submitter's estimate: 1.1 to 3 times the real run time, whole seconds.
            let factor = 1.1 + 1.9 * rng.unit();
            let timeout_ms = ((runs_ms as f64 * factor / 1_000.0).ceil() as u64).max(1) * 1_000;
            (gb, priority(&mut rng), runs_ms, timeout_ms)
        })
        .collect();
    let work_gb_ms: f64 = drafts
        .iter()
        .map(|&(gb, _, runs_ms, _)| f64::from(gb) * runs_ms as f64)
        .sum();
    let mean_gap_ms = work_gb_ms / f64::from(card_gb) / load / tasks as f64;
    let mut now = 0.0;
    drafts
        .drain(..)
        .enumerate()
        .map(|(index, (gb, priority, runs_ms, timeout_ms))| {
            now += -mean_gap_ms * (1.0 - rng.unit()).ln();
            Task {
                id: index as TaskId + 1,
                arrives_ms: now as u64,
                gb,
                priority,
                runs_ms,
                timeout_ms,
                tenant: 0,
            }
        })
        .collect()
}
