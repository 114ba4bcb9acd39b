//! What the fuzz targets share: the server's router driven in-process (a memory store, the
//! rules in an in-memory SQLite table), and the checks every answer of API v1 must pass; and
//! each target's body (`targets`), which the corpus replay runs too.

pub mod targets;

use std::sync::OnceLock;

use axum::body::Body;
use http::{HeaderMap, Method, Request};
use http_body_util::BodyExt;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;
use tower::ServiceExt;

/// The admin token the in-process server is configured with.
pub const ADMIN_TOKEN: &str = "fuzz-admin";

/// The limits in force when a target starts, as `PUT /v1/limits/{name}` bodies: every kind and
/// algorithm, a reserve, a key, and `match`es for `/v1/check`.
pub const BASE_LIMITS: &[(&str, &str)] = &[
    (
        "rate",
        r#"{"kind":"rate","limit":1000000,"period_ms":1000}"#,
    ),
    (
        "small",
        r#"{"kind":"rate","limit":3,"period_ms":60000,"algorithm":"fixed","reserve":{"high":1}}"#,
    ),
    (
        "gcra",
        r#"{"kind":"rate","limit":5,"period_ms":1000,"algorithm":"gcra","burst":2}"#,
    ),
    (
        "per-user",
        r#"{"kind":"rate","limit":100,"period_ms":1000,"per":"user","match":{"method":"GET","path":"/users/#"}}"#,
    ),
    (
        "pool",
        r#"{"kind":"concurrency","limit":4,"lease_ttl_ms":60000,"match":{"method":"POST","path":"/upload"}}"#,
    ),
    (
        "entity",
        r#"{"kind":"rate","limit":50,"period_ms":1000,"margin_ms":10,"match":{"method":"*","path":"/entity/#/bundle"}}"#,
    ),
];

/// The server, in this process.
pub struct Api {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
}

/// One answer of the API.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// The body as JSON, when it is JSON.
    pub json: Option<Value>,
}

impl Answer {
    /// A string field of the JSON body, by JSON pointer.
    pub fn text(&self, pointer: &str) -> Option<&str> {
        self.json.as_ref()?.pointer(pointer)?.as_str()
    }

    pub fn number(&self, pointer: &str) -> Option<u64> {
        self.json.as_ref()?.pointer(pointer)?.as_u64()
    }
}

impl Api {
    /// The server every run of a target talks to, started on first use with `BASE_LIMITS`.
    pub fn get() -> &'static Api {
        static API: OnceLock<Api> = OnceLock::new();
        API.get_or_init(Api::start)
    }

    fn start() -> Api {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let router = runtime.block_on(async {
            // A named in-memory database, so that no file is left behind.
            let url = format!(
                "sqlite:file:tollgate-fuzz-{}?mode=memory&cache=shared",
                std::process::id()
            );
            let source = tollgate_rules::SqlSource::connect(&url, "fuzz_limits")
                .await
                .expect("an in-memory rules table");
            let config = tollgate_server::ServerConfig {
                listen: "127.0.0.1:0".parse().expect("an address"),
                store: tollgate_server::StoreChoice::Memory,
                rules_url: url,
                state_url: None,
                rules_table: "fuzz_limits".to_owned(),
                reload_interval: std::time::Duration::from_secs(3600),
                admin_token: Some(ADMIN_TOKEN.to_owned()),
                data_token: None,
                metrics_token: None,
                body_bytes_max: tollgate_server::DEFAULT_BODY_BYTES_MAX,
                // Waits are decided, but never long.
                wait_ms_max: 1,
                keys_tracked_max: tollgate_server::DEFAULT_KEYS_TRACKED_MAX,
                keys_per_limit_max: None,
                pause_ms_max: tollgate_server::DEFAULT_PAUSE_MS_MAX,
                learn: tollgate::LearnConfig::default(),
                shares: tollgate::Shares::default(),
                recover_on_start: false,
                permit_secret: Some([7; 16]),
                shutdown_grace: std::time::Duration::from_secs(1),
                redis_namespace: tollgate_server::DEFAULT_REDIS_NAMESPACE.to_owned(),
                store_fail_open: false,
                redis_allow_eviction: false,
                redis_module: tollgate_server::DEFAULT_REDIS_MODULE,
                store_timeout: std::time::Duration::from_secs(1),
                grpc_listen: None,
                envoy_config: None,
                path_matching: tollgate_server::DEFAULT_PATH_MATCHING,
                forward_auth_user_header: None,
                forward_auth_trusted_proxies: Vec::new(),
                forward_auth_ipv6_prefix_len: tollgate_server::DEFAULT_FORWARD_AUTH_IPV6_PREFIX_LEN,
                path_encoded_slash: tollgate_server::PathEncodedSlash::default(),
                forward_auth_proxy: None,
                forward_auth_method_header: None,
                forward_auth_uri_header: None,
                forward_auth_network_keys_max:
                    tollgate_server::DEFAULT_FORWARD_AUTH_NETWORK_KEYS_MAX,
                allowed_origins: Vec::new(),
                allowed_hosts: Vec::new(),
                header_read_timeout: std::time::Duration::from_millis(
                    tollgate_server::DEFAULT_HEADER_READ_TIMEOUT_MS,
                ),
                idle_timeout: std::time::Duration::from_millis(
                    tollgate_server::DEFAULT_IDLE_TIMEOUT_MS,
                ),
                connections_max: tollgate_server::DEFAULT_CONNECTIONS_MAX,
                waiters_max: tollgate_server::DEFAULT_WAITERS_MAX,
                waiters_per_limit_max: tollgate_server::DEFAULT_WAITERS_PER_LIMIT_MAX,
                waiters_per_token_max: tollgate_server::DEFAULT_WAITERS_PER_TOKEN_MAX,
                tls_cert: None,
                tls_key: None,
            };
            tollgate_server::memory_router(config, tollgate_rules::RulesSource::Sql(source))
                .await
                .expect("a router")
        });
        let api = Api { runtime, router };
        for (name, body) in BASE_LIMITS {
            let answer = api.admin(Method::PUT, &format!("/v1/limits/{name}"), body.as_bytes());
            assert_eq!(answer.status, 200, "base limit {name}: {answer:?}");
        }
        api
    }

    /// Send one request; `admin` adds the admin token.
    pub fn send(&self, method: Method, uri: &str, body: &[u8], admin: bool) -> Answer {
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .header(http::header::CONTENT_TYPE, "application/json");
        if admin {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}"));
        }
        let request = request.body(Body::from(body.to_vec())).expect("a request");
        self.runtime.block_on(async {
            let response = self
                .router
                .clone()
                .oneshot(request)
                .await
                .expect("the router is infallible");
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body = response
                .into_body()
                .collect()
                .await
                .expect("a body")
                .to_bytes()
                .to_vec();
            let json = serde_json::from_slice(&body).ok();
            Answer {
                status,
                headers,
                body,
                json,
            }
        })
    }

    pub fn data(&self, method: Method, uri: &str, body: &[u8]) -> Answer {
        self.send(method, uri, body, false)
    }

    pub fn admin(&self, method: Method, uri: &str, body: &[u8]) -> Answer {
        self.send(method, uri, body, true)
    }

    /// Commit a permit the API granted, using nothing: a granted permit is always accepted.
    pub fn settle(&self, permit: &str) {
        let answer = self.data(
            Method::POST,
            &format!("/v1/permits/{}/commit", segment(permit)),
            br#"{"used":0}"#,
        );
        assert_eq!(
            answer.status, 200,
            "committing a granted permit: {answer:?}"
        );
    }
}

