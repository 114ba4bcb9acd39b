//! The rules in force and how they change: one immutable `RuleSet` snapshot, swapped whole,
//! rebuilt from the source (the SQL table, or a limits file) on every poll, PostgreSQL
//! notification and admin write.
//!
//! A row that fails validation is reported and skipped, but if an earlier version of the same
//! limit was valid, that version stays in force: an administrator's typo never silently lifts
//! a limit. For SQL rules that earlier version outlives the process: each limit's last valid
//! version is kept in `<table>_valid` (written when it changes) and read at start, so a row
//! broken while the server was down is served as it last was. Counters live in the store by
//! limit name, so a reload never refills them.
//!
//! One request is decided all or nothing over at most `COUNTERS_PER_REQUEST_MAX` limits, so a
//! set in force never lets one request match more rules than that (see `fanout`): a row that
//! would is rejected like an invalid one, and never displaces a rule already in force.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;
use tollgate::{COUNTERS_PER_REQUEST_MAX, LimitTable, Limiter};

use crate::fanout::Fanout;
use crate::file::FileSource;
use crate::inbound::InboundIndex;
use crate::path::{PathError, PathMatching};
use crate::rule::Validate;
use crate::rule::{RawRule, Rule, RuleError};
use crate::sql::{SourceError, SqlSource, TableRow, column_of};

/// Rules in force at most; rows past it are refused, so memory stays bounded.
pub const RULES_MAX: usize = 10_000;

/// Where rules come from: the SQL table, which the admin API writes, or a limits file, which
/// only its authors change.
#[derive(Debug)]
pub enum RulesSource {
    Sql(SqlSource),
    File(FileSource),
}

impl From<SqlSource> for RulesSource {
    fn from(source: SqlSource) -> RulesSource {
        RulesSource::Sql(source)
    }
}

impl From<FileSource> for RulesSource {
    fn from(source: FileSource) -> RulesSource {
        RulesSource::File(source)
    }
}

impl RulesSource {
    async fn load(&self) -> Result<Vec<TableRow>, SourceError> {
        match self {
            RulesSource::Sql(source) => source.load().await,
            RulesSource::File(source) => source.load().await,
        }
    }

    /// What to call the source in logs and messages: `table tollgate_limits`, `file limits.toml`.
    pub fn describe(&self) -> String {
        match self {
            RulesSource::Sql(source) => format!("table {}", source.table()),
            RulesSource::File(source) => format!("file {}", source.path().display()),
        }
    }

    /// Where a rule's field lives in this source: a table column, or the field as the file
    /// spells it.
    fn locate(&self, field: &str) -> String {
        match self {
            RulesSource::Sql(_) => column_of(field).to_owned(),
            RulesSource::File(_) => field.to_owned(),
        }
    }

    /// A rejected row as people read it: `FILE:LINE: NAME: FIELD: REASON` for a file (as
    /// compilers say where a fault is), `table T: row NAME: COLUMN: REASON` for a table.
    pub fn fault(&self, row: &RejectedRow) -> String {
        match (self, row.line) {
            (RulesSource::File(file), Some(line)) => format!(
                "{}:{line}: {}: {}: {}",
                file.path().display(),
                row.name,
                row.column,
                row.reason
            ),
            _ => format!(
                "{}: row {}: {}: {}",
                self.describe(),
                row.name,
                row.column,
                row.reason
            ),
        }
    }

    /// Whether the source can be read now, for readiness checks.
    pub async fn ping(&self) -> Result<(), SourceError> {
        match self {
            RulesSource::Sql(source) => source.ping().await,
            RulesSource::File(source) => source.ping().await,
        }
    }

    /// PostgreSQL's change notifications, where the source has them.
    async fn change_feed(&self) -> Result<Option<crate::sql::ChangeFeed>, SourceError> {
        match self {
            RulesSource::Sql(source) => source.change_feed().await,
            RulesSource::File(_) => Ok(None),
        }
    }
}

