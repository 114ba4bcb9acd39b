//! The SQL rules source: one table that administrators edit with plain SQL, on SQLite (the
//! default, a file created on first start), PostgreSQL or MySQL/MariaDB. This module owns the
//! schema and its migrations, reading rows into `RawRule`s (a cell of the wrong type refuses
//! that row, naming its column), writing the admin API's changes, and PostgreSQL's change feed
//! (a trigger that NOTIFYs, so an edit reloads at once rather than at the next poll). Beside
//! the rules table it keeps the server's state: its runs (`runs.rs`), the memory store's
//! write-ahead records (`write_ahead.rs`), its scoped data tokens (`tokens.rs`) and the last valid
//! version of each rule (`valid.rs`).
//!
//! The table name is configurable so that several deployments (or tests) share one database;
//! it is spliced into SQL text, so it is validated to a plain identifier first.

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{ColumnIndex, Decode, Row, Type, TypeInfo, ValueRef};

use crate::rule::{RawMatch, RawReserve, RawRule, Rule, RuleError};

/// The default rules table.
pub const DEFAULT_TABLE: &str = "tollgate_limits";
/// Longest table name, in bytes; leaves room for the suffixes of the derived names.
pub const TABLE_NAME_BYTES_MAX: usize = 40;
/// Connections per rules pool: reloads and admin writes are rare and short.
const POOL_CONNECTIONS_MAX: u32 = 4;
/// How long to wait for a connection before calling the database unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long SQLite waits on a lock held by another writer (an administrator's `sqlite3`).
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The table's columns, in the order every query uses.
pub const COLUMNS: [&str; 14] = [
    "name",
    "kind",
    "limit_units",
    "period_ms",
    "algorithm",
    "burst",
    "margin_ms",
    "lease_ttl_ms",
    "reserve_high",
    "reserve_normal",
    "per",
    "match_method",
    "match_path",
    "keys_max",
];

/// The column that holds a rule field, for reporting a row's error in the table's terms.
pub fn column_of(field: &str) -> &str {
    match field {
        "limit" => "limit_units",
        "reserve.high" | "reserve" => "reserve_high",
        "reserve.normal" => "reserve_normal",
        "match.method" => "match_method",
        // A rule's `match` as a whole (how many rules one request matches): its path column.
        "match" | "match.path" => "match_path",
        other => other,
    }
}

/// A failure of the rules database, not of a rule.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    #[error("rules URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("rules table name {name:?}: {reason}")]
    BadTable { name: String, reason: String },
    #[error("rules database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("limits file {path}: {reason}")]
    File { path: String, reason: String },
    /// Another server took over this store's run in the state database: this one may write
    /// nothing more for it (`take_over`).
    #[error("the state database's run of store {store:?} was taken over by another server")]
    Fenced { store: String },
    /// A limits file with entries that are not rules: it is not served until every one is.
    #[error("limits file {path} is not served: {} rejected:\n  {}", plural(entries.len()), entries.join("\n  "))]
    Rejected { path: String, entries: Vec<String> },
}

fn plural(entries: usize) -> String {
    match entries {
        1 => "1 entry is".to_owned(),
        n => format!("{n} entries are"),
    }
}

impl SourceError {
    /// Whether trying again later, unchanged, may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, SourceError::Database(_) | SourceError::File { .. })
    }
}

/// One row of the rules table, read but not yet validated.
#[derive(Clone, Debug)]
pub struct TableRow {
    pub name: String,
    /// The row as a rule, or the first cell that could not be read.
    pub rule: Result<RawRule, RuleError>,
    /// Where a limits file writes the entry, to report a fault at its line; none for a table.
    pub lines: Option<crate::file::EntryLines>,
}

#[derive(Clone, Debug)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
    MySql(MySqlPool),
}

/// Runs the same code on whichever pool this source has; sqlx's query API is alike on all.
macro_rules! on_pool {
    ($pool:expr, $name:ident => $body:expr) => {
        match $pool {
            Pool::Sqlite($name) => $body,
            Pool::Postgres($name) => $body,
            Pool::MySql($name) => $body,
        }
    };
}

mod runs;
mod tokens;
mod valid;
mod write_ahead;

pub use runs::PreviousRun;
pub use tokens::TokenRow;

/// A connected rules database.
#[derive(Clone, Debug)]
pub struct SqlSource {
    pool: Pool,
    table: String,
    select: String,
    upsert: String,
    delete: String,
}

