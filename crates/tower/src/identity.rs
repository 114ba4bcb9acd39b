//! Who makes a request: the user key that limits counted `per` user are keyed by.
//!
//! The source is configured, never guessed. A header is believed only when it is the
//! configured source (an authenticating proxy in front sets it); a trusted proxy's chain is
//! read only when the socket peer is a configured trusted proxy, and then from the right, so a
//! client cannot choose its own identity by sending it. The chain is `X-Forwarded-For`, which
//! nginx, Caddy, Traefik, HAProxy and the cloud load balancers write, unless the caller says
//! its proxies write RFC 7239 `Forwarded` instead: those proxies pass a client's own
//! `Forwarded` on untouched, so believing it by default would let a client name itself.
//!
//! Counted by address, an IPv6 client is its network prefix (a /64 unless configured): one
//! subscriber is given a whole /64 and may send each request from another of its 2^64
//! addresses. An IPv4 client is its address, and so is an IPv4 address seen through an IPv6
//! socket (`::ffff:a.b.c.d`).

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use http::{HeaderMap, HeaderName};

/// Reads the authenticated principal out of the request's extensions, where an
/// authentication layer that runs before the throttle put it.
pub type PrincipalFn = Arc<dyn for<'a> Fn(&'a http::Extensions) -> Option<&'a str> + Send + Sync>;

/// Where the user key comes from.
#[derive(Clone)]
pub enum Identity {
    /// The value of this header. Only safe when something in front (an authenticating proxy)
    /// sets it and strips any copy sent by the client.
    Header(HeaderName),
    /// The authenticated principal, read from the request extensions.
    Principal(PrincipalFn),
    /// The client's IP address: the socket peer from axum's `ConnectInfo<SocketAddr>` (serve
    /// with `into_make_service_with_connect_info::<SocketAddr>()`), or, when the peer is one
    /// of the trusted proxies, the nearest untrusted address of their chain (`X-Forwarded-For`
    /// unless [`ClientAddress::reading_forwarded`]); an IPv6 address counted by its network
    /// prefix (see [`ClientAddress`]).
    Peer(ClientAddress),
}

impl Identity {
    /// The client's address, behind `trusted` proxies, an IPv6 client counted by its /64
    /// ([`DEFAULT_IPV6_PREFIX_LEN`]).
    pub fn peer(trusted: TrustedProxies) -> Identity {
        Identity::Peer(ClientAddress::new(trusted))
    }

    /// The principal an authentication layer stored in the extensions.
    pub fn principal(
        read: impl for<'a> Fn(&'a http::Extensions) -> Option<&'a str> + Send + Sync + 'static,
    ) -> Identity {
        Identity::Principal(Arc::new(read))
    }

    /// The user key of a request, if this source names one: borrowed from the request, or an
    /// address written out.
    pub(crate) fn user_of<'r>(
        &self,
        headers: &'r HeaderMap,
        extensions: &'r http::Extensions,
    ) -> Option<Cow<'r, str>> {
        match self {
            Identity::Header(name) => {
                let value = headers.get(name)?.to_str().ok()?.trim();
                (!value.is_empty()).then_some(Cow::Borrowed(value))
            }
            Identity::Principal(read) => {
                let principal = read(extensions)?;
                (!principal.is_empty()).then_some(Cow::Borrowed(principal))
            }
            Identity::Peer(client) => {
                let ConnectInfo(peer) = extensions.get::<ConnectInfo<SocketAddr>>()?;
                Some(Cow::Owned(client.key_of(peer.ip(), headers)))
            }
        }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Identity::Principal(_) => f.write_str("Principal(..)"),
            Identity::Peer(client) => f.debug_tuple("Peer").field(client).finish(),
        }
    }
}

/// How long an IPv6 client's network prefix is unless configured, in bits: a /64 is what one
/// subscriber, one LAN, is given (RFC 6177; SLAAC needs it), so its addresses are one client.
pub const DEFAULT_IPV6_PREFIX_LEN: u8 = 64;
/// The widest IPv6 prefix that may stand for one client, in bits: anything shorter would
/// lump whole providers (/32 and wider) together.
pub const IPV6_PREFIX_LEN_MIN: u8 = 32;
/// The narrowest, in bits: one address.
pub const IPV6_PREFIX_LEN_MAX: u8 = 128;

/// [`Identity::Peer`]'s source: which proxies are believed, and how much of an IPv6 address
/// names one client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientAddress {
    trusted: TrustedProxies,
    ipv6_prefix_len: u8,
    /// The trusted proxies' chain is RFC 7239 `Forwarded`, not `X-Forwarded-For`.
    forwarded: bool,
}

