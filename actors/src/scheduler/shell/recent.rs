//! The callers whose tasks ended a moment ago, for a pool that attaches repeated
//! submissions (`OnDuplicate::Attach`) with a mailbox that stores results on its own time (a
//! database): between a task's end and its result's store, a resubmission would find neither
//! the live task nor the stored result and run again. Remembering the caller for a while
//! closes that gap: the resubmission gets the original's key, where the result is (or is
//! about to be) stored.

use std::collections::{HashMap, VecDeque};

use crate::domain::{MailboxKey, TaskId, TenantId};

/// How long a caller is remembered after its task ended, ms: a result's store takes
/// milliseconds; this covers a slow database.
pub(crate) const REMEMBERED_MS: u64 = 10_000;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct RecentlyEnded {
    /// When each remembered caller's task ended, oldest first.
    order: VecDeque<(u64, TenantId, TaskId)>,
    /// Each remembered caller's key, and when it ended (a caller that ends twice is
    /// remembered from its latest end).
    keys: HashMap<(TenantId, TaskId), (u64, MailboxKey)>,
}

impl RecentlyEnded {
    /// Task `id` of `key` ended at `now`.
    pub fn remember(&mut self, key: &MailboxKey, id: TaskId, now: u64) {
        self.forget_before(now);
        self.order.push_back((now, key.tenant.clone(), id));
        self.keys
            .insert((key.tenant.clone(), id), (now, key.clone()));
    }

    /// The key of caller (`tenant`, `id`) if its task ended within the window before `now`.
    pub fn key_of(&mut self, tenant: &TenantId, id: TaskId, now: u64) -> Option<MailboxKey> {
        self.forget_before(now);
        self.keys
            .get(&(tenant.clone(), id))
            .map(|(_, key)| key.clone())
    }

    /// Forgets the callers whose tasks ended more than the window before `now`.
    fn forget_before(&mut self, now: u64) {
        while let Some((ended, ..)) = self.order.front() {
            if now.saturating_sub(*ended) < REMEMBERED_MS {
                return;
            }
            let Some((ended, tenant, id)) = self.order.pop_front() else {
                return;
            };
            let caller = (tenant, id);
            if self.keys.get(&caller).is_some_and(|(at, _)| *at == ended) {
                self.keys.remove(&caller);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_is_remembered_for_the_window_from_its_latest_end() {
        let mut recent = RecentlyEnded::default();
        let key = MailboxKey::new("acme").with_session("s");
        recent.remember(&key, 7, 1_000);
        assert_eq!(
            recent.key_of(&key.tenant, 7, 1_000 + REMEMBERED_MS - 1),
            Some(key.clone())
        );
        assert_eq!(recent.key_of(&key.tenant, 8, 1_000), None, "another id");
        assert_eq!(
            recent.key_of(&TenantId::from("other"), 7, 1_000),
            None,
            "another tenant"
        );
        recent.remember(&key, 7, 5_000);
        assert_eq!(
            recent.key_of(&key.tenant, 7, 1_000 + REMEMBERED_MS),
            Some(key.clone()),
            "its latest end counts"
        );
        assert_eq!(
            recent.key_of(&key.tenant, 7, 5_000 + REMEMBERED_MS),
            None,
            "forgotten"
        );
        assert!(recent.order.is_empty() && recent.keys.is_empty());
    }
}
