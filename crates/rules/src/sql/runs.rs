//! What the rules database remembers of the stores it serves, so a restart neither forgets
//! what was granted nor holds back what never was: `<table>_runs`, one row per store (the
//! memory store of a server, or a Redis namespace) with its last heartbeat and whether it
//! stopped cleanly, and `<table>_saved`, the memory store's counters and pauses as a clean
//! stop left them.

use sqlx::Row;
use tollgate::{MemorySnapshot, SavedCounter};

use super::{Pool, SourceError, SqlSource};

/// Rows inserted per statement when saving: well under every backend's limit on parameters.
const SAVE_BATCH_ROWS: usize = 1000;

/// What the database knows of a store's previous run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreviousRun {
    /// Up to when, on the store's clock (microseconds), the run was known to be granting: its
    /// last heartbeat, which covers the interval until the next one was due.
    pub granting_until_us: u64,
    /// Whether it stopped cleanly, leaving its counters in `<table>_saved`.
    pub clean: bool,
}

impl SqlSource {
    pub(super) fn runs_migration(&self) -> Vec<String> {
        let table = &self.table;
        let (text, key, state) = match self.pool {
            Pool::Sqlite(_) => ("TEXT", "TEXT", "TEXT"),
            Pool::Postgres(_) => ("VARCHAR(300)", "VARCHAR(256)", "TEXT"),
            Pool::MySql(_) => ("VARCHAR(300)", "VARCHAR(256)", "LONGTEXT"),
        };
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {table}_runs (
                    store {text} NOT NULL PRIMARY KEY,
                    granting_until_us BIGINT NOT NULL,
                    clean BIGINT NOT NULL
                )"
            ),
            // `kind`: 'counter' (state: the core's words) or 'pause' (state: its end).
            format!(
                "CREATE TABLE IF NOT EXISTS {table}_saved (
                    store {text} NOT NULL,
                    seq BIGINT NOT NULL,
                    kind VARCHAR(16) NOT NULL,
                    limit_name VARCHAR(128) NOT NULL,
                    counter_key {key},
                    state {state} NOT NULL,
                    PRIMARY KEY (store, seq)
                )"
            ),
        ]
    }

    /// `?` or `$n`, as the backend writes a parameter.
    pub(super) fn param(&self, index: usize) -> String {
        match self.pool {
            Pool::Postgres(_) => format!("${index}"),
            Pool::Sqlite(_) | Pool::MySql(_) => "?".to_owned(),
        }
    }

    /// The previous run of `store`, if one was ever recorded.
    pub async fn previous_run(&self, store: &str) -> Result<Option<PreviousRun>, SourceError> {
        let query = format!(
            "SELECT granting_until_us, clean FROM {}_runs WHERE store = {}",
            self.table,
            self.param(1)
        );
        let row: Option<(i64, i64)> = on_pool!(&self.pool, pool => {
            sqlx::query(&query)
                .bind(store)
                .fetch_optional(pool)
                .await?
                .map(|row| Ok::<_, sqlx::Error>((row.try_get(0)?, row.try_get(1)?)))
                .transpose()?
        });
        Ok(row.map(|(until, clean)| PreviousRun {
            granting_until_us: u64::try_from(until).unwrap_or(0),
            clean: clean != 0,
        }))
    }

    /// Record that `store` runs and may grant until `granting_until_us`: from now on a restart
    /// that finds no clean stop holds back what this run may have granted.
    pub async fn heartbeat(&self, store: &str, granting_until_us: u64) -> Result<(), SourceError> {
        let until = i64::try_from(granting_until_us).unwrap_or(i64::MAX);
        on_pool!(&self.pool, pool => {
            sqlx::query(&self.run_upsert())
                .bind(store)
                .bind(until)
                .bind(0_i64)
                .execute(pool)
                .await?;
        });
        Ok(())
    }

    /// Insert or update a store's run: store, granting until, clean.
    fn run_upsert(&self) -> String {
        let table = &self.table;
        match self.pool {
            Pool::MySql(_) => format!(
                "INSERT INTO {table}_runs (store, granting_until_us, clean) VALUES (?, ?, ?)
                 ON DUPLICATE KEY UPDATE granting_until_us = VALUES(granting_until_us),
                 clean = VALUES(clean)"
            ),
            Pool::Sqlite(_) | Pool::Postgres(_) => format!(
                "INSERT INTO {table}_runs (store, granting_until_us, clean) VALUES ({}, {}, {})
                 ON CONFLICT (store) DO UPDATE SET granting_until_us = excluded.granting_until_us,
                 clean = excluded.clean",
                self.param(1),
                self.param(2),
                self.param(3)
            ),
        }
    }

    /// What a clean stop of `store` left. A row that cannot be read comes back with an empty
    /// state, which the memory store refuses and holds its limit for instead.
    pub async fn saved(&self, store: &str) -> Result<MemorySnapshot, SourceError> {
        let query = format!(
            "SELECT kind, limit_name, counter_key, state FROM {}_saved WHERE store = {} ORDER BY seq",
            self.table,
            self.param(1)
        );
        let rows: Vec<(String, String, Option<String>, String)> = on_pool!(&self.pool, pool => {
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
                )))
                .collect::<Result<_, _>>()?
        });
        let mut snapshot = MemorySnapshot::default();
        for (kind, limit, key, state) in rows {
            let words: Option<Vec<u64>> = state
                .split_ascii_whitespace()
                .map(|word| word.parse().ok())
                .collect();
            match (kind.as_str(), words) {
                ("pause", Some(words)) if words.len() == 1 => {
                    snapshot.pauses.push((limit, words[0]));
                }
                ("taken", Some(words)) if words.len() == 1 => snapshot.taken_at_us = words[0],
                (_, words) => snapshot.counters.push(SavedCounter {
                    limit,
                    key,
                    state: words.unwrap_or_default(),
                }),
            }
        }
        Ok(snapshot)
    }

    /// Start a run of `store`: forget what an earlier clean stop saved (it has been read, and a
    /// crash of this run must not bring it back), and record the run as granting. One
    /// transaction: a crash in between must not leave a clean stop with nothing saved.
    pub async fn begin_run(&self, store: &str, granting_until_us: u64) -> Result<(), SourceError> {
        let delete = format!(
            "DELETE FROM {}_saved WHERE store = {}",
            self.table,
            self.param(1)
        );
        let until = i64::try_from(granting_until_us).unwrap_or(i64::MAX);
        on_pool!(&self.pool, pool => {
            let mut transaction = pool.begin().await?;
            sqlx::query(&delete).bind(store).execute(&mut *transaction).await?;
            sqlx::query(&self.run_upsert())
                .bind(store)
                .bind(until)
                .bind(0_i64)
                .execute(&mut *transaction)
                .await?;
            transaction.commit().await?;
        });
        Ok(())
    }

    /// A clean stop of `store`: save `snapshot` and record the stop, in one transaction, so a
    /// later start finds either all of it or a run that did not stop cleanly.
    pub async fn end_run(&self, store: &str, snapshot: &MemorySnapshot) -> Result<(), SourceError> {
        let table = &self.table;
        let delete = format!("DELETE FROM {table}_saved WHERE store = {}", self.param(1));
        let taken = snapshot.taken_at_us.to_string();
        let rows = std::iter::once(("taken", "", None, taken))
            .chain(
                snapshot
                    .pauses
                    .iter()
                    .map(|(limit, until)| ("pause", limit.as_str(), None, until.to_string())),
            )
            .chain(snapshot.counters.iter().map(|saved| {
                let words: Vec<String> = saved.state.iter().map(u64::to_string).collect();
                (
                    "counter",
                    saved.limit.as_str(),
                    saved.key.as_deref(),
                    words.join(" "),
                )
            }))
            .collect::<Vec<_>>();
        let until = i64::try_from(snapshot.taken_at_us).unwrap_or(i64::MAX);
        on_pool!(&self.pool, pool => {
            let mut transaction = pool.begin().await?;
            sqlx::query(&delete).bind(store).execute(&mut *transaction).await?;
            for (batch_index, batch) in rows.chunks(SAVE_BATCH_ROWS).enumerate() {
                let mut insert = sqlx::QueryBuilder::new(format!(
                    "INSERT INTO {table}_saved (store, seq, kind, limit_name, counter_key, state) "
                ));
                insert.push_values(batch.iter().enumerate(), |mut row, (index, saved)| {
                    let seq = i64::try_from(batch_index * SAVE_BATCH_ROWS + index).unwrap_or(i64::MAX);
                    row.push_bind(store)
                        .push_bind(seq)
                        .push_bind(saved.0)
                        .push_bind(saved.1)
                        .push_bind(saved.2)
                        .push_bind(saved.3.as_str());
                });
                insert.build().execute(&mut *transaction).await?;
            }
            sqlx::query(&self.run_upsert())
                .bind(store)
                .bind(until)
                .bind(1_i64)
                .execute(&mut *transaction)
                .await?;
            transaction.commit().await?;
        });
        Ok(())
    }
}
