//! The model's backends: the local queue actor and the shared queue, answering the calls the
//! shell asked for, in order or when an event says so, or failing them; and the rules their
//! calls keep.

use crate::domain::{BackendFault, FaultKind};
use proptest::prelude::*;

use super::{QueueStep, World};
use crate::queue::actor::{QueueMsg, QueueReport};
use crate::queue::{EntryId, Lease};
use crate::scheduler::shell::storage::shared::{Enqueued, SharedCall, SharedReport};

impl World {
    /// The local queue actor answers its oldest call.
    pub(super) fn answer_queue(&mut self, fail: bool) {
        let Some(call) = self.queue_calls.pop_front() else {
            return;
        };
        let report = match call {
            QueueMsg::Park { entry, .. } if fail => QueueReport::ParkFailed {
                entry,
                backend: "test",
                fault: BackendFault::plain(FaultKind::Refused, "disk full"),
            },
            QueueMsg::Park { entry, task, .. } => {
                self.stored.insert(entry, task);
                QueueReport::Parked { entry }
            }
            QueueMsg::Claim { entry } => match self.stored.remove(&entry) {
                Some(task) if !fail => {
                    self.claimed.insert(entry);
                    QueueReport::Claimed { entry, task }
                }
                _ => QueueReport::ClaimFailed {
                    entry,
                    fault: BackendFault::plain(FaultKind::Other, "not there"),
                },
            },
            QueueMsg::Settle { entry, .. } => {
                self.claimed.remove(&entry);
                return;
            }
            QueueMsg::ParentEnded { .. } => return,
            QueueMsg::Release { entry } => {
                self.claimed.remove(&entry);
                return;
            }
            QueueMsg::Remove { entry } => {
                self.stored.remove(&entry);
                return;
            }
        };
        self.shell.queue_report(report, self.now);
    }

    /// The shared queue answers one pending call.
    pub(super) fn answer_shared(&mut self, n: usize, fail: bool) {
        if self.shared_calls.is_empty() {
            return;
        }
        let call = self.shared_calls.remove(n % self.shared_calls.len());
        let report = match call {
            SharedCall::Enqueue {
                entry,
                rank_time_ms,
                task,
                key,
                reply,
                ..
            } => {
                let (task_id, cost) = (task.meta.id, task.meta.cost);
                let result = if fail {
                    Err(crate::queue::QueueError::Backend(BackendFault::plain(
                        FaultKind::Other,
                        "down",
                    )))
                } else {
                    self.shared_parked.push((entry, rank_time_ms, task));
                    Ok(None)
                };
                SharedReport::Enqueued(vec![Enqueued {
                    task_id,
                    key,
                    cost,
                    reply,
                    result,
                    attached: None,
                }])
            }
            SharedCall::RecordStart {
                entry,
                shared_entry,
                task,
                ..
            } => {
                let result = if fail {
                    Err(crate::queue::QueueError::Backend(BackendFault::plain(
                        FaultKind::Other,
                        "down",
                    )))
                } else {
                    self.shared_claimed.insert(shared_entry, task.clone());
                    self.shared_held.push(shared_entry);
                    Ok(Lease {
                        entry: shared_entry,
                        task,
                        attempt: 1,
                        expires_at_ms: self.now + 300,
                        trace: None,
                    })
                };
                SharedReport::Recorded { entry, result }
            }
            SharedCall::Claim { query, max, .. } if !fail => {
                let mut free = query.free;
                let mut leases = Vec::new();
                self.shared_parked.sort_by_key(|(entry, rank, task)| {
                    (std::cmp::Reverse(task.meta.priority), *rank, *entry)
                });
                let mut index = 0;
                while index < self.shared_parked.len() && leases.len() < max {
                    let cost = self.shared_parked[index].2.meta.cost;
                    if cost.units <= free.get(cost.kind) {
                        let (entry, _, task) = self.shared_parked.remove(index);
                        free = free.with(cost.kind, free.get(cost.kind) - cost.units);
                        self.shared_claimed.insert(entry, task.clone());
                        self.shared_held.push(entry);
                        leases.push(Lease {
                            entry,
                            task,
                            attempt: 1,
                            expires_at_ms: self.now + 300,
                            trace: None,
                        });
                    } else {
                        index += 1;
                    }
                }
                SharedReport::Claimed(Ok(leases))
            }
            SharedCall::Claim { .. } => SharedReport::Claimed(Err(
                crate::queue::QueueError::Backend(BackendFault::plain(FaultKind::Other, "down")),
            )),
            SharedCall::RemoveTask { key, id, reply } => {
                let found = self.shared_parked.iter().position(|(_, _, task)| {
                    task.meta.id == id && task.meta.mailbox.as_ref() == Some(&key)
                });
                let result = Ok(found.map(|index| self.shared_parked.remove(index).2));
                SharedReport::Removed {
                    key,
                    id,
                    reply,
                    result,
                }
            }
            SharedCall::Renew { .. }
            | SharedCall::GiveBackBudget { .. }
            | SharedCall::SettleUse { .. } => return,
            SharedCall::Settle { .. } => unreachable!("settles are carried out at once"),
            SharedCall::Retry { claim, .. } => {
                self.give_back(claim.entry);
                if let Some(task) = self.shared_claimed.remove(&claim.entry) {
                    self.shared_held.retain(|&held| held != claim.entry);
                    self.shared_parked.push((claim.entry, 0, task));
                }
                return;
            }
            SharedCall::Release { claims, .. } => {
                for claim in claims {
                    self.give_back(claim.entry);
                    if let Some(task) = self.shared_claimed.remove(&claim.entry) {
                        self.shared_held.retain(|&held| held != claim.entry);
                        self.shared_parked.push((claim.entry, 0, task));
                    }
                }
                return;
            }
        };
        self.shell.shared_report(report, self.now);
    }

    /// Notes that the task of shared `entry` left this node's hands (lost or handed back).
    pub(super) fn give_back(&mut self, entry: EntryId) {
        if let Some(task) = self.shared_claimed.get(&entry) {
            let key = task
                .meta
                .mailbox
                .clone()
                .expect("a shared task carries its key");
            self.given_back.insert((key, task.meta.id));
        }
    }

    /// Park, then claim or remove, then settle: in that order, once each.
    pub(super) fn order_rule(&mut self, call: &QueueMsg<u32>) -> Result<(), TestCaseError> {
        let (entry, next) = match call {
            // Not a call about the entry's own storage: any time after the entry was there.
            QueueMsg::ParentEnded { .. } => return Ok(()),
            QueueMsg::Park { entry, .. } => (*entry, QueueStep::Parked),
            QueueMsg::Claim { entry } => (*entry, QueueStep::Claimed),
            QueueMsg::Remove { entry } | QueueMsg::Settle { entry, .. } => {
                (*entry, QueueStep::Over)
            }
            QueueMsg::Release { entry } => (*entry, QueueStep::Parked),
        };
        let now = self.order.get(&entry).copied();
        let allowed = matches!(
            (now, call),
            (None, QueueMsg::Park { .. })
                | (
                    Some(QueueStep::Parked),
                    QueueMsg::Claim { .. } | QueueMsg::Remove { .. }
                )
                | (
                    Some(QueueStep::Claimed),
                    QueueMsg::Settle { .. } | QueueMsg::Release { .. }
                )
        );
        prop_assert!(allowed, "entry {entry}: {next:?} after {now:?}");
        self.order.insert(entry, next);
        Ok(())
    }
}
