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
