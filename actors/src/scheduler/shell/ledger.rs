//! The ledger: every task the shell has admitted and not yet ended, by entry and by caller.
//!
//! A record holds what the shell needs of a task between its admission and its end: its
//! identity (entry id, the caller's task id and mailbox key), the metadata its executor gets
//! back, its execution timeout, its payload while the ledger is where it waits (see
//! [`Record::payload`]), its phase (parked, or running with its cancellation flag) and, boxed,
//! what few tasks carry (a stream, a nested slot, a submitter still waiting for a store, a
//! shared lease, an enabled span).
//!
//! # Memory
//!
//! A million parked tasks are a million records, so a record is kept small: an anonymous
//! mailbox key is its 128 random bits, not its 42-byte name; the rare parts are one pointer;
//! records sit in one vector, reused through a free list; the indexes are tables of 4-byte
//! slot numbers hashed by a key the record itself holds, so no key is stored twice.
//!
//! # Invariants
//!
//! - Every record is reachable from `by_entry` under its entry and from `by_caller` under its
//!   (tenant, task id); no two records share either.
//! - A record whose key the pool made (`minted_key`, marked with [`Ledger::mark_minted`]) is
//!   also reachable from `by_minted` under its key's random bits, which no other record
//!   shares; no other record is in that index.
//! - `len` counts the occupied slots; `vacant` lists exactly the empty ones.

use std::borrow::Cow;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use hashbrown::HashTable;

use crate::domain::{
    ExtraCosts, MailboxKey, Priority, ResourceCost, ResourceKind, ScheduledTask, TaskId,
    TaskMetadata, TenantId,
};
use crate::observe::trace::TraceParent;
use crate::queue::{Claim, EntryId};
use crate::running::cancellation::Cancellation;
use crate::running::stream::StreamAttachment;
use crate::scheduler::protocol::Reply;
use crate::sync::slots::SlotGuard;

/// Entry ids are the admission time in milliseconds shifted left by this many bits, plus a
/// counter within the millisecond: increasing in admission order and across restarts.
pub(crate) const ENTRY_TIME_SHIFT: u32 = 16;

/// The admission time (ms) an entry id carries.
pub(crate) fn admitted_ms(entry: EntryId) -> u64 {
    entry >> ENTRY_TIME_SHIFT
}

/// The count within its millisecond an entry id carries.
pub(crate) fn sequence_of(entry: EntryId) -> u16 {
    (entry & ((1 << ENTRY_TIME_SHIFT) - 1)) as u16
}

/// A `timeout_ms` that means "no execution timeout".
const NO_TIMEOUT: u64 = u64::MAX;

/// A tenant as the caller index hashes it: an anonymous tenant by its bits, so a record that
/// keeps only the bits and a caller that names the full key find each other.
#[derive(Hash, PartialEq, Eq, Clone, Copy)]
enum Tenant<'a> {
    Anonymous(u128),
    Named(&'a str),
}

impl<'a> Tenant<'a> {
    fn of(tenant: &'a TenantId) -> Self {
        match MailboxKey::anonymous_bits(tenant) {
            Some(bits) => Tenant::Anonymous(bits),
            None => Tenant::Named(&tenant.0),
        }
    }
}

/// A task's mailbox key, as small as it can be kept.
pub(crate) enum TaskKey {
    /// A key [`MailboxKey::anonymous`] made: its bits (in two words, for the record's
    /// alignment; see [`TaskKey::bits`]).
    Anonymous([u64; 2]),
    /// Any other key.
    Named(Box<MailboxKey>),
}

impl TaskKey {
    /// The tenant of a key that is not anonymous.
    pub fn named_tenant(&self) -> Option<&TenantId> {
        match self {
            TaskKey::Anonymous(_) => None,
            TaskKey::Named(key) => Some(&key.tenant),
        }
    }

    /// Keeps `key` in its smallest form (an anonymous key costs no allocation).
    pub fn of(key: &MailboxKey) -> Self {
        let bare = key.user_id.is_none() && key.session_id.is_none();
        match MailboxKey::anonymous_bits(&key.tenant) {
            Some(bits) if bare => TaskKey::Anonymous([(bits >> 64) as u64, bits as u64]),
            _ => TaskKey::Named(Box::new(key.clone())),
        }
    }

