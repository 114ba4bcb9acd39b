//! Who may call the HTTP API from where: the checks every request passes before a handler
//! sees it, so that a web page can neither reach the API through the browser that shows it
//! nor through a DNS name rebound to loopback.
//!
//! - **Host** (DNS rebinding): on a loopback listener, a request must name the server by a
//!   loopback name (`localhost`, `127.0.0.1`, `[::1]`) or an `allowed_hosts` entry. A page
//!   whose own name was rebound to 127.0.0.1 sends that name, and is refused. `/healthz` is
//!   exempt: it reads nothing and changes nothing, and a probe may name the server as it likes.
//! - **Origin**: a browser says which page sends a request; only the server's own origin (the
//!   dashboard at `/ui`) and the `allowed_origins` may call. Tools send no Origin.
//! - **Content-Type**: a body must be `application/json`, which a page cannot send to another
//!   site without a preflight; a preflight is answered (CORS) for `allowed_origins` only.
//!
//! `/v1/forward-auth` is asked by a reverse proxy, with the end user's request headers passed
//! on: its `Origin` and `Content-Type` are the user's request's, not the caller's, so neither is
//! checked there (it reads no body). A page still gets nothing from it: it needs
//! `X-Forwarded-Method` and `X-Forwarded-Uri`, which a browser sends cross-site only after a
//! preflight, answered for `allowed_origins` alone; and the Host check stands.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The loopback names every loopback listener answers to (IP literals are parsed, so any
/// spelling of a loopback address is one too).
const LOOPBACK_NAMES: [&str; 1] = ["localhost"];
/// How long a browser may keep a preflight's answer.
const PREFLIGHT_MAX_AGE_S: &str = "600";
const ALLOWED_METHODS: &str = "GET, POST, PUT, DELETE";
const ALLOWED_HEADERS: &str = "authorization, content-type";
/// The endpoint whose Origin and Content-Type are the end user's (see the module's doc).
const FORWARD_AUTH: &str = "/v1/forward-auth";
/// Answers a page from an allowed origin may read besides the simple ones.
const EXPOSED_HEADERS: &str = "retry-after";

/// The checks, as configured.
#[derive(Clone, Debug)]
pub(crate) struct Guard {
    /// `scheme://host[:port]`, lowercase.
    allowed_origins: Vec<String>,
    /// Names a request's Host may give (`name` or `name:port`, lowercase), besides the
    /// loopback ones; `None`: any Host.
    allowed_hosts: Option<Vec<String>>,
}

impl Guard {
    /// Checks for a listener that is on loopback (`loopback`) or not. The Host is checked on
    /// loopback, and beyond it only when names are configured. Entries were checked at start
    /// (`ServerConfig::check`).
    pub(crate) fn new(
        loopback: bool,
        allowed_origins: &[String],
        allowed_hosts: &[String],
    ) -> Guard {
        let hosts: Vec<String> = allowed_hosts
            .iter()
            .filter_map(|host| parse_host(host).ok())
            .collect();
        Guard {
            allowed_origins: allowed_origins
                .iter()
                .filter_map(|origin| parse_origin(origin).ok())
                .collect(),
            allowed_hosts: (loopback || !hosts.is_empty()).then_some(hosts),
        }
    }

    fn host_allowed(&self, host: &str) -> bool {
        let Some(allowed) = &self.allowed_hosts else {
            return true;
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let name = host_name(&host);
        if LOOPBACK_NAMES.contains(&name) || is_loopback_literal(name) {
            return true;
        }
        allowed.iter().any(|entry| *entry == host || *entry == name)
    }

    /// Whether `origin` is the server's own (the page was served by this server under the
    /// Host the request names, plain or behind a TLS proxy).
    fn own_origin(origin: &str, host: Option<&str>) -> bool {
        let Some(host) = host else {
            return false;
        };
        let origin = origin.to_ascii_lowercase();
        let host = host.to_ascii_lowercase();
        ["http://", "https://"]
            .iter()
            .any(|scheme| origin.strip_prefix(scheme) == Some(host.as_str()))
    }

    fn configured(&self, origin: &str) -> bool {
        let origin = origin.to_ascii_lowercase();
        self.allowed_origins.contains(&origin)
    }
}

/// The guard as middleware: refuses what it must, answers preflights of allowed origins, and
/// adds CORS headers to their answers.
pub(crate) async fn guard(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = text(headers, &header::HOST);
    if request.uri().path() != "/healthz"
        && let Some(host) = host
        && !guard.host_allowed(host)
    {
        return forbidden(
            "Host",
            format!(
                "{host:?} is not a name this server answers to: use localhost, 127.0.0.1 or \
                 [::1], or add it to allowed_hosts"
            ),
        );
    }
    if request.uri().path() == FORWARD_AUTH {
        return next.run(request).await;
    }
    let mut cors_origin = None;
    if let Some(origin) = headers.get(header::ORIGIN) {
        let Ok(origin) = origin.to_str() else {
            return forbidden("Origin", "is not text");
        };
        if guard.configured(origin) {
            cors_origin = HeaderValue::from_str(origin).ok();
        } else if !Guard::own_origin(origin, host) {
            return forbidden(
                "Origin",
                format!(
                    "pages from {origin:?} may not call this server; add the origin to \
                     allowed_origins to let them"
                ),
            );
        }
    }
    if let Some(origin) = cors_origin.clone()
        && request.method() == Method::OPTIONS
        && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
    {
        return preflight(origin);
    }
    if has_body(headers) && !is_json(headers) {
        let given = text(headers, &header::CONTENT_TYPE).map_or_else(
            || "none was given".to_owned(),
            |given| format!("got {given:?}"),
        );
        return ApiError::bad_field(
            "Content-Type",
            format!("a request with a body must say application/json; {given}"),
        )
        .with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        .into_response();
    }
    let mut response = next.run(request).await;
    if let Some(origin) = cors_origin {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSED_HEADERS),
        );
        headers.append(header::VARY, HeaderValue::from_static("origin"));
    }
    response
}

