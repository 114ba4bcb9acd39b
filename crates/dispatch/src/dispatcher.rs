//! The dispatcher: one per remote host. Callers submit jobs (an async closure that receives a
//! connection from the host's pool) with a priority; a bounded fan-in queue is served highest
//! priority first, first come first served within a level; each job gets a pooled connection
//! for its selector, then runs under the host's [`Gate`] (quota, pause, fence, retries).
//!
//! The queue is drained by one loop task, spawned with every job's task on the runtime the
//! dispatcher was started on: the caller's, a handle given, or a dedicated runtime of its own
//! threads. On a dedicated runtime the dispatcher keeps working when callers occupy every
//! thread of their own runtime (blocking calls, a busy `current_thread` runtime): nothing it
//! runs is scheduled on the callers' threads. Submitting is synchronous (a lock and a push),
//! so even a caller that never yields has its job queued.
//!
//! The order of the steps is deliberate: connection first, quota last, then send at once. A
//! grant taken before waiting for a connection would be spent while the job waits, and grants
//! bunched up by that wait would reach the vendor closer together than the limit allows.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::runtime::{Handle, Runtime};
use tokio::sync::{Notify, oneshot};
use tollgate::Priority;

use crate::classify::Classify;
use crate::error::{ConnectError, DispatchError};
use crate::gate::Gate;
use crate::pool::{Checkout, Pool};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type Connector<C, S> = Arc<dyn Fn(&S) -> BoxFuture<Result<C, ConnectError>> + Send + Sync>;
type Start<C, S> = Box<dyn FnOnce(Arc<Shared<C, S>>, S, Lent<C>) -> BoxFuture<()> + Send>;

/// Most jobs a queue may be configured to hold.
pub const QUEUED_MAX_LIMIT: u32 = 1_000_000;
/// Most connections a pool may be configured to hold.
pub const CONNECTIONS_MAX_LIMIT: u32 = 10_000;

/// A dispatcher's bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatcherConfig {
    /// Jobs waiting for a connection at most; past it `submit` fails with `QueueFull`.
    pub queued_max: u32,
    /// Connections open at most, across every selector; also the most jobs in flight.
    pub connections_max: u32,
}

/// Where the dispatcher's loop and jobs run.
#[derive(Debug)]
pub enum DispatchRuntime {
    /// The runtime `start` is called on.
    Current,
    /// A runtime of the caller's choosing.
    Handle(Handle),
    /// A multi-threaded runtime of its own with this many threads, shut down when the last
    /// handle to the dispatcher is dropped (jobs still queued then fail with `ShutDown`).
    Dedicated { worker_threads: usize },
}

/// A connection lent to a job, or room reserved for one to be opened.
enum Lent<C> {
    Ready(C),
    Open,
}

struct Entry<C, S> {
    priority: Priority,
    seq: u64,
    selector: S,
    start: Start<C, S>,
}

impl<C, S> PartialEq for Entry<C, S> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}
impl<C, S> Eq for Entry<C, S> {}
impl<C, S> PartialOrd for Entry<C, S> {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl<C, S> Ord for Entry<C, S> {
    /// The heap's greatest is served first: the highest priority, then the earliest arrival.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

struct State<C, S> {
    queue: BinaryHeap<Entry<C, S>>,
    next_seq: u64,
    pool: Pool<C, S>,
    stopping: bool,
}

struct Shared<C, S> {
    gate: Gate,
    connector: Connector<C, S>,
    config: DispatcherConfig,
    state: Mutex<State<C, S>>,
    /// Wakes the loop: a job queued, a connection back, a stop. One waiter, so `notify_one`
    /// (which keeps the wake-up if the loop is busy) never loses one.
    changed: Notify,
    handle: Handle,
}

impl<C, S> Shared<C, S> {
    fn state(&self) -> std::sync::MutexGuard<'_, State<C, S>> {
        // Every critical section leaves the state whole (pushes, pops, counters).
        match self.state.lock() {
            Ok(state) => state,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// Owns the dispatcher's life: dropping the last handle stops the loop (after the queue
/// drains) and shuts down a dedicated runtime.
struct Owner<C, S> {
    shared: Arc<Shared<C, S>>,
    runtime: Option<Runtime>,
}

impl<C, S> Drop for Owner<C, S> {
    fn drop(&mut self) {
        self.shared.state().stopping = true;
        self.shared.changed.notify_one();
        if let Some(runtime) = self.runtime.take() {
            // Never blocks: dropping a runtime inside an async context would panic.
            runtime.shutdown_background();
        }
    }
}

/// A host's dispatcher. `C` is a connection (a client handle, cloned into each attempt), `S`
/// the pool selector. Cheap to clone; clones share the queue and the pool.
pub struct Dispatcher<C, S> {
    owner: Arc<Owner<C, S>>,
}

impl<C, S> Clone for Dispatcher<C, S> {
    fn clone(&self) -> Self {
        Dispatcher {
            owner: self.owner.clone(),
        }
    }
}

impl<C, S: PartialEq> fmt::Debug for Dispatcher<C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.owner.shared.state();
        f.debug_struct("Dispatcher")
            .field("queued", &state.queue.len())
            .field("connections_open", &state.pool.open())
            .field("connections_idle", &state.pool.idle())
            .field("config", &self.owner.shared.config)
            .finish_non_exhaustive()
    }
}

/// A submitted job's result, to await.
#[must_use = "a job's result arrives through this future"]
#[derive(Debug)]
pub struct Job<R> {
    receiver: oneshot::Receiver<Result<R, DispatchError>>,
}

impl<R> Future for Job<R> {
    type Output = Result<R, DispatchError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.receiver)
            .poll(cx)
            .map(|result| result.unwrap_or(Err(DispatchError::ShutDown)))
    }
}

