//! The SQL rules source against real databases: SQLite always; PostgreSQL and MariaDB/MySQL
//! when `TOLLGATE_TEST_POSTGRES` / `TOLLGATE_TEST_MYSQL` name them (skipped loudly otherwise).
//! Each test works in its own table, so tests run in parallel and leave each other alone.
//! Waiting is a poll until true with a generous deadline, never a fixed sleep.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tollgate::{Limiter, Request};
use tollgate_rules::{RawRule, Rules, SqlSource};

/// Far beyond any reload interval used here; only a broken reload takes this long.
const DEADLINE: Duration = Duration::from_secs(30);

fn unique_table(test: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let serial = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut name = format!(
        "t{}_{}_{nanos:x}{serial}_",
        std::process::id() % 100_000,
        test
    );
    name.truncate(40);
    name
}

/// A connection for plain SQL, as an administrator would use.
enum Admin {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
    MySql(sqlx::MySqlPool),
}

impl Admin {
    async fn connect(url: &str) -> Admin {
        if url.starts_with("sqlite:") {
            Admin::Sqlite(sqlx::SqlitePool::connect(url).await.expect("sqlite"))
        } else if url.starts_with("postgres") {
            Admin::Postgres(sqlx::PgPool::connect(url).await.expect("postgres"))
        } else {
            Admin::MySql(sqlx::MySqlPool::connect(url).await.expect("mysql"))
        }
    }

