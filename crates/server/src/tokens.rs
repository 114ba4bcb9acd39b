//! Scoped data tokens: a data-plane token limited to a set of limits, a highest priority,
//! whether it may pause, the most units and the longest wait of one request, and how many of
//! its requests may wait at once. This module owns what such a token may do (`Grant`, checked by the
//! data-plane handlers), its secret (made here, shown once, kept only as its SHA-256), the
//! tokens in force (`Tokens`: the state database's `<table>_tokens`, cached and reloaded on the
//! rules' interval, so a revocation reaches every replica within it and this one at once), and
//! the admin API that manages them (`/v1/tokens`).
//!
//! A request bearing a scoped token is held to its scope wherever it is shown, on a server
//! with a data token or without one; the configured data token keeps every right.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;
use tollgate::{Priority, check_limit_name};
use tollgate_api::Code;
use tollgate_api::admin::{Deleted, NewToken, TokenBody, TokenList, TokenView};
use tollgate_api::schema::{BadRequest, Unauthorized, Unavailable};
use tollgate_rules::{SourceError, SqlSource, TokenRow};

use crate::api::limit_name;
use crate::error::ApiError;
use crate::extract::{Admin, Body};
use crate::state::AppState;

/// Scoped tokens in force at most; more rows are left out (and logged), creating more refused.
pub const TOKENS_MAX: usize = 10_000;
/// Limit names and patterns one token may list at most.
pub const TOKEN_LIMITS_MAX: usize = 64;
/// Random bytes in a secret: 256 bits, so a hash without salt is as good as any.
const SECRET_BYTES: usize = 32;
/// Starts every secret, so that secret scanners and people can tell one at a glance.
const SECRET_PREFIX: &str = "tgd_";
/// A scoped token's highest priority when none is given.
const DEFAULT_PRIORITY_MAX: Priority = Priority::Normal;

/// SHA-256 of a presented secret: how tokens are stored and looked up.
type Digest256 = [u8; 32];

fn digest(secret: &[u8]) -> Digest256 {
    Sha256::digest(secret).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn digest_from_hex(text: &str) -> Option<Digest256> {
    let mut bytes = [0u8; 32];
    if text.len() != 64 {
        return None;
    }
    for (index, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(index * 2..index * 2 + 2)?, 16).ok()?;
    }
    Some(bytes)
}

/// A new secret: the prefix and 256 random bits in hex.
fn new_secret() -> Result<String, ApiError> {
    let mut bytes = [0u8; SECRET_BYTES];
    getrandom::fill(&mut bytes).map_err(|error| {
        crate::error::internal(format!("no randomness for a token secret: {error}"))
    })?;
    Ok(format!("{SECRET_PREFIX}{}", hex(&bytes)))
}

/// One entry of a token's limits: a name, `prefix*`, or `*` (every limit).
#[derive(Clone, Debug, PartialEq, Eq)]
enum LimitPattern {
    Name(String),
    Prefix(String),
}

impl LimitPattern {
    fn parse(text: &str) -> Result<LimitPattern, String> {
        let explain = "must be a limit name, a prefix ending in `*` (`vendor-*`), or `*`";
        match text.strip_suffix('*') {
            Some("") => Ok(LimitPattern::Prefix(String::new())),
            Some(prefix) => {
                // A prefix of a valid name is a valid name itself (every character allowed
                // after the first is allowed at the end).
                check_limit_name(prefix).map_err(|reason| format!("{explain}: {reason}"))?;
                Ok(LimitPattern::Prefix(prefix.to_owned()))
            }
            None => {
                check_limit_name(text).map_err(|reason| format!("{explain}: {reason}"))?;
                Ok(LimitPattern::Name(text.to_owned()))
            }
        }
    }

    fn covers(&self, limit: &str) -> bool {
        match self {
            LimitPattern::Name(name) => name == limit,
            LimitPattern::Prefix(prefix) => limit.starts_with(prefix.as_str()),
        }
    }

    fn text(&self) -> String {
        match self {
            LimitPattern::Name(name) => name.clone(),
            LimitPattern::Prefix(prefix) => format!("{prefix}*"),
        }
    }
}

