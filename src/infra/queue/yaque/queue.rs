//! The embedded durable queue: parked (and, with `"durability": "accepted"`, running) tasks in
//! files on this machine, so a crash, a `kill -9` or a closed laptop lid loses no queued work.
//!
//! # Design
//!
//! The scheduler's core ranks parked tasks and tells the queue which entry to hand over, in
//! any order (skip-ahead); a FIFO cannot do that by itself. So the queue is a **log**: every
//! change is one record appended to a [`yaque`] queue (its [`Sender`](yaque::Sender) writes
//! the segment files `0.q`, `1.q`, ... in `PATH/STREAM/`, each append one `write` that a
//! killed process cannot tear in half), and an in-memory index, rebuilt from the log at
//! start, answers every call:
//!
//! | record | written by | meaning |
//! | --- | --- | --- |
//! | `park` (entry, task as JSON) | [`park`](TaskQueue::park) | the entry is parked with this task |
//! | `park_at` (entry, instant, task as JSON) | [`park_carrying`](TaskQueue::park_carrying) | the same, not to start before the instant (a scheduled start, returned by `load_parked`) |
//! | `park_carried` (entry, flags, instant if any, trace, task as JSON) | [`park_carrying`](TaskQueue::park_carrying) | the same, in a trace (returned by `load_parked`: a resumed task goes on in it) |
//! | `claim` (entry) | [`claim`](TaskQueue::claim) | the entry is running |
//! | `gone` (entry) | [`settle`](TaskQueue::settle), [`remove`](TaskQueue::remove) | the entry is finished or cancelled |
//!
//! Replaying the records in order (the last record of an entry wins) gives the queue's state.
//! Each record carries a magic tag and a 64-bit checksum, so a torn or damaged record is told
//! from a good one.
//!
//! **Priorities and order.** Entry ids increase in admission order and each `park` record
//! keeps the task's metadata, so [`load_parked`](TaskQueue::load_parked) hands the core every
//! parked task with its priority and rank; the core puts them back in priority order, first
//! admitted first within a priority, and the pool picks up where it stopped.
//!
//! **Compaction.** The log would grow for ever, so it is rewritten: at every start, and
//! whenever what was appended since the last rewrite exceeds four times the live tasks' size
//! (and 8 MiB), the queue moves to a fresh segment, writes one `park` (and `claim`) record per
//! live entry there, and deletes every older segment, oldest first. A crash at any point of
//! this leaves a log whose replay gives the same state: the old segments are deleted only
//! once the snapshot is written, and always as a prefix.
//!
//! **A full disk.** A rewrite needs room for a copy of the live tasks next to the old log, so
//! it runs only when the disk has that room (plus 64 KiB); otherwise the queue goes on
//! appending to the log as it is and rewrites it later, at a start or a threshold with room.
//! So a queue whose disk filled up starts again once 64 KiB are free; with less, the start
//! fails with an error saying so. A write that fails is cut off the segment again: yaque's
//! writer keeps the bytes it could not write and writes them when it is dropped, or writes
//! part of them, and without the cut a task refused for lack of space would come back after
//! a restart. (Should the cut fail too, the entry's true state is written again before the
//! next record.)
//!
//! **Start.** The stream belongs to whoever holds an OS lock (`flock`) on
//! `STREAM/owner.lock`: a lock that dies with its process, so an owner that was killed, even
//! one left a zombie, or a pid from before a reboot, never keeps the queue closed. A live owner's lock is
//! respected: the queue refuses to open, naming the owner (one process per stream). yaque's
//! own lock files found by the new owner are left-overs and are removed. Every segment is
//! read with a checking reader of this module rather than yaque's `Receiver`, which panics on
//! a damaged header and waits for ever on a truncated tail. Entries that were claimed when
//! the process died are parked again (their runs were lost: at-least-once). Two live entries
//! of one caller's task id (tenant and id) are kept once, the first admitted (de-duplication
//! by task id).
//!
//! **Damage.** A truncated or corrupt record is **quarantined**: its bytes are copied to
//! `PATH/STREAM.quarantine/SEGMENT.q@OFFSET.bad`, a `tracing` warning names the segment file
//! and the byte offset, the reader resynchronises on the next good record, and the pool
//! starts with every good record. [`YaqueQueue::quarantined`] lists what was set aside.
//!
//! **What reaches the disk.** An append returns once its bytes are written to the file (the
//! kernel holds them): a crashed or killed process loses nothing it was told is stored. The
//! queue does not `fsync`, so a power cut can lose the last writes the OS had not flushed.
//!
//! What a crash costs in each durability mode (the pool's `durability` setting, see
//! [`Durability`](crate::core::Durability)) is described in `PARKING_LOT.md`.
//!
//! Each call does its file I/O (a `write` of a few hundred bytes) on the queue actor's task;
//! the scheduler never waits for it.

