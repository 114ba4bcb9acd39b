//! A Tollgate server as the host's quota source, over HTTP API v1 (docs/server.md):
//! `POST /v1/acquire` with `wait_ms`, `POST /v1/permits/{id}/commit` and `/renew`, and
//! `POST /v1/pause`. The server does the waiting, ordering and pausing; this is only the client.
//! The bodies are the wire contract's own (`tollgate_api`).

use std::time::Duration;

use tollgate::{DenyReason, Priority};
use tollgate_api::data::{
    AcquireBody, CommitBody, Granted, PauseAnswer, PauseBody, RateLimited, RenewAnswer, Used,
};
use tollgate_api::{Code, ErrorBody};

use crate::error::DispatchError;
use crate::quota::Lesson;
use crate::quota::{HostLimits, check_limits};

/// Longest answer body read from the server, in bytes.
pub const REMOTE_BODY_BYTES_MAX: usize = 64 * 1024;
/// Slack added to a waiting acquire's HTTP timeout, beyond its `wait_ms`, in milliseconds.
const REMOTE_SLACK_MS: u64 = 5_000;

/// The server and the names of the host's limits on it.
#[derive(Clone, Debug)]
pub struct RemoteQuota {
    /// `http://host:port`, without a trailing slash.
    base_url: String,
    /// Bearer token for the data plane, if the server requires one.
    token: Option<String>,
    limits: HostLimits,
    client: reqwest::Client,
    /// One non-waiting call's timeout.
    timeout: Duration,
}

#[derive(Debug)]
pub(crate) struct RemotePermit {
    id: String,
    quota: RemoteQuota,
    /// Whether the permit holds a lease: one dropped unsettled is released in the background,
    /// as a local permit's is, rather than held until its TTL runs out on the server.
    lease: bool,
    /// Committed (or being committed): nothing is left for the drop to release.
    settled: bool,
}

pub(crate) enum RemoteAcquired {
    Granted {
        permit: RemotePermit,
        fence: Option<u64>,
        /// When the server made the grant, on this process's clock (as near as can be known).
        granted_at: tokio::time::Instant,
        lease_expires_in: Option<Duration>,
    },
    Denied {
        retry_after: Duration,
        paused: bool,
    },
}

fn transport(error: reqwest::Error) -> DispatchError {
    // reqwest's own message names only the URL; what went wrong (connection refused, timed
    // out, reset) is further down the chain of causes.
    let mut reason = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        reason.push_str(": ");
        reason.push_str(&cause.to_string());
        source = cause.source();
    }
    DispatchError::Remote {
        reason: format!("unreachable: {reason}"),
        transient: true,
    }
}

