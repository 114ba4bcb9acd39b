//! `GET /v1/forward-auth`: the decision a reverse proxy asks for before it forwards a request
//! (nginx `auth_request`, Caddy `forward_auth`, Traefik `forwardAuth`; `docs/proxies.md`).
//!
//! This module owns what is read from the proxy's request (the original method and URI, who
//! the user is, the proxy's token) and the headers of the answer (`RateLimit-Policy`,
//! `RateLimit`, `Retry-After`). The decision itself is `/v1/check`'s
//! (`api::inbound::decide_inbound`): the same rules, the same path normalisation, the same token
//! scopes, so the two endpoints cannot answer one request differently.
//!
//! Who the user is: the value of `forward_auth_user_header` when configured and present (the
//! proxy sets it after its own authentication), else the client's address: the socket peer,
//! or, when the peer is one of `forward_auth_trusted_proxies`, the nearest untrusted address of
//! `X-Forwarded-For` (never `Forwarded`, which these proxies pass on from the client
//! untouched); an IPv6 client by its prefix, as the tower layer keys one.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;
use tollgate::core::Kind;
use tollgate_tower::{ClientAddress, TrustedProxies};

use crate::api::ApiResult;
use crate::api::inbound::{Inbound, InboundFields, decide_inbound};
use crate::config::ServerConfig;
use crate::error::{ApiError, internal};
use crate::extract::ForwardData;
use crate::state::AppState;

/// The header a proxy sends its data token in on this endpoint. Not `Authorization`: a proxy
/// passes the end user's request headers on to the auth endpoint, so `Authorization` there is
/// the user's own credential for the application (or absent), and a proxy that overwrote it
/// with Tollgate's token could no longer tell the application who the user is.
pub(crate) const TOKEN_HEADER: &str = "x-tollgate-token";
/// The original method: Traefik and Caddy send the first; the second is nginx's custom.
const METHOD_HEADERS: [&str; 2] = ["x-forwarded-method", "x-original-method"];
/// The original request target (path and query).
const URI_HEADERS: [&str; 2] = ["x-forwarded-uri", "x-original-uri"];
/// How the original method and URI are named in a refusal.
const METHOD_FIELD: &str = "X-Forwarded-Method";
const URI_FIELD: &str = "X-Forwarded-Uri";

/// The endpoint's settings, read once from the configuration.
#[derive(Clone, Debug)]
pub(crate) struct ForwardAuth {
    user_header: Option<HeaderName>,
    client: ClientAddress,
}

impl ForwardAuth {
    /// The settings of `config`, or the first one refused, naming it.
    pub(crate) fn new(config: &ServerConfig) -> Result<ForwardAuth, crate::ServerError> {
        let refuse = |setting, reason: String| crate::ServerError::Setting { setting, reason };
        let user_header = match config.forward_auth_user_header.as_deref() {
            None => None,
            Some(name) => Some(
                parse_user_header(name)
                    .map_err(|reason| refuse("forward_auth_user_header", reason))?,
            ),
        };
        let trusted = TrustedProxies::parse(
            config
                .forward_auth_trusted_proxies
                .iter()
                .map(|entry| entry.trim()),
        )
        .map_err(|reason| refuse("forward_auth_trusted_proxies", reason))?;
        let client = ClientAddress::new(trusted)
            .with_ipv6_prefix_len(config.forward_auth_ipv6_prefix_len)
            .map_err(|reason| {
                refuse(
                    "forward_auth_ipv6_prefix_len",
                    reason.trim_start_matches("ipv6_prefix_len: ").to_owned(),
                )
            })?;
        Ok(ForwardAuth {
            user_header,
            client,
        })
    }
}

/// A header name a proxy may name its user in: any valid name but the token's own and the
/// ones this endpoint reads for something else.
fn parse_user_header(text: &str) -> Result<HeaderName, String> {
    let name = HeaderName::from_bytes(text.trim().as_bytes())
        .map_err(|_| format!("{text:?} is not an HTTP header name"))?;
    let taken = [
        TOKEN_HEADER,
        "authorization",
        "x-forwarded-for",
        "forwarded",
    ]
    .into_iter()
    .chain(METHOD_HEADERS)
    .chain(URI_HEADERS);
    for other in taken {
        if name.as_str() == other {
            return Err(format!(
                "{text:?} carries something else on /v1/forward-auth; name the header your proxy \
                 sets to the authenticated user, e.g. X-User"
            ));
        }
    }
    Ok(name)
}

