//! Request extraction: bearer tokens (compared in constant time) and JSON bodies whose every
//! refusal names the field at fault, including unknown fields and oversized bodies.

use axum::body::Bytes;
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

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

fn check(headers: &HeaderMap, expected: &str, what: &str) -> Result<(), ApiError> {
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

/// Proof that a data-plane request carries the data token, when one is configured.
#[derive(Debug)]
pub(crate) struct Data;

impl<S: Send + Sync> FromRequestParts<S> for Data
where
    AppState: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Data, ApiError> {
        let state = AppState::from_ref(state);
        match state.config().data_token.as_deref() {
            None => Ok(Data),
            Some(expected) => check(&parts.headers, expected, "the data plane").map(|()| Data),
        }
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
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    // serde would read an array into a struct by position; every body here is an object.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_field("body", "must be a JSON object"));
    }
    // Well-formed bodies, the usual case, are read without tracking the path: only a refusal
    // needs it, and it is found by reading the body again.
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
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
    // serde names unknown and missing fields in back-quotes; the path is their parent's.
    let named = ["unknown field `", "missing field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .and_then(|rest| rest.split_once('`'))
        .map(|(name, _)| name.to_owned());
    // The path ends at an unknown field, but at the parent of a missing one.
    let field = match (named, path) {
        (Some(name), "." | "") => name,
        (Some(name), path) if path == name || path.ends_with(&format!(".{name}")) => {
            path.to_owned()
        }
        (Some(name), parent) => format!("{parent}.{name}"),
        (None, "." | "") => "body".to_owned(),
        (None, path) => path.to_owned(),
    };
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
    fn a_permit_path_has_one_segment_then_the_action() {
        assert_eq!(
            permit_segment("/v1/permits/ab01/commit", "commit"),
            Some("ab01")
        );
        assert_eq!(
            permit_segment("/v1/permits/ab01/renew", "renew"),
            Some("ab01")
        );
        for path in [
            "/v1/permits//commit",
            "/v1/permits/ab01/commit/",
            "/v1/permits/ab01/x/commit",
            "/v1/permits/ab01",
            "/v1/permits/ab01/renew",
            "/v2/permits/ab01/commit",
        ] {
            assert_eq!(permit_segment(path, "commit"), None, "{path}");
        }
    }

    #[test]
    fn permit_segments_are_percent_decoded_as_the_router_decodes_them() {
        assert_eq!(percent_decode("ab01").ok().as_deref(), Some("ab01"));
        assert_eq!(percent_decode("%61b%301").ok().as_deref(), Some("ab01"));
        // Not an escape: left as it is.
        assert_eq!(percent_decode("%+1x%").ok().as_deref(), Some("%+1x%"));
        assert_eq!(percent_decode("%zz%4").ok().as_deref(), Some("%zz%4"));
        let refused = percent_decode("%ff").expect_err("not UTF-8");
        assert_eq!(refused.field.as_deref(), Some("permit"));
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

/// Where a permit's routes keep its id: `/v1/permits/{permit}/...`.
const PERMITS_PREFIX: &str = "/v1/permits/";

/// The permit id of a `/v1/permits/{permit}/{action}` path, still percent-encoded, if the path
/// has that shape (one non-empty segment for the id, then `action`).
pub(crate) fn permit_segment<'p>(path: &'p str, action: &str) -> Option<&'p str> {
    let rest = path.strip_prefix(PERMITS_PREFIX)?;
    let (permit, tail) = rest.split_once('/')?;
    (!permit.is_empty() && tail == action).then_some(permit)
}

/// The permit id from the path, percent-decoded, read straight from the URI: the busiest
/// routes are dispatched without the router (`endpoints`), so there are no route parameters.
#[derive(Debug)]
pub(crate) struct PermitInPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PermitInPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<PermitInPath, ApiError> {
        let path = parts.uri.path();
        let segment = permit_segment(path, "commit")
            .or_else(|| permit_segment(path, "renew"))
            .ok_or_else(|| ApiError::bad_field("permit", "is missing from the path"))?;
        percent_decode(segment).map(PermitInPath)
    }
}

/// `%XY` as the byte it stands for; a `%` not followed by two hex digits stays as it is.
fn percent_decode(segment: &str) -> Result<String, ApiError> {
    if !segment.contains('%') {
        return Ok(segment.to_owned());
    }
    let bytes = segment.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = match bytes.get(index..index + 3) {
            Some(&[b'%', high, low]) => hex_digit(high).zip(hex_digit(low)),
            _ => None,
        };
        match escaped {
            Some((high, low)) => {
                decoded.push(high << 4 | low);
                index += 3;
            }
            None => {
                decoded.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8(decoded)
        .map_err(|_| ApiError::bad_field("permit", "is not UTF-8 once percent-decoded"))
}

fn hex_digit(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|digit| u8::try_from(digit).ok())
}