    /// The bits of an anonymous key.
    fn bits(words: [u64; 2]) -> u128 {
        (u128::from(words[0]) << 64) | u128::from(words[1])
    }

    fn tenant(&self) -> Tenant<'_> {
        match self {
            TaskKey::Anonymous(words) => Tenant::Anonymous(Self::bits(*words)),
            TaskKey::Named(key) => Tenant::of(&key.tenant),
        }
    }

    /// The full key (built from the bits for an anonymous one).
    pub fn key(&self) -> Cow<'_, MailboxKey> {
        match self {
            TaskKey::Anonymous(words) => {
                Cow::Owned(MailboxKey::anonymous_from_bits(Self::bits(*words)))
            }
            TaskKey::Named(key) => Cow::Borrowed(key),
        }
    }

    /// The full key, kept in full from now on (a task that starts is reported several times).
    pub fn expand(&mut self) -> &MailboxKey {
        if let TaskKey::Anonymous(words) = *self {
            let key = MailboxKey::anonymous_from_bits(Self::bits(words));
            *self = TaskKey::Named(Box::new(key));
        }
        match self {
            TaskKey::Named(key) => key,
            TaskKey::Anonymous(_) => unreachable!("expanded just above"),
        }
    }

    /// The full key, by value.
    pub fn into_key(self) -> MailboxKey {
        match self {
            TaskKey::Named(key) => *key,
            TaskKey::Anonymous(words) => MailboxKey::anonymous_from_bits(Self::bits(words)),
        }
    }

    /// The bits of the tenant when it is one [`MailboxKey::anonymous`] made (a task
    /// submitted without a mailbox), whatever the rest of the key.
    pub fn anonymous_tenant(&self) -> Option<u128> {
        match self.tenant() {
            Tenant::Anonymous(bits) => Some(bits),
            Tenant::Named(_) => None,
        }
    }

    /// Whether `key` is exactly this key.
    pub fn is(&self, key: &MailboxKey) -> bool {
        match self {
            TaskKey::Anonymous(words) => {
                key.user_id.is_none()
                    && key.session_id.is_none()
                    && MailboxKey::anonymous_bits(&key.tenant) == Some(Self::bits(*words))
            }
            TaskKey::Named(own) => **own == *key,
        }
    }
}

/// Where a task is in its life.
pub(crate) enum Phase<P> {
    /// In the parking lot (the core's, or a claimed task parked here), with its payload
    /// while the ledger is where it waits: parked in a pool whose queue keeps nothing the
    /// process does not (in memory), spinning before a durable queue stores it, or claimed
    /// from a shared queue and parked here. `None` when a durable queue holds it.
    Parked(Option<P>),
    /// Started on the worker slot the core gave it (its payload went with its job).
    Running(Run),
}

/// A time in milliseconds as the caller gave it (`u128`), kept in two words so the record
/// needs no 16-byte alignment of its own.
#[derive(Clone, Copy)]
struct Millis {
    high: u64,
    low: u64,
}

impl From<u128> for Millis {
    fn from(ms: u128) -> Self {
        Self {
            high: (ms >> 64) as u64,
            low: ms as u64,
        }
    }
}

impl From<Millis> for u128 {
    fn from(ms: Millis) -> Self {
        (u128::from(ms.high) << 64) | u128::from(ms.low)
    }
}

/// A started task's run. (16 bytes, so a running record needs no box of its own.)
pub(crate) struct Run {
    /// How long after its admission it started, ms (saturating at 49 days): its start time
    /// is `admitted_ms + waited_ms`, where the event stream's run times start.
    pub waited_ms: u32,
    /// Raised to stop the run; the job carries a clone (a streamed task's is its stream's).
    pub cancellation: Cancellation,
    /// Its job was sent to its worker.
    pub sent: bool,
    /// Its outcome was delivered already (the watchdog or the drain deadline): the worker's
    /// late report only releases its capacity.
    pub ended: bool,
    /// Its payload came from the local durable queue, which must hear how it ended.
    pub from_queue: bool,
}

