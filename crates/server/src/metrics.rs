//! Prometheus metrics. Labels are limit names (bounded by the rules table), denial reasons,
//! store operations and error codes; never keys, which are unbounded and may be personal data.
//!
//! Store round trips are timed by wrapping the store (`MeteredStore`), so every store, present
//! or future, is measured the same way without the engine knowing about metrics.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::Response;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tollgate::store::{
    Adjust, Adjusted, Ask, Decision, Forward, Renewed, Store, StoreFuture, Take,
};
use tollgate::{Committed, DenyReason, MemoryStore, Priority};
use tollgate_rules::Rules;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LimitLabels {
    pub(crate) limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DenialLabels {
    pub(crate) limit: String,
    pub(crate) reason: &'static str,
}

/// Waiters by limit and priority: for `/v1/stats`, not exported (the exported gauge is per
/// limit, which is what alerts want).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WaiterLabels {
    pub(crate) limit: String,
    pub(crate) priority: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OperationLabels {
    pub(crate) operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CodeLabels {
    pub(crate) code: &'static str,
}

/// Why `/v1/forward-auth` refused a request before reading it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RefusalLabels {
    pub(crate) reason: &'static str,
}

pub(crate) type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn wait_histogram() -> Histogram {
    // 1 ms to about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn store_histogram() -> Histogram {
    // 10 µs to about 0.3 s.
    Histogram::new(exponential_buckets(0.000_01, 2.0, 16))
}

#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    registry: Arc<Registry>,
    pub(crate) grants: Family<LimitLabels, Counter>,
    pub(crate) denials: Family<DenialLabels, Counter>,
    pub(crate) waiters: Family<LimitLabels, Gauge>,
    pub(crate) waiters_by_priority: Family<WaiterLabels, Gauge>,
    pub(crate) wait_seconds: HistogramFamily<LimitLabels>,
    pub(crate) errors: Family<CodeLabels, Counter>,
    pub(crate) forward_auth_refusals: Family<RefusalLabels, Counter>,
    /// The memory store, whose counters are counted; a shared store's are its own business.
    memory: Option<Arc<MemoryStore>>,
    envoy: Option<Arc<tollgate_envoy::ConfigWatch>>,
}

impl Metrics {
    /// The registry, with the rules and store read at scrape time (and the memory store's
    /// write-ahead, when it writes ahead).
    pub(crate) fn new(
        rules: Rules,
        memory: Option<Arc<MemoryStore>>,
        ahead: Option<Arc<crate::runs::WriteAheadStats>>,
        store_seconds: HistogramFamily<OperationLabels>,
        envoy: Option<Arc<tollgate_envoy::ConfigWatch>>,
    ) -> Metrics {
        let mut registry = Registry::with_prefix("tollgate");
        let grants = Family::<LimitLabels, Counter>::default();
        registry.register("grants", "Acquires granted, by limit", grants.clone());
        let denials = Family::<DenialLabels, Counter>::default();
        registry.register(
            "denials",
            "Acquires not granted within their wait, by limit and reason (capacity, paused, queued, recovering)",
            denials.clone(),
        );
        let waiters = Family::<LimitLabels, Gauge>::default();
        registry.register(
            "waiters",
            "Acquires waiting for room now, by limit",
            waiters.clone(),
        );
        let wait_seconds: HistogramFamily<LimitLabels> =
            Family::new_with_constructor(wait_histogram);
        registry.register(
            "acquire_wait_seconds",
            "Time acquires that were allowed to wait spent before their answer, by limit",
            wait_seconds.clone(),
        );
        registry.register(
            "store_round_trip_seconds",
            "Store round trips, by operation",
            store_seconds.clone(),
        );
        let errors = Family::<CodeLabels, Counter>::default();
        registry.register("http_errors", "Error answers, by code", errors.clone());
        let forward_auth_refusals = Family::<RefusalLabels, Counter>::default();
        registry.register(
            "forward_auth_refusals",
            "Forward-auth requests refused unread, by reason (unexpected_header: one the configured proxy does not set; disagreeing_headers: two values of the original method or URI)",
            forward_auth_refusals.clone(),
        );
        registry.register_collector(Box::new(ScrapeTime {
            rules,
            memory: memory.clone(),
            ahead,
            envoy: envoy.clone(),
        }));
        Metrics {
            memory,
            registry: Arc::new(registry),
            grants,
            denials,
            waiters,
            waiters_by_priority: Family::default(),
            wait_seconds,
            errors,
            forward_auth_refusals,
            envoy,
        }
    }

