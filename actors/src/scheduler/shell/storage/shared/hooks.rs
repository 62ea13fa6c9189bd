//! The shared mode's answers where storage modes differ ([`StorageMode`]): a task that would
//! park here goes to the shared queue for any node to claim, and one that starts at once is
//! stored first as this node's claim where the durability asks for it.

use super::calls::SharedCall;
use super::SharedRoom;
use crate::domain::{MailboxKey, ScheduledTask};
use crate::observe::events::TaskStep;
use crate::queue::{Carried, DependsOn, EntryId};
use crate::scheduler::core::Cancel;
use crate::scheduler::protocol::{Extras, Reply};
use crate::scheduler::shell::ledger::{admitted_ms, sequence_of};
use crate::scheduler::shell::storage::{start_now, Parking, Starting, StorageMode};
use crate::scheduler::shell::tasks::Tasks;

/// A submission on its way to the shared queue.
pub(crate) struct Enqueue<P> {
    pub entry: EntryId,
    pub task: ScheduledTask<P>,
    pub key: MailboxKey,
    pub reply: Reply,
    /// Its scheduled start (no node claims it before) and its trace (it is claimed in it).
    pub carried: Carried,
    /// The parents it waits for in the queue, if any.
    pub depends_on: Option<DependsOn>,
}

impl SharedRoom {
    /// Parks a submission in the shared queue, where any node may claim it (held there until
    /// its instant and its parents, if it has them). Its submitter hears once the queue
    /// answers.
    pub fn enqueue<P: Send + 'static, R: Send + 'static>(
        tasks: &mut Tasks<P, R>,
        enqueue: Enqueue<P>,
    ) {
        let Enqueue {
            entry,
            mut task,
            key,
            reply,
            carried,
            depends_on,
        } = enqueue;
        task.meta.mailbox = Some(key.clone());
        tasks.fx.shared(SharedCall::Enqueue {
            entry: SharedRoom::entry_for(sequence_of(entry)),
            rank_time_ms: admitted_ms(entry),
            carried,
            depends_on,
            task,
            key,
            reply,
        });
    }
}

impl<P: Send + 'static, R: Send + 'static> StorageMode<P, R> for SharedRoom {
    fn backend(&self) -> &'static str {
        SharedRoom::backend(self)
    }

    fn keeps_parked(&self) -> bool {
        true
    }

    fn waits_in_fleet(&self) -> bool {
        true
    }

    fn refuses_several_kinds(&self) -> Option<String> {
        Some(format!("the shared queue {}", SharedRoom::backend(self)))
    }

    fn refuses_dependencies(&self) -> Option<String> {
        match self.keeps_dependencies() {
            true => None,
            false => Some(format!("the shared queue {}", SharedRoom::backend(self))),
        }
    }

    /// Under `accepted` durability a task that starts at once is stored as this node's
    /// claim first; it runs, and its submitter hears, once the queue answers
    /// (`SharedReport::Recorded`).
    fn start(
        &mut self,
        tasks: &mut Tasks<P, R>,
        starting: Starting<P>,
        now: u64,
    ) -> Option<ScheduledTask<P>> {
        if !self.records_starts() {
            return Some(start_now(tasks, starting, now));
        }
        let Starting {
            entry,
            mut task,
            key,
            timeout,
            reply,
            extras,
        } = starting;
        let shared_entry = SharedRoom::entry_for(sequence_of(entry));
        let trace = extras.and_then(|extras| extras.trace);
        let traced = Extras::with_trace(None, trace);
        tasks.track(entry, &task.meta, &key, timeout, traced);
        tasks.set_lease(entry, shared_entry, 1);
        tasks.step(entry, TaskStep::Admitted, now);
        tasks.begin_run(entry, false, now);
        if let Some(record) = tasks.ledger.get_mut(entry) {
            let rare = record.rare_mut();
            rare.reply = Some(reply);
            rare.recording = true;
        }
        task.meta.mailbox = Some(key);
        tasks.fx.shared(SharedCall::RecordStart {
            entry,
            shared_entry,
            rank_time_ms: admitted_ms(entry),
            task,
            trace,
            now,
        });
        None
    }

    /// It parks in the shared queue, where any node may claim it, not here: the core lets
    /// go of it, and what its place lets start starts.
    fn park(&mut self, tasks: &mut Tasks<P, R>, parking: Parking<P>, now: u64) -> Vec<EntryId> {
        let Parking {
            entry,
            task,
            key,
            not_before_ms,
            reply,
            extras,
            ..
        } = parking;
        let started = match tasks.core.cancel(entry, now) {
            Ok(Cancel::Parked { started }) => started,
            _ => Vec::new(),
        };
        let carried = Carried {
            not_before_ms,
            trace: extras.and_then(|extras| extras.trace),
            also: Default::default(),
        };
        let enqueue = Enqueue {
            entry,
            task,
            key,
            reply,
            carried,
            depends_on: None,
        };
        SharedRoom::enqueue(tasks, enqueue);
        started
    }

    fn tick(&mut self, _tasks: &mut Tasks<P, R>, now: u64) -> bool {
        self.take_reclaim(now)
    }

    fn holds_stop(&self) -> bool {
        self.is_claiming()
    }

    fn next_due(&self) -> Option<u64> {
        self.reclaim_due()
    }

    fn shared(&mut self) -> Option<&mut SharedRoom> {
        Some(self)
    }
}
