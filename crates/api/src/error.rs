//! Error answers: `{"error": {"code", "message", "field"?}}`, with one of the wire's codes.
//! Which HTTP status carries which code is the server's (and the tower layer's) to say.

use serde::{Deserialize, Serialize};

/// The wire's error codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    BadRequest,
    Unauthorized,
    /// A valid token whose scope does not allow this (403).
    Forbidden,
    NotFound,
    RateLimited,
    StoreUnavailable,
    TooManyKeys,
    Conflict,
    Internal,
}

impl Code {
    /// Every code, in the order the documentation lists them.
    pub const ALL: [Code; 9] = [
        Code::BadRequest,
        Code::Unauthorized,
        Code::Forbidden,
        Code::NotFound,
        Code::RateLimited,
        Code::StoreUnavailable,
        Code::TooManyKeys,
        Code::Conflict,
        Code::Internal,
    ];

    /// The code's one name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::BadRequest => "bad_request",
            Code::Unauthorized => "unauthorized",
            Code::Forbidden => "forbidden",
            Code::NotFound => "not_found",
            Code::RateLimited => "rate_limited",
            Code::StoreUnavailable => "store_unavailable",
            Code::TooManyKeys => "too_many_keys",
            Code::Conflict => "conflict",
            Code::Internal => "internal",
        }
    }

    /// The code named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|code| code.as_str() == name)
    }
}

/// An error answer. The tower layer's refusals add `retry_after_ms` beside `error`; the
/// server's 429s are `RateLimited` and `CheckDenied`, which say more.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// The error object of every error answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// A `Code`'s name. Kept as text, so that a client reads a code a newer server added.
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
    /// The request field at fault, for `bad_request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ErrorDetail {
    pub fn new(code: Code, message: impl Into<String>) -> ErrorDetail {
        ErrorDetail {
            code: code.as_str().to_owned(),
            message: message.into(),
            field: None,
        }
    }

    /// The code, if this client knows it.
    pub fn code(&self) -> Option<Code> {
        Code::parse(&self.code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_from_its_name() {
        for code in Code::ALL {
            assert_eq!(Code::parse(code.as_str()), Some(code));
        }
        assert_eq!(Code::parse("rate-limited"), None);
    }

    #[test]
    fn an_error_body_reads_back_and_tolerates_codes_it_does_not_know() {
        let text = r#"{"error":{"code":"made_up","message":"m"},"newer":1}"#;
        let body: ErrorBody = serde_json::from_str(text).expect("an error body");
        assert_eq!(body.error.code(), None);
        assert_eq!(body.error.field, None);
        let body = ErrorBody {
            error: ErrorDetail::new(Code::Conflict, "gone"),
            retry_after_ms: None,
        };
        assert_eq!(
            serde_json::to_string(&body).expect("json"),
            r#"{"error":{"code":"conflict","message":"gone"}}"#
        );
    }
}