    async fn exec(&self, sql: &str) {
        let result = match self {
            Admin::Sqlite(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
            Admin::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
            Admin::MySql(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
        };
        if let Err(error) = result {
            panic!("{sql}: {error}");
        }
    }

    async fn count(&self, sql: &str) -> i64 {
        let result = match self {
            Admin::Sqlite(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
            Admin::Postgres(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
            Admin::MySql(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
        };
        result.unwrap_or_else(|error| panic!("{sql}: {error}"))
    }

    async fn drop_table(&self, table: &str) {
        for sql in [
            format!("DROP TABLE IF EXISTS {table}"),
            format!("DROP TABLE IF EXISTS {table}_migrations"),
            format!("DROP TABLE IF EXISTS {table}_runs"),
            format!("DROP TABLE IF EXISTS {table}_saved"),
            format!("DROP TABLE IF EXISTS {table}_ahead"),
            format!("DROP TABLE IF EXISTS {table}_tokens"),
            format!("DROP TABLE IF EXISTS {table}_valid"),
        ] {
            let _ = match self {
                Admin::Sqlite(pool) => sqlx::query(&sql).execute(pool).await.map(|_| ()),
                Admin::Postgres(pool) => sqlx::query(&sql).execute(pool).await.map(|_| ()),
                Admin::MySql(pool) => sqlx::query(&sql).execute(pool).await.map(|_| ()),
            };
        }
        if let Admin::Postgres(pool) = self {
            let _ = sqlx::query(&format!("DROP FUNCTION IF EXISTS {table}_notify()"))
                .execute(pool)
                .await;
        }
    }
}

/// The database URLs to run on: SQLite in a temporary directory, and the others if set.
fn urls(directory: &tempfile::TempDir) -> Vec<String> {
    let mut urls = vec![format!(
        "sqlite://{}",
        directory.path().join("rules.db").display()
    )];
    for variable in ["TOLLGATE_TEST_POSTGRES", "TOLLGATE_TEST_MYSQL"] {
        match std::env::var(variable) {
            Ok(url) if !url.is_empty() => urls.push(url),
            _ => tollgate::conformance::skipped(&format!(
                "the {variable} part of this test: {variable} unset"
            )),
        }
    }
    urls
}

async fn until(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !condition().await {
        assert!(
            started.elapsed() < DEADLINE,
            "not within {DEADLINE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Setup {
    rules: Rules,
    limiter: Limiter,
    admin: Admin,
    table: String,
    stop: watch::Sender<bool>,
}

async fn setup(url: &str, test: &str, reload_interval: Duration) -> Setup {
    let table = unique_table(test);
    let source = SqlSource::connect(url, &table)
        .await
        .expect("connects and migrates");
    let limiter = Limiter::in_memory();
    let rules = Rules::start(source, limiter.clone()).await.expect("loads");
    let (stop, stopped) = watch::channel(false);
    rules.spawn_reloader(reload_interval, stopped);
    let admin = Admin::connect(url).await;
    Setup {
        rules,
        limiter,
        admin,
        table,
        stop,
    }
}

impl Setup {
    async fn finish(self) {
        let _ = self.stop.send(true);
        self.admin.drop_table(&self.table).await;
    }

    fn in_force(&self, name: &str) -> Option<u64> {
        self.limiter
            .limits()
            .get(name)
            .map(|limit| limit.policy().capacity())
    }
}

fn rate_row(table: &str, name: &str, limit: i64) -> String {
    format!(
        "INSERT INTO {table} (name, kind, limit_units, period_ms) VALUES ('{name}', 'rate', {limit}, 60000)"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_sql_edits_take_effect_within_the_reload_interval() {
    let directory = tempfile::tempdir().expect("tempdir");
    for url in urls(&directory) {
        let setup = setup(&url, "edits", Duration::from_millis(100)).await;
        let table = setup.table.clone();
        setup.admin.exec(&rate_row(&table, "vendor-x", 5)).await;
        until(&format!("{url}: insert seen"), async || {
            setup.in_force("vendor-x") == Some(5)
        })
        .await;
        setup
            .admin
            .exec(&format!(
                "UPDATE {table} SET limit_units = 7 WHERE name = 'vendor-x'"
            ))
            .await;
        until(&format!("{url}: update seen"), async || {
            setup.in_force("vendor-x") == Some(7)
        })
        .await;
        setup
            .admin
            .exec(&format!("DELETE FROM {table} WHERE name = 'vendor-x'"))
            .await;
        until(&format!("{url}: delete seen"), async || {
            setup.in_force("vendor-x").is_none()
        })
        .await;
        setup.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_row_keeps_the_last_valid_version_and_spares_the_others() {
    let directory = tempfile::tempdir().expect("tempdir");
    for url in urls(&directory) {
        let setup = setup(&url, "invalid", Duration::from_millis(100)).await;
        let table = setup.table.clone();
        setup.admin.exec(&rate_row(&table, "a", 3)).await;
        setup.admin.exec(&rate_row(&table, "b", 4)).await;
        until(&format!("{url}: rows seen"), async || {
            setup.in_force("a") == Some(3) && setup.in_force("b") == Some(4)
        })
        .await;
        // `a` turns invalid; a new row `c` is invalid from the start; `b` changes validly.
        setup
            .admin
            .exec(&format!(
                "UPDATE {table} SET limit_units = -1 WHERE name = 'a'"
            ))
            .await;
        setup
            .admin
            .exec(&format!(
                "INSERT INTO {table} (name, kind, limit_units, period_ms, algorithm) VALUES ('c', 'rate', 1, 1000, 'leaky')"
            ))
            .await;
        setup
            .admin
            .exec(&format!(
                "UPDATE {table} SET limit_units = 9 WHERE name = 'b'"
            ))
            .await;
        until(&format!("{url}: valid change seen"), async || {
            setup.in_force("b") == Some(9)
        })
        .await;
        let snapshot = setup.rules.snapshot();
        assert_eq!(
            setup.in_force("a"),
            Some(3),
            "{url}: a's last valid version stays"
        );
        assert_eq!(setup.in_force("c"), None, "{url}: c was never valid");
        let rejected = rejections(&snapshot);
        assert_eq!(
            rejected,
            vec![("a", "limit_units", true), ("c", "algorithm", false)],
            "{url}"
        );
        assert_eq!(
            setup.rules.stats().rows_rejected.load(Ordering::Relaxed),
            2,
            "{url}"
        );
        // Fixing the row puts the new version in force.
        setup
            .admin
            .exec(&format!(
                "UPDATE {table} SET limit_units = 2 WHERE name = 'a'"
            ))
            .await;
        until(&format!("{url}: fix seen"), async || {
            setup.in_force("a") == Some(2)
        })
        .await;
        setup.finish().await;
    }
}

/// The last valid version outlives the process: a row broken while no server ran keeps it at
/// the next start, a row that was never valid is absent and reported, and a row deleted
/// meanwhile is not brought back (its kept version is dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_valid_version_survives_a_restart() {
    let directory = tempfile::tempdir().expect("tempdir");
    for url in urls(&directory) {
        let setup = setup(&url, "kept", Duration::from_secs(3600)).await;
        let table = setup.table.clone();
        setup.admin.exec(&rate_row(&table, "a", 3)).await;
        setup.admin.exec(&rate_row(&table, "b", 4)).await;
        setup.rules.reload().await.expect("reload");
        setup
            .admin
            .exec(&format!(
                "UPDATE {table} SET limit_units = 5 WHERE name = 'a'"
            ))
            .await;
        setup.rules.reload().await.expect("reload");
        assert_eq!(setup.in_force("a"), Some(5), "{url}");
        let _ = setup.stop.send(true);
        // While no server runs: `a` is broken, `b` deleted, `c` written broken.
        for sql in [
            format!("UPDATE {table} SET limit_units = -1 WHERE name = 'a'"),
            format!("DELETE FROM {table} WHERE name = 'b'"),
            format!(
                "INSERT INTO {table} (name, kind, limit_units, period_ms) VALUES ('c', 'rate', 1, -5)"
            ),
        ] {
            setup.admin.exec(&sql).await;
        }
        let limiter = Limiter::in_memory();
        let source = SqlSource::connect(&url, &table).await.expect("connects");
        let restarted = Rules::start(source, limiter.clone()).await.expect("loads");
        let capacity = |name: &str| {
            limiter
                .limits()
                .get(name)
                .map(|limit| limit.policy().capacity())
        };
        assert_eq!(
            capacity("a"),
            Some(5),
            "{url}: a keeps its last valid version"
        );
        assert_eq!(capacity("b"), None, "{url}: b was deleted");
        assert_eq!(capacity("c"), None, "{url}: c was never valid");
        assert_eq!(
            rejections(&restarted.snapshot()),
            vec![("a", "limit_units", true), ("c", "period_ms", false)],
            "{url}"
        );
        assert_eq!(
            setup
                .admin
                .count(&format!("SELECT COUNT(*) FROM {table}_valid"))
                .await,
            1,
            "{url}: only a's version is kept"
        );
        setup.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_never_refills_a_live_counter() {
    let directory = tempfile::tempdir().expect("tempdir");
    let url = &urls(&directory)[0];
    let setup = setup(url, "refill", Duration::from_millis(50)).await;
    let table = setup.table.clone();
    setup.admin.exec(&rate_row(&table, "vendor-x", 2)).await;
    until("row seen", async || setup.in_force("vendor-x") == Some(2)).await;
    for _ in 0..2 {
        let permit = setup
            .limiter
            .try_acquire(&Request::new("vendor-x"))
            .await
            .expect("ok")
            .granted()
            .expect("room");
        drop(permit);
    }
    // Reloads with no change, a change elsewhere, and a change of this very limit's
    // algorithm-neutral field: none may give back a unit.
    let version = setup.rules.snapshot().version();
    setup.admin.exec(&rate_row(&table, "other", 1)).await;
    until("other seen", async || setup.in_force("other").is_some()).await;
    setup
        .admin
        .exec(&format!(
            "UPDATE {table} SET reserve_high = 1 WHERE name = 'vendor-x'"
        ))
        .await;
    until("reserve seen", async || {
        setup.rules.snapshot().version() >= version + 2
    })
    .await;
    for _ in 0..3 {
        setup.rules.reload().await.expect("reload");
        let outcome = setup
            .limiter
            .try_acquire(&Request::new("vendor-x").priority(tollgate::Priority::High))
            .await
            .expect("ok");
        assert!(!outcome.is_granted(), "a reload refilled the counter");
    }
    setup.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_writes_go_to_the_table_and_apply_at_once() {
    let directory = tempfile::tempdir().expect("tempdir");
    for url in urls(&directory) {
        // A reload interval so long that only the write path can explain the change.
        let setup = setup(&url, "writes", Duration::from_secs(3_600)).await;
        let table = setup.table.clone();
        let raw: RawRule = serde_json::from_str(
            r#"{"kind":"rate","limit":10,"period_ms":1000,"algorithm":"gcra","burst":4,
                "reserve":{"high":1},"per":"user","match":{"method":"get","path":"/e/12/b"}}"#,
        )
        .expect("json");
        let before = setup.rules.version();
        assert_eq!(before, setup.rules.snapshot().version(), "{url}");
        let stored = setup.rules.put("vendor-x", &raw).await.expect("stored");
        // The version read without the snapshot moves with it, for readers that poll it.
        assert!(setup.rules.version() > before, "{url}");
        assert_eq!(setup.rules.version(), setup.rules.snapshot().version());
        assert_eq!(stored.canonical().burst, Some(4));
        assert_eq!(setup.in_force("vendor-x"), Some(4), "{url}");
        assert_eq!(
            setup
                .admin
                .count(&format!(
                    "SELECT COUNT(*) FROM {table} WHERE name = 'vendor-x' AND match_path = '/e/#/b' AND match_method = 'GET' AND per = 'user'"
                ))
                .await,
            1,
            "{url}"
        );
        // Written again, it round-trips to the same rule.
        let again = setup
            .rules
            .put("vendor-x", stored.canonical())
            .await
            .expect("stored again");
        assert_eq!(again.canonical(), stored.canonical(), "{url}");
        assert!(setup.rules.delete("vendor-x").await.expect("deleted"));
        assert!(!setup.rules.delete("vendor-x").await.expect("absent"));
        assert_eq!(setup.in_force("vendor-x"), None, "{url}");
        setup.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_notifies_changes_without_waiting_for_the_poll() {
    let Ok(url) = std::env::var("TOLLGATE_TEST_POSTGRES") else {
        tollgate::conformance::skipped(
            "postgres_notifies_changes_without_waiting_for_the_poll: TOLLGATE_TEST_POSTGRES unset",
        );
        return;
    };
    // Polling once an hour: only the trigger's notification can bring the change in time.
    let setup = setup(&url, "notify", Duration::from_secs(3_600)).await;
    let table = setup.table.clone();
    // The listener starts in the background; repeat the edit until it is heard.
    let started = Instant::now();
    let mut limit = 1;
    loop {
        setup
            .admin
            .exec(&format!(
                "INSERT INTO {table} (name, kind, limit_units, period_ms) VALUES ('n', 'rate', {limit}, 1000)
                 ON CONFLICT (name) DO UPDATE SET limit_units = excluded.limit_units"
            ))
            .await;
        let seen = Instant::now();
        let mut heard = false;
        while seen.elapsed() < Duration::from_secs(2) {
            if setup.in_force("n") == Some(limit) {
                heard = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if heard {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no notification within {DEADLINE:?}"
        );
        limit += 1;
    }
    setup.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_of_the_wrong_type_reject_only_their_row() {
    let directory = tempfile::tempdir().expect("tempdir");
    let url = &urls(&directory)[0];
    let setup = setup(url, "types", Duration::from_millis(50)).await;
    let table = setup.table.clone();
    setup.admin.exec(&rate_row(&table, "good", 3)).await;
    // SQLite stores whatever it is given: text in an integer column must not crash anything.
    setup
        .admin
        .exec(&format!(
            "INSERT INTO {table} (name, kind, limit_units, period_ms) VALUES ('bad', 'rate', 'ten', 1000)"
        ))
        .await;
    until("rows seen", async || {
        setup.in_force("good") == Some(3) && !setup.rules.snapshot().rejected().is_empty()
    })
    .await;
    let snapshot = setup.rules.snapshot();
    assert_eq!(snapshot.rejected()[0].name, "bad");
    assert_eq!(snapshot.rejected()[0].column, "limit_units");
    // Said in SQL's terms, not the reader's types.
    assert_eq!(
        snapshot.rejected()[0].reason,
        "must be an integer, found TEXT"
    );
    assert!(setup.in_force("bad").is_none());
    setup.finish().await;
}

#[tokio::test]
async fn bad_urls_and_table_names_are_refused_clearly() {
    let error = SqlSource::connect("oracle://x", "t")
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("sqlite://"), "{error}");
    let error = SqlSource::connect("sqlite::memory:", "bad-name")
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("bad-name"), "{error}");
}

/// A row on every method and path, counted per user: a user's overall frequency.
fn broad_row(table: &str, name: &str) -> String {
    format!(
        "INSERT INTO {table} (name, kind, limit_units, period_ms, per, match_method, match_path) VALUES ('{name}', 'rate', 1000, 60000, 'user', '*', '*')"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_that_would_let_one_request_match_too_many_rules_are_rejected() {
    let directory = tempfile::tempdir().expect("tempdir");
    for url in urls(&directory) {
        let setup = setup(&url, "fanout", Duration::from_millis(50)).await;
        let table = setup.table.clone();
        // Seven broad rules and an endpoint rule: a GET on the endpoint matches 8, the most one
        // request may be decided on.
        for n in 0..7 {
            setup.admin.exec(&broad_row(&table, &format!("b{n}"))).await;
        }
        setup
            .admin
            .exec(&format!(
                "INSERT INTO {table} (name, kind, limit_units, period_ms, algorithm, per, match_method, match_path) VALUES ('entity-bundle', 'rate', 1, 3600000, 'fixed', 'user', 'GET', '/repo/v1/entity/#/bundle')"
            ))
            .await;
        setup
            .admin
            .exec(&format!(
                "INSERT INTO {table} (name, kind, limit_units, period_ms, match_method, match_path) VALUES ('other', 'rate', 5, 1000, 'POST', '/other')"
            ))
            .await;
        until(&format!("{url}: the rules are in force"), async || {
            setup.rules.snapshot().len() == 9
        })
        .await;
        // A new broad row, named to come first, and a change that would make `other` broad: each
        // would let a GET on the endpoint match 9 rules.
        setup.admin.exec(&broad_row(&table, "a-new")).await;
        setup
            .admin
            .exec(&format!(
                "UPDATE {table} SET match_method = '*', match_path = '*' WHERE name = 'other'"
            ))
            .await;
        until(&format!("{url}: the rows are rejected"), async || {
            setup.rules.snapshot().rejected().len() == 2
        })
        .await;
        let snapshot = setup.rules.snapshot();
        let rejected = rejections(&snapshot);
        assert_eq!(
            rejected,
            vec![
                ("a-new", "match_path", false),
                ("other", "match_path", true)
            ],
            "{url}"
        );
        for row in snapshot.rejected() {
            assert_eq!(
                row.reason,
                "a GET request on /repo/v1/entity/#/bundle would match 9 rules; one request may be decided on at most 8",
                "{url}: {row:?}"
            );
        }
        // What was in force stays, `other` in its previous version.
        assert_eq!(setup.in_force("a-new"), None);
        assert_eq!(setup.in_force("entity-bundle"), Some(1));
        for n in 0..7 {
            assert!(setup.in_force(&format!("b{n}")).is_some(), "b{n}");
        }
        let other = snapshot.get("other").expect("in force");
        assert_eq!(other.matcher().map(|m| m.path()), Some("/other"));
        let matched: Vec<&str> = snapshot
            .matching("GET", "/repo/v1/entity/#/bundle")
            .map(|rule| rule.name())
            .collect();
        assert_eq!(
            matched,
            ["b0", "b1", "b2", "b3", "b4", "b5", "b6", "entity-bundle"]
        );
        // Room made by deleting a broad rule goes to the changed row first, then to new ones.
        setup
            .admin
            .exec(&format!("DELETE FROM {table} WHERE name = 'b6'"))
            .await;
        until(&format!("{url}: the change is in force"), async || {
            setup
                .rules
                .snapshot()
                .get("other")
                .is_some_and(|rule| rule.matcher().is_some_and(|m| m.path() == "*"))
        })
        .await;
        let snapshot = setup.rules.snapshot();
        let rejected: Vec<&str> = snapshot
            .rejected()
            .iter()
            .map(|row| row.name.as_str())
            .collect();
        assert_eq!(rejected, ["a-new"], "{url}");
        setup
            .admin
            .exec(&format!("DELETE FROM {table} WHERE name = 'b5'"))
            .await;
        until(&format!("{url}: the new row is in force"), async || {
            setup.in_force("a-new").is_some()
        })
        .await;
        assert!(setup.rules.snapshot().rejected().is_empty(), "{url}");
        setup.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_write_that_would_let_one_request_match_too_many_rules_is_refused() {
    let directory = tempfile::tempdir().expect("tempdir");
    for url in urls(&directory) {
        let setup = setup(&url, "fanout_put", Duration::from_secs(3_600)).await;
        let table = setup.table.clone();
        let broad: RawRule = serde_json::from_str(
            r#"{"kind":"rate","limit":1000,"period_ms":60000,"per":"user","match":{"method":"*","path":"*"}}"#,
        )
        .expect("json");
        for n in 0..8 {
            setup
                .rules
                .put(&format!("b{n}"), &broad)
                .await
                .expect("fits");
        }
        // Replacing a rule does not count it twice.
        setup.rules.put("b0", &broad).await.expect("replaced");
        let error = setup
            .rules
            .put("b8", &broad)
            .await
            .expect_err("a ninth broad rule is refused");
        let tollgate_rules::RulesError::Invalid(error) = error else {
            panic!("not a refusal of the rule: {error}");
        };
        assert_eq!(error.field, "match");
        assert_eq!(
            error.reason,
            "any request would match 9 rules; one request may be decided on at most 8"
        );
        assert_eq!(
            setup
                .admin
                .count(&format!("SELECT COUNT(*) FROM {table} WHERE name = 'b8'"))
                .await,
            0,
            "nothing was written"
        );
        assert_eq!(setup.in_force("b8"), None);
        setup.finish().await;
    }
}

/// The rejected rows of a snapshot: name, column, whether a previous version stays in force.
fn rejections(snapshot: &tollgate_rules::RuleSet) -> Vec<(&str, &str, bool)> {
    snapshot
        .rejected()
        .iter()
        .map(|row| {
            (
                row.name.as_str(),
                row.column.as_str(),
                row.previous_in_force,
            )
        })
        .collect()
}

/// What the state database remembers of the memory store's runs, on every backend: nothing
/// before the first; a run taken over, with its boot; batches of write-ahead records (in
/// several statements, keys that differ only in case or trailing spaces kept apart) and
/// pauses, replaced and forgotten as the batches say; a second server's take-over fencing the
/// first off, whose writes then change nothing; a clean stop replacing every record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_and_write_ahead_records_round_trip() {
    use tollgate::{MemorySnapshot, RecordBatch, SavedCounter};
    use tollgate_rules::{PreviousRun, SourceError};

    fn sorted(mut snapshot: MemorySnapshot) -> MemorySnapshot {
        snapshot
            .counters
            .sort_by(|a, b| (&a.limit, &a.key).cmp(&(&b.limit, &b.key)));
        snapshot.pauses.sort();
        snapshot
    }

    let directory = tempfile::tempdir().expect("tempdir");
    for url in urls(&directory) {
        let table = unique_table("runs");
        let source = SqlSource::connect(&url, &table).await.expect("connect");
        let writer = source.for_write_ahead().await.expect("writer");
        let admin = Admin::connect(&url).await;
        assert_eq!(source.previous_run("memory").await.expect("read"), None);
        let first = source
            .take_over("memory", "owner-a", Some("boot-1"), 100)
            .await
            .expect("take over");
        assert_eq!(first, None, "{url}");
        let running = PreviousRun {
            granting_until_us: 100,
            clean: false,
            ahead: true,
            boot: Some("boot-1".into()),
            held_since_us: 0,
        };
        assert_eq!(
            source.previous_run("memory").await.expect("read"),
            Some(running.clone())
        );
        source
            .heartbeat_of("memory", "owner-a", 200)
            .await
            .expect("heartbeat");
        let keys = ["user", "User", "user ", "ü"];
        let mut counters: Vec<SavedCounter> = (0..2_500u64)
            .map(|n| SavedCounter {
                limit: format!("limit-{}", n % 7),
                // Each limit's one counter once; keys for the rest.
                key: (n >= 7).then(|| format!("{}-{n}", keys[(n % 4) as usize])),
                state: vec![n, n + 1, 0, 3, u64::MAX - n],
                budget: n % 13,
            })
            .collect();
        for key in keys {
            counters.push(SavedCounter {
                limit: "case".into(),
                key: Some(key.into()),
                state: vec![1, 2, 0, 0],
                budget: 3,
            });
        }
        let mut batch = RecordBatch::default();
        batch.counters = counters.clone();
        batch.pauses = Some(vec![("vendor".into(), 900), ("other".into(), 950)]);
        writer
            .write_ahead("memory", "owner-a", &batch)
            .await
            .unwrap_or_else(|error| panic!("{url}: {error}"));
        let mut expected = MemorySnapshot {
            counters,
            pauses: vec![("vendor".into(), 900), ("other".into(), 950)],
            taken_at_us: 0,
        };
        assert_eq!(
            sorted(source.ahead_records("memory").await.expect("read")),
            sorted(expected.clone()),
            "{url}"
        );
        // A later batch replaces one record, forgets another, and leaves the pauses.
        let mut batch = RecordBatch::default();
        batch.counters = vec![SavedCounter {
            limit: "case".into(),
            key: Some("User".into()),
            state: vec![7, 8, 0, 0],
            budget: 5,
        }];
        batch.forgotten = vec![("case".into(), Some("user ".into()))];
        writer
            .write_ahead("memory", "owner-a", &batch)
            .await
            .expect("second batch");
        expected.counters.retain(|saved| {
            saved.limit != "case" || !matches!(saved.key.as_deref(), Some("User" | "user "))
        });
        expected.counters.extend(batch.counters.clone());
        assert_eq!(
            sorted(source.ahead_records("memory").await.expect("read")),
            sorted(expected.clone()),
            "{url}"
        );
        // A second server takes the run over: the first is fenced off.
        let previous = source
            .take_over("memory", "owner-b", None, 300)
            .await
            .expect("take over");
        assert_eq!(
            previous,
            Some(PreviousRun {
                granting_until_us: 200,
                ..running
            }),
            "{url}"
        );
        let fenced = writer.write_ahead("memory", "owner-a", &batch).await;
        assert!(
            matches!(fenced, Err(SourceError::Fenced { .. })),
            "{url}: {fenced:?}"
        );
        let fenced = source.heartbeat_of("memory", "owner-a", 400).await;
        assert!(
            matches!(fenced, Err(SourceError::Fenced { .. })),
            "{url}: {fenced:?}"
        );
        assert_eq!(
            sorted(source.ahead_records("memory").await.expect("read")),
            sorted(expected.clone()),
            "{url}: a fenced writer changes nothing"
        );
        // The second's clean stop: every record replaced, the run clean.
        let last = MemorySnapshot {
            counters: vec![SavedCounter {
                limit: "limit-1".into(),
                key: None,
                state: vec![3, 4, 0, 0],
                budget: 0,
            }],
            pauses: vec![("vendor".into(), 990)],
            taken_at_us: 0,
        };
        let stale = MemorySnapshot::default();
        let fenced = source
            .replace_records("memory", "owner-a", &stale, Some(500))
            .await;
        assert!(
            matches!(fenced, Err(SourceError::Fenced { .. })),
            "{url}: {fenced:?}"
        );
        source
            .replace_records("memory", "owner-b", &last, Some(600))
            .await
            .expect("clean stop");
        assert_eq!(
            source.previous_run("memory").await.expect("read"),
            Some(PreviousRun {
                granting_until_us: 600,
                clean: true,
                ahead: true,
                boot: None,
                held_since_us: 0,
            }),
            "{url}"
        );
        assert_eq!(
            source.ahead_records("memory").await.expect("read"),
            last,
            "{url}"
        );
        // A record edited into something no counter wrote comes back with no state, which the
        // store refuses (and holds the limit for): nothing is silently read as zero.
        admin
            .exec(&format!(
                "UPDATE {table}_ahead SET state = 'x 1' WHERE kind = 'counter'"
            ))
            .await;
        let edited = source.ahead_records("memory").await.expect("read");
        assert!(edited.counters[0].state.is_empty(), "{url}");
        // An older server's clean stop, in `<table>_saved`: read, and gone with the next
        // replacement of the records.
        admin
            .exec(&format!(
                "INSERT INTO {table}_saved (store, seq, kind, limit_name, counter_key, state) \
                 VALUES ('memory', 0, 'counter', 'legacy', NULL, '1 2 0 0')"
            ))
            .await;
        let saved = source.saved("memory").await.expect("read");
        assert_eq!(saved.counters.len(), 1, "{url}");
        assert_eq!(saved.counters[0].state, [1, 2, 0, 0], "{url}");
        source
            .replace_records("memory", "owner-b", &last, None)
            .await
            .expect("records");
        assert_eq!(
            source.saved("memory").await.expect("read"),
            MemorySnapshot::default(),
            "{url}"
        );
        // Records that cannot be trusted go, and the hold is kept with the run.
        source
            .forget_records("memory", "owner-b", 700)
            .await
            .expect("forget");
        assert_eq!(
            source.ahead_records("memory").await.expect("read"),
            MemorySnapshot::default(),
            "{url}"
        );
        let previous = source.previous_run("memory").await.expect("read");
        assert_eq!(previous.map(|run| run.held_since_us), Some(700), "{url}");
        // A Redis namespace's row is its own, and no write-ahead's.
        source.begin_run("redis:ns", 0).await.expect("begin");
        assert_eq!(
            source.previous_run("redis:ns").await.expect("read"),
            Some(PreviousRun {
                granting_until_us: 0,
                clean: false,
                ahead: false,
                boot: None,
                held_since_us: 0,
            })
        );
        admin.drop_table(&table).await;
    }
}

/// Scoped data tokens on every backend: stored as given (the hash, never a secret), listed in
/// name order, a second token of a name refused and the first left as it was, and deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_rows_round_trip() {
    use tollgate_rules::TokenRow;

    let directory = tempfile::tempdir().expect("tempdir");
    for url in urls(&directory) {
        let table = unique_table("tokens");
        let source = SqlSource::connect(&url, &table).await.expect("connect");
        let admin = Admin::connect(&url).await;
        assert_eq!(source.tokens().await.expect("read"), Vec::new(), "{url}");
        let row = |name: &str, hash: char| TokenRow {
            name: name.to_owned(),
            secret_sha256: hash.to_string().repeat(64),
            limits: r#"["vendor-*","billing"]"#.to_owned(),
            priority_max: "normal".to_owned(),
            may_pause: name == "b",
            created_ms: 1_700_000_000_000,
            // Read back as stored, a bound and its absence alike.
            cost_max: (name == "a").then_some(5),
            wait_max_ms: (name == "b").then_some(250),
        };
        assert!(source.insert_token(&row("b", 'b')).await.expect("insert"));
        assert!(source.insert_token(&row("a", 'a')).await.expect("insert"));
        // A name taken: refused, not replaced, and no error.
        let mut again = row("a", 'c');
        again.priority_max = "high".to_owned();
        assert!(!source.insert_token(&again).await.expect("insert"), "{url}");
        assert_eq!(
            source.tokens().await.expect("read"),
            vec![row("a", 'a'), row("b", 'b')],
            "{url}"
        );
        assert!(source.delete_token("a").await.expect("delete"));
        assert!(!source.delete_token("a").await.expect("delete"), "{url}");
        assert_eq!(
            source.tokens().await.expect("read"),
            vec![row("b", 'b')],
            "{url}"
        );
        assert_eq!(
            admin
                .count(&format!("SELECT COUNT(*) FROM {table}_tokens"))
                .await,
            1,
            "{url}"
        );
        admin.drop_table(&table).await;
    }
}
