//! The serializable domain types, at the path existing code imports them from.

pub use prometheus_parking_lot_actors::domain::{
    ExtraCosts, MailboxKey, Priority, ResourceCost, ResourceKind, TaskId, TenantId,
};
