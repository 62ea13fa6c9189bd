//! The embedded durable queue: parked (and, with `"durability": "accepted"`, running) tasks in
//! files on this machine, so a crash, a `kill -9` or a closed laptop lid loses no queued work.
//!
//! # Design
//!
//! The scheduler's core ranks parked tasks and tells the queue which entry to hand over, in
//! any order (skip-ahead); a FIFO cannot do that by itself. So the queue is a **log**: every
//! change is one record appended to a [`yaque`] queue (its [`Sender`] writes
//! the segment files `0.q`, `1.q`, ... in `PATH/STREAM/`, each append one `write` that a
//! killed process cannot tear in half), and an in-memory index, rebuilt from the log at
//! start, answers every call:
//!
//! | record | written by | meaning |
//! | --- | --- | --- |
//! | `park` (entry, task as JSON) | [`park`](TaskQueue::park) | the entry is parked with this task |
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

use super::os;

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use yaque::{Sender, SenderBuilder};

use crate::core::{
    EntryId, QueueCounts, QueueError, ScheduledTask, Settlement, StoredEntry, TaskMetadata,
    TaskQueue,
};

/// Every record starts with this tag.
const MAGIC: [u8; 4] = *b"PLq1";
/// Tag, kind, entry id, checksum.
const RECORD_OVERHEAD: usize = 4 + 1 + 8 + 8;
/// yaque's frame header: 26 bits of length and 6 parity bits.
const FRAME_HEADER: usize = 4;
/// The largest frame yaque writes (its header holds 26 bits of length).
const MAX_FRAME: usize = (1 << 26) - 1;
/// yaque's end-of-segment marker.
const SEGMENT_END: [u8; 4] = [0xFF; 4];
/// The log is rewritten once this much (and four times the live tasks' size) was appended.
const COMPACT_FLOOR: u64 = 8 * 1024 * 1024;
/// Free space a start needs besides the log it keeps, with slack: the lock files and the
/// first block of a fresh segment. A rewrite needs this beyond the copy of the live tasks.
const START_ROOM: u64 = 64 * 1024;

const PARK: u8 = 1;
const CLAIM: u8 = 2;
const GONE: u8 = 3;

/// A truncated or corrupt stretch of a segment file, set aside at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// The segment file it was found in (the stream's directory, for a whole record whose
    /// task's metadata does not decode).
    pub file: PathBuf,
    /// Its byte offset in that file (0 for a task that does not decode).
    pub offset: u64,
    /// How many bytes were set aside.
    pub len: u64,
    /// Where its bytes were copied.
    pub saved_as: PathBuf,
}

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

/// The log's writer and the index it rebuilds.
struct Store {
    dir: PathBuf,
    /// Where damaged records and undecodable tasks are set aside.
    quarantine: PathBuf,
    /// The stream's ownership, held while the queue is open.
    _owner: os::OwnerLock,
    /// `None` after a failed write or rewrite: the next record opens a new writer.
    sender: Option<Sender>,
    /// The segment the writer appends to (it never moves to another by itself).
    segment: PathBuf,
    /// The bytes of `segment` that hold whole records: where a failed write is cut back to.
    segment_len: u64,
    /// Live entries, in entry order.
    entries: BTreeMap<EntryId, Kept>,
    claimed: usize,
    /// Size of the live entries' `park` records.
    live_bytes: u64,
    /// Bytes appended since the last rewrite.
    appended: u64,
    /// Entries whose state in the log may differ from the index: the start dropped them (a
    /// duplicate task id, an undecodable task), or a failed write of theirs could not be cut
    /// back. Their state is written again before the next record.
    uncertain: BTreeSet<EntryId>,
}

/// A live entry: its task as stored, and whether it is running.
struct Kept {
    task: Vec<u8>,
    claimed: bool,
}

