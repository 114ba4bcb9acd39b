//! The Redis key schema, and which Redis Cluster slot each key lands on.
//!
//! Every key is `tg:{<tag>}:<namespace>:...`. The tag is the only text Redis Cluster hashes, and
//! no caller writes it: a counter's slot is the CRC16 of its namespace, limit and key (each
//! length-prefixed), and its tag is a short fixed string that hashes to that slot (`SLOT_TAGS`).
//! So the counters of one limit spread over every slot by key, while the keys of one counter
//! (its state, its logs) and its slot's generation share a slot, and one script may touch them
//! together. Limit names and user keys follow the namespace, each prefixed by its length, so no
//! text a caller supplies can reach into another counter's key or choose a slot.

use std::sync::OnceLock;

use tollgate::store::CounterId;

/// Longest namespace, in bytes.
pub const NAMESPACE_BYTES_MAX: usize = 64;

/// Redis Cluster's slots.
pub(crate) const SLOTS: u16 = 16384;

/// Why `namespace` is not usable, if it is not.
pub fn check_namespace(namespace: &str) -> Result<(), String> {
    if namespace.is_empty() || namespace.len() > NAMESPACE_BYTES_MAX {
        return Err(format!("must be 1 to {NAMESPACE_BYTES_MAX} bytes"));
    }
    if !namespace
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        return Err("must be lower-case letters, digits, '_' or '-'".into());
    }
    Ok(())
}

/// The slot Redis Cluster gives a hash tag.
pub(crate) fn slot_of(tag: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag) % SLOTS
}

/// For each slot, the smallest number whose decimal text hashes to it: the tag of that slot's
/// keys. Made once per process (about 160,000 CRCs); the same on every machine.
fn slot_tags() -> &'static [u32] {
    static TAGS: OnceLock<Vec<u32>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; usize::from(SLOTS)];
        let mut missing = tags.len();
        let mut number = 0u32;
        while missing > 0 {
            let slot = usize::from(slot_of(number.to_string().as_bytes()));
            if tags[slot] == u32::MAX {
                tags[slot] = number;
                missing -= 1;
            }
            number += 1;
        }
        tags
    })
}

/// The evictions record of the slot whose generation is `generation`: the same key with
/// `evicted` for `gen`, so the same hash tag and slot (`lua/loss.lua`, `T.evictions`).
pub(crate) fn evictions_beside(generation: &str) -> String {
    let stem = generation.strip_suffix("gen").unwrap_or(generation);
    format!("{stem}evicted")
}

#[derive(Clone, Debug)]
pub(crate) struct Keys {
    namespace: String,
    /// One generation per slot (a cluster, where each master can lose its slots alone), or one
    /// for the namespace (one Redis, lost or kept whole).
    per_slot_generation: bool,
    wake_channel: String,
    learn_channel: String,
}

impl Keys {
    pub(crate) fn new(namespace: &str, per_slot_generation: bool) -> Keys {
        Keys {
            namespace: namespace.to_owned(),
            per_slot_generation,
            wake_channel: format!("tg:{namespace}:wake"),
            learn_channel: format!("tg:{namespace}:learn"),
        }
    }

    pub(crate) fn wake_channel(&self) -> &str {
        &self.wake_channel
    }

    /// Where the processes of a namespace tell each other what a vendor taught (opaque text).
    pub(crate) fn learn_channel(&self) -> &str {
        &self.learn_channel
    }

    /// The slot of `counter`'s keys.
    pub(crate) fn counter_slot(&self, counter: CounterId<'_>) -> u16 {
        let mut text = String::with_capacity(self.namespace.len() + 24 + counter.limit.len());
        push_field(&mut text, &self.namespace);
        push_field(&mut text, counter.limit);
        if let Some(key) = counter.key {
            push_field(&mut text, key);
        }
        slot_of(text.as_bytes())
    }

    /// The slot of `limit`'s pause: that of its counter without a key.
    pub(crate) fn pause_slot(&self, limit: &str) -> u16 {
        self.counter_slot(CounterId { limit, key: None })
    }

    /// `tg:{<tag>}:<namespace>:`, the start of every key in `slot`.
    fn prefix(&self, slot: u16, extra: usize) -> String {
        let mut key = String::with_capacity(self.namespace.len() + 16 + extra);
        key.push_str("tg:{");
        key.push_str(&slot_tags()[usize::from(slot)].to_string());
        key.push_str("}:");
        key.push_str(&self.namespace);
        key.push(':');
        key
    }

