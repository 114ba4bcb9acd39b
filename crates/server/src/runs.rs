//! A restart that neither forgets nor over-holds: what the state database remembers of this
//! server's memory store (`tollgate_rules::PreviousRun`, `<table>_ahead`).
//!
//! - While it runs, the memory store grants on a rate counter only within a budget recorded
//!   ahead (`tollgate`'s `write_ahead.rs`): `spawn_writer` writes the records it asks for, in
//!   batches, one transaction each, on SQLite without waiting for the disk (a killed process
//!   loses nothing SQLite was handed; the host's boot is recorded, since a host that goes
//!   down may lose the last commits). A heartbeat records every few seconds up to when it may
//!   be granting.
//! - A clean stop replaces the records with the final state, budgets 0, and the next start
//!   puts them back exactly, holding nothing.
//! - After a crash (kill -9, out of memory, a panic) the next start puts each record back
//!   and charges it its budget, so each rate counter resumes with at most its unspent budget
//!   held back. Leases have no budget (renewals move them without a grant): concurrency limits
//!   are held until one lease TTL after the last heartbeat, as is every limit when the records
//!   cannot be trusted (the host went down on SQLite's relaxed commits, or an older server
//!   wrote no records); such a hold is kept with the run, and later starts hold it too until
//!   it ends, since the records it could not trust are gone.
//! - Taking the run over fences off any server still running on the same database: its next
//!   write finds the run owned by another and fails, so it spends no budget the new one did not
//!   read.
//! - A rules database with no previous run holds nothing; nor does a Redis namespace it has
//!   never known in use (one it knew that comes back empty is a loss, held as G6 says).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tollgate::{Clock, Limit, Limiter, MemorySnapshot, MemoryStore, Policy};
use tollgate_rules::{PreviousRun, SourceError, SqlSource};

/// How often a running memory store records that it may be granting.
pub(crate) const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// Counters one batch of write-ahead records at most.
const AHEAD_ROWS_PER_BATCH: usize = 2_000;
/// Longest a batch may take to commit before it counts as failed.
const AHEAD_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the writer looks for work nobody woke it for (forgotten counters' rows).
const AHEAD_IDLE_INTERVAL: Duration = Duration::from_secs(1);
/// The wait before writing again after a batch failed, doubled up to `AHEAD_RETRY_MAX`.
const AHEAD_RETRY_MIN: Duration = Duration::from_millis(50);
const AHEAD_RETRY_MAX: Duration = Duration::from_secs(2);

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

/// This host's boot, where the system says (Linux): a crash that changed it took the host down.
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_owned()).filter(|id| !id.is_empty())
}

/// A name for this run, unique among the servers that may share the state database.
fn new_owner() -> Result<String, SourceError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|error| SourceError::BadUrl {
        url: "state".into(),
        reason: format!("no randomness to name this run: {error}"),
    })?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// What the write-ahead has written, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct WriteAheadStats {
    /// Transactions committed.
    pub(crate) batches: AtomicU64,
    /// Counter records in them.
    pub(crate) records: AtomicU64,
    /// Batches the state database did not take.
    pub(crate) failures: AtomicU64,
}

