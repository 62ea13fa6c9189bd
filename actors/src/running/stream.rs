//! Streamed results: partial values an executor emits while it runs, received as a
//! [`futures_util::Stream`] (or a blocking iterator) by the task's submitter.
//!
//! # How a stream works
//!
//! `submit_streaming` creates one shared buffer for the task. The executor finds the
//! sending face, [`Partials`], through [`running::partials`](crate::running::partials) and
//! sends into it; the submitter holds the receiving face, [`ResultStream`]. The buffer holds
//! at most `buffer` partials: a sender waits (async) or blocks (sync) while it is full, so a
//! slow reader slows only its own task, on its own worker. When the run is over the
//! scheduler puts the final outcome (the executor's return value, or the error that ended
//! the task) behind the partials: the stream yields every partial, then the final item,
//! then ends. Streamed outcomes go to the stream only, not to the mailbox.
//!
//! The task holds its capacity and its worker until the executor returns, so the units
//! cover the whole generation, not just its setup. Dropping the [`ResultStream`] before
//! its end cancels the task: the flag [`running::is_cancelled`](crate::running::is_cancelled)
//! reads is raised, the executor's next send fails with [`StreamClosed`], an async executor's
//! future is dropped at once, and a task still parked ends `Cancelled` when it would have
//! started. Either way its capacity comes back as soon as its executor stops.
//!
//! A reader that stays but reads nothing would hold the task's units for ever, its executor
//! waiting on a full buffer. So the pool bounds that wait (`PoolLimits::stream_idle_ms`,
//! five minutes by default): a send that finds the buffer full and waits that long with
//! nothing read fails with [`StreamClosed`] and raises the task's cancellation flag; the
//! task ends `Cancelled` and frees its units when its executor returns. The partials that
//! waited stay readable, then the stream yields `Cancelled`. (An async send bounds its wait
//! with tokio's timer, which the pool's worker threads have; sent from a thread with no
//! tokio runtime, only [`Partials::send_blocking`] is bounded.)

use std::any::Any;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures_util::Stream;

use crate::domain::PoolError;
use crate::running::cancellation::Cancellation;
use crate::sync::parker::block_on_until;
use crate::util::contain::drop_contained;

/// The smallest stream buffer: one partial.
pub const MIN_STREAM_BUFFER: usize = 1;
/// The stream buffer `submit_streaming` uses unless told otherwise.
pub const DEFAULT_STREAM_BUFFER: usize = 64;

/// The buffer one streamed task shares between its executor and its submitter.
pub(crate) struct StreamShared<R> {
    state: Mutex<State<R>>,
    capacity: usize,
    cancellation: Cancellation,
    /// How long a send may wait on a full buffer, ms; 0 until the scheduler admits the task
    /// and sets its pool's bound (see [`set_idle_limit`](Self::set_idle_limit)).
    idle_limit_ms: AtomicU64,
}

struct State<R> {
    partials: VecDeque<R>,
    /// The final outcome, once the scheduler delivered it.
    outcome: Option<Result<R, PoolError>>,
    /// No partial is accepted any more: the outcome was delivered.
    ended: bool,
    /// The submitter dropped its stream.
    abandoned: bool,
    /// A send waited past the idle bound with nothing read: no partial is accepted any more.
    stalled: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

impl<R> StreamShared<R> {
    fn lock(&self) -> MutexGuard<'_, State<R>> {
        // A panic while holding this lock can only come from a waker; the state stays valid.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The cancellation flag of the streamed task (the same one the worker runs it under).
    pub(crate) fn cancellation(&self) -> &Cancellation {
        &self.cancellation
    }

    /// Bounds how long a send may wait on a full buffer with nothing read (the pool's
    /// `stream_idle_ms`).
    pub(crate) fn set_idle_limit(&self, limit_ms: u64) {
        self.idle_limit_ms.store(limit_ms, Ordering::Relaxed);
    }

    /// The bound on a send's wait, if one is set.
    fn idle_limit(&self) -> Option<Duration> {
        let limit_ms = self.idle_limit_ms.load(Ordering::Relaxed);
        (limit_ms > 0).then(|| Duration::from_millis(limit_ms))
    }