/// Why `name` cannot be a table name, if it cannot.
pub fn check_table_name(name: &str) -> Result<(), String> {
    let bytes = name.as_bytes();
    let lead_ok = bytes
        .first()
        .is_some_and(|b| b.is_ascii_lowercase() || *b == b'_');
    let rest_ok = bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_');
    if !lead_ok || !rest_ok || bytes.len() > TABLE_NAME_BYTES_MAX {
        return Err(format!(
            "must match [a-z_][a-z0-9_]* and be at most {TABLE_NAME_BYTES_MAX} bytes"
        ));
    }
    Ok(())
}

fn bad_url(url: &str, reason: impl Into<String>) -> SourceError {
    SourceError::BadUrl {
        url: redact(url),
        reason: reason.into(),
    }
}

/// The URL without its password, for messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    match authority.rsplit_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _password)) => {
                let slash = if rest.contains('/') { "/" } else { "" };
                format!("{scheme}://{user}:***@{host}{slash}{path}")
            }
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// A SQLite file holds every user key the server has counted and the limits in force: it is
/// made readable by this user alone (mode 0600) before SQLite opens it, and a looser one,
/// with its `-wal` and `-shm` companions, is tightened. SQLite gives the companions it makes
/// the database file's mode.
fn keep_private(url: &str, path: &std::path::Path) -> Result<(), SourceError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let text = path.to_string_lossy();
        if text.is_empty() || text == ":memory:" {
            return Ok(());
        }
        let private = |error: std::io::Error| {
            bad_url(
                url,
                format!("making it readable by this user alone (0600): {error}"),
            )
        };
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            // A directory that is not there yet is SQLite's to report, as before.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(private(error)),
        }
        for suffix in ["", "-wal", "-shm"] {
            let file = std::path::PathBuf::from(format!("{text}{suffix}"));
            let Ok(metadata) = std::fs::metadata(&file) else {
                continue;
            };
            let mode = metadata.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                    .map_err(private)?;
                tracing::warn!(
                    path = %file.display(),
                    was = format!("{mode:o}"),
                    "state file was readable by others; made it 0600"
                );
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (url, path);
    Ok(())
}

impl SqlSource {
    /// On SQLite, move what the write-ahead log holds into the database file and empty the log,
    /// so no older copy of a deleted row stays in it; nothing on other databases.
    pub async fn checkpoint(&self) -> Result<(), SourceError> {
        if let Pool::Sqlite(pool) = &self.pool {
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(pool)
                .await?;
        }
        Ok(())
    }

    /// Connect by URL (`sqlite://FILE`, `postgres://...`, `mysql://...` or `mariadb://...`),
    /// creating a SQLite file if missing, and bring the table's schema up to date.
    pub async fn connect(url: &str, table: &str) -> Result<SqlSource, SourceError> {
        check_table_name(table).map_err(|reason| SourceError::BadTable {
            name: table.to_owned(),
            reason,
        })?;
        let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
        let pool = match scheme {
            "sqlite" => {
                let options = SqliteConnectOptions::from_str(url)
                    .map_err(|error| bad_url(url, error.to_string()))?;
                keep_private(url, options.get_filename())?;
                let options = options
                    .create_if_missing(true)
                    // WAL lets an administrator's writes and our reads proceed side by side.
                    .journal_mode(SqliteJournalMode::Wal)
                    // A deleted or replaced row is overwritten with zeros: a user's record
                    // (its grant times, to the microsecond) leaves the file when its counter
                    // goes idle, not whenever SQLite reuses the page.
                    .pragma("secure_delete", "ON")
                    // And the log of writes is cut back whenever it starts over, so that older
                    // copies of those rows do not linger at its end.
                    .pragma("journal_size_limit", "0")
                    .busy_timeout(SQLITE_BUSY_TIMEOUT);
                Pool::Sqlite(
                    SqlitePoolOptions::new()
                        .max_connections(POOL_CONNECTIONS_MAX)
                        .acquire_timeout(CONNECT_TIMEOUT)
                        .connect_with(options)
                        .await?,
                )
            }
            "postgres" | "postgresql" => {
                let options = PgConnectOptions::from_str(url)
                    .map_err(|error| bad_url(url, error.to_string()))?;
                Pool::Postgres(
                    PgPoolOptions::new()
                        .max_connections(POOL_CONNECTIONS_MAX)
                        .acquire_timeout(CONNECT_TIMEOUT)
                        .connect_with(options)
                        .await?,
                )
            }
            "mysql" | "mariadb" => {
                let url_mysql = match url.strip_prefix("mariadb:") {
                    Some(rest) => format!("mysql:{rest}"),
                    None => url.to_owned(),
                };
                let options = MySqlConnectOptions::from_str(&url_mysql)
                    .map_err(|error| bad_url(url, error.to_string()))?;
                Pool::MySql(
                    MySqlPoolOptions::new()
                        .max_connections(POOL_CONNECTIONS_MAX)
                        .acquire_timeout(CONNECT_TIMEOUT)
                        .connect_with(options)
                        .await?,
                )
            }
            _ => {
                return Err(bad_url(
                    url,
                    "must start with sqlite://, postgres://, mysql:// or mariadb://",
                ));
            }
        };
        let source = SqlSource::with_pool(pool, table);
        source.migrate().await?;
        Ok(source)
    }

