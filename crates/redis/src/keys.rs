//! The Redis key schema. Every key starts with `tg:{<namespace>}:`; the braces make the
//! namespace the Redis Cluster hash tag, so all keys of a namespace share a slot and one script
//! may touch any of them. Limit names and user keys follow outside the braces, each prefixed by
//! its length, so no text a caller supplies can reach into another counter's key or the tag.

/// Longest namespace, in bytes.
pub const NAMESPACE_BYTES_MAX: usize = 64;

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

#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
    generation: String,
    wake_channel: String,
}

impl Keys {
    pub(crate) fn new(namespace: &str) -> Keys {
        let prefix = format!("tg:{{{namespace}}}:");
        Keys {
            generation: format!("{prefix}gen"),
            wake_channel: format!("{prefix}wake"),
            prefix,
        }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn generation(&self) -> &str {
        &self.generation
    }

    pub(crate) fn wake_channel(&self) -> &str {
        &self.wake_channel
    }

    /// `tg:{ns}:c:<len>:<limit>` or `tg:{ns}:c:<len>:<limit>:<len>:<key>`.
    pub(crate) fn counter(&self, counter: tollgate::store::CounterId<'_>) -> String {
        let mut key = String::with_capacity(self.prefix.len() + 16 + counter.limit.len());
        key.push_str(&self.prefix);
        key.push_str("c:");
        push_field(&mut key, counter.limit);
        if let Some(user_key) = counter.key {
            key.push(':');
            push_field(&mut key, user_key);
        }
        key
    }

    /// `tg:{ns}:r:...`: the open reservations of the counter `counter` names (same fields).
    pub(crate) fn reservations(&self, counter: tollgate::store::CounterId<'_>) -> String {
        let mut key = self.counter(counter);
        // "c:" becomes "r:" right after the prefix.
        key.replace_range(self.prefix.len()..self.prefix.len() + 1, "r");
        key
    }

    /// `tg:{ns}:q:...`: the older sliding buckets of the counter `counter` names (same fields).
    pub(crate) fn buckets(&self, counter: tollgate::store::CounterId<'_>) -> String {
        let mut key = self.counter(counter);
        key.replace_range(self.prefix.len()..self.prefix.len() + 1, "q");
        key
    }

    /// `tg:{ns}:p:<len>:<limit>`: the limit-wide pause.
    pub(crate) fn limit_pause(&self, limit: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + 16 + limit.len());
        key.push_str(&self.prefix);
        key.push_str("p:");
        push_field(&mut key, limit);
        key
    }

    /// The counter a key names, if it is one of this namespace's counter keys.
    pub(crate) fn parse_counter(&self, key: &str) -> Option<(String, Option<String>)> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix("c:")?;
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
    use tollgate::store::CounterId;

    #[test]
    fn user_text_never_reaches_the_hash_tag_or_another_counter() {
        let keys = Keys::new("prod");
        let plain = keys.counter(CounterId {
            limit: "a",
            key: Some("b:1:c"),
        });
        assert_eq!(plain, "tg:{prod}:c:1:a:5:b:1:c");
        let reservations = keys.reservations(CounterId {
            limit: "a",
            key: Some("b:1:c"),
        });
        assert_eq!(reservations, "tg:{prod}:r:1:a:5:b:1:c");
        let buckets = keys.buckets(CounterId {
            limit: "a",
            key: Some("b:1:c"),
        });
        assert_eq!(buckets, "tg:{prod}:q:1:a:5:b:1:c");
        // A key that looks like the tail of another limit's key stays a different key.
        let forged = keys.counter(CounterId {
            limit: "a",
            key: Some("}:c:1:x"),
        });
        assert!(forged.starts_with("tg:{prod}:c:1:a:"));
        assert_ne!(
            forged,
            keys.counter(CounterId {
                limit: "x",
                key: None
            })
        );
        for key in [plain, forged] {
            // The first '{' and the first '}' after it delimit the tag: always the namespace.
            let open = key.find('{').expect("tag");
            let close = key[open..].find('}').expect("tag end") + open;
            assert_eq!(&key[open + 1..close], "prod");
        }
        assert_eq!(
            keys.parse_counter("tg:{prod}:c:1:a:5:b:1:c"),
            Some(("a".to_owned(), Some("b:1:c".to_owned())))
        );
        assert_eq!(
            keys.parse_counter("tg:{prod}:c:3:abc"),
            Some(("abc".to_owned(), None))
        );
        assert_eq!(keys.parse_counter("tg:{prod}:c:9:abc"), None);
        assert_eq!(keys.parse_counter("tg:{other}:c:3:abc"), None);
    }

    #[test]
    fn namespaces_are_checked() {
        assert!(check_namespace("tollgate").is_ok());
        assert!(check_namespace("").is_err());
        assert!(check_namespace("a{b}").is_err());
        assert!(check_namespace(&"a".repeat(65)).is_err());
    }
}