    /// A send waited out the idle bound: later sends fail, and the task is cancelled (its
    /// executor stops, its units come back). What was sent stays for a late reader.
    fn stall(&self) {
        self.lock().stalled = true;
        self.cancellation.cancel();
    }

    /// Whether the submitter dropped its stream.
    #[cfg(test)]
    fn is_abandoned(&self) -> bool {
        self.lock().abandoned
    }

    /// Puts the final outcome behind the partials and ends the stream (once; a second
    /// outcome, such as the worker's after a watchdog's, is dropped).
    pub(crate) fn finish(&self, outcome: Result<R, PoolError>) {
        let mut state = self.lock();
        if state.ended || state.abandoned {
            drop(state);
            drop_contained(outcome);
            return;
        }
        state.ended = true;
        state.outcome = Some(outcome);
        let reader = state.reader.take();
        let writer = state.writer.take();
        drop(state);
        wake(reader);
        wake(writer);
    }
}

fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        waker.wake();
    }
}

/// What a streamed submission carries to the scheduler: the task's buffer, with its item
/// type erased (the actor protocol is generic over the payload only). Make one with
/// [`ResultStream::channel`].
pub struct StreamAttachment(pub(crate) Arc<dyn Any + Send + Sync>);

impl std::fmt::Debug for StreamAttachment {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("StreamAttachment")
    }
}

/// The executor's face of a stream: sends partial results to the submitter.
pub struct Partials<R> {
    shared: Arc<StreamShared<R>>,
}

impl<R> Clone for Partials<R> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

/// A send failed: the stream is over (its submitter dropped it, or the task already ended).
/// The executor should stop; what it returns is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the result stream is closed: its reader is gone or the task has ended")]
pub struct StreamClosed;

impl<R: Send + 'static> Partials<R> {
    pub(crate) fn from_erased(erased: Arc<dyn Any + Send + Sync>) -> Option<Self> {
        erased
            .downcast::<StreamShared<R>>()
            .ok()
            .map(|shared| Self { shared })
    }

    /// Sends one partial, waiting while the buffer is full, at most the pool's idle bound
    /// (see the module docs): past it the send fails and the task is cancelled.
    pub async fn send(&self, item: R) -> Result<(), StreamClosed> {
        let mut item = Some(item);
        let sending = poll_fn(|context| self.poll_send(context, &mut item));
        let limit = self
            .shared
            .idle_limit()
            .filter(|_| tokio::runtime::Handle::try_current().is_ok());
        let Some(limit) = limit else {
            return sending.await;
        };
        match tokio::time::timeout(limit, sending).await {
            Ok(sent) => sent,
            Err(_) => {
                self.shared.stall();
                Err(StreamClosed)
            }
        }
    }

    /// Sends one partial from blocking code (a sync token loop inside `execute`), blocking
    /// the thread while the buffer is full, at most the pool's idle bound. Works on a
    /// worker thread; needs no runtime.
    pub fn send_blocking(&self, item: R) -> Result<(), StreamClosed> {
        let mut item = Some(item);
        let sending = poll_fn(|context| self.poll_send(context, &mut item));
        let deadline = self
            .shared
            .idle_limit()
            .and_then(|limit| Instant::now().checked_add(limit));
        match block_on_until(sending, deadline) {
            Some(sent) => sent,
            None => {
                self.shared.stall();
                Err(StreamClosed)
            }
        }
    }

    /// Whether the task was cancelled (its stream dropped, `cancel`, timeout, shutdown).
    pub fn is_cancelled(&self) -> bool {
        self.shared.cancellation.is_cancelled()
    }

    fn poll_send(
        &self,
        context: &mut Context<'_>,
        item: &mut Option<R>,
    ) -> Poll<Result<(), StreamClosed>> {
        let mut state = self.shared.lock();
        if state.ended || state.abandoned || state.stalled {
            return Poll::Ready(Err(StreamClosed));
        }
        if state.partials.len() >= self.shared.capacity {
            state.writer = Some(context.waker().clone());
            return Poll::Pending;
        }
        if let Some(item) = item.take() {
            state.partials.push_back(item);
        }
        let reader = state.reader.take();
        drop(state);
        wake(reader);
        Poll::Ready(Ok(()))
    }
}