impl ClientAddress {
    /// Clients behind `trusted` proxies; an IPv6 client is its /64.
    pub fn new(trusted: TrustedProxies) -> ClientAddress {
        ClientAddress {
            trusted,
            ipv6_prefix_len: DEFAULT_IPV6_PREFIX_LEN,
            forwarded: false,
        }
    }

    /// Count an IPv6 client by its first `bits` bits: 48 or 56 where subscribers are given
    /// wider networks, 128 to count every address apart. Refused outside
    /// [`IPV6_PREFIX_LEN_MIN`]..=[`IPV6_PREFIX_LEN_MAX`], naming the setting.
    pub fn with_ipv6_prefix_len(mut self, bits: u8) -> Result<ClientAddress, String> {
        if !(IPV6_PREFIX_LEN_MIN..=IPV6_PREFIX_LEN_MAX).contains(&bits) {
            return Err(format!(
                "ipv6_prefix_len: must be from {IPV6_PREFIX_LEN_MIN} to {IPV6_PREFIX_LEN_MAX} \
                 bits, got {bits}"
            ));
        }
        self.ipv6_prefix_len = bits;
        Ok(self)
    }

    pub fn trusted(&self) -> &TrustedProxies {
        &self.trusted
    }

    pub fn ipv6_prefix_len(&self) -> u8 {
        self.ipv6_prefix_len
    }

    /// Read the trusted proxies' chain from RFC 7239 `Forwarded` instead of `X-Forwarded-For`:
    /// only for proxies that write `Forwarded` and strip or overwrite a client's own (a
    /// proxy that passes it on untouched would let a client name itself).
    pub fn reading_forwarded(mut self) -> ClientAddress {
        self.forwarded = true;
        self
    }

    /// The key of the client of a request that came from `peer`: the peer, or behind a
    /// trusted proxy the nearest untrusted address of the chain, walked from the right.
    pub fn key_of(&self, peer: IpAddr, headers: &HeaderMap) -> String {
        self.key(self.address_of(peer, headers))
    }

    /// The address of the client of a request that came from `peer` (canonical: an
    /// IPv4-mapped address is IPv4): the peer, or behind a trusted proxy the nearest untrusted
    /// address of the chain, walked from the right. [`ClientAddress::key_for`] is its key.
    pub fn address_of(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if !self.trusted.contains(peer) {
            return peer;
        }
        let hops = if self.forwarded {
            forwarded_hops(headers)
        } else {
            x_forwarded_for_hops(headers)
        };
        nearest_untrusted(peer, &hops, &self.trusted)
    }

    /// The key of a client at `address`, as [`ClientAddress::key_of`] writes it.
    pub fn key_for(&self, address: IpAddr) -> String {
        self.key(canonical(address))
    }

    /// The key of a client at `address` (canonical: an IPv4-mapped address is IPv4): an IPv4
    /// address as written, an IPv6 one as its network, `2001:db8:7:7::/64` (the whole address
    /// at 128 bits).
    fn key(&self, address: IpAddr) -> String {
        match address {
            IpAddr::V6(v6) if self.ipv6_prefix_len < IPV6_PREFIX_LEN_MAX => {
                let mask = u128::MAX << (128 - u32::from(self.ipv6_prefix_len));
                let network = std::net::Ipv6Addr::from(u128::from(v6) & mask);
                format!("{network}/{}", self.ipv6_prefix_len)
            }
            address => address_key(address),
        }
    }
}

/// An address as `Display` writes it. IPv4 by hand: through the formatting machinery it is
/// 12 % of a throttled request's instructions (`benches/overhead.rs`, `tollgate-gcra`).
fn address_key(address: IpAddr) -> String {
    let IpAddr::V4(v4) = address else {
        return address.to_string();
    };
    let mut key = String::with_capacity(15);
    for (index, octet) in v4.octets().into_iter().enumerate() {
        if index > 0 {
            key.push('.');
        }
        if octet >= 100 {
            key.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            key.push(char::from(b'0' + octet / 10 % 10));
        }
        key.push(char::from(b'0' + octet % 10));
    }
    key
}

/// What to do with a request that matched a rule counted per user but names no user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unidentified {
    /// Answer `401 Unauthorized`.
    Reject,
    /// Count every such request under this one key (all anonymous callers share a budget).
    SharedKey(String),
}

/// An IP network: an address and a prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpNet {
    address: IpAddr,
    prefix_len: u8,
}

