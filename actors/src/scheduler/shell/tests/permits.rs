//! The model's permit holders: they drop permits, give up waiting (as a dropped future
//! does) and take the answers that came.

use std::sync::Arc;

use super::{taken, World};
use crate::permit::answer::Withdrawal;
use crate::permit::{release_holding, Grant, PermitOp, PermitPort};

impl World {
    /// The `n`th held permit is dropped, as `Permit`'s `Drop` does (its grows first: a
    /// grow borrows its permit).
    pub(super) fn release(&mut self, n: usize) {
        if self.permits.is_empty() {
            return;
        }
        let holding = self.permits.remove(n % self.permits.len());
        while let Some(index) = self
            .grows
            .iter()
            .position(|grow| Arc::ptr_eq(&grow.0, &holding))
        {
            self.withdraw(self.acquires.len() + index);
        }
        release_holding(&*self.port, &holding);
    }

    /// A waiter gives up, as the acquire and grow guards do.
    pub(super) fn withdraw(&mut self, n: usize) {
        let waiters = self.acquires.len() + self.grows.len();
        if waiters == 0 {
            return;
        }
        let n = n % waiters;
        let op = if n < self.acquires.len() {
            let answer = self.acquires.remove(n);
            match answer.withdraw() {
                Withdrawal::WasWaiting => Some(PermitOp::WithdrawAcquire(answer)),
                Withdrawal::Answered(Ok(grant)) => Some(PermitOp::Release { entry: grant.entry }),
                Withdrawal::Answered(Err(_)) | Withdrawal::Settled => None,
            }
        } else {
            let (holding, extra, answer) = self.grows.remove(n - self.acquires.len());
            match answer.withdraw() {
                Withdrawal::WasWaiting => Some(PermitOp::WithdrawGrow(answer)),
                Withdrawal::Answered(Ok(())) => {
                    let units = holding.take(extra);
                    let entry = holding.entry();
                    Some(PermitOp::Shrink { entry, units })
                }
                Withdrawal::Answered(Err(_)) | Withdrawal::Settled => None,
            }
        };
        if let Some(op) = op {
            self.port.send(op);
        }
    }

    /// Holders take the answers that came.
    pub(super) fn take_permit_answers(&mut self) {
        let mut waiting = Vec::new();
        for answer in std::mem::take(&mut self.acquires) {
            match taken(&answer) {
                Some(Ok(Grant { holding, .. })) => self.permits.push(holding),
                Some(Err(_)) => {}
                None => waiting.push(answer),
            }
        }
        self.acquires = waiting;
        self.grows.retain(|(_, _, answer)| taken(answer).is_none());
    }
}