/// A memory store's run, from its start to its clean stop.
#[derive(Debug)]
pub(crate) struct MemoryRun {
    source: SqlSource,
    owner: String,
    memory: Arc<MemoryStore>,
    stats: Arc<WriteAheadStats>,
    heartbeat: JoinHandle<()>,
    writer: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

/// What to put back at a start, from the previous run.
enum Recovery {
    /// Nothing: a first run, or a crash with `recover_on_start` off.
    Nothing,
    /// The records as they are: a clean stop; `true` for an older server's saved rows, which
    /// become records at once.
    Exact(MemorySnapshot, bool),
    /// The records, each charged its budget; concurrency limits held from the last heartbeat.
    Charged(MemorySnapshot, u64),
    /// Every limit held from the last heartbeat: the records cannot be trusted.
    Held(u64),
}

impl MemoryRun {
    /// Take the run over, put back what the previous run left (or hold what it may have
    /// granted), then start the heartbeat and the write-ahead writer. `limiter`'s limits must
    /// be in force (the rules loaded); `others` are limits decided on the store outside the
    /// limiter (Envoy's counters).
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
        let owner = new_owner()?;
        let boot = boot_id();
        // Relaxed commits only where a lost one can be told (the boot is known).
        let ahead_source = match boot {
            Some(_) => source.for_write_ahead().await?,
            None => source.clone(),
        };
        let previous = source
            .take_over(
                MEMORY_STORE,
                &owner,
                boot.as_deref(),
                granting_until(&*clock),
            )
            .await?;
        // A hold an earlier run began on records it could not trust outlives it.
        let carried = previous
            .as_ref()
            .map_or(0, |previous| previous.held_since_us);
        let recovery = match previous {
            None => {
                tracing::info!("first run of the memory store on this state database");
                Recovery::Nothing
            }
            Some(previous) if previous.clean && previous.ahead => {
                Recovery::Exact(source.ahead_records(MEMORY_STORE).await?, false)
            }
            Some(previous) if previous.clean => {
                Recovery::Exact(source.saved(MEMORY_STORE).await?, true)
            }
            Some(_) if !recover_on_start => {
                tracing::warn!(
                    "the previous run did not stop cleanly, and recover_on_start is off: what \
                     it granted is not held back"
                );
                // Its records would be put back after a later crash: gone, with any hold.
                source.forget_records(MEMORY_STORE, &owner, 0).await?;
                Recovery::Nothing
            }
            Some(previous) if trusted(&source, &previous, boot.as_deref()) => {
                let mut records = source.ahead_records(MEMORY_STORE).await?;
                records.taken_at_us = previous.granting_until_us;
                Recovery::Charged(records, previous.granting_until_us)
            }
            Some(previous) => Recovery::Held(previous.granting_until_us),
        };
        let now = clock.now_us();
        let longest_hold = |held: &mut dyn Iterator<Item = &Limit>, since: u64| {
            let longest = held
                .map(|limit| {
                    since
                        .saturating_add(limit.policy().memory_us())
                        .saturating_sub(now)
                })
                .max()
                .unwrap_or(0);
            crate::human_duration(Duration::from_micros(longest))
        };
        match recovery {
            Recovery::Nothing => {}
            Recovery::Exact(snapshot, legacy) => {
                let policies = policies(&limits, |_| true);
                let restored = memory.restore(&snapshot, |name| policies.get(name).copied());
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
                if legacy {
                    // Kept as records before anything is granted: a crash of this run must
                    // find them.
                    source
                        .replace_records(MEMORY_STORE, &owner, &memory.snapshot(), None)
                        .await?;
                }
            }
            Recovery::Charged(records, since) => {
                // Leases have no budget: concurrency limits are held, their records ignored.
                let rates = policies(&limits, |policy| !policy.is_concurrency());
                let restored = memory.restore(&records, |name| rates.get(name).copied());
                let leases: Vec<&Limit> = limits
                    .iter()
                    .filter(|limit| limit.policy().is_concurrency())
                    .collect();
                memory.hold(since, leases.iter().copied());
                tracing::warn!(
                    counters = restored.counters,
                    dropped = restored.dropped,
                    concurrency_limits_held = leases.len(),
                    longest_hold = %longest_hold(&mut leases.iter().copied(), since),
                    "the previous run did not stop cleanly: each rate counter resumes from its \
                     last record with its unspent budget held back; concurrency limits grant \
                     nothing until one lease TTL after it was last known to grant \
                     (recover_on_start)"
                );
                if !restored.held.is_empty() {
                    tracing::warn!(
                        limits = ?restored.held,
                        "some records could not be restored; their limits are held until one \
                         period after the previous run was last known to grant"
                    );
                }
            }
            Recovery::Held(since) => {
                // The records go, and the hold is kept with the run: a start after this run
                // must not put them back without it.
                source
                    .forget_records(MEMORY_STORE, &owner, since.max(carried))
                    .await?;
                memory.hold(since, limits.iter());
                tracing::warn!(
                    limits = limits.len(),
                    longest_hold = %longest_hold(&mut limits.iter(), since),
                    "the previous run did not stop cleanly and its records cannot be trusted \
                     (the host restarted since, or it wrote none): each limit it had grants \
                     nothing until one period after it was last known to grant \
                     (recover_on_start)"
                );
            }
        }
        if carried > 0 && recover_on_start {
            memory.hold(carried, limits.iter());
        }
        let (stop, stopped) = watch::channel(false);
        let stats = Arc::new(WriteAheadStats::default());
        let heartbeat = spawn_heartbeat(
            source.clone(),
            owner.clone(),
            memory.clone(),
            clock,
            stopped.clone(),
        );
        let writer = spawn_writer(
            ahead_source,
            owner.clone(),
            memory.clone(),
            stats.clone(),
            stopped,
        );
        Ok(MemoryRun {
            source,
            owner,
            memory,
            stats,
            heartbeat,
            writer,
            stop,
        })
    }

    /// What the write-ahead has written so far.
    pub(crate) fn stats(&self) -> Arc<WriteAheadStats> {
        self.stats.clone()
    }

