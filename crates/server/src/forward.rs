//! `GET /v1/forward-auth`: the decision a reverse proxy asks for before it forwards a request
//! (nginx `auth_request`, Caddy `forward_auth`, Traefik `forwardAuth`; `docs/proxies.md`).
//!
//! This module owns what is read from the proxy's request (the original method and URI, who
//! the user is, the proxy's token) and the headers of the answer (`RateLimit-Policy`,
//! `RateLimit`, `Retry-After`). The decision itself is `/v1/check`'s
//! (`api::inbound::find_inbound`, `decide_found`): the same rules, the same path readings,
//! the same token scopes, so the two endpoints cannot answer one request differently.
//!
//! The original method and URI are read from the headers the configured proxy sets
//! (`forward_auth_proxy`, or `forward_auth_method_header` / `forward_auth_uri_header`), and
//! from no other: a proxy passes the client's own headers on to this endpoint, so a header of
//! that kind the proxy does not set was written by the client, and a request carrying one, or
//! two values of one, is refused unread.
//!
//! Who the user is: the value of `forward_auth_user_header` when configured and present (the
//! proxy sets it after its own authentication), keyed `user:NAME` (or `user-sha256:HEX` for a
//! name that is long or not plain ASCII), else the client's address: the socket peer, or,
//! when the peer is one of `forward_auth_trusted_proxies`, the nearest untrusted address of
//! `X-Forwarded-For` (never `Forwarded`, which these proxies pass on from the client
//! untouched); an IPv6 client by its prefix, as the tower layer keys one; a client past its
//! network's share of keys by its network (`networks`). Users and addresses never share a
//! key: an address key has no `user` prefix.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;
use sha2::{Digest, Sha256};
use tollgate::core::Kind;
use tollgate_tower::{ClientAddress, TrustedProxies};

use crate::api::ApiResult;
use crate::api::inbound::{Found, Inbound, InboundFields, decide_found, find_inbound};
use crate::config::ServerConfig;
use crate::error::{ApiError, internal};
use crate::extract::ForwardData;
use crate::metrics::RefusalLabels;
use crate::networks::NetworkKeys;
use crate::state::AppState;

/// The header a proxy sends its data token in on this endpoint. Not `Authorization`: a proxy
/// passes the end user's request headers on to the auth endpoint, so `Authorization` there is
/// the user's own credential for the application (or absent), and a proxy that overwrote it
/// with Tollgate's token could no longer tell the application who the user is.
pub(crate) const TOKEN_HEADER: &str = "x-tollgate-token";
/// The headers each proxy names the original method and URI in: nginx's documentation sets
/// `X-Original-URI` (and the method, by convention, `X-Original-Method`); Caddy's
/// `forward_auth` and Traefik's `forwardAuth` set the `X-Forwarded-*` pair.
const PROXIES: [(&str, &str, &str); 3] = [
    ("nginx", "X-Original-Method", "X-Original-URI"),
    ("caddy", "X-Forwarded-Method", "X-Forwarded-Uri"),
    ("traefik", "X-Forwarded-Method", "X-Forwarded-Uri"),
];
/// Read when no proxy is configured; a request carrying `X-Original-*` is then refused.
const DEFAULT_HEADERS: (&str, &str) = ("X-Forwarded-Method", "X-Forwarded-Uri");
/// Every header some proxy names the original request in. One the configured proxy does not
/// set reached this endpoint from the client.
const ORIGINAL_HEADERS: [&str; 4] = [
    "X-Forwarded-Method",
    "X-Original-Method",
    "X-Forwarded-Uri",
    "X-Original-URI",
];
/// A user name is kept in its key as it is when it is at most this long and plain ASCII; any
/// other is keyed by its SHA-256, so every user value is a key.
const USER_NAME_BYTES_MAX: usize = 128;
/// What a key from the user header starts with; an address key never does.
const USER_KEY_PREFIX: &str = "user:";
const USER_HASH_KEY_PREFIX: &str = "user-sha256:";
/// A client keeps its place in its network's share this much past the longest window of the
/// limits it was counted under, for counters that outlive their window by a little.
const PLACE_SLACK: Duration = Duration::from_secs(1);

/// A header this endpoint reads, and how a refusal names it.
#[derive(Clone, Debug)]
struct Named {
    header: HeaderName,
    field: String,
}

