//! The gate as a `reqwest-middleware` middleware: a reqwest user gets the host's quota,
//! fleet-wide pauses on 429/503, fence checks and bounded retries by adding one layer.
//!
//! ```no_run
//! # fn example(gate: tollgate_dispatch::Gate) {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(tollgate_dispatch::TollgateMiddleware::new().host("api.vendor.example", gate))
//!     .build();
//! // Interactive calls ahead of bulk ones:
//! let request = client
//!     .get("http://api.vendor.example/v1/thing")
//!     .with_extension(tollgate_dispatch::Priority::High);
//! # let _ = request; }
//! ```
//!
//! Requests to hosts without a gate pass through untouched. The priority is the request's
//! `tollgate::Priority` extension (normal without one). reqwest's own connection pool is the
//! pool here; the host's concurrency limit, if any, bounds requests in flight. Transient
//! failures (connect errors, timeouts, 5xx) are retried only for idempotent methods, since a
//! POST that timed out may have been done; rate-limit answers are retried for every method
//! (the vendor refused the request). A request whose body cannot be cloned (a stream) is sent
//! once; its rate-limit answer still pauses the host.

use std::collections::HashMap;

use http::Extensions;
use reqwest::{Method, Request, Response};
use reqwest_middleware::{Middleware, Next};
use tollgate::Priority;

use crate::classify::Verdict;
use crate::gate::{Gate, Settled};

/// Gates by host: `host` or `host:port` as in the request URL.
#[derive(Clone, Debug, Default)]
pub struct TollgateMiddleware {
    gates: HashMap<String, Gate>,
}

impl TollgateMiddleware {
    pub fn new() -> TollgateMiddleware {
        TollgateMiddleware {
            gates: HashMap::new(),
        }
    }

    /// Route requests for `host` (`api.vendor.example`, or `127.0.0.1:8080` for one port)
    /// through `gate`.
    pub fn host(mut self, host: &str, gate: Gate) -> TollgateMiddleware {
        self.gates.insert(host.to_ascii_lowercase(), gate);
        self
    }

    fn gate_for(&self, url: &reqwest::Url) -> Option<&Gate> {
        let host = url.host_str()?.to_ascii_lowercase();
        if let Some(port) = url.port()
            && let Some(gate) = self.gates.get(&format!("{host}:{port}"))
        {
            return Some(gate);
        }
        self.gates.get(&host)
    }
}

fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS | Method::TRACE
    )
}

#[async_trait::async_trait]
impl Middleware for TollgateMiddleware {
    async fn handle(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let Some(gate) = self.gate_for(request.url()) else {
            return next.run(request, extensions).await;
        };
        let priority = extensions.get::<Priority>().copied().unwrap_or_default();
        let retry_transient = idempotent(request.method());
        let mut request = request;
        let mut attempt = 0u32;
        loop {
            let mut admission = gate
                .admit(priority)
                .await
                .map_err(reqwest_middleware::Error::middleware)?;
            let copy = request.try_clone();
            gate.sending(&mut admission);
            let output = next.clone().run(request, extensions).await;
            let mut verdict = gate.classify(&output);
            gate.learn(&output, verdict).await;
            if verdict == Verdict::Retry && !retry_transient {
                verdict = Verdict::Done;
            }
            // Without a copy there is nothing to retry with: settle as the last attempt.
            let attempt_index = if copy.is_some() { attempt } else { u32::MAX };
            match (gate.settle(admission, verdict, attempt_index).await, copy) {
                (Settled::Retry, Some(copy)) => {
                    request = copy;
                    attempt += 1;
                }
                _ => return output,
            }
        }
    }
}
