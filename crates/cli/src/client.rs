//! A minimal HTTP/1 client for the Tollgate API, on hyper: plain `http://` with keep-alive.
//! It does not speak TLS: against a server that serves it (`tls_cert`), docs/server.md says to
//! use curl, or run the commands next to a TLS-terminating proxy.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Largest response body read, in bytes.
pub const RESPONSE_BYTES_MAX: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("server URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("cannot reach the server at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("no answer from the server within {0:?}")]
    Timeout(Duration),
    #[error("bad answer from the server: {0}")]
    BadAnswer(String),
}

/// An answer: status, headers, body, and the body as JSON when it is JSON.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub json: Option<serde_json::Value>,
}

impl Answer {
    /// `error.code` of an error answer.
    pub fn error_code(&self) -> Option<&str> {
        self.json.as_ref()?.get("error")?.get("code")?.as_str()
    }

    /// `error.message` of an error answer.
    pub fn error_message(&self) -> Option<&str> {
        self.json.as_ref()?.get("error")?.get("message")?.as_str()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client for one server, reusing connections.
#[derive(Clone, Debug)]
pub struct Client {
    base: String,
    token: Option<String>,
    timeout: Duration,
    http: HyperClient<HttpConnector, Full<Bytes>>,
}

impl Client {
    /// A client for `base` (`http://HOST:PORT`), sending `token` as a bearer token if given.
    pub fn new(
        base: &str,
        token: Option<String>,
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        let base = base.trim_end_matches('/').to_owned();
        let uri: Uri = base
            .parse()
            .map_err(|error: hyper::http::uri::InvalidUri| ClientError::BadUrl {
                url: base.clone(),
                reason: error.to_string(),
            })?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(ClientError::BadUrl {
                    url: base,
                    reason: "https is not supported by this client; use http:// to a server on \
                             loopback or behind a TLS-terminating proxy on the same host"
                        .into(),
                });
            }
            _ => {
                return Err(ClientError::BadUrl {
                    url: base,
                    reason: "must start with http://".into(),
                });
            }
        }
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build_http();
        Ok(Client {
            base,
            token,
            timeout,
            http,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Send a JSON body (or none) and read the answer.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, ClientError> {
        let bytes = match body {
            Some(body) => serde_json::to_vec(body)
                .map_err(|error| ClientError::BadAnswer(error.to_string()))?,
            None => Vec::new(),
        };
        self.send_raw(method, path, bytes, self.timeout).await
    }

    /// Send raw bytes as `application/json`, waiting at most `timeout`.
    pub async fn send_raw(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Answer, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut request = Request::builder()
            .method(method)
            .uri(&url)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|error| ClientError::BadUrl {
                url: url.clone(),
                reason: error.to_string(),
            })?;
        let exchange = async {
            let response =
                self.http
                    .request(request)
                    .await
                    .map_err(|error| ClientError::Unreachable {
                        url: url.clone(),
                        reason: error_chain(&error),
                    })?;
            let (parts, body) = response.into_parts();
            let limited = http_body_util::Limited::new(body, RESPONSE_BYTES_MAX);
            let body = limited
                .collect()
                .await
                .map_err(|error| ClientError::BadAnswer(error.to_string()))?
                .to_bytes();
            let json = serde_json::from_slice(&body).ok();
            Ok(Answer {
                status: parts.status,
                headers: parts.headers,
                body,
                json,
            })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
