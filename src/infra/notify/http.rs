//! [`HttpNotifier`]: POSTs one JSON body per terminal event to a webhook.
//!
//! `notify` (called by the scheduler or the mailbox actor once a result is stored) encodes
//! the body, gives it a `delivery_id` and puts it in a bounded outbox, and
//! returns. The notifier's own thread (`parking-lot-webhook-{name}`, with its own
//! current-thread tokio runtime) takes notifications from the outbox into at most
//! `max_in_flight` concurrent deliveries. A delivery sends the same body until the endpoint
//! answers 2xx, retrying transport errors, timeouts, 408, 429 and 5xx with exponential
//! backoff and full jitter up to `max_retries` times; any other answer (3xx, 4xx) is final.
//! A slow or dead endpoint therefore costs outbox space, never the caller's time: the
//! scheduler, the mailbox and other pools go on.
//!
//! At-least-once: a receiver sees a notification twice only when an attempt timed out or
//! failed after the receiver got it; the `delivery_id` is the same on every attempt, so it
//! de-duplicates with it.
//!
//! Secrets: the `Authorization` value is a sensitive header (never printed by the HTTP
//! client) and the HMAC key lives in a signer that never shows it. Neither appears in
//! `Debug`, logs, tracing fields or errors; logged errors leave the URL out too, since a
//! webhook URL may carry a token of its own.

use prometheus_parking_lot_actors::util::random::random_u128;
use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{StatusCode, Url};
use tokio::sync::{Notify, Semaphore};

use super::attempt_span::{AttemptSpan, TRACEPARENT_HEADER};
use super::body;
use super::outbox::Outbox;
use super::signature::{Signer, SIGNATURE_HEADER};
use crate::core::TraceParent;
use crate::core::{Notifier, PoolError, TerminalEvent};
use crate::settings::secret::Secret;
use crate::util::redact;
use crate::util::serde::TaskId;

/// How an [`HttpNotifier`] delivers: the endpoint and its credentials from the config, plus
/// delivery tuning with sensible defaults.
///
/// `Debug` shows the secrets as `Secret(***)` and the URL as its origin only (a webhook's
/// path or query is often its token).
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot::config::Secret;
/// use prometheus_parking_lot::infra::notify::http::HttpNotifierSettings;
///
/// let settings = HttpNotifierSettings::new("https://hooks.example.com/done")
///     .with_name("chat")
///     .with_auth_header(Secret::new("Bearer hunter2"))
///     .with_hmac_secret(Secret::new("whsec"))
///     .with_timeout(Duration::from_secs(2))
///     .with_max_retries(3);
/// assert!(!format!("{settings:?}").contains("hunter2"));
/// assert!(!format!("{settings:?}").contains("/done"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct HttpNotifierSettings {
    name: String,
    base_url: String,
    auth_header: Option<Secret>,
    hmac_secret: Option<Secret>,
    timeout: Duration,
    max_retries: u32,
    backoff_base: Duration,
    backoff_cap: Duration,
    outbox_capacity: usize,
    max_in_flight: usize,
}

impl HttpNotifierSettings {
    /// Per-request timeout unless configured: 5 s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
    /// Retries after the first attempt unless configured: 5.
    pub const DEFAULT_MAX_RETRIES: u32 = 5;
    /// The first retry waits up to this long; each further one up to twice as long.
    pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(250);
    /// No retry waits longer than this.
    pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(30);
    /// Notifications waiting for a delivery slot, at most.
    pub const DEFAULT_OUTBOX_CAPACITY: usize = 10_000;
    /// Deliveries under way at once, at most.
    pub const DEFAULT_MAX_IN_FLIGHT: usize = 8;
    /// The largest `max_in_flight` accepted.
    pub const MAX_IN_FLIGHT: usize = 1_024;

