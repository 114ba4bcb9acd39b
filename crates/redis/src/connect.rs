//! Connecting: the URL checked, the eviction policy read, the script loaded as a function
//! library (or for `EVALSHA`) and loaded again when Redis lost it, and the wake-up
//! subscription that follows the nodes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::Script;
use tollgate::store::{CounterId, WakeFn};
use tollgate::{Error, Result};

use crate::backend::{Backend, Target};
use crate::batch::{Caller, load_library};
use crate::errors::{store_error, unavailable};
use crate::native::{self, Module};
use crate::store::{RedisStore, RedisStoreConfig};
use crate::{abi, eviction, keys};

impl RedisStore {
    /// Connect, load the script, and subscribe to the namespace's wake-ups; the Redis module
    /// asked for its version and used as `config.module` says (`native.rs`).
    pub async fn connect(config: RedisStoreConfig) -> Result<RedisStore> {
        RedisStore::connect_expecting(config, abi::PROTOCOL_VERSION).await
    }

    /// `connect`, the module expected to speak `version` (for tests of a mismatch).
    #[doc(hidden)]
    pub async fn connect_expecting(config: RedisStoreConfig, version: u64) -> Result<RedisStore> {
        let module = config.module;
        keys::check_namespace(&config.namespace).map_err(|reason| Error::InvalidRequest {
            field: "namespace",
            reason,
        })?;
        let target = Target::parse(&config.url).map_err(|reason| Error::InvalidRequest {
            field: "store",
            reason,
        })?;
        let backend =
            tokio::time::timeout(config.timeout, Backend::connect(&target, config.timeout))
                .await
                .map_err(|_| unavailable("timed out connecting to Redis"))?
                .map_err(|error| match error.kind() {
                    redis::ErrorKind::InvalidClientConfig => Error::InvalidRequest {
                        field: "store",
                        reason: format!("not a usable Redis URL: {error}"),
                    },
                    _ => store_error(error),
                })?;
        let policies = eviction::policies(&backend).await.map_err(store_error)?;
        let evicting = eviction::evicting(&policies);
        if !evicting.is_empty() {
            if !config.allow_eviction {
                return Err(Error::InvalidRequest {
                    field: "store",
                    reason: eviction::refusal(&evicting),
                });
            }
            tracing::warn!(
                policy = %evicting.join(", "),
                "Redis may evict Tollgate's keys (allowed by redis_allow_eviction): every call \
                 watches evictions, and a counter missing after one is held for a period"
            );
        }
        let script = Script::new(abi::script());
        let name = format!("tollgate_{}", &script.get_hash()[..16]);
        let library = format!(
            "#!lua name={name}\n{}",
            abi::script().replace("__TOLLGATE_FUNCTION__", &name)
        );
        let function = match load_library(&backend, &library).await {
            Ok(()) => Some((name, library)),
            Err(error) => {
                tracing::debug!(%error, "FUNCTION LOAD refused; deciding by EVALSHA");
                backend
                    .query(redis::cmd("SCRIPT").arg("LOAD").arg(abi::script()))
                    .await
                    .map_err(store_error)?;
                None
            }
        };
        let using_module = if module == Module::Off {
            false
        } else {
            let loaded = native::probe(&backend, version).await?;
            native::choose(module, &loaded, version).map_err(|reason| Error::InvalidRequest {
                field: "module",
                reason,
            })?
        };
        tracing::info!(
            setting = %module,
            "operations decided by the {}",
            if using_module {
                "Redis module"
            } else {
                "function library"
            }
        );
        let keys = keys::Keys::new(&config.namespace, target.is_cluster());
        let backend = Arc::new(backend);
        let wake: Arc<Mutex<Option<WakeFn>>> = Arc::new(Mutex::new(None));
        let lessons: Arc<Mutex<Option<crate::store::LessonFn>>> = Arc::new(Mutex::new(None));
        let subscriber = tokio::spawn(subscribe(
            backend.clone(),
            target.clone(),
            keys.clone(),
            wake.clone(),
            lessons.clone(),
        ));
        let caller = Arc::new(Caller::new(
            backend,
            script,
            function,
            !evicting.is_empty(),
            config.timeout,
            config.namespace.clone(),
            (module, using_module, version),
        ));
        Ok(RedisStore {
            caller,
            target,
            keys,
            config,
            place_ttl_us: crate::store::PLACE_TTL_US,
            wake,
            lessons,
            subscriber: Some(subscriber),
            limits: Mutex::new(std::collections::HashMap::new()),
            admitting: Mutex::new(std::collections::HashMap::new()),
        })
    }
}

/// Listen on the wake channel, reconnecting with a capped backoff (to another node of a
/// cluster, or to the master the Sentinels name now), and pass every counter whose capacity
/// came back to the limiter's wake-up.
async fn subscribe(
    backend: Arc<Backend>,
    target: Target,
    keys: keys::Keys,
    wake: Arc<Mutex<Option<WakeFn>>>,
    lessons: Arc<Mutex<Option<crate::store::LessonFn>>>,
) {
    let mut backoff = Duration::from_millis(50);
    let mut attempt = 0;
    loop {
        let client = backend.subscription_client(&target, attempt).await;
        attempt += 1;
        match client {
            Ok(client) => match client.get_async_pubsub().await {
                Ok(mut pubsub) => {
                    if pubsub
                        .subscribe(&[keys.wake_channel(), keys.learn_channel()])
                        .await
                        .is_ok()
                    {
                        backoff = Duration::from_millis(50);
                        let mut messages = pubsub.on_message();
                        while let Some(message) = messages.next().await {
                            let payload: Vec<u8> = message.get_payload_bytes().to_vec();
                            let Ok(text) = String::from_utf8(payload) else {
                                continue;
                            };
                            if message.get_channel_name() == keys.learn_channel() {
                                let handler = lessons.lock().ok().and_then(|slot| slot.clone());
                                if let Some(handler) = handler {
                                    handler(&text);
                                }
                                continue;
                            }
                            if let Some((limit, key)) = keys.parse_counter(&text) {
                                let handler = wake.lock().ok().and_then(|slot| slot.clone());
                                if let Some(handler) = handler {
                                    handler(CounterId {
                                        limit: &limit,
                                        key: key.as_deref(),
                                    });
                                }
                            }
                        }
                    }
                }
                Err(error) => tracing::debug!(%error, "wake-up subscription failed; retrying"),
            },
            Err(error) => tracing::debug!(%error, "wake-up subscription failed; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