/// The submitter's face of a streamed task: every partial, then the final value or the
/// error that ended the task, then the end. Dropping it before the end cancels the task.
///
/// ```
/// use futures_util::StreamExt;
/// use prometheus_parking_lot_actors::running::stream::ResultStream;
///
/// // The channel behind `submit_streaming`, driven by hand here.
/// let (_attachment, stream) = ResultStream::<u32>::channel(4).unwrap();
/// drop(stream); // a reader that leaves early cancels its task
/// ```
pub struct ResultStream<R> {
    shared: Arc<StreamShared<R>>,
    /// The final item was yielded: the stream is over.
    done: bool,
}

impl<R: Send + 'static> ResultStream<R> {
    /// A new stream buffer of `buffer` partials: the attachment to submit with
    /// (`SchedulerRequest::SubmitStreaming`) and the stream to read. `InvalidConfig` when
    /// `buffer` is 0.
    pub fn channel(buffer: usize) -> Result<(StreamAttachment, Self), PoolError> {
        if buffer < MIN_STREAM_BUFFER {
            return Err(PoolError::InvalidConfig(format!(
                "stream buffer: {buffer} partials; it must hold at least {MIN_STREAM_BUFFER}"
            )));
        }
        let shared = Arc::new(StreamShared {
            state: Mutex::new(State {
                partials: VecDeque::new(),
                outcome: None,
                ended: false,
                abandoned: false,
                stalled: false,
                reader: None,
                writer: None,
            }),
            capacity: buffer,
            cancellation: Cancellation::new(),
            idle_limit_ms: AtomicU64::new(0),
        });
        let attachment = StreamAttachment(shared.clone());
        Ok((
            attachment,
            Self {
                shared,
                done: false,
            },
        ))
    }

    /// The next item, blocking this thread until it comes (no runtime needed); `None` at the
    /// end. `Timeout` as an item if `deadline` passes first (the stream stays usable).
    pub fn next_blocking(&mut self, deadline: Option<Instant>) -> Option<Result<R, PoolError>> {
        block_on_until(poll_fn(|context| self.poll_item(context)), deadline)
            .unwrap_or(Some(Err(PoolError::Timeout)))
    }

    /// This stream as a blocking iterator (each `next` waits without a time limit).
    pub fn into_blocking_iter(self) -> BlockingStream<R> {
        BlockingStream(self)
    }

    fn poll_item(&mut self, context: &mut Context<'_>) -> Poll<Option<Result<R, PoolError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let mut state = self.shared.lock();
        if let Some(item) = state.partials.pop_front() {
            let writer = state.writer.take();
            drop(state);
            wake(writer);
            return Poll::Ready(Some(Ok(item)));
        }
        if let Some(outcome) = state.outcome.take() {
            drop(state);
            self.done = true;
            return Poll::Ready(Some(outcome));
        }
        state.reader = Some(context.waker().clone());
        Poll::Pending
    }
}

impl<R: Send + 'static> Stream for ResultStream<R> {
    type Item = Result<R, PoolError>;

    fn poll_next(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_item(context)
    }
}

impl<R> Drop for ResultStream<R> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.shared.lock();
        state.abandoned = true;
        let partials = std::mem::take(&mut state.partials);
        let outcome = state.outcome.take();
        let writer = state.writer.take();
        drop(state);
        self.shared.cancellation.cancel();
        wake(writer);
        drop_contained(partials);
        drop_contained(outcome);
    }
}

impl<R> std::fmt::Debug for ResultStream<R> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ResultStream")
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// A [`ResultStream`] read as a blocking iterator; see
/// [`ResultStream::into_blocking_iter`].
#[derive(Debug)]
pub struct BlockingStream<R>(ResultStream<R>);

