//! Dependencies between tasks through a `WorkerPool` (the contract every supporting queue
//! keeps is `tests/conformance/dependencies.rs`): what a held task's events say, and what a
//! child submitted from inside a running task inherits from it.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{
    PoolError, SubmitOptions, TaskMetadata, TaskStatus, TaskStep, WorkerExecutor, WorkerPool,
};
use prometheus_parking_lot::util::serde::{MailboxKey, Priority, ResourceCost, TaskId};
use tokio::sync::watch;

const PATIENCE: Duration = Duration::from_secs(10);

/// What a step does.
#[derive(Debug, Clone)]
enum Step {
    /// Waits for the gate, then fails.
    FailAfterGate,
    /// Returns at once.
    Quick,
    /// Submits one child (`Quick`, with `child_meta`) from inside its run and returns the
    /// tenant of the key it got and its result.
    Spawn { child_meta: TaskMetadata },
}

/// Runs steps; remembers the metadata each ran with.
#[derive(Clone)]
struct Steps {
    pool: Arc<OnceLock<Arc<WorkerPool<Step, String, Steps>>>>,
    gate: watch::Receiver<bool>,
    ran: Arc<Mutex<Vec<TaskMetadata>>>,
}

#[async_trait]
impl WorkerExecutor<Step, String> for Steps {
    async fn execute(&self, step: Step, meta: TaskMetadata) -> String {
        self.ran.lock().unwrap().push(meta.clone());
        match step {
            Step::Quick => format!("step {}", meta.id),
            Step::FailAfterGate => {
                let mut gate = self.gate.clone();
                let _ = gate.wait_for(|open| *open).await;
                panic!("step {} failed", meta.id);
            }
            Step::Spawn { child_meta } => {
                let pool = self.pool.get().expect("pool set").clone();
                let key = pool
                    .submit_async(Step::Quick, child_meta)
                    .await
                    .expect("child admitted");
                let result = pool
                    .retrieve_async(&key, PATIENCE)
                    .await
                    .unwrap_or_else(|error| format!("error: {error}"));
                format!("{}: {result}", key.tenant.0)
            }
        }
    }
}

struct Lab {
    pool: Arc<WorkerPool<Step, String, Steps>>,
    gate: watch::Sender<bool>,
    ran: Arc<Mutex<Vec<TaskMetadata>>>,
}

fn lab() -> Lab {
    let (gate, gate_rx) = watch::channel(false);
    let executor = Steps {
        pool: Arc::new(OnceLock::new()),
        gate: gate_rx,
        ran: Arc::new(Mutex::new(Vec::new())),
    };
    let config = WorkerPoolConfig::new()
        .with_name("dependencies")
        .with_worker_count(3)
        .with_max_units(3);
    let pool = Arc::new(WorkerPool::new(config, executor.clone()).expect("pool starts"));
    assert!(executor.pool.set(pool.clone()).is_ok());
    Lab {
        pool,
        gate,
        ran: executor.ran,
    }
}

fn meta(tenant: &str, id: TaskId) -> TaskMetadata {
    let key = MailboxKey::new(tenant).with_session(format!("step-{id}"));
    TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_of_a_failed_parent_says_which_parent_and_ends_cancelled() {
    let lab = lab();
    let mut events = lab.pool.events();
    let parent = lab
        .pool
        .submit_async(Step::FailAfterGate, meta("plan", 1))
        .await
        .expect("parent admitted");
    let options = SubmitOptions::default().with_depends_on([1]);
    let child = lab
        .pool
        .submit_with(Step::Quick, meta("plan", 2), options)
        .await
        .expect("child admitted");
    let _ = lab.gate.send(true);
    assert!(matches!(
        lab.pool.retrieve_async(&parent, PATIENCE).await,
        Err(PoolError::Failed(_))
    ));
    assert_eq!(
        lab.pool.retrieve_async(&child, PATIENCE).await,
        Err(PoolError::Cancelled)
    );
    let mut child_steps = Vec::new();
    while let Ok(event) = events.try_recv() {
        if event.task_id == 2 {
            child_steps.push(event.step);
        }
    }
    assert_eq!(
        child_steps[..2],
        [TaskStep::Admitted, TaskStep::Parked],
        "{child_steps:?}"
    );
    assert_eq!(child_steps[2], TaskStep::WaitsForParents { pending: 1 });
    assert!(
        matches!(
            &child_steps[3],
            TaskStep::ParentFailed {
                parent: 1,
                status: TaskStatus::Failed(_)
            }
        ),
        "{child_steps:?}"
    );
    assert_eq!(child_steps[4], TaskStep::Ended(TaskStatus::Cancelled));
    assert_eq!(child_steps.len(), 5, "{child_steps:?}");
    assert!(
        lab.ran.lock().unwrap().iter().all(|ran| ran.id != 2),
        "the child never ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_submitted_from_inside_a_task_inherits_its_tenant_and_priority() {
    let lab = lab();
    // Submitted with no key and a lower priority: it takes the parent's tenant and priority.
    let child_meta = TaskMetadata::new(11, ResourceCost::cpu(1)).with_priority(Priority::Low);
    let parent_meta = meta("agent-7", 10).with_priority(Priority::High);
    let key = lab
        .pool
        .submit_async(Step::Spawn { child_meta }, parent_meta)
        .await
        .expect("admitted");
    assert_eq!(
        lab.pool.retrieve_async(&key, PATIENCE).await,
        Ok("agent-7: step 11".to_owned())
    );
    // Raised explicitly above the parent's: kept.
    let child_meta = TaskMetadata::new(13, ResourceCost::cpu(1)).with_priority(Priority::Critical);
    let key = lab
        .pool
        .submit_async(Step::Spawn { child_meta }, meta("agent-7", 12))
        .await
        .expect("admitted");
    assert_eq!(
        lab.pool.retrieve_async(&key, PATIENCE).await,
        Ok("agent-7: step 13".to_owned())
    );
    let ran = lab.ran.lock().unwrap().clone();
    let child = ran.iter().find(|meta| meta.id == 11).expect("child 11 ran");
    assert_eq!(child.priority, Priority::High);
    let raised = ran.iter().find(|meta| meta.id == 13).expect("child 13 ran");
    assert_eq!(raised.priority, Priority::Critical);
    // A task submitted from outside any run inherits nothing.
    let outside = TaskMetadata::new(14, ResourceCost::cpu(1)).with_priority(Priority::Low);
    let key = lab
        .pool
        .submit_async(Step::Quick, outside)
        .await
        .expect("admitted");
    lab.pool
        .retrieve_async(&key, PATIENCE)
        .await
        .expect("a result");
    let ran = lab.ran.lock().unwrap().clone();
    let alone = ran.iter().find(|meta| meta.id == 14).expect("task 14 ran");
    assert_eq!(alone.priority, Priority::Low);
    assert!(
        key.is_anonymous(),
        "no tenant given to a task from outside a run"
    );
}