    /// One more (`delta` 1) or one fewer (-1) request waiting on `limit` at `priority`.
    pub(crate) fn waiting(&self, limit: &str, priority: Priority, delta: i64) {
        self.waiters
            .get_or_create(&LimitLabels {
                limit: limit.to_owned(),
            })
            .inc_by(delta);
        self.waiters_by_priority
            .get_or_create(&WaiterLabels {
                limit: limit.to_owned(),
                priority: priority.as_str(),
            })
            .inc_by(delta);
    }

    /// Requests waiting on `limit` at `priority` now.
    pub(crate) fn waiting_at(&self, limit: &str, priority: Priority) -> u64 {
        self.waiters_by_priority
            .get(&WaiterLabels {
                limit: limit.to_owned(),
                priority: priority.as_str(),
            })
            .map_or(0, |gauge| u64::try_from(gauge.get()).unwrap_or(0))
    }

    /// Grants on `limit` since the server started.
    pub(crate) fn grants_of(&self, limit: &str) -> u64 {
        self.grants
            .get(&LimitLabels {
                limit: limit.to_owned(),
            })
            .map_or(0, |counter| counter.get())
    }

    /// Denials on `limit` for `reason` since the server started.
    pub(crate) fn denials_of(&self, limit: &str, reason: DenyReason) -> u64 {
        self.denials
            .get(&DenialLabels {
                limit: limit.to_owned(),
                reason: reason.as_str(),
            })
            .map_or(0, |counter| counter.get())
    }

    /// Acquires waiting on `limit` now.
    pub(crate) fn waiting_on(&self, limit: &str) -> u64 {
        self.waiters
            .get(&LimitLabels {
                limit: limit.to_owned(),
            })
            .map_or(0, |gauge| u64::try_from(gauge.get()).unwrap_or(0))
    }

    /// The Envoy configuration served, if any.
    pub(crate) fn envoy(&self) -> Option<&Arc<tollgate_envoy::ConfigWatch>> {
        self.envoy.as_ref()
    }

    pub(crate) fn memory(&self) -> Option<&MemoryStore> {
        self.memory.as_deref()
    }

