//! `tollgate limits apply`, `export` and `check`: limits as code. `check` reads a file as
//! `serve --rules file://` would; `apply` and `export` work against a server whose rules live
//! in SQL. `apply` makes the server's limits what a file says (all of the file is
//! validated before anything is written, and `--dry-run` only shows the difference); `export`
//! writes the limits in force as such a file.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tollgate_cli::client::{Answer, Client};
use tollgate_rules::{FileFormat, FileSource, RawRule, Rules, Validate, render_limits};

/// What applying a file changes, by limit name.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// In the file, not on the server: the canonical rule to create.
    pub create: BTreeMap<String, Value>,
    /// On both, different: the server's rule, then the file's.
    pub update: BTreeMap<String, (Value, Value)>,
    /// On the server, not in the file: deleted with `--prune`, else kept.
    pub absent: Vec<String>,
}

impl Plan {
    pub fn is_empty(&self, prune: bool) -> bool {
        self.create.is_empty() && self.update.is_empty() && (!prune || self.absent.is_empty())
    }
}

/// The file's limits, each validated as the server would (canonical form, by name), or every
/// fault of the file at once, each naming its limit and field.
/// Read as the server reads a `file://` rules source.
pub async fn read_limits_file(path: &Path) -> Result<BTreeMap<String, Value>> {
    let rows = FileSource::new(path.to_owned())?.load().await?;
    let mut limits = BTreeMap::new();
    let mut faults = Vec::new();
    for row in rows {
        match row.rule.and_then(|raw| raw.validate(&row.name)) {
            Ok(rule) => {
                limits.insert(row.name, serde_json::to_value(rule.canonical())?);
            }
            Err(error) => faults.push(format!("limit {:?}: {error}", row.name)),
        }
    }
    if !faults.is_empty() {
        bail!(
            "{} is not applied; nothing was changed:\n  {}",
            path.display(),
            faults.join("\n  ")
        );
    }
    Ok(limits)
}

/// `limits check`: the file read and put in force as `serve --rules file://` does at start (on
/// a limiter of its own, so one fact decides both): a summary, or the error naming every
/// rejected entry at its line.
pub async fn check(path: &Path) -> Result<String> {
    let source = FileSource::new(path.to_owned())?;
    let rules = Rules::start(source, tollgate::Limiter::in_memory()).await?;
    let count = rules.snapshot().len();
    let limits = if count == 1 { "limit" } else { "limits" };
    Ok(format!(
        "{}: {count} {limits}, every entry valid; `serve` would put them in force\n",
        path.display()
    ))
}

/// The server's limits in force, by name, from `GET /v1/limits`.
pub fn limits_in_force(answer: &Answer) -> Result<BTreeMap<String, Value>> {
    let limits = answer
        .json
        .as_ref()
        .and_then(|json| json.get("limits"))
        .and_then(Value::as_array)
        .context("the server's list of limits has no `limits` array")?;
    Ok(limits
        .iter()
        .filter_map(|limit| Some((limit.get("name")?.as_str()?.to_owned(), limit.clone())))
        .collect())
}

pub fn plan(wanted: &BTreeMap<String, Value>, in_force: &BTreeMap<String, Value>) -> Plan {
    let mut plan = Plan::default();
    for (name, rule) in wanted {
        match in_force.get(name) {
            None => {
                plan.create.insert(name.clone(), rule.clone());
            }
            Some(current) if current != rule => {
                plan.update
                    .insert(name.clone(), (current.clone(), rule.clone()));
            }
            Some(_) => {}
        }
    }
    plan.absent = in_force
        .keys()
        .filter(|name| !wanted.contains_key(*name))
        .cloned()
        .collect();
    plan
}

