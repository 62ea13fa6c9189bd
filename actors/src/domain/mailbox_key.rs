//! Mailbox addresses.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The tenant that owns a mailbox. Every mailbox backend filters by tenant, so a key of one
/// tenant never reads another tenant's results.
///
/// It compares with its name as text, either way round:
///
/// ```
/// use prometheus_parking_lot_actors::domain::MailboxKey;
///
/// let key = MailboxKey::new("acme");
/// assert!(key.tenant == "acme");
/// assert!(key.tenant == String::from("acme"));
/// assert!("acme" == key.tenant);
/// assert!(key.tenant != "globex");
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(transparent)]
pub struct TenantId(pub String);

impl From<String> for TenantId {
    fn from(tenant: String) -> Self {
        Self(tenant)
    }
}

impl From<&str> for TenantId {
    fn from(tenant: &str) -> Self {
        Self(tenant.to_owned())
    }
}

/// A tenant compares with its name as text: `key.tenant == "acme"`.
impl PartialEq<str> for TenantId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for TenantId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for TenantId {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl PartialEq<TenantId> for str {
    fn eq(&self, other: &TenantId) -> bool {
        self == other.0
    }
}

impl PartialEq<TenantId> for &str {
    fn eq(&self, other: &TenantId) -> bool {
        *self == other.0
    }
}

impl PartialEq<TenantId> for String {
    fn eq(&self, other: &TenantId) -> bool {
        *self == other.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How the tenants of [`MailboxKey::anonymous`] keys begin.
const ANONYMOUS_PREFIX: &str = "anonymous-";

/// Names an inbox: a tenant, optionally narrowed to a user and a session. One result is
/// addressed by a key and its task id.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MailboxKey {
    /// The owning tenant.
    pub tenant: TenantId,
    /// The user within the tenant, if any.
    pub user_id: Option<String>,
    /// The session within the user, if any.
    pub session_id: Option<String>,
}

impl MailboxKey {
    /// A key for the whole of `tenant`.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::MailboxKey;
    /// let key = MailboxKey::new("acme").with_user("ada");
    /// assert_eq!(key.tenant.0, "acme");
    /// assert_eq!(key.user_id.as_deref(), Some("ada"));
    /// ```
    pub fn new(tenant: impl Into<TenantId>) -> Self {
        Self {
            tenant: tenant.into(),
            user_id: None,
            session_id: None,
        }
    }

    /// A fresh key that nobody can guess or pre-fill: its tenant is `anonymous-` followed by
    /// 128 random bits from the operating system's CSPRNG, so it is a tenant of its own. A
    /// pool gives every task submitted without a mailbox one of these.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::MailboxKey;
    /// let (a, b) = (MailboxKey::anonymous(), MailboxKey::anonymous());
    /// assert_ne!(a, b);
    /// assert!(a.tenant.0.starts_with("anonymous-"));
    /// assert_eq!(a.tenant.0.len(), "anonymous-".len() + 32);
    /// ```
    pub fn anonymous() -> Self {
        Self::anonymous_from_bits(crate::util::random::random_u128())
    }

    /// The anonymous key whose tenant carries `bits` (see [`anonymous_bits`](Self::anonymous_bits)).
    pub(crate) fn anonymous_from_bits(bits: u128) -> Self {
        Self::new(format!("{ANONYMOUS_PREFIX}{bits:032x}"))
    }

    /// The 128 bits of a tenant that [`anonymous`](Self::anonymous) made, when the tenant is
    /// exactly such a name (`anonymous-` and 32 lowercase hex digits): the engine keeps these
    /// 16 bytes instead of the 42-byte name for tasks that wait.
    pub(crate) fn anonymous_bits(tenant: &TenantId) -> Option<u128> {
        let digits = tenant.0.strip_prefix(ANONYMOUS_PREFIX)?;
        let lowercase_hex = digits.len() == 32
            && digits
                .bytes()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte));
        if !lowercase_hex {
            return None;
        }
        u128::from_str_radix(digits, 16).ok()
    }

    /// Whether the tenant is one [`anonymous`](Self::anonymous) made up (or a caller named
    /// like one). A pool's fair share counts all such tenants as one.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::MailboxKey;
    /// assert!(MailboxKey::anonymous().is_anonymous());
    /// assert!(!MailboxKey::new("acme").is_anonymous());
    /// ```
    pub fn is_anonymous(&self) -> bool {
        self.tenant.0.starts_with(ANONYMOUS_PREFIX)
    }

    /// The same key narrowed to a user.
    pub fn with_user(mut self, user_id: impl Into<String>) -> Self {
        self.user_id = Some(user_id.into());
        self
    }

    /// The same key narrowed to a session.
    pub fn with_session(mut self, session_id: impl Into<String>) -> Self {
        self.session_id = Some(session_id.into());
        self
    }
}

impl From<String> for MailboxKey {
    fn from(tenant: String) -> Self {
        Self::new(tenant)
    }
}

impl From<&str> for MailboxKey {
    fn from(tenant: &str) -> Self {
        Self::new(tenant)
    }
}
