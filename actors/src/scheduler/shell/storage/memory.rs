//! The in-memory mode: parked tasks wait in their ledger records, and nothing outlives the
//! process. Every default of [`StorageMode`] is this mode's answer.

use super::{park_in_ledger, Parking, StorageMode};
use crate::queue::EntryId;
use crate::scheduler::shell::tasks::Tasks;

/// The in-memory mode. It holds no state: the ledger is its store.
pub(crate) struct MemoryRoom;

impl<P: Send + 'static, R: Send + 'static> StorageMode<P, R> for MemoryRoom {
    fn keeps_parked(&self) -> bool {
        false
    }

    fn keeps_payloads_here(&self) -> bool {
        true
    }

    fn park(&mut self, tasks: &mut Tasks<P, R>, parking: Parking<P>, now: u64) -> Vec<EntryId> {
        park_in_ledger(tasks, parking, now);
        Vec::new()
    }
}
