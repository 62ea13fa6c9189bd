//! NOTIFY without the commit queue: [`Announcer`].
//!
//! PostgreSQL serialises the commits of transactions that sent `NOTIFY` (they take one lock
//! on the notification queue while committing), so a `NOTIFY` inside every park or result
//! store would make those commits wait in line. The backends commit their rows without it and
//! hand the announcement here instead: one task per database handle sends what has gathered,
//! each channel once per round with its payloads joined by `,`, in a transaction of its own,
//! and gathers again while that round is in flight. Listeners see a row only after it is
//! committed, and a burst of a thousand parks costs a handful of notifications.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use sea_orm::{ConnectionTrait, DatabaseConnection, Value};

use super::PgDatabase;

/// The longest payload one notification carries (PostgreSQL refuses 8,000 bytes and more).
const MAX_PAYLOAD: usize = 7_000;

/// Gathers announcements and sends them, coalesced, from one task at a time.
#[derive(Default)]
pub(crate) struct Announcer {
    state: Mutex<Gathered>,
}

#[derive(Default)]
struct Gathered {
    /// Payloads waiting per channel (an empty payload means "look again").
    pending: HashMap<String, BTreeSet<String>>,
    /// Whether a task is sending.
    sending: bool,
}

impl Announcer {
    /// Announces `payload` on `channel` soon, on `database`'s runtime.
    pub(crate) fn announce(
        self: &Arc<Self>,
        database: &PgDatabase,
        channel: &str,
        payload: String,
    ) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .pending
            .entry(channel.to_owned())
            .or_default()
            .insert(payload);
        if state.sending {
            return;
        }
        state.sending = true;
        drop(state);
        let announcer = Arc::clone(self);
        let connection = database.connection().clone();
        database.spawn(async move { announcer.send_all(connection).await });
    }

    /// Sends rounds until nothing is pending.
    async fn send_all(self: Arc<Self>, connection: DatabaseConnection) {
        loop {
            let round = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                if state.pending.is_empty() {
                    state.sending = false;
                    return;
                }
                std::mem::take(&mut state.pending)
            };
            let mut channels = Vec::new();
            let mut payloads = Vec::new();
            for (channel, gathered) in round {
                for payload in joined(gathered) {
                    channels.push(channel.clone());
                    payloads.push(payload);
                }
            }
            let statement = PgDatabase::statement(
                "SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS n(c, p)",
                [Value::from(channels.clone()), Value::from(payloads.clone())],
            );
            if let Err(error) = connection.execute_raw(statement).await {
                // Listeners also poll: a lost announcement delays work, it never loses any.
                tracing::warn!(error = %super::describe(&error), "postgres NOTIFY failed; nodes will find the work at their next poll");
            }
        }
    }
}

/// The payloads of one channel joined by `,` into as few notifications as fit.
fn joined(payloads: BTreeSet<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for payload in payloads {
        match out.last_mut() {
            Some(last) if last.len() + 1 + payload.len() <= MAX_PAYLOAD => {
                if !last.is_empty() && !payload.is_empty() {
                    last.push(',');
                }
                last.push_str(&payload);
            }
            _ => out.push(payload),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_joined_and_split_below_the_limit() {
        let few: BTreeSet<String> = ["a1", "b2", ""].iter().map(|s| s.to_string()).collect();
        assert_eq!(joined(few), vec!["a1,b2".to_string()]);
        let many: BTreeSet<String> = (0..2_000).map(|n| format!("{n:016x}")).collect();
        let notes = joined(many);
        assert!(notes.len() >= 4, "{} notifications", notes.len());
        assert!(notes.iter().all(|note| note.len() <= MAX_PAYLOAD));
        let back: usize = notes.iter().map(|note| note.split(',').count()).sum();
        assert_eq!(back, 2_000, "every payload is sent once");
    }
}
