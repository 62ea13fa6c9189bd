//! Worker slots with identities (rule 9): which slot a running task holds, slots retired for
//! good or resting until their thread is ready again, and a slot given back at an end.

use super::{Claim, ParkingLot, NO_WORKER};
use crate::domain::TaskId;

impl ParkingLot {
    /// Worker slots held by running tasks (permits hold none).
    pub fn busy_workers(&self) -> usize {
        self.running.len() - self.running_permits
    }

    /// The worker slot a running task holds; `None` for a permit (rule 14).
    pub fn worker_of(&self, id: TaskId) -> Option<usize> {
        self.running
            .get(&id)
            .filter(|claim| claim.worker != NO_WORKER)
            .map(|claim| claim.worker as usize)
    }

    /// The running task holding worker slot `worker`, if any. O(running).
    pub fn task_on(&self, worker: usize) -> Option<TaskId> {
        self.running
            .iter()
            .find(|(_, claim)| claim.worker as usize == worker)
            .map(|(&id, _)| id)
    }

    /// Retires worker slot `worker`: its thread is gone for good, so it is never handed out
    /// again. A task running on it keeps its capacity until the driver `complete`s it.
    /// Returns that task, if any.
    pub fn retire_worker(&mut self, worker: usize) -> Option<TaskId> {
        let slot = self.retired.get_mut(worker)?;
        *slot = true;
        self.resting[worker] = false;
        self.idle_workers.retain(|&idle| idle as usize != worker);
        self.task_on(worker)
    }

    /// Worker slots not retired.
    pub fn live_workers(&self) -> usize {
        self.retired.iter().filter(|retired| !**retired).count()
    }

    /// Worker slot `worker`, resting, is ready for a task again; returns the tasks that
    /// start on the slots now idle, in order. Does nothing for a slot that does not rest.
    pub fn worker_ready(&mut self, worker: usize, now: u64) -> Vec<TaskId> {
        let mut started = Vec::new();
        let Some(resting) = self.resting.get_mut(worker) else {
            return started;
        };
        if !std::mem::take(resting) {
            return started;
        }
        if !self.retired[worker] {
            self.idle_workers.push(worker as u32);
        }
        self.unpark(now, &mut started);
        started
    }

    /// Gives the worker slot of a claim that ended back, unless it is retired or the claim
    /// is a permit's (which holds none).
    pub(super) fn free_worker_of(&mut self, claim: &Claim, rest: bool) {
        let worker = claim.worker as usize;
        if claim.worker == NO_WORKER {
            self.running_permits -= 1;
        } else if self.retired[worker] {
            // Gone for good: never handed out again.
        } else if rest {
            self.resting[worker] = true;
        } else {
            self.idle_workers.push(claim.worker);
        }
    }
}
