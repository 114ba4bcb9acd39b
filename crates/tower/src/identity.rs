//! Who makes a request: the user key that limits counted `per` user are keyed by.
//!
//! The source is configured, never guessed. A header is believed only when it is the
//! configured source (an authenticating proxy in front sets it); `X-Forwarded-For` and
//! `Forwarded` are read only when the socket peer is a configured trusted proxy, and then
//! from the right, so a client cannot choose its own identity by sending those headers.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::extract::ConnectInfo;
use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use http::{HeaderMap, HeaderName};
use smallvec::SmallVec;
use tokio::net::TcpListener;
use tollgate::{Check, KeyHandle, LimitHandle, Priority};

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
    /// The client's IP address: the socket peer (held by a throttle made for its connection,
    /// see [`Throttle::into_make_service_with_peer`](crate::Throttle::into_make_service_with_peer);
    /// otherwise from axum's `ConnectInfo<PeerAddr>`, whose key is written once per
    /// connection, or `ConnectInfo<SocketAddr>`), or, when the peer is one
    /// of these trusted proxies, the nearest untrusted address in `Forwarded` /
    /// `X-Forwarded-For`.
    Peer(TrustedProxies),
}

impl Identity {
    /// The principal an authentication layer stored in the extensions.
    pub fn principal(
        read: impl for<'a> Fn(&'a http::Extensions) -> Option<&'a str> + Send + Sync + 'static,
    ) -> Identity {
        Identity::Principal(Arc::new(read))
    }

    /// The user of a request, if this source names one. The key is borrowed from the request
    /// where it can be; an address is written out into `address`, on the caller's stack, so
    /// naming the user allocates nothing and moves no buffer.
    /// `connection` is the peer of a throttle made for one connection, read before the
    /// request's connection info. `peer_addr_first` says which connection info to look for
    /// first: the kind found last time (a server gives every request the same kind), so a
    /// request looks up one.
    pub(crate) fn user_of<'r>(
        &self,
        headers: &'r HeaderMap,
        extensions: &'r http::Extensions,
        connection: Option<&'r PeerAddr>,
        address: &'r mut AddressText,
        peer_addr_first: &AtomicBool,
    ) -> Option<User<'r>> {
        let key = match self {
            Identity::Header(name) => {
                let value = headers.get(name)?.to_str().ok()?.trim();
                (!value.is_empty()).then_some(value)
            }
            Identity::Principal(read) => {
                let principal = read(extensions)?;
                (!principal.is_empty()).then_some(principal)
            }
            Identity::Peer(trusted) => {
                let peer = match connection {
                    Some(peer) => Peer::Addr(peer),
                    None => Peer::of(extensions, peer_addr_first)?,
                };
                let peer = match peer {
                    // The connection's key, written once, unless its peer is a proxy to look
                    // behind.
                    Peer::Addr(peer) if !trusted.contains(peer.address.ip()) => {
                        return Some(User {
                            key: peer.key(),
                            connection: Some(peer),
                        });
                    }
                    Peer::Addr(peer) => peer.address.ip(),
                    Peer::Socket(address) => address.ip(),
                };
                address.write(client_ip(peer, headers, trusted));
                Some(address.as_str())
            }
        };
        key.map(|key| User {
            key,
            connection: None,
        })
    }
}

/// A connection's socket peer with its user key written out once, for [`Identity::Peer`].
///
/// A throttle made for its connection holds one
/// ([`Throttle::into_make_service_with_peer`](crate::Throttle::into_make_service_with_peer)).
/// A layer inside a router reads it from the connection info: serve with
/// `into_make_service_with_connect_info::<PeerAddr>()` instead of `SocketAddr`, and every
/// request of the connection carries the key ready to use, where a `SocketAddr` has it
/// written out (and checked as text) again for each request. The key is the same either way.
/// A peer that is a trusted proxy is looked behind as always.
///
/// The connection also keeps, for each rule counted per user that its requests are decided
/// under alone, the limit's handle on its key (`tollgate::KeyHandle`): under a GCRA rule with
/// the memory store, a request then takes no lock and finds no counter. The store keeps the
/// key's counter while the connection is open. A handle made when the store could offer no
/// word (at the key cap, or while its rule was being changed) decides the general way for as
/// long as the connection keeps it: slower, never wrong.
#[derive(Clone, Debug)]
pub struct PeerAddr {
    address: SocketAddr,
    connection: Arc<Connection>,
}