/// The part of a stored task read at start.
#[derive(Deserialize)]
struct MetaOnly {
    meta: TaskMetadata,
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
        let bytes = serde_json::to_vec(&task).map_err(|error| {
            QueueError::Backend(BackendFault::plain(
                FaultKind::Refused,
                format!("entry {entry}: the task does not serialise: {error}"),
            ))
        })?;
        let mut store = self.lock();
        if store.entries.contains_key(&entry) {
            return Err(QueueError::Duplicate(entry));
        }
        store.append(PARK, entry, &bytes)?;
        store.live_bytes += record_len(bytes.len());
        store.entries.insert(
            entry,
            Kept {
                task: bytes,
                claimed: false,
            },
        );
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

    async fn settle(&self, entry: EntryId, _settlement: Settlement) -> Result<(), QueueError> {
        let mut store = self.lock();
        if !store.entries.get(&entry).is_some_and(|kept| kept.claimed) {
            return Err(QueueError::NotClaimed(entry));
        }
        store.append(GONE, entry, &[])?;
        store.forget(entry);
        store.maybe_compact();
        Ok(())
    }

    /// Appends the entry's task again as a park: the log then holds it parked, for this
    /// process and for a restart (old and new binaries read a park the same way).
    async fn release(&self, entry: EntryId) -> Result<(), QueueError> {
        let mut store = self.lock();
        let task = match store.entries.get(&entry) {
            Some(kept) if kept.claimed => kept.task.clone(),
            _ => return Err(QueueError::NotClaimed(entry)),
        };
        store.append(PARK, entry, &task)?;
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
        store.append(GONE, entry, &[])?;
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
                Ok(StoredEntry { entry, meta })
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

impl Store {
    /// Takes the stream, replays the log (quarantining damage), parks left-over claims
    /// again, drops duplicate task ids, and rewrites the log into a fresh segment when the
    /// disk has room for it (else opens a writer on the log as it is).
    fn open(dir: PathBuf, quarantine: &Path) -> io::Result<(Self, Vec<Quarantined>)> {
        Self::start(dir.clone(), quarantine).map_err(|error| explain_full_disk(&dir, error))
    }

    fn start(dir: PathBuf, quarantine: &Path) -> io::Result<(Self, Vec<Quarantined>)> {
        fs::create_dir_all(&dir)?;
        let owner = os::OwnerLock::take(&dir)?;
        os::clear_yaque_locks(&dir)?;
        let mut replay = Replay::default();
        let mut quarantined = Vec::new();
        let mut log_bytes = 0;
        for (_, file) in &segments(&dir, quarantine, &mut quarantined)? {
            let bytes = fs::read(file)?;
            log_bytes += bytes.len() as u64;
            replay.segment(file, &bytes, quarantine, &mut quarantined)?;
        }
        let (entries, dropped) = replay.finish(&dir, quarantine, &mut quarantined)?;
        let live_bytes = entries
            .values()
            .map(|kept| record_len(kept.task.len()))
            .sum();
        let mut store = Store {
            dir,
            quarantine: quarantine.to_path_buf(),
            _owner: owner,
            sender: None,
            segment: PathBuf::new(),
            segment_len: 0,
            entries,
            claimed: 0,
            live_bytes,
            appended: log_bytes.saturating_sub(live_bytes),
            uncertain: dropped.into_iter().collect(),
        };
        match store.compact() {
            Ok(true) => {}
            Ok(false) => {
                store.writer()?;
            }
            Err(error) => {
                // A failed rewrite leaves the old log whole.
                tracing::warn!(dir = %store.dir.display(), %error, "could not rewrite the queue's log at start; it is kept as it is");
                store.writer()?;
            }
        }
        Ok((store, quarantined))
    }

    /// Appends one record (after restating uncertain entries). On failure nothing changes in
    /// the index, and nothing of the record stays in the log.
    fn append(&mut self, kind: u8, entry: EntryId, body: &[u8]) -> Result<(), QueueError> {
        let record = encode(kind, entry, body);
        if record.len() > MAX_FRAME {
            return Err(QueueError::Backend(BackendFault::plain(
                FaultKind::Refused,
                format!(
                "entry {entry}: the task takes {} bytes stored; the yaque queue holds at most {} \
                 bytes a task",
                body.len(),
                MAX_FRAME - RECORD_OVERHEAD
            ),
            )));
        }
        let written = self
            .restate()
            .and_then(|()| self.write(&[record], &[entry]));
        written.map_err(|error| {
            QueueError::Backend(io_fault(
                format!("writing to {}: {error}", self.dir.display()),
                error,
            ))
        })
    }

    /// Appends `records` (of `entries`) with one write. A failed write is cut off the
    /// segment: yaque's writer keeps the bytes it could not write and writes them when it is
    /// dropped, or writes part of them, so without the cut a record reported as not stored
    /// could be found after a restart. If the cut fails, the entries' state is written again
    /// before the next record instead.
    fn write(&mut self, records: &[Vec<u8>], entries: &[EntryId]) -> io::Result<()> {
        let written = self
            .writer()?
            .try_send_batch(records.iter())
            .map_err(|error| io::Error::other(error.to_string()));
        if let Err(error) = written {
            // The writer goes first: dropping it is what may write the failed bytes.
            self.sender = None;
            let cut = fs::OpenOptions::new()
                .write(true)
                .open(&self.segment)
                .and_then(|file| file.set_len(self.segment_len));
            if let Err(cut_error) = cut {
                tracing::warn!(segment = %self.segment.display(), error = %cut_error, "could not cut a failed write off the queue's log; its entries are written again before the next record");
                self.uncertain.extend(entries);
            }
            return Err(error);
        }
        let bytes = records
            .iter()
            .map(|record| (FRAME_HEADER + record.len()) as u64)
            .sum::<u64>();
        self.segment_len += bytes;
        self.appended += bytes;
        Ok(())
    }

    /// Writes the index's state of every uncertain entry again (`park`, and `claim` if it
    /// runs, or `gone`), so that whatever a failed write left in the log is overridden.
    fn restate(&mut self) -> io::Result<()> {
        if self.uncertain.is_empty() {
            return Ok(());
        }
        let mut records = Vec::new();
        for entry in &self.uncertain {
            match self.entries.get(entry) {
                Some(kept) => {
                    records.push(encode(PARK, *entry, &kept.task));
                    if kept.claimed {
                        records.push(encode(CLAIM, *entry, &[]));
                    }
                }
                None => records.push(encode(GONE, *entry, &[])),
            }
        }
        let entries: Vec<EntryId> = self.uncertain.iter().copied().collect();
        self.write(&records, &entries)?;
        self.uncertain.clear();
        Ok(())
    }

    /// The log's writer; after a failed write or rewrite, a new one on a fresh segment.
    fn writer(&mut self) -> io::Result<&mut Sender> {
        let sender = match self.sender.take() {
            Some(sender) => sender,
            None => self.new_writer()?,
        };
        Ok(self.sender.insert(sender))
    }

    /// A writer appending to a fresh segment after every existing one. Called with no writer
    /// open, so yaque's lock files, if any, are left-overs of a failed open.
    fn new_writer(&mut self) -> io::Result<Sender> {
        os::clear_yaque_locks(&self.dir)?;
        let next = segments(&self.dir, Path::new(""), &mut Vec::new())?
            .last()
            .map_or(0, |&(number, _)| number + 1);
        let segment = self.dir.join(format!("{next}.q"));
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&segment)?;
        let dir = &self.dir;
        // yaque appends to the highest segment; with no size limit it stays on this one,
        // whose length is then known (rewrites keep the log small).
        let sender = catch_unwind(AssertUnwindSafe(|| {
            SenderBuilder::new().segment_size(u64::MAX).open(dir)
        }))
        .map_err(|_| {
            io::Error::other(format!(
                "yaque could not read the queue's version file in {}",
                dir.display()
            ))
        })??;
        self.segment = segment;
        self.segment_len = 0;
        Ok(sender)
    }

    /// Moves a task this build cannot decode out of the queue, into the quarantine.
    fn set_aside(&mut self, entry: EntryId) -> Result<(), QueueError> {
        let Some(kept) = self.entries.get(&entry) else {
            return Ok(());
        };
        let saved_as = self.quarantine.join(format!("entry-{entry}.json"));
        fs::create_dir_all(&self.quarantine)
            .and_then(|()| fs::write(&saved_as, &kept.task))
            .map_err(|error| {
                QueueError::Backend(io_fault(
                    format!("could not quarantine entry {entry}: {error}"),
                    error,
                ))
            })?;
        tracing::error!(entry, saved_as = %saved_as.display(), "a stored task does not decode; it was set aside");
        self.append(GONE, entry, &[])?;
        self.forget(entry);
        Ok(())
    }

    fn forget(&mut self, entry: EntryId) {
        if let Some(kept) = self.entries.remove(&entry) {
            self.live_bytes -= record_len(kept.task.len());
            if kept.claimed {
                self.claimed -= 1;
            }
        }
    }

    /// Rewrites the log when the appended records dwarf the live ones.
    fn maybe_compact(&mut self) {
        if self.appended <= COMPACT_FLOOR.max(self.live_bytes.saturating_mul(4)) {
            return;
        }
        let compacted = self.compact().unwrap_or_else(|error| {
            tracing::error!(dir = %self.dir.display(), %error, "yaque queue compaction failed; the log keeps growing until the next rewrite");
            false
        });
        if !compacted {
            // Tried again once as much more was appended, not at every record.
            self.appended = 0;
        }
    }

    /// Rewrites the log if the disk has room for a copy of the live entries: moves the
    /// writer to a fresh segment, writes every live entry there, then deletes the older
    /// segments, oldest first. `Ok(false)`: no room, the log is left as it is.
    fn compact(&mut self) -> io::Result<bool> {
        let claims = self.entries.values().filter(|kept| kept.claimed).count() as u64;
        let snapshot = self.live_bytes + claims * record_len(0);
        let needed = snapshot + START_ROOM;
        if let Some(free) = os::free_bytes(&self.dir).filter(|&free| free < needed) {
            tracing::warn!(dir = %self.dir.display(), free, needed, "too little free space to rewrite the queue's log; it is kept as it is, and rewritten once there is room");
            return Ok(false);
        }
        let older = segments(&self.dir, Path::new(""), &mut Vec::new())?;
        self.sender = None;
        let mut records = Vec::with_capacity(self.entries.len());
        for (&entry, kept) in &self.entries {
            records.push(encode(PARK, entry, &kept.task));
            if kept.claimed {
                records.push(encode(CLAIM, entry, &[]));
            }
        }
        self.writer()?;
        for chunk in records.chunks(1024) {
            if let Err(error) = self.write(chunk, &[]) {
                // Half a snapshot only repeats live entries; it goes, the old log stays.
                let _ = fs::remove_file(&self.segment);
                return Err(error);
            }
        }
        self.appended = 0;
        for (number, file) in &older {
            if let Err(error) = fs::remove_file(file) {
                tracing::warn!(segment = number, file = %file.display(), %error, "could not delete a compacted segment");
                return Ok(true);
            }
        }
        // Whatever a failed write left behind was in the deleted segments.
        self.uncertain.clear();
        Ok(true)
    }
}

/// Adds to a full disk's error what the queue needs to start.
fn explain_full_disk(dir: &Path, error: io::Error) -> io::Error {
    if error.kind() != io::ErrorKind::StorageFull {
        return error;
    }
    let free = os::free_bytes(dir).map_or_else(String::new, |free| format!(", {free} bytes free"));
    io::Error::new(
        io::ErrorKind::StorageFull,
        format!(
            "{error} (the disk holding {}{free}): the queue needs about {} KiB free to start; \
             it keeps its log as it is and rewrites it once the disk has room for a copy of \
             its live tasks",
            dir.display(),
            START_ROOM / 1024
        ),
    )
}

/// The segment files of `dir` in order. A `.q` file whose name is no number (which yaque
/// cannot handle) is moved to the quarantine.
fn segments(
    dir: &Path,
    quarantine: &Path,
    quarantined: &mut Vec<Quarantined>,
) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut segments = Vec::new();
    for item in fs::read_dir(dir)? {
        let path = item?.path();
        if path.extension().is_none_or(|ext| ext != "q") {
            continue;
        }
        match path
            .file_stem()
            .and_then(|stem| stem.to_str()?.parse::<u64>().ok())
        {
            Some(number) => segments.push((number, path)),
            None if !quarantine.as_os_str().is_empty() => {
                let len = fs::metadata(&path)?.len();
                let saved_as = quarantine_path(quarantine, &path, 0)?;
                fs::rename(&path, &saved_as)?;
                tracing::warn!(file = %path.display(), offset = 0, bytes = len, saved_as = %saved_as.display(), "a queue file that is no segment was quarantined");
                quarantined.push(Quarantined {
                    file: path,
                    offset: 0,
                    len,
                    saved_as,
                });
            }
            None => {}
        }
    }
    segments.sort_unstable();
    Ok(segments)
}

