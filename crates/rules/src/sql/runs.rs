//! What the rules database remembers of the stores it serves, so a restart neither forgets
//! what was granted nor holds back what never was: `<table>_runs`, one row per store (the
//! memory store of a server, or a Redis namespace) with its last heartbeat, whether it
//! stopped cleanly and, for the memory store, the server that owns the run and whether it
//! writes its budgets ahead (`write_ahead.rs`, which keeps its records); and `<table>_saved`, the
//! counters and pauses an older server's clean stop left (read once, then replaced by
//! records).

use sqlx::Row;
use tollgate::{MemorySnapshot, SavedCounter};

use super::{Pool, SourceError, SqlSource};

/// What the database knows of a store's previous run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreviousRun {
    /// Up to when, on the store's clock (microseconds), the run was known to be granting: its
    /// last heartbeat, which covers the interval until the next one was due.
    pub granting_until_us: u64,
    /// Whether it stopped cleanly, leaving its counters in `<table>_ahead` (or, for an older
    /// server's run, `<table>_saved`).
    pub clean: bool,
    /// Whether it granted only budgets written ahead to `<table>_ahead`.
    pub ahead: bool,
    /// The boot of the host it ran on, where known.
    pub boot: Option<String>,
    /// When a run whose records could not be trusted was last known to grant, if a run since
    /// held every limit from then (`forget_records`): later runs hold it too, until it ends.
    /// 0 for none.
    pub held_since_us: u64,
}

/// A state as stored: the core's words, in decimal, separated by spaces.
pub(super) fn words(state: &str) -> Option<Vec<u64>> {
    state
        .split_ascii_whitespace()
        .map(|word| word.parse().ok())
        .collect()
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
            "SELECT granting_until_us, clean, ahead, boot, held_since_us FROM {}_runs WHERE store = {}",
            self.table,
            self.param(1)
        );
        let row = on_pool!(&self.pool, pool => {
            sqlx::query(&query)
                .bind(store)
                .fetch_optional(pool)
                .await?
                .map(|row| Ok::<_, sqlx::Error>(PreviousRun {
                    granting_until_us: u64::try_from(row.try_get::<i64, _>(0)?).unwrap_or(0),
                    clean: row.try_get::<i64, _>(1)? != 0,
                    ahead: row.try_get::<i64, _>(2)? != 0,
                    boot: row.try_get(3)?,
                    held_since_us: u64::try_from(row.try_get::<i64, _>(4)?).unwrap_or(0),
                }))
                .transpose()?
        });
        Ok(row)
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

    /// What an older server's clean stop of `store` left, before its records moved to
    /// `<table>_ahead` (the next write of records deletes it). A row that cannot be read comes
    /// back with an empty state, which the memory store refuses and holds its limit for
    /// instead.
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
            match (kind.as_str(), words(&state)) {
                ("pause", Some(words)) if words.len() == 1 => {
                    snapshot.pauses.push((limit, words[0]));
                }
                ("taken", Some(words)) if words.len() == 1 => snapshot.taken_at_us = words[0],
                (_, words) => snapshot.counters.push(SavedCounter {
                    limit,
                    key,
                    state: words.unwrap_or_default(),
                    budget: 0,
                }),
            }
        }
        Ok(snapshot)
    }

    /// Record that `store` runs and may grant until `granting_until_us` (for a Redis
    /// namespace: that it is in use, so that finding it empty later is a loss).
    pub async fn begin_run(&self, store: &str, granting_until_us: u64) -> Result<(), SourceError> {
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
}
