//! Which clients of one network have keys of their own on `/v1/forward-auth`.
//!
//! A client counted by address is its IPv4 address or its IPv6 prefix (a /64 by default), and
//! each such key takes a place in every limit's key budget (`keys_per_limit_max`, 100,000 by
//! default). One IPv6 /48 holds 65,536 /64s: two would fill a limit's budget, and every new
//! client of that limit would then be refused until the flood's counters expire. So each
//! network (an IPv4 /24, an IPv6 /48) has at most `forward_auth_network_keys_max` clients
//! with keys of their own at once; its further clients share the network's one key
//! (`2001:db8:1::/48`, `198.51.100.0/24`), and a flood from one network spends that network's
//! budget, not everyone's.
//!
//! A client keeps its place for as long as its counters can live in the store: the longest
//! window (or lease TTL) of the limits it was counted under, from its last request. Places
//! are kept for at most `keys_tracked_max` clients over every network, the store's own cap;
//! past it, a new client shares its network's key until places come free.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The network of an IPv4 client, in bits: a /24, the smallest block routed between networks.
pub(crate) const IPV4_NETWORK_LEN: u8 = 24;
/// The network of an IPv6 client, in bits: a /48, what one site is given (RFC 6177).
pub(crate) const IPV6_NETWORK_LEN: u8 = 48;
/// Places are swept of expired clients at most this often when every place is taken, so that
/// a flood of new clients cannot make every request walk them all.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct NetworkKeys {
    /// Clients of one network with keys of their own at once.
    per_network: usize,
    /// Clients with places, over every network.
    tracked_max: usize,
    /// Bits of an IPv6 address that name one client.
    ipv6_client_len: u8,
    places: Mutex<Places>,
}

#[derive(Debug, Default)]
struct Places {
    /// By network (IPv4 networks as IPv4-mapped IPv6 numbers), each client's place until then.
    networks: HashMap<u128, HashMap<u128, Instant>>,
    total: usize,
    swept_at: Option<Instant>,
}

impl NetworkKeys {
    pub(crate) fn new(per_network: u32, tracked_max: u64, ipv6_client_len: u8) -> NetworkKeys {
        NetworkKeys {
            per_network: usize::try_from(per_network).unwrap_or(usize::MAX).max(1),
            tracked_max: usize::try_from(tracked_max).unwrap_or(usize::MAX).max(1),
            ipv6_client_len,
            places: Mutex::new(Places::default()),
        }
    }

    /// The key the client at `address` (canonical) shares with its network, or `None` when it
    /// keeps its own: it has a place, or one is free, which it then holds until `keep_for`
    /// after `now`.
    pub(crate) fn shared_key(
        &self,
        address: IpAddr,
        keep_for: Duration,
        now: Instant,
    ) -> Option<String> {
        let (network, client) = match address {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4);
                let network = bits & (u32::MAX << (32 - IPV4_NETWORK_LEN));
                (
                    u128::from(Ipv4Addr::from(network).to_ipv6_mapped()),
                    u128::from(bits),
                )
            }
            IpAddr::V6(v6) => {
                // A client as wide as its network or wider is a network of its own.
                if self.ipv6_client_len <= IPV6_NETWORK_LEN {
                    return None;
                }
                let bits = u128::from(v6);
                let client = bits & (u128::MAX << (128 - u32::from(self.ipv6_client_len)));
                (bits & (u128::MAX << (128 - IPV6_NETWORK_LEN)), client)
            }
        };
        let until = now + keep_for;
        // A panic elsewhere leaves the places consistent: each change is one step.
        let mut places = self.places.lock().unwrap_or_else(PoisonError::into_inner);
        let Places {
            networks,
            total,
            swept_at,
        } = &mut *places;
        if let Some(held) = networks
            .get_mut(&network)
            .and_then(|clients| clients.get_mut(&client))
        {
            *held = (*held).max(until);
            return None;
        }
        if *total >= self.tracked_max && swept_at.is_none_or(|at| now >= at + SWEEP_INTERVAL) {
            *swept_at = Some(now);
            networks.retain(|_, clients| {
                let before = clients.len();
                clients.retain(|_, held| *held > now);
                *total -= before - clients.len();
                !clients.is_empty()
            });
        }
        let clients = match networks.entry(network) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => {
                if *total >= self.tracked_max {
                    return Some(network_key(address));
                }
                entry.insert(HashMap::new())
            }
        };
        if clients.len() >= self.per_network {
            let before = clients.len();
            clients.retain(|_, held| *held > now);
            *total -= before - clients.len();
        }
        if clients.len() >= self.per_network || *total >= self.tracked_max {
            return Some(network_key(address));
        }
        clients.insert(client, until);
        *total += 1;
        None
    }
}

/// The key a network's clients share: `198.51.100.0/24`, `2001:db8:1::/48`. Never a client's
/// own key: an IPv4 client's has no `/`, an IPv6 client's is longer than /48.
fn network_key(address: IpAddr) -> String {
    match address {
        IpAddr::V4(v4) => {
            let network = u32::from(v4) & (u32::MAX << (32 - IPV4_NETWORK_LEN));
            format!("{}/{IPV4_NETWORK_LEN}", Ipv4Addr::from(network))
        }
        IpAddr::V6(v6) => {
            let network = u128::from(v6) & (u128::MAX << (128 - IPV6_NETWORK_LEN));
            format!("{}/{IPV6_NETWORK_LEN}", Ipv6Addr::from(network))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn a_network_past_its_cap_shares_one_key_and_others_keep_theirs() {
        let keys = NetworkKeys::new(2, 100, 64);
        let now = Instant::now();
        let hour = Duration::from_secs(3600);
        assert_eq!(keys.shared_key(ip("2001:db8:1:1::1"), hour, now), None);
        assert_eq!(keys.shared_key(ip("2001:db8:1:2::1"), hour, now), None);
        // The same /64 keeps its place.
        assert_eq!(keys.shared_key(ip("2001:db8:1:1::9"), hour, now), None);
        assert_eq!(
            keys.shared_key(ip("2001:db8:1:3::1"), hour, now).as_deref(),
            Some("2001:db8:1::/48")
        );
        assert_eq!(keys.shared_key(ip("2001:db8:2:1::1"), hour, now), None);
        assert_eq!(keys.shared_key(ip("198.51.100.1"), hour, now), None);
        assert_eq!(keys.shared_key(ip("198.51.100.2"), hour, now), None);
        assert_eq!(
            keys.shared_key(ip("198.51.100.3"), hour, now).as_deref(),
            Some("198.51.100.0/24")
        );
        // Once a place has expired, a new client takes it.
        let later = now + hour + Duration::from_secs(1);
        assert_eq!(keys.shared_key(ip("2001:db8:1:3::1"), hour, later), None);
    }

    #[test]
    fn past_the_places_over_every_network_new_clients_share_their_networks_key() {
        let keys = NetworkKeys::new(10, 2, 64);
        let now = Instant::now();
        let minute = Duration::from_secs(60);
        assert_eq!(keys.shared_key(ip("192.0.2.1"), minute, now), None);
        assert_eq!(keys.shared_key(ip("198.51.100.1"), minute, now), None);
        assert_eq!(
            keys.shared_key(ip("203.0.113.1"), minute, now).as_deref(),
            Some("203.0.113.0/24")
        );
        // A client as wide as its network is never capped.
        let wide = NetworkKeys::new(1, 1, 48);
        assert_eq!(wide.shared_key(ip("2001:db8:1::1"), minute, now), None);
        assert_eq!(wide.shared_key(ip("2001:db8:2::1"), minute, now), None);
    }
}
