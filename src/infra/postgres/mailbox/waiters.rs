//! Waiting for a result without polling: who waits on which key ([`Waiters`]), by a hash
//! of the key every process computes alike.
//!
//! A store announces on the table's channel (`NOTIFY`, after its commit, gathered with other
//! stores: see the database handle's announcer) a hash of the key; each process listens
//! on one connection and wakes exactly the waiters of that key (a hash collision only costs a
//! spurious wake-up: the waiter takes, finds nothing, waits again). A store on this node also
//! wakes its waiters directly, without the round trip. When the listening connection is lost
//! every waiter is woken once, since notifications may have been missed meanwhile.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::Notify;

use crate::util::serde::MailboxKey;

/// The waiters' handles of the keys with one hash.
pub(super) type SameHash = Vec<(MailboxKey, Weak<Notify>)>;

/// Who waits on which key, by the key's hash.
#[derive(Default)]
pub(super) struct Waiters {
    pub(super) by_hash: Mutex<HashMap<u64, SameHash>>,
}

impl Waiters {
    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<u64, SameHash>> {
        self.by_hash.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the waiters of keys with this hash.
    pub(super) fn wake_hash(&self, hash: u64) {
        let waiters = self.lock();
        for (_, notify) in waiters.get(&hash).into_iter().flatten() {
            if let Some(notify) = notify.upgrade() {
                notify.notify_waiters();
            }
        }
    }

    /// Wakes every waiter (notifications may have been lost).
    pub(super) fn wake_all(&self) {
        let waiters = self.lock();
        for (_, notify) in waiters.values().flatten() {
            if let Some(notify) = notify.upgrade() {
                notify.notify_waiters();
            }
        }
    }
}

/// A hash of a full key that every process computes alike (FNV-1a over its parts).
pub(super) fn key_hash(key: &MailboxKey) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(key.tenant.0.as_bytes());
    for part in [&key.user_id, &key.session_id] {
        match part {
            Some(text) => {
                eat(&[1]);
                eat(text.as_bytes());
            }
            None => eat(&[0]),
        }
    }
    hash
}