/// What few tasks carry (boxed: the rest pay one null pointer).
#[derive(Default)]
pub(crate) struct Rare {
    /// Its `task` span, when a subscriber wants one.
    pub span: Option<tracing::Span>,
    /// A streamed task's buffer: its outcome goes there, not to the mailbox.
    pub stream: Option<StreamAttachment>,
    /// The nested slot of a task submitted from one of the pool's own workers, held until
    /// its worker is free again (see [`crate::sync::slots`]).
    pub slot: Option<SlotGuard>,
    /// Its submitter, waiting until the queue has stored the task.
    pub reply: Option<Reply>,
    /// The shared queue's claim of a task this node claimed from it (or stored as its claim
    /// when it started at once): its fencing token.
    pub lease: Option<Claim>,
    /// The queue is still storing `lease` (a task this node started at once): until it
    /// answers, the claim is not renewed.
    pub recording: bool,
    /// `lease` is a claim this node took from the shared queue, which charged the fleet's
    /// fair share (if the queue keeps one), not a task it started at once and stored as its
    /// claim, which charged nothing there.
    pub claimed: bool,
    /// A copy of the running task's payload, kept while it may be preempted, so it can run
    /// again (a `P`; see `rerun.rs`).
    pub spare: Option<Box<dyn std::any::Any + Send>>,
    /// Units the run held when it was asked to yield; `None`: not asked.
    pub asked_units: Option<u32>,
    /// How many times the task was asked to yield.
    pub preemptions: u32,
    /// Why each of its failed runs failed, oldest first, while it is tried again (see
    /// `retry.rs`).
    pub failures: Vec<String>,
    /// The trace it belongs to, if any: its events and its terminal event carry it.
    pub trace: Option<TraceParent>,
    /// What it needs beside its cost, for a task of several kinds (core rule 25).
    pub also: ExtraCosts,
}

/// One admitted task. See the module docs. (The cost and the times are kept in parts, so
/// the record packs into 128 bytes beside a 16-byte payload.)
pub(crate) struct Record<P> {
    /// The pool's id of the task.
    pub entry: EntryId,
    /// The caller's id of the task.
    pub task_id: TaskId,
    /// Where its outcome goes.
    pub key: TaskKey,
    /// The caller's creation time, as given (the rank uses the entry id).
    created_at_ms: Millis,
    /// The caller's deadline, as given, when `has_deadline`.
    deadline_ms: Millis,
    /// The units it holds while it runs, of `kind`.
    units: u32,
    kind: ResourceKind,
    /// Its priority.
    pub priority: Priority,
    has_deadline: bool,
    /// Its key was made by the pool (the task came without one), so the key `submit`
    /// returned is the only way to its result: a waiter that gives up may abandon it.
    pub minted_key: bool,
    /// Its execution timeout in ms, or [`NO_TIMEOUT`].
    timeout_ms: u64,
    /// Parked (with its payload, where the ledger keeps it) or running.
    pub phase: Phase<P>,
    /// See [`Rare`].
    pub rare: Option<Box<Rare>>,
}

impl<P> Record<P> {
    /// A parked record of `meta`'s task under `key`.
    pub fn new(
        entry: EntryId,
        meta: &TaskMetadata,
        key: TaskKey,
        timeout: Option<Duration>,
    ) -> Self {
        Self {
            entry,
            task_id: meta.id,
            key,
            created_at_ms: meta.created_at_ms.into(),
            deadline_ms: meta.deadline_ms.unwrap_or(0).into(),
            units: meta.cost.units,
            kind: meta.cost.kind,
            priority: meta.priority,
            has_deadline: meta.deadline_ms.is_some(),
            minted_key: false,
            timeout_ms: timeout.map_or(NO_TIMEOUT, |limit| {
                u64::try_from(limit.as_millis())
                    .unwrap_or(NO_TIMEOUT - 1)
                    .min(NO_TIMEOUT - 1)
            }),
            phase: Phase::Parked(None),
            rare: None,
        }
    }

    /// What it holds while it runs.
    pub fn cost(&self) -> ResourceCost {
        ResourceCost {
            kind: self.kind,
            units: self.units,
        }
    }

    /// Whether it is parked.
    pub fn is_parked(&self) -> bool {
        matches!(self.phase, Phase::Parked(_))
    }

    /// Keeps its payload in the ledger while it is parked.
    pub fn keep_payload(&mut self, payload: P) {
        self.park_again(Some(payload));
    }

    /// Parks the task again after a run, with its payload when the ledger keeps it (`None`:
    /// a durable queue holds it).
    pub fn park_again(&mut self, payload: Option<P>) {
        self.phase = Phase::Parked(payload);
    }