    /// The text exposition format.
    pub(crate) fn render(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Values owned elsewhere, read at each scrape.
#[derive(Debug)]
struct ScrapeTime {
    rules: Rules,
    /// The memory store, whose counters are counted; a shared store's are its own business.
    memory: Option<Arc<MemoryStore>>,
    /// The memory store's write-ahead to the state database.
    ahead: Option<Arc<crate::runs::WriteAheadStats>>,
    /// Envoy's rate limit service, when it is on.
    envoy: Option<Arc<tollgate_envoy::ConfigWatch>>,
}

fn encode_one(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let metric_encoder = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(metric_encoder)
}

impl ScrapeTime {
    /// What vendors taught, for the rate limits that learned something: the limit in force
    /// and the grant-to-send delay callers report (docs/outbound.md).
    fn encode_learned(
        &self,
        encoder: &mut DescriptorEncoder,
        snapshot: &tollgate_rules::RuleSet,
    ) -> Result<(), std::fmt::Error> {
        let limiter = self.rules.limiter();
        let learned: Vec<(String, tollgate::Learned)> = snapshot
            .iter()
            .filter_map(|rule| {
                let name = rule.name();
                let learned = limiter.learned(name)?;
                (learned.learned.is_some() || !learned.delay.is_zero())
                    .then(|| (name.to_owned(), learned))
            })
            .collect();
        if learned.is_empty() {
            return Ok(());
        }
        let gauge = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "limit_in_force",
            "The limit a rate limit decides under now, lower than its configured limit while a vendor's lesson holds (POST /v1/learn)",
            None,
            gauge.metric_type(),
        )?;
        for (name, learned) in &learned {
            ConstGauge::new(i64::try_from(learned.effective).unwrap_or(i64::MAX))
                .encode(family.encode_family(&[("limit", name.as_str())])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "send_delay_ms",
            "The most time callers reported between a grant's answer and their send in the last minute or two (sent_after_ms)",
            None,
            gauge.metric_type(),
        )?;
        for (name, learned) in &learned {
            ConstGauge::new(i64::try_from(learned.delay.as_millis()).unwrap_or(i64::MAX))
                .encode(family.encode_family(&[("limit", name.as_str())])?)?;
        }
        Ok(())
    }
}

impl prometheus_client::collector::Collector for ScrapeTime {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = self.rules.stats();
        let snapshot = self.rules.snapshot();
        {
            let reloads = ConstCounter::new(stats.reloads_ok.load(Relaxed));
            let failed = ConstCounter::new(stats.reloads_failed.load(Relaxed));
            let mut family = encoder.encode_descriptor(
                "rules_reloads",
                "Reads of the rules source (table or file), by outcome (ok, failed)",
                None,
                reloads.metric_type(),
            )?;
            reloads.encode(family.encode_family(&[("outcome", "ok")])?)?;
            failed.encode(family.encode_family(&[("outcome", "failed")])?)?;
        }
        encode_one(
            &mut encoder,
            "rules_rows_rejected",
            "Rows of the rules table (or limits of the file) that failed validation at the last reload",
            &ConstGauge::new(stats.rows_rejected.load(Relaxed) as i64),
        )?;
        encode_one(
            &mut encoder,
            "rules_limits",
            "Limits in force",
            &ConstGauge::new(snapshot.len() as i64),
        )?;
        encode_one(
            &mut encoder,
            "rules_version",
            "Version of the rules in force; it grows with every change applied",
            &ConstGauge::new(snapshot.version() as i64),
        )?;
        if let Some(envoy) = &self.envoy {
            let stats = envoy.stats();
            let ok = ConstCounter::new(stats.reloads_ok.load(Relaxed));
            let failed = ConstCounter::new(stats.reloads_failed.load(Relaxed));
            let mut family = encoder.encode_descriptor(
                "envoy_config_reloads",
                "Reloads of the Envoy configuration after its files changed, by outcome (ok, failed: the edit was refused and the previous configuration kept)",
                None,
                ok.metric_type(),
            )?;
            ok.encode(family.encode_family(&[("outcome", "ok")])?)?;
            failed.encode(family.encode_family(&[("outcome", "failed")])?)?;
            let allowed = ConstCounter::new(stats.answered_ok.load(Relaxed));
            let over = ConstCounter::new(stats.answered_over_limit.load(Relaxed));
            let mut family = encoder.encode_descriptor(
                "envoy_decisions",
                "ShouldRateLimit answers, by overall code (ok, over_limit)",
                None,
                allowed.metric_type(),
            )?;
            allowed.encode(family.encode_family(&[("code", "ok")])?)?;
            over.encode(family.encode_family(&[("code", "over_limit")])?)?;
            encode_one(
                &mut encoder,
                "envoy_store_failures",
                "ShouldRateLimit requests decided without the store, which could not answer",
                &ConstCounter::new(stats.store_failures.load(Relaxed)),
            )?;
        }
        self.encode_learned(&mut encoder, &snapshot)?;
        if let Some(memory) = &self.memory {
            encode_one(
                &mut encoder,
                "keys_tracked",
                "Counters the store tracks now (bounded by keys_tracked_max)",
                &ConstGauge::new(i64::try_from(memory.len()).unwrap_or(i64::MAX)),
            )?;
        }
        if let Some(ahead) = &self.ahead {
            let committed = ConstCounter::new(ahead.batches.load(Relaxed));
            let failed = ConstCounter::new(ahead.failures.load(Relaxed));
            let mut family = encoder.encode_descriptor(
                "state_writes",
                "Transactions of write-ahead records to the state database, by outcome (committed, failed)",
                None,
                committed.metric_type(),
            )?;
            committed.encode(family.encode_family(&[("outcome", "committed")])?)?;
            failed.encode(family.encode_family(&[("outcome", "failed")])?)?;
            encode_one(
                &mut encoder,
                "state_records_written",
                "Counter records committed to the state database ahead of the grants they allow",
                &ConstCounter::new(ahead.records.load(Relaxed)),
            )?;
        }
        Ok(())
    }
}

/// The family `MeteredStore` records into, made before the registry that exposes it.
pub(crate) fn store_seconds_family() -> HistogramFamily<OperationLabels> {
    Family::new_with_constructor(store_histogram)
}

/// A store that times every round trip of the store it wraps.
#[derive(Debug)]
pub(crate) struct MeteredStore {
    inner: Arc<dyn Store>,
    seconds: HistogramFamily<OperationLabels>,
}

impl MeteredStore {
    pub(crate) fn new(
        inner: Arc<dyn Store>,
        seconds: HistogramFamily<OperationLabels>,
    ) -> MeteredStore {
        MeteredStore { inner, seconds }
    }

