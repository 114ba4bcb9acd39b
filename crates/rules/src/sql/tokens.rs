//! `<table>_tokens`: the scoped data tokens of the servers sharing this database, one row per
//! token with its scope. A token's secret is never stored, only its SHA-256 (computed by the
//! server, which owns what a token may do); this module only reads and writes the rows.

use sqlx::Row;

use super::{Pool, SourceError, SqlSource};

/// One row of `<table>_tokens`, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRow {
    /// The token's name, unique: how administrators list and revoke it.
    pub name: String,
    /// SHA-256 of the secret, 64 lower-case hex digits.
    pub secret_sha256: String,
    /// The limits it may use, as a JSON array of names and `prefix*` patterns.
    pub limits: String,
    /// `low`, `normal` or `high`.
    pub priority_max: String,
    pub may_pause: bool,
    /// When it was made, in milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// The most units one request of it may ask for; `None`: no bound of its own.
    pub cost_max: Option<i64>,
    /// The longest one request of it may wait, in milliseconds; `None`: no bound of its own.
    pub wait_max_ms: Option<i64>,
}

impl SqlSource {
    pub(super) fn tokens_migration(&self) -> Vec<String> {
        let table = &self.table;
        let limits = match self.pool {
            Pool::Sqlite(_) | Pool::Postgres(_) => "TEXT",
            Pool::MySql(_) => "LONGTEXT",
        };
        vec![format!(
            "CREATE TABLE IF NOT EXISTS {table}_tokens (
                name VARCHAR(128) NOT NULL PRIMARY KEY,
                secret_sha256 CHAR(64) NOT NULL UNIQUE,
                limits {limits} NOT NULL,
                priority_max VARCHAR(16) NOT NULL,
                may_pause BIGINT NOT NULL,
                created_ms BIGINT NOT NULL
            )"
        )]
    }

    /// The bounds a token sets on each of its requests (added after the table).
    pub(super) fn token_bounds_migration(&self) -> Vec<String> {
        let table = &self.table;
        ["cost_max", "wait_max_ms"]
            .iter()
            .map(|column| match self.pool {
                Pool::Postgres(_) => {
                    format!("ALTER TABLE {table}_tokens ADD COLUMN IF NOT EXISTS {column} BIGINT")
                }
                Pool::Sqlite(_) | Pool::MySql(_) => {
                    format!("ALTER TABLE {table}_tokens ADD COLUMN {column} BIGINT")
                }
            })
            .collect()
    }

    /// Every token row, in name order. A row whose cells cannot be read is an error: the
    /// caller keeps the tokens it had rather than guess.
    pub async fn tokens(&self) -> Result<Vec<TokenRow>, SourceError> {
        let query = format!(
            "SELECT name, secret_sha256, limits, priority_max, may_pause, created_ms, \
             cost_max, wait_max_ms FROM {}_tokens ORDER BY name",
            self.table
        );
        let rows = on_pool!(&self.pool, pool => {
            sqlx::query(&query)
                .fetch_all(pool)
                .await?
                .iter()
                .map(|row| Ok::<_, sqlx::Error>(TokenRow {
                    name: row.try_get(0)?,
                    secret_sha256: row.try_get(1)?,
                    limits: row.try_get(2)?,
                    priority_max: row.try_get(3)?,
                    may_pause: row.try_get::<i64, _>(4)? != 0,
                    created_ms: row.try_get(5)?,
                    cost_max: row.try_get(6)?,
                    wait_max_ms: row.try_get(7)?,
                }))
                .collect::<Result<Vec<_>, _>>()?
        });
        Ok(rows)
    }

    /// Store a new token; `false` if one of that name (or, by a chance of 2^-256, that secret)
    /// exists already, which is left as it is.
    pub async fn insert_token(&self, token: &TokenRow) -> Result<bool, SourceError> {
        let query = format!(
            "INSERT INTO {}_tokens (name, secret_sha256, limits, priority_max, may_pause, \
             created_ms, cost_max, wait_max_ms) VALUES ({}, {}, {}, {}, {}, {}, {}, {})",
            self.table,
            self.param(1),
            self.param(2),
            self.param(3),
            self.param(4),
            self.param(5),
            self.param(6),
            self.param(7),
            self.param(8)
        );
        let inserted = on_pool!(&self.pool, pool => {
            sqlx::query(&query)
                .bind(&token.name)
                .bind(&token.secret_sha256)
                .bind(&token.limits)
                .bind(&token.priority_max)
                .bind(i64::from(token.may_pause))
                .bind(token.created_ms)
                .bind(token.cost_max)
                .bind(token.wait_max_ms)
                .execute(pool)
                .await
                .map(|_| ())
        });
        match inserted {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(error)) if error.is_unique_violation() => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// Delete a token; returns whether there was one.
    pub async fn delete_token(&self, name: &str) -> Result<bool, SourceError> {
        let query = format!(
            "DELETE FROM {}_tokens WHERE name = {}",
            self.table,
            self.param(1)
        );
        let affected = on_pool!(&self.pool, pool => {
            sqlx::query(&query).bind(name).execute(pool).await?.rows_affected()
        });
        Ok(affected > 0)
    }
}
