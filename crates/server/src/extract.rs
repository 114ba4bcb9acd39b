//! Request extraction: bearer tokens (compared in constant time) and JSON bodies whose every
//! refusal names the field at fault, including unknown fields and oversized bodies.

use axum::body::Bytes;
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;
use crate::tokens::Grant;

/// Equal if `given` equals `expected`, in time that depends only on the lengths, so that a
/// caller cannot learn the token a byte at a time from response times.
pub(crate) fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut difference = given.len() ^ expected.len();
    for (index, byte) in expected.iter().enumerate() {
        let other = given.get(index).copied().unwrap_or(0);
        difference |= usize::from(byte ^ other);
    }
    std::hint::black_box(difference) == 0
}

fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let scheme = value.get(..7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| value[7..].trim_ascii())
}

pub(crate) fn check(headers: &HeaderMap, expected: &str, what: &str) -> Result<(), ApiError> {
    match bearer(headers) {
        None => Err(ApiError::unauthorized(format!(
            "{what} needs the header Authorization: Bearer <token>"
        ))),
        Some(given) if constant_time_eq(given, expected.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::unauthorized(format!("{what} refuses this token"))),
    }
}

/// Proof that a request carries the admin token. With no admin token configured, the admin
/// API is closed to everyone.
#[derive(Debug)]
pub(crate) struct Admin;

impl<S: Send + Sync> FromRequestParts<S> for Admin
where
    AppState: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Admin, ApiError> {
        let state = AppState::from_ref(state);
        match state.config().admin_token.as_deref() {
            None => Err(ApiError::unauthorized(
                "the admin API is disabled: no admin token is configured (TOLLGATE_ADMIN_TOKEN)",
            )),
            Some(expected) => check(&parts.headers, expected, "the admin API").map(|()| Admin),
        }
    }
}

/// Proof that a data-plane request carries the data token, when one is configured, or a
/// scoped token; with what it may do.
#[derive(Debug)]
pub(crate) struct Data(pub(crate) Grant);

impl<S: Send + Sync> FromRequestParts<S> for Data
where
    AppState: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Data, ApiError> {
        data_grant(
            &AppState::from_ref(state),
            bearer(&parts.headers),
            "Authorization: Bearer <token>",
        )
        .map(Data)
    }
}

/// Proof that a `/v1/forward-auth` request carries the data token, when one is configured, or
/// a scoped token, in `X-Tollgate-Token`; with what it may do. `Authorization` is not read
/// there: it is the end user's own, passed on by the proxy (`forward.rs`).
#[derive(Debug)]
pub(crate) struct ForwardData(pub(crate) Grant);

impl<S: Send + Sync> FromRequestParts<S> for ForwardData
where
    AppState: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<ForwardData, ApiError> {
        let given = parts
            .headers
            .get(crate::forward::TOKEN_HEADER)
            .map(|value| value.as_bytes().trim_ascii());
        data_grant(
            &AppState::from_ref(state),
            given,
            "X-Tollgate-Token: <token> (on /v1/forward-auth, Authorization is the end user's \
             and is not read)",
        )
        .map(ForwardData)
    }
}

/// What the token `given` may do on the data plane: everything for the data token (or for
/// anyone when none is configured), its scope for a scoped token. `header` says where the
/// token is expected, for the refusal.
fn data_grant(state: &AppState, given: Option<&[u8]>, header: &str) -> Result<Grant, ApiError> {
    let expected = state.config().data_token.as_deref();
    // A scoped token is held to its scope wherever it is shown, open data plane or not.
    if let Some(given) = given
        && !expected.is_some_and(|expected| constant_time_eq(given, expected.as_bytes()))
        && let Some(scope) = state.tokens().find(given)
    {
        return Ok(Grant::Scoped(scope));
    }
    match (expected, given) {
        (None, _) => Ok(Grant::Full),
        (Some(_), None) => Err(ApiError::unauthorized(format!(
            "the data plane needs the header {header}"
        ))),
        (Some(expected), Some(given)) if constant_time_eq(given, expected.as_bytes()) => {
            Ok(Grant::Full)
        }
        (Some(_), Some(_)) => Err(ApiError::unauthorized("the data plane refuses this token")),
    }
}

