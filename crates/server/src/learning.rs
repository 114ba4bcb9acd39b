//! What vendors teach, shared between the replicas of a server on one Redis namespace: each
//! lesson a replica takes (`POST /v1/learn`) and each margin a reported delay widens is
//! published on the namespace's channel, and every other replica puts it in force on its own
//! limiter. The memory store has one server, which needs nothing of this. Pauses go through the
//! store itself and are shared already.
//!
//! Best effort by design: a replica not subscribed at the moment (starting, reconnecting) does
//! not hear a lesson, and learns it again from its own callers, who teach again within a minute
//! (`docs/outbound.md`).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate::store::Store;
use tollgate::{AdvertisedQuota, Lesson, Limiter};
use tollgate_redis::RedisStore;

/// What one replica tells the others.
#[derive(Debug, Serialize, Deserialize)]
struct Message {
    /// The replica that took it, which does not take it twice.
    origin: u64,
    limit: String,
    #[serde(default)]
    lesson: Option<Taught>,
    /// A grant-to-send delay that widened the limit's margin here, in microseconds.
    #[serde(default)]
    delay_us: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Taught {
    source: String,
    /// Each quota and its window in microseconds.
    quotas: Vec<(u64, Option<u64>)>,
    rate_limited: bool,
}

/// The replica's side of sharing: nothing on a store that is not Redis.
#[derive(Clone, Debug)]
pub(crate) struct SharedLearning {
    store: Option<Arc<dyn Store>>,
    origin: u64,
}

fn redis(store: &Arc<dyn Store>) -> Option<&RedisStore> {
    let any: &dyn std::any::Any = &**store;
    any.downcast_ref::<RedisStore>()
}

impl SharedLearning {
    /// No sharing: a server alone on its store.
    pub(crate) fn none() -> SharedLearning {
        SharedLearning {
            store: None,
            origin: 0,
        }
    }

    /// Share through `store` if it is Redis, putting what other replicas publish in force on
    /// `limiter`.
    pub(crate) fn start(store: &Arc<dyn Store>, limiter: &Limiter) -> SharedLearning {
        // Random per replica: only told apart from the others' on one namespace.
        let origin = {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        };
        let Some(redis) = redis(store) else {
            return SharedLearning {
                store: None,
                origin,
            };
        };
        let limiter = limiter.clone();
        redis.on_lesson(Arc::new(move |text: &str| {
            let Ok(message) = serde_json::from_str::<Message>(text) else {
                tracing::debug!("an unreadable lesson on the namespace's channel");
                return;
            };
            if message.origin == origin {
                return;
            }
            apply(&limiter, &message);
        }));
        SharedLearning {
            store: Some(store.clone()),
            origin,
        }
    }

    /// Tell the other replicas of a lesson this one took.
    pub(crate) async fn lesson(&self, limit: &str, lesson: &Lesson<'_>) {
        self.publish(Message {
            origin: self.origin,
            limit: limit.to_owned(),
            lesson: Some(Taught {
                source: lesson.source.to_owned(),
                quotas: lesson
                    .quotas
                    .iter()
                    .map(|quota| {
                        let window = quota
                            .window
                            .map(|window| u64::try_from(window.as_micros()).unwrap_or(u64::MAX));
                        (quota.quota, window)
                    })
                    .collect(),
                rate_limited: lesson.rate_limited,
            }),
            delay_us: None,
        })
        .await;
    }

    /// Tell the other replicas of a delay that widened `limit`'s margin here.
    pub(crate) async fn delay(&self, limit: &str, delay: Duration) {
        self.publish(Message {
            origin: self.origin,
            limit: limit.to_owned(),
            lesson: None,
            delay_us: Some(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX)),
        })
        .await;
    }

    async fn publish(&self, message: Message) {
        let Some(redis) = self.store.as_ref().and_then(redis) else {
            return;
        };
        let Ok(text) = serde_json::to_string(&message) else {
            return;
        };
        if let Err(error) = redis.publish_lesson(&text).await {
            tracing::debug!(%error, limit = %message.limit, "a lesson was not shared with the other replicas");
        }
    }
}

fn apply(limiter: &Limiter, message: &Message) {
    if let Some(taught) = &message.lesson {
        let quotas: Vec<AdvertisedQuota> = taught
            .quotas
            .iter()
            .map(|(quota, window_us)| AdvertisedQuota {
                quota: *quota,
                window: window_us.map(Duration::from_micros),
            })
            .collect();
        let lesson = Lesson {
            source: &taught.source,
            quotas: &quotas,
            rate_limited: taught.rate_limited,
        };
        if let Err(error) = limiter.learn(&message.limit, &lesson) {
            tracing::debug!(%error, limit = %message.limit, "another replica's lesson not taken");
        }
    }
    if let Some(delay_us) = message.delay_us {
        limiter.note_delay(&message.limit, Duration::from_micros(delay_us));
    }
}
