//! The admin API's limits: list, get, put and delete a limit, and lift a pause.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use tollgate_api::RawRule;
use tollgate_api::admin::{Deleted, LimitList, RejectedRow, Reset, Resumed};
use tollgate_api::schema::{BadRequest, Key, LimitName, NotFound, Unauthorized, Unavailable};
use utoipa::IntoParams;

use super::{ApiResult, limit_name};
use crate::error::ApiError;
use crate::extract::{Admin, Body};
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/limits", tag = "admin",
    security(("admin" = [])),
    responses((status = 200, description = "the limits in force and the rows refused",
            body = LimitList),
        (status = 401, response = Unauthorized)))]
pub(crate) async fn list_limits(_: Admin, State(state): State<AppState>) -> Json<LimitList> {
    let snapshot = state.rules().snapshot();
    Json(LimitList {
        version: snapshot.version(),
        limits: snapshot
            .iter()
            .map(|rule| rule.canonical().clone())
            .collect(),
        rejected: snapshot.rejected().iter().map(RejectedRow::from).collect(),
    })
}

#[utoipa::path(get, path = "/v1/limits/{name}", tag = "admin",
    security(("admin" = [])),
    params(("name" = LimitName, Path, description = "the limit's name")),
    responses((status = 200, description = "the limit in force, as stored", body = RawRule),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 404, response = NotFound)))]
pub(crate) async fn get_limit(
    _: Admin,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<RawRule>> {
    let name = limit_name(name)?;
    let snapshot = state.rules().snapshot();
    let rule = snapshot
        .get(&name)
        .ok_or_else(|| ApiError::not_found(format!("unknown limit {name:?}")))?;
    Ok(Json(rule.canonical().clone()))
}

#[utoipa::path(put, path = "/v1/limits/{name}", tag = "admin",
    security(("admin" = [])),
    params(("name" = LimitName, Path, description = "the limit's name")),
    request_body = tollgate_api::schema::LimitBody,
    responses(
        (status = 200, description = "the limit as stored, with defaults filled in",
            body = RawRule,
            links(
                ("GetLimit" = (operation_id = "get_limit",
                    parameters(("name" = "$request.path.name")))),
                ("DeleteLimit" = (operation_id = "delete_limit",
                    parameters(("name" = "$request.path.name")))),
                ("Acquire" = (operation_id = "acquire",
                    request_body = json!({"limits": ["$request.path.name"]}))),
                ("Pause" = (operation_id = "pause",
                    request_body = json!({"limit": "$request.path.name"}))),
                ("Stats" = (operation_id = "stats",
                    parameters(("limit" = "$request.path.name")))),
            )),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 409, description = "the limits come from a file, which only its authors \
            change", body = tollgate_api::schema::ConflictError),
        (status = 503, response = Unavailable)))]
pub(crate) async fn put_limit(
    _: Admin,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    Body(raw): Body<RawRule>,
) -> ApiResult<Json<RawRule>> {
    let name = limit_name(name)?;
    let rule = state.rules().put(&name, &raw).await?;
    tracing::info!(limit = %name, "limit stored");
    Ok(Json(rule.canonical().clone()))
}

#[utoipa::path(delete, path = "/v1/limits/{name}", tag = "admin",
    security(("admin" = [])),
    params(("name" = LimitName, Path, description = "the limit's name")),
    responses((status = 200, description = "the limit is gone", body = Deleted),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 404, response = NotFound),
        (status = 409, description = "the limits come from a file, which only its authors \
            change", body = tollgate_api::schema::ConflictError),
        (status = 503, response = Unavailable)))]
pub(crate) async fn delete_limit(
    _: Admin,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Deleted>> {
    let name = limit_name(name)?;
    if !state.rules().delete(&name).await? {
        return Err(ApiError::not_found(format!("unknown limit {name:?}")));
    }
    tracing::info!(limit = %name, "limit deleted");
    Ok(Json(Deleted::new(name)))
}

/// `DELETE /v1/limits/{name}/pause`: which pause to lift.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ResumeQuery {
    /// For a limit counted per key: lift this key's own pause (without it, the limit-wide
    /// pause).
    #[param(value_type = Option<Key>)]
    key: Option<String>,
}

#[utoipa::path(delete, path = "/v1/limits/{name}/pause", tag = "admin",
    security(("admin" = [])),
    params(("name" = LimitName, Path, description = "the limit's name"), ResumeQuery),
    responses(
        (status = 200, description = "the pause is lifted (in every replica sharing the \
            store): grants resume at once, unless the store holds the limit after a loss of \
            state (`recovering`), which is not a pause", body = Resumed),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable)))]
pub(crate) async fn resume(
    _: Admin,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    query: Result<Query<ResumeQuery>, QueryRejection>,
) -> ApiResult<Json<Resumed>> {
    let name = limit_name(name)?;
    let Query(query) =
        query.map_err(|rejection| crate::stats::query_error(&rejection.body_text(), "key"))?;
    let resumed = state.limiter().resume(&name, query.key.as_deref()).await?;
    tracing::info!(limit = %name, key = ?query.key, resumed, "pause lifted by an administrator");
    Ok(Json(Resumed {
        limit: name,
        key: query.key,
        resumed,
    }))
}

/// `DELETE /v1/limits/{name}/usage`: whose usage to forget.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ResetQuery {
    /// The key whose counter to forget: required for a limit counted per key, refused for
    /// one that is not.
    #[param(value_type = Option<Key>)]
    key: Option<String>,
}

#[utoipa::path(delete, path = "/v1/limits/{name}/usage", tag = "admin",
    security(("admin" = [])),
    params(("name" = LimitName, Path, description = "the limit's name"), ResetQuery),
    responses(
        (status = 200, description = "the counter is forgotten in every replica sharing the \
            store: its usage, its open reservations (their commits refund nothing) and the \
            key's own pause; a hold after a loss of state stays. For a mistaken lockout: it \
            grants again what the limit had counted", body = Reset),
        (status = 400, description = "a concurrency limit (its leases end by themselves), a \
            key missing for a limit counted per key, or given for one that is not",
            body = tollgate_api::schema::BadRequestError),
        (status = 401, response = Unauthorized),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable)))]
/// Forget one counter's usage, after a mistaken lockout.
pub(crate) async fn reset(
    _: Admin,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    query: Result<Query<ResetQuery>, QueryRejection>,
) -> ApiResult<Json<Reset>> {
    let name = limit_name(name)?;
    let Query(query) =
        query.map_err(|rejection| crate::stats::query_error(&rejection.body_text(), "key"))?;
    // The engine names the limit `limit`; here it is the path's `name`.
    let reset = state
        .limiter()
        .reset(&name, query.key.as_deref())
        .await
        .map_err(|error| match error {
            tollgate::Error::InvalidRequest {
                field: "limit",
                reason,
            } => ApiError::bad_field("name", reason),
            other => other.into(),
        })?;
    tracing::warn!(limit = %name, key = ?query.key, reset, "usage reset by an administrator");
    Ok(Json(Reset {
        limit: name,
        key: query.key,
        reset,
    }))
}
