//! Property tests of a budget a fleet shares (the in-memory shared queue, the reference
//! backend): whatever the nodes claim and whenever, the units they take together in any span
//! of time stay within the bucket's bound, `burst + units × span / per`.

use std::time::Duration;

use proptest::prelude::*;

use prometheus_parking_lot::core::{
    Budget, Budgets, Capacity, FitQuery, ScheduledTask, Settlement, SharedBudgets, SharedQueue,
    TaskMetadata,
};
use prometheus_parking_lot::infra::queue::shared_memory::InMemorySharedQueue;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost, ResourceKind};

/// One claim: after `advance_ms`, node `node` claims at most `max` tasks.
#[derive(Debug, Clone)]
struct Step {
    advance_ms: u64,
    node: usize,
    max: usize,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0u64..400, 0usize..3, 1usize..6).prop_map(|(advance_ms, node, max)| Step {
            advance_ms,
            node,
            max,
        }),
        1..60,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn what_the_nodes_claim_together_stays_within_the_bound(
        units in 1u32..50,
        per_ms in 100u64..2_000,
        burst in 1u32..40,
        costs in prop::collection::vec(0u32..40, 20..120),
        steps in steps(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let claims: Vec<(u64, u64)> = runtime.block_on(async {
            let queue = InMemorySharedQueue::<u32>::new();
            let budget = Budget { units, per_ms, burst, max_starts: None };
            queue
                .share_budgets(&Budgets::none().with(ResourceKind::Io, budget))
                .await
                .unwrap();
            for (entry, cost) in costs.iter().enumerate() {
                let meta = TaskMetadata::new(entry as u64, ResourceCost::io(*cost % (burst + 1)))
                    .with_mailbox(MailboxKey::new("t"));
                queue.enqueue(entry as u64, 0, ScheduledTask::new(meta, 0)).await.unwrap();
            }
            let nodes = ["a", "b", "c"];
            let plenty = FitQuery::within(Capacity::uniform(0).with(ResourceKind::Io, 1_000));
            let mut now = 0;
            let mut claims = Vec::new();
            for step in &steps {
                now += step.advance_ms;
                let node = nodes[step.node];
                let leases = queue
                    .claim_batch(node, &plenty, step.max, Duration::from_secs(60), now)
                    .await
                    .unwrap();
                let spent: u64 = leases.iter().map(|l| u64::from(l.task.meta.cost.units)).sum();
                for lease in leases {
                    queue.settle(node, lease.claim(), Settlement::Done).await.unwrap();
                }
                claims.push((now, spent));
            }
            claims
        });
        for i in 0..claims.len() {
            let mut spent = 0;
            for j in i..claims.len() {
                spent += claims[j].1;
                let span = claims[j].0 - claims[i].0;
                let bound = u64::from(burst) + u64::from(units) * span / per_ms;
                prop_assert!(
                    spent <= bound,
                    "claims {i}..={j} took {spent} units in {span} ms; the bound is {bound}"
                );
            }
        }
    }
}