    /// Takes its payload, if the ledger keeps it.
    pub fn take_payload(&mut self) -> Option<P> {
        match &mut self.phase {
            Phase::Parked(payload) => payload.take(),
            Phase::Running(_) => None,
        }
    }

    /// Its execution timeout.
    pub fn timeout(&self) -> Option<Duration> {
        (self.timeout_ms != NO_TIMEOUT).then(|| Duration::from_millis(self.timeout_ms))
    }

    /// When it was admitted, ms.
    pub fn admitted_ms(&self) -> u64 {
        admitted_ms(self.entry)
    }

    /// When it started, ms, if it is running.
    pub fn started_ms(&self) -> Option<u64> {
        let run = self.run()?;
        Some(self.admitted_ms().saturating_add(u64::from(run.waited_ms)))
    }

    /// The metadata its executor sees: the caller's, with the mailbox key filled in.
    pub fn meta(&self) -> TaskMetadata {
        TaskMetadata {
            id: self.task_id,
            mailbox: Some(self.key.key().into_owned()),
            priority: self.priority,
            cost: self.cost(),
            deadline_ms: self.has_deadline.then(|| self.deadline_ms.into()),
            created_at_ms: self.created_at_ms.into(),
        }
    }

    /// Its task, rebuilt around its payload, if the ledger holds it.
    pub fn take_task(&mut self) -> Option<ScheduledTask<P>> {
        let payload = self.take_payload()?;
        Some(ScheduledTask {
            meta: self.meta(),
            payload,
        })
    }

    /// Its rare parts, made on first use.
    pub fn rare_mut(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Its rare parts, if it has any.
    pub fn rare(&self) -> Option<&Rare> {
        self.rare.as_deref()
    }

    /// The shared claim it runs under, if any.
    pub fn lease(&self) -> Option<Claim> {
        self.rare()?.lease
    }

    /// Whether the task was claimed from the shared queue (see [`Rare::claimed`]).
    pub fn claimed_from_queue(&self) -> bool {
        self.rare().is_some_and(|rare| rare.claimed)
    }

    /// The shared claim to keep renewed: its lease, unless the queue is still storing it (a
    /// task this node started at once, see [`Rare::recording`]). A renewal
    /// racing that insert would find no claim, and the node would give up its own run; the
    /// insert gives the claim a whole lease.
    pub fn renewable_lease(&self) -> Option<Claim> {
        let rare = self.rare()?;
        rare.lease.filter(|_| !rare.recording)
    }

    /// Which run of the task this is: 1, or its claim's count.
    pub fn attempt(&self) -> u32 {
        self.lease().map_or(1, |claim| claim.attempt)
    }

    /// Which run of the task this is, counting local retries too: its claim's count on a
    /// shared queue, else 1 plus its failed runs.
    pub fn run_number(&self) -> u32 {
        match self.rare() {
            Some(rare) => rare.lease.map_or_else(
                || 1 + u32::try_from(rare.failures.len()).unwrap_or(u32::MAX - 1),
                |claim| claim.attempt,
            ),
            None => 1,
        }
    }

    /// The trace it belongs to, if any.
    pub fn trace(&self) -> Option<&TraceParent> {
        self.rare()?.trace.as_ref()
    }

    /// What it needs beside its cost (core rule 25): none for a task of one kind.
    pub fn also(&self) -> ExtraCosts {
        self.rare().map_or(ExtraCosts::NONE, |rare| rare.also)
    }

    /// Its stream, if it is a streamed task.
    pub fn stream(&self) -> Option<&StreamAttachment> {
        self.rare()?.stream.as_ref()
    }

    /// Takes its submitter's pending answer, if one waits for a store.
    pub fn take_reply(&mut self) -> Option<Reply> {
        self.rare.as_mut()?.reply.take()
    }

    /// Gives back its nested slot, if it holds one: before its outcome is visible, so a
    /// parent that reads it and submits the next child finds the slot free.
    pub fn release_nested_slot(&mut self) {
        if let Some(rare) = &mut self.rare {
            rare.slot = None;
        }
    }

    /// Its run, if it is running.
    pub fn run_mut(&mut self) -> Option<&mut Run> {
        match &mut self.phase {
            Phase::Running(run) => Some(run),
            Phase::Parked(_) => None,
        }
    }

    /// Its run, if it is running.
    pub fn run(&self) -> Option<&Run> {
        match &self.phase {
            Phase::Running(run) => Some(run),
            Phase::Parked(_) => None,
        }
    }
}

/// The live tasks. See the module docs.
pub(crate) struct Ledger<P> {
    slots: Vec<Option<Record<P>>>,
    vacant: Vec<u32>,
    by_entry: HashTable<u32>,
    by_caller: HashTable<u32>,
    by_minted: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    len: usize,
    last_entry: EntryId,
}

impl<P> Default for Ledger<P> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            vacant: Vec::new(),
            by_entry: HashTable::new(),
            by_caller: HashTable::new(),
            by_minted: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            len: 0,
            last_entry: 0,
        }
    }
}