/// What a scoped token may do.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Scope {
    name: String,
    limits: Vec<LimitPattern>,
    priority_max: Priority,
    may_pause: bool,
    created_ms: i64,
    cost_max: Option<u64>,
    wait_max_ms: Option<u64>,
}

/// A bound of a token read from its row: positive, or absent.
fn positive(field: &str, cell: Option<i64>) -> Result<Option<u64>, String> {
    match cell {
        None => Ok(None),
        Some(value) if value >= 1 => Ok(Some(value as u64)),
        Some(value) => Err(format!("{field}: must be at least 1, got {value}")),
    }
}

impl Scope {
    /// The scope a stored row holds, or why the row cannot be read as one.
    fn from_row(row: &TokenRow) -> Result<Scope, String> {
        check_limit_name(&row.name).map_err(|reason| format!("name: {reason}"))?;
        let texts: Vec<String> = serde_json::from_str(&row.limits)
            .map_err(|error| format!("limits: not a JSON array of strings: {error}"))?;
        let limits =
            parse_limits(&texts).map_err(|(field, reason)| format!("{field}: {reason}"))?;
        let priority_max = Priority::parse(&row.priority_max).ok_or_else(|| {
            format!(
                "priority_max: must be high, normal or low, got {:?}",
                row.priority_max
            )
        })?;
        Ok(Scope {
            name: row.name.clone(),
            limits,
            priority_max,
            may_pause: row.may_pause,
            created_ms: row.created_ms,
            cost_max: positive("cost_max", row.cost_max)?,
            wait_max_ms: positive("wait_max_ms", row.wait_max_ms)?,
        })
    }

    fn covers(&self, limit: &str) -> bool {
        self.limits.iter().any(|pattern| pattern.covers(limit))
    }

    fn limit_texts(&self) -> Vec<String> {
        self.limits.iter().map(LimitPattern::text).collect()
    }

    fn view(&self) -> TokenView {
        TokenView {
            name: self.name.clone(),
            limits: self.limit_texts(),
            priority_max: self.priority_max.as_str().to_owned(),
            may_pause: self.may_pause,
            created_ms: self.created_ms,
            cost_max: self.cost_max,
            wait_max_ms: self.wait_max_ms,
        }
    }
}

/// A token's limits, read: each entry checked, naming the entry at fault.
fn parse_limits(texts: &[String]) -> Result<Vec<LimitPattern>, (String, String)> {
    if texts.is_empty() {
        return Err((
            "limits".into(),
            "must name at least one limit, prefix* or *".into(),
        ));
    }
    if texts.len() > TOKEN_LIMITS_MAX {
        return Err((
            "limits".into(),
            format!("must have at most {TOKEN_LIMITS_MAX} entries"),
        ));
    }
    texts
        .iter()
        .enumerate()
        .map(|(index, text)| {
            LimitPattern::parse(text).map_err(|reason| (format!("limits[{index}]"), reason))
        })
        .collect()
}

/// What a data-plane request may do: everything (the data token, or an open data plane), or
/// what its scoped token allows.
#[derive(Clone, Debug)]
pub(crate) enum Grant {
    Full,
    Scoped(Arc<Scope>),
}

impl Grant {
    fn refuse(scope: &Scope, what: impl std::fmt::Display) -> ApiError {
        ApiError::forbidden(format!("token {:?}: {what}", scope.name))
    }

    /// Whether this caller may see or use `limit`.
    pub(crate) fn covers(&self, limit: &str) -> bool {
        match self {
            Grant::Full => true,
            Grant::Scoped(scope) => scope.covers(limit),
        }
    }

