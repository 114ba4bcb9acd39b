//! gRPC decisions per second on loopback, 64 requests in flight over one HTTP/2 connection:
//! Envoy's `ShouldRateLimit` against the built `tollgate serve --grpc-listen`, and, when its
//! binary is found, `throttlecrab-server`'s `Throttle` doing the same work: one counter decision
//! per request, on keys drawn from 10,000, every request allowed.
//!
//! `cargo bench -p tollgate-cli --bench grpc_decisions` runs each for `BENCH_SECONDS` (default 5),
//! `BENCH_ROUNDS` times (default 1), interleaved. throttlecrab-server is looked up in
//! `THROTTLECRAB_SERVER`, then on `PATH` (`scripts/bench-grpc` installs it, with `protoc`, which
//! its gRPC transport needs at build time). Under `cargo test --all-targets` it only smoke-tests
//! itself briefly. Load generator and servers share this machine's cores: the figures compare
//! the two servers under the same handicap, not their capacity on dedicated hardware.

#[allow(dead_code)] // it reads the gRPC address too, so starts its server itself
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use common::{Process, free_port, throttlecrab_binary};

const IN_FLIGHT: usize = 64;
const KEYS: u64 = 10_000;

const ENVOY_CONFIG: &str = "domain: bench\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1000000000\n";

fn start_tollgate(directory: &std::path::Path) -> (Process, String) {
    std::fs::write(directory.join("bench.yaml"), ENVOY_CONFIG).expect("write the config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
            "--envoy-config",
            "bench.yaml",
            "--recover-on-start",
            "false",
            "--log",
            "warn",
        ])
        .env("TOLLGATE_ADMIN_TOKEN", "bench")
        .current_dir(directory)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start tollgate serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut grpc = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("a line");
        if let Some(address) = line.strip_prefix("tollgate: envoy rate limit service (gRPC) on ") {
            grpc = Some(address.to_owned());
        }
        if line.starts_with("tollgate: listening on ") {
            break;
        }
    }
    let address = grpc.expect("the gRPC address");
    (Process(child), format!("http://{address}"))
}