    /// POST to `base_url`, no credentials, defaults for the rest.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            name: "webhook".into(),
            base_url: base_url.into(),
            auth_header: None,
            hmac_secret: None,
            timeout: Self::DEFAULT_TIMEOUT,
            max_retries: Self::DEFAULT_MAX_RETRIES,
            backoff_base: Self::DEFAULT_BACKOFF_BASE,
            backoff_cap: Self::DEFAULT_BACKOFF_CAP,
            outbox_capacity: Self::DEFAULT_OUTBOX_CAPACITY,
            max_in_flight: Self::DEFAULT_MAX_IN_FLIGHT,
        }
    }

    /// Names the delivery thread (`parking-lot-webhook-{name}`) and the logs; usually the
    /// pool's name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sends this `Authorization` value with every request.
    pub fn with_auth_header(mut self, value: Secret) -> Self {
        self.auth_header = Some(value);
        self
    }

    /// Signs every request with this key (see [`signature`](super::signature)).
    pub fn with_hmac_secret(mut self, key: Secret) -> Self {
        self.hmac_secret = Some(key);
        self
    }

    /// How long one request may take, connecting included.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Retries after the first attempt.
    pub fn with_max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = max_retries;
        self
    }

    /// Retry `n` waits a random time between zero and `min(cap, base * 2^(n-1))`.
    pub fn with_backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_cap = cap;
        self
    }

    /// How many notifications may wait for a delivery slot; beyond that the oldest waiting
    /// one is dropped (counted in [`WebhookStats::dropped`]).
    pub fn with_outbox_capacity(mut self, capacity: usize) -> Self {
        self.outbox_capacity = capacity;
        self
    }

    /// How many deliveries may be under way at once.
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight;
        self
    }

    fn check(&self) -> Result<Url, PoolError> {
        let invalid = |problem: &str| PoolError::InvalidConfig(format!("webhook: {problem}"));
        let url = Url::parse(&self.base_url)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https") && url.has_host())
            .ok_or_else(|| {
                invalid("base_url is not a URL; use http://host/path or https://host/path")
            })?;
        if self.timeout.is_zero() {
            return Err(invalid("timeout is 0; use a positive timeout"));
        }
        if self.outbox_capacity == 0 {
            return Err(invalid("outbox capacity is 0; use at least 1"));
        }
        if !(1..=Self::MAX_IN_FLIGHT).contains(&self.max_in_flight) {
            return Err(invalid(&format!(
                "max_in_flight is {}; use 1 to {}",
                self.max_in_flight,
                Self::MAX_IN_FLIGHT
            )));
        }
        Ok(url)
    }
}

impl fmt::Debug for HttpNotifierSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpNotifierSettings")
            .field("name", &self.name)
            .field("base_url", &redact::url(&self.base_url))
            .field("auth_header", &self.auth_header)
            .field("hmac_secret", &self.hmac_secret)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_cap", &self.backoff_cap)
            .field("outbox_capacity", &self.outbox_capacity)
            .field("max_in_flight", &self.max_in_flight)
            .finish()
    }
}

/// What a notifier has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WebhookStats {
    /// Notifications the endpoint accepted (2xx).
    pub delivered: u64,
    /// Attempts that were retried (each failed attempt followed by another).
    pub retries: u64,
    /// Notifications dropped from a full outbox before any attempt.
    pub dropped: u64,
    /// Notifications given up: retries exhausted, or a final answer (3xx, 4xx).
    pub abandoned: u64,
    /// Notifications waiting or under way now.
    pub pending: usize,
}

/// A webhook [`Notifier`]. See the module docs.
///
/// A config naming an `http` notifier gets one from
/// [`build_pools_from_scheduler_config`](crate::build_pools_from_scheduler_config); on the
/// actor API, put it in [`PoolSpec::notifiers`](crate::actors::PoolSpec::notifiers).
/// Dropping it stops its thread; whatever is still pending then is abandoned with a warning
/// (a pool's shutdown [flushes](Notifier::flush) it first, up to the drain deadline).
///
/// ```
/// use std::sync::Arc;
/// use prometheus_parking_lot::core::{Notifier, TaskStatus, TerminalEvent};
/// use prometheus_parking_lot::infra::notify::http::{HttpNotifier, HttpNotifierSettings};
/// use prometheus_parking_lot::MailboxKey;
///
/// let notifier = HttpNotifier::new(HttpNotifierSettings::new("http://127.0.0.1:9/hook"))?;
/// notifier.notify(&TerminalEvent {
///     pool: Arc::from("chat"),
///     key: MailboxKey::new("acme"),
///     task_id: 7,
///     status: TaskStatus::Completed,
///     stored_at_ms: 1_700_000_000_000,
///     attempt: 1,
///     result: None,
///     trace: None,
/// }); // returns at once; the POST happens on the notifier's thread
/// assert_eq!(notifier.stats().delivered + notifier.stats().dropped, 0);
/// # Ok::<(), prometheus_parking_lot::PoolError>(())
/// ```
pub struct HttpNotifier {
    shared: Arc<Shared>,
}