    /// Refused (403) unless this caller may use `limit`.
    pub(crate) fn limit(&self, limit: &str) -> Result<(), ApiError> {
        match self {
            Grant::Scoped(scope) if !scope.covers(limit) => Err(Grant::refuse(
                scope,
                format_args!(
                    "may not use limit {limit:?}; its limits are {}",
                    scope.limit_texts().join(", ")
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The priority to decide at: the one asked for, refused (403, naming `priority`) above
    /// the token's highest; with none asked for, normal, or the token's highest if lower.
    pub(crate) fn priority(&self, asked: Option<Priority>) -> Result<Priority, ApiError> {
        match (self, asked) {
            (Grant::Full, asked) => Ok(asked.unwrap_or_default()),
            (Grant::Scoped(scope), None) => Ok(Priority::default().min(scope.priority_max)),
            (Grant::Scoped(scope), Some(asked)) if asked > scope.priority_max => {
                Err(Grant::refuse(
                    scope,
                    format_args!(
                        "priority {} is above its priority_max, {}",
                        asked.as_str(),
                        scope.priority_max.as_str()
                    ),
                ))
            }
            (Grant::Scoped(_), Some(asked)) => Ok(asked),
        }
    }

    /// The cost to ask for: the one asked for, refused (403, naming `cost`) above the token's
    /// `cost_max`.
    pub(crate) fn cost(&self, asked: u64) -> Result<u64, ApiError> {
        match self {
            Grant::Scoped(scope) if scope.cost_max.is_some_and(|most| asked > most) => {
                Err(Grant::refuse(
                    scope,
                    format_args!(
                        "cost {asked} is above its cost_max, {}",
                        scope.cost_max.unwrap_or_default()
                    ),
                ))
            }
            _ => Ok(asked),
        }
    }

    /// The wait to allow: the one asked for, no longer than the token's `wait_max_ms`.
    pub(crate) fn wait_ms(&self, asked: u64) -> u64 {
        match self {
            Grant::Scoped(scope) => scope.wait_max_ms.map_or(asked, |most| asked.min(most)),
            Grant::Full => asked,
        }
    }

    /// A place among this token's waiting requests, if it may have one more (`most`, the
    /// server's `waiters_per_token_max`); a caller with every right always may. Given back
    /// when dropped.
    pub(crate) fn wait_place(&self, tokens: &Tokens, most: usize) -> Option<WaitPlace> {
        let Grant::Scoped(scope) = self else {
            return Some(WaitPlace { held: None });
        };
        let mut waiting = match tokens.waiting.lock() {
            Ok(waiting) => waiting,
            Err(poisoned) => poisoned.into_inner(),
        };
        let count = waiting.entry(scope.name.clone()).or_default();
        if *count >= most {
            return None;
        }
        *count += 1;
        Some(WaitPlace {
            held: Some((tokens.waiting.clone(), scope.name.clone())),
        })
    }

    /// Refused (403) unless this caller may pause `limit`.
    pub(crate) fn pause(&self, limit: &str) -> Result<(), ApiError> {
        if let Grant::Scoped(scope) = self
            && !scope.may_pause
        {
            return Err(Grant::refuse(
                scope,
                "may not pause (its may_pause is false)",
            ));
        }
        self.limit(limit)
    }
}

/// Requests waiting now, by token name.
type Waiting = Arc<std::sync::Mutex<HashMap<String, usize>>>;

/// One waiting request of a scoped token, counted until dropped.
#[derive(Debug)]
pub(crate) struct WaitPlace {
    held: Option<(Waiting, String)>,
}

impl Drop for WaitPlace {
    fn drop(&mut self) {
        let Some((waiting, name)) = self.held.take() else {
            return;
        };
        let mut waiting = match waiting.lock() {
            Ok(waiting) => waiting,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(count) = waiting.get_mut(&name) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(&name);
            }
        }
    }
}

/// The tokens in force, by the digest of their secret and by name.
#[derive(Debug, Default)]
struct InForce {
    by_digest: HashMap<Digest256, Arc<Scope>>,
    by_name: BTreeMap<String, Arc<Scope>>,
}

/// The scoped tokens of a server: the table, and what of it is in force here.
#[derive(Debug)]
pub(crate) struct Tokens {
    /// `None` only for a router built without a state database (fuzzing).
    source: Option<SqlSource>,
    in_force: RwLock<Arc<InForce>>,
    /// Serialises reloads and writes, so that a reload that read the table before a write
    /// cannot put back what the write changed; and holds the rows refused at the last reload,
    /// so each is logged when it changes, not at every reload.
    refused: Mutex<BTreeMap<String, String>>,
    /// Requests waiting now, by token name: kept apart from the scopes, which a reload makes
    /// anew, so that a reload cannot reset a token's count.
    waiting: Waiting,
}

impl Tokens {
    /// Load the tokens of `source`'s table. Fails if it cannot be read: a server must not start
    /// with no idea of who may call it.
    pub(crate) async fn start(source: Option<SqlSource>) -> Result<Tokens, SourceError> {
        let tokens = Tokens {
            source,
            in_force: RwLock::new(Arc::default()),
            refused: Mutex::new(BTreeMap::new()),
            waiting: Waiting::default(),
        };
        tokens.reload().await?;
        Ok(tokens)
    }

    fn current(&self) -> Arc<InForce> {
        match self.in_force.read() {
            Ok(in_force) => in_force.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The scope of the token whose secret is `presented`, if it is one in force.
    pub(crate) fn find(&self, presented: &[u8]) -> Option<Arc<Scope>> {
        let in_force = self.current();
        // No token, nothing to hash: a server without scoped tokens pays nothing per request.
        if in_force.by_digest.is_empty() {
            return None;
        }
        in_force.by_digest.get(&digest(presented)).cloned()
    }

    /// Read the table and put it in force. On a database error nothing changes.
    pub(crate) async fn reload(&self) -> Result<(), SourceError> {
        let mut refused = self.refused.lock().await;
        self.apply(&mut refused).await
    }

    async fn apply(&self, refused: &mut BTreeMap<String, String>) -> Result<(), SourceError> {
        let Some(source) = &self.source else {
            return Ok(());
        };
        let rows = source.tokens().await?;
        let mut in_force = InForce::default();
        let mut now_refused = BTreeMap::new();
        for row in rows {
            let scope = Scope::from_row(&row).and_then(|scope| {
                let digest = digest_from_hex(&row.secret_sha256)
                    .ok_or("secret_sha256: must be 64 hex digits")?;
                if in_force.by_name.len() >= TOKENS_MAX {
                    return Err(format!(
                        "more than {TOKENS_MAX} tokens; this one is not loaded"
                    ));
                }
                Ok((digest, scope))
            });
            match scope {
                Ok((digest, scope)) => {
                    let scope = Arc::new(scope);
                    in_force.by_name.insert(scope.name.clone(), scope.clone());
                    in_force.by_digest.insert(digest, scope);
                }
                Err(reason) => {
                    if refused.get(&row.name) != Some(&reason) {
                        tracing::warn!(
                            table = %format!("{}_tokens", source.table()),
                            token = %row.name,
                            %reason,
                            "token row refused: the token is not in force"
                        );
                    }
                    now_refused.insert(row.name, reason);
                }
            }
        }
        *refused = now_refused;
        match self.in_force.write() {
            Ok(mut slot) => *slot = Arc::new(in_force),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(in_force),
        }
        Ok(())
    }

    fn source(&self) -> Result<&SqlSource, ApiError> {
        self.source.as_ref().ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                Code::Conflict,
                "this server has no state database to keep tokens in",
            )
        })
    }

    /// Reload every `interval` until `stop` turns true; a failed reload keeps the tokens in
    /// force and is retried at the next tick.
    pub(crate) fn spawn_reloader(
        self: &Arc<Self>,
        interval: Duration,
        stop: watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        let tokens = self.clone();
        crate::spawn_every(interval, stop, move || {
            let tokens = tokens.clone();
            async move {
                if let Err(error) = tokens.reload().await {
                    tracing::warn!(%error, "tokens reload failed; the tokens in force stay");
                }
            }
        })
    }
}

// ---- Admin API -----------------------------------------------------------------------------

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

#[utoipa::path(post, path = "/v1/tokens", tag = "admin",
    security(("admin" = [])),
    request_body = TokenBody,
    responses(
        (status = 201, description = "the token, with its secret: shown this once",
            body = NewToken,
            links(("DeleteToken" = (operation_id = "delete_token",
                parameters(("name" = "$response.body#/name")))))),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 409, description = "a token of this name exists, or there are as many as \
            may be", body = tollgate_api::schema::ConflictError),
        (status = 503, response = Unavailable)))]
