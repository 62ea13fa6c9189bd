//! The model's checks: the rules that hold after every event (the core's invariants, the
//! workers' jobs, the order of queue calls, outcomes after releases, the permits' units),
//! and, once every run finished and every call was answered, what holds at the end.

use std::collections::HashSet;

use proptest::prelude::*;
use tokio::sync::oneshot;

use super::{Mode, World};
use crate::domain::{PoolError, ResourceKind, TaskId};

impl World {
    pub(super) fn check(&self) -> Result<(), TestCaseError> {
        let core = &self.shell.tasks.core;
        prop_assert_eq!(core.check_invariants(), Ok(()));
        let unadmitted = self.steps.unadmitted_ends.lock().expect("steps").clone();
        prop_assert!(unadmitted.is_empty(), "{:?}", unadmitted);
        let stats = self.shell.stats();
        let outcomes = stats.completed_tasks
            + stats.failed_tasks
            + stats.timed_out_tasks
            + stats.expired_tasks
            + stats.cancelled_tasks;
        prop_assert!(
            outcomes <= stats.submitted_tasks,
            "{} outcomes of {} submissions",
            outcomes,
            stats.submitted_tasks
        );
        for &(worker, entry, _, id) in &self.running {
            prop_assert_eq!(
                core.worker_of(entry),
                Some(worker),
                "task {} runs on worker {} but the core does not hold it there",
                id,
                worker
            );
        }
        let mut borrowed = [0u32; ResourceKind::COUNT];
        for holding in &self.permits {
            let entry = holding.entry();
            let claim = if entry == 0 {
                0
            } else {
                core.units_of(entry).unwrap_or(0)
            };
            prop_assert_eq!(
                holding.units(),
                claim + holding.fast.borrowed(),
                "permit {} holds other units than its claim and what it borrowed",
                entry
            );
            borrowed[holding.kind.index()] += holding.fast.borrowed();
        }
        let lanes = &self.port.lanes;
        for kind in ResourceKind::ALL {
            prop_assert_eq!(
                core.lent(kind),
                lanes.available(kind) + borrowed[kind.index()],
                "{:?}: lent units are neither in the lane nor borrowed",
                kind
            );
        }
        Ok(())
    }

    /// Ends the run: every waiter gone, every permit dropped, every call answered, every
    /// run finished, the pool shut down.
    pub(super) fn wind_down(&mut self) -> Result<(), TestCaseError> {
        while !self.acquires.is_empty() || !self.grows.is_empty() {
            self.withdraw(0);
            self.schedule_port()?;
            self.check()?;
        }
        while !self.permits.is_empty() {
            self.release(0);
            self.schedule_port()?;
            self.check()?;
        }
        while let Some(worker) = self.resting.pop() {
            self.shell.worker_ready(worker, self.now);
            self.carry_out()?;
            self.check()?;
        }
        for _ in 0..200 {
            if self.queue_calls.is_empty()
                && self.shared_calls.is_empty()
                && self.running.is_empty()
            {
                break;
            }
            if !self.queue_calls.is_empty() {
                self.answer_queue(false);
            }
            if !self.shared_calls.is_empty() {
                self.answer_shared(0, false);
            }
            if let Some((_, entry, _, id)) = self.running.pop() {
                let outcome = Ok(u32::try_from(id).unwrap_or(0));
                self.shell.finish(entry, outcome, self.now);
            }
            self.carry_out()?;
            self.check()?;
        }
        self.shell.take_in_registrations();
        self.shell.close_lanes(self.now);
        let (reply, _report) = oneshot::channel();
        let _ = self
            .shell
            .shutdown(ractor::RpcReplyPort::from(reply), self.now);
        self.carry_out()?;
        self.shell.drain_deadline(self.now + 1);
        self.carry_out()?;
        while let Some((_, entry, _, _)) = self.running.pop() {
            self.shell
                .finish(entry, Err(PoolError::Cancelled), self.now);
            self.carry_out()?;
        }
        while !self.queue_calls.is_empty() || !self.shared_calls.is_empty() {
            self.answer_queue(false);
            self.answer_shared(0, false);
            self.carry_out()?;
        }
        self.check()
    }

    /// The end-of-run rules (see the module docs).
    pub(super) fn verify(&self) -> Result<(), TestCaseError> {
        let core = &self.shell.tasks.core;
        prop_assert_eq!(core.running_len(), 0, "nothing runs after the drain");
        for kind in ResourceKind::ALL {
            prop_assert_eq!(core.used(kind), 0, "{:?} units still held", kind);
        }
        let kept: HashSet<TaskId> = self
            .stored
            .values()
            .chain(self.shared_parked.iter().map(|(_, _, task)| task))
            .chain(self.shared_claimed.values())
            .map(|task| task.meta.id)
            .collect();
        for (task, &delivered) in &self.delivered {
            let accepted = self.accepted.get(task).copied().unwrap_or(0);
            prop_assert!(
                delivered <= accepted,
                "task {:?}: {} outcomes for {} accepted submissions",
                task,
                delivered,
                accepted
            );
        }
        for (task, &accepted) in &self.accepted {
            let delivered = self.delivered.get(task).copied().unwrap_or(0);
            let abandoned = self.abandoned.get(task).copied().unwrap_or(0);
            prop_assert!(
                delivered + abandoned == accepted || kept.contains(&task.1),
                "task {:?}: {} accepted submissions, {} outcomes, {} abandoned, not kept by a queue",
                task,
                accepted,
                delivered,
                abandoned
            );
        }
        if matches!(self.mode, Mode::Memory) {
            prop_assert_eq!(self.shell.tasks.ledger.len(), 0, "the ledger is empty");
            let counts = self.steps.counts.lock().expect("steps");
            for ((_, id), &(admitted, ended)) in counts.iter() {
                prop_assert_eq!(admitted, ended, "task {}: admitted, ended", id);
            }
        }
        prop_assert!(
            self.shell.tasks.publishing.is_empty(),
            "every outcome under a claim was answered"
        );
        Ok(())
    }
}