fn preflight(origin: HeaderValue) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(ALLOWED_METHODS),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(ALLOWED_HEADERS),
    );
    headers.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static(PREFLIGHT_MAX_AGE_S),
    );
    headers.insert(header::VARY, HeaderValue::from_static("origin"));
    response
}

fn forbidden(header: &str, reason: impl std::fmt::Display) -> Response {
    ApiError::bad_field(header, reason)
        .with_status(StatusCode::FORBIDDEN)
        .into_response()
}

fn text<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// Whether the request carries a body: a length above zero, or one sent in chunks.
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || text(headers, &header::CONTENT_LENGTH).is_some_and(|length| {
            length
                .trim()
                .parse::<u64>()
                .map_or(true, |length| length > 0)
        })
}

/// `application/json`, in any case, with any parameters (`; charset=utf-8`).
fn is_json(headers: &HeaderMap) -> bool {
    text(headers, &header::CONTENT_TYPE).is_some_and(|value| {
        let essence = value.split(';').next().unwrap_or_default().trim();
        essence.eq_ignore_ascii_case("application/json")
    })
}

/// The name part of a Host value: `[::1]:7070` → `[::1]`, `example:80` → `example`.
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

fn is_loopback_literal(name: &str) -> bool {
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>()
        .is_ok_and(|address| address.to_canonical().is_loopback())
}

/// `allowed_origins` entries as the guard compares them: `scheme://host[:port]`, http or
/// https, lowercase, nothing after the authority.
pub fn parse_origin(text: &str) -> Result<String, String> {
    let origin = text.trim().trim_end_matches('/').to_ascii_lowercase();
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .ok_or_else(|| format!("{text:?} must start with http:// or https://"))?;
    if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
        return Err(format!(
            "{text:?} must be scheme://host[:port], as a browser sends it in Origin"
        ));
    }
    Ok(origin)
}

/// `allowed_hosts` entries: `name` (any port) or `name:port`, lowercase, no scheme.
pub fn parse_host(text: &str) -> Result<String, String> {
    let host = text.trim().trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() || host.contains(['/', '?', '#', '@', ' ']) {
        return Err(format!(
            "{text:?} must be a host name, with or without :port (no scheme, no path)"
        ));
    }
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_pass_on_loopback_and_others_only_when_configured() {
        let guard = Guard::new(true, &[], &["tollgate.internal".into()]);
        for host in [
            "localhost",
            "LocalHost:7070",
            "127.0.0.1:7070",
            "127.0.0.2",
            "[::1]:7070",
            "[::1]",
            "localhost.",
            "tollgate.internal:9",
        ] {
            assert!(guard.host_allowed(host), "{host}");
        }
        for host in [
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io:7070",
            "[::2]:7070",
            "10.0.0.1:7070",
        ] {
            assert!(!guard.host_allowed(host), "{host}");
        }
        assert!(Guard::new(false, &[], &[]).host_allowed("anything.example"));
        assert!(!Guard::new(false, &[], &["a.example".into()]).host_allowed("b.example"));
    }

    #[test]
    fn an_origin_is_the_servers_own_only_under_the_same_host_and_port() {
        assert!(Guard::own_origin(
            "http://127.0.0.1:7070",
            Some("127.0.0.1:7070")
        ));
        assert!(Guard::own_origin(
            "https://Tollgate.example",
            Some("tollgate.example")
        ));
        assert!(!Guard::own_origin(
            "http://127.0.0.1:7071",
            Some("127.0.0.1:7070")
        ));
        assert!(!Guard::own_origin("null", Some("127.0.0.1:7070")));
        assert!(!Guard::own_origin("http://127.0.0.1:7070", None));
    }

    #[test]
    fn configured_origins_and_hosts_are_checked_when_read() {
        assert_eq!(
            parse_origin("HTTPS://App.example/").as_deref(),
            Ok("https://app.example")
        );
        assert!(parse_origin("app.example").is_err());
        assert!(parse_origin("https://app.example/path").is_err());
        assert!(parse_origin("null").is_err());
        assert_eq!(
            parse_host("Tollgate.Internal:7070").as_deref(),
            Ok("tollgate.internal:7070")
        );
        assert!(parse_host("http://x").is_err());
    }
}