impl IpNet {
    /// `10.0.0.0/8`, `::1`, `192.0.2.7` (a bare address is a network of one).
    pub fn parse(text: &str) -> Result<IpNet, String> {
        let (address, prefix_len) = match text.split_once('/') {
            Some((address, prefix)) => (
                address,
                Some(
                    prefix
                        .parse::<u8>()
                        .map_err(|_| format!("{text:?}: the prefix length must be a number"))?,
                ),
            ),
            None => (text, None),
        };
        let address: IpAddr = address
            .parse()
            .map_err(|_| format!("{text:?}: not an IP address"))?;
        let bits = if address.is_ipv4() { 32 } else { 128 };
        let prefix_len = prefix_len.unwrap_or(bits);
        if prefix_len > bits {
            return Err(format!(
                "{text:?}: the prefix length must be at most {bits}"
            ));
        }
        Ok(IpNet {
            address: canonical(address),
            prefix_len,
        })
    }

    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.address, canonical(address)) {
            (IpAddr::V4(net), IpAddr::V4(address)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(address) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(address)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(address) & mask
            }
            _ => false,
        }
    }
}

/// IPv4 addresses seen through an IPv6 socket (`::ffff:a.b.c.d`) are IPv4 addresses.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        IpAddr::V4(_) => address,
    }
}

/// The proxies whose `Forwarded` / `X-Forwarded-For` headers are believed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    networks: Vec<IpNet>,
}

impl TrustedProxies {
    /// No proxy is trusted: the socket peer is the client, and forwarding headers are ignored.
    pub fn none() -> TrustedProxies {
        TrustedProxies::default()
    }

    /// Trust these networks (`10.0.0.0/8`, `127.0.0.1`, `fd00::/8`).
    pub fn parse<'a>(
        networks: impl IntoIterator<Item = &'a str>,
    ) -> Result<TrustedProxies, String> {
        let networks = networks
            .into_iter()
            .map(IpNet::parse)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TrustedProxies { networks })
    }

    pub fn contains(&self, address: IpAddr) -> bool {
        self.networks.iter().any(|net| net.contains(address))
    }
}

/// Forwarding hops read at most, so a huge header costs bounded work.
const FORWARDED_HOPS_MAX: usize = 32;

/// The client's address behind a trusted, canonical `peer`: the chain of forwarded addresses
/// `hops` (client first) is walked from the right (the hop the trusted proxy itself added) to
/// the first address that is not a trusted proxy. Anything left of that was written by the
/// client and is not believed.
fn nearest_untrusted(peer: IpAddr, hops: &[Option<IpAddr>], trusted: &TrustedProxies) -> IpAddr {
    let mut nearest = peer;
    for hop in hops.iter().rev() {
        match hop {
            // Garbage in a hop we would have to believe: stop at the last trusted address.
            None => return nearest,
            Some(address) => {
                let address = canonical(*address);
                if !trusted.contains(address) {
                    return address;
                }
                nearest = address;
            }
        }
    }
    nearest
}

