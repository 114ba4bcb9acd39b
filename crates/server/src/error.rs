//! The API's errors: `{"error": {"code", "message"}}` with one of the wire's codes, and the only
//! place where a failure becomes an HTTP status. Engine and rules errors map here, once.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tollgate::{Error, PermitError};
use tollgate_api::{Code, ErrorBody, ErrorDetail};
use tollgate_rules::{RuleError, RulesError, SourceError};

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: Code,
    pub message: String,
    /// The request field at fault, when there is one.
    pub field: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: Code, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
        }
    }

    /// A bad request naming the field at fault; the message starts with the field.
    pub fn bad_field(field: impl Into<String>, reason: impl std::fmt::Display) -> ApiError {
        let field = field.into();
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: Code::BadRequest,
            message: format!("{field}: {reason}"),
            field: Some(field),
        }
    }

    /// The same refusal under another status: a bad request the HTTP layer refuses as
    /// `403` (a Host or Origin not allowed) or `415` (a body that is not JSON).
    pub(crate) fn with_status(mut self, status: StatusCode) -> ApiError {
        self.status = status;
        self
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, Code::Unauthorized, message)
    }

    /// A caller whose token is valid but may not do this (a scoped data token outside its
    /// scope): 403 `forbidden`; showing another token would not help, a wider one would.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, Code::Forbidden, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, Code::NotFound, message)
    }

    pub(crate) fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                field: self.field.clone(),
                ..ErrorDetail::new(self.code, self.message.clone())
            },
            retry_after_ms: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        // For the error-counting middleware.
        response.extensions_mut().insert(self.code);
        let challenge = match self.code {
            Code::Unauthorized => Some("Bearer"),
            // RFC 6750: a token that is valid but not enough is `insufficient_scope`.
            Code::Forbidden => Some(r#"Bearer error="insufficient_scope""#),
            _ => None,
        };
        if let Some(challenge) = challenge {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        response
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> ApiError {
        let message = error.to_string();
        match error {
            Error::InvalidRequest { field, reason } => ApiError::bad_field(field, reason),
            Error::UnknownLimit { .. } => ApiError::not_found(message),
            Error::Cost { .. } => ApiError::bad_field("cost", message),
            Error::Permit { source } => match source {
                PermitError::Unknown => ApiError::not_found(message),
                PermitError::UsedAboveCost { .. } => ApiError::bad_field("used", source),
                PermitError::Gone | PermitError::LeaseExpired | PermitError::WrongKind => {
                    ApiError::new(StatusCode::CONFLICT, Code::Conflict, message)
                }
                #[allow(unreachable_patterns)]
                _ => ApiError::new(StatusCode::CONFLICT, Code::Conflict, message),
            },
            // Unreachable or answering with a failure: one wire code, the message says which.
            Error::StoreUnavailable { .. } | Error::StoreFailed { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                Code::StoreUnavailable,
                message,
            ),
            Error::TooManyKeys { .. } | Error::TooManyKeysForLimit { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, Code::TooManyKeys, message)
            }
            // Transient, like an unreachable store: a replica that is not stopping will answer.
            Error::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                Code::StoreUnavailable,
                "the server is shutting down; retry against another replica or after restart",
            ),
            #[allow(unreachable_patterns)]
            _ => internal(message),
        }
    }
}

impl From<RuleError> for ApiError {
    fn from(error: RuleError) -> ApiError {
        ApiError::bad_field(error.field, error.reason)
    }
}

impl From<SourceError> for ApiError {
    fn from(error: SourceError) -> ApiError {
        tracing::error!(%error, "rules database failed");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Code::StoreUnavailable,
            format!("the rules database is unavailable: {error}"),
        )
    }
}

impl From<RulesError> for ApiError {
    fn from(error: RulesError) -> ApiError {
        match error {
            RulesError::Invalid(error) => error.into(),
            RulesError::Source(error) => error.into(),
            RulesError::ReadOnly { .. } => {
                ApiError::new(StatusCode::CONFLICT, Code::Conflict, error.to_string())
            }
        }
    }
}

pub(crate) fn internal(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, Code::Internal, message)
}