impl HttpNotifier {
    /// Checks the settings, builds the HTTP client and starts the delivery thread.
    pub fn new(settings: HttpNotifierSettings) -> Result<Self, PoolError> {
        let url = settings.check()?;
        let sender = Sender::new(&settings, url)?;
        let shared = Arc::new(Shared {
            name: Arc::from(settings.name.as_str()),
            outbox: Mutex::new(Outbox::new(settings.outbox_capacity)),
            waiting: Notify::new(),
            closing: Notify::new(),
            idle: Notify::new(),
            unfinished: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            delivery_prefix: u64::try_from(random_u128() >> 64).unwrap_or_default(),
            deliveries: AtomicU64::new(0),
            counters: Counters {
                #[cfg(feature = "metrics")]
                metrics: crate::metrics::WebhookMetrics::register(&settings.name),
                ..Counters::default()
            },
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| {
                PoolError::Internal(format!("webhook: could not start its runtime: {error}"))
            })?;
        let worker = shared.clone();
        let slots = settings.max_in_flight;
        std::thread::Builder::new()
            .name(format!("parking-lot-webhook-{}", settings.name))
            .spawn(move || {
                runtime.block_on(deliver_all(worker.clone(), Arc::new(sender), slots));
                worker.report_abandoned_at_close();
            })
            .map_err(|error| {
                PoolError::Internal(format!("webhook: could not start its thread: {error}"))
            })?;
        Ok(Self { shared })
    }

    /// What the notifier has done so far.
    pub fn stats(&self) -> WebhookStats {
        self.shared.counters.snapshot(&self.shared.unfinished)
    }
}

impl fmt::Debug for HttpNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpNotifier")
            .field("name", &self.shared.name)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Notifier for HttpNotifier {
    fn notify(&self, event: &TerminalEvent) {
        let delivery_id = self.shared.next_delivery_id();
        match body::encode(event, &delivery_id) {
            Ok(body) => self.shared.push(Pending {
                delivery_id,
                task_id: event.task_id,
                body,
                trace: event.trace,
            }),
            Err(error) => tracing::error!(
                pool = %self.shared.name,
                task_id = event.task_id,
                %error,
                "webhook: could not encode a notification; it is not sent"
            ),
        }
    }

    async fn flush(&self, deadline: Option<Instant>) {
        let idle = self.shared.idle();
        let Some(deadline) = deadline else {
            return idle.await;
        };
        if tokio::time::timeout_at(deadline.into(), idle)
            .await
            .is_err()
        {
            tracing::warn!(
                pool = %self.shared.name,
                pending = self.shared.unfinished.load(Ordering::Acquire),
                "webhook: the drain deadline passed with notifications still pending"
            );
        }
    }
}

impl Drop for HttpNotifier {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.closing.notify_waiters();
        self.shared.waiting.notify_waiters();
    }
}

/// One notification: its body, sent as it is on every attempt.
struct Pending {
    delivery_id: String,
    task_id: TaskId,
    body: Vec<u8>,
    /// The trace of the task, sent as each attempt's `traceparent`.
    trace: Option<TraceParent>,
}

/// What the notifier's handle and its thread share.
struct Shared {
    name: Arc<str>,
    outbox: Mutex<Outbox<Pending>>,
    /// A notification was pushed.
    waiting: Notify,
    /// The notifier was dropped.
    closing: Notify,
    /// Nothing is waiting or under way any more.
    idle: Notify,
    /// Notifications waiting or under way.
    unfinished: AtomicUsize,
    closed: AtomicBool,
    /// Random per notifier: delivery ids of different notifiers and processes differ.
    delivery_prefix: u64,
    /// Notifications numbered so far: delivery ids within this notifier differ.
    deliveries: AtomicU64,
    counters: Counters,
}