/// The first of `names` present, as text, or a refusal naming the first name.
fn original<'h>(headers: &'h HeaderMap, names: [&str; 2], field: &str) -> ApiResult<&'h str> {
    let Some(value) = names.iter().find_map(|name| headers.get(*name)) else {
        return Err(ApiError::bad_field(
            field,
            format!(
                "missing: the proxy must send the original request's in {} (or {})",
                names[0], names[1]
            ),
        ));
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::bad_field(field, "must be visible ASCII"))?
        .trim();
    if text.is_empty() {
        return Err(ApiError::bad_field(field, "is empty"));
    }
    Ok(text)
}

#[utoipa::path(get, path = "/v1/forward-auth", tag = "data",
    security(("forward" = [])),
    params(
        ("X-Forwarded-Method" = String, Header, description = "the original request's method, \
            letters only (or `X-Original-Method`, read when this is absent); HEAD meets GET \
            rules", pattern = "^[A-Za-z]+$", example = "GET"),
        ("X-Forwarded-Uri" = String, Header, description = "the original request's target, \
            path and query, starting with `/` (or `X-Original-URI`, read when this is \
            absent); the path is matched normalized as `/v1/check` matches `path`, the query \
            ignored", pattern = "^/", example = "/repo/v1/entity/123/bundle"),
        ("X-Forwarded-For" = Option<String>, Header, description = "the client's address, \
            believed only from a peer in `forward_auth_trusted_proxies`, read from the right; \
            the key when no `forward_auth_user_header` names the user"),
    ),
    responses(
        (status = 200, description = "allowed: the proxy forwards the request. The body is \
            `/v1/check`'s", body = tollgate_api::data::CheckAnswer,
            headers(
                ("RateLimit-Policy" = String, description = "each limit matched, \
                    `\"NAME\";q=QUOTA;w=WINDOW_S` (IETF httpapi-ratelimit-headers; no `w` for a \
                    concurrency limit); absent when no limit matched"),
                ("RateLimit" = String, description = "each limit matched, \
                    `\"NAME\";r=REMAINING;t=RESET_S`; absent when no limit matched"))),
        (status = 400, response = tollgate_api::schema::BadRequest),
        (status = 401, response = tollgate_api::schema::Unauthorized),
        (status = 403, response = tollgate_api::schema::Forbidden),
        (status = 404, description = "a limit matched was deleted while it was decided on",
            body = tollgate_api::schema::NotFoundError),
        (status = 429, description = "not allowed now: the proxy refuses the request (nginx \
            needs `error_page` for it, see `docs/proxies.md`)", body = tollgate_api::data::CheckDenied,
            headers(
                ("Retry-After" = u64, description = "seconds to wait: `retry_after_ms` rounded \
                    up"),
                ("RateLimit-Policy" = String, description = "as for 200"),
                ("RateLimit" = String, description = "as for 200"))),
        (status = 503, response = tollgate_api::schema::Unavailable)))]
