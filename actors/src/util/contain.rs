//! Dropping values whose `Drop` may panic, without letting the panic escape.
//!
//! Executors' payloads, results and futures are user values; a panic in their `Drop` must
//! not take down a worker thread without a report, the scheduler, or a lock.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// How many nested panic payloads are dropped before the last one is leaked instead.
const NESTED_PANICS: usize = 8;

/// Drops `value`, containing any panic its `Drop` raises (and the panics raised by dropping
/// those panics' payloads). Returns whether a panic was contained.
pub fn drop_contained<T>(value: T) -> bool {
    let Err(mut payload) = catch_unwind(AssertUnwindSafe(move || drop(value))) else {
        return false;
    };
    tracing::error!("a value panicked while being dropped; the panic was contained");
    for _ in 0..NESTED_PANICS {
        match catch_unwind(AssertUnwindSafe(move || drop(payload))) {
            Ok(()) => return true,
            Err(next) => payload = next,
        }
    }
    std::mem::forget(payload);
    true
}

/// The message a panic payload carries, without dropping it.
pub fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::drop_contained;

    struct Bomb(u32);

    impl Drop for Bomb {
        fn drop(&mut self) {
            if self.0 > 0 {
                std::panic::panic_any(Bomb(self.0 - 1));
            }
        }
    }

    #[test]
    fn nested_panicking_drops_are_contained() {
        assert!(!drop_contained(Bomb(0)));
        assert!(drop_contained(Bomb(3)));
        assert!(drop_contained(Bomb(100)));
    }
}