/// A row that is not in force as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedRow {
    pub name: String,
    /// Where the fault is: the table column, or the file's field.
    pub column: String,
    pub reason: String,
    /// Whether an earlier valid version of this limit is still in force.
    pub previous_in_force: bool,
    /// The file's line where the fault is written (the field's, else the entry's); none for
    /// a table.
    pub line: Option<u32>,
}

impl From<&RejectedRow> for tollgate_api::admin::RejectedRow {
    fn from(row: &RejectedRow) -> tollgate_api::admin::RejectedRow {
        tollgate_api::admin::RejectedRow {
            name: row.name.clone(),
            column: row.column.clone(),
            reason: row.reason.clone(),
            previous_in_force: row.previous_in_force,
            line: row.line,
        }
    }
}

/// One version of the rules in force.
#[derive(Debug, Default)]
pub struct RuleSet {
    version: u64,
    rules: BTreeMap<String, Arc<Rule>>,
    rejected: Vec<RejectedRow>,
    path_matching: PathMatching,
    /// The rules with a `match`, indexed for matching requests, paths read with
    /// `path_matching`.
    inbound: Arc<InboundIndex>,
}

impl RuleSet {
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Rule>> {
        self.rules.get(name)
    }

    /// The rules in force, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Rule>> {
        self.rules.values()
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Rows of the table not in force as written, at the last reload.
    pub fn rejected(&self) -> &[RejectedRow] {
        &self.rejected
    }

    /// How request paths are read before they are matched (see [`PathMatching`]).
    pub fn path_matching(&self) -> PathMatching {
        self.path_matching
    }

    /// A request path in the form `matching` compares: [`PathMatching::normalize`] with this
    /// set's reading.
    pub fn normalize<'p>(&self, path: &'p str) -> Result<std::borrow::Cow<'p, str>, PathError> {
        self.path_matching.normalize(path)
    }

    /// The rules whose `match` matches a request with `method` on `normalized_path` (from
    /// [`RuleSet::normalize`]), in chain order (see [`InboundIndex`]).
    pub fn matching<'s>(
        &'s self,
        method: &str,
        normalized_path: &str,
    ) -> impl Iterator<Item = &'s Arc<Rule>> + 's {
        let matched = self.inbound.matching(method, normalized_path);
        let rules = self.inbound.rules();
        matched
            .positions
            .into_iter()
            .filter_map(move |position| rules.get(position as usize))
    }

    /// The one inbound matcher, built once per version of the rules: what `/v1/check`,
    /// `/v1/forward-auth` and the tower layer match requests with.
    pub fn inbound(&self) -> &Arc<InboundIndex> {
        &self.inbound
    }

    fn new(
        version: u64,
        rules: BTreeMap<String, Arc<Rule>>,
        rejected: Vec<RejectedRow>,
        path_matching: PathMatching,
    ) -> RuleSet {
        let inbound = Arc::new(InboundIndex::build(rules.values(), path_matching));
        RuleSet {
            version,
            rules,
            rejected,
            path_matching,
            inbound,
        }
    }
}

/// Counts for metrics, read at scrape time.
#[derive(Debug, Default)]
pub struct RulesStats {
    pub reloads_ok: AtomicU64,
    pub reloads_failed: AtomicU64,
    /// Rows rejected at the last successful reload.
    pub rows_rejected: AtomicU64,
    /// Whether the last reload reached the database.
    pub last_reload_ok: AtomicBool,
    /// Why the last reload failed, while it has not succeeded since.
    pub last_reload_error: std::sync::Mutex<Option<String>>,
}

impl RulesStats {
    fn set_last_error(&self, error: Option<String>) {
        self.last_reload_ok
            .store(error.is_none(), Ordering::Relaxed);
        match self.last_reload_error.lock() {
            Ok(mut slot) => *slot = error,
            Err(poisoned) => *poisoned.into_inner() = error,
        }
    }