/// Gives a connection's room back if a job's task ends without returning it (a panic in the
/// job, a runtime shutting down).
struct Room<C, S: PartialEq> {
    shared: Arc<Shared<C, S>>,
    held: bool,
}

impl<C, S: PartialEq> Room<C, S> {
    fn give_back(mut self, selector: S, connection: C) {
        self.held = false;
        self.shared.state().pool.checkin(selector, connection);
        self.shared.changed.notify_one();
    }
}

impl<C, S: PartialEq> Drop for Room<C, S> {
    fn drop(&mut self) {
        if self.held {
            self.shared.state().pool.discard();
            self.shared.changed.notify_one();
        }
    }
}

impl<C, S> Dispatcher<C, S>
where
    C: Clone + Send + Sync + 'static,
    S: Clone + PartialEq + Send + Sync + 'static,
{
    /// Start a dispatcher over `gate` (the host's quota and classifier). `connect` opens a
    /// connection for a selector; it is called lazily, outside every lock.
    pub fn start<F, Fut>(
        gate: Gate,
        config: DispatcherConfig,
        connect: F,
        runtime: DispatchRuntime,
    ) -> Result<Dispatcher<C, S>, DispatchError>
    where
        F: Fn(&S) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<C, ConnectError>> + Send + 'static,
    {
        if config.queued_max == 0 || config.queued_max > QUEUED_MAX_LIMIT {
            return Err(DispatchError::config(
                "queued_max",
                format!("must be between 1 and {QUEUED_MAX_LIMIT}"),
            ));
        }
        if config.connections_max == 0 || config.connections_max > CONNECTIONS_MAX_LIMIT {
            return Err(DispatchError::config(
                "connections_max",
                format!("must be between 1 and {CONNECTIONS_MAX_LIMIT}"),
            ));
        }
        let (handle, owned_runtime) = match runtime {
            DispatchRuntime::Current => (
                Handle::try_current().map_err(|_| {
                    DispatchError::config("runtime", "start the dispatcher inside a tokio runtime, or give it a handle or a dedicated runtime")
                })?,
                None,
            ),
            DispatchRuntime::Handle(handle) => (handle, None),
            DispatchRuntime::Dedicated { worker_threads } => {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(worker_threads.max(1))
                    .thread_name("tollgate-dispatch")
                    .enable_all()
                    .build()
                    .map_err(|error| DispatchError::config("runtime", error.to_string()))?;
                (runtime.handle().clone(), Some(runtime))
            }
        };
        let connector: Connector<C, S> = Arc::new(move |selector: &S| {
            let opening = connect(selector);
            Box::pin(opening) as BoxFuture<Result<C, ConnectError>>
        });
        let shared = Arc::new(Shared {
            gate,
            connector,
            state: Mutex::new(State {
                queue: BinaryHeap::new(),
                next_seq: 0,
                pool: Pool::new(config.connections_max as usize),
                stopping: false,
            }),
            config,
            changed: Notify::new(),
            handle: handle.clone(),
        });
        handle.spawn(serve(shared.clone()));
        Ok(Dispatcher {
            owner: Arc::new(Owner {
                shared,
                runtime: owned_runtime,
            }),
        })
    }

    /// The host's gate (its statistics, the pause in force).
    pub fn gate(&self) -> &Gate {
        &self.owner.shared.gate
    }

    /// The runtime the dispatcher's tasks run on: build clients and stores there when callers
    /// may occupy their own threads (a store's connection task lives where it was created).
    pub fn handle(&self) -> &Handle {
        &self.owner.shared.handle
    }

    /// Jobs waiting for a connection now.
    pub fn queued(&self) -> usize {
        self.owner.shared.state().queue.len()
    }

    /// Queue `job` for a connection of `selector`, at `priority`. Returns at once: the job is
    /// queued (or refused with `QueueFull`) before this returns, and its result arrives through
    /// the returned [`Job`]. `job` runs once per attempt, with a clone of the lent connection;
    /// dropping the `Job` before the job starts withdraws it.
    pub fn submit<R, F, Fut>(
        &self,
        selector: S,
        priority: Priority,
        mut job: F,
    ) -> Result<Job<R>, DispatchError>
    where
        R: Classify + Send + 'static,
        F: FnMut(C) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
    {
        let (sender, receiver) = oneshot::channel();
        let start: Start<C, S> = Box::new(move |shared, selector, lent| {
            Box::pin(async move {
                let room = Room {
                    shared: shared.clone(),
                    held: true,
                };
                if sender.is_closed() {
                    // Withdrawn while queued: the connection goes back unused.
                    if let Lent::Ready(connection) = lent {
                        room.give_back(selector, connection);
                    }
                    return;
                }
                let connection = match lent {
                    Lent::Ready(connection) => connection,
                    Lent::Open => match (shared.connector)(&selector).await {
                        Ok(connection) => connection,
                        Err(source) => {
                            drop(room);
                            let _ = sender.send(Err(DispatchError::Connect { source }));
                            return;
                        }
                    },
                };
                let result = shared.gate.call(priority, || job(connection.clone())).await;
                room.give_back(selector, connection);
                let _ = sender.send(result);
            })
        });
        let shared = &self.owner.shared;
        {
            let mut state = shared.state();
            if state.stopping {
                return Err(DispatchError::ShutDown);
            }
            if state.queue.len() >= shared.config.queued_max as usize {
                return Err(DispatchError::QueueFull {
                    queued_max: shared.config.queued_max,
                });
            }
            let seq = state.next_seq;
            state.next_seq += 1;
            state.queue.push(Entry {
                priority,
                seq,
                selector,
                start,
            });
        }
        shared.changed.notify_one();
        Ok(Job { receiver })
    }

    /// Submit and wait for the result.
    pub async fn run<R, F, Fut>(
        &self,
        selector: S,
        priority: Priority,
        job: F,
    ) -> Result<R, DispatchError>
    where
        R: Classify + Send + 'static,
        F: FnMut(C) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
    {
        self.submit(selector, priority, job)?.await
    }
}

/// The loop: lend the head of the queue a connection as soon as one is free for its selector,
/// and start it. The head blocks the jobs behind it (a lower priority never overtakes a higher
/// one, nor a later arrival an earlier one of its level), so each wait is for a connection to
/// come back.
async fn serve<C, S>(shared: Arc<Shared<C, S>>)
where
    C: Clone + Send + Sync + 'static,
    S: Clone + PartialEq + Send + Sync + 'static,
{
    loop {
        let next = {
            let mut guard = shared.state();
            let state = &mut *guard;
            let lent = match state.queue.peek() {
                None if state.stopping => return,
                None => None,
                Some(head) => match state.pool.checkout(&head.selector) {
                    Checkout::Idle(connection) => Some(Lent::Ready(connection)),
                    Checkout::Create { .. } => Some(Lent::Open),
                    Checkout::Full => None,
                },
            };
            lent.and_then(|lent| state.queue.pop().map(|entry| (entry, lent)))
        };
        match next {
            Some((entry, lent)) => {
                let task = (entry.start)(shared.clone(), entry.selector, lent);
                shared.handle.spawn(task);
            }
            None => shared.changed.notified().await,
        }
    }
}