fn quarantine_path(quarantine: &Path, file: &Path, offset: u64) -> io::Result<PathBuf> {
    fs::create_dir_all(quarantine)?;
    let name = file
        .file_name()
        .map_or_else(|| "segment".into(), |name| name.to_string_lossy());
    Ok(quarantine.join(format!("{name}@{offset}.bad")))
}

/// The state the log's records describe, as they are replayed.
#[derive(Default)]
struct Replay {
    entries: BTreeMap<EntryId, Kept>,
}

impl Replay {
    /// Replays one segment's frames, quarantining every damaged stretch.
    fn segment(
        &mut self,
        file: &Path,
        bytes: &[u8],
        quarantine: &Path,
        quarantined: &mut Vec<Quarantined>,
    ) -> io::Result<()> {
        let mut at = 0;
        while at < bytes.len() {
            if bytes[at..].starts_with(&SEGMENT_END) && at + FRAME_HEADER == bytes.len() {
                break;
            }
            if let Some((kind, entry, body, next)) = frame_at(bytes, at) {
                self.apply(kind, entry, body);
                at = next;
                continue;
            }
            let resume = (at + 1..bytes.len())
                .find(|&start| frame_at(bytes, start).is_some())
                .unwrap_or(bytes.len());
            let saved_as = quarantine_path(quarantine, file, at as u64)?;
            fs::write(&saved_as, &bytes[at..resume])?;
            tracing::warn!(
                file = %file.display(),
                offset = at,
                bytes = resume - at,
                saved_as = %saved_as.display(),
                "a truncated or corrupt queue record was quarantined; the other records are kept"
            );
            quarantined.push(Quarantined {
                file: file.to_path_buf(),
                offset: at as u64,
                len: (resume - at) as u64,
                saved_as,
            });
            at = resume;
        }
        Ok(())
    }