impl Shared {
    /// A fresh delivery id: 32 hex digits, the notifier's random prefix and a sequence
    /// number (no system call on the caller's thread).
    fn next_delivery_id(&self) -> String {
        let sequence = self.deliveries.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{sequence:016x}", self.delivery_prefix)
    }

    fn push(&self, pending: Pending) {
        self.unfinished.fetch_add(1, Ordering::AcqRel);
        let overflow = match self.outbox.lock() {
            Ok(mut outbox) => outbox.push(pending),
            Err(poisoned) => poisoned.into_inner().push(pending),
        };
        if let Some(overflow) = overflow {
            let dropped = self.counters.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            #[cfg(feature = "metrics")]
            self.counters.metrics.dropped.increment(1);
            let (task_id, delivery_id) = (overflow.dropped.task_id, &overflow.dropped.delivery_id);
            if overflow.first {
                tracing::warn!(pool = %self.name, task_id, delivery_id, dropped_total = dropped,
                    "webhook: outbox full; dropping the oldest pending notifications (their results stay stored)");
            } else {
                tracing::debug!(pool = %self.name, task_id, delivery_id, dropped_total = dropped,
                    "webhook: outbox full; dropped a notification");
            }
            self.finished();
        }
        self.waiting.notify_one();
    }

    /// The next notification, once one waits; `None` once the notifier is dropped.
    async fn next(&self) -> Option<Pending> {
        loop {
            let mut pushed = pin!(self.waiting.notified());
            pushed.as_mut().enable();
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            let next = match self.outbox.lock() {
                Ok(mut outbox) => outbox.pop(),
                Err(poisoned) => poisoned.into_inner().pop(),
            };
            if next.is_some() {
                return next;
            }
            pushed.await;
        }
    }

    /// Resolves once the notifier is dropped.
    async fn closed(&self) {
        loop {
            let mut closing = pin!(self.closing.notified());
            closing.as_mut().enable();
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            closing.await;
        }
    }

