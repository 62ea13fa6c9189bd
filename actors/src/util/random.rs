//! Unguessable random numbers: anonymous mailbox keys, shared-queue entry ids, webhook
//! delivery ids and retry jitter.
//!
//! Bytes come from the operating system's CSPRNG (`getrandom`), fetched 4 KiB at a time per
//! thread so a key costs a copy, not a system call.

use std::cell::RefCell;

const BUFFER: usize = 4096;

struct Pool {
    bytes: [u8; BUFFER],
    used: usize,
}

thread_local! {
    static POOL: RefCell<Pool> = const { RefCell::new(Pool { bytes: [0; BUFFER], used: BUFFER }) };
}

/// 128 bits from the operating system's CSPRNG.
///
/// Panics only if the operating system cannot supply randomness at all, in which case no
/// key this crate could make would be safe to hand out.
pub fn random_u128() -> u128 {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.used + 16 > BUFFER {
            getrandom::fill(&mut pool.bytes).expect("the operating system has no randomness");
            pool.used = 0;
        }
        let start = pool.used;
        pool.used += 16;
        let mut word = [0u8; 16];
        word.copy_from_slice(&pool.bytes[start..start + 16]);
        u128::from_ne_bytes(word)
    })
}

#[cfg(test)]
mod tests {
    use super::random_u128;
    use std::collections::HashSet;

    #[test]
    fn draws_differ_across_buffer_refills() {
        let draws: HashSet<u128> = (0..1_000).map(|_| random_u128()).collect();
        assert_eq!(draws.len(), 1_000);
    }
}