    fn apply(&mut self, kind: u8, entry: EntryId, body: &[u8]) {
        match kind {
            PARK => {
                self.entries.insert(
                    entry,
                    Kept {
                        task: body.to_vec(),
                        claimed: false,
                    },
                );
            }
            CLAIM => {
                if let Some(kept) = self.entries.get_mut(&entry) {
                    kept.claimed = true;
                }
            }
            _ => {
                self.entries.remove(&entry);
            }
        }
    }

    /// The live entries (left-over claims parked again, one entry per caller's task id), and
    /// the entries dropped: duplicates, and those whose metadata does not decode (quarantined).
    fn finish(
        self,
        dir: &Path,
        quarantine: &Path,
        quarantined: &mut Vec<Quarantined>,
    ) -> io::Result<(BTreeMap<EntryId, Kept>, Vec<EntryId>)> {
        let mut entries = self.entries;
        let mut seen: HashMap<(String, u64), EntryId> = HashMap::new();
        let mut dropped = Vec::new();
        let mut rerun = 0;
        for (&entry, kept) in entries.iter_mut() {
            if kept.claimed {
                kept.claimed = false;
                rerun += 1;
            }
            let meta = match serde_json::from_slice::<MetaOnly>(&kept.task) {
                Ok(MetaOnly { meta }) => meta,
                Err(error) => {
                    fs::create_dir_all(quarantine)?;
                    let saved_as = quarantine.join(format!("entry-{entry}.json"));
                    fs::write(&saved_as, &kept.task)?;
                    tracing::warn!(entry, %error, saved_as = %saved_as.display(), "a stored task's metadata does not decode; it was quarantined");
                    quarantined.push(Quarantined {
                        file: dir.to_path_buf(),
                        offset: 0,
                        len: kept.task.len() as u64,
                        saved_as,
                    });
                    dropped.push(entry);
                    continue;
                }
            };
            if let Some(caller) = meta.mailbox.map(|key| (key.tenant.to_string(), meta.id)) {
                if let Some(first) = seen.get(&caller) {
                    tracing::warn!(
                        entry,
                        first,
                        task_id = caller.1,
                        "a task id stored twice for one tenant is kept once"
                    );
                    dropped.push(entry);
                } else {
                    seen.insert(caller, entry);
                }
            }
        }
        for entry in &dropped {
            entries.remove(entry);
        }
        if rerun > 0 {
            tracing::warn!(tasks = rerun, "tasks that were running when the process stopped are parked again and will run again");
        }
        Ok((entries, dropped))
    }
}

