//! The classifier: what a vendor's answer means for the dispatcher. An answer is seen through
//! [`Answer`] (an HTTP status and headers, a gRPC status, an error), which any job output
//! exposes by implementing [`Classify`]; the [`Classifier`] turns it into a [`Verdict`]: done
//! (hand it to the caller unchanged), rate-limited (pause the whole host), or retry.
//!
//! User rules run first, in the order added; the first that answers wins. The default rules
//! come last:
//!
//! - HTTP 429: rate-limited, with the `Retry-After` it carries (or none: the dispatcher then
//!   uses its configured default).
//! - HTTP 503 **with** a `Retry-After` header: rate-limited (a vendor shedding load and saying
//!   for how long). A 503 without one is an ordinary server error.
//! - HTTP 500, 502, 503, 504 and 408, and errors marked transient: retry with backoff.
//! - everything else: done.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

use crate::retry_after::parse_retry_after;

/// gRPC's RESOURCE_EXHAUSTED status code.
pub const GRPC_RESOURCE_EXHAUSTED: i32 = 8;
/// gRPC's UNAVAILABLE status code.
pub const GRPC_UNAVAILABLE: i32 = 14;

/// What the classifier sees of one answer.
#[derive(Clone, Copy, Debug)]
pub enum Answer<'a> {
    /// An HTTP response.
    Http {
        status: StatusCode,
        headers: &'a HeaderMap,
    },
    /// A gRPC status; `retry_delay` is the delay a vendor put in its details
    /// (`google.rpc.RetryInfo`), decoded by whoever implements [`Classify`].
    Grpc {
        code: i32,
        message: &'a str,
        retry_delay: Option<Duration>,
    },
    /// A failure without a vendor answer (a refused connection, a timeout): whether trying again
    /// may help, and its text for rules that match on it.
    Error { transient: bool, message: &'a str },
    /// Nothing to judge: a success, or a value the classifier has no view of.
    Other,
}

/// A job output the classifier can look at. Implemented for `reqwest::Response`,
/// `reqwest::Error`, `http::Response<B>`, `std::io::Error`, `()` and `Result<T, E>` of those;
/// implement it for a vendor SDK's result type to classify its answers.
pub trait Classify {
    fn answer(&self) -> Answer<'_>;
}

/// What to do with one answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Hand the answer to the caller unchanged.
    Done,
    /// The vendor says the host is over its limit: pause the whole host, fleet-wide, for
    /// `retry_after` (or the configured default when the vendor gave none that could be read),
    /// then try again.
    RateLimited { retry_after: Option<Duration> },
    /// A transient failure: try again after a jittered backoff, within `retries_max`.
    Retry,
}

/// A user rule: `Some(verdict)` to decide, `None` to let later rules decide. `now` is the wall
/// clock, for HTTP-dates.
pub type Rule = Arc<dyn Fn(&Answer<'_>, SystemTime) -> Option<Verdict> + Send + Sync>;

/// User rules, then the defaults.
#[derive(Clone, Default)]
pub struct Classifier {
    rules: Vec<Rule>,
}

impl fmt::Debug for Classifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classifier")
            .field("rules", &self.rules.len())
            .finish()
    }
}

impl Classifier {
    /// Only the default rules.
    pub fn new() -> Classifier {
        Classifier { rules: Vec::new() }
    }

    /// Add a rule, consulted before the defaults and after the rules added earlier.
    pub fn rule(
        mut self,
        rule: impl Fn(&Answer<'_>, SystemTime) -> Option<Verdict> + Send + Sync + 'static,
    ) -> Classifier {
        self.rules.push(Arc::new(rule));
        self
    }

    /// gRPC RESOURCE_EXHAUSTED is a rate-limit answer, paused for the `RetryInfo` delay it
    /// carries (or the default). Not a default rule: some services also use the code for
    /// quotas that no wait will restore (a daily budget spent), where pausing the host for
    /// everyone is the wrong answer.
    pub fn grpc_resource_exhausted(self) -> Classifier {
        self.rule(|answer, _| match answer {
            Answer::Grpc {
                code: GRPC_RESOURCE_EXHAUSTED,
                retry_delay,
                ..
            } => Some(Verdict::RateLimited {
                retry_after: *retry_delay,
            }),
            _ => None,
        })
    }

    pub fn classify(&self, answer: &Answer<'_>, now: SystemTime) -> Verdict {
        self.rules
            .iter()
            .find_map(|rule| rule(answer, now))
            .unwrap_or_else(|| default_verdict(answer, now))
    }
}

/// The default rules (see the module documentation).
pub fn default_verdict(answer: &Answer<'_>, now: SystemTime) -> Verdict {
    match *answer {
        Answer::Http { status, headers } => {
            let retry_after_header = headers.get(http::header::RETRY_AFTER);
            let retry_after =
                retry_after_header.and_then(|value| parse_retry_after(value.as_bytes(), now));
            match status {
                StatusCode::TOO_MANY_REQUESTS => Verdict::RateLimited { retry_after },
                StatusCode::SERVICE_UNAVAILABLE if retry_after_header.is_some() => {
                    Verdict::RateLimited { retry_after }
                }
                StatusCode::INTERNAL_SERVER_ERROR
                | StatusCode::BAD_GATEWAY
                | StatusCode::SERVICE_UNAVAILABLE
                | StatusCode::GATEWAY_TIMEOUT
                | StatusCode::REQUEST_TIMEOUT => Verdict::Retry,
                _ => Verdict::Done,
            }
        }
        Answer::Grpc {
            code: GRPC_UNAVAILABLE,
            ..
        } => Verdict::Retry,
        Answer::Error {
            transient: true, ..
        } => Verdict::Retry,
        Answer::Grpc { .. } | Answer::Error { .. } | Answer::Other => Verdict::Done,
    }
}

/// A value with nothing to classify (always [`Verdict::Done`] unless a rule says otherwise):
/// wrap a job's plain output in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Plain<T>(pub T);

impl<T> Classify for Plain<T> {
    fn answer(&self) -> Answer<'_> {
        Answer::Other
    }
}

