//! The yaque queue on a disk that fills up, on a small tmpfs each test mounts for itself.
//!
//! A queue whose disk filled up must start again once a little space is free, not only once
//! there is room for a whole copy of it; with no space at all, its start fails with an
//! error saying how much it needs. A park refused for lack of space never comes back after a
//! restart, and the log is rewritten at the first start that has room for it.
//!
//! Mounting needs root (or `CAP_SYS_ADMIN`); where the mount is refused, each test says so
//! on stderr and ends without checking anything.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use prometheus_parking_lot::core::{EntryId, ScheduledTask, Settlement, TaskMetadata, TaskQueue};
use prometheus_parking_lot::infra::queue::yaque::YaqueQueue;
use prometheus_parking_lot::util::serde::ResourceCost;

const STREAM: &str = "full";
/// Each task carries this much payload, so a few hundred fill the disk.
const PAYLOAD_BYTES: usize = 2 * 1024;

/// A tmpfs of a given size, unmounted and removed when dropped (also when a test fails).
struct SmallDisk(PathBuf);

impl SmallDisk {
    /// Mounts a tmpfs of `kib` KiB at a fresh directory, or says on stderr why it cannot.
    fn mount(label: &str, kib: u64) -> Option<Self> {
        let dir =
            std::env::temp_dir().join(format!("pl-yaque-disk-{label}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mount point");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(&dir)
            .output();
        let refusal = match mounted {
            Ok(output) if output.status.success() => return Some(Self(dir)),
            Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            Err(error) => format!("cannot run mount: {error}"),
        };
        let _ = std::fs::remove_dir(&dir);
        // Straight to the process's stderr, past the test harness's capture: a skip is seen.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {label}: this process cannot mount a {kib} KiB tmpfs ({refusal}); run the \
             tests as root to check a full disk"
        );
        None
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// A file of `kib` KiB that takes space until it is removed.
    fn reserve(&self, name: &str, kib: usize) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, vec![0xA5; kib * 1024]).expect("the spare file fits");
        path
    }

    /// Takes every byte still free.
    fn fill_up(&self) {
        let mut filler = std::fs::File::create(self.0.join("filler")).expect("filler");
        while filler.write_all(&[0x5A; 512]).is_ok() {}
        let _ = filler.sync_all();
    }

    /// The bytes of the queue's segment files.
    fn log_bytes(&self) -> u64 {
        std::fs::read_dir(self.0.join(STREAM))
            .expect("stream dir")
            .map(|item| item.expect("dir entry").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "q"))
            .map(|path| std::fs::metadata(path).expect("segment").len())
            .sum()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(disk: &SmallDisk) -> Result<YaqueQueue<String>, String> {
    YaqueQueue::open(disk.path(), STREAM).map_err(|error| error.to_string())
}

fn task(id: u64) -> ScheduledTask<String> {
    let mut meta = TaskMetadata::new(id, ResourceCost::gpu_vram(1));
    meta.created_at_ms = 1_700_000_000_000 + u128::from(id);
    ScheduledTask::new(meta, format!("{id:>8}").repeat(PAYLOAD_BYTES / 8))
}

/// Parks tasks 0, 1, 2, ... until the disk refuses one: the ids it took, and the refusal.
async fn park_until_full(queue: &YaqueQueue<String>) -> (Vec<EntryId>, EntryId, String) {
    let mut accepted = Vec::new();
    for id in 0..100_000 {
        match queue.park(id, task(id)).await {
            Ok(()) => accepted.push(id),
            Err(error) => return (accepted, id, error.to_string()),
        }
    }
    panic!("the disk never filled up");
}

async fn parked_ids(queue: &YaqueQueue<String>) -> Vec<EntryId> {
    let parked = queue.load_parked().await.expect("load_parked");
    parked.iter().map(|stored| stored.entry).collect()
}

#[tokio::test]
async fn a_queue_whose_disk_filled_up_starts_again_once_a_little_space_is_free() {
    let Some(disk) = SmallDisk::mount("restart", 1024) else {
        return;
    };
    let spares = [disk.reserve("spare-0", 64), disk.reserve("spare-1", 64)];

    let queue = open(&disk).expect("opens on an empty disk");
    let (mut accepted, refused, error) = park_until_full(&queue).await;
    assert!(
        error.contains("No space left on device"),
        "the OS error is passed on: {error}"
    );
    assert!(accepted.len() > 100, "only {} tasks fit", accepted.len());
    // Space comes back while the queue runs: it takes work again.
    std::fs::remove_file(&spares[0]).unwrap();
    let next = refused + 1;
    queue
        .park(next, task(next))
        .await
        .expect("a park once some space is free");
    accepted.push(next);
    drop(queue);

    // About 60 KiB free, and a queue of about 900 KiB.
    let queue = open(&disk).expect("the queue starts with a little space free");
    assert_eq!(
        parked_ids(&queue).await,
        accepted,
        "every accepted task is back, and the refused task {refused} is not"
    );
    let (first, last) = (accepted[0], *accepted.last().unwrap());
    assert_eq!(queue.claim(first).await.unwrap(), Some(task(first)));
    queue.settle(first, Settlement::Done).await.unwrap();
    // All but the last three finish; then the disk gets room to rewrite the log.
    let kept = &accepted[accepted.len() - 3..];
    for &entry in &accepted[1..accepted.len() - 3] {
        queue.claim(entry).await.unwrap().expect("parked");
        queue.settle(entry, Settlement::Done).await.unwrap();
    }
    drop(queue);
    std::fs::remove_file(&spares[1]).unwrap();

    let queue = open(&disk).expect("restarts");
    assert_eq!(parked_ids(&queue).await, kept);
    let bytes = disk.log_bytes();
    assert!(
        bytes < 16 * 1024,
        "the log was rewritten once there was room: {bytes} bytes for three tasks"
    );
    assert_eq!(queue.claim(last).await.unwrap(), Some(task(last)));
}

#[tokio::test]
async fn a_queue_on_a_full_disk_says_how_much_space_it_needs_to_start() {
    let Some(disk) = SmallDisk::mount("needs", 512) else {
        return;
    };
    let spare = disk.reserve("spare", 64);
    let queue = open(&disk).expect("opens on an empty disk");
    let (accepted, _, _) = park_until_full(&queue).await;
    drop(queue);
    disk.fill_up();

    let Err(error) = open(&disk) else {
        panic!("the queue opened with no byte free");
    };
    assert!(
        error.contains("No space left on device")
            && error.contains("needs about 64 KiB free to start"),
        "the error says what is missing: {error}"
    );
    std::fs::remove_file(spare).unwrap();
    let queue = open(&disk).expect("starts once 64 KiB are free");
    assert_eq!(parked_ids(&queue).await, accepted);
}
