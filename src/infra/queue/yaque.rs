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
//! **Start.** Stale lock files of a process that died (`send.lock`, the version lock) are
//! cleared with [`yaque::recovery::unlock`], which leaves a live owner's lock alone (the
//! queue then refuses to open: one process per stream). Every segment is read with a
//! checking reader of this module rather than yaque's `Receiver`, which panics on a damaged
//! header and waits for ever on a truncated tail. Entries that were claimed when the process
//! died are parked again (their runs were lost: at-least-once). Two live entries of one
//! caller's task id (tenant and id) are kept once, the first admitted (de-duplication by
//! task id).
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

use std::collections::{BTreeMap, HashMap};
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
/// A segment holds about this much before yaque starts the next one.
const SEGMENT_BYTES: u64 = 32 * 1024 * 1024;
/// The log is rewritten once this much (and four times the live tasks' size) was appended.
const COMPACT_FLOOR: u64 = 8 * 1024 * 1024;

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
    /// `None` only after a compaction could not reopen the writer: every call then fails.
    sender: Option<Sender>,
    /// Live entries, in entry order.
    entries: BTreeMap<EntryId, Kept>,
    claimed: usize,
    /// Size of the live entries' `park` records.
    live_bytes: u64,
    /// Bytes appended since the last rewrite.
    appended: u64,
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
            return Err(QueueError::Backend(format!(
                "yaque stream {stream:?} is not allowed; stream names are 1 to 64 of the \
                 characters a-z A-Z 0-9 _ -"
            )));
        }
        let dir = path.as_ref().join(stream);
        let quarantine = path.as_ref().join(format!("{stream}.quarantine"));
        let (store, quarantined) = Store::open(dir, &quarantine).map_err(|error| {
            QueueError::Backend(format!(
                "could not open the yaque stream {stream} in {}: {error}",
                path.as_ref().display()
            ))
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
            QueueError::Backend(format!(
                "entry {entry}: its stored task does not decode: {error}"
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
            QueueError::Backend(format!(
                "entry {entry}: the task does not serialise: {error}"
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
                    QueueError::Backend(format!(
                        "entry {entry}: its metadata does not decode: {error}"
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
    /// Clears stale locks, replays the log (quarantining damage), parks left-over claims
    /// again, drops duplicate task ids, and rewrites the log into a fresh segment.
    fn open(dir: PathBuf, quarantine: &Path) -> io::Result<(Self, Vec<Quarantined>)> {
        fs::create_dir_all(&dir)?;
        for lock in [dir.join("send.lock"), dir.join("version").join("lock")] {
            clear_stale_lock(&lock)?;
        }
        let mut replay = Replay::default();
        let mut quarantined = Vec::new();
        let segments = segments(&dir, quarantine, &mut quarantined)?;
        for (_, file) in &segments {
            let bytes = fs::read(file)?;
            replay.segment(file, &bytes, quarantine, &mut quarantined)?;
        }
        let entries = replay.finish(&dir, quarantine, &mut quarantined)?;
        let next = segments.last().map_or(0, |&(number, _)| number + 1);
        let mut store = Store {
            dir,
            quarantine: quarantine.to_path_buf(),
            sender: None,
            entries,
            claimed: 0,
            live_bytes: 0,
            appended: 0,
        };
        store.rewrite(next, &segments)?;
        Ok((store, quarantined))
    }

    /// Appends one record. On failure nothing changes in the index.
    fn append(&mut self, kind: u8, entry: EntryId, body: &[u8]) -> Result<(), QueueError> {
        let record = encode(kind, entry, body);
        if record.len() > MAX_FRAME {
            return Err(QueueError::Backend(format!(
                "entry {entry}: the task takes {} bytes stored; the yaque queue holds at most {} \
                 bytes a task",
                body.len(),
                MAX_FRAME - RECORD_OVERHEAD
            )));
        }
        let sender = self.sender.as_mut().ok_or_else(|| {
            QueueError::Backend(format!(
                "the queue in {} lost its writer after a failed compaction; restart the pool",
                self.dir.display()
            ))
        })?;
        sender.try_send(&record).map_err(|error| {
            QueueError::Backend(format!("writing to {}: {error}", self.dir.display()))
        })?;
        self.appended += (FRAME_HEADER + record.len()) as u64;
        Ok(())
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
                QueueError::Backend(format!("could not quarantine entry {entry}: {error}"))
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
        let result = segments(&self.dir, Path::new(""), &mut Vec::new()).and_then(|segments| {
            let next = segments.last().map_or(0, |&(number, _)| number + 1);
            self.rewrite(next, &segments)
        });
        if let Err(error) = result {
            tracing::error!(dir = %self.dir.display(), %error, "yaque queue compaction failed; the log keeps growing until the next start");
        }
    }

    /// Moves the writer to the fresh segment `next`, writes every live entry there, then
    /// deletes `older` segments, oldest first.
    fn rewrite(&mut self, next: u64, older: &[(u64, PathBuf)]) -> io::Result<()> {
        self.sender = None;
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{next}.q")))?;
        let dir = self.dir.clone();
        let sender = catch_unwind(AssertUnwindSafe(|| {
            SenderBuilder::new().segment_size(SEGMENT_BYTES).open(&dir)
        }))
        .map_err(|_| {
            io::Error::other(format!(
                "yaque could not read the queue's version file in {}",
                dir.display()
            ))
        })??;
        let mut records = Vec::with_capacity(self.entries.len());
        let mut live_bytes = 0;
        for (&entry, kept) in &self.entries {
            records.push(encode(PARK, entry, &kept.task));
            live_bytes += record_len(kept.task.len());
            if kept.claimed {
                records.push(encode(CLAIM, entry, &[]));
            }
        }
        let sender = self.sender.insert(sender);
        for chunk in records.chunks(1024) {
            sender
                .try_send_batch(chunk.iter())
                .map_err(|error| io::Error::other(error.to_string()))?;
        }
        self.live_bytes = live_bytes;
        self.appended = 0;
        for (number, file) in older.iter().filter(|(number, _)| *number < next) {
            if let Err(error) = fs::remove_file(file) {
                tracing::warn!(segment = number, file = %file.display(), %error, "could not delete a compacted segment");
                break;
            }
        }
        Ok(())
    }
}

/// Removes a lock file left by a process that died. A lock a live process holds is kept and
/// reported; a lock file torn by a kill while it was written (no owner in it) is removed.
fn clear_stale_lock(lock: &Path) -> io::Result<()> {
    let contents = match fs::read_to_string(lock) {
        Ok(contents) => contents,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    let field = |name: &str| {
        contents
            .split(name)
            .nth(1)
            .is_some_and(|rest| rest.chars().next().is_some_and(|c| c.is_ascii_digit()))
    };
    if !(field("pid=") && field("token=")) {
        tracing::warn!(lock = %lock.display(), "removing a torn lock file left by a killed process");
        return fs::remove_file(lock);
    }
    match catch_unwind(|| yaque::recovery::unlock(lock)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(io::Error::other(format!(
            "the queue is in use ({error}); one process at a time may open a stream"
        ))),
        Err(_) => Err(io::Error::other(format!(
            "the lock file {} cannot be read; delete it if no process uses the queue",
            lock.display()
        ))),
    }
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

    /// The live entries: left-over claims parked again, one entry per caller's task id.
    /// An entry whose metadata does not decode is quarantined.
    fn finish(
        self,
        dir: &Path,
        quarantine: &Path,
        quarantined: &mut Vec<Quarantined>,
    ) -> io::Result<BTreeMap<EntryId, Kept>> {
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
        for entry in dropped {
            entries.remove(&entry);
        }
        if rerun > 0 {
            tracing::warn!(tasks = rerun, "tasks that were running when the process stopped are parked again and will run again");
        }
        Ok(entries)
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
