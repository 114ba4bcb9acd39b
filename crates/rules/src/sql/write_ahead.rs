//! `<table>_ahead`: the memory store's records of write-ahead (`tollgate`'s `write_ahead.rs`), one row
//! per counter with its state and the budget it may spend past it, and one per limit-wide
//! pause. A counter's budget is spent only once its row is committed, so after a crash the rows
//! bound what the crashed run can have granted; a clean stop replaces them all with the final
//! state, budgets 0. Every write checks, in its own transaction, that the store's run still
//! belongs to the writing server (`<table>_runs.owner`): a server that another took over is
//! fenced off, and so can spend no budget the other did not read.
//!
//! Rows are keyed by an id that spells the limit and the key in hex: the same bytes are the
//! same counter on every backend, whatever its collation does with case and trailing spaces.

use sqlx::Row;
use tollgate::{MemorySnapshot, RecordBatch, SavedCounter};

use super::runs::{PreviousRun, words};
use super::{Pool, SourceError, SqlSource};

/// Rows written per statement: well under every backend's limit on parameters.
const ROWS_PER_STATEMENT: usize = 1000;

const KIND_COUNTER: &str = "counter";
const KIND_PAUSE: &str = "pause";

/// A row's id: the limit's bytes and the key's in hex, `-` for no key.
fn counter_id(limit: &str, key: Option<&str>) -> String {
    let hex = |text: &str| {
        text.bytes()
            .map(|byte| format!("{byte:02x}"))
            .collect::<String>()
    };
    match key {
        Some(key) => format!("{}.{}", hex(limit), hex(key)),
        None => format!("{}-", hex(limit)),
    }
}

/// One row to write: kind, id, limit, key, state, budget.
type AheadRow<'a> = (&'static str, String, &'a str, Option<&'a str>, String, i64);

fn counter_row(saved: &SavedCounter) -> AheadRow<'_> {
    let state: Vec<String> = saved.state.iter().map(u64::to_string).collect();
    (
        KIND_COUNTER,
        counter_id(&saved.limit, saved.key.as_deref()),
        &saved.limit,
        saved.key.as_deref(),
        state.join(" "),
        i64::try_from(saved.budget).unwrap_or(i64::MAX),
    )
}

fn pause_row((limit, until): &(String, u64)) -> AheadRow<'_> {
    (
        KIND_PAUSE,
        counter_id(limit, None),
        limit,
        None,
        until.to_string(),
        0,
    )
}