    fn timed<'a, T: Send + 'a>(
        &'a self,
        operation: &'static str,
        started: Instant,
        future: StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        match future {
            StoreFuture::Ready(result) => {
                self.observe(operation, started);
                StoreFuture::Ready(result)
            }
            StoreFuture::Pending(pending) => StoreFuture::boxed(async move {
                let result = pending.await;
                self.observe(operation, started);
                result
            }),
        }
    }

    fn observe(&self, operation: &'static str, started: Instant) {
        self.seconds
            .get_or_create(&OperationLabels { operation })
            .observe(started.elapsed().as_secs_f64());
    }
}

/// Times every decision and change; the rest (what the limiter tells, what the store offers,
/// readiness) is the inner store's. Metering changes no decision, so the in-process ways stay
/// open: a decision on a counter's word makes no round trip to time.
impl Forward for MeteredStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    // A ready answer stays ready: the limiter decides on the calling thread as before.
    fn acquire<'a>(&'a self, ask: Ask<'a>) -> StoreFuture<'a, Decision> {
        let started = Instant::now();
        self.timed("acquire", started, self.inner.acquire(ask))
    }

    fn commit<'a>(&'a self, take: Take<'a>, seq: u64, used: u64) -> StoreFuture<'a, Committed> {
        let started = Instant::now();
        self.timed("commit", started, self.inner.commit(take, seq, used))
    }

    fn renew<'a>(&'a self, take: Take<'a>, fence: u64) -> StoreFuture<'a, Renewed> {
        let started = Instant::now();
        self.timed("renew", started, self.inner.renew(take, fence))
    }

    fn adjust<'a>(&'a self, take: Take<'a>, adjust: Adjust) -> StoreFuture<'a, Adjusted> {
        let started = Instant::now();
        let operation = match adjust {
            Adjust::Pause { .. } => "pause",
            Adjust::Resume => "resume",
            Adjust::Reset => "reset",
            Adjust::Charge { .. } => "charge",
        };
        self.timed(operation, started, self.inner.adjust(take, adjust))
    }

    fn usage<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, tollgate::store::Usage> {
        let started = Instant::now();
        self.timed("usage", started, self.inner.usage(take))
    }
}