    /// The generation that guards the counters of `slot`.
    pub(crate) fn generation(&self, slot: u16) -> String {
        if self.per_slot_generation {
            let mut key = self.prefix(slot, 3);
            key.push_str("gen");
            key
        } else {
            format!("tg:{{{0}}}:{0}:gen", self.namespace)
        }
    }

    /// `tg:{<tag>}:<ns>:<kind>:<len>:<limit>[:<len>:<key>]`: `kind` `c` the counter's state,
    /// `r` its open reservations, `q` its older sliding buckets, `w` its queue of waiters.
    fn counter_part(&self, kind: char, slot: u16, counter: CounterId<'_>) -> String {
        let extra = 16 + counter.limit.len() + counter.key.map_or(0, |key| key.len() + 8);
        let mut key = self.prefix(slot, extra);
        key.push(kind);
        key.push(':');
        push_field(&mut key, counter.limit);
        if let Some(user_key) = counter.key {
            key.push(':');
            push_field(&mut key, user_key);
        }
        key
    }

    /// A counter's three keys: its state, its open reservations and its older sliding buckets.
    pub(crate) fn counter_keys(
        &self,
        slot: u16,
        counter: CounterId<'_>,
    ) -> [String; crate::abi::KEYS_PER_COUNTER] {
        [
            self.counter_part('c', slot, counter),
            self.counter_part('r', slot, counter),
            self.counter_part('q', slot, counter),
        ]
    }

    /// `counter`'s queue of waiters across the fleet (`tollgate_redis_protocol::queue`), in
    /// its slot: `w` beside its other keys.
    pub(crate) fn counter_queue(&self, slot: u16, counter: CounterId<'_>) -> String {
        self.counter_part('w', slot, counter)
    }

    /// The key that holds `counter`'s state.
    pub(crate) fn counter(&self, counter: CounterId<'_>) -> String {
        self.counter_part('c', self.counter_slot(counter), counter)
    }

    /// `tg:{<tag>}:<ns>:p:<len>:<limit>`: the limit-wide pause, in `limit`'s own slot.
    pub(crate) fn limit_pause(&self, limit: &str) -> String {
        let mut key = self.prefix(self.pause_slot(limit), 16 + limit.len());
        key.push_str("p:");
        push_field(&mut key, limit);
        key
    }

    /// `tg:{<tag>}:<ns>:k:<len>:<limit>`: the limit's key budget (`tally.rs`), in `limit`'s own
    /// slot, beside its pause.
    pub(crate) fn limit_tally(&self, limit: &str) -> String {
        let mut key = self.prefix(self.pause_slot(limit), 16 + limit.len());
        key.push_str("k:");
        push_field(&mut key, limit);
        key
    }

    /// The counter a key names, if it is one of this namespace's counter keys.
    pub(crate) fn parse_counter(&self, key: &str) -> Option<(String, Option<String>)> {
        let rest = key.strip_prefix("tg:{")?;
        let (_, rest) = rest.split_once("}:")?;
        let rest = rest
            .strip_prefix(self.namespace.as_str())?
            .strip_prefix(":c:")?;
        let (limit, rest) = take_field(rest)?;
        if rest.is_empty() {
            return Some((limit.to_owned(), None));
        }
        let (user_key, rest) = take_field(rest.strip_prefix(':')?)?;
        rest.is_empty()
            .then(|| (limit.to_owned(), Some(user_key.to_owned())))
    }
}

fn push_field(key: &mut String, text: &str) {
    key.push_str(&text.len().to_string());
    key.push(':');
    key.push_str(text);
}