    fn with_pool(pool: Pool, table: &str) -> SqlSource {
        let columns = COLUMNS.join(", ");
        let placeholders: Vec<String> = (1..=COLUMNS.len())
            .map(|index| match pool {
                Pool::Postgres(_) => format!("${index}"),
                Pool::Sqlite(_) | Pool::MySql(_) => "?".to_owned(),
            })
            .collect();
        let updates: Vec<String> = COLUMNS[1..]
            .iter()
            .map(|column| match pool {
                Pool::MySql(_) => format!("{column} = VALUES({column})"),
                Pool::Sqlite(_) | Pool::Postgres(_) => format!("{column} = excluded.{column}"),
            })
            .collect();
        let conflict = match pool {
            Pool::MySql(_) => "ON DUPLICATE KEY UPDATE".to_owned(),
            Pool::Sqlite(_) | Pool::Postgres(_) => "ON CONFLICT (name) DO UPDATE SET".to_owned(),
        };
        SqlSource {
            select: format!("SELECT {columns} FROM {table} ORDER BY name"),
            upsert: format!(
                "INSERT INTO {table} ({columns}) VALUES ({}) {conflict} {}",
                placeholders.join(", "),
                updates.join(", ")
            ),
            delete: format!("DELETE FROM {table} WHERE name = {}", placeholders[0]),
            table: table.to_owned(),
            pool,
        }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// Which database this is: `sqlite`, `postgres` or `mysql`.
    pub fn backend(&self) -> &'static str {
        match self.pool {
            Pool::Sqlite(_) => "sqlite",
            Pool::Postgres(_) => "postgres",
            Pool::MySql(_) => "mysql",
        }
    }

