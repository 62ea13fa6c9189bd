//! What the bench binaries share: how big a run is, and the median of its rounds.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Whether this is a measured run (`cargo bench` passes `--bench`) rather than the smoke test
/// `cargo test` runs.
pub fn measured() -> bool {
    std::env::args().any(|arg| arg == "--bench")
}

/// The environment variable `name` as a number, or `default` when it is unset or not one.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// The median of `values` (the upper one of an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// The database a Postgres bench uses: `DATABASE_URL`, else the local server's `test`.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Now, ms since the Unix epoch.
pub fn now_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// The median and 90th percentile of `times`, in ms.
pub fn spread_ms(times: &[std::time::Duration]) -> (f64, f64) {
    let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let p90 = ms
        .get((ms.len() * 9 / 10).min(ms.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    (median(&ms), p90)
}

/// A global allocator that counts the live heap bytes, so memory per task is measured, not
/// estimated. A bench that wants it declares it:
/// `#[global_allocator] static ALLOCATOR: support::LiveBytes = support::LiveBytes;`
pub struct LiveBytes;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

impl LiveBytes {
    /// The heap bytes allocated and not yet freed, by every thread.
    pub fn now() -> isize {
        LIVE_BYTES.load(Ordering::Relaxed)
    }
}

unsafe impl GlobalAlloc for LiveBytes {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