pub(crate) async fn create_token(
    _: Admin,
    State(state): State<AppState>,
    Body(body): Body<TokenBody>,
) -> Result<Response, ApiError> {
    check_limit_name(&body.name).map_err(|reason| ApiError::bad_field("name", reason))?;
    let limits =
        parse_limits(&body.limits).map_err(|(field, reason)| ApiError::bad_field(field, reason))?;
    let priority_max = match body.priority_max.as_deref() {
        None => DEFAULT_PRIORITY_MAX,
        Some(text) => Priority::parse(text).ok_or_else(|| {
            ApiError::bad_field(
                "priority_max",
                format!("must be high, normal or low, got {text:?}"),
            )
        })?,
    };
    // As the document says: a cost past UNITS_MAX is refused anyway, and 2^53 ms is longer
    // than any wait.
    let bound = |field: &str, value: Option<u64>, most: u64| match value {
        Some(value) if !(1..=most).contains(&value) => Err(ApiError::bad_field(
            field,
            format!("must be at least 1 and at most {most}, got {value}"),
        )),
        other => Ok(other),
    };
    let cost_max = bound("cost_max", body.cost_max, tollgate::core::UNITS_MAX)?;
    let wait_max_ms = bound(
        "wait_max_ms",
        body.wait_max_ms,
        tollgate_api::data::WAIT_MS_MAX,
    )?;
    let tokens = state.tokens();
    let source = tokens.source()?;
    let mut refused = tokens.refused.lock().await;
    if tokens.current().by_name.len() >= TOKENS_MAX {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            Code::Conflict,
            format!("there are {TOKENS_MAX} tokens already, as many as may be; delete one first"),
        ));
    }
    let secret = new_secret()?;
    let scope = Scope {
        name: body.name,
        limits,
        priority_max,
        may_pause: body.may_pause.unwrap_or(false),
        created_ms: now_ms(),
        cost_max,
        wait_max_ms,
    };
    let row = TokenRow {
        name: scope.name.clone(),
        secret_sha256: hex(&digest(secret.as_bytes())),
        limits: serde_json::to_string(&scope.limit_texts()).unwrap_or_else(|_| "[]".into()),
        priority_max: scope.priority_max.as_str().to_owned(),
        may_pause: scope.may_pause,
        created_ms: scope.created_ms,
        cost_max: scope.cost_max.map(|value| value as i64),
        wait_max_ms: scope.wait_max_ms.map(|value| value as i64),
    };
    if !source.insert_token(&row).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            Code::Conflict,
            format!(
                "a token named {:?} exists; delete it first to replace it",
                scope.name
            ),
        ));
    }
    // In force here at once.
    tokens.apply(&mut refused).await?;
    tracing::info!(token = %scope.name, limits = ?scope.limit_texts(),
        priority_max = scope.priority_max.as_str(), may_pause = scope.may_pause, "token made");
    if state.config().data_token.is_none() {
        tracing::warn!(
            token = %scope.name,
            "no data token is configured: the data plane is open, so a caller without this \
             token is not held to its scope"
        );
    }
    Ok((
        StatusCode::CREATED,
        Json(NewToken {
            name: scope.name.clone(),
            limits: scope.limit_texts(),
            priority_max: scope.priority_max.as_str().to_owned(),
            may_pause: scope.may_pause,
            created_ms: scope.created_ms,
            cost_max: scope.cost_max,
            wait_max_ms: scope.wait_max_ms,
            secret,
        }),
    )
        .into_response())
}