impl<P> Ledger<P> {
    /// A fresh entry id for a task admitted at `now`: above every id given so far.
    pub fn next_entry(&mut self, now: u64) -> EntryId {
        let stamp = now.saturating_mul(1 << ENTRY_TIME_SHIFT);
        self.last_entry = stamp.max(self.last_entry.saturating_add(1));
        self.last_entry
    }

    /// Notes an entry id given before (a stored task), so fresh ids stay above it.
    pub fn note_entry(&mut self, entry: EntryId) {
        self.last_entry = self.last_entry.max(entry);
    }

    /// How many tasks are live.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The entry of the caller's live task `(tenant, id)`, if any.
    pub fn entry_of_caller(&self, tenant: &TenantId, id: TaskId) -> Option<EntryId> {
        let tenant = Tenant::of(tenant);
        let hash = self.hash_caller(tenant, id);
        let slot = self.by_caller.find(hash, |&slot| {
            let record = self.record(slot);
            record.task_id == id && record.key.tenant() == tenant
        })?;
        Some(self.record(*slot).entry)
    }

    /// Notes that the pool made `entry`'s key (see [`Record::minted_key`]), so a retrieve
    /// that holds only that key finds the task ([`entry_of_minted`](Self::entry_of_minted)).
    /// Does nothing for an entry that is not live, or whose key is not one the pool makes.
    pub fn mark_minted(&mut self, entry: EntryId) {
        let Some(slot) = self.slot_of(entry) else {
            return;
        };
        let record = self.record(slot);
        let (Some(bits), false) = (minted_bits(record), record.minted_key) else {
            return;
        };
        let hash = self.hasher.hash_one(bits);
        if let Some(record) = self.slots[slot as usize].as_mut() {
            record.minted_key = true;
        }
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.by_minted.insert_unique(hash, slot, |&slot| {
            hasher.hash_one(minted_bits(occupied(slots, slot)).unwrap_or_default())
        });
    }

    /// The entry of the live task whose pool-made key is exactly `key`, if any.
    pub fn entry_of_minted(&self, key: &MailboxKey) -> Option<EntryId> {
        if key.user_id.is_some() || key.session_id.is_some() {
            return None;
        }
        let bits = MailboxKey::anonymous_bits(&key.tenant)?;
        let hash = self.hasher.hash_one(bits);
        let slot = self
            .by_minted
            .find(hash, |&slot| minted_bits(self.record(slot)) == Some(bits))?;
        Some(self.record(*slot).entry)
    }

