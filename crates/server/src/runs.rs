//! A restart that neither forgets nor over-holds (what the rules database remembers of this
//! server's store, `tollgate_rules::PreviousRun`):
//!
//! - the memory store saves its counters and pauses on a clean stop and the next start puts
//!   them back, holding nothing;
//! - while it runs, a heartbeat records every few seconds up to when it may be granting, so
//!   after a crash the limits of that time are held only until then plus their period
//!   (`recover_on_start`), and a limit created since is not held;
//! - a rules database with no previous run holds nothing; nor does a Redis namespace it has
//!   never known in use (one it knew that comes back empty is a loss, held as G6 says).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tollgate::{Clock, Limit, Limiter, MemoryStore, Policy};
use tollgate_rules::{SourceError, SqlSource};

/// How often a running memory store records that it may be granting.
pub(crate) const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// The memory store's row: one memory-store server per rules table.
const MEMORY_STORE: &str = "memory";

/// The row of a Redis namespace.
pub(crate) fn redis_store(namespace: &str) -> String {
    format!("redis:{namespace}")
}

/// How far ahead a heartbeat vouches: until the next one is due, with one interval to spare
/// for a slow tick.
fn granting_until(clock: &dyn Clock) -> u64 {
    let ahead = u64::try_from((HEARTBEAT_INTERVAL * 2).as_micros()).unwrap_or(u64::MAX);
    clock.now_us().saturating_add(ahead)
}

/// A memory store's run, from its start to its clean stop.
#[derive(Debug)]
pub(crate) struct MemoryRun {
    source: SqlSource,
    memory: Arc<MemoryStore>,
    heartbeat: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl MemoryRun {
    /// Put back what the previous run left, or hold what it may have granted, then record this
    /// run and start its heartbeat. `limiter`'s limits must be in force (the rules loaded);
    /// `others` are limits decided on the store outside the limiter (Envoy's counters).
    pub(crate) async fn begin(
        source: SqlSource,
        memory: Arc<MemoryStore>,
        clock: Arc<dyn Clock>,
        limiter: &Limiter,
        others: Vec<Limit>,
        recover_on_start: bool,
    ) -> Result<MemoryRun, SourceError> {
        let table = limiter.limits();
        let limits: Vec<Limit> = table
            .iter()
            .map(|limit| (**limit).clone())
            .chain(others)
            .collect();
        let policies: std::collections::HashMap<&str, Policy> = limits
            .iter()
            .map(|limit| (limit.name(), *limit.policy()))
            .collect();
        let policy_of = |name: &str| policies.get(name).copied();
        match source.previous_run(MEMORY_STORE).await? {
            None => tracing::info!("first run of the memory store on this rules database"),
            Some(previous) if previous.clean => {
                let saved = source.saved(MEMORY_STORE).await?;
                let restored = memory.restore(&saved, policy_of);
                tracing::info!(
                    counters = restored.counters,
                    dropped = restored.dropped,
                    "counters of the previous run restored"
                );
                if !restored.held.is_empty() {
                    tracing::warn!(
                        limits = ?restored.held,
                        "some saved counters could not be restored; their limits are held \
                         until what they counted can no longer count"
                    );
                }
            }
            Some(previous) if recover_on_start => {
                memory.hold(previous.granting_until_us, limits.iter());
                let now = clock.now_us();
                let longest = limits
                    .iter()
                    .map(|limit| {
                        previous
                            .granting_until_us
                            .saturating_add(limit.policy().memory_us())
                            .saturating_sub(now)
                    })
                    .max()
                    .unwrap_or(0);
                tracing::warn!(
                    limits = limits.len(),
                    longest_hold = %crate::human_duration(Duration::from_micros(longest)),
                    "the previous run did not stop cleanly: each limit it had grants nothing \
                     until one period after it was last known to grant (recover_on_start)"
                );
            }
            Some(_) => tracing::warn!(
                "the previous run did not stop cleanly, and recover_on_start is off: what it \
                 granted is not held back"
            ),
        }
        source
            .begin_run(MEMORY_STORE, granting_until(&*clock))
            .await?;
        let (stop, mut stopped) = watch::channel(false);
        let heartbeat_source = source.clone();
        let heartbeat = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(HEARTBEAT_INTERVAL);
            ticker.tick().await;
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    _ = stopped.changed() => break,
                }
                if let Err(error) = heartbeat_source
                    .heartbeat(MEMORY_STORE, granting_until(&*clock))
                    .await
                {
                    // A crash now would be held from the last recorded heartbeat: too short a
                    // hold if grants go on meanwhile. Said loudly; decisions go on.
                    tracing::warn!(%error, "heartbeat not recorded in the rules database");
                }
            }
        });
        Ok(MemoryRun {
            source,
            memory,
            heartbeat,
            stop,
        })
    }

    /// A clean stop, once nothing decides any more: save the counters for the next start.
    pub(crate) async fn end(self) {
        let _ = self.stop.send(true);
        let _ = self.heartbeat.await;
        let snapshot = self.memory.snapshot();
        match self.source.end_run(MEMORY_STORE, &snapshot).await {
            Ok(()) => tracing::info!(
                counters = snapshot.counters.len(),
                "counters saved for the next start"
            ),
            Err(error) => tracing::warn!(
                %error,
                "counters could not be saved: the next start holds what this run granted"
            ),
        }
    }
}
