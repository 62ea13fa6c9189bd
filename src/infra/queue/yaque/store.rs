//! The log on disk: its writer and the index it rebuilds ([`Store`]), the start that
//! replays the segments and sets damage aside ([`Replay`]), appends, and compaction.

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use yaque::{Sender, SenderBuilder};

use crate::core::{Carried, EntryId, HeldBy, QueueError, TaskMetadata, TaskStatus, TraceParent};
use crate::util::serde::{ExtraCosts, ResourceKind};

use super::os;
use super::record::{
    encode, frame_at, record_len, CARRIES_COSTS, CARRIES_INSTANT, CARRIES_TRACE, CLAIM, COSTS_LEN,
    ENDED, FRAME_HEADER, GONE, MAX_FRAME, PARK, PARK_AT, PARK_CARRIED, PARK_HELD, RECORD_OVERHEAD,
    SEGMENT_END, TRACE_LEN,
};

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

/// The fault of a file operation that failed with `error`: a full disk, a missing
/// permission or a read-only file system refuse until an operator acts; data that cannot be
/// read back is corrupt.
pub(super) fn io_fault(text: String, error: io::Error) -> BackendFault {
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

/// The log is rewritten once this much (and four times the live tasks' size) was appended.
const COMPACT_FLOOR: u64 = 8 * 1024 * 1024;
/// Free space a start needs besides the log it keeps, with slack: the lock files and the
/// first block of a fresh segment. A rewrite needs this beyond the copy of the live tasks.
const START_ROOM: u64 = 64 * 1024;

/// The log's writer and the index it rebuilds.
pub(super) struct Store {
    pub(super) dir: PathBuf,
    /// Where damaged records and undecodable tasks are set aside.
    pub(super) quarantine: PathBuf,
    /// The stream's ownership, held while the queue is open.
    pub(super) _owner: os::OwnerLock,
    /// `None` after a failed write or rewrite: the next record opens a new writer.
    pub(super) sender: Option<Sender>,
    /// The segment the writer appends to (it never moves to another by itself).
    pub(super) segment: PathBuf,
    /// The bytes of `segment` that hold whole records: where a failed write is cut back to.
    pub(super) segment_len: u64,
    /// Live entries, in entry order.
    pub(super) entries: BTreeMap<EntryId, Kept>,
    pub(super) claimed: usize,
    /// Size of the live entries' `park` records.
    pub(super) live_bytes: u64,
    /// Bytes appended since the last rewrite.
    pub(super) appended: u64,
    /// Entries whose state in the log may differ from the index: the start dropped them (a
    /// duplicate task id, an undecodable task), or a failed write of theirs could not be cut
    /// back. Their state is written again before the next record.
    pub(super) uncertain: BTreeSet<EntryId>,
    /// How many live held entries name each parent.
    pub(super) named: HashMap<EntryId, u32>,
    /// How each parent that a live held entry names ended, where the log holds its end.
    pub(super) ended: HashMap<EntryId, TaskStatus>,
}

/// A live entry: its task as stored, whether it is running, and what it was parked with.
pub(super) struct Kept {
    pub(super) task: Vec<u8>,
    pub(super) claimed: bool,
    /// The instant (ms since the Unix epoch) before which it must not start (a scheduled
    /// start), and the trace it belongs to, if it was parked with them.
    pub(super) carried: Carried,
    /// The parents it is held for, if it was parked held.
    pub(super) held: Option<Box<HeldBy>>,
}

impl Kept {
    /// The entry as a `park` record's kind and body would store it.
    fn from_park(kind: u8, body: &[u8]) -> Option<Self> {
        let (carried, task) = match kind {
            PARK => (Carried::default(), body),
            PARK_AT => {
                let (instant, task) = body.split_first_chunk::<8>()?;
                let carried = Carried {
                    not_before_ms: Some(u64::from_le_bytes(*instant)),
                    trace: None,
                    also: Default::default(),
                };
                (carried, task)
            }
            PARK_CARRIED => read_carried(body)?,
            PARK_HELD => {
                let (held, rest) = read_held(body)?;
                let (carried, task) = read_carried(rest)?;
                return Some(Self {
                    task: task.to_vec(),
                    claimed: false,
                    carried,
                    held: Some(Box::new(held)),
                });
            }
            _ => return None,
        };
        Some(Self {
            task: task.to_vec(),
            claimed: false,
            carried,
            held: None,
        })
    }

    /// Its `park` record's kind and body: the task, after what it carries (see
    /// `record.rs`). Without a trace, the kinds every earlier version reads.
    pub(super) fn park_body(&self) -> (u8, Cow<'_, [u8]>) {
        let Carried {
            not_before_ms,
            trace,
            also,
        } = self.carried;
        let held_len = self.held.as_ref().map_or(0, |held| held_len(held));
        let mut body =
            Vec::with_capacity(held_len + 1 + 8 + TRACE_LEN + COSTS_LEN + self.task.len());
        // Costs of several kinds go as a trace does: in a `PARK_CARRIED` body.
        let carries = trace.is_some() || !also.is_empty();
        let kind = match (&self.held, not_before_ms, carries) {
            (None, None, false) => return (PARK, Cow::Borrowed(&self.task)),
            (None, Some(instant), false) => {
                body.extend_from_slice(&instant.to_le_bytes());
                PARK_AT
            }
            (None, _, true) => {
                write_carried(&mut body, &self.carried);
                PARK_CARRIED
            }
            (Some(held), ..) => {
                body.push(u8::from(held.run_anyway));
                let count = u16::try_from(held.parents.len()).unwrap_or(u16::MAX);
                body.extend_from_slice(&count.to_le_bytes());
                for &(entry, task_id) in held.parents.iter().take(usize::from(count)) {
                    body.extend_from_slice(&entry.to_le_bytes());
                    body.extend_from_slice(&task_id.to_le_bytes());
                }
                write_carried(&mut body, &self.carried);
                PARK_HELD
            }
        };
        body.extend_from_slice(&self.task);
        (kind, Cow::Owned(body))
    }

    /// Its `park` record.
    fn park_record(&self, entry: EntryId) -> Vec<u8> {
        let (kind, body) = self.park_body();
        encode(kind, entry, &body)
    }

    /// What its `park` record takes on disk.
    pub(super) fn park_len(&self) -> u64 {
        let instant = if self.carried.not_before_ms.is_some() {
            8
        } else {
            0
        };
        let costs = if self.carried.also.is_empty() {
            0
        } else {
            COSTS_LEN
        };
        let carries = self.carried.trace.is_some() || !self.carried.also.is_empty();
        let trace = if self.carried.trace.is_some() {
            TRACE_LEN
        } else {
            0
        };
        // The flags byte of a `PARK_CARRIED` part, which a `PARK_HELD` body always has.
        let flags = usize::from(carries || self.held.is_some());
        let held = self.held.as_ref().map_or(0, |held| held_len(held));
        record_len(self.task.len() + instant + flags + trace + costs + held)
    }
}

/// The bytes a `PARK_HELD` body gives its parents (before its `PARK_CARRIED` part).
fn held_len(held: &HeldBy) -> usize {
    1 + 2 + held.parents.len().min(usize::from(u16::MAX)) * 16
}

/// Writes `carried` as a `PARK_CARRIED` body starts: flags, then what they say.
fn write_carried(body: &mut Vec<u8>, carried: &Carried) {
    let instant_flag = if carried.not_before_ms.is_some() {
        CARRIES_INSTANT
    } else {
        0
    };
    let trace_flag = if carried.trace.is_some() {
        CARRIES_TRACE
    } else {
        0
    };
    let costs_flag = if carried.also.is_empty() {
        0
    } else {
        CARRIES_COSTS
    };
    body.push(trace_flag | instant_flag | costs_flag);
    if let Some(instant) = carried.not_before_ms {
        body.extend_from_slice(&instant.to_le_bytes());
    }
    if let Some(trace) = &carried.trace {
        body.extend_from_slice(&trace.trace_id());
        body.extend_from_slice(&trace.span_id());
        body.push(trace.flags());
    }
    if costs_flag != 0 {
        for units in carried.also.units() {
            body.extend_from_slice(&units.to_le_bytes());
        }
    }
}

/// The parents a `PARK_HELD` body starts with, and the rest; `None` if it is cut short.
fn read_held(body: &[u8]) -> Option<(HeldBy, &[u8])> {
    let (&run_anyway, rest) = body.split_first()?;
    let (count, mut rest) = rest.split_first_chunk::<2>()?;
    let mut parents = Vec::with_capacity(usize::from(u16::from_le_bytes(*count)));
    for _ in 0..u16::from_le_bytes(*count) {
        let (entry, after) = rest.split_first_chunk::<8>()?;
        let (task_id, after) = after.split_first_chunk::<8>()?;
        parents.push((u64::from_le_bytes(*entry), u64::from_le_bytes(*task_id)));
        rest = after;
    }
    let held = HeldBy {
        parents,
        run_anyway: run_anyway == 1,
    };
    Some((held, rest))
}

/// An `ENDED` record's body: how the parent ended.
pub(super) fn ended_body(status: &TaskStatus) -> Vec<u8> {
    serde_json::to_vec(status).unwrap_or_default()
}

/// How a parent ended, from its `ENDED` record's body; one that does not decode counts as
/// not succeeded, in words that say so.
fn read_ended(body: &[u8]) -> TaskStatus {
    serde_json::from_slice(body).unwrap_or_else(|error| {
        TaskStatus::Failed(format!("its stored end does not decode: {error}"))
    })
}

/// What a `PARK_CARRIED` body carries, and the task after it; `None` if it is cut short or
/// holds an invalid trace.
fn read_carried(body: &[u8]) -> Option<(Carried, &[u8])> {
    let (&flags, mut rest) = body.split_first()?;
    let mut carried = Carried::default();
    if flags & CARRIES_INSTANT != 0 {
        let (instant, after) = rest.split_first_chunk::<8>()?;
        carried.not_before_ms = Some(u64::from_le_bytes(*instant));
        rest = after;
    }
    if flags & CARRIES_TRACE != 0 {
        let (trace_id, after) = rest.split_first_chunk::<16>()?;
        let (span_id, after) = after.split_first_chunk::<8>()?;
        let (&trace_flags, after) = after.split_first()?;
        let trace = TraceParent::new(*trace_id, *span_id, trace_flags & 1 == 1)?;
        carried.trace = Some(trace);
        rest = after;
    }
    if flags & CARRIES_COSTS != 0 {
        let mut units = [0; ResourceKind::COUNT];
        for slot in &mut units {
            let (read, after) = rest.split_first_chunk::<4>()?;
            *slot = u32::from_le_bytes(*read);
            rest = after;
        }
        carried.also = ExtraCosts::from_units(units);
    }
    Some((carried, rest))
}

/// The part of a stored task read at start.
#[derive(Deserialize)]
pub(super) struct MetaOnly {
    pub(super) meta: TaskMetadata,
}

impl Store {
    /// Takes the stream, replays the log (quarantining damage), parks left-over claims
    /// again, drops duplicate task ids, and rewrites the log into a fresh segment when the
    /// disk has room for it (else opens a writer on the log as it is).
    pub(super) fn open(dir: PathBuf, quarantine: &Path) -> io::Result<(Self, Vec<Quarantined>)> {
        Self::start(dir.clone(), quarantine).map_err(|error| explain_full_disk(&dir, error))
    }

    pub(super) fn start(dir: PathBuf, quarantine: &Path) -> io::Result<(Self, Vec<Quarantined>)> {
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
        let Replayed {
            entries,
            ended,
            dropped,
        } = replay.finish(&dir, quarantine, &mut quarantined)?;
        let live_bytes = entries.values().map(Kept::park_len).sum();
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
            named: HashMap::new(),
            ended: HashMap::new(),
        };
        let held: Vec<HeldBy> = store
            .entries
            .values()
            .filter_map(|kept| kept.held.as_deref().cloned())
            .collect();
        for held in &held {
            store.hold(held);
        }
        store.ended = ended;
        store
            .ended
            .retain(|entry, _| store.named.contains_key(entry));
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
    pub(super) fn append(
        &mut self,
        kind: u8,
        entry: EntryId,
        body: &[u8],
    ) -> Result<(), QueueError> {
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
    pub(super) fn write(&mut self, records: &[Vec<u8>], entries: &[EntryId]) -> io::Result<()> {
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
    pub(super) fn restate(&mut self) -> io::Result<()> {
        if self.uncertain.is_empty() {
            return Ok(());
        }
        let mut records = Vec::new();
        for entry in &self.uncertain {
            match self.entries.get(entry) {
                Some(kept) => {
                    records.push(kept.park_record(*entry));
                    if kept.claimed {
                        records.push(encode(CLAIM, *entry, &[]));
                    }
                }
                None => match self.ended.get(entry) {
                    Some(status) => records.push(encode(ENDED, *entry, &ended_body(status))),
                    None => records.push(encode(GONE, *entry, &[])),
                },
            }
        }
        let entries: Vec<EntryId> = self.uncertain.iter().copied().collect();
        self.write(&records, &entries)?;
        self.uncertain.clear();
        Ok(())
    }

    /// The log's writer; after a failed write or rewrite, a new one on a fresh segment.
    pub(super) fn writer(&mut self) -> io::Result<&mut Sender> {
        let sender = match self.sender.take() {
            Some(sender) => sender,
            None => self.new_writer()?,
        };
        Ok(self.sender.insert(sender))
    }

    /// A writer appending to a fresh segment after every existing one. Called with no writer
    /// open, so yaque's lock files, if any, are left-overs of a failed open.
    pub(super) fn new_writer(&mut self) -> io::Result<Sender> {
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
    pub(super) fn set_aside(&mut self, entry: EntryId) -> Result<(), QueueError> {
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

    pub(super) fn forget(&mut self, entry: EntryId) {
        if let Some(kept) = self.entries.remove(&entry) {
            self.live_bytes -= kept.park_len();
            if kept.claimed {
                self.claimed -= 1;
            }
            if let Some(held) = kept.held {
                self.let_go(&held);
            }
        }
    }

    /// A held entry naming `held`'s parents is live.
    pub(super) fn hold(&mut self, held: &HeldBy) {
        for &(parent, _) in &held.parents {
            *self.named.entry(parent).or_default() += 1;
        }
    }

    /// A held entry naming `held`'s parents is gone: a parent no live entry names any more
    /// is forgotten, with its end.
    fn let_go(&mut self, held: &HeldBy) {
        for &(parent, _) in &held.parents {
            let Some(count) = self.named.get_mut(&parent) else {
                continue;
            };
            *count -= 1;
            if *count == 0 {
                self.named.remove(&parent);
                self.ended.remove(&parent);
            }
        }
    }

    /// The record that ends `entry` with `status`: `ENDED` (with how it ended) for a parent
    /// that live held entries name, which keeps its end for them, else `GONE`.
    pub(super) fn end_record(&mut self, entry: EntryId, status: TaskStatus) -> (u8, Vec<u8>) {
        if !self.named.contains_key(&entry) {
            return (GONE, Vec::new());
        }
        let body = ended_body(&status);
        self.ended.insert(entry, status);
        (ENDED, body)
    }

    /// Rewrites the log when the appended records dwarf the live ones.
    pub(super) fn maybe_compact(&mut self) {
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
    pub(super) fn compact(&mut self) -> io::Result<bool> {
        let claims = self.entries.values().filter(|kept| kept.claimed).count() as u64;
        let ends: u64 = self
            .ended
            .values()
            .map(|status| record_len(ended_body(status).len()))
            .sum();
        let snapshot = self.live_bytes + claims * record_len(0) + ends;
        let needed = snapshot + START_ROOM;
        if let Some(free) = os::free_bytes(&self.dir).filter(|&free| free < needed) {
            tracing::warn!(dir = %self.dir.display(), free, needed, "too little free space to rewrite the queue's log; it is kept as it is, and rewritten once there is room");
            return Ok(false);
        }
        let older = segments(&self.dir, Path::new(""), &mut Vec::new())?;
        self.sender = None;
        let mut records = Vec::with_capacity(self.entries.len() + self.ended.len());
        // The ends that held entries still read, before the entries.
        for (&entry, status) in &self.ended {
            records.push(encode(ENDED, entry, &ended_body(status)));
        }
        for (&entry, kept) in &self.entries {
            records.push(kept.park_record(entry));
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

/// What a replay leaves: see [`Replay::finish`].
struct Replayed {
    entries: BTreeMap<EntryId, Kept>,
    ended: HashMap<EntryId, TaskStatus>,
    dropped: Vec<EntryId>,
}

/// The state the log's records describe, as they are replayed.
#[derive(Default)]
struct Replay {
    entries: BTreeMap<EntryId, Kept>,
    /// Every parent end the log holds (those no live entry names are dropped at the end).
    ended: HashMap<EntryId, TaskStatus>,
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
            PARK | PARK_AT | PARK_CARRIED | PARK_HELD => match Kept::from_park(kind, body) {
                Some(kept) => {
                    self.entries.insert(entry, kept);
                }
                None => {
                    self.entries.remove(&entry);
                }
            },
            CLAIM => {
                if let Some(kept) = self.entries.get_mut(&entry) {
                    kept.claimed = true;
                }
            }
            ENDED => {
                self.entries.remove(&entry);
                self.ended.insert(entry, read_ended(body));
            }
            _ => {
                self.entries.remove(&entry);
            }
        }
    }

    /// The live entries (left-over claims parked again, one entry per caller's task id), the
    /// parents' ends, and the entries dropped: duplicates, and those whose metadata does not
    /// decode (quarantined).
    fn finish(
        self,
        dir: &Path,
        quarantine: &Path,
        quarantined: &mut Vec<Quarantined>,
    ) -> io::Result<Replayed> {
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
        Ok(Replayed {
            entries,
            ended: self.ended,
            dropped,
        })
    }
}