    /// Adds a record. The caller checked that neither its entry nor its caller is live.
    pub fn insert(&mut self, record: Record<P>) {
        let entry_hash = self.hasher.hash_one(record.entry);
        let caller_hash = self.hash_caller(record.key.tenant(), record.task_id);
        let slot = match self.vacant.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(record);
                slot
            }
            None => {
                self.slots.push(Some(record));
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 live tasks")
            }
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.by_entry.insert_unique(entry_hash, slot, |&slot| {
            hasher.hash_one(occupied(slots, slot).entry)
        });
        self.by_caller.insert_unique(caller_hash, slot, |&slot| {
            let record = occupied(slots, slot);
            hasher.hash_one((record.key.tenant(), record.task_id))
        });
        self.len += 1;
    }

    /// The record of `entry`, if it is live.
    pub fn get(&self, entry: EntryId) -> Option<&Record<P>> {
        let slot = self.slot_of(entry)?;
        Some(self.record(slot))
    }

    /// The record of `entry`, if it is live.
    pub fn get_mut(&mut self, entry: EntryId) -> Option<&mut Record<P>> {
        let slot = self.slot_of(entry)?;
        self.slots[slot as usize].as_mut()
    }

    /// Removes and returns the record of `entry`, if it is live.
    pub fn remove(&mut self, entry: EntryId) -> Option<Record<P>> {
        let entry_hash = self.hasher.hash_one(entry);
        let slots = &self.slots;
        let found = self
            .by_entry
            .find_entry(entry_hash, |&slot| occupied(slots, slot).entry == entry)
            .ok()?;
        let (slot, _) = found.remove();
        let record = self.slots[slot as usize]
            .take()
            .expect("an indexed slot is occupied");
        let caller_hash = self.hash_caller(record.key.tenant(), record.task_id);
        if let Ok(found) = self
            .by_caller
            .find_entry(caller_hash, |&other| other == slot)
        {
            found.remove();
        }
        if record.minted_key {
            let bits = minted_bits(&record).unwrap_or_default();
            if let Ok(found) = self
                .by_minted
                .find_entry(self.hasher.hash_one(bits), |&other| other == slot)
            {
                found.remove();
            }
        }
        self.vacant.push(slot);
        self.len -= 1;
        if self.len == 0 {
            self.slots.clear();
            self.vacant.clear();
        }
        Some(record)
    }

    /// Every live record, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Record<P>> {
        self.slots.iter().flatten()
    }

    /// Every live entry, in no particular order.
    pub fn entries(&self) -> Vec<EntryId> {
        self.iter().map(|record| record.entry).collect()
    }

    fn slot_of(&self, entry: EntryId) -> Option<u32> {
        let hash = self.hasher.hash_one(entry);
        self.by_entry
            .find(hash, |&slot| self.record(slot).entry == entry)
            .copied()
    }

    fn record(&self, slot: u32) -> &Record<P> {
        occupied(&self.slots, slot)
    }

    fn hash_caller(&self, tenant: Tenant<'_>, id: TaskId) -> u64 {
        self.hasher.hash_one((tenant, id))
    }
}

/// The random bits of `record`'s key when it is a bare anonymous key (the only kind the
/// pool makes), in either of the forms the record keeps it.
fn minted_bits<P>(record: &Record<P>) -> Option<u128> {
    match &record.key {
        TaskKey::Anonymous(words) => Some(TaskKey::bits(*words)),
        TaskKey::Named(key) if key.user_id.is_none() && key.session_id.is_none() => {
            MailboxKey::anonymous_bits(&key.tenant)
        }
        TaskKey::Named(_) => None,
    }
}