/// What the requests of one connection share.
#[derive(Debug)]
struct Connection {
    /// The IP as the user key (`client_ip` of a peer that is no trusted proxy).
    key: Arc<str>,
    /// The handle on `key` made first: set once, then read without a lock (most connections
    /// meet one rule counted per user, and keep meeting it).
    first: OnceLock<KeyHandle>,
    /// Handles on `key` for other limits, the latest last; at most
    /// `KEY_HANDLES_PER_CONNECTION`. A lock no two requests of a connection wait on: one that
    /// finds it held (HTTP/2 requests in parallel) decides without it.
    others: Mutex<SmallVec<[KeyHandle; 1]>>,
}

/// Limits past the first that a connection keeps a key handle for: the rules a client's
/// requests meet one at a time are few; past this many, the oldest handle makes room.
const KEY_HANDLES_PER_CONNECTION: usize = 4;

impl PeerAddr {
    pub fn new(address: SocketAddr) -> PeerAddr {
        let mut text = AddressText::default();
        text.write(canonical(address.ip()));
        PeerAddr {
            address,
            connection: Arc::new(Connection {
                key: Arc::from(text.as_str()),
                first: OnceLock::new(),
                others: Mutex::new(SmallVec::new()),
            }),
        }
    }

    /// The socket peer.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The user key the peer is counted under when it is no trusted proxy.
    pub fn key(&self) -> &str {
        &self.connection.key
    }

    /// `handle.check_now` of one unit for this connection's key, on the connection's handle
    /// for that key, made on first use.
    pub(crate) fn check_now(&self, handle: &LimitHandle) -> Option<tollgate::Result<Check>> {
        self.connection
            .with_key_handle(handle, |kept| kept.check_now(1, Priority::Normal))
            .unwrap_or_else(|| handle.check_now(Some(&self.connection.key), 1, Priority::Normal))
    }

    /// One unit for this connection's key taken on its key's word, if the counter allows it
    /// now (`KeyHandle::take_now`); `false` has taken nothing.
    pub(crate) fn take_now(&self, handle: &LimitHandle) -> bool {
        self.connection
            .with_key_handle(handle, |kept| kept.take_now(1, Priority::Normal))
            .unwrap_or(false)
    }
}

impl Connection {
    /// `then` of the connection's handle on its key for `handle`'s limit, made on first use;
    /// `None` when another request of the connection holds the handles past the first.
    #[inline]
    fn with_key_handle<R>(
        &self,
        handle: &LimitHandle,
        then: impl FnOnce(&KeyHandle) -> R,
    ) -> Option<R> {
        let first = self
            .first
            .get_or_init(|| handle.for_key(Arc::clone(&self.key)));
        if first.is_for(handle) {
            return Some(then(first));
        }
        self.with_other_key_handle(handle, then)
    }

    /// `with_key_handle` for a limit other than the first.
    #[cold]
    fn with_other_key_handle<R>(
        &self,
        handle: &LimitHandle,
        then: impl FnOnce(&KeyHandle) -> R,
    ) -> Option<R> {
        let mut others = self.others.try_lock().ok()?;
        let position = match others.iter().position(|kept| kept.is_for(handle)) {
            Some(position) => position,
            None => {
                if others.len() == KEY_HANDLES_PER_CONNECTION {
                    others.remove(0);
                }
                others.push(handle.for_key(Arc::clone(&self.key)));
                others.len() - 1
            }
        };
        Some(then(&others[position]))
    }
}

/// Who a request is from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct User<'r> {
    pub(crate) key: &'r str,
    /// The connection, when the key is its peer's (`PeerAddr::check_now` then decides).
    pub(crate) connection: Option<&'r PeerAddr>,
}

/// A request's connection info, of either kind.
enum Peer<'r> {
    Addr(&'r PeerAddr),
    Socket(SocketAddr),
}