impl Classify for () {
    fn answer(&self) -> Answer<'_> {
        Answer::Other
    }
}

impl<T: Classify, E: Classify> Classify for Result<T, E> {
    fn answer(&self) -> Answer<'_> {
        match self {
            Ok(value) => value.answer(),
            Err(error) => error.answer(),
        }
    }
}

impl<B> Classify for http::Response<B> {
    fn answer(&self) -> Answer<'_> {
        Answer::Http {
            status: self.status(),
            headers: self.headers(),
        }
    }
}

impl Classify for reqwest::Response {
    fn answer(&self) -> Answer<'_> {
        Answer::Http {
            status: self.status(),
            headers: self.headers(),
        }
    }
}

impl Classify for reqwest::Error {
    fn answer(&self) -> Answer<'_> {
        // A connect failure or timeout may pass; a builder or decode error will not. The
        // message is not borrowed from the error (reqwest formats it on demand).
        Answer::Error {
            transient: self.is_connect() || self.is_timeout(),
            message: "",
        }
    }
}

impl Classify for reqwest_middleware::Error {
    fn answer(&self) -> Answer<'_> {
        match self {
            reqwest_middleware::Error::Reqwest(error) => error.answer(),
            reqwest_middleware::Error::Middleware(_) => Answer::Error {
                transient: false,
                message: "",
            },
        }
    }
}

impl Classify for std::io::Error {
    fn answer(&self) -> Answer<'_> {
        use std::io::ErrorKind;
        Answer::Error {
            transient: matches!(
                self.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::TimedOut
                    | ErrorKind::Interrupted
                    | ErrorKind::WouldBlock
            ),
            message: "",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(retry_after: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = retry_after {
            headers.insert(
                http::header::RETRY_AFTER,
                HeaderValue::from_str(value).expect("ascii"),
            );
        }
        headers
    }

    fn http_verdict(classifier: &Classifier, status: u16, retry_after: Option<&str>) -> Verdict {
        let headers = headers(retry_after);
        let answer = Answer::Http {
            status: StatusCode::from_u16(status).expect("status"),
            headers: &headers,
        };
        classifier.classify(&answer, SystemTime::UNIX_EPOCH)
    }

    // The default rules for HTTP answers: `tests/vectors.rs`, on the vectors every
    // implementation shares.

    #[test]
    fn grpc_resource_exhausted_only_when_asked() {
        let answer = Answer::Grpc {
            code: GRPC_RESOURCE_EXHAUSTED,
            message: "quota",
            retry_delay: Some(Duration::from_millis(1_500)),
        };
        let now = SystemTime::UNIX_EPOCH;
        assert_eq!(Classifier::new().classify(&answer, now), Verdict::Done);
        assert_eq!(
            Classifier::new()
                .grpc_resource_exhausted()
                .classify(&answer, now),
            Verdict::RateLimited {
                retry_after: Some(Duration::from_millis(1_500))
            }
        );
        let unavailable = Answer::Grpc {
            code: GRPC_UNAVAILABLE,
            message: "",
            retry_delay: None,
        };
        assert_eq!(
            Classifier::new().classify(&unavailable, now),
            Verdict::Retry
        );
    }

    #[test]
    fn user_rules_run_first_in_order() {
        // A vendor that answers 400 with a "RATE_LIMIT" header instead of 429, and whose 500s
        // are never worth retrying.
        let classifier = Classifier::new()
            .rule(|answer, _| match answer {
                Answer::Http { status, headers }
                    if *status == StatusCode::BAD_REQUEST
                        && headers.contains_key("x-rate-limit") =>
                {
                    Some(Verdict::RateLimited {
                        retry_after: Some(Duration::from_secs(60)),
                    })
                }
                _ => None,
            })
            .rule(|answer, _| match answer {
                Answer::Http { status, .. } if status.is_server_error() => Some(Verdict::Done),
                _ => None,
            })
            .rule(|_, _| Some(Verdict::Retry));
        let mut flagged = HeaderMap::new();
        flagged.insert("x-rate-limit", HeaderValue::from_static("1"));
        let answer = Answer::Http {
            status: StatusCode::BAD_REQUEST,
            headers: &flagged,
        };
        let now = SystemTime::UNIX_EPOCH;
        assert_eq!(
            classifier.classify(&answer, now),
            Verdict::RateLimited {
                retry_after: Some(Duration::from_secs(60))
            }
        );
        assert_eq!(http_verdict(&classifier, 500, None), Verdict::Done);
        assert_eq!(
            http_verdict(&classifier, 200, None),
            Verdict::Retry,
            "the catch-all rule comes before the defaults"
        );
    }

    #[test]
    fn results_and_errors() {
        let transient = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let permanent = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let classifier = Classifier::new();
        let now = SystemTime::UNIX_EPOCH;
        let ok: Result<(), std::io::Error> = Ok(());
        assert_eq!(classifier.classify(&ok.answer(), now), Verdict::Done);
        let refused: Result<(), std::io::Error> = Err(transient);
        assert_eq!(classifier.classify(&refused.answer(), now), Verdict::Retry);
        let denied: Result<(), std::io::Error> = Err(permanent);
        assert_eq!(classifier.classify(&denied.answer(), now), Verdict::Done);
    }
}