impl SqlSource {
    pub(super) fn ahead_migration(&self) -> Vec<String> {
        let table = &self.table;
        let (text, id, key, state) = match self.pool {
            Pool::Sqlite(_) => ("TEXT", "TEXT", "TEXT", "TEXT"),
            Pool::Postgres(_) => ("VARCHAR(300)", "VARCHAR(800)", "VARCHAR(256)", "TEXT"),
            Pool::MySql(_) => (
                "VARCHAR(300)",
                "VARCHAR(800) CHARACTER SET ascii COLLATE ascii_bin",
                "VARCHAR(256)",
                "LONGTEXT",
            ),
        };
        let add = |column: &str| match self.pool {
            Pool::Postgres(_) => {
                format!("ALTER TABLE {table}_runs ADD COLUMN IF NOT EXISTS {column}")
            }
            Pool::Sqlite(_) | Pool::MySql(_) => {
                format!("ALTER TABLE {table}_runs ADD COLUMN {column}")
            }
        };
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {table}_ahead (
                    store {text} NOT NULL,
                    kind VARCHAR(16) NOT NULL,
                    counter_id {id} NOT NULL,
                    limit_name VARCHAR(128) NOT NULL,
                    counter_key {key},
                    state {state} NOT NULL,
                    budget BIGINT NOT NULL,
                    PRIMARY KEY (store, kind, counter_id)
                )"
            ),
            // The server whose run it is: every write of its records checks it.
            add("owner VARCHAR(64)"),
            // The host's boot: a crash that took the host with it may have lost the last
            // records SQLite had not yet written to the disk.
            add("boot VARCHAR(64)"),
            // Whether the run wrote its budgets ahead (0: an older server's run).
            add("ahead BIGINT NOT NULL DEFAULT 0"),
            // A hold that outlives the run that began it (`forget_records`).
            add("held_since_us BIGINT NOT NULL DEFAULT 0"),
        ]
    }

    /// The same database for write-ahead: on SQLite, a connection of its own that commits
    /// without waiting for the disk (`synchronous = NORMAL`, which loses nothing when the
    /// process is killed, only when the host goes down); elsewhere, this source.
    pub async fn for_write_ahead(&self) -> Result<SqlSource, SourceError> {
        let Pool::Sqlite(pool) = &self.pool else {
            return Ok(self.clone());
        };
        let options = (*pool.connect_options()).clone();
        let file = options.get_filename().to_string_lossy().into_owned();
        if file.is_empty() || file == ":memory:" {
            // Another connection to an in-memory database would see another database.
            return Ok(self.clone());
        }
        let relaxed = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(super::CONNECT_TIMEOUT)
            .connect_with(options.synchronous(sqlx::sqlite::SqliteSynchronous::Normal))
            .await?;
        Ok(SqlSource::with_pool(Pool::Sqlite(relaxed), &self.table))
    }

    /// A transaction that writes: SQLite takes its write lock at once, so what the
    /// transaction reads first is still so when it writes.
    fn begin_writing(&self) -> &'static str {
        match self.pool {
            Pool::Sqlite(_) => "BEGIN IMMEDIATE",
            Pool::Postgres(_) | Pool::MySql(_) => "BEGIN",
        }
    }

    /// Make this server's run of `store` the one in force: whatever run was recorded is
    /// returned, and from now on only `owner` writes `store`'s records (another server still
    /// running on this database is fenced off at its next write). One transaction.
    pub async fn take_over(
        &self,
        store: &str,
        owner: &str,
        boot: Option<&str>,
        granting_until_us: u64,
    ) -> Result<Option<PreviousRun>, SourceError> {
        let table = &self.table;
        let lock = match self.pool {
            Pool::Sqlite(_) => "",
            Pool::Postgres(_) | Pool::MySql(_) => " FOR UPDATE",
        };
        let select = format!(
            "SELECT granting_until_us, clean, ahead, boot, held_since_us FROM {table}_runs \
             WHERE store = {}{lock}",
            self.param(1)
        );
        let upsert = match self.pool {
            Pool::MySql(_) => format!(
                "INSERT INTO {table}_runs (store, granting_until_us, clean, owner, boot, ahead)
                 VALUES (?, ?, 0, ?, ?, 1)
                 ON DUPLICATE KEY UPDATE granting_until_us = VALUES(granting_until_us),
                 clean = 0, owner = VALUES(owner), boot = VALUES(boot), ahead = 1"
            ),
            Pool::Sqlite(_) | Pool::Postgres(_) => format!(
                "INSERT INTO {table}_runs (store, granting_until_us, clean, owner, boot, ahead)
                 VALUES ({}, {}, 0, {}, {}, 1)
                 ON CONFLICT (store) DO UPDATE SET granting_until_us = excluded.granting_until_us,
                 clean = 0, owner = excluded.owner, boot = excluded.boot, ahead = 1",
                self.param(1),
                self.param(2),
                self.param(3),
                self.param(4)
            ),
        };
        let until = i64::try_from(granting_until_us).unwrap_or(i64::MAX);
        let previous = on_pool!(&self.pool, pool => {
            let mut transaction = pool.begin_with(self.begin_writing()).await?;
            let previous = sqlx::query(&select)
                .bind(store)
                .fetch_optional(&mut *transaction)
                .await?
                .map(|row| {
                    Ok::<_, sqlx::Error>(PreviousRun {
                        granting_until_us: u64::try_from(row.try_get::<i64, _>(0)?).unwrap_or(0),
                        clean: row.try_get::<i64, _>(1)? != 0,
                        ahead: row.try_get::<i64, _>(2)? != 0,
                        boot: row.try_get(3)?,
                        held_since_us: u64::try_from(row.try_get::<i64, _>(4)?).unwrap_or(0),
                    })
                })
                .transpose()?;
            sqlx::query(&upsert)
                .bind(store)
                .bind(until)
                .bind(owner)
                .bind(boot)
                .execute(&mut *transaction)
                .await?;
            transaction.commit().await?;
            previous
        });
        Ok(previous)
    }

    /// The first statement of every write by `owner`: it locks the run's row, and finds it
    /// owned by someone else when another server took over.
    fn owner_check(&self) -> String {
        format!(
            "UPDATE {}_runs SET owner = owner WHERE store = {} AND owner = {}",
            self.table,
            self.param(1),
            self.param(2)
        )
    }

    /// Record that `owner`'s run of `store` may grant until `granting_until_us`; `Fenced` once
    /// another server took the run over.
    pub async fn heartbeat_of(
        &self,
        store: &str,
        owner: &str,
        granting_until_us: u64,
    ) -> Result<(), SourceError> {
        let update = format!(
            "UPDATE {}_runs SET granting_until_us = {} WHERE store = {} AND owner = {}",
            self.table,
            self.param(1),
            self.param(2),
            self.param(3)
        );
        let until = i64::try_from(granting_until_us).unwrap_or(i64::MAX);
        let updated = on_pool!(&self.pool, pool => {
            sqlx::query(&update)
                .bind(until)
                .bind(store)
                .bind(owner)
                .execute(pool)
                .await?
                .rows_affected()
        });
        if updated == 0 {
            return Err(SourceError::Fenced {
                store: store.to_owned(),
            });
        }
        Ok(())
    }

    /// What `store`'s write-ahead left: each counter's last record with its budget, and the
    /// limit-wide pauses. A row that cannot be read comes back with an empty state, which the
    /// memory store refuses and holds its limit for instead. `taken_at_us` is left 0.
    pub async fn ahead_records(&self, store: &str) -> Result<MemorySnapshot, SourceError> {
        let query = format!(
            "SELECT kind, limit_name, counter_key, state, budget FROM {}_ahead WHERE store = {}",
            self.table,
            self.param(1)
        );
        type Row = (String, String, Option<String>, String, i64);
        let rows: Vec<Row> = on_pool!(&self.pool, pool => {
            sqlx::query(&query)
                .bind(store)
                .fetch_all(pool)
                .await?
                .iter()
                .map(|row| Ok::<_, sqlx::Error>((
                    row.try_get(0)?,
                    row.try_get(1)?,
                    row.try_get(2)?,
                    row.try_get(3)?,
                    row.try_get(4)?,
                )))
                .collect::<Result<_, _>>()?
        });
        let mut snapshot = MemorySnapshot::default();
        for (kind, limit, key, state, budget) in rows {
            let state = words(&state);
            match (kind.as_str(), state) {
                (KIND_PAUSE, Some(state)) if state.len() == 1 => {
                    snapshot.pauses.push((limit, state[0]));
                }
                (KIND_PAUSE, _) => {}
                (_, state) => snapshot.counters.push(SavedCounter {
                    limit,
                    key,
                    state: state.unwrap_or_default(),
                    // A budget that cannot be read counts as the largest: held, not trusted.
                    budget: u64::try_from(budget).unwrap_or(u64::MAX),
                }),
            }
        }
        Ok(snapshot)
    }

    /// Commit one batch of `owner`'s write-ahead of `store`, in one transaction: the
    /// forgotten counters' rows deleted, then each counter's record written, and the pauses
    /// replaced when they changed. `Fenced`, with nothing written, once another server took
    /// the run over.
    pub async fn write_ahead(
        &self,
        store: &str,
        owner: &str,
        batch: &RecordBatch,
    ) -> Result<(), SourceError> {
        let rows: Vec<AheadRow<'_>> = batch.counters.iter().map(counter_row).collect();
        let pauses: Option<Vec<AheadRow<'_>>> = batch
            .pauses
            .as_ref()
            .map(|pauses| pauses.iter().map(pause_row).collect());
        let forgotten: Vec<String> = batch
            .forgotten
            .iter()
            .map(|(limit, key)| counter_id(limit, key.as_deref()))
            .collect();
        self.write_rows(
            store,
            owner,
            Writes {
                forgotten: &forgotten,
                everything: false,
                pauses: pauses.as_deref(),
                rows: &rows,
                clean_at_us: None,
                held_since_us: None,
            },
        )
        .await
    }

    /// Replace every record of `owner`'s run of `store` with `snapshot` (the store's whole
    /// state; budgets as it says), in one transaction; with `clean_at_us`, also record the run
    /// as stopped cleanly then, so the next start puts the records back as they are. `Fenced`,
    /// with nothing written, once another server took the run over.
    pub async fn replace_records(
        &self,
        store: &str,
        owner: &str,
        snapshot: &MemorySnapshot,
        clean_at_us: Option<u64>,
    ) -> Result<(), SourceError> {
        let rows: Vec<AheadRow<'_>> = snapshot.counters.iter().map(counter_row).collect();
        let pauses: Vec<AheadRow<'_>> = snapshot.pauses.iter().map(pause_row).collect();
        self.write_rows(
            store,
            owner,
            Writes {
                forgotten: &[],
                everything: true,
                pauses: Some(&pauses),
                rows: &rows,
                clean_at_us,
                held_since_us: None,
            },
        )
        .await
    }

    /// Delete every record of `owner`'s run of `store`, which cannot be trusted, and record
    /// that every limit is held from `held_since_us` (when that run was last known to grant),
    /// in one transaction: a later start finds no record to put back without the hold.
    pub async fn forget_records(
        &self,
        store: &str,
        owner: &str,
        held_since_us: u64,
    ) -> Result<(), SourceError> {
        self.write_rows(
            store,
            owner,
            Writes {
                forgotten: &[],
                everything: true,
                pauses: None,
                rows: &[],
                clean_at_us: None,
                held_since_us: Some(held_since_us),
            },
        )
        .await
    }

    async fn write_rows(
        &self,
        store: &str,
        owner: &str,
        writes: Writes<'_>,
    ) -> Result<(), SourceError> {
        let table = &self.table;
        let owner_check = self.owner_check();
        let delete_all = format!("DELETE FROM {table}_ahead WHERE store = {}", self.param(1));
        // Rows an older server saved at its clean stop: replaced by these records.
        let delete_saved = format!("DELETE FROM {table}_saved WHERE store = {}", self.param(1));
        let delete_pauses = format!(
            "DELETE FROM {table}_ahead WHERE store = {} AND kind = '{KIND_PAUSE}'",
            self.param(1)
        );
        let conflict = match self.pool {
            Pool::MySql(_) => {
                " ON DUPLICATE KEY UPDATE state = VALUES(state), budget = VALUES(budget)"
            }
            Pool::Sqlite(_) | Pool::Postgres(_) => {
                " ON CONFLICT (store, kind, counter_id) DO UPDATE SET state = excluded.state, \
                 budget = excluded.budget"
            }
        };
        let held = format!(
            "UPDATE {table}_runs SET held_since_us = {} WHERE store = {} AND owner = {}",
            self.param(1),
            self.param(2),
            self.param(3)
        );
        let clean = format!(
            "UPDATE {table}_runs SET clean = 1, granting_until_us = {} WHERE store = {} AND owner = {}",
            self.param(1),
            self.param(2),
            self.param(3)
        );
        on_pool!(&self.pool, pool => {
            let mut transaction = pool.begin_with(self.begin_writing()).await?;
            let owned = sqlx::query(&owner_check)
                .bind(store)
                .bind(owner)
                .execute(&mut *transaction)
                .await?
                .rows_affected();
            if owned == 0 {
                transaction.rollback().await?;
                return Err(SourceError::Fenced { store: store.to_owned() });
            }
            if writes.everything {
                sqlx::query(&delete_all).bind(store).execute(&mut *transaction).await?;
                sqlx::query(&delete_saved).bind(store).execute(&mut *transaction).await?;
            } else if writes.pauses.is_some() {
                sqlx::query(&delete_pauses).bind(store).execute(&mut *transaction).await?;
            }
            for ids in writes.forgotten.chunks(ROWS_PER_STATEMENT) {
                let mut delete = sqlx::QueryBuilder::new(format!(
                    "DELETE FROM {table}_ahead WHERE store = "
                ));
                delete.push_bind(store);
                delete.push(format!(" AND kind = '{KIND_COUNTER}' AND counter_id IN ("));
                let mut each = delete.separated(", ");
                for id in ids {
                    each.push_bind(id.as_str());
                }
                delete.push(")");
                delete.build().execute(&mut *transaction).await?;
            }
            let pauses = writes.pauses.unwrap_or_default();
            for rows in [writes.rows, pauses] {
                for chunk in rows.chunks(ROWS_PER_STATEMENT) {
                    let mut insert = sqlx::QueryBuilder::new(format!(
                        "INSERT INTO {table}_ahead \
                         (store, kind, counter_id, limit_name, counter_key, state, budget) "
                    ));
                    insert.push_values(chunk, |mut values, row| {
                        values
                            .push_bind(store)
                            .push_bind(row.0)
                            .push_bind(row.1.as_str())
                            .push_bind(row.2)
                            .push_bind(row.3)
                            .push_bind(row.4.as_str())
                            .push_bind(row.5);
                    });
                    insert.push(conflict);
                    insert.build().execute(&mut *transaction).await?;
                }
            }
            if let Some(since) = writes.held_since_us {
                sqlx::query(&held)
                    .bind(i64::try_from(since).unwrap_or(i64::MAX))
                    .bind(store)
                    .bind(owner)
                    .execute(&mut *transaction)
                    .await?;
            }
            if let Some(at) = writes.clean_at_us {
                sqlx::query(&clean)
                    .bind(i64::try_from(at).unwrap_or(i64::MAX))
                    .bind(store)
                    .bind(owner)
                    .execute(&mut *transaction)
                    .await?;
            }
            transaction.commit().await?;
        });
        Ok(())
    }
}

/// What one transaction of `write_rows` does.
struct Writes<'a> {
    /// Ids of counters whose rows go.
    forgotten: &'a [String],
    /// Every row of the store goes first (and an older server's saved rows).
    everything: bool,
    /// The pauses, replacing those recorded, when given.
    pauses: Option<&'a [AheadRow<'a>]>,
    rows: &'a [AheadRow<'a>],
    clean_at_us: Option<u64>,
    /// Every limit held from then, in later runs too.
    held_since_us: Option<u64>,
}
