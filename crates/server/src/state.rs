//! The state every handler shares, behind one `Arc` (cloning it per connection shares, never
//! copies, the limiter).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tollgate::Limiter;
use tollgate_rules::Rules;

use crate::config::ServerConfig;
use crate::forward::ForwardAuth;
use crate::metrics::Metrics;
use crate::tokens::Tokens;

#[derive(Clone, Debug)]
pub(crate) struct AppState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: ServerConfig,
    limiter: Limiter,
    rules: Rules,
    metrics: Metrics,
    tokens: Arc<Tokens>,
    forward_auth: ForwardAuth,
    learning: crate::learning::SharedLearning,
    hot_keys: crate::hot_keys::HotKeys,
    history: crate::history::History,
    shutting_down: AtomicBool,
    /// The address bound, once it is (`listen` may ask for port 0).
    listening: OnceLock<SocketAddr>,
}

impl AppState {
    pub(crate) fn new(
        config: ServerConfig,
        limiter: Limiter,
        rules: Rules,
        metrics: Metrics,
        tokens: Arc<Tokens>,
        forward_auth: ForwardAuth,
        learning: crate::learning::SharedLearning,
    ) -> AppState {
        AppState {
            inner: Arc::new(Inner {
                config,
                limiter,
                rules,
                metrics,
                tokens,
                forward_auth,
                learning,
                hot_keys: crate::hot_keys::HotKeys::default(),
                history: crate::history::History::default(),
                shutting_down: AtomicBool::new(false),
                listening: OnceLock::new(),
            }),
        }
    }

    pub(crate) fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    /// Sharing what vendors teach with the other replicas (on Redis).
    pub(crate) fn learning(&self) -> &crate::learning::SharedLearning {
        &self.inner.learning
    }

    pub(crate) fn limiter(&self) -> &Limiter {
        &self.inner.limiter
    }

    pub(crate) fn rules(&self) -> &Rules {
        &self.inner.rules
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The scoped data tokens in force.
    pub(crate) fn tokens(&self) -> &Tokens {
        &self.inner.tokens
    }

    /// `/v1/forward-auth`'s settings.
    pub(crate) fn forward_auth(&self) -> &ForwardAuth {
        &self.inner.forward_auth
    }

    pub(crate) fn hot_keys(&self) -> &crate::hot_keys::HotKeys {
        &self.inner.hot_keys
    }

    /// Each limit's recent past (`/v1/stats?history=`).
    pub(crate) fn history(&self) -> &crate::history::History {
        &self.inner.history
    }

    /// The address this server listens on: the one bound, else the one configured.
    pub(crate) fn listening(&self) -> SocketAddr {
        self.inner
            .listening
            .get()
            .copied()
            .unwrap_or(self.inner.config.listen)
    }

    pub(crate) fn set_listening(&self, address: SocketAddr) {
        let _ = self.inner.listening.set(address);
    }

    pub(crate) fn begin_shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::Release);
        self.inner.limiter.shutdown();
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::Acquire)
    }
}