impl<R: Send + 'static> Iterator for BlockingStream<R> {
    type Item = Result<R, PoolError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next_blocking(None)
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    fn pair(buffer: usize) -> (Partials<u32>, ResultStream<u32>) {
        let (attachment, stream) = ResultStream::<u32>::channel(buffer).expect("valid buffer");
        let partials = Partials::from_erased(attachment.0).expect("same item type");
        (partials, stream)
    }

    #[test]
    fn partials_then_the_final_outcome_then_the_end() {
        let (partials, stream) = pair(8);
        partials.send_blocking(1).unwrap();
        partials.send_blocking(2).unwrap();
        partials.shared.finish(Ok(3));
        assert_eq!(partials.send_blocking(4), Err(StreamClosed), "ended");
        let items: Vec<_> = stream.into_blocking_iter().collect();
        assert_eq!(items, vec![Ok(1), Ok(2), Ok(3)]);
    }

    #[test]
    fn an_error_ends_the_stream_after_the_partials() {
        let (partials, mut stream) = pair(8);
        partials.send_blocking(1).unwrap();
        partials
            .shared
            .finish(Err(PoolError::Failed("boom".into())));
        assert_eq!(stream.next_blocking(None), Some(Ok(1)));
        assert_eq!(
            stream.next_blocking(None),
            Some(Err(PoolError::Failed("boom".into())))
        );
        assert_eq!(stream.next_blocking(None), None);
    }

    #[test]
    fn a_full_buffer_blocks_the_sender_until_the_reader_takes_one() {
        let (partials, mut stream) = pair(1);
        partials.send_blocking(1).unwrap();
        let sender = std::thread::spawn(move || {
            partials.send_blocking(2).unwrap();
            partials.shared.finish(Ok(3));
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!sender.is_finished(), "the second send waits for room");
        assert_eq!(stream.next_blocking(None), Some(Ok(1)));
        sender.join().unwrap();
        assert_eq!(stream.next_blocking(None), Some(Ok(2)));
        assert_eq!(stream.next_blocking(None), Some(Ok(3)));
    }

    #[test]
    fn dropping_the_stream_cancels_and_fails_the_next_send_even_a_blocked_one() {
        let (partials, stream) = pair(1);
        partials.send_blocking(1).unwrap();
        let blocked = std::thread::spawn({
            let partials = partials.clone();
            move || partials.send_blocking(2)
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(stream);
        assert_eq!(blocked.join().unwrap(), Err(StreamClosed));
        assert!(partials.is_cancelled());
        assert!(partials.shared.is_abandoned());
        assert_eq!(partials.send_blocking(3), Err(StreamClosed));
    }

    #[tokio::test]
    async fn an_async_reader_sees_items_as_they_come() {
        let (partials, mut stream) = pair(2);
        let writer = tokio::spawn(async move {
            for n in 0..5 {
                partials.send(n).await.unwrap();
            }
            partials.shared.finish(Ok(99));
        });
        let mut seen = Vec::new();
        while let Some(item) = stream.next().await {
            seen.push(item.unwrap());
        }
        writer.await.unwrap();
        assert_eq!(seen, vec![0, 1, 2, 3, 4, 99]);
    }

    #[test]
    fn a_send_that_waits_past_the_idle_bound_fails_cancels_and_leaves_what_was_sent() {
        let (partials, mut stream) = pair(1);
        partials.shared.set_idle_limit(30);
        partials.send_blocking(1).unwrap();
        assert_eq!(partials.send_blocking(2), Err(StreamClosed), "nobody read");
        assert!(partials.is_cancelled(), "the task is asked to stop");
        assert_eq!(
            partials.send_blocking(3),
            Err(StreamClosed),
            "later sends fail at once"
        );
        // The task ends as a cancelled run does; a reader that comes back sees both.
        partials.shared.finish(Err(PoolError::Cancelled));
        assert_eq!(stream.next_blocking(None), Some(Ok(1)));
        assert_eq!(stream.next_blocking(None), Some(Err(PoolError::Cancelled)));
        assert_eq!(stream.next_blocking(None), None);
    }

    #[tokio::test]
    async fn an_async_send_is_bounded_too() {
        let (partials, mut stream) = pair(1);
        partials.shared.set_idle_limit(30);
        partials.send(1).await.unwrap();
        assert_eq!(partials.send(2).await, Err(StreamClosed), "nobody read");
        assert!(partials.is_cancelled());
        assert_eq!(stream.next().await, Some(Ok(1)), "what was sent stays");
    }

    #[test]
    fn a_zero_buffer_is_refused_and_another_item_type_finds_no_sink() {
        let error = ResultStream::<u32>::channel(0).unwrap_err();
        assert!(error.to_string().contains("at least 1"), "{error}");
        let (attachment, _stream) = ResultStream::<u32>::channel(1).unwrap();
        assert!(Partials::<String>::from_erased(attachment.0).is_none());
    }
}