fn occupied<P>(slots: &[Option<Record<P>>], slot: u32) -> &Record<P> {
    slots[slot as usize]
        .as_ref()
        .expect("an indexed slot is occupied")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ResourceCost;

    fn record(entry: EntryId, id: TaskId, key: MailboxKey) -> Record<u8> {
        let meta = TaskMetadata::new(id, ResourceCost::cpu(1));
        Record::new(entry, &meta, TaskKey::of(&key), None)
    }

    #[test]
    fn records_are_found_by_entry_and_by_caller_until_removed() {
        let mut ledger = Ledger::default();
        let anonymous = MailboxKey::anonymous();
        ledger.insert(record(1, 7, MailboxKey::new("acme")));
        ledger.insert(record(2, 7, anonymous.clone()));
        ledger.insert(record(3, 8, MailboxKey::new("acme").with_user("ada")));
        assert_eq!(ledger.len(), 3);
        assert_eq!(ledger.entry_of_caller(&TenantId::from("acme"), 7), Some(1));
        assert_eq!(ledger.entry_of_caller(&anonymous.tenant, 7), Some(2));
        assert_eq!(ledger.entry_of_caller(&TenantId::from("acme"), 8), Some(3));
        assert_eq!(ledger.entry_of_caller(&TenantId::from("other"), 7), None);
        assert!(ledger.get(2).expect("live").key.is(&anonymous));
        assert!(matches!(
            ledger.get(2).expect("live").key,
            TaskKey::Anonymous(_)
        ));

        let removed = ledger.remove(1).expect("live");
        assert_eq!(removed.task_id, 7);
        assert!(ledger.get(1).is_none());
        assert_eq!(ledger.entry_of_caller(&TenantId::from("acme"), 7), None);
        ledger.insert(record(4, 7, MailboxKey::new("acme")));
        assert_eq!(ledger.entry_of_caller(&TenantId::from("acme"), 7), Some(4));
        assert_eq!(ledger.slots.len(), 3, "the vacant slot was reused");
        let mut entries = ledger.entries();
        entries.sort_unstable();
        assert_eq!(entries, [2, 3, 4]);
    }

    #[test]
    fn a_minted_key_finds_its_task_until_it_is_removed_and_other_keys_never_do() {
        let mut ledger = Ledger::default();
        let minted = MailboxKey::anonymous();
        let named_alike = MailboxKey::anonymous();
        ledger.insert(record(1, 7, minted.clone()));
        ledger.insert(record(2, 8, named_alike.clone()));
        ledger.insert(record(3, 9, MailboxKey::new("acme")));
        ledger.mark_minted(1);
        ledger.mark_minted(3); // a named key is never one the pool made
        assert_eq!(ledger.entry_of_minted(&minted), Some(1));
        assert_eq!(ledger.entry_of_minted(&named_alike), None, "not marked");
        assert_eq!(ledger.entry_of_minted(&MailboxKey::new("acme")), None);
        assert_eq!(
            ledger.entry_of_minted(&minted.clone().with_user("ada")),
            None
        );
        assert!(!ledger.get(3).expect("live").minted_key);

        // A running task keeps its key in full: it is still found under it.
        ledger.get_mut(1).expect("live").key.expand();
        assert_eq!(ledger.entry_of_minted(&minted), Some(1));
        ledger.remove(1).expect("live");
        assert_eq!(ledger.entry_of_minted(&minted), None);
        ledger.insert(record(4, 7, minted.clone()));
        assert_eq!(
            ledger.entry_of_minted(&minted),
            None,
            "a new record is not marked"
        );
    }

    #[test]
    fn an_anonymous_key_keeps_its_bits_and_gives_back_the_same_key() {
        let key = MailboxKey::anonymous();
        let mut kept = TaskKey::of(&key);
        assert!(matches!(kept, TaskKey::Anonymous(_)));
        assert_eq!(*kept.key(), key);
        assert_eq!(*kept.expand(), key);
        assert!(kept.is(&key));
        assert!(!kept.is(&key.clone().with_user("ada")));
        let narrowed = TaskKey::of(&key.clone().with_session("s"));
        assert!(matches!(narrowed, TaskKey::Named(_)));
        assert!(narrowed.tenant() == Tenant::of(&key.tenant));
        assert!(Tenant::of(&TenantId::from("anonymous-XYZ")) == Tenant::Named("anonymous-XYZ"));
    }

    #[test]
    fn a_record_with_a_16_byte_payload_packs_into_128_bytes() {
        assert_eq!(std::mem::size_of::<Option<Record<u128>>>(), 128);
        let meta = TaskMetadata {
            deadline_ms: Some(u128::MAX - 1),
            created_at_ms: (1 << 70) + 5,
            ..TaskMetadata::new(3, ResourceCost::gpu_vram(9))
        };
        let record = Record::<u8>::new(1, &meta, TaskKey::of(&MailboxKey::new("acme")), None);
        let again = record.meta();
        assert_eq!(
            (again.deadline_ms, again.created_at_ms),
            (meta.deadline_ms, meta.created_at_ms)
        );
        assert_eq!(again.cost, meta.cost);
    }

    #[test]
    fn entry_ids_grow_with_time_and_within_a_millisecond() {
        let mut ledger = Ledger::<u8>::default();
        let first = ledger.next_entry(5);
        let second = ledger.next_entry(5);
        assert_eq!((admitted_ms(first), sequence_of(first)), (5, 0));
        assert_eq!((admitted_ms(second), sequence_of(second)), (5, 1));
        let later = ledger.next_entry(9) + 10;
        ledger.note_entry(later);
        assert!(ledger.next_entry(9) > (9 << ENTRY_TIME_SHIFT) + 10);
        assert_eq!(
            ledger.next_entry(3) >> ENTRY_TIME_SHIFT,
            9,
            "never goes back"
        );
    }
}