use super::record::{CLAIM, ENDED};
use super::store::{ended_body, io_fault, Kept, MetaOnly, Quarantined, Store};

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind};

use std::marker::PhantomData;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::core::{
    Carried, EntryId, HeldBy, QueueCounts, QueueError, ScheduledTask, Settlement, StoredEntry,
    StoredHold, StoredParent, TaskQueue, TaskStatus,
};

/// Parked and claimed tasks in files; see the module docs.
///
/// ```
/// use prometheus_parking_lot::core::TaskQueue;
/// use prometheus_parking_lot::infra::queue::yaque::YaqueQueue;
///
/// let dir = std::env::temp_dir().join(format!("pl-doc-yaque-{}", std::process::id()));
/// let queue: YaqueQueue<String> = YaqueQueue::open(&dir, "chat")?;
/// assert_eq!(queue.backend(), "yaque");
/// assert!(queue.is_durable());
/// drop(queue);
/// std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct YaqueQueue<P> {
    store: Mutex<Store>,
    quarantined: Vec<Quarantined>,
    payload: PhantomData<fn() -> P>,
}

impl<P> YaqueQueue<P> {
    /// Opens (or creates) the queue of `stream` in the directory `path`: its files are in
    /// `path/stream/`, damaged records are copied to `path/stream.quarantine/`.
    ///
    /// Fails if another live process has the stream open, or the directory cannot be used.
    pub fn open(path: impl AsRef<Path>, stream: &str) -> Result<Self, QueueError> {
        let valid = !stream.is_empty()
            && stream.len() <= 64
            && stream
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(QueueError::Backend(BackendFault::plain(
                FaultKind::Refused,
                format!(
                    "yaque stream {stream:?} is not allowed; stream names are 1 to 64 of the \
                 characters a-z A-Z 0-9 _ -"
                ),
            )));
        }
        let dir = path.as_ref().join(stream);
        let quarantine = path.as_ref().join(format!("{stream}.quarantine"));
        let (store, quarantined) = Store::open(dir, &quarantine).map_err(|error| {
            let text = format!(
                "could not open the yaque stream {stream} in {}: {error}",
                path.as_ref().display()
            );
            QueueError::Backend(io_fault(text, error))
        })?;
        Ok(Self {
            store: Mutex::new(store),
            quarantined,
            payload: PhantomData,
        })
    }

    /// The damaged records set aside when this queue was opened (empty for healthy files).
    pub fn quarantined(&self) -> &[Quarantined] {
        &self.quarantined
    }

    /// Every update leaves the index consistent before it could panic, so a poisoned lock is
    /// taken over as it is.
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<P: Serialize> YaqueQueue<P> {
    /// Appends `task`'s park (with what it carries: the instant before which it must not
    /// start, its trace; and the parents it is held for) and indexes it.
    fn store_park(
        &self,
        entry: EntryId,
        task: &ScheduledTask<P>,
        carried: Carried,
        held: Option<Box<HeldBy>>,
    ) -> Result<(), QueueError> {
        let bytes = serde_json::to_vec(task).map_err(|error| {
            QueueError::Backend(BackendFault::plain(
                FaultKind::Refused,
                format!("entry {entry}: the task does not serialise: {error}"),
            ))
        })?;
        let kept = Kept {
            task: bytes,
            claimed: false,
            carried,
            held,
        };
        let mut store = self.lock();
        if store.entries.contains_key(&entry) {
            return Err(QueueError::Duplicate(entry));
        }
        {
            let (kind, body) = kept.park_body();
            store.append(kind, entry, &body)?;
        }
        store.live_bytes += kept.park_len();
        if let Some(held) = &kept.held {
            store.hold(held);
        }
        store.entries.insert(entry, kept);
        store.maybe_compact();
        Ok(())
    }
}