    /// Why the last reload failed, if it did.
    pub fn last_error(&self) -> Option<String> {
        match self.last_reload_error.lock() {
            Ok(slot) => slot.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// A rule refused by the admin API, or a database that could not store it.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error(transparent)]
    Invalid(#[from] RuleError),
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The rules come from a file: they change by editing it, not through the server.
    #[error(
        "limits come from the file {path}: edit it there (the server reloads it), or serve from a SQL rules database to change limits through the admin API"
    )]
    ReadOnly { path: String },
}

#[derive(Debug)]
struct State {
    version: u64,
    /// What was last applied: the valid rules and the rejected rows with their reasons.
    in_force: BTreeMap<String, Arc<Rule>>,
    rejected: BTreeMap<String, RejectedRow>,
    /// What `<table>_valid` holds, as far as this server wrote or read it: compared with what
    /// is in force after each reload, so only the names that changed are written.
    kept: BTreeMap<String, Arc<Rule>>,
}

#[derive(Debug)]
struct Inner {
    source: RulesSource,
    limiter: Limiter,
    /// How request paths, and rule paths, are read before they are matched.
    path_matching: PathMatching,
    /// Serializes reloads and admin writes, so snapshots are applied in order.
    state: Mutex<State>,
    snapshot: RwLock<Arc<RuleSet>>,
    /// The snapshot's version, readable without its lock: set after the snapshot is.
    version: AtomicU64,
    stats: RulesStats,
}

/// The rules of one server: their source, the snapshot in force, and the limiter it feeds.
#[derive(Clone, Debug)]
pub struct Rules {
    inner: Arc<Inner>,
}

impl Rules {
    /// Load the source and put its rules in force on `limiter`, paths read as most routers
    /// read them ([`PathMatching::default`]). Fails if the source cannot be read: a server
    /// should not start with no idea of its limits.
    pub async fn start(
        source: impl Into<RulesSource>,
        limiter: Limiter,
    ) -> Result<Rules, SourceError> {
        Rules::start_with(source, limiter, PathMatching::default()).await
    }

    /// [`Rules::start`], request and rule paths read with `path_matching`: the reading of the
    /// router the rules guard.
    pub async fn start_with(
        source: impl Into<RulesSource>,
        limiter: Limiter,
        path_matching: PathMatching,
    ) -> Result<Rules, SourceError> {
        let rules = Rules {
            inner: Arc::new(Inner {
                source: source.into(),
                limiter,
                path_matching,
                state: Mutex::new(State {
                    version: 0,
                    in_force: BTreeMap::new(),
                    rejected: BTreeMap::new(),
                    kept: BTreeMap::new(),
                }),
                snapshot: RwLock::new(Arc::new(RuleSet::new(
                    0,
                    BTreeMap::new(),
                    Vec::new(),
                    path_matching,
                ))),
                version: AtomicU64::new(0),
                stats: RulesStats::default(),
            }),
        };
        rules.read_kept_versions().await?;
        let snapshot = rules.reload().await?;
        // A limits file is reviewed before it is served: a server that started without one of
        // its entries would enforce less than its authors wrote, and say so only in a log line.
        if let RulesSource::File(file) = &rules.inner.source
            && !snapshot.rejected().is_empty()
        {
            return Err(SourceError::Rejected {
                path: file.path().display().to_string(),
                entries: snapshot
                    .rejected()
                    .iter()
                    .map(|row| rules.inner.source.fault(row))
                    .collect(),
            });
        }
        Ok(rules)
    }