pub(crate) async fn forward_auth(
    ForwardData(grant): ForwardData,
    State(state): State<AppState>,
    request: Request,
) -> ApiResult<Response> {
    let headers = request.headers();
    let method = original(headers, METHOD_HEADERS, METHOD_FIELD)?;
    let uri = original(headers, URI_HEADERS, URI_FIELD)?;
    if !uri.starts_with('/') {
        return Err(ApiError::bad_field(
            URI_FIELD,
            "must be the original request's path and query, starting with /",
        ));
    }
    let settings = state.forward_auth();
    let named = match &settings.user_header {
        Some(name) => match headers.get(name) {
            Some(value) => {
                let text = value
                    .to_str()
                    .map_err(|_| ApiError::bad_field(name.as_str(), "must be visible ASCII"))?
                    .trim();
                (!text.is_empty()).then_some((name.as_str(), text))
            }
            None => None,
        },
        None => None,
    };
    // A key from the user header is refused naming the header; an address is always a key.
    let (field, user) = match named {
        Some((field, user)) => (field, user.to_owned()),
        None => {
            let Some(ConnectInfo(peer)) = request.extensions().get::<ConnectInfo<SocketAddr>>()
            else {
                return Err(internal(
                    "no peer address: /v1/forward-auth is served only from a socket",
                ));
            };
            (
                "X-Forwarded-For",
                settings.client.key_of(peer.ip(), headers),
            )
        }
    };
    let fields = InboundFields {
        method: METHOD_FIELD,
        path: URI_FIELD,
        user: field,
    };
    let inbound = decide_inbound(&state, &grant, method, uri, Some(&user), &fields).await?;
    let extra = rate_limit_headers(&state, &inbound);
    let mut response = inbound.into_response();
    let answer = response.headers_mut();
    for (name, value) in extra {
        answer.insert(name, value);
    }
    Ok(response)
}

/// `RateLimit-Policy` and `RateLimit` for the limits matched (IETF
/// draft-ietf-httpapi-ratelimit-headers): each limit by its name, its quota open to the
/// request's priority (`q`) over its window in seconds (`w`, for a rate limit), what remains of
/// it (`r`) and the seconds until everything counted now stops counting (`t`).
fn rate_limit_headers(state: &AppState, inbound: &Inbound) -> Vec<(HeaderName, HeaderValue)> {
    let table = state.limiter().limits();
    let mut policies = Vec::new();
    let mut counters = Vec::new();
    for view in inbound.limits() {
        let Some(limit) = table.get(&view.name) else {
            continue;
        };
        let policy = limit.policy();
        let quota = policy.capacity_for(inbound.priority());
        let window = match policy.kind() {
            Kind::Rate(rate) => format!(";w={}", rate.period_us().div_ceil(1_000_000)),
            Kind::Concurrency(_) => String::new(),
        };
        policies.push(format!("\"{}\";q={quota}{window}", view.name));
        counters.push(format!(
            "\"{}\";r={};t={}",
            view.name,
            view.remaining,
            view.reset_ms.div_ceil(1_000)
        ));
    }
    if policies.is_empty() {
        return Vec::new();
    }
    let mut headers = Vec::new();
    for (name, items) in [("ratelimit-policy", policies), ("ratelimit", counters)] {
        // Limit names are `[a-z0-9][a-z0-9._:-]*`: always a valid quoted string and header.
        if let Ok(value) = HeaderValue::from_str(&items.join(", ")) {
            headers.push((HeaderName::from_static(name), value));
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_header_is_a_header_name_that_carries_nothing_else() {
        assert_eq!(
            parse_user_header(" X-User ").map(|name| name.to_string()),
            Ok("x-user".to_owned())
        );
        for taken in [
            "X-Tollgate-Token",
            "authorization",
            "X-Forwarded-For",
            "X-Forwarded-Uri",
            "X-Original-Method",
        ] {
            assert!(parse_user_header(taken).is_err(), "{taken}");
        }
        assert!(parse_user_header("bad header").is_err());
        assert!(parse_user_header("").is_err());
    }

    #[test]
    fn the_original_method_and_uri_come_from_either_spelling() {
        let mut headers = HeaderMap::new();
        let missing = original(&headers, METHOD_HEADERS, METHOD_FIELD).expect_err("missing");
        assert_eq!(missing.field.as_deref(), Some("X-Forwarded-Method"));
        headers.insert("x-original-method", HeaderValue::from_static("head"));
        assert_eq!(
            original(&headers, METHOD_HEADERS, METHOD_FIELD).ok(),
            Some("head")
        );
        headers.insert("x-forwarded-method", HeaderValue::from_static("GET"));
        assert_eq!(
            original(&headers, METHOD_HEADERS, METHOD_FIELD).ok(),
            Some("GET")
        );
        headers.insert("x-forwarded-uri", HeaderValue::from_static("  "));
        let empty = original(&headers, URI_HEADERS, URI_FIELD).expect_err("empty");
        assert_eq!(empty.field.as_deref(), Some("X-Forwarded-Uri"));
    }
}