impl<P: DeserializeOwned> YaqueQueue<P> {
    fn decode(&self, entry: EntryId, bytes: &[u8]) -> Result<ScheduledTask<P>, QueueError> {
        serde_json::from_slice(bytes).map_err(|error| {
            QueueError::Backend(BackendFault::plain(
                FaultKind::Corrupt,
                format!("entry {entry}: its stored task does not decode: {error}"),
            ))
        })
    }

    /// The task of `entry` if it is parked (not claimed); a task this build cannot decode is
    /// moved to the quarantine and its error returned.
    fn parked_task(
        &self,
        store: &mut Store,
        entry: EntryId,
    ) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let Some(kept) = store.entries.get(&entry).filter(|kept| !kept.claimed) else {
            return Ok(None);
        };
        match self.decode(entry, &kept.task) {
            Ok(task) => Ok(Some(task)),
            Err(error) => {
                store.set_aside(entry)?;
                Err(error)
            }
        }
    }
}

#[async_trait]
impl<P> TaskQueue<P> for YaqueQueue<P>
where
    P: Serialize + DeserializeOwned + Send + 'static,
{
    fn backend(&self) -> &'static str {
        "yaque"
    }

    fn is_durable(&self) -> bool {
        true
    }

    async fn park(&self, entry: EntryId, task: ScheduledTask<P>) -> Result<(), QueueError> {
        self.store_park(entry, &task, Carried::default(), None)
    }

    /// Stored as a `park` record with what it carries before the task (see `record.rs`),
    /// which [`load_parked`](TaskQueue::load_parked) returns after a restart.
    async fn park_carrying(
        &self,
        entry: EntryId,
        task: ScheduledTask<P>,
        carried: Carried,
    ) -> Result<(), QueueError> {
        self.store_park(entry, &task, carried, None)
    }

    fn keeps_dependencies(&self) -> bool {
        true
    }

    fn keeps_several_kinds(&self) -> bool {
        true
    }

    /// Stored as a `PARK_HELD` record: the parents (entry and task id each) and whether it
    /// runs anyway, then what it carries and the task (see `record.rs`).
    async fn park_held(
        &self,
        entry: EntryId,
        task: ScheduledTask<P>,
        carried: Carried,
        held: &HeldBy,
    ) -> Result<(), QueueError> {
        self.store_park(entry, &task, carried, Some(Box::new(held.clone())))
    }

    /// Appends an `ENDED` record for a parent that stored held tasks name and that the log
    /// does not hold as ended so: a task that was never stored here, or a removal whose
    /// status this refines.
    async fn parent_ended(&self, entry: EntryId, status: &TaskStatus) -> Result<(), QueueError> {
        let mut store = self.lock();
        let known = store.ended.get(&entry) == Some(status);
        if known || !store.named.contains_key(&entry) || store.entries.contains_key(&entry) {
            return Ok(());
        }
        store.append(ENDED, entry, &ended_body(status))?;
        store.ended.insert(entry, status.clone());
        store.maybe_compact();
        Ok(())
    }

    async fn claim(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let mut store = self.lock();
        let Some(task) = self.parked_task(&mut store, entry)? else {
            return Ok(None);
        };
        store.append(CLAIM, entry, &[])?;
        if let Some(kept) = store.entries.get_mut(&entry) {
            kept.claimed = true;
        }
        store.claimed += 1;
        store.maybe_compact();
        Ok(Some(task))
    }

    /// A parent that stored held tasks name ends with an `ENDED` record, which keeps how
    /// it ended for them; any other entry with a `GONE`.
    async fn settle(&self, entry: EntryId, settlement: Settlement) -> Result<(), QueueError> {
        let mut store = self.lock();
        if !store.entries.get(&entry).is_some_and(|kept| kept.claimed) {
            return Err(QueueError::NotClaimed(entry));
        }
        let status = match settlement {
            Settlement::Done => TaskStatus::Completed,
            Settlement::Failed(reason) => TaskStatus::Failed(reason),
            Settlement::Ended(status) => status,
        };
        let (kind, body) = store.end_record(entry, status);
        if let Err(error) = store.append(kind, entry, &body) {
            store.ended.remove(&entry);
            return Err(error);
        }
        store.forget(entry);
        store.maybe_compact();
        Ok(())
    }

    /// Appends the entry's task again as a park: the log then holds it parked, for this
    /// process and for a restart (old and new binaries read a park the same way).
    async fn release(&self, entry: EntryId) -> Result<(), QueueError> {
        let mut store = self.lock();
        let (kind, body) = match store.entries.get(&entry) {
            Some(kept) if kept.claimed => {
                let (kind, body) = kept.park_body();
                (kind, body.into_owned())
            }
            _ => return Err(QueueError::NotClaimed(entry)),
        };
        store.append(kind, entry, &body)?;
        if let Some(kept) = store.entries.get_mut(&entry) {
            kept.claimed = false;
        }
        store.claimed -= 1;
        store.maybe_compact();
        Ok(())
    }

    fn releases_claims(&self) -> bool {
        true
    }

    async fn remove(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let mut store = self.lock();
        let Some(task) = self.parked_task(&mut store, entry)? else {
            return Ok(None);
        };
        // A removed task did not run: cancelled, as far as the queue knows (the scheduler's
        // `parent_ended` says if it expired, or was shed, instead).
        let (kind, body) = store.end_record(entry, TaskStatus::Cancelled);
        if let Err(error) = store.append(kind, entry, &body) {
            store.ended.remove(&entry);
            return Err(error);
        }
        store.forget(entry);
        store.maybe_compact();
        Ok(Some(task))
    }

    /// The parked entries, in entry order. Entries a dead process had claimed were parked
    /// again when the queue was opened.
    async fn load_parked(&self) -> Result<Vec<StoredEntry>, QueueError> {
        let store = self.lock();
        store
            .entries
            .iter()
            .filter(|(_, kept)| !kept.claimed)
            .map(|(&entry, kept)| {
                let MetaOnly { meta } = serde_json::from_slice(&kept.task).map_err(|error| {
                    QueueError::Backend(BackendFault::plain(
                        FaultKind::Corrupt,
                        format!("entry {entry}: its metadata does not decode: {error}"),
                    ))
                })?;
                let held = kept.held.as_deref().map(|held| StoredHold {
                    parents: held
                        .parents
                        .iter()
                        .map(|&(parent, task_id)| StoredParent {
                            entry: parent,
                            task_id,
                            ended: store.ended.get(&parent).cloned(),
                        })
                        .collect(),
                    run_anyway: held.run_anyway,
                });
                Ok(StoredEntry {
                    entry,
                    meta,
                    carried: kept.carried,
                    held,
                })
            })
            .collect()
    }

    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        let store = self.lock();
        Ok(QueueCounts {
            parked: store.entries.len() - store.claimed,
            claimed: store.claimed,
        })
    }
}