impl<'r> Peer<'r> {
    /// The connection info in `extensions`, looked up by the kind `peer_addr_first` names
    /// first, which is then set to the kind found.
    fn of(extensions: &'r http::Extensions, peer_addr_first: &AtomicBool) -> Option<Peer<'r>> {
        let by_addr = || {
            extensions
                .get::<ConnectInfo<PeerAddr>>()
                .map(|info| Peer::Addr(&info.0))
        };
        let by_socket = || {
            extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|info| Peer::Socket(info.0))
        };
        let first_addr = peer_addr_first.load(Ordering::Relaxed);
        let first = if first_addr { by_addr() } else { by_socket() };
        if first.is_some() {
            return first;
        }
        let found = if first_addr { by_socket() } else { by_addr() }?;
        peer_addr_first.store(!first_addr, Ordering::Relaxed);
        Some(found)
    }
}

impl Connected<IncomingStream<'_, TcpListener>> for PeerAddr {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> PeerAddr {
        PeerAddr::new(*stream.remote_addr())
    }
}

impl Connected<SocketAddr> for PeerAddr {
    fn connect_info(address: SocketAddr) -> PeerAddr {
        PeerAddr::new(address)
    }
}

/// Longest text form of an address: an IPv6 address with an embedded IPv4 one
/// (`ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`).
const ADDRESS_TEXT_BYTES_MAX: usize = 45;

/// The buffer an address is written into: the longest form rounded up to whole 16-byte
/// blocks, on an 8-byte boundary. Checking the whole buffer as UTF-8 then takes the check's
/// word-at-a-time path, block by block, where a short slice would be checked byte by byte.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct AddressBytes([u8; 48]);

/// The decimal digits of every octet value, then their count.
const OCTET_TEXT: [[u8; 4]; 256] = {
    let mut table = [[0; 4]; 256];
    let mut octet = 0;
    while octet < 256 {
        let value = octet as u8;
        table[octet] = if value >= 100 {
            [
                b'0' + value / 100,
                b'0' + value / 10 % 10,
                b'0' + value % 10,
                3,
            ]
        } else if value >= 10 {
            [b'0' + value / 10, b'0' + value % 10, 0, 2]
        } else {
            [b'0' + value, 0, 0, 1]
        };
        octet += 1;
    }
    table
};

/// An IP address written out as `IpAddr`'s `Display` writes it, held inline. IPv4 (the common
/// case) is written by hand: the formatting machinery costs more than the rest of the decision.
#[derive(Clone, Copy)]
pub(crate) struct AddressText {
    bytes: AddressBytes,
    len: u8,
}

impl Default for AddressText {
    fn default() -> AddressText {
        AddressText {
            bytes: AddressBytes([0; 48]),
            len: 0,
        }
    }
}

impl AddressText {
    #[cfg(test)]
    fn new(address: IpAddr) -> AddressText {
        let mut text = AddressText::default();
        text.write(address);
        text
    }

    /// Write `address` over whatever was written before.
    pub(crate) fn write(&mut self, address: IpAddr) {
        let text = self;
        text.len = 0;
        match address {
            IpAddr::V4(v4) => {
                // Each octet's digits from a table, copied three bytes at a time (the buffer
                // has room past the longest IPv4 form) and then counted by their length.
                let mut end = 0;
                for (index, octet) in v4.octets().into_iter().enumerate() {
                    if index > 0 {
                        text.bytes.0[end] = b'.';
                        end += 1;
                    }
                    let [digits @ .., len] = OCTET_TEXT[usize::from(octet)];
                    text.bytes.0[end..end + 3].copy_from_slice(&digits);
                    end += usize::from(len);
                }
                // At most 15 bytes: the length fits.
                text.len = end as u8;
            }
            IpAddr::V6(v6) => {
                use std::fmt::Write;
                // Writing to the inline buffer fails only past its length, which no address
                // reaches (ADDRESS_TEXT_BYTES_MAX is the longest form).
                let _ = write!(text, "{v6}");
            }
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        // Only ASCII is ever written, so this never falls back, and the text's end is always
        // a character boundary. An IPv4 form fits the first 16 bytes, which are checked in
        // two words; a longer one has the whole buffer checked, a block at a time.
        let written = if self.len <= 16 {
            &self.bytes.0[..16]
        } else {
            &self.bytes.0[..]
        };
        std::str::from_utf8(written)
            .ok()
            .and_then(|all| all.get(..usize::from(self.len)))
            .unwrap_or_default()
    }
}

impl fmt::Write for AddressText {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let start = usize::from(self.len);
        let end = start + text.len();
        let slot = self.bytes.0[..ADDRESS_TEXT_BYTES_MAX]
            .get_mut(start..end)
            .ok_or(fmt::Error)?;
        slot.copy_from_slice(text.as_bytes());
        self.len = u8::try_from(end).map_err(|_| fmt::Error)?;
        Ok(())
    }
}