fn start_throttlecrab(binary: &str) -> (Process, String) {
    let port = free_port();
    let child = Command::new(binary)
        .args([
            "--grpc",
            "--grpc-host",
            "127.0.0.1",
            "--grpc-port",
            &port.to_string(),
            "--log-level",
            "warn",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start throttlecrab-server");
    (Process(child), format!("http://127.0.0.1:{port}"))
}

async fn channel(url: &str) -> Channel {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Channel::from_shared(url.to_owned())
            .expect("a URI")
            .connect()
            .await
        {
            Ok(channel) => return channel,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("cannot connect to {url}: {error}"),
        }
    }
}

/// throttlecrab's messages, as its `proto/throttlecrab.proto` defines them.
#[derive(Clone, PartialEq, prost::Message)]
struct ThrottleRequest {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(int32, tag = "2")]
    max_burst: i32,
    #[prost(int32, tag = "3")]
    count_per_period: i32,
    #[prost(int32, tag = "4")]
    period: i32,
    #[prost(int32, tag = "5")]
    quantity: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ThrottleResponse {
    #[prost(bool, tag = "1")]
    allowed: bool,
}

/// Run `IN_FLIGHT` loops of `decide` for `seconds`; returns decisions per second. Every answer
/// must allow, or the comparison would be of unlike work.
async fn measure<F, Fut>(seconds: f64, decide: F) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let decide = Arc::new(decide);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let workers: Vec<_> = (0..IN_FLIGHT as u64)
        .map(|worker| {
            let (decide, done, stop) = (decide.clone(), done.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = worker;
                while !stop.load(Ordering::Relaxed) {
                    n = n
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    assert!(decide((n >> 33) % KEYS).await, "a decision did not allow");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.expect("a worker");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

async fn tollgate_round(url: &str, seconds: f64) -> f64 {
    let client = RateLimitServiceClient::new(channel(url).await);
    measure(seconds, move |key| {
        let mut client = client.clone();
        async move {
            let request = RateLimitRequest {
                domain: "bench".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "user".into(),
                        value: key.to_string(),
                    }],
                    ..RateLimitDescriptor::default()
                }],
                hits_addend: 1,
            };
            let answer = client
                .should_rate_limit(request)
                .await
                .expect("answered")
                .into_inner();
            answer.overall_code == Code::Ok as i32
        }
    })
    .await
}

async fn throttlecrab_round(url: &str, seconds: f64) -> f64 {
    let channel = channel(url).await;
    measure(seconds, move |key| {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        async move {
            grpc.ready().await.expect("ready");
            let request = ThrottleRequest {
                key: format!("user_{key}"),
                max_burst: 1_000_000_000,
                count_per_period: 1_000_000_000,
                period: 60,
                quantity: 1,
            };
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(
                "/throttlecrab.RateLimiter/Throttle",
            );
            let answer: tonic::Response<ThrottleResponse> = grpc
                .unary(
                    tonic::Request::new(request),
                    path,
                    tonic_prost::ProstCodec::default(),
                )
                .await
                .expect("answered");
            answer.into_inner().allowed
        }
    })
    .await
}

/// The floor: the same gRPC stack answering `OK` without deciding anything, served by this
/// bench binary started again as a child process. No server doing any work can beat it.
#[derive(Debug, Default)]
struct Floor;

#[tonic::async_trait]
impl envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService
    for Floor
{
    async fn should_rate_limit(
        &self,
        _request: tonic::Request<RateLimitRequest>,
    ) -> Result<
        tonic::Response<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse>,
        tonic::Status,
    > {
        Ok(tonic::Response::new(
            envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse {
                overall_code: Code::Ok as i32,
                ..Default::default()
            },
        ))
    }
}

/// `main` serves the floor when this is set (`common::start_floor`).
const FLOOR_VARIABLE: &str = "GRPC_FLOOR_SERVE";

fn serve_floor(address: &str) {
    let (address, runtime) = common::floor_runtime(address);
    runtime.block_on(async {
        tonic::transport::Server::builder()
            .add_service(
                envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer::new(Floor),
            )
            .serve(address)
            .await
            .expect("serve");
    });
}

fn main() {
    if let Ok(address) = std::env::var(FLOOR_VARIABLE) {
        serve_floor(&address);
        return;
    }
    let benching = std::env::args().any(|argument| argument == "--bench");
    let seconds: f64 = if benching {
        std::env::var("BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5.0)
    } else {
        0.3
    };
    let rounds: usize = if benching {
        std::env::var("BENCH_ROUNDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1)
    } else {
        1
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let throttlecrab = throttlecrab_binary();
    if throttlecrab.is_none() {
        eprintln!(
            "throttlecrab-server not found (THROTTLECRAB_SERVER or PATH): measuring Tollgate alone"
        );
    }
    runtime.block_on(async {
        for round in 1..=rounds {
            // A directory of its own each round: every start is a first start.
            let directory = tempfile::tempdir().expect("tempdir");
            let (tollgate, url) = start_tollgate(directory.path());
            let ours = tollgate_round(&url, seconds).await;
            drop(tollgate);
            println!("round {round}: tollgate ShouldRateLimit   {ours:>10.0} decisions/s");
            let (floor, url) = common::start_floor(FLOOR_VARIABLE);
            let empty = tollgate_round(&url, seconds).await;
            drop(floor);
            println!("round {round}: floor (gRPC, no decision)  {empty:>10.0} answers/s");
            if let Some(binary) = &throttlecrab {
                let (peer, url) = start_throttlecrab(binary);
                let theirs = throttlecrab_round(&url, seconds).await;
                drop(peer);
                println!("round {round}: throttlecrab Throttle      {theirs:>10.0} decisions/s");
                println!(
                    "round {round}: ratio tollgate / throttlecrab  {:.2}",
                    ours / theirs
                );
            }
        }
    });
}
