//! `<table>_valid`: the last valid version of each rule, one row per limit name holding its
//! canonical form as JSON. It is what lets a row broken while the server was down keep its
//! last valid version across a restart (see `reload`): the rules table says which limits
//! exist, this table says what each was when it was last valid. Only the rules table decides
//! existence: a name kept here whose row is gone is never served again.

use std::sync::Arc;

use sqlx::Row;

use super::{Pool, SourceError, SqlSource};
use crate::rule::{RawRule, Rule, RuleError, Validate};

impl SqlSource {
    pub(super) fn valid_migration(&self) -> Vec<String> {
        let table = &self.table;
        let rule = match self.pool {
            Pool::Sqlite(_) | Pool::Postgres(_) => "TEXT",
            Pool::MySql(_) => "LONGTEXT",
        };
        vec![format!(
            "CREATE TABLE IF NOT EXISTS {table}_valid (
                name VARCHAR(128) NOT NULL PRIMARY KEY,
                rule {rule} NOT NULL
            )"
        )]
    }

    /// Every kept version, in name order, each validated again (a version this build no
    /// longer accepts is an error for that name, not for the whole table).
    pub async fn kept_versions(
        &self,
    ) -> Result<Vec<(String, Result<Rule, RuleError>)>, SourceError> {
        let query = format!("SELECT name, rule FROM {}_valid ORDER BY name", self.table);
        let rows: Vec<(String, String)> = on_pool!(&self.pool, pool => {
            sqlx::query(&query)
                .fetch_all(pool)
                .await?
                .iter()
                .map(|row| Ok::<_, sqlx::Error>((row.try_get(0)?, row.try_get(1)?)))
                .collect::<Result<Vec<_>, _>>()?
        });
        Ok(rows
            .into_iter()
            .map(|(name, json)| {
                let rule = serde_json::from_str::<RawRule>(&json)
                    .map_err(|error| RuleError {
                        field: "rule".into(),
                        reason: format!("kept version is not a rule: {error}"),
                    })
                    .and_then(|raw| raw.validate(&name));
                (name, rule)
            })
            .collect())
    }

    /// Write the versions that changed and drop the names no longer in force, in one
    /// transaction.
    pub async fn keep_versions(
        &self,
        changed: &[Arc<Rule>],
        dropped: &[String],
    ) -> Result<(), SourceError> {
        let table = &self.table;
        let (name, rule) = (self.param(1), self.param(2));
        let upsert = match self.pool {
            Pool::MySql(_) => format!(
                "INSERT INTO {table}_valid (name, rule) VALUES ({name}, {rule}) \
                 ON DUPLICATE KEY UPDATE rule = VALUES(rule)"
            ),
            Pool::Sqlite(_) | Pool::Postgres(_) => format!(
                "INSERT INTO {table}_valid (name, rule) VALUES ({name}, {rule}) \
                 ON CONFLICT (name) DO UPDATE SET rule = excluded.rule"
            ),
        };
        let delete = format!("DELETE FROM {table}_valid WHERE name = {name}");
        let mut rows = Vec::with_capacity(changed.len());
        for version in changed {
            let json = serde_json::to_string(version.canonical())
                .map_err(|error| SourceError::Database(sqlx::Error::Encode(Box::new(error))))?;
            rows.push((version.name().to_owned(), json));
        }
        on_pool!(&self.pool, pool => {
            let mut transaction = pool.begin().await?;
            for (name, json) in &rows {
                sqlx::query(&upsert)
                    .bind(name)
                    .bind(json)
                    .execute(&mut *transaction)
                    .await?;
            }
            for name in dropped {
                sqlx::query(&delete)
                    .bind(name)
                    .execute(&mut *transaction)
                    .await?;
            }
            transaction.commit().await?;
        });
        Ok(())
    }
}