fn take_field(text: &str) -> Option<(&str, &str)> {
    let (length, rest) = text.split_once(':')?;
    let length: usize = length.parse().ok()?;
    if rest.len() < length || !rest.is_char_boundary(length) {
        return None;
    }
    Some(rest.split_at(length))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tag Redis Cluster hashes: between the first `{` and the first `}` after it.
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').expect("tag");
        let close = key[open..].find('}').expect("tag end") + open;
        &key[open + 1..close]
    }

    #[test]
    fn a_slots_evictions_record_shares_its_generations_slot() {
        for per_slot in [false, true] {
            let keys = Keys::new("ns", per_slot);
            let generation = keys.generation(1234);
            let record = evictions_beside(&generation);
            assert_ne!(record, generation);
            assert!(record.ends_with(":evicted"), "{record}");
            assert_eq!(hash_tag(&record), hash_tag(&generation));
        }
    }

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        let tags = slot_tags();
        assert_eq!(tags.len(), usize::from(SLOTS));
        for (slot, tag) in tags.iter().enumerate() {
            assert_eq!(usize::from(slot_of(tag.to_string().as_bytes())), slot);
        }
        // Redis's own figures (CLUSTER KEYSLOT).
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"123456789"), 0x31C3 % SLOTS);
    }

    #[test]
    fn user_text_never_reaches_the_hash_tag_or_another_counter() {
        let keys = Keys::new("prod", true);
        let counter = CounterId {
            limit: "a",
            key: Some("b:1:c"),
        };
        let slot = keys.counter_slot(counter);
        let [state, reservations, buckets] = keys.counter_keys(slot, counter);
        let tag = hash_tag(&state).to_owned();
        assert_eq!(state, format!("tg:{{{tag}}}:prod:c:1:a:5:b:1:c"));
        assert_eq!(reservations, format!("tg:{{{tag}}}:prod:r:1:a:5:b:1:c"));
        assert_eq!(buckets, format!("tg:{{{tag}}}:prod:q:1:a:5:b:1:c"));
        assert_eq!(keys.counter(counter), state);
        // The counter's keys, and its slot's generation, share one slot.
        for key in [&reservations, &buckets, &keys.generation(slot)] {
            assert_eq!(slot_of(hash_tag(key).as_bytes()), slot);
        }
        // A key with braces or the look of another counter's tail stays inside its own field.
        let forged = keys.counter(CounterId {
            limit: "a",
            key: Some("}{0}:prod:c:1:x"),
        });
        assert!(hash_tag(&forged).bytes().all(|b| b.is_ascii_digit()));
        assert_ne!(
            forged,
            keys.counter(CounterId {
                limit: "x",
                key: None
            })
        );
        assert_eq!(
            keys.parse_counter(&state),
            Some(("a".to_owned(), Some("b:1:c".to_owned())))
        );
        assert_eq!(
            keys.parse_counter(&forged),
            Some(("a".to_owned(), Some("}{0}:prod:c:1:x".to_owned())))
        );
        let unkeyed = keys.counter(CounterId {
            limit: "abc",
            key: None,
        });
        assert_eq!(keys.parse_counter(&unkeyed), Some(("abc".to_owned(), None)));
        assert_eq!(keys.parse_counter("tg:{1}:prod:c:9:abc"), None);
        assert_eq!(keys.parse_counter("tg:{1}:other:c:3:abc"), None);
        // A limit's pause and its key budget share the slot of its counter without a key.
        for key in [keys.limit_pause("abc"), keys.limit_tally("abc")] {
            assert_eq!(
                slot_of(hash_tag(&key).as_bytes()),
                keys.counter_slot(CounterId {
                    limit: "abc",
                    key: None
                })
            );
            assert_eq!(keys.parse_counter(&key), None);
        }
    }

    #[test]
    fn the_keys_of_one_limit_spread_over_the_slots() {
        let keys = Keys::new("prod", true);
        let mut slots = std::collections::HashSet::new();
        for user in 0..1000 {
            let user = user.to_string();
            slots.insert(keys.counter_slot(CounterId {
                limit: "per-user",
                key: Some(&user),
            }));
        }
        // 1,000 keys over 16,384 slots: nearly all distinct.
        assert!(slots.len() > 950, "{}", slots.len());
        // One Redis: one generation for the namespace.
        let single = Keys::new("prod", false);
        assert_eq!(single.generation(1), single.generation(9000));
        assert_ne!(keys.generation(1), keys.generation(9000));
    }

    #[test]
    fn namespaces_are_checked() {
        assert!(check_namespace("tollgate").is_ok());
        assert!(check_namespace("").is_err());
        assert!(check_namespace("a{b}").is_err());
        assert!(check_namespace(&"a".repeat(65)).is_err());
    }
}
