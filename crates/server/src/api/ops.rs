//! Operations: `/healthz`, `/readyz`, `/metrics`, and the answers to an unknown path (404) and
//! a method an endpoint does not serve (405).

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tollgate_api::Code;
use tollgate_api::ops::Health;

use super::ApiResult;
use crate::error::ApiError;
use crate::state::AppState;

#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "the process runs", body = Health)))]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        rules: None,
        store: None,
        rules_problems: None,
    })
}

/// How long readiness waits on the rules database.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "ready: the rules database and the store answer",
            body = Health),
        (status = 503, description = "not ready, and why", body = Health)))]
pub(crate) async fn readyz(State(state): State<AppState>) -> Response {
    let rules = match tokio::time::timeout(READY_TIMEOUT, state.rules().source().ping()).await {
        Ok(Ok(())) => "ok".to_owned(),
        Ok(Err(error)) => format!("unreachable: {error}"),
        Err(_) => "unreachable: no answer within 2 s".to_owned(),
    };
    // One round trip for a shared store; nothing for the memory store.
    let store = if state.is_shutting_down() {
        "shutting down".to_owned()
    } else {
        match tokio::time::timeout(READY_TIMEOUT, state.limiter().store().ping()).await {
            Ok(Ok(())) => "ok".to_owned(),
            Ok(Err(error)) if error.fails_open() => format!("unreachable: {error}"),
            // It answered, but cannot be relied on (e.g. a Redis that may now evict).
            Ok(Err(error)) => format!("failing: {error}"),
            Err(_) => "unreachable: no answer within 2 s".to_owned(),
        }
    };
    let ready = rules == "ok" && store == "ok";
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(Health {
            status: if ready {
                "ok".into()
            } else {
                "not ready".into()
            },
            rules: Some(rules),
            store: Some(store),
            rules_problems: Some(state.rules().problems()).filter(|problems| !problems.is_empty()),
        }),
    )
        .into_response()
}

/// `GET /metrics`: with a metrics token configured, only for a scraper that shows it.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format",
        content_type = "text/plain", body = String),
        (status = 401, response = tollgate_api::schema::Unauthorized)))]
pub(crate) async fn metrics(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
) -> ApiResult<Response> {
    if let Some(expected) = state.config().metrics_token.as_deref() {
        crate::extract::check(&headers, expected, "/metrics (metrics_token)")?;
    }
    let text = state
        .metrics()
        .render()
        .map_err(|error| crate::error::internal(error.to_string()))?;
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(response)
}

/// An unknown path (`GET /` among them): the answer says where people and programs start.
pub(crate) async fn not_found() -> ApiError {
    ApiError::not_found(
        "no such endpoint; the dashboard is at /ui, and the API's description at /openapi.json",
    )
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        Code::BadRequest,
        "method not allowed on this endpoint; see /openapi.json",
    )
}
