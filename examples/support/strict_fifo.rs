//! The strict FIFO baseline the VRAM simulation and the packing study compare the parking lot
//! with: tasks start in arrival order, and the head of the line blocks everyone behind it
//! until it fits the card and a worker is free. Shared by `examples/vram_simulation.rs` and
//! `benches/packing_study.rs` (included with `#[path]`).

use std::collections::{HashMap, VecDeque};

use prometheus_parking_lot::util::serde::TaskId;

/// See the module docs.
pub struct StrictFifo {
    card_gb: u32,
    workers: usize,
    waiting: VecDeque<(TaskId, u32)>,
    running: HashMap<TaskId, u32>,
    used: u32,
}

impl StrictFifo {
    /// An empty line in front of a card of `card_gb` with `workers` worker slots.
    pub fn new(card_gb: u32, workers: usize) -> Self {
        Self {
            card_gb,
            workers,
            waiting: VecDeque::new(),
            running: HashMap::new(),
            used: 0,
        }
    }

    /// Task `id` of `gb` arrives; returns the tasks that start now, in order.
    pub fn arrive(&mut self, id: TaskId, gb: u32) -> Vec<TaskId> {
        self.waiting.push_back((id, gb));
        self.start_heads()
    }

    /// Running task `id` ends; returns the tasks that start now, in order.
    pub fn finish(&mut self, id: TaskId) -> Vec<TaskId> {
        self.used -= self.running.remove(&id).expect("a running task");
        self.start_heads()
    }

    fn start_heads(&mut self) -> Vec<TaskId> {
        let mut started = Vec::new();
        while let Some(&(id, gb)) = self.waiting.front() {
            if self.used + gb > self.card_gb || self.running.len() == self.workers {
                break;
            }
            self.waiting.pop_front();
            self.used += gb;
            self.running.insert(id, gb);
            started.push(id);
        }
        started
    }
}