    /// The migrations, in order; each is a list of statements that can run again safely.
    fn migrations(&self) -> Vec<(i64, Vec<String>)> {
        let table = &self.table;
        let create = match self.pool {
            Pool::Sqlite(_) => format!(
                "CREATE TABLE IF NOT EXISTS {table} (
                    name TEXT NOT NULL PRIMARY KEY,
                    kind TEXT NOT NULL,
                    limit_units INTEGER,
                    period_ms INTEGER,
                    algorithm TEXT,
                    burst INTEGER,
                    margin_ms INTEGER,
                    lease_ttl_ms INTEGER,
                    reserve_high INTEGER,
                    reserve_normal INTEGER,
                    per TEXT,
                    match_method TEXT,
                    match_path TEXT
                )"
            ),
            Pool::Postgres(_) | Pool::MySql(_) => format!(
                "CREATE TABLE IF NOT EXISTS {table} (
                    name VARCHAR(128) NOT NULL PRIMARY KEY,
                    kind VARCHAR(16) NOT NULL,
                    limit_units BIGINT,
                    period_ms BIGINT,
                    algorithm VARCHAR(16),
                    burst BIGINT,
                    margin_ms BIGINT,
                    lease_ttl_ms BIGINT,
                    reserve_high BIGINT,
                    reserve_normal BIGINT,
                    per VARCHAR(256),
                    match_method VARCHAR(16),
                    match_path VARCHAR(1024)
                )"
            ),
        };
        let mut first = vec![create];
        if let Pool::Postgres(_) = self.pool {
            // Statement-level, so a bulk edit is one notification.
            first.push(format!(
                "CREATE OR REPLACE FUNCTION {table}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN PERFORM pg_notify('{channel}', TG_OP); RETURN NULL; END $$",
                channel = self.channel()
            ));
            first.push(format!("DROP TRIGGER IF EXISTS {table}_changed ON {table}"));
            first.push(format!(
                "CREATE TRIGGER {table}_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
                 ON {table} FOR EACH STATEMENT EXECUTE FUNCTION {table}_notify()"
            ));
        }
        let keys_max = match self.pool {
            Pool::Sqlite(_) => format!("ALTER TABLE {table} ADD COLUMN keys_max INTEGER"),
            Pool::Postgres(_) => {
                format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS keys_max BIGINT")
            }
            Pool::MySql(_) => format!("ALTER TABLE {table} ADD COLUMN keys_max BIGINT"),
        };
        vec![
            (1, first),
            (2, self.runs_migration()),
            (3, vec![keys_max]),
            (4, self.tokens_migration()),
            (5, self.valid_migration()),
            (6, self.ahead_migration()),
            (7, self.token_bounds_migration()),
        ]
    }

    fn channel(&self) -> String {
        format!("{}_changed", self.table)
    }

    /// Apply the migrations not yet recorded in `<table>_migrations`.
    async fn migrate(&self) -> Result<(), SourceError> {
        let table = &self.table;
        let ledger = format!("{table}_migrations");
        let create_ledger =
            format!("CREATE TABLE IF NOT EXISTS {ledger} (version BIGINT NOT NULL PRIMARY KEY)");
        let select_versions = format!("SELECT version FROM {ledger}");
        let record = match self.pool {
            Pool::Postgres(_) => {
                format!("INSERT INTO {ledger} (version) VALUES ($1) ON CONFLICT DO NOTHING")
            }
            Pool::Sqlite(_) => format!("INSERT OR IGNORE INTO {ledger} (version) VALUES (?)"),
            Pool::MySql(_) => format!("INSERT IGNORE INTO {ledger} (version) VALUES (?)"),
        };
        match &self.pool {
            Pool::Postgres(pool) => {
                // DDL is transactional here: one server migrates, concurrent starts wait.
                let mut transaction = pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                    .bind(&ledger)
                    .execute(&mut *transaction)
                    .await?;
                sqlx::query(&create_ledger)
                    .execute(&mut *transaction)
                    .await?;
                let applied: Vec<i64> = sqlx::query_scalar(&select_versions)
                    .fetch_all(&mut *transaction)
                    .await?;
                for (version, statements) in self.migrations() {
                    if applied.contains(&version) {
                        continue;
                    }
                    for statement in statements {
                        sqlx::query(&statement).execute(&mut *transaction).await?;
                    }
                    sqlx::query(&record)
                        .bind(version)
                        .execute(&mut *transaction)
                        .await?;
                    tracing::info!(table = %table, version, "rules table migrated");
                }
                transaction.commit().await?;
            }
            other => on_pool!(other, pool => {
                // Every statement is idempotent, so concurrent starts at worst repeat one.
                sqlx::query(&create_ledger).execute(pool).await?;
                let applied: Vec<i64> = sqlx::query_scalar(&select_versions).fetch_all(pool).await?;
                for (version, statements) in self.migrations() {
                    if applied.contains(&version) {
                        continue;
                    }
                    for statement in statements {
                        match sqlx::query(&statement).execute(pool).await {
                            // A column another start added meanwhile (SQLite and MySQL cannot
                            // say ADD COLUMN IF NOT EXISTS).
                            Err(error) if added_already(&error) => {}
                            other => { other?; }
                        }
                    }
                    sqlx::query(&record).bind(version).execute(pool).await?;
                    tracing::info!(table = %table, version, "rules table migrated");
                }
            }),
        }
        Ok(())
    }

    /// Every row of the table, in name order.
    pub async fn load(&self) -> Result<Vec<TableRow>, SourceError> {
        let rows = on_pool!(&self.pool, pool => {
            sqlx::query(&self.select)
                .fetch_all(pool)
                .await?
                .iter()
                .enumerate()
                .map(|(index, row)| decode_row(index, row))
                .collect()
        });
        Ok(rows)
    }

    /// Insert or replace the row of a validated rule, in its canonical form.
    pub async fn upsert(&self, rule: &Rule) -> Result<(), SourceError> {
        let raw = rule.canonical();
        let reserve = raw.reserve.clone().unwrap_or_default();
        let matcher = raw.matcher.clone().unwrap_or_default();
        on_pool!(&self.pool, pool => {
            sqlx::query(&self.upsert)
                .bind(rule.name())
                .bind(raw.kind.clone())
                .bind(raw.limit)
                .bind(raw.period_ms)
                .bind(raw.algorithm.clone())
                .bind(raw.burst)
                .bind(raw.margin_ms)
                .bind(raw.lease_ttl_ms)
                .bind(reserve.high)
                .bind(reserve.normal)
                .bind(raw.per.clone())
                .bind(matcher.method)
                .bind(matcher.path)
                .bind(raw.keys_max)
                .execute(pool)
                .await?;
        });
        Ok(())
    }

    /// Delete a rule's row; returns whether there was one.
    pub async fn delete(&self, name: &str) -> Result<bool, SourceError> {
        let affected = on_pool!(&self.pool, pool => {
            sqlx::query(&self.delete).bind(name).execute(pool).await?.rows_affected()
        });
        Ok(affected > 0)
    }

    /// A round trip to the database, for readiness checks.
    pub async fn ping(&self) -> Result<(), SourceError> {
        on_pool!(&self.pool, pool => {
            sqlx::query("SELECT 1").execute(pool).await?;
        });
        Ok(())
    }

    /// Notifications of changes to the table, where the database can send them (PostgreSQL).
    pub async fn change_feed(&self) -> Result<Option<ChangeFeed>, SourceError> {
        let Pool::Postgres(pool) = &self.pool else {
            return Ok(None);
        };
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(&self.channel()).await?;
        Ok(Some(ChangeFeed { listener }))
    }
}