/// The plan as people read it: `+` created, `~` changed (field by field), `-` deleted, and
/// what `--prune` would delete.
pub fn describe(plan: &Plan, prune: bool) -> String {
    let mut text = String::new();
    for (name, rule) in &plan.create {
        text.push_str(&format!("+ {name} {}\n", compact(rule)));
    }
    for (name, (before, after)) in &plan.update {
        text.push_str(&format!("~ {name}\n"));
        let empty = serde_json::Map::new();
        let before = before.as_object().unwrap_or(&empty);
        let after = after.as_object().unwrap_or(&empty);
        let mut fields: Vec<&String> = before.keys().chain(after.keys()).collect();
        fields.sort();
        fields.dedup();
        for field in fields {
            let (old, new) = (before.get(field), after.get(field));
            if old != new {
                let show = |value: Option<&Value>| value.map_or("(unset)".to_owned(), compact);
                text.push_str(&format!("    {field}: {} -> {}\n", show(old), show(new)));
            }
        }
    }
    for name in &plan.absent {
        if prune {
            text.push_str(&format!("- {name}\n"));
        } else {
            text.push_str(&format!(
                "  {name} is not in the file: kept (--prune deletes it)\n"
            ));
        }
    }
    if plan.is_empty(prune) {
        text.push_str("no changes: the server's limits are the file's\n");
    }
    text
}

fn compact(value: &Value) -> String {
    let mut value = value.clone();
    if let Some(object) = value.as_object_mut() {
        object.remove("name");
    }
    value.to_string()
}

/// Carry out `plan`: creations and changes, then (with `prune`) deletions. Stops at the first
/// refusal, returning that answer; what was applied before it stays applied, and is said.
pub async fn carry_out(
    client: &Client,
    plan: &Plan,
    prune: bool,
) -> Result<Option<Answer>, tollgate_cli::client::ClientError> {
    let puts = plan
        .create
        .iter()
        .chain(plan.update.iter().map(|(name, (_, rule))| (name, rule)));
    for (name, rule) in puts {
        let answer = client
            .send(
                hyper::Method::PUT,
                &format!("/v1/limits/{}", crate::http::segment(name)),
                Some(rule),
            )
            .await?;
        if !answer.status.is_success() {
            eprintln!("tollgate: applying {name} was refused");
            return Ok(Some(answer));
        }
        println!("applied {name}");
    }
    if prune {
        for name in &plan.absent {
            let answer = client
                .send(
                    hyper::Method::DELETE,
                    &format!("/v1/limits/{}", crate::http::segment(name)),
                    None,
                )
                .await?;
            if !answer.status.is_success() {
                eprintln!("tollgate: deleting {name} was refused");
                return Ok(Some(answer));
            }
            println!("deleted {name}");
        }
    }
    Ok(None)
}

/// The limits in force (`GET /v1/limits`) as a limits file; the rejected rows, which are not in
/// it, are counted.
pub fn export(answer: &Answer, format: FileFormat) -> Result<(String, usize)> {
    let limits = limits_in_force(answer)?;
    let rules: Vec<RawRule> = limits
        .into_values()
        .map(serde_json::from_value)
        .collect::<Result<_, _>>()
        .context("the server's limits are not rules this command knows")?;
    let rejected = answer
        .json
        .as_ref()
        .and_then(|json| json.get("rejected"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let text = render_limits(&rules, format).map_err(|reason| anyhow::anyhow!(reason))?;
    Ok((text, rejected))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_plan_creates_changes_and_names_what_the_file_lacks() {
        let wanted = BTreeMap::from([
            (
                "a".to_owned(),
                json!({"name": "a", "kind": "rate", "limit": 5}),
            ),
            (
                "b".to_owned(),
                json!({"name": "b", "kind": "rate", "limit": 7}),
            ),
        ]);
        let in_force = BTreeMap::from([
            (
                "b".to_owned(),
                json!({"name": "b", "kind": "rate", "limit": 6}),
            ),
            (
                "c".to_owned(),
                json!({"name": "c", "kind": "rate", "limit": 1}),
            ),
        ]);
        let plan = plan(&wanted, &in_force);
        assert_eq!(plan.create.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(plan.update.keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(plan.absent, ["c"]);
        let text = describe(&plan, false);
        assert!(
            text.contains("+ a {\"kind\":\"rate\",\"limit\":5}"),
            "{text}"
        );
        assert!(text.contains("    limit: 6 -> 7"), "{text}");
        assert!(text.contains("c is not in the file: kept"), "{text}");
        assert!(describe(&plan, true).contains("- c\n"));
        let same = super::plan(&in_force, &in_force);
        assert!(same.is_empty(true));
        assert!(describe(&same, true).contains("no changes"));
    }
}