impl RemoteQuota {
    /// `base_url` is the server's root (`http://127.0.0.1:7070`); `timeout` bounds each call
    /// that does not wait (waiting acquires get their wait on top).
    pub fn new(
        base_url: &str,
        token: Option<String>,
        limits: HostLimits,
        timeout: Duration,
    ) -> Result<RemoteQuota, DispatchError> {
        check_limits(&limits)?;
        let base_url = base_url.trim_end_matches('/').to_owned();
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(DispatchError::config(
                "base_url",
                "must start with http:// or https://",
            ));
        }
        let client = reqwest::Client::builder()
            .build()
            .map_err(|error| DispatchError::config("base_url", error.to_string()))?;
        Ok(RemoteQuota {
            base_url,
            token,
            limits,
            client,
            timeout,
        })
    }

    /// The names of the host's limits.
    pub fn limits(&self) -> &HostLimits {
        &self.limits
    }

    async fn post(
        &self,
        path: &str,
        body: &impl serde::Serialize,
        timeout: Duration,
    ) -> Result<(reqwest::StatusCode, Vec<u8>), DispatchError> {
        let (status, bytes, _) = self.post_timed(path, body, timeout).await?;
        Ok((status, bytes))
    }

    /// `post`, with the time the server says it held the request (`Server-Timing`).
    async fn post_timed(
        &self,
        path: &str,
        body: &impl serde::Serialize,
        timeout: Duration,
    ) -> Result<(reqwest::StatusCode, Vec<u8>, Option<Duration>), DispatchError> {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base_url))
            .timeout(timeout)
            .json(body);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let mut response = request.send().await.map_err(transport)?;
        let held = response
            .headers()
            .get("server-timing")
            .and_then(|value| value.to_str().ok())
            .and_then(server_held);
        let status = response.status();
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if bytes.len() + chunk.len() > REMOTE_BODY_BYTES_MAX {
                return Err(DispatchError::Remote {
                    reason: format!("answer longer than {REMOTE_BODY_BYTES_MAX} bytes"),
                    transient: false,
                });
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok((status, bytes, held))
    }

    fn failure(status: reqwest::StatusCode, bytes: &[u8]) -> DispatchError {
        // A 429 or 408 without the server's body comes from something in front of it (a proxy
        // or load balancer): it passes, like a 5xx.
        let transient = status.is_server_error()
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS
            || status == reqwest::StatusCode::REQUEST_TIMEOUT;
        match serde_json::from_slice::<ErrorBody>(bytes) {
            Ok(body) => DispatchError::Remote {
                transient: transient || body.error.code() == Some(Code::StoreUnavailable),
                reason: format!("{status}: {}: {}", body.error.code, body.error.message),
            },
            Err(_) => DispatchError::Remote {
                reason: format!("{status} with an unreadable body"),
                transient,
            },
        }
    }

    fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, DispatchError> {
        serde_json::from_slice(bytes).map_err(|error| DispatchError::Remote {
            reason: format!("unexpected answer: {error}"),
            transient: false,
        })
    }

    pub(crate) async fn acquire(
        &self,
        priority: Priority,
        wait: Duration,
    ) -> Result<RemoteAcquired, DispatchError> {
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let body = AcquireBody {
            limits: self
                .limits
                .names()
                .iter()
                .map(|name| name.to_string())
                .collect(),
            key: None,
            // Always one unit: a dropped lease's release (`Drop for RemotePermit`) relies on it.
            cost: Some(1),
            costs: None,
            priority: Some(priority.as_str().to_owned()),
            wait_ms: Some(wait_ms),
            refundable: None,
        };
        let timeout = wait + self.timeout + Duration::from_millis(REMOTE_SLACK_MS);
        let asked_at = tokio::time::Instant::now();
        let (status, bytes, held) = self.post_timed("/v1/acquire", &body, timeout).await?;
        if status == reqwest::StatusCode::OK {
            let granted: Granted = RemoteQuota::parse(&bytes)?;
            // The grant was made when the server let the request go: the time since is the
            // answer's way back, which the margin must cover too. Without the server's
            // figure, the answer's arrival (the answer's way back goes unseen).
            let now = tokio::time::Instant::now();
            let granted_at = held.map_or(now, |held| (asked_at + held).min(now));
            let lease = granted.limits.iter().find(|limit| limit.fence.is_some());
            return Ok(RemoteAcquired::Granted {
                permit: RemotePermit {
                    id: granted.permit,
                    quota: self.clone(),
                    lease: lease.is_some(),
                    settled: false,
                },
                fence: lease.and_then(|limit| limit.fence),
                granted_at,
                lease_expires_in: lease
                    .and_then(|limit| limit.expires_ms)
                    .map(Duration::from_millis),
            });
        }
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS
            && let Ok(denied) = serde_json::from_slice::<RateLimited>(&bytes)
        {
            return Ok(RemoteAcquired::Denied {
                retry_after: Duration::from_millis(denied.retry_after_ms),
                paused: denied.reason.0 == DenyReason::Paused,
            });
        }
        Err(RemoteQuota::failure(status, &bytes))
    }

    pub(crate) async fn pause(&self, duration: Duration) -> Result<Duration, DispatchError> {
        let target = self
            .limits
            .pause_target()
            .ok_or_else(|| DispatchError::config("limits", "name at least one limit"))?;
        let body = PauseBody {
            limit: target.to_owned(),
            key: None,
            // Rounded up: a pause is a lower bound.
            retry_after_ms: tollgate_api::ms_ceil(duration),
        };
        let (status, bytes) = self.post("/v1/pause", &body, self.timeout).await?;
        if status != reqwest::StatusCode::OK {
            return Err(RemoteQuota::failure(status, &bytes));
        }
        let paused: PauseAnswer = RemoteQuota::parse(&bytes)?;
        Ok(Duration::from_millis(paused.paused_ms))
    }
}