    /// Take the last valid versions kept in the state database as the versions in force before
    /// the first reload: a row that is invalid now keeps its kept version, as a row broken
    /// while running keeps the one in memory. Only rows still in the table are served, so a
    /// kept version never brings a deleted row back. A limits file keeps none: a file with a
    /// rejected entry is not served at all.
    async fn read_kept_versions(&self) -> Result<(), SourceError> {
        let RulesSource::Sql(table) = &self.inner.source else {
            return Ok(());
        };
        let mut kept = BTreeMap::new();
        for (name, version) in table.kept_versions().await? {
            match version {
                Ok(rule) => {
                    kept.insert(name, Arc::new(rule));
                }
                // Written by a build that accepted more: not a version this one can serve.
                Err(error) => tracing::warn!(
                    row = %name,
                    field = %error.field,
                    reason = %error.reason,
                    "kept rule version not valid; not used"
                ),
            }
        }
        let mut state = self.inner.state.lock().await;
        state.in_force = kept.clone();
        state.kept = kept;
        Ok(())
    }

    /// Write to `<table>_valid` the versions in force that it does not hold yet, and drop the
    /// names no longer in force (their rows are gone). A failure leaves `state.kept` as it was,
    /// so the next reload tries again; the rules in force do not depend on it.
    async fn keep_versions(&self, state: &mut State, in_force: &BTreeMap<String, Arc<Rule>>) {
        let RulesSource::Sql(table) = &self.inner.source else {
            return;
        };
        if *in_force == state.kept {
            return;
        }
        let changed: Vec<Arc<Rule>> = in_force
            .iter()
            .filter(|(name, rule)| state.kept.get(*name) != Some(*rule))
            .map(|(_, rule)| rule.clone())
            .collect();
        let dropped: Vec<String> = state
            .kept
            .keys()
            .filter(|name| !in_force.contains_key(*name))
            .cloned()
            .collect();
        match table.keep_versions(&changed, &dropped).await {
            Ok(()) => state.kept = in_force.clone(),
            Err(error) => tracing::warn!(
                %error,
                "last valid rule versions not written; retried at the next reload"
            ),
        }
    }

    /// What is wrong with the rules now, one line each: every rejected row or entry (a file's
    /// as `FILE:LINE: NAME: FIELD: REASON`) and a failed last reload. Empty when all is well.
    pub fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self
            .snapshot()
            .rejected()
            .iter()
            .map(|row| {
                let kept = if row.previous_in_force {
                    "its previous version stays in force"
                } else {
                    "not in force"
                };
                format!("{} ({kept})", self.inner.source.fault(row))
            })
            .collect();
        if let Some(error) = self.inner.stats.last_error() {
            problems.push(format!("{error}; the rules in force stay as they were"));
        }
        problems
    }

    pub fn source(&self) -> &RulesSource {
        &self.inner.source
    }

    /// The SQL table, when the rules come from one (the admin API writes it).
    fn table(&self) -> Result<&SqlSource, RulesError> {
        match &self.inner.source {
            RulesSource::Sql(source) => Ok(source),
            RulesSource::File(source) => Err(RulesError::ReadOnly {
                path: source.path().display().to_string(),
            }),
        }
    }

    pub fn limiter(&self) -> &Limiter {
        &self.inner.limiter
    }

    pub fn stats(&self) -> &RulesStats {
        &self.inner.stats
    }

    /// How request paths are read before they are matched.
    pub fn path_matching(&self) -> PathMatching {
        self.inner.path_matching
    }