/// The frame starting at `at`, if it is whole and its record checks: (kind, entry, body,
/// where the next frame starts).
fn frame_at(bytes: &[u8], at: usize) -> Option<(u8, EntryId, &[u8], usize)> {
    let header: [u8; 4] = bytes.get(at..at + FRAME_HEADER)?.try_into().ok()?;
    let len = (u32::from_be_bytes(header) & 0x03FF_FFFF) as usize;
    let start = at + FRAME_HEADER;
    let record = bytes.get(start..start.checked_add(len)?)?;
    let (kind, entry, body) = decode(record)?;
    Some((kind, entry, body, start + len))
}

fn encode(kind: u8, entry: EntryId, body: &[u8]) -> Vec<u8> {
    let mut record = Vec::with_capacity(body.len() + RECORD_OVERHEAD);
    record.extend_from_slice(&MAGIC);
    record.push(kind);
    record.extend_from_slice(&entry.to_le_bytes());
    record.extend_from_slice(body);
    let sum = checksum(&record);
    record.extend_from_slice(&sum.to_le_bytes());
    record
}

fn decode(record: &[u8]) -> Option<(u8, EntryId, &[u8])> {
    if record.len() < RECORD_OVERHEAD || !record.starts_with(&MAGIC) {
        return None;
    }
    let (content, sum) = record.split_at(record.len() - 8);
    if checksum(content).to_le_bytes() != sum {
        return None;
    }
    let kind = content[4];
    if !(PARK..=GONE).contains(&kind) {
        return None;
    }
    let entry = EntryId::from_le_bytes(content[5..13].try_into().ok()?);
    Some((kind, entry, &content[13..]))
}

