//! What the yaque queue asks of the operating system: a lock on its stream that dies with its
//! process, and the free space of the disk its files are on.
//!
//! **Why a lock of our own.** yaque marks a stream in use with lock files (`send.lock`, the
//! version lock) that hold the owner's pid, and judges a left-over file by asking whether a
//! process of that pid exists. That is wrong twice: a killed process that its parent has not
//! reaped yet (a zombie) still exists, and after a reboot the pid may belong to anyone. So
//! the queue takes an advisory `flock(2)` on `STREAM/owner.lock` before it touches anything
//! else. The kernel drops that lock when the owner's last descriptor closes, which happens
//! when the process dies, zombie or not; nothing depends on pids. Whoever holds it owns the
//! stream, so yaque's lock files found by a new owner are left-overs and are removed.
//!
//! Platforms without `flock` (Windows) fall back to yaque's own pid check.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// The file the stream's owner holds locked.
const OWNER_FILE: &str = "owner.lock";
/// How long a busy lock is tried again before the owner is reported. A process that starts
/// a program holds a copy of every descriptor between `fork` and `exec`, so a stream just
/// closed may stay locked for that long; so may one whose owner is exiting.
const BUSY_PATIENCE: Duration = Duration::from_millis(500);

/// The stream's ownership, for as long as this value lives.
pub(super) struct OwnerLock {
    /// The descriptor the lock belongs to; closing it releases the lock.
    _file: File,
}

impl OwnerLock {
    /// Takes the stream in `dir`, or says who has it and what to do.
    pub(super) fn take(dir: &Path) -> io::Result<Self> {
        let path = dir.join(OWNER_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        if let Err(error) = lock_patiently(&file) {
            if error.kind() != io::ErrorKind::WouldBlock {
                return Err(error);
            }
            let owner = match std::fs::read_to_string(&path) {
                Ok(text) if text.trim() == std::process::id().to_string() => {
                    "this process".to_owned()
                }
                Ok(text) if !text.trim().is_empty() => format!("process {}", text.trim()),
                _ => "another process".to_owned(),
            };
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "the queue is in use by {owner}, which holds {}; one process at a time may \
                     open a stream: stop that process (or drop its pool) first, or give this \
                     pool another stream or path",
                    path.display()
                ),
            ));
        }
        write_owner(&file);
        Ok(Self { _file: file })
    }
}

/// Records this process's pid in the owner file, for the error another opener shows. The
/// pid is only shown, never trusted, so a failure to write it (a full disk) is ignored.
fn write_owner(file: &File) {
    // Fixed width, written in place: a file that already holds an owner needs no new block.
    let text = format!("{:<20}\n", std::process::id());
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        let _ = file.write_all_at(text.as_bytes(), 0);
    }
    #[cfg(not(unix))]
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut file = file;
        let _ = file
            .seek(SeekFrom::Start(0))
            .and_then(|_| file.write_all(text.as_bytes()));
    }
}

/// Takes the lock, trying again for up to [`BUSY_PATIENCE`] while it is busy.
fn lock_patiently(file: &File) -> io::Result<()> {
    let started = Instant::now();
    loop {
        match lock_exclusively(file) {
            Err(error)
                if error.kind() == io::ErrorKind::WouldBlock
                    && started.elapsed() < BUSY_PATIENCE =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            outcome => return outcome,
        }
    }
}

#[cfg(unix)]
fn lock_exclusively(file: &File) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock(2) on a descriptor `file` owns for the whole call.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if locked == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(unix))]
fn lock_exclusively(_file: &File) -> io::Result<()> {
    Ok(())
}

/// Removes yaque's lock files in `dir`. Called by the stream's owner only, when no writer of
/// its own is open: any such file was left by a process that died, or by a write that
/// failed half-way (yaque creates a lock file, then writes into it; on a full disk the
/// second step fails and the empty file would block every later open).
#[cfg(unix)]
pub(super) fn clear_yaque_locks(dir: &Path) -> io::Result<()> {
    for lock in [
        dir.join("send.lock"),
        dir.join("recv.lock"),
        dir.join("version").join("lock"),
    ] {
        match std::fs::remove_file(&lock) {
            Ok(()) => {
                tracing::debug!(lock = %lock.display(), "removed a left-over yaque lock file")
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Without an owner lock, a lock file is cleared only when no live process of its pid
/// exists (yaque's own check).
#[cfg(not(unix))]
pub(super) fn clear_yaque_locks(dir: &Path) -> io::Result<()> {
    for lock in [dir.join("send.lock"), dir.join("version").join("lock")] {
        let holds_pid = std::fs::read_to_string(&lock)
            .map(|text| text.contains("pid=") && text.contains("token="))
            .unwrap_or(true);
        if !holds_pid {
            std::fs::remove_file(&lock)?;
            continue;
        }
        match std::panic::catch_unwind(|| yaque::recovery::unlock(&lock)) {
            Ok(result) => result.map_err(|error| {
                io::Error::other(format!(
                    "the queue is in use ({error}); one process at a time may open a stream"
                ))
            })?,
            Err(_) => {
                return Err(io::Error::other(format!(
                    "the lock file {} cannot be read; delete it if no process uses the queue",
                    lock.display()
                )))
            }
        }
    }
    Ok(())
}

/// Bytes an unprivileged writer may still use on the disk holding `dir`; `None` where the
/// platform does not say.
#[cfg(unix)]
pub(super) fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs(3) with a NUL-terminated path and a zeroed struct it fills in.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; both pointers are valid for the call.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return None;
    }
    #[allow(clippy::useless_conversion)] // the field types differ between platforms
    let (blocks, size) = (u64::from(stats.f_bavail), u64::from(stats.f_frsize));
    Some(blocks.saturating_mul(size))
}

#[cfg(not(unix))]
pub(super) fn free_bytes(_dir: &Path) -> Option<u64> {
    None
}