#[utoipa::path(get, path = "/v1/tokens", tag = "admin",
    security(("admin" = [])),
    responses((status = 200, description = "the tokens in force, without their secrets",
            body = TokenList),
        (status = 401, response = Unauthorized), (status = 503, response = Unavailable)))]
pub(crate) async fn list_tokens(
    _: Admin,
    State(state): State<AppState>,
) -> Result<Json<TokenList>, ApiError> {
    // The table as it is now, so that a token made or revoked through another replica shows.
    state.tokens().reload().await?;
    Ok(Json(TokenList {
        tokens: state
            .tokens()
            .current()
            .by_name
            .values()
            .map(|scope| scope.view())
            .collect(),
    }))
}

#[utoipa::path(delete, path = "/v1/tokens/{name}", tag = "admin",
    security(("admin" = [])),
    params(("name" = tollgate_api::schema::LimitName, Path, description = "the token's name")),
    responses((status = 200, description = "the token no longer works here; on other \
            replicas within their reload interval", body = Deleted),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 404, response = tollgate_api::schema::NotFound),
        (status = 409, description = "this server has no state database",
            body = tollgate_api::schema::ConflictError),
        (status = 503, response = Unavailable)))]
pub(crate) async fn delete_token(
    _: Admin,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Deleted>, ApiError> {
    let name = limit_name(name)?;
    let tokens = state.tokens();
    let source = tokens.source()?;
    let mut refused = tokens.refused.lock().await;
    let deleted = source.delete_token(&name).await?;
    // Out of force here at once, whatever a reload may have read before.
    tokens.apply(&mut refused).await?;
    if !deleted {
        return Err(ApiError::not_found(format!("unknown token {name:?}")));
    }
    tracing::info!(token = %name, "token revoked");
    Ok(Json(Deleted::new(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(limits: &[&str], priority_max: Priority, may_pause: bool) -> Grant {
        let texts: Vec<String> = limits.iter().map(|text| (*text).to_owned()).collect();
        Grant::Scoped(Arc::new(Scope {
            name: "t".into(),
            limits: parse_limits(&texts).expect("valid"),
            priority_max,
            may_pause,
            created_ms: 0,
            cost_max: None,
            wait_max_ms: None,
        }))
    }

    #[test]
    fn patterns_are_names_prefixes_or_everything() {
        let grant = scope(&["billing", "vendor-*"], Priority::Normal, false);
        assert!(grant.limit("billing").is_ok());
        assert!(grant.limit("vendor-x").is_ok());
        assert!(grant.limit("vendor-").is_ok());
        assert!(grant.limit("billing-2").is_err());
        assert!(grant.limit("vendor").is_err());
        let all = scope(&["*"], Priority::Normal, false);
        assert!(all.limit("anything").is_ok());
        for bad in ["", "ven*dor", "**", "Vendor-*", "a b"] {
            assert!(LimitPattern::parse(bad).is_err(), "{bad:?}");
        }
        let refused = parse_limits(&["a".into(), "B".into()]).expect_err("refused");
        assert_eq!(refused.0, "limits[1]");
    }

    #[test]
    fn priorities_are_capped_and_refused_above_the_highest() {
        let low = scope(&["*"], Priority::Low, false);
        assert_eq!(low.priority(None).ok(), Some(Priority::Low));
        assert!(low.priority(Some(Priority::Normal)).is_err());
        let high = scope(&["*"], Priority::High, true);
        assert_eq!(high.priority(None).ok(), Some(Priority::Normal));
        assert_eq!(
            high.priority(Some(Priority::High)).ok(),
            Some(Priority::High)
        );
        assert!(high.pause("x").is_ok());
        let refused = low.pause("x").expect_err("refused");
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        assert!(refused.message.contains("may_pause"), "{}", refused.message);
    }

    #[test]
    fn secrets_are_random_and_stored_as_their_digest() {
        let one = new_secret().expect("secret");
        let two = new_secret().expect("secret");
        assert_ne!(one, two);
        assert!(one.starts_with(SECRET_PREFIX));
        assert_eq!(one.len(), SECRET_PREFIX.len() + 2 * SECRET_BYTES);
        let stored = hex(&digest(one.as_bytes()));
        assert_eq!(digest_from_hex(&stored), Some(digest(one.as_bytes())));
        assert_eq!(digest_from_hex("zz"), None);
    }
}