    /// The rules in force now.
    pub fn snapshot(&self) -> Arc<RuleSet> {
        match self.inner.snapshot.read() {
            Ok(snapshot) => snapshot.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The version of the rules in force now, without taking their snapshot: a reader that
    /// finds a newer version than it holds takes `snapshot`, which is then at least as new.
    pub fn version(&self) -> u64 {
        self.inner.version.load(Ordering::Acquire)
    }

    /// Read the table and apply it. On a database error nothing changes.
    pub async fn reload(&self) -> Result<Arc<RuleSet>, SourceError> {
        let mut state = self.inner.state.lock().await;
        self.apply(&mut state).await
    }

    /// `reload`, under the state lock the caller holds.
    async fn apply(&self, state: &mut State) -> Result<Arc<RuleSet>, SourceError> {
        let rows = match self.inner.source.load().await {
            Ok(rows) => rows,
            Err(error) => {
                self.inner
                    .stats
                    .reloads_failed
                    .fetch_add(1, Ordering::Relaxed);
                self.inner.stats.set_last_error(Some(error.to_string()));
                return Err(error);
            }
        };
        // What is in force now and still has a row stays, as it is, while the rows are
        // decided: it fitted together before, so no row below can displace it. Rows are then
        // decided changed first (each in its previous version's place), new ones after, by
        // name within each.
        let mut fanout = Fanout::new(COUNTERS_PER_REQUEST_MAX, self.inner.path_matching);
        let mut in_force = BTreeMap::new();
        let mut rejected = BTreeMap::new();
        let mut changed_rows = Vec::new();
        let mut new_rows = Vec::new();
        for row in rows {
            let validated = row.rule.and_then(|raw| raw.validate(&row.name));
            if let Some(previous) = state.in_force.get(&row.name)
                && fanout.try_add(previous).is_ok()
            {
                in_force.insert(row.name.clone(), previous.clone());
            }
            match validated {
                // Unchanged: in force already, the same `Arc` (equality checks stay cheap).
                Ok(rule) if in_force.get(&row.name).is_some_and(|kept| **kept == rule) => {}
                validated if in_force.contains_key(&row.name) => {
                    changed_rows.push((row.name, validated, row.lines))
                }
                validated => new_rows.push((row.name, validated, row.lines)),
            }
        }
        for (name, validated, lines) in changed_rows.into_iter().chain(new_rows) {
            let previous = in_force.get(&name).cloned();
            let validated = validated.and_then(|rule| {
                if previous.is_none() && in_force.len() >= RULES_MAX {
                    return Err(RuleError {
                        field: "name".into(),
                        reason: format!("more than {RULES_MAX} rules; this one is not loaded"),
                    });
                }
                if let Some(previous) = &previous {
                    fanout.remove(previous);
                }
                match fanout.try_add(&rule) {
                    Ok(()) => Ok(rule),
                    Err(widest) => {
                        // The previous version fitted in this very place a moment ago.
                        if let Some(previous) = &previous {
                            let _ = fanout.try_add(previous);
                        }
                        Err(widest.refusal(fanout.cap()))
                    }
                }
            });
            match validated {
                Ok(rule) => {
                    in_force.insert(name, Arc::new(rule));
                }
                Err(error) => {
                    let rejection = RejectedRow {
                        line: lines.as_ref().map(|lines| lines.of(&error.field)),
                        name: name.clone(),
                        column: self.inner.source.locate(&error.field),
                        reason: error.reason,
                        previous_in_force: previous.is_some(),
                    };
                    if state.rejected.get(&name) != Some(&rejection) {
                        tracing::warn!(
                            source = %self.inner.source.describe(),
                            row = %rejection.name,
                            column = %rejection.column,
                            line = rejection.line,
                            reason = %rejection.reason,
                            previous_version_kept = rejection.previous_in_force,
                            "rules row rejected"
                        );
                    }
                    rejected.insert(name, rejection);
                }
            }
        }
        for name in state.rejected.keys() {
            if !rejected.contains_key(name) {
                tracing::info!(row = %name, "rules row no longer rejected");
            }
        }
        self.inner.stats.reloads_ok.fetch_add(1, Ordering::Relaxed);
        self.inner.stats.set_last_error(None);
        self.inner
            .stats
            .rows_rejected
            .store(rejected.len() as u64, Ordering::Relaxed);
        self.keep_versions(state, &in_force).await;
        let changed =
            state.version == 0 || in_force != state.in_force || rejected != state.rejected;
        if !changed {
            return Ok(self.snapshot());
        }
        let limits_changed = state.version == 0 || in_force != state.in_force;
        state.version += 1;
        if limits_changed {
            // Counters are kept by name in the store: replacing the table refills nothing.
            self.inner.limiter.replace_limits(LimitTable::new(
                state.version,
                in_force.values().map(|rule| rule.limit().clone()),
            ));
            tracing::info!(
                version = state.version,
                limits = in_force.len(),
                "rules applied"
            );
        }
        let snapshot = Arc::new(RuleSet::new(
            state.version,
            in_force.clone(),
            rejected.values().cloned().collect(),
            self.inner.path_matching,
        ));
        state.in_force = in_force;
        state.rejected = rejected;
        match self.inner.snapshot.write() {
            Ok(mut slot) => *slot = snapshot.clone(),
            Err(poisoned) => *poisoned.into_inner() = snapshot.clone(),
        }
        self.inner
            .version
            .store(snapshot.version, Ordering::Release);
        Ok(snapshot)
    }

    /// Validate a rule, write it to the table, and put the table in force at once. A rule that
    /// would let one request match more rules than one request may be decided on, beside the
    /// others in force (in place of this name's current version), is refused and not written.
    pub async fn put(&self, name: &str, raw: &RawRule) -> Result<Arc<Rule>, RulesError> {
        let table = self.table()?;
        let rule = raw.validate(name)?;
        // Under the state lock, so no reload changes what is in force between the check and
        // the write.
        let mut state = self.inner.state.lock().await;
        let mut fanout = Fanout::new(COUNTERS_PER_REQUEST_MAX, self.inner.path_matching);
        for other in state.in_force.values().filter(|other| other.name() != name) {
            // The set in force fits, and so does any part of it.
            let _ = fanout.try_add(other);
        }
        fanout
            .try_add(&rule)
            .map_err(|widest| RulesError::Invalid(widest.refusal(fanout.cap())))?;
        table.upsert(&rule).await?;
        let snapshot = self.apply(&mut state).await?;
        // The row just written is valid and fits beside the rules in force, so it is what is in
        // force (unless an administrator changed the table in between, in which case theirs is
        // the newer truth).
        Ok(snapshot
            .get(name)
            .cloned()
            .unwrap_or_else(|| Arc::new(rule)))
    }

    /// Delete a rule's row and put the table in force at once. Returns whether it existed.
    pub async fn delete(&self, name: &str) -> Result<bool, RulesError> {
        let existed = self.table()?.delete(name).await?;
        self.reload().await?;
        Ok(existed)
    }

    /// Reload every `interval`, and at once on a change notification where the database sends
    /// them, until `stop` turns true. Failed reloads are logged and retried at the next tick.
    pub fn spawn_reloader(
        &self,
        interval: Duration,
        mut stop: watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        let rules = self.clone();
        tokio::spawn(async move {
            let mut feed = None;
            let mut feed_wanted =
                matches!(&rules.inner.source, RulesSource::Sql(sql) if sql.backend() == "postgres");
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                if feed.is_none() && feed_wanted {
                    match rules.inner.source.change_feed().await {
                        Ok(Some(opened)) => feed = Some(opened),
                        Ok(None) => feed_wanted = false,
                        Err(error) => {
                            tracing::warn!(%error, "rules change feed unavailable; polling only")
                        }
                    }
                }
                tokio::select! {
                    _ = stop.changed() => {}
                    _ = ticker.tick() => {}
                    changed = next_change(&mut feed) => {
                        if let Err(error) = changed {
                            tracing::warn!(%error, "rules change feed lost; reconnecting");
                            feed = None;
                        }
                    }
                }
                if *stop.borrow() {
                    break;
                }
                if let Err(error) = rules.reload().await {
                    tracing::warn!(%error, "rules reload failed; the previous rules stay in force");
                }
            }
        })
    }
}

async fn next_change(feed: &mut Option<crate::sql::ChangeFeed>) -> Result<(), SourceError> {
    match feed {
        Some(feed) => feed.changed().await,
        None => std::future::pending().await,
    }
}