/// Whether a migration's ADD COLUMN failed only because the column is there.
fn added_already(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|error| error.message().to_lowercase().contains("duplicate column"))
}

/// PostgreSQL's notifications for the rules table.
#[derive(Debug)]
pub struct ChangeFeed {
    listener: PgListener,
}

impl ChangeFeed {
    /// Wait for the next change. After an error the feed reconnects on the next call, but
    /// changes made meanwhile are only seen by the next poll.
    pub async fn changed(&mut self) -> Result<(), SourceError> {
        self.listener.recv().await?;
        Ok(())
    }
}

/// A cell that is not of the type its column holds, said in SQL's terms: the column, what it
/// must hold, and the SQL type found.
fn cell_error<R: Row>(row: &R, column: &'static str, wanted: &str) -> RuleError
where
    &'static str: ColumnIndex<R>,
{
    let found = row
        .try_get_raw(column)
        .map(|value| value.type_info().name().to_owned())
        .unwrap_or_else(|_| "no such column".to_owned());
    RuleError {
        field: column.into(),
        reason: format!("must be {wanted}, found {found}"),
    }
}

fn decode_row<'r, R>(index: usize, row: &'r R) -> TableRow
where
    R: Row,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    &'static str: ColumnIndex<R>,
{
    let text = |column: &'static str| {
        row.try_get::<Option<String>, _>(column)
            .map_err(|_| cell_error(row, column, "text"))
    };
    let number = |column: &'static str| {
        row.try_get::<Option<i64>, _>(column)
            .map_err(|_| cell_error(row, column, "an integer"))
    };
    let name = match text("name") {
        Ok(Some(name)) => name,
        Ok(None) => format!("<row {index}>"),
        Err(error) => {
            return TableRow {
                name: format!("<row {index}>"),
                rule: Err(error),
                lines: None,
            };
        }
    };
    let rule = (|| {
        let reserve_high = number("reserve_high")?;
        let reserve_normal = number("reserve_normal")?;
        let match_method = text("match_method")?;
        let match_path = text("match_path")?;
        Ok(RawRule {
            name: None,
            kind: text("kind")?,
            limit: number("limit_units")?,
            period_ms: number("period_ms")?,
            algorithm: text("algorithm")?,
            burst: number("burst")?,
            margin_ms: number("margin_ms")?,
            lease_ttl_ms: number("lease_ttl_ms")?,
            reserve: (reserve_high.is_some() || reserve_normal.is_some()).then_some(RawReserve {
                high: reserve_high,
                normal: reserve_normal,
            }),
            per: text("per")?,
            keys_max: number("keys_max")?,
            matcher: (match_method.is_some() || match_path.is_some()).then_some(RawMatch {
                method: match_method,
                path: match_path,
            }),
        })
    })();
    TableRow {
        name,
        rule,
        lines: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        assert!(check_table_name("tollgate_limits").is_ok());
        assert!(check_table_name("_t1").is_ok());
        for bad in ["", "1t", "T", "a-b", "a;drop table x", &"a".repeat(41)] {
            assert!(check_table_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/rules"),
            "postgres://app:***@db:5432/rules"
        );
        assert_eq!(redact("sqlite://tollgate.db"), "sqlite://tollgate.db");
    }
}
