//! The in-memory shared queue's maintenance: rescuing expired leases, the dead letters it
//! keeps and hands out, and its counts.

use async_trait::async_trait;

use super::*;

#[async_trait]
impl<P> QueueMaintenance for InMemorySharedQueue<P>
where
    P: Send,
{
    async fn rescue_expired(&self, now_ms: u64) -> Result<usize, QueueError> {
        let mut lot = self.lock();
        lot.ended.retain(|_, (until, _)| *until > now_ms);
        lot.expire_held(now_ms);
        let mut expired: Vec<EntryId> = lot
            .claimed
            .iter()
            .filter(|(_, claim)| claim.expires_at_ms <= now_ms)
            .map(|(&entry, _)| entry)
            .collect();
        // In entry order, so dead letters come out in a stable order.
        expired.sort_unstable();
        for &entry in &expired {
            let Some(claim) = lot.claimed.remove(&entry) else {
                continue;
            };
            if claim.parked.claims >= self.max_attempts {
                let letter = dead_letter(&claim);
                let failed = TaskStatus::Failed(letter.reason.clone());
                lot.ended(entry, &claim.parked.task, Some(failed));
                lot.keep_dead(entry, claim.parked, letter.reason.clone());
                lot.dead.push_back(letter);
            } else {
                lot.park(entry, claim.parked);
            }
        }
        Ok(expired.len())
    }

    async fn take_dead_letters(&self, max: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let mut lot = self.lock();
        let taken = max.min(lot.dead.len());
        Ok(lot.dead.drain(..taken).collect())
    }

    async fn list_dead_letters(
        &self,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<KeptLetter>, QueueError> {
        let lot = self.lock();
        Ok(lot
            .kept
            .iter()
            .skip(offset)
            .take(limit)
            .map(|(entry, parked, reason)| {
                let meta = &parked.task.meta;
                KeptLetter {
                    entry: *entry,
                    task_id: meta.id,
                    key: meta.mailbox.clone().unwrap_or_else(|| MailboxKey::new("")),
                    cost: meta.cost,
                    priority: meta.priority,
                    attempts: parked.claims,
                    reason: reason.clone(),
                }
            })
            .collect())
    }

    /// A dead letter whose caller has a live task again (callers kept unique) stays one:
    /// `Duplicate`.
    async fn retry_dead_letter(&self, entry: EntryId) -> Result<bool, QueueError> {
        let mut lot = self.lock();
        let Some(index) = lot.kept.iter().position(|(kept, ..)| *kept == entry) else {
            return Ok(false);
        };
        if lot.refuses(entry, &lot.kept[index].1.task) {
            return Err(QueueError::Duplicate(entry));
        }
        let Some((_, mut parked, _)) = lot.kept.remove(index) else {
            return Ok(false);
        };
        parked.claims = 0;
        lot.park(entry, parked);
        Ok(true)
    }

    async fn purge_dead_letters(&self, entry: Option<EntryId>) -> Result<usize, QueueError> {
        let mut lot = self.lock();
        let before = lot.kept.len();
        match entry {
            Some(entry) => lot.kept.retain(|(kept, ..)| *kept != entry),
            None => lot.kept.clear(),
        }
        Ok(before - lot.kept.len())
    }

    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        let lot = self.lock();
        Ok(QueueCounts {
            parked: lot.parked.len() + lot.resting.len() + lot.books.len(),
            claimed: lot.claimed.len(),
        })
    }
}