impl RemoteQuota {
    /// Tell the server what the vendor's answer said of the host's rate limit; returns the
    /// pause it put in force (none: zero).
    pub(crate) async fn learn(&self, lesson: &Lesson) -> Result<Duration, DispatchError> {
        let Some(target) = self.limits.rate.as_deref() else {
            return Ok(Duration::ZERO);
        };
        let body = tollgate_api::data::LearnBody {
            limit: target.to_owned(),
            source: lesson.source.clone(),
            quotas: lesson
                .quotas
                .iter()
                .map(|quota| tollgate_api::data::QuotaBody {
                    quota: quota.quota,
                    window_ms: quota.window.map(tollgate_api::ms_ceil),
                })
                .collect(),
            remaining: lesson.remaining,
            reset_ms: lesson.reset.map(tollgate_api::ms_ceil),
            rate_limited: lesson.rate_limited,
        };
        let (status, bytes) = self.post("/v1/learn", &body, self.timeout).await?;
        if status != reqwest::StatusCode::OK {
            return Err(RemoteQuota::failure(status, &bytes));
        }
        let learned: tollgate_api::data::LearnAnswer = RemoteQuota::parse(&bytes)?;
        Ok(Duration::from_millis(learned.paused_ms))
    }

    async fn commit(
        &self,
        id: &str,
        used: u64,
        sent_after: Option<Duration>,
    ) -> Result<(), DispatchError> {
        let path = format!("/v1/permits/{id}/commit");
        let body = CommitBody {
            used: Some(Used::All(used)),
            sent_after_ms: sent_after.map(tollgate_api::ms_ceil),
        };
        let (status, bytes) = self.post(&path, &body, self.timeout).await?;
        if status != reqwest::StatusCode::OK {
            return Err(RemoteQuota::failure(status, &bytes));
        }
        Ok(())
    }
}

impl RemotePermit {
    pub(crate) async fn commit(
        mut self,
        used: u64,
        sent_after: Option<Duration>,
    ) -> Result<(), DispatchError> {
        // Settled whatever the answer: a commit that failed is not tried again from the drop
        // (its lease, if the server never heard of the commit, runs to its TTL).
        self.settled = true;
        self.quota.commit(&self.id, used, sent_after).await
    }

    pub(crate) async fn renew(&mut self) -> Result<Duration, DispatchError> {
        let path = format!("/v1/permits/{}/renew", self.id);
        let (status, bytes) = self
            .quota
            .post(&path, &tollgate_api::data::RenewBody {}, self.quota.timeout)
            .await?;
        if status != reqwest::StatusCode::OK {
            return Err(RemoteQuota::failure(status, &bytes));
        }
        let renewed: RenewAnswer = RemoteQuota::parse(&bytes)?;
        Ok(Duration::from_millis(renewed.expires_ms))
    }
}

impl Drop for RemotePermit {
    /// A lease dropped unsettled (its caller went away, or the attempt was refused before
    /// sending) is released in the background. All its rate units count as used: the call may
    /// have happened. Without a runtime to send the release on, the lease runs to its TTL.
    fn drop(&mut self) {
        if self.settled || !self.lease {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!("a lease dropped outside a runtime is left to expire");
            return;
        };
        let quota = self.quota.clone();
        let id = std::mem::take(&mut self.id);
        runtime.spawn(async move {
            // One unit per grant: every acquire of the remote quota asks for cost 1.
            if let Err(error) = quota.commit(&id, 1, None).await {
                tracing::debug!(%error, "releasing a dropped lease failed; it runs to its TTL");
            }
        });
    }
}

/// The time a Tollgate server held an acquire, from its `Server-Timing: acquire;dur=MS`.
pub(crate) fn server_held(value: &str) -> Option<Duration> {
    value.split(',').find_map(|metric| {
        let mut parts = metric.split(';').map(str::trim);
        if parts.next()? != "acquire" {
            return None;
        }
        let ms: f64 = parts
            .find_map(|part| part.strip_prefix("dur="))?
            .parse()
            .ok()?;
        (ms.is_finite() && (0.0..=86_400_000.0).contains(&ms))
            .then(|| Duration::from_secs_f64(ms / 1_000.0))
    })
}

#[cfg(test)]
mod server_timing_tests {
    use super::*;

    #[test]
    fn the_servers_hold_is_read_from_server_timing() {
        assert_eq!(
            server_held("acquire;dur=12.5"),
            Some(Duration::from_micros(12_500))
        );
        assert_eq!(
            server_held("db;dur=1, acquire; dur=3"),
            Some(Duration::from_millis(3))
        );
        for bad in [
            "",
            "acquire",
            "acquire;dur=-1",
            "acquire;dur=NaN",
            "other;dur=3",
        ] {
            assert_eq!(server_held(bad), None, "{bad}");
        }
    }
}