impl fmt::Debug for AddressText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Identity::Principal(_) => f.write_str("Principal(..)"),
            Identity::Peer(trusted) => f.debug_tuple("Peer").field(trusted).finish(),
        }
    }
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

/// The client's address: the peer, unless the peer is a trusted proxy; then the chain of
/// forwarded addresses is walked from the right (the hop the trusted proxy itself added) to
/// the first address that is not a trusted proxy. Anything left of that was written by the
/// client and is not believed.
pub(crate) fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &TrustedProxies) -> IpAddr {
    let peer = canonical(peer);
    if !trusted.contains(peer) {
        return peer;
    }
    let hops = forwarded_hops(headers);
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

/// The forwarded addresses, client first: from `Forwarded` if present, else `X-Forwarded-For`.
/// `None` marks a hop that is not an address (`unknown`, an obfuscated name, garbage).
fn forwarded_hops(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let mut hops = Vec::new();
    let forwarded = headers.get_all(http::header::FORWARDED);
    if forwarded.iter().next().is_some() {
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
    } else {
        for value in headers.get_all("x-forwarded-for") {
            let Ok(text) = value.to_str() else {
                hops.push(None);
                continue;
            };
            hops.extend(text.split(',').map(|hop| parse_node(hop.trim())));
        }
    }
    // Only the nearest hops matter: they are read from the right.
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
        assert_eq!(
            client_ip(ip("203.0.113.9"), &spoofed, &trusted),
            ip("203.0.113.9")
        );
        let none = TrustedProxies::none();
        assert_eq!(client_ip(ip("10.0.0.1"), &spoofed, &none), ip("10.0.0.1"));
    }

    #[test]
    fn a_trusted_proxy_chain_is_read_from_the_right() {
        let trusted = TrustedProxies::parse(["10.0.0.0/8", "192.0.2.5"]).expect("valid");
        // The client claimed 1.1.1.1; 198.51.100.7 is what our first proxy saw.
        let chain = headers(&[("x-forwarded-for", "1.1.1.1, 198.51.100.7, 192.0.2.5")]);
        assert_eq!(
            client_ip(ip("10.1.2.3"), &chain, &trusted),
            ip("198.51.100.7")
        );
        let forwarded = headers(&[(
            "forwarded",
            r#"for=1.1.1.1, for="[2001:db8::7]:4711";proto=https, for=192.0.2.5:80"#,
        )]);
        assert_eq!(
            client_ip(ip("10.1.2.3"), &forwarded, &trusted),
            ip("2001:db8::7")
        );
        let garbage = headers(&[("x-forwarded-for", "1.1.1.1, nonsense")]);
        assert_eq!(
            client_ip(ip("10.1.2.3"), &garbage, &trusted),
            ip("10.1.2.3")
        );
        let empty = HeaderMap::new();
        assert_eq!(client_ip(ip("10.1.2.3"), &empty, &trusted), ip("10.1.2.3"));
    }

    #[test]
    fn address_keys_are_written_as_display_writes_them() {
        let mut addresses: Vec<IpAddr> = [
            "0.0.0.0",
            "9.10.99.100",
            "127.0.0.1",
            "255.255.255.255",
            "10.200.3.47",
            "::",
            "::1",
            "2001:db8::7",
            "fe80::1:2:3:4",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "::ffff:255.255.255.255",
            "::255.255.255.255",
            "1:0:0:1:0:0:0:1",
        ]
        .iter()
        .map(|text| ip(text))
        .collect();
        // Every octet value, in every position.
        addresses.extend((0..=255u8).map(|o| IpAddr::from([o, 255 - o, o / 3, o.wrapping_mul(7)])));
        for address in &addresses {
            assert_eq!(AddressText::new(*address).as_str(), address.to_string());
        }
        // One buffer written over and over, as a layer's request does: what a longer address
        // left behind never shows.
        let mut reused = AddressText::default();
        for address in addresses.iter().chain(addresses.iter().rev()) {
            reused.write(*address);
            assert_eq!(reused.as_str(), address.to_string());
        }
    }

    /// A `PeerAddr` names the same user as the `SocketAddr` it was made from, for a peer that
    /// is no trusted proxy and for one that is, whichever kind a request carries and in
    /// whatever order the kinds come.
    #[test]
    fn peer_addr_and_socket_addr_name_the_same_user() {
        let peers = ["127.0.0.1", "::ffff:10.1.2.3", "2001:db8::7", "10.9.8.7"];
        let forwarded = headers(&[("x-forwarded-for", "198.51.100.7")]);
        let identities = [
            Identity::Peer(TrustedProxies::none()),
            Identity::Peer(TrustedProxies::parse(["10.0.0.0/8"]).expect("valid")),
        ];
        let peer_addr_first = AtomicBool::new(true);
        for identity in &identities {
            // Kinds alternate, then repeat: the lookup order follows the kind last found.
            for kinds in [[true, false, true, true], [false, false, true, false]] {
                for (peer, by_peer_addr) in peers.iter().zip(kinds) {
                    let socket = SocketAddr::new(ip(peer), 40_000);
                    let mut extensions = http::Extensions::new();
                    if by_peer_addr {
                        extensions.insert(ConnectInfo(PeerAddr::new(socket)));
                    } else {
                        extensions.insert(ConnectInfo(socket));
                    }
                    let mut address = AddressText::default();
                    let user = identity
                        .user_of(
                            &forwarded,
                            &extensions,
                            None,
                            &mut address,
                            &peer_addr_first,
                        )
                        .map(|user| user.key);
                    let expected = client_ip(
                        ip(peer),
                        &forwarded,
                        match identity {
                            Identity::Peer(trusted) => trusted,
                            _ => unreachable!("peer identities only"),
                        },
                    );
                    assert_eq!(
                        user,
                        Some(expected.to_string().as_str()),
                        "{identity:?} {peer} by PeerAddr: {by_peer_addr}"
                    );
                    assert_eq!(peer_addr_first.load(Ordering::Relaxed), by_peer_addr);
                }
            }
        }
        assert_eq!(
            PeerAddr::new(SocketAddr::new(ip("::ffff:10.1.2.3"), 1)).key(),
            "10.1.2.3"
        );
    }

    /// A throttle made for its connection names the user by its own peer, whatever connection
    /// info a request carries, and still looks behind a trusted proxy.
    #[test]
    fn a_connection_s_own_peer_comes_before_the_request_s_connection_info() {
        let own = PeerAddr::new(SocketAddr::new(ip("10.9.8.7"), 40_000));
        let mut extensions = http::Extensions::new();
        extensions.insert(ConnectInfo(SocketAddr::new(ip("192.0.2.1"), 1)));
        extensions.insert(ConnectInfo(PeerAddr::new(SocketAddr::new(
            ip("192.0.2.2"),
            1,
        ))));
        let forwarded = headers(&[("x-forwarded-for", "198.51.100.7")]);
        let peer_addr_first = AtomicBool::new(true);
        let user = |identity: &Identity, extensions: &http::Extensions| {
            let mut address = AddressText::default();
            identity
                .user_of(
                    &forwarded,
                    extensions,
                    Some(&own),
                    &mut address,
                    &peer_addr_first,
                )
                .map(|user| (user.key.to_owned(), user.connection.is_some()))
        };
        let untrusting = Identity::Peer(TrustedProxies::none());
        let expected = Some(("10.9.8.7".to_owned(), true));
        assert_eq!(user(&untrusting, &extensions), expected);
        assert_eq!(user(&untrusting, &http::Extensions::new()), expected);
        let trusting = Identity::Peer(TrustedProxies::parse(["10.0.0.0/8"]).expect("valid"));
        assert_eq!(
            user(&trusting, &extensions),
            Some(("198.51.100.7".to_owned(), false))
        );
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
