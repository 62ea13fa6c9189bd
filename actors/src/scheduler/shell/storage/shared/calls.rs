//! The shared mode's messages: the calls the shell asks of the shared queue
//! ([`SharedCall`], an effect like any other) and what their answers report back to the
//! scheduler ([`SharedReport`]), with the pieces they carry.

use ractor::RpcReplyPort;

use crate::domain::{
    MailboxKey, PoolError, Priority, ResourceCost, ResourceKind, ScheduledTask, TaskId, TaskStatus,
    TenantId,
};
use crate::mailbox::actor::Stored;
use crate::observe::trace::TraceParent;
use crate::queue::{
    Carried, Claim, DeadLetter, DependsOn, EntryId, FitQuery, Lease, QueueError, RunUse, Settlement,
};
use crate::scheduler::protocol::Reply;
use crate::scheduler::shell::effects::CancelReply;

/// A call to the shared queue, as the shell asks for it (`io.rs` makes each one in a task of
/// its own, so a slow database never holds up the scheduler).
pub(crate) enum SharedCall<P> {
    /// Park a task for any node; `reply` hears once it is stored (`SharedReport::Enqueued`).
    Enqueue {
        /// Its shared entry id.
        entry: EntryId,
        /// Its admission time: its rank among equal priorities.
        rank_time_ms: u64,
        /// What it carries: claimable by no node before its instant (a scheduled start),
        /// claimed in its trace.
        carried: Carried,
        /// Held until these parents succeed, if set (a queue that keeps dependencies).
        depends_on: Option<DependsOn>,
        task: ScheduledTask<P>,
        key: MailboxKey,
        reply: Reply,
    },
    /// Store a task this node starts at once as its own claim (`SharedReport::Recorded`).
    RecordStart {
        /// The task's local entry.
        entry: EntryId,
        /// Its shared entry id.
        shared_entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        /// The trace it runs in, stored with it for a node that may rescue it.
        trace: Option<TraceParent>,
        now: u64,
    },
    /// Claim up to `max` of the best tasks that fit `query` together (`SharedReport::Claimed`).
    Claim {
        query: FitQuery,
        max: usize,
        now: u64,
    },
    /// End this node's claim on a shared entry.
    Settle {
        claim: Claim,
        settlement: Settlement,
    },
    /// Hand this node's claims back to the queue at once, for any node to claim (a stopping
    /// node's work it will not run).
    Release { claims: Vec<Claim>, now: u64 },
    /// Park this node's claim again after a failed run, for any node to claim from `at_ms`
    /// (the run counted as an attempt).
    Retry {
        claim: Claim,
        at_ms: u64,
        reason: String,
    },
    /// Put `units` back into the fleet's budget of `kind`: a claimed task used fewer.
    GiveBackBudget { kind: ResourceKind, units: u32 },
    /// Settle the fleet's fair-share charge of `tenant`'s claimed task to what its run
    /// used (`SharedFairShare::settle_use`).
    SettleUse { tenant: TenantId, used: RunUse },
    /// Remove the parked task `id` of exactly `key`, for a cancel (`SharedReport::Removed`).
    RemoveTask {
        key: MailboxKey,
        id: TaskId,
        reply: CancelReply,
    },
    /// Renew the leases this node holds (`SharedReport::Lost` names those it lost).
    Renew { held: Vec<EntryId>, now: u64 },
}

/// What a shared-queue call answered, back on the scheduler.
pub(crate) enum SharedReport<P> {
    /// The poll interval passed.
    Poll,
    /// The queue says a task may have been parked (a database notification).
    Wake,
    /// A group of tasks this node handed to the shared queue is stored (or not, each).
    Enqueued(Vec<Enqueued>),
    /// A claim's answer: the leases it took, best-ranked first.
    Claimed(Result<Vec<Lease<P>>, QueueError>),
    /// A cancel's removal from the shared queue.
    Removed {
        key: MailboxKey,
        id: TaskId,
        reply: RpcReplyPort<Result<(), PoolError>>,
        result: Result<Option<ScheduledTask<P>>, QueueError>,
    },
    /// A task started at once is stored as this node's claim (or not); its submitter waits
    /// in the task's record until then.
    Recorded {
        entry: EntryId,
        result: Result<Lease<P>, QueueError>,
    },
    /// Leases a renewal found lost (expired and rescued by another node).
    Lost(Vec<EntryId>),
    /// An outcome that went out under its task's shared claim was published (or fenced out,
    /// or could not be stored): the task's `Ended` step, held back until now.
    Published {
        key: MailboxKey,
        /// The claim it went out under.
        claim: Claim,
        later: EndedLater,
        stored: Stored,
    },
    /// Tasks the queue gave up on: their submitters get a failure.
    Dead(Vec<DeadLetter>),
}

/// The `Ended` step of a task whose outcome goes out under a shared claim, held back until
/// the store answers: told as `Ended` once published, as `LeaseLost` when the claim was lost
/// or the store failed (nothing was published, so this run did not end the task).
pub(crate) struct EndedLater {
    pub task_id: TaskId,
    pub cost: ResourceCost,
    pub status: TaskStatus,
    /// When its run started, if it started here.
    pub since_ms: Option<u64>,
    pub priority: Option<Priority>,
    /// Its trace, and which run this was, as its `Ended` event says them.
    pub trace: Option<TraceParent>,
    pub attempt: Option<u32>,
}

/// One task of a park group, and whether the queue stored it.
pub(crate) struct Enqueued {
    pub task_id: TaskId,
    pub key: MailboxKey,
    pub cost: ResourceCost,
    pub reply: Reply,
    /// Stored, with how many parents it waits for in the queue when it was parked with
    /// some; or why not.
    pub result: Result<Option<u32>, QueueError>,
    /// Not stored, for the task of its caller is live in the queue (callers kept unique):
    /// that task's key, which its submitter gets instead.
    pub attached: Option<MailboxKey>,
}