    /// Resolves once nothing is waiting or under way.
    async fn idle(&self) {
        loop {
            let mut idle = pin!(self.idle.notified());
            idle.as_mut().enable();
            if self.unfinished.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// One notification is done with (delivered, abandoned or dropped).
    fn finished(&self) {
        if self.unfinished.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    fn report_abandoned_at_close(&self) {
        let left = self.unfinished.load(Ordering::Acquire);
        if left > 0 {
            tracing::warn!(pool = %self.name, pending = left,
                "webhook: the notifier was dropped with notifications still pending; they are not sent (their results stay stored)");
        }
    }
}

#[derive(Default)]
struct Counters {
    delivered: AtomicU64,
    retries: AtomicU64,
    dropped: AtomicU64,
    abandoned: AtomicU64,
    /// The same failures, for the metrics recorder.
    #[cfg(feature = "metrics")]
    metrics: crate::metrics::WebhookMetrics,
}

impl Counters {
    fn snapshot(&self, unfinished: &AtomicUsize) -> WebhookStats {
        WebhookStats {
            delivered: self.delivered.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            abandoned: self.abandoned.load(Ordering::Relaxed),
            pending: unfinished.load(Ordering::Acquire),
        }
    }
}

/// The delivery thread's loop: a free slot, then the next notification, delivered on a
/// task of its own; until the notifier is dropped (its runtime then drops what is under
/// way).
async fn deliver_all(shared: Arc<Shared>, sender: Arc<Sender>, slots: usize) {
    let slots = Arc::new(Semaphore::new(slots));
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot,
            () = shared.closed() => return,
        };
        let Ok(slot) = slot else { return };
        let Some(pending) = shared.next().await else {
            return;
        };
        let (shared, sender) = (shared.clone(), sender.clone());
        tokio::spawn(async move {
            sender.deliver(&shared, &pending).await;
            drop(slot);
            shared.finished();
        });
    }
}

/// What one attempt came to.
enum Attempt {
    /// 2xx.
    Delivered,
    /// Worth another try: transport error, timeout, 408, 429, 5xx.
    Failed(String),
    /// Final: any other answer.
    Refused(String),
}

/// Sends requests: the client, the endpoint and the credentials.
struct Sender {
    client: reqwest::Client,
    url: Url,
    auth_header: Option<HeaderValue>,
    signer: Option<Signer>,
    max_retries: u32,
    backoff_base: Duration,
    backoff_cap: Duration,
}

impl Sender {
    fn new(settings: &HttpNotifierSettings, url: Url) -> Result<Self, PoolError> {
        let auth_header = match &settings.auth_header {
            Some(secret) => {
                let mut value = HeaderValue::from_str(secret.expose()).map_err(|_| {
                    PoolError::InvalidConfig(
                        "webhook: auth_header is not a valid HTTP header value; use visible \
                         ASCII characters, spaces and tabs (the value is secret and not shown)"
                            .into(),
                    )
                })?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!(
                "prometheus_parking_lot/",
                env!("CARGO_PKG_VERSION")
            ))
            .build()
            .map_err(|error| {
                PoolError::Internal(format!(
                    "webhook: could not build its HTTP client: {}",
                    describe(error)
                ))
            })?;
        Ok(Self {
            client,
            url,
            auth_header,
            signer: settings
                .hmac_secret
                .as_ref()
                .map(|key| Signer::new(key.expose().as_bytes())),
            max_retries: settings.max_retries,
            backoff_base: settings.backoff_base,
            backoff_cap: settings.backoff_cap,
        })
    }

    /// Sends until delivered, refused, or out of retries; counts the outcome.
    async fn deliver(&self, shared: &Shared, pending: &Pending) {
        let counters = &shared.counters;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (failure, retry) = match self.attempt(&shared.name, pending, attempts).await {
                Attempt::Delivered => {
                    counters.delivered.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Attempt::Failed(failure) => (failure, attempts <= self.max_retries),
                Attempt::Refused(failure) => (failure, false),
            };
            if !retry {
                counters.abandoned.fetch_add(1, Ordering::Relaxed);
                #[cfg(feature = "metrics")]
                counters.metrics.abandoned.increment(1);
                tracing::warn!(pool = %shared.name, task_id = pending.task_id,
                    delivery_id = %pending.delivery_id, attempts, %failure,
                    "webhook: notification not delivered; giving up (the result stays stored)");
                return;
            }
            counters.retries.fetch_add(1, Ordering::Relaxed);
            #[cfg(feature = "metrics")]
            counters.metrics.attempt_failed.increment(1);
            let delay = full_jitter(self.backoff_base, self.backoff_cap, attempts);
            tracing::debug!(pool = %shared.name, task_id = pending.task_id,
                delivery_id = %pending.delivery_id, attempts, %failure,
                retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "webhook: attempt failed; retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// Attempt number `number` of `pending`, a notification of pool `pool`.
    async fn attempt(&self, pool: &str, pending: &Pending, number: u32) -> Attempt {
        let span = pending
            .trace
            .map(|trace| AttemptSpan::start(&trace, pool, number));
        let mut request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(pending.body.clone());
        if let Some(value) = &self.auth_header {
            request = request.header(AUTHORIZATION, value.clone());
        }
        if let Some(signer) = &self.signer {
            request = request.header(SIGNATURE_HEADER, signer.header(now_ms(), &pending.body));
        }
        if let Some(span) = &span {
            request = request.header(TRACEPARENT_HEADER, span.traceparent().to_string());
        }
        let (attempt, status) = match request.send().await {
            Ok(response) => (judge(response.status()), Some(response.status().as_u16())),
            Err(error) => (Attempt::Failed(describe(error)), None),
        };
        if let Some(span) = span {
            let failure = match &attempt {
                Attempt::Delivered => None,
                Attempt::Failed(failure) | Attempt::Refused(failure) => Some(failure.as_str()),
            };
            span.end(status, failure);
        }
        attempt
    }
}

/// What an answer means for the notification.
fn judge(status: StatusCode) -> Attempt {
    if status.is_success() {
        return Attempt::Delivered;
    }
    let retryable = status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS;
    let answer = format!("the endpoint answered {status}");
    if retryable {
        Attempt::Failed(answer)
    } else {
        Attempt::Refused(answer)
    }
}

/// A transport error with its causes, without the URL or any other credential.
fn describe(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(&error);
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    redact::text(&text)
}

/// Retry `attempt` (1 for the first retry) waits a uniformly random time in
/// `[0, min(cap, base * 2^(attempt-1))]` ("full jitter"): retries of many notifications
/// spread out instead of arriving together.
fn full_jitter(base: Duration, cap: Duration, attempt: u32) -> Duration {
    let ceiling = base
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(31))
        .min(cap);
    let ceiling_ns = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    if ceiling_ns == 0 {
        return Duration::ZERO;
    }
    let draw = u64::try_from(random_u128() >> 64).unwrap_or(u64::MAX);
    Duration::from_nanos(draw % ceiling_ns.saturating_add(1))
}

fn now_ms() -> u64 {
    u64::try_from(crate::util::clock::now_ms()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_jitter_stays_under_a_doubling_ceiling_and_the_cap() {
        let (base, cap) = (Duration::from_millis(100), Duration::from_millis(1_000));
        for attempt in 1..=40 {
            let ceiling = match attempt {
                1 => 100,
                2 => 200,
                3 => 400,
                4 => 800,
                _ => 1_000,
            };
            for _ in 0..50 {
                let delay = full_jitter(base, cap, attempt);
                assert!(
                    delay <= Duration::from_millis(ceiling),
                    "{attempt}: {delay:?}"
                );
            }
        }
        assert_eq!(full_jitter(Duration::ZERO, cap, 3), Duration::ZERO);
        let spread: std::collections::HashSet<Duration> =
            (0..20).map(|_| full_jitter(base, cap, 5)).collect();
        assert!(
            spread.len() > 10,
            "jitter should spread retries: {spread:?}"
        );
    }

    #[test]
    fn answers_are_judged_retryable_or_final() {
        let kind = |code: u16| match judge(StatusCode::from_u16(code).unwrap()) {
            Attempt::Delivered => "delivered",
            Attempt::Failed(_) => "retry",
            Attempt::Refused(_) => "final",
        };
        for (code, expected) in [
            (200, "delivered"),
            (204, "delivered"),
            (301, "final"),
            (400, "final"),
            (401, "final"),
            (404, "final"),
            (408, "retry"),
            (429, "retry"),
            (500, "retry"),
            (503, "retry"),
        ] {
            assert_eq!(kind(code), expected, "HTTP {code}");
        }
    }

    #[test]
    fn delivery_ids_differ_within_and_across_notifiers() {
        let start = || HttpNotifier::new(HttpNotifierSettings::new("http://127.0.0.1:9/x"));
        let (one, two) = (start().unwrap(), start().unwrap());
        let ids: std::collections::HashSet<String> = (0..100)
            .flat_map(|_| [one.shared.next_delivery_id(), two.shared.next_delivery_id()])
            .collect();
        assert_eq!(ids.len(), 200);
        assert!(ids.iter().all(|id| id.len() == 32));
    }

    #[test]
    fn bad_settings_are_refused_with_the_problem_named() {
        let refused = |settings: HttpNotifierSettings| match HttpNotifier::new(settings) {
            Err(PoolError::InvalidConfig(problem)) => problem,
            other => panic!("accepted: {other:?}"),
        };
        assert!(refused(HttpNotifierSettings::new("ftp://h/x")).contains("base_url"));
        assert!(
            refused(HttpNotifierSettings::new("http://h/x").with_timeout(Duration::ZERO))
                .contains("timeout")
        );
        assert!(
            refused(HttpNotifierSettings::new("http://h/x").with_outbox_capacity(0))
                .contains("outbox")
        );
        assert!(
            refused(HttpNotifierSettings::new("http://h/x").with_max_in_flight(0))
                .contains("max_in_flight")
        );
        let secret = "Bearer s3cr3t\r\nX-Injected: 1";
        let problem =
            refused(HttpNotifierSettings::new("http://h/x").with_auth_header(Secret::new(secret)));
        assert!(
            problem.contains("auth_header") && !problem.contains("s3cr3t"),
            "{problem}"
        );
    }
}