/// Counts error answers by code (`tollgate_http_errors_total`), from the code every error
/// answer carries in its extensions.
pub(crate) async fn count_errors(
    State(errors): State<Family<CodeLabels, Counter>>,
    response: Response,
) -> Response {
    if let Some(code) = response.extensions().get::<tollgate_api::Code>() {
        errors
            .get_or_create(&CodeLabels {
                code: code.as_str(),
            })
            .inc();
    }
    response
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tollgate::{MemoryStoreConfig, MonotonicClock};
    use tollgate_rules::FileSource;

    use super::*;

    /// Every metric `/metrics` can export, with its type, as the `# TYPE` lines of a registry
    /// with every optional part on (the memory store, its write-ahead, Envoy) name them. A
    /// counter's samples carry `_total`, as the guide writes its name.
    async fn exported() -> BTreeMap<String, String> {
        let directory = tempfile::tempdir().expect("tempdir");
        let file = directory.path().join("limits.toml");
        std::fs::write(
            &file,
            "[limits]\nvendor-x = { kind = \"rate\", limit = 10, period_ms = 1000 }\n",
        )
        .expect("write the limits file");
        let source = FileSource::new(file).expect("a limits file");
        let rules = Rules::start(source, tollgate::Limiter::in_memory())
            .await
            .expect("rules");
        // A lesson, so that the learned limit's families have samples.
        rules
            .limiter()
            .learn(
                "vendor-x",
                &tollgate::Lesson {
                    source: "test",
                    quotas: &[],
                    rate_limited: true,
                },
            )
            .expect("learned");
        let memory = Arc::new(MemoryStore::new(
            MemoryStoreConfig {
                keys_tracked_max: 10,
                keys_per_limit_max: 10,
            },
            Arc::new(MonotonicClock::new()),
        ));
        let store_seconds = store_seconds_family();
        let metrics = Metrics::new(
            rules,
            Some(memory),
            Some(Arc::default()),
            store_seconds.clone(),
            Some(tollgate_envoy::ConfigWatch::fixed(
                tollgate_envoy::Config::default(),
            )),
        );
        // A family is rendered only once it has a sample, so each gets one; the registry's
        // list of what was registered (its Debug form, the only way to list it) then says
        // whether one was left out here.
        let limit = LimitLabels {
            limit: "vendor-x".into(),
        };
        metrics.grants.get_or_create(&limit).inc();
        metrics
            .denials
            .get_or_create(&DenialLabels {
                limit: "vendor-x".into(),
                reason: DenyReason::Capacity.as_str(),
            })
            .inc();
        metrics.waiters.get_or_create(&limit).set(1);
        metrics.wait_seconds.get_or_create(&limit).observe(0.1);
        metrics
            .errors
            .get_or_create(&CodeLabels { code: "internal" })
            .inc();
        metrics
            .forward_auth_refusals
            .get_or_create(&RefusalLabels {
                reason: "unexpected_header",
            })
            .inc();
        store_seconds
            .get_or_create(&OperationLabels {
                operation: "acquire",
            })
            .observe(0.001);
        let text = metrics.render().expect("renders");
        let registered: Vec<String> = format!("{:?}", metrics.registry)
            .split("Descriptor { name: \"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .map(|name| format!("tollgate_{name}"))
            .collect();
        assert!(!registered.is_empty(), "no family found in the registry");
        for name in &registered {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} is registered but has no sample in this test, so it was not rendered"
            );
        }
        text.lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .map(|line| {
                let (name, kind) = line.split_once(' ').expect("# TYPE name kind");
                let name = match kind {
                    "counter" => format!("{name}_total"),
                    _ => name.to_owned(),
                };
                (name, kind.to_owned())
            })
            .collect()
    }

    /// The metrics table of the server's guide: each metric's name and type.
    fn documented() -> BTreeMap<String, String> {
        let guide = std::fs::read_to_string(
            tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR"))
                .join("../../docs/server.md"),
        )
        .expect("docs/server.md");
        let section = guide
            .split("\n## Metrics\n")
            .nth(1)
            .expect("a section \"## Metrics\" in docs/server.md");
        let section = section.split("\n## ").next().unwrap_or(section);
        section
            .lines()
            .filter_map(|line| line.strip_prefix("| `tollgate_"))
            .map(|row| {
                let cells: Vec<&str> = row.split('|').map(str::trim).collect();
                let name = cells[0].trim_end_matches('`');
                (format!("tollgate_{name}"), cells[1].to_owned())
            })
            .collect()
    }

    /// The guide lists exactly the metrics the server exports, each with its type: a metric
    /// added, renamed or dropped in the code fails here until the guide says so.
    #[tokio::test]
    async fn the_guide_lists_every_metric_and_only_those() {
        let exported = exported().await;
        let documented = documented();
        let undocumented: Vec<_> = exported
            .iter()
            .filter(|(name, _)| !documented.contains_key(*name))
            .collect();
        let missing: Vec<_> = documented
            .iter()
            .filter(|(name, _)| !exported.contains_key(*name))
            .collect();
        assert!(
            undocumented.is_empty() && missing.is_empty(),
            "exported but not in docs/server.md's metrics table: {undocumented:?}; \
             in the table but never exported: {missing:?}"
        );
        assert_eq!(exported, documented, "a metric's type differs");
    }

    /// Metering changes no decision and costs the memory store none of its fast paths: the
    /// handle still finds the memory store through the wrapper, and a decision the memory
    /// store answers at once is still answered at once (no future to box and poll).
    #[test]
    fn metering_keeps_the_memory_store_s_fast_paths() {
        let memory = Arc::new(MemoryStore::new(
            MemoryStoreConfig {
                keys_tracked_max: 10,
                keys_per_limit_max: 10,
            },
            Arc::new(MonotonicClock::new()),
        ));
        let metered = MeteredStore::new(memory.clone(), store_seconds_family());
        let found = Store::offers(&metered)
            .in_process
            .expect("the memory store's in-process ways, through the wrapper");
        assert!(std::ptr::addr_eq(found, memory.as_ref()));
        let policy = tollgate::Policy::rate(
            10,
            1_000_000,
            0,
            tollgate::Algorithm::Gcra { burst: 10 },
            tollgate::Reserve::default(),
        )
        .expect("a policy");
        let takes = [Take {
            counter: tollgate::store::CounterId {
                limit: "vendor-x",
                key: None,
            },
            policy: &policy,
        }];
        let answer = Store::acquire(&metered, Ask::new(&takes, 1, Priority::Normal));
        assert!(
            matches!(answer, StoreFuture::Ready(Some(Ok(_)))),
            "{answer:?}"
        );
    }
}