/// `text` as one path segment of a URI, every byte but letters and digits percent-encoded.
pub fn segment(text: &str) -> String {
    utf8_percent_encode(text, NON_ALPHANUMERIC).to_string()
}

/// `raw` spliced into a URI as it is when the result is a valid URI (so axum's own decoding
/// of escapes is fuzzed too), percent-encoded otherwise.
pub fn uri_with(prefix: &str, raw: &str, suffix: &str) -> String {
    let spliced = format!("{prefix}{raw}{suffix}");
    if spliced.parse::<http::Uri>().is_ok() {
        spliced
    } else {
        format!("{prefix}{}{suffix}", segment(raw))
    }
}

/// The checks every answer passes: its status is one the endpoint documents, an error is
/// `{"error": {"code", "message"}}` with the code its status stands for, a 400 names the field
/// at fault, and a 429 carries `Retry-After` in whole seconds, rounded up from
/// `retry_after_ms`.
pub fn check_answer(answer: &Answer, documented: &[u16]) {
    assert!(
        documented.contains(&answer.status),
        "status {} is not one of {documented:?}: {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    if answer.status < 400 {
        assert!(answer.json.is_some(), "a success without a JSON body");
        return;
    }
    let code = answer.text("/error/code").expect("an error code");
    let message = answer.text("/error/message").expect("an error message");
    assert!(!message.is_empty(), "an empty error message");
    let expected: &[&str] = match answer.status {
        400 => &["bad_request"],
        401 => &["unauthorized"],
        404 => &["not_found"],
        409 => &["conflict"],
        429 => &["rate_limited"],
        503 => &["store_unavailable", "too_many_keys"],
        _ => &["internal"],
    };
    assert!(
        expected.contains(&code),
        "status {} with code {code}",
        answer.status
    );
    if answer.status == 400 {
        let field = answer.text("/error/field").unwrap_or_default();
        assert!(
            !field.is_empty(),
            "a refusal that names no field: {message}"
        );
        assert!(
            message.starts_with(field),
            "the message does not start with its field {field:?}: {message}"
        );
    }
    if answer.status == 429 {
        let retry_after_ms = answer.number("/retry_after_ms").expect("retry_after_ms");
        let header = answer
            .headers
            .get(http::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok())
            .expect("a Retry-After header in seconds");
        assert_eq!(header, retry_after_ms.div_ceil(1_000), "Retry-After");
        let reason = answer.text("/reason").unwrap_or_default();
        assert!(
            ["capacity", "paused", "recovering", "queued"].contains(&reason),
            "reason {reason:?}"
        );
    }
}

/// A body as the server reads it (`None` when it refuses it as a body): empty reads as `{}`,
/// and only an object is read.
pub fn read_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Option<T> {
    let body: &[u8] = if body.trim_ascii().is_empty() {
        b"{}"
    } else {
        body
    };
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    serde_json::from_slice(body).ok()
}

/// `input` split in two at its first `0xff` byte (never part of UTF-8 text), or all in the
/// second part when there is none.
pub fn split(input: &[u8]) -> (&[u8], &[u8]) {
    match input.iter().position(|&byte| byte == 0xff) {
        Some(at) => (&input[..at], &input[at + 1..]),
        None => (&[], input),
    }
}
