//! Whether Redis may evict Tollgate's keys: its `maxmemory-policy`, read from every master, and
//! what the store makes of it. Every key Tollgate writes has a TTL (so no counter outlives its
//! use), so `volatile-*` policies can evict them as surely as `allkeys-*`: only `noeviction` is
//! safe. A store that allows eviction watches Redis's `evicted_keys` on every call instead
//! (`lua/loss.lua`, `T.evictions`), and holds a counter found missing after an eviction.

use redis::Value;

use crate::backend::Backend;

/// The one policy under which Redis never evicts a key.
pub(crate) const SAFE_POLICY: &str = "noeviction";

/// The policy of each master that answered (its address on a cluster, empty on one Redis).
pub(crate) async fn policies(backend: &Backend) -> redis::RedisResult<Vec<(String, String)>> {
    // `INFO memory` first: managed Redis services that refuse CONFIG still answer it.
    let info = backend.query(redis::cmd("INFO").arg("memory")).await?;
    let mut found = Vec::new();
    let mut missing = false;
    for (node, text) in texts(info) {
        match field(&text, "maxmemory_policy") {
            Some(policy) => found.push((node, policy)),
            None => missing = true,
        }
    }
    if missing || found.is_empty() {
        // An INFO without the field (an old or trimmed Redis): ask CONFIG GET (on a cluster,
        // one node answers it).
        let value = backend
            .query(redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy"))
            .await?;
        if let Some(policy) = config_value(value) {
            found.push((String::new(), policy));
        }
    }
    Ok(found)
}

/// The masters among `policies` whose policy may evict, as `node policy` (or `policy`).
pub(crate) fn evicting(policies: &[(String, String)]) -> Vec<String> {
    policies
        .iter()
        .filter(|(_, policy)| policy != SAFE_POLICY)
        .map(|(node, policy)| {
            if node.is_empty() {
                policy.clone()
            } else {
                format!("{policy} on {node}")
            }
        })
        .collect()
}

/// Why a Redis whose policy may evict is refused, and the two ways out.
pub(crate) fn refusal(evicting: &[String]) -> String {
    format!(
        "Redis maxmemory-policy is {}, which can evict Tollgate's keys (each has a TTL, so \
         volatile-* policies evict them too) and so forget what a counter granted; run \
         `CONFIG SET maxmemory-policy noeviction` (and make it the configured policy), or allow \
         eviction with redis_allow_eviction = true (TOLLGATE_REDIS_ALLOW_EVICTION, \
         --redis-allow-eviction), under which a counter missing after an eviction is held for \
         one period",
        evicting.join(", ")
    )
}

/// `INFO`'s text per node: one Redis answers a string, a cluster a map of node to string.
fn texts(value: Value) -> Vec<(String, String)> {
    match value {
        Value::Map(nodes) => nodes
            .into_iter()
            .filter_map(|(node, text)| Some((text_of(node)?, text_of(text)?)))
            .collect(),
        other => text_of(other)
            .map(|text| vec![(String::new(), text)])
            .unwrap_or_default(),
    }
}

fn text_of(value: Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
        Value::SimpleString(text) => Some(text),
        Value::VerbatimString { text, .. } => Some(text),
        _ => None,
    }
}

/// One `name:value` line of an INFO text.
fn field(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then(|| value.trim().to_owned())
    })
}

/// The value of a one-parameter `CONFIG GET`: `[name, value]`, or a map.
fn config_value(value: Value) -> Option<String> {
    match value {
        Value::Array(items) => items.into_iter().nth(1).and_then(text_of),
        Value::Map(pairs) => pairs
            .into_iter()
            .next()
            .and_then(|(_, value)| text_of(value)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_is_read_from_info_of_one_redis_or_every_master() {
        let one = Value::BulkString(
            b"# Memory\r\nused_memory:1\r\nmaxmemory_policy:noeviction\r\n".to_vec(),
        );
        let found: Vec<_> = texts(one)
            .into_iter()
            .map(|(node, text)| (node, field(&text, "maxmemory_policy")))
            .collect();
        assert_eq!(found, vec![(String::new(), Some("noeviction".to_owned()))]);
        let cluster = Value::Map(vec![
            (
                Value::BulkString(b"10.0.0.1:7000".to_vec()),
                Value::BulkString(b"maxmemory_policy:noeviction\r\n".to_vec()),
            ),
            (
                Value::BulkString(b"10.0.0.2:7000".to_vec()),
                Value::BulkString(b"maxmemory_policy:volatile-lru\r\n".to_vec()),
            ),
        ]);
        let policies: Vec<_> = texts(cluster)
            .into_iter()
            .filter_map(|(node, text)| Some((node, field(&text, "maxmemory_policy")?)))
            .collect();
        assert_eq!(evicting(&policies), vec!["volatile-lru on 10.0.0.2:7000"]);
        let message = refusal(&evicting(&policies));
        for says in [
            "volatile-lru",
            "CONFIG SET maxmemory-policy noeviction",
            "redis_allow_eviction",
        ] {
            assert!(message.contains(says), "{message}");
        }
        let config = Value::Array(vec![
            Value::BulkString(b"maxmemory-policy".to_vec()),
            Value::BulkString(b"allkeys-lru".to_vec()),
        ]);
        assert_eq!(config_value(config), Some("allkeys-lru".to_owned()));
    }
}