/// FNV-1a, 64 bits: tells a damaged record from a good one (not an adversary's).
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What a `park` record with a task of `task_len` bytes takes on disk.
fn record_len(task_len: usize) -> u64 {
    (FRAME_HEADER + RECORD_OVERHEAD + task_len) as u64
}

/// The fault of a file operation that failed with `error`: a full disk, a missing
/// permission or a read-only file system refuse until an operator acts; data that cannot be
/// read back is corrupt.
fn io_fault(text: String, error: io::Error) -> BackendFault {
    let kind = match error.kind() {
        io::ErrorKind::StorageFull
        | io::ErrorKind::PermissionDenied
        | io::ErrorKind::ReadOnlyFilesystem
        | io::ErrorKind::QuotaExceeded => FaultKind::Refused,
        io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => FaultKind::Corrupt,
        _ => FaultKind::Other,
    };
    BackendFault::new(kind, text, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_detected() {
        let record = encode(PARK, 42, b"{\"x\":1}");
        assert_eq!(decode(&record), Some((PARK, 42, &b"{\"x\":1}"[..])));
        for index in 0..record.len() {
            let mut damaged = record.clone();
            damaged[index] ^= 0x10;
            assert_eq!(
                decode(&damaged),
                None,
                "a flipped bit at {index} is noticed"
            );
        }
        assert_eq!(decode(&record[..record.len() - 1]), None, "truncated");
    }
}