/// The addresses of `Forwarded`, client first. `None` marks a hop that is not an address (`unknown`, an obfuscated name, garbage).
fn forwarded_hops(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let forwarded = headers.get_all(http::header::FORWARDED);
    let mut hops = Vec::new();
    for value in forwarded {
        let Ok(text) = value.to_str() else {
            hops.push(None);
            continue;
        };
        for element in text.split(',') {
            let address = element
                .split(';')
                .filter_map(|pair| pair.trim().split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
                .and_then(|(_, value)| parse_node(value.trim()));
            hops.push(address);
        }
    }
    nearest_hops(hops)
}

/// The addresses of `X-Forwarded-For`, client first, as `forwarded_hops` reads them.
fn x_forwarded_for_hops(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let mut hops = Vec::new();
    for value in headers.get_all("x-forwarded-for") {
        let Ok(text) = value.to_str() else {
            hops.push(None);
            continue;
        };
        hops.extend(text.split(',').map(|hop| parse_node(hop.trim())));
    }
    nearest_hops(hops)
}

/// Only the nearest hops matter: they are read from the right.
fn nearest_hops(mut hops: Vec<Option<IpAddr>>) -> Vec<Option<IpAddr>> {
    if hops.len() > FORWARDED_HOPS_MAX {
        hops.drain(..hops.len() - FORWARDED_HOPS_MAX);
    }
    hops
}

/// `192.0.2.1`, `192.0.2.1:4711`, `"[2001:db8::1]:4711"`, `2001:db8::1`.
fn parse_node(text: &str) -> Option<IpAddr> {
    let text = text.trim_matches('"');
    if let Ok(address) = text.parse::<IpAddr>() {
        return Some(address);
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (address, _) = rest.split_once(']')?;
        return address.parse().ok();
    }
    text.parse::<SocketAddr>().ok().map(|socket| socket.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_keys_are_what_display_writes() {
        for octet in [0u8, 7, 9, 10, 42, 99, 100, 199, 200, 255] {
            let v4 = IpAddr::from([octet, 255 - octet, octet / 3, 1]);
            assert_eq!(address_key(v4), v4.to_string());
        }
        let v6: IpAddr = "2001:db8::1".parse().expect("an address");
        assert_eq!(address_key(v6), v6.to_string());
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, http::HeaderValue::from_static(value));
        }
        map
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address")
    }

    #[test]
    fn forwarding_headers_are_ignored_from_untrusted_peers() {
        let trusted = TrustedProxies::parse(["10.0.0.0/8"]).expect("valid");
        let spoofed = headers(&[("x-forwarded-for", "1.2.3.4"), ("forwarded", "for=1.2.3.4")]);
        for client in [
            ClientAddress::new(trusted.clone()),
            ClientAddress::new(trusted).reading_forwarded(),
        ] {
            assert_eq!(client.key_of(ip("203.0.113.9"), &spoofed), "203.0.113.9");
        }
        let none = ClientAddress::new(TrustedProxies::none());
        assert_eq!(none.key_of(ip("10.0.0.1"), &spoofed), "10.0.0.1");
    }

    #[test]
    fn a_trusted_proxy_chain_is_read_from_the_right() {
        let trusted = TrustedProxies::parse(["10.0.0.0/8", "192.0.2.5"]).expect("valid");
        let client = ClientAddress::new(trusted.clone())
            .with_ipv6_prefix_len(128)
            .expect("valid");
        // The client claimed 1.1.1.1; 198.51.100.7 is what our first proxy saw.
        let chain = headers(&[("x-forwarded-for", "1.1.1.1, 198.51.100.7, 192.0.2.5")]);
        assert_eq!(client.key_of(ip("10.1.2.3"), &chain), "198.51.100.7");
        let forwarded = headers(&[(
            "forwarded",
            r#"for=1.1.1.1, for="[2001:db8::7]:4711";proto=https, for=192.0.2.5:80"#,
        )]);
        assert_eq!(
            client
                .clone()
                .reading_forwarded()
                .key_of(ip("10.1.2.3"), &forwarded),
            "2001:db8::7"
        );
        let garbage = headers(&[("x-forwarded-for", "1.1.1.1, nonsense")]);
        assert_eq!(client.key_of(ip("10.1.2.3"), &garbage), "10.1.2.3");
        let empty = HeaderMap::new();
        assert_eq!(client.key_of(ip("10.1.2.3"), &empty), "10.1.2.3");
        assert_eq!(
            client.reading_forwarded().key_of(ip("10.1.2.3"), &chain),
            "10.1.2.3",
            "a chain in the header not chosen is not read"
        );
    }

    /// By socket peer: the client's address as `Display` writes it, an IPv4 address seen
    /// through an IPv6 socket as IPv4, and the forwarded client behind a trusted proxy only.
    #[test]
    fn the_peer_is_read_from_the_socket_address() {
        let forwarded = headers(&[("x-forwarded-for", "198.51.100.7")]);
        let untrusting = Identity::peer(TrustedProxies::none());
        let trusting = Identity::peer(TrustedProxies::parse(["10.0.0.0/8"]).expect("valid"));
        let user = |identity: &Identity, peer: &str| {
            let mut extensions = http::Extensions::new();
            extensions.insert(ConnectInfo(SocketAddr::new(ip(peer), 40_000)));
            identity
                .user_of(&forwarded, &extensions)
                .map(Cow::into_owned)
        };
        for (peer, expected) in [
            ("127.0.0.1", "127.0.0.1"),
            ("::ffff:10.1.2.3", "10.1.2.3"),
            ("2001:db8::7", "2001:db8::/64"),
            ("2001:db8:0:0:ffff:1:2:3", "2001:db8::/64"),
            ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
            ("10.9.8.7", "10.9.8.7"),
        ] {
            assert_eq!(user(&untrusting, peer).as_deref(), Some(expected), "{peer}");
        }
        assert_eq!(user(&trusting, "10.9.8.7").as_deref(), Some("198.51.100.7"));
        assert_eq!(user(&trusting, "192.0.2.1").as_deref(), Some("192.0.2.1"));
        assert_eq!(
            untrusting.user_of(&forwarded, &http::Extensions::new()),
            None
        );
    }

    /// Through `Identity::Peer`, as the layer asks: behind a trusted proxy that appends to
    /// `X-Forwarded-For` and passes a client's own `Forwarded` on (nginx, Caddy, Traefik), the
    /// client is what the proxy wrote, not what it claims.
    #[test]
    fn a_client_behind_a_trusted_proxy_cannot_name_itself_in_forwarded() {
        let identity = Identity::peer(TrustedProxies::parse(["10.0.0.0/8"]).expect("valid"));
        let mut extensions = http::Extensions::new();
        extensions.insert(ConnectInfo(SocketAddr::new(ip("10.0.0.1"), 40_000)));
        for claim in ["for=1.2.3.4", "for=5.6.7.8"] {
            let sent = headers(&[("forwarded", claim), ("x-forwarded-for", "198.51.100.7")]);
            assert_eq!(
                identity.user_of(&sent, &extensions).as_deref(),
                Some("198.51.100.7"),
                "{claim}"
            );
        }
    }

    /// By default the chain is `X-Forwarded-For` alone: a client's own `Forwarded`, passed on
    /// untouched by a trusted proxy that writes only `X-Forwarded-For`, names nobody.
    #[test]
    fn x_forwarded_for_alone_ignores_a_forwarded_header() {
        let client = ClientAddress::new(TrustedProxies::parse(["10.0.0.0/8"]).expect("valid"));
        let both = headers(&[
            ("forwarded", "for=1.2.3.4"),
            ("x-forwarded-for", "6.6.6.6, 198.51.100.7"),
        ]);
        assert_eq!(client.key_of(ip("10.0.0.1"), &both), "198.51.100.7");
        // From an untrusted peer nothing forwarded is read; an IPv6 client is its /64.
        assert_eq!(
            client.key_of(ip("2001:db8:1:2:3:4:5:6"), &both),
            "2001:db8:1:2::/64"
        );
        let v6 = headers(&[("x-forwarded-for", "2001:db8:9:9::1")]);
        assert_eq!(
            client.key_of(ip("::ffff:10.0.0.1"), &v6),
            "2001:db8:9:9::/64"
        );
        assert_eq!(client.key_of(ip("10.0.0.1"), &HeaderMap::new()), "10.0.0.1");
    }

    #[test]
    fn an_ipv6_client_is_its_prefix_of_the_configured_length() {
        let key = |bits: u8, address: &str| {
            ClientAddress::new(TrustedProxies::none())
                .with_ipv6_prefix_len(bits)
                .expect("a valid length")
                .key(canonical(ip(address)))
        };
        assert_eq!(key(64, "2001:db8:a:b:c:d:e:f"), "2001:db8:a:b::/64");
        assert_eq!(key(56, "2001:db8:a:b:c:d:e:f"), "2001:db8:a::/56");
        assert_eq!(key(48, "2001:db8:a:bb:c:d:e:f"), "2001:db8:a::/48");
        assert_eq!(key(60, "2001:db8:a:ff:c:d:e:f"), "2001:db8:a:f0::/60");
        assert_eq!(key(128, "2001:db8:a:b:c:d:e:f"), "2001:db8:a:b:c:d:e:f");
        // IPv4, and IPv4 through an IPv6 socket: the whole address, whatever the length.
        assert_eq!(key(48, "192.0.2.7"), "192.0.2.7");
        assert_eq!(key(64, "::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(
            ClientAddress::new(TrustedProxies::none()).ipv6_prefix_len(),
            DEFAULT_IPV6_PREFIX_LEN
        );
        for bits in [0, 31, 129, 255] {
            let refused = ClientAddress::new(TrustedProxies::none())
                .with_ipv6_prefix_len(bits)
                .expect_err("out of range");
            assert!(refused.starts_with("ipv6_prefix_len: "), "{refused}");
        }
    }

    #[test]
    fn networks_parse_and_contain() {
        let net = IpNet::parse("192.168.0.0/16").expect("valid");
        assert!(net.contains(ip("192.168.4.5")));
        assert!(net.contains(ip("::ffff:192.168.4.5")));
        assert!(!net.contains(ip("192.169.0.1")));
        assert!(
            IpNet::parse("0.0.0.0/0")
                .expect("valid")
                .contains(ip("8.8.8.8"))
        );
        assert!(IpNet::parse("::1").expect("valid").contains(ip("::1")));
        assert!(IpNet::parse("10.0.0.0/33").is_err());
        assert!(IpNet::parse("ten").is_err());
    }
}