    /// A clean stop, once nothing decides any more: the final state replaces the records.
    pub(crate) async fn end(self) {
        let _ = self.stop.send(true);
        let _ = self.heartbeat.await;
        let _ = self.writer.await;
        self.memory.close_records("the server is stopping");
        let snapshot = self.memory.snapshot();
        let at = snapshot.taken_at_us;
        match self
            .source
            .replace_records(MEMORY_STORE, &self.owner, &snapshot, Some(at))
            .await
        {
            Ok(()) => tracing::info!(
                counters = snapshot.counters.len(),
                "counters saved for the next start"
            ),
            Err(error) => tracing::warn!(
                %error,
                "counters could not be saved: the next start puts back the last records, each \
                 with its budget held back"
            ),
        }
        // The records of counters gone idle were deleted; no older copy of them stays in
        // SQLite's log once the server has stopped.
        if let Err(error) = self.source.checkpoint().await {
            tracing::debug!(%error, "the state database's log was not emptied");
        }
    }
}

/// Each limit's policy, for those `keep` keeps.
fn policies(
    limits: &[Limit],
    keep: impl Fn(&Policy) -> bool,
) -> std::collections::HashMap<&str, Policy> {
    limits
        .iter()
        .filter(|limit| keep(limit.policy()))
        .map(|limit| (limit.name(), *limit.policy()))
        .collect()
}

/// Whether the previous run's records hold everything it committed: always off SQLite (the
/// database commits durably), and on SQLite when its relaxed commits cannot have been lost,
/// that is when the host did not go down since (the same boot, or no boot known: then it
/// committed durably).
fn trusted(source: &SqlSource, previous: &PreviousRun, boot: Option<&str>) -> bool {
    if !previous.ahead {
        return false;
    }
    match (source.backend(), previous.boot.as_deref()) {
        ("sqlite", Some(previous)) => boot == Some(previous),
        _ => true,
    }
}

/// Record every few seconds that this run may be granting; a run taken over by another
/// server stops granting past its budgets.
fn spawn_heartbeat(
    source: SqlSource,
    owner: String,
    memory: Arc<MemoryStore>,
    clock: Arc<dyn Clock>,
    mut stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(HEARTBEAT_INTERVAL);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stopped.changed() => break,
            }
            match source
                .heartbeat_of(MEMORY_STORE, &owner, granting_until(&*clock))
                .await
            {
                Ok(()) => {}
                Err(error @ SourceError::Fenced { .. }) => {
                    fenced(&memory, &error);
                    break;
                }
                // A crash now would hold leases from the last recorded heartbeat: too short a
                // hold if leases are granted meanwhile. Said loudly; decisions go on.
                Err(error) => {
                    tracing::warn!(%error, "heartbeat not recorded in the state database");
                }
            }
        }
    })
}

fn fenced(memory: &MemoryStore, error: &SourceError) {
    tracing::error!(
        %error,
        "another server started on this state database and took over the memory store's run: \
         this server grants only what its recorded budgets allow, then refuses with \
         store_unavailable; stop it"
    );
    memory.close_records(&error.to_string());
}

/// Write the records the memory store asks for, batch after batch, until `stopped`.
fn spawn_writer(
    source: SqlSource,
    owner: String,
    memory: Arc<MemoryStore>,
    stats: Arc<WriteAheadStats>,
    mut stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut retry = AHEAD_RETRY_MIN;
        loop {
            while let Some(batch) = memory.record_batch(AHEAD_ROWS_PER_BATCH) {
                let written = tokio::time::timeout(
                    AHEAD_WRITE_TIMEOUT,
                    source.write_ahead(MEMORY_STORE, &owner, &batch),
                )
                .await;
                match written {
                    Ok(Ok(())) => {
                        stats.batches.fetch_add(1, Ordering::Relaxed);
                        stats
                            .records
                            .fetch_add(batch.counters.len() as u64, Ordering::Relaxed);
                        memory.records_landed(batch);
                        retry = AHEAD_RETRY_MIN;
                    }
                    Ok(Err(error @ SourceError::Fenced { .. })) => {
                        memory.records_failed(batch, &error.to_string());
                        fenced(&memory, &error);
                        return;
                    }
                    failed => {
                        let reason = match failed {
                            Ok(Err(error)) => error.to_string(),
                            _ => format!("no commit within {} s", AHEAD_WRITE_TIMEOUT.as_secs()),
                        };
                        stats.failures.fetch_add(1, Ordering::Relaxed);
                        memory.records_failed(batch, &reason);
                        if retry == AHEAD_RETRY_MIN {
                            tracing::warn!(
                                error = %reason,
                                "write-ahead records not written to the state database: \
                                 counters grant what their recorded budgets leave, and \
                                 requests that need a new record fail until it is written"
                            );
                        }
                        tokio::select! {
                            () = tokio::time::sleep(retry) => {}
                            _ = stopped.changed() => return,
                        }
                        retry = (retry * 2).min(AHEAD_RETRY_MAX);
                    }
                }
            }
            tokio::select! {
                () = memory.records_due() => {}
                () = tokio::time::sleep(AHEAD_IDLE_INTERVAL) => {}
                _ = stopped.changed() => return,
            }
        }
    })
}