impl Named {
    fn parse(text: &str) -> Result<Named, String> {
        let field = text.trim();
        let header = HeaderName::from_bytes(field.as_bytes())
            .map_err(|_| format!("{text:?} is not an HTTP header name"))?;
        Ok(Named {
            header,
            field: field.to_owned(),
        })
    }
}

/// The endpoint's settings, read once from the configuration.
#[derive(Clone, Debug)]
pub(crate) struct ForwardAuth {
    user_header: Option<HeaderName>,
    client: ClientAddress,
    method: Named,
    uri: Named,
    /// Headers naming the original request that the proxy does not set.
    unexpected: Vec<Named>,
    /// Who sets the headers read, for messages: `nginx`, or the settings that name them.
    proxy: String,
    networks: Arc<NetworkKeys>,
}

impl ForwardAuth {
    /// The settings of `config`, or the first one refused, naming it.
    pub(crate) fn new(config: &ServerConfig) -> Result<ForwardAuth, crate::ServerError> {
        let refuse = |setting, reason: String| crate::ServerError::Setting { setting, reason };
        let (preset, proxy) = match config.forward_auth_proxy.as_deref().map(str::trim) {
            None => (DEFAULT_HEADERS, "the default reading".to_owned()),
            Some(name) => {
                let Some(&(_, method, uri)) = PROXIES
                    .iter()
                    .find(|(proxy, ..)| proxy.eq_ignore_ascii_case(name))
                else {
                    return Err(refuse(
                        "forward_auth_proxy",
                        format!(
                            "{name:?} is not a proxy this endpoint knows: \"nginx\", \"caddy\" or \
                             \"traefik\" (or name the headers with forward_auth_method_header \
                             and forward_auth_uri_header)"
                        ),
                    ));
                };
                ((method, uri), name.to_ascii_lowercase())
            }
        };
        let method = Named::parse(
            config
                .forward_auth_method_header
                .as_deref()
                .unwrap_or(preset.0),
        )
        .map_err(|reason| refuse("forward_auth_method_header", reason))?;
        let uri = Named::parse(
            config
                .forward_auth_uri_header
                .as_deref()
                .unwrap_or(preset.1),
        )
        .map_err(|reason| refuse("forward_auth_uri_header", reason))?;
        let proxy = if config.forward_auth_method_header.is_some()
            || config.forward_auth_uri_header.is_some()
        {
            "forward_auth_method_header and forward_auth_uri_header".to_owned()
        } else {
            proxy
        };
        let reserved = [
            TOKEN_HEADER,
            "authorization",
            "x-forwarded-for",
            "forwarded",
            "host",
        ];
        for (setting, named) in [
            ("forward_auth_method_header", &method),
            ("forward_auth_uri_header", &uri),
        ] {
            if reserved.contains(&named.header.as_str()) {
                return Err(refuse(
                    setting,
                    format!(
                        "{:?} carries something else on /v1/forward-auth",
                        named.field
                    ),
                ));
            }
        }
        if method.header == uri.header {
            return Err(refuse(
                "forward_auth_uri_header",
                "must not be the method's header".to_owned(),
            ));
        }
        let unexpected = ORIGINAL_HEADERS
            .iter()
            .filter_map(|name| Named::parse(name).ok())
            .filter(|named| named.header != method.header && named.header != uri.header)
            .collect();
        let user_header = match config.forward_auth_user_header.as_deref() {
            None => None,
            Some(name) => Some(
                parse_user_header(name, &[&method.header, &uri.header])
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
        if config.forward_auth_network_keys_max == 0 {
            return Err(refuse(
                "forward_auth_network_keys_max",
                "must be at least 1".to_owned(),
            ));
        }
        let networks = Arc::new(NetworkKeys::new(
            config.forward_auth_network_keys_max,
            config.keys_tracked_max,
            client.ipv6_prefix_len(),
        ));
        Ok(ForwardAuth {
            user_header,
            client,
            method,
            uri,
            unexpected,
            proxy,
            networks,
        })
    }
}

/// A header name a proxy may name its user in: any valid name but the token's own and the
/// ones this endpoint reads for something else (`read`, and every header some proxy names the
/// original request in).
fn parse_user_header(text: &str, read: &[&HeaderName]) -> Result<HeaderName, String> {
    let name = HeaderName::from_bytes(text.trim().as_bytes())
        .map_err(|_| format!("{text:?} is not an HTTP header name"))?;
    let taken = [
        TOKEN_HEADER,
        "authorization",
        "x-forwarded-for",
        "forwarded",
    ]
    .into_iter()
    .chain(ORIGINAL_HEADERS)
    .chain(read.iter().map(|name| name.as_str()));
    for other in taken {
        if name.as_str().eq_ignore_ascii_case(other) {
            return Err(format!(
                "{text:?} carries something else on /v1/forward-auth; name the header your proxy \
                 sets to the authenticated user, e.g. X-User"
            ));
        }
    }
    Ok(name)
}

/// A request refused unread: a 400 naming the header, as any request Tollgate cannot read
/// (a proxy refuses the original request: Caddy and Traefik pass the 400 on, the shipped
/// nginx configuration turns it into a refusal), counted in
/// `tollgate_forward_auth_refusals_total`.
fn refused(state: &AppState, reason: &'static str, field: &str, message: String) -> ApiError {
    state
        .metrics()
        .forward_auth_refusals
        .get_or_create(&RefusalLabels { reason })
        .inc();
    ApiError::bad_field(field, message)
}

impl ForwardAuth {
    /// Refuse a request that carries a header naming the original request which the proxy
    /// does not set: the client wrote it.
    fn refuse_unexpected(&self, state: &AppState, headers: &HeaderMap) -> ApiResult<()> {
        for named in &self.unexpected {
            if headers.contains_key(&named.header) {
                return Err(refused(
                    state,
                    "unexpected_header",
                    &named.field,
                    format!(
                        "is not set by the proxy in front ({}: {} and {}), so the client sent \
                         it; the request is refused unread (forward_auth_proxy names the proxy)",
                        self.proxy, self.method.field, self.uri.field
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The value of `named`, the one header the proxy names the original's method or URI in
    /// (`what`): missing is a 400, two different values a refusal.
    fn original<'h>(
        &self,
        state: &AppState,
        headers: &'h HeaderMap,
        named: &Named,
        what: &str,
    ) -> ApiResult<&'h str> {
        let mut values = headers.get_all(&named.header).iter();
        let Some(value) = values.next() else {
            return Err(ApiError::bad_field(
                &named.field,
                format!(
                    "missing: the proxy must send the original request's {what} in it ({})",
                    self.proxy
                ),
            ));
        };
        if values.any(|other| other != value) {
            return Err(refused(
                state,
                "disagreeing_headers",
                &named.field,
                "was sent twice with different values; the request is refused unread".to_owned(),
            ));
        }
        let text = value
            .to_str()
            .map_err(|_| ApiError::bad_field(&named.field, "must be visible ASCII"))?
            .trim();
        if text.is_empty() {
            return Err(ApiError::bad_field(&named.field, "is empty"));
        }
        Ok(text)
    }
}

/// The key of a user the proxy named: `user:NAME` for a short name in plain ASCII, else
/// `user-sha256:` and the SHA-256 of its bytes in hex, so that any value is a key and none is
/// an address's.
fn user_key(name: &[u8]) -> String {
    if name.len() <= USER_NAME_BYTES_MAX && name.iter().all(|&b| (b' '..=b'~').contains(&b)) {
        // Printable ASCII is UTF-8.
        if let Ok(text) = std::str::from_utf8(name) {
            return format!("{USER_KEY_PREFIX}{text}");
        }
    }
    let mut key = String::with_capacity(USER_HASH_KEY_PREFIX.len() + 64);
    key.push_str(USER_HASH_KEY_PREFIX);
    for byte in Sha256::digest(name) {
        key.push(char::from(HEX[usize::from(byte >> 4)]));
        key.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    key
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// How long a client's counters may live after a request counted under `found`'s limits: the
/// longest window (a rate limit) or lease (a concurrency limit) among them.
fn counters_live(state: &AppState, found: &Found) -> Duration {
    let table = state.limiter().limits();
    let longest = found
        .names()
        .iter()
        .filter_map(|name| table.get(name))
        .map(|limit| match limit.policy().kind() {
            Kind::Rate(rate) => rate.window_us(),
            Kind::Concurrency(concurrency) => concurrency.lease_ttl_us(),
        })
        .max()
        .unwrap_or(0);
    Duration::from_micros(longest) + PLACE_SLACK
}

#[utoipa::path(get, path = "/v1/forward-auth", tag = "data",
    security(("forward" = [])),
    params(
        ("X-Forwarded-Method" = Option<String>, Header, description = "the original request's \
            method, letters only, from Caddy and Traefik (`forward_auth_proxy` `caddy` or \
            `traefik`, and when no proxy is configured); HEAD meets GET rules. Read only from \
            the header the configured proxy sets (`forward_auth_method_header` names another): \
            a request carrying one it does not set, or two different values, is a 403 naming \
            the header and is not read", pattern = "^[A-Za-z]+$", example = "GET"),
        ("X-Forwarded-Uri" = Option<String>, Header, description = "the original request's \
            target, path and query, starting with `/`, from Caddy and Traefik (and when no \
            proxy is configured); read only as `X-Forwarded-Method` is. The path is matched as \
            `/v1/check` matches `path`: normalized as written and, unless \
            `path_encoded_slash = \"segment\"`, also with `%2F` and `%2E` decoded, counted under \
            the rules of both readings; the query ignored", pattern = "^/",
            example = "/repo/v1/entity/123/bundle"),
        ("X-Original-Method" = Option<String>, Header, description = "the original method from \
            nginx (`forward_auth_proxy = \"nginx\"`); refused otherwise"),
        ("X-Original-URI" = Option<String>, Header, description = "the original target from \
            nginx (`forward_auth_proxy = \"nginx\"`, nginx's `$request_uri`); refused otherwise"),
        ("X-Forwarded-For" = Option<String>, Header, description = "the client's address, \
            believed only from a peer in `forward_auth_trusted_proxies`, read from the right; \
            the key when no `forward_auth_user_header` names the user (past \
            `forward_auth_network_keys_max` clients of one /24 or /48, the network's key)"),
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
    let settings = state.forward_auth();
    settings.refuse_unexpected(&state, headers)?;
    let method = settings.original(&state, headers, &settings.method, "method")?;
    let uri = settings.original(&state, headers, &settings.uri, "path and query")?;
    if !uri.starts_with('/') {
        return Err(ApiError::bad_field(
            &settings.uri.field,
            "must be the original request's path and query, starting with /",
        ));
    }
    // Any value is a user: one a rule does not need is never refused.
    let named = settings.user_header.as_ref().and_then(|name| {
        let value = headers.get(name)?.as_bytes().trim_ascii();
        (!value.is_empty()).then(|| (name.as_str(), user_key(value)))
    });
    let user_field = match &named {
        Some((field, _)) => field,
        None => "X-Forwarded-For",
    };
    let fields = InboundFields {
        method: &settings.method.field,
        path: &settings.uri.field,
        user: user_field,
    };
    let found = find_inbound(&state, method, uri, &fields)?;
    let user = match named {
        Some((_, key)) => key,
        None => {
            let Some(ConnectInfo(peer)) = request.extensions().get::<ConnectInfo<SocketAddr>>()
            else {
                return Err(internal(
                    "no peer address: /v1/forward-auth is served only from a socket",
                ));
            };
            let address = settings.client.address_of(peer.ip(), headers);
            // Only a key that will be counted takes a place in its network's share.
            let shared = found.per_key().then(|| {
                settings
                    .networks
                    .shared_key(address, counters_live(&state, &found), Instant::now())
            });
            match shared.flatten() {
                Some(network) => network,
                None => settings.client.key_for(address),
            }
        }
    };
    let inbound = decide_found(&state, &grant, found, Some(&user), &fields).await?;
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
        let uri = HeaderName::from_static("x-request-target");
        assert_eq!(
            parse_user_header(" X-User ", &[&uri]).map(|name| name.to_string()),
            Ok("x-user".to_owned())
        );
        for taken in [
            "X-Tollgate-Token",
            "authorization",
            "X-Forwarded-For",
            "X-Forwarded-Uri",
            "X-Original-Method",
            "X-Request-Target",
        ] {
            assert!(parse_user_header(taken, &[&uri]).is_err(), "{taken}");
        }
        assert!(parse_user_header("bad header", &[]).is_err());
        assert!(parse_user_header("", &[]).is_err());
    }

    #[test]
    fn every_user_value_is_a_key_apart_from_addresses() {
        assert_eq!(user_key(b"alice"), "user:alice");
        assert_eq!(user_key(b"127.0.0.1"), "user:127.0.0.1");
        let long = user_key(&[b'u'; 300]);
        assert!(
            long.starts_with("user-sha256:") && long.len() == 12 + 64,
            "{long}"
        );
        let utf8 = user_key("zoë".as_bytes());
        assert!(utf8.starts_with("user-sha256:"), "{utf8}");
        assert_ne!(utf8, user_key("zoe".as_bytes()));
        for key in [long, utf8] {
            assert!(tollgate::check_key(&key).is_ok(), "{key}");
        }
    }
}