/// A JSON body. An empty body reads as `{}`, so endpoints whose fields are all optional take
/// none.
#[derive(Debug)]
pub(crate) struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T>
where
    AppState: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Body<T>, ApiError> {
        let body_bytes_max = AppState::from_ref(state).config().body_bytes_max;
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::bad_field(
                        "body",
                        format!("must be at most {body_bytes_max} bytes (body_bytes_max)"),
                    )
                } else {
                    ApiError::bad_field("body", rejection.body_text())
                }
            })?;
        parse(&bytes).map(Body)
    }
}

/// Parse JSON into `T`, naming the field at fault in every error.
pub(crate) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.trim_ascii().is_empty() {
        b"{}"
    } else {
        bytes
    };
    // serde would read an array into a struct by position; every body here is an object.
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(ApiError::bad_field("body", "must be a JSON object"));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        describe(&path, &inner)
    })?;
    deserializer
        .end()
        .map_err(|error| ApiError::bad_field("body", format!("malformed JSON: {error}")))?;
    Ok(value)
}

fn describe(path: &str, error: &serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    if matches!(
        error.classify(),
        Category::Syntax | Category::Eof | Category::Io
    ) {
        return ApiError::bad_field("body", format!("malformed JSON: {error}"));
    }
    let message = error.to_string();
    let field = tollgate_rules::serde_field(path, &message, "body");
    // serde_json appends " at line L column C"; the field is a better locator.
    let reason = message
        .rsplit_once(" at line ")
        .map_or(message.as_str(), |(reason, _)| reason);
    ApiError::bad_field(field, reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Sample {
        cost: Option<u64>,
        inner: Option<Inner>,
        list: Option<Vec<String>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        high: Option<i64>,
    }

    fn field(json: &str) -> Option<String> {
        parse::<Sample>(json.as_bytes()).expect_err("refused").field
    }

    #[test]
    fn every_refusal_names_a_field() {
        assert_eq!(field(r#"{"cost":-1}"#).as_deref(), Some("cost"));
        assert_eq!(field(r#"{"cost":"one"}"#).as_deref(), Some("cost"));
        assert_eq!(field(r#"{"bogus":1}"#).as_deref(), Some("bogus"));
        assert_eq!(
            field(r#"{"inner":{"low":1}}"#).as_deref(),
            Some("inner.low")
        );
        assert_eq!(field(r#"{"list":[1]}"#).as_deref(), Some("list[0]"));
        // A field with an empty name cannot be named: the object holding it is.
        assert_eq!(field(r#"{"":1}"#).as_deref(), Some("body"));
        assert_eq!(field(r#"{"inner":{"":1}}"#).as_deref(), Some("inner"));
        // A field given twice is named, not the object that holds it.
        assert_eq!(field(r#"{"cost":1,"cost":2}"#).as_deref(), Some("cost"));
        assert_eq!(
            field(r#"{"inner":{"high":1,"high":2}}"#).as_deref(),
            Some("inner.high")
        );
        assert_eq!(field(r#"{"cost":1"#).as_deref(), Some("body"));
        assert_eq!(field(r#"{"cost":1} x"#).as_deref(), Some("body"));
        assert_eq!(field("[]").as_deref(), Some("body"));
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Needs {
            inner: Inner2,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Inner2 {
            level: u64,
        }
        let missing = parse::<Needs>(br#"{"inner":{}}"#).expect_err("missing");
        assert_eq!(missing.field.as_deref(), Some("inner.level"));
        let missing = parse::<Needs>(b"{}").expect_err("missing");
        assert_eq!(missing.field.as_deref(), Some("inner"));
        assert!(parse::<Sample>(b"  ").is_ok());
    }

    #[test]
    fn tokens_compare_equal_only_when_equal() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secreT", b"secret"));
        assert!(!constant_time_eq(b"secret1", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
    }
}
