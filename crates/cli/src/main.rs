//! The `tollgate` binary: `serve` runs the server; `limits` manages a running server's limits
//! through its admin API; `acquire` runs a command under a permit.
//!
//! Configuration is read in two stages (as ripgrep does): raw values from the config file, the
//! environment (`TOLLGATE_*`) and flags, merged with flags winning over the environment and the
//! environment over the file; then resolved and validated into the server's `ServerConfig`.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};
use hyper::Method;
use serde::Deserialize;
use tollgate_api::data::{AcquireBody, CommitBody, Granted, RateLimited};
use tollgate_cli::client::{Answer, Client};
use tollgate_cli::kept_token;
use tollgate_cli::parse_duration;
use tollgate_rules::{PathCase, PathMatching, PathParams};
use tollgate_server::{
    DEFAULT_BODY_BYTES_MAX, DEFAULT_CONNECTIONS_MAX, DEFAULT_FORWARD_AUTH_IPV6_PREFIX_LEN,
    DEFAULT_HEADER_READ_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_KEYS_TRACKED_MAX,
    DEFAULT_LISTEN, DEFAULT_PATH_MATCHING, DEFAULT_PAUSE_MS_MAX, DEFAULT_REDIS_ALLOW_EVICTION,
    DEFAULT_REDIS_NAMESPACE, DEFAULT_RELOAD_INTERVAL_MS, DEFAULT_RULES_URL,
    DEFAULT_SHUTDOWN_GRACE_MS, DEFAULT_STORE_TIMEOUT_MS, DEFAULT_WAIT_MS_MAX, DEFAULT_WAITERS_MAX,
    DEFAULT_WAITERS_PER_LIMIT_MAX, RELOAD_INTERVAL_MS_MIN, ServerConfig, StoreChoice, parse_host,
    parse_origin, parse_permit_secret,
};

const DEFAULT_SERVER_URL: &str = "http://127.0.0.1:7070";
/// How long client commands wait for an answer beyond the acquire's own wait.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Exit code of `acquire` when nothing was granted within the wait (sysexits EX_TEMPFAIL).
const EXIT_NOT_GRANTED: u8 = 75;
/// Exit code of a client command whose server failed or could not be reached (EX_UNAVAILABLE).
const EXIT_SERVER_FAILED: u8 = 69;
/// Exit code of `acquire` when the command could not be started (as a shell does).
const EXIT_COMMAND_NOT_STARTED: u8 = 127;

#[derive(Parser, Debug)]
#[command(
    name = "tollgate",
    version,
    about = "Keep a fleet of programs inside the limits that APIs impose.",
    long_about = "Keep a fleet of programs inside the limits that APIs impose.\n\n\
        Start a server with `tollgate serve` (memory store, rules in ./tollgate.db, \
        127.0.0.1:7070), define a limit with `tollgate limits put`, and run work under it \
        with `tollgate acquire`.\n\n\
        Settings come from flags, then TOLLGATE_* environment variables, then the TOML file \
        given by --config (flags win). The admin token is read from TOLLGATE_ADMIN_TOKEN or \
        the config file's admin_token, never from a flag (flags show in `ps`). With neither, \
        a server on a SQLite rules file makes one on first start and keeps it beside the file \
        (tollgate.db.admin-token, mode 0600), where the commands on this machine find it.",
    after_help = "Example:\n  \
        tollgate serve &\n  \
        tollgate limits put vendor-x '{\"kind\":\"rate\",\"limit\":10,\"period_ms\":1000}'\n  \
        tollgate acquire vendor-x --wait 5s -- curl -s https://api.vendor-x.example/items\n\n\
        Exit codes:\n  \
        0    done (acquire: the command's own status, or 128 + the signal that ended it)\n  \
        1    refused: bad input, unknown limit, wrong token, or a failure to start serve\n  \
        2    usage: an unknown or missing argument\n  \
        69   the server failed or could not be reached\n  \
        70   simulate: a limit was overdrawn (a defect; please report it)\n  \
        75   acquire: no permit granted within --wait\n  \
        127  acquire: the command could not be started"
)]
struct Cli {
    /// TOML config file (see docs/server.md for its keys).
    #[arg(
        short,
        long,
        global = true,
        env = "TOLLGATE_CONFIG",
        value_name = "FILE"
    )]
    config: Option<PathBuf>,
    /// The server the client commands talk to (or the config file's `server`)
    /// [default: http://127.0.0.1:7070].
    #[arg(
        short,
        long,
        global = true,
        env = "TOLLGATE_SERVER",
        value_name = "URL"
    )]
    server: Option<String>,
    /// How the client commands print records: `table` for people, `json` for programs
    /// [default: table on a terminal, json when piped or redirected].
    #[arg(short, long, global = true, value_enum, value_name = "FORMAT")]
    output: Option<Output>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the server: HTTP API v1, admin API, /metrics, /healthz, /readyz.
    // Boxed: the server's settings are several times the size of any other command's.
    Serve(Box<ServeArgs>),
    /// List, show, create or replace, and delete limits on a running server (admin API).
    ///
    /// Exits 1 if the server refused the request, 69 if the server failed or could not be
    /// reached.
    Limits {
        #[command(subcommand)]
        action: LimitsAction,
    },
    /// Make, list and revoke scoped data tokens on a running server (admin API): data-plane
    /// tokens limited to some limits, a highest priority, and whether they may pause.
    ///
    /// Exits 1 if the server refused the request, 69 if the server failed or could not be
    /// reached.
    /// `create` always prints JSON: it holds the secret.
    Tokens {
        #[command(subcommand)]
        action: TokensAction,
    },
    /// A running server at a glance: each limit's usage now, pauses, waiters, grants and
    /// denials; the rules' reload state; the store.
    ///
    /// Exits 1 if the server refused the request, 69 if the server failed or could not be
    /// reached.
    Status {
        /// Only this limit.
        limit: Option<String>,
        /// For a limit counted per key: the key whose usage to show.
        #[arg(short, long, requires = "limit")]
        key: Option<String>,
    },
    /// Run a workload (limits and callers, TOML) through the real engine on a virtual clock, and
    /// report per caller offered, granted, timed out and waits, and per limit the most units in
    /// any window (never above the limit) and the utilisation while demand exceeds it.
    ///
    /// Exits 1 if the workload is refused, 70 if a limit was overdrawn (which would be a bug).
    Simulate {
        /// The workload file (see examples/workloads/).
        workload: PathBuf,
        /// Print the report as JSON (as `--output json` does; the report is for people
        /// otherwise, piped or not).
        #[arg(long)]
        json: bool,
        /// Also write an SVG chart: grants per window by priority against the limit, and waits.
        #[arg(long, value_name = "FILE.svg")]
        chart: Option<PathBuf>,
    },
    /// Print a completion script for SHELL: `tollgate completions bash > /etc/bash_completion.d/tollgate`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Run COMMAND under a permit of LIMIT, then commit it; exits with COMMAND's status.
    ///
    /// Exits 75 if no permit was granted within --wait, 69 if the server failed or could not
    /// be reached, 127 if COMMAND could not be started. Leases are renewed while COMMAND runs.
    /// COMMAND is run directly, not through a shell: use `-- sh -c '...'` for pipelines.
    /// SIGTERM and SIGHUP are passed on to COMMAND; the permit is committed once it has ended.
    Acquire(AcquireArgs),
}

/// The server a client command talks to, as `--server` (or `TOLLGATE_SERVER`) gave it.
#[derive(Debug)]
struct ServerArgs {
    server: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Json,
    Table,
}

#[derive(Subcommand, Debug)]
enum LimitsAction {
    /// All limits in force, and rows of the rules table that failed validation.
    List,
    /// One limit.
    Get { name: String },
    /// Create or replace a limit. RULE is JSON, `@FILE`, or `-` for standard input, e.g.
    /// '{"kind":"rate","limit":10,"period_ms":1000}' or
    /// '{"kind":"concurrency","limit":5,"lease_ttl_ms":30000}'.
    Put { name: String, rule: String },
    /// Delete a limit (and lift its pauses: a limit made again under the name starts unpaused).
    Delete { name: String },
    /// Lift a pause: the limit-wide one, or with --key that key's own. Grants resume at once,
    /// in every replica sharing the store.
    Resume {
        name: String,
        /// For a limit counted per key: the key whose pause to lift.
        #[arg(long)]
        key: Option<String>,
    },
    /// Make the server's limits those of a limits file (TOML or YAML, as `export` writes).
    ///
    /// Every limit in the file is validated first: one bad limit and nothing is written.
    /// Limits on the server that the file lacks are kept unless --prune is given.
    Apply {
        /// The limits file: `.toml`, `.yaml` or `.yml`.
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// Show what would change, and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Also delete the server's limits that the file does not name.
        #[arg(long)]
        prune: bool,
    },
    /// Check a limits file as `serve --rules file://FILE` would at start, without serving:
    /// every rejected entry as FILE:LINE: NAME: FIELD: REASON, and a non-zero exit.
    Check {
        /// The limits file: `.toml`, `.yaml` or `.yml`.
        file: PathBuf,
    },
    /// Print the limits in force as a limits file, for `apply` or `serve --rules file://`.
    Export {
        /// `toml` or `yaml`.
        #[arg(long, default_value = "toml", value_parser = tollgate_rules::FileFormat::parse)]
        format: tollgate_rules::FileFormat,
    },
}

#[derive(Subcommand, Debug)]
enum TokensAction {
    /// Make a token; prints it with its secret, which is shown this once (the server keeps
    /// only its hash).
    Create {
        /// The token's name, to list and revoke it by.
        name: String,
        /// A limit it may use: a name, a prefix ending in `*` (`vendor-*`), or `*` for all;
        /// repeat for more.
        #[arg(long = "limit", required = true, value_name = "LIMIT")]
        limits: Vec<String>,
        /// The highest priority it may ask for: high, normal or low [default: normal].
        #[arg(long, value_name = "PRIORITY")]
        priority_max: Option<String>,
        /// Let it pause its limits.
        #[arg(long)]
        may_pause: bool,
    },
    /// The tokens in force, without their secrets.
    List,
    /// Revoke a token: at once on this server, on other replicas within their reload interval.
    Delete { name: String },
}

#[derive(Args, Debug)]
struct AcquireArgs {
    /// The limits to take from (all or none).
    #[arg(required = true, value_name = "LIMIT")]
    limits: Vec<String>,
    /// Key, for limits counted per key (e.g. a user or account id).
    #[arg(short, long)]
    key: Option<String>,
    /// high, normal or low.
    #[arg(short, long, default_value = "normal")]
    priority: String,
    /// Units to take.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// How long to wait for a permit: 0, 500ms, 2s, 1m (capped by the server's wait_ms_max).
    #[arg(short, long, default_value = "0", value_parser = parse_duration)]
    wait: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:7070].
    #[arg(long, env = "TOLLGATE_LISTEN", value_name = "ADDR")]
    listen: Option<String>,
    /// `memory`, redis://HOST:PORT/DB, redis-cluster://HOST:PORT[,HOST:PORT...] or
    /// redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB] [default: memory].
    #[arg(long, env = "TOLLGATE_STORE", value_name = "STORE")]
    store: Option<String>,
    /// Rules: a database, sqlite://FILE, postgres://..., mysql://..., or a read-only limits
    /// file, file://limits.toml (or .yaml) [default: sqlite://tollgate.db].
    #[arg(long, env = "TOLLGATE_RULES", value_name = "URL")]
    rules: Option<String>,
    /// Database the server remembers its store in across restarts
    /// [default: the rules database; with a limits file, sqlite://tollgate.db].
    #[arg(long, env = "TOLLGATE_STATE", value_name = "URL")]
    state: Option<String>,
    /// Rules table name [default: tollgate_limits].
    #[arg(long, env = "TOLLGATE_RULES_TABLE", value_name = "NAME")]
    rules_table: Option<String>,
    /// How often to re-read the rules table, ms [default: 2000].
    #[arg(long, env = "TOLLGATE_RELOAD_INTERVAL_MS", value_name = "MS")]
    reload_interval_ms: Option<u64>,
    /// Longest wait honoured, ms [default: 60000].
    #[arg(long, env = "TOLLGATE_WAIT_MS_MAX", value_name = "MS")]
    wait_ms_max: Option<u64>,
    /// Largest request body, bytes [default: 65536].
    #[arg(long, env = "TOLLGATE_BODY_BYTES_MAX", value_name = "BYTES")]
    body_bytes_max: Option<u32>,
    /// Memory store: counters tracked at most, over every limit [default: 1000000].
    #[arg(long, env = "TOLLGATE_KEYS_TRACKED_MAX", value_name = "N")]
    keys_tracked_max: Option<u64>,
    /// Keys one limit counted per key may have counters of at once (memory store and Redis),
    /// unless its rule sets keys_max [default: a tenth of keys_tracked_max].
    #[arg(long, env = "TOLLGATE_KEYS_PER_LIMIT_MAX", value_name = "N")]
    keys_per_limit_max: Option<u64>,
    /// Longest pause, ms; longer ones are cut to it (at most 86400000, a day)
    /// [default: 3600000].
    #[arg(long, env = "TOLLGATE_PAUSE_MS_MAX", value_name = "MS")]
    pause_ms_max: Option<u64>,
    /// Memory store: after an unclean stop, put back each counter's last record with its
    /// budget held back, and hold concurrency limits until one lease TTL after the previous run
    /// last granted, since what it granted may still count
    /// [default: true].
    #[arg(long, env = "TOLLGATE_RECOVER_ON_START", value_name = "BOOL")]
    recover_on_start: Option<bool>,
    /// Time in-flight requests get to finish on shutdown, ms
    /// [default: 10000].
    #[arg(long, env = "TOLLGATE_SHUTDOWN_GRACE_MS", value_name = "MS")]
    shutdown_grace_ms: Option<u64>,
    /// Redis store: namespace of every key; replicas sharing a quota share it
    /// [default: tollgate].
    #[arg(long, env = "TOLLGATE_REDIS_NAMESPACE", value_name = "NAME")]
    redis_namespace: Option<String>,
    /// Redis store: grant when Redis is unreachable (fail-open) instead of answering
    /// store_unavailable [default: false].
    #[arg(long, env = "TOLLGATE_STORE_FAIL_OPEN", value_name = "BOOL")]
    store_fail_open: Option<bool>,
    /// Redis store: start on a Redis whose maxmemory-policy may evict Tollgate's keys (any
    /// but noeviction); every call then watches for evictions, and a counter missing after
    /// one is held for a period [default: false].
    #[arg(long, env = "TOLLGATE_REDIS_ALLOW_EVICTION", value_name = "BOOL")]
    redis_allow_eviction: Option<bool>,
    /// Redis store: time one operation may take, ms [default: 1000].
    #[arg(long, env = "TOLLGATE_STORE_TIMEOUT_MS", value_name = "MS")]
    store_timeout_ms: Option<u64>,
    /// Serve Envoy's rate limit service (gRPC ShouldRateLimit) on ADDR, e.g. 127.0.0.1:8081
    /// [default: off].
    #[arg(long, env = "TOLLGATE_GRPC_LISTEN", value_name = "ADDR")]
    grpc_listen: Option<String>,
    /// envoyproxy/ratelimit's YAML configuration for the gRPC service: a file, or a directory
    /// of *.yaml files (one domain each); re-read when it changes.
    #[arg(long, env = "TOLLGATE_ENVOY_CONFIG", value_name = "PATH")]
    envoy_config: Option<PathBuf>,
    /// How /v1/check reads paths, as the application's router does: `sensitive` (/Users is
    /// not /users) or `insensitive` [default: sensitive].
    #[arg(long, env = "TOLLGATE_PATH_CASE", value_name = "CASE")]
    path_case: Option<String>,
    /// How /v1/check reads `;` in a path segment, as the application's router does: `keep`
    /// (an ordinary character) or `strip` (it starts parameters, dropped: /a;v=1 is /a)
    /// [default: keep].
    #[arg(long, env = "TOLLGATE_PATH_PARAMS", value_name = "PARAMS")]
    path_params: Option<String>,
    /// /v1/forward-auth: the request header that names the user, set by the reverse proxy
    /// after its own authentication (e.g. X-User); without it, the client's address
    /// [default: none].
    #[arg(long, env = "TOLLGATE_FORWARD_AUTH_USER_HEADER", value_name = "NAME")]
    forward_auth_user_header: Option<String>,
    /// /v1/forward-auth: the proxies whose X-Forwarded-For is believed, comma-separated
    /// addresses or networks (127.0.0.1, 10.0.0.0/8) [default: none: the peer is the client].
    #[arg(
        long,
        env = "TOLLGATE_FORWARD_AUTH_TRUSTED_PROXIES",
        value_name = "CIDRS",
        value_delimiter = ','
    )]
    forward_auth_trusted_proxies: Option<Vec<String>>,
    /// /v1/forward-auth: bits of an IPv6 client's address that name one client, 32 to 128
    /// [default: 64].
    #[arg(
        long,
        env = "TOLLGATE_FORWARD_AUTH_IPV6_PREFIX_LEN",
        value_name = "BITS"
    )]
    forward_auth_ipv6_prefix_len: Option<u8>,
    /// Origins whose pages may call the API from a browser (CORS), comma-separated, e.g.
    /// https://app.example [default: none; the server's own dashboard always may].
    #[arg(
        long,
        env = "TOLLGATE_ALLOWED_ORIGINS",
        value_name = "ORIGINS",
        value_delimiter = ','
    )]
    allowed_origins: Option<Vec<String>>,
    /// Host names the server answers to besides localhost, 127.0.0.1 and [::1], comma-separated
    /// (`name` or `name:port`); against DNS rebinding [default: none].
    #[arg(
        long,
        env = "TOLLGATE_ALLOWED_HOSTS",
        value_name = "HOSTS",
        value_delimiter = ','
    )]
    allowed_hosts: Option<Vec<String>>,
    /// Time a client gets to send a request's head, and then its body, ms [default: 10000].
    #[arg(long, env = "TOLLGATE_HEADER_READ_TIMEOUT_MS", value_name = "MS")]
    header_read_timeout_ms: Option<u64>,
    /// An idle keep-alive connection is closed after this, ms [default: 120000].
    #[arg(long, env = "TOLLGATE_IDLE_TIMEOUT_MS", value_name = "MS")]
    idle_timeout_ms: Option<u64>,
    /// Open HTTP connections at most; lowered to what the open-file limit leaves
    /// [default: 4096].
    #[arg(long, env = "TOLLGATE_CONNECTIONS_MAX", value_name = "N")]
    connections_max: Option<usize>,
    /// Acquires waiting for room at once, over every limit; lowered to half the connections
    /// [default: 1024].
    #[arg(long, env = "TOLLGATE_WAITERS_MAX", value_name = "N")]
    waiters_max: Option<usize>,
    /// Acquires waiting for room at once on one limit [default: 256].
    #[arg(long, env = "TOLLGATE_WAITERS_PER_LIMIT_MAX", value_name = "N")]
    waiters_per_limit_max: Option<usize>,
    /// TLS on the HTTP and gRPC listeners: the certificate chain, a PEM file; give --tls-key
    /// too. Reloaded when the files change [default: off].
    #[arg(long, env = "TOLLGATE_TLS_CERT", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, a PEM file.
    #[arg(long, env = "TOLLGATE_TLS_KEY", value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Log filter, e.g. `info` or `warn,tollgate_server=debug` [default: info].
    #[arg(long, env = "TOLLGATE_LOG", value_name = "FILTER")]
    log: Option<String>,
    /// `text` or `json` [default: text].
    #[arg(long, env = "TOLLGATE_LOG_FORMAT", value_name = "FORMAT")]
    log_format: Option<String>,
}

/// The config file, as written. Unknown keys are refused, so a typo is not silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    store: Option<String>,
    rules: Option<String>,
    state: Option<String>,
    rules_table: Option<String>,
    reload_interval_ms: Option<u64>,
    admin_token: Option<String>,
    data_token: Option<String>,
    body_bytes_max: Option<u32>,
    wait_ms_max: Option<u64>,
    keys_tracked_max: Option<u64>,
    keys_per_limit_max: Option<u64>,
    pause_ms_max: Option<u64>,
    recover_on_start: Option<bool>,
    permit_secret: Option<String>,
    shutdown_grace_ms: Option<u64>,
    redis_namespace: Option<String>,
    store_fail_open: Option<bool>,
    redis_allow_eviction: Option<bool>,
    store_timeout_ms: Option<u64>,
    grpc_listen: Option<String>,
    envoy_config: Option<PathBuf>,
    path_case: Option<String>,
    path_params: Option<String>,
    forward_auth_user_header: Option<String>,
    forward_auth_trusted_proxies: Option<Vec<String>>,
    forward_auth_ipv6_prefix_len: Option<u8>,
    allowed_origins: Option<Vec<String>>,
    allowed_hosts: Option<Vec<String>>,
    header_read_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    connections_max: Option<usize>,
    waiters_max: Option<usize>,
    waiters_per_limit_max: Option<usize>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    log: Option<String>,
    log_format: Option<String>,
    /// For client commands: the server's URL.
    server: Option<String>,
}

fn read_file_config(path: Option<&Path>) -> Result<FileConfig> {
    let Some(path) = path else {
        return Ok(FileConfig::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
}

/// A token setting of `serve`: the environment's, else the config file's. One given empty is
/// refused rather than read as "none": an empty data token used to mean an open data plane.
fn token_setting(variable: &str, key: &str, from_file: Option<String>) -> Result<Option<String>> {
    match std::env::var(variable) {
        Ok(token) if token.trim().is_empty() => {
            bail!("{variable} is set but empty; give a token, or unset the variable")
        }
        Ok(token) => Ok(Some(token)),
        Err(std::env::VarError::NotUnicode(_)) => bail!("{variable} is not UTF-8"),
        Err(std::env::VarError::NotPresent) => match from_file {
            Some(token) if token.trim().is_empty() => {
                bail!("{key} in the config file is empty; give a token, or leave the key out")
            }
            token => Ok(token),
        },
    }
}

/// Each entry of a list setting as `parse` reads it, or an error naming the setting.
fn list_setting(
    key: &str,
    entries: Option<Vec<String>>,
    parse: fn(&str) -> std::result::Result<String, String>,
) -> Result<Vec<String>> {
    entries
        .unwrap_or_default()
        .iter()
        .filter(|entry| !entry.trim().is_empty())
        .map(|entry| parse(entry).map_err(|reason| anyhow!("{key}: {reason}")))
        .collect()
}

/// An environment variable that is set and not empty.
fn env_text(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

fn main() -> ExitCode {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let server_from_flag = matches
        .subcommand()
        .and_then(|(_, sub)| sub.value_source("server"))
        .or_else(|| matches.value_source("server"))
        == Some(clap::parser::ValueSource::CommandLine);
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tollgate: cannot start the async runtime: {error}");
            return ExitCode::from(EXIT_SERVER_FAILED);
        }
    };
    match runtime.block_on(run(cli, server_from_flag)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("tollgate: {}", said_once(&error));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes, each said once: a cause whose text an outer message already
/// carries (`"rules database: {0}"` over its source) is not repeated.
fn said_once(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

async fn run(cli: Cli, server_from_flag: bool) -> Result<ExitCode> {
    let file = read_file_config(cli.config.as_deref())?;
    let server = ServerArgs { server: cli.server };
    let output = cli.output.unwrap_or_else(|| {
        // Records for people on a terminal; for programs everywhere else.
        if std::io::stdout().is_terminal() {
            Output::Table
        } else {
            Output::Json
        }
    });
    match cli.command {
        Command::Serve(_) if server_from_flag => Err(anyhow!(
            "--server names the server the client commands talk to; serve listens on --listen"
        )),
        Command::Serve(args) => serve(*args, file).await,
        // Checking a file asks no server, so needs neither its address nor a token.
        Command::Limits {
            action: LimitsAction::Check { file: path },
            ..
        } => check_limits(&path).await,
        Command::Limits { action } => limits(server, output, action, file).await,
        Command::Acquire(args) => acquire(args, server, file).await,
        Command::Tokens { action } => tokens(server, output, action, file).await,
        Command::Status { limit, key } => status(server, limit, key, output, file).await,
        Command::Simulate {
            workload,
            json,
            chart,
        } => {
            let json = json || cli.output == Some(Output::Json);
            tokio::task::spawn_blocking(move || simulate(&workload, json, chart.as_deref()))
                .await
                .context("the simulation stopped")?
        }
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "tollgate", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
    }
}

mod limits_file;

// ---- serve ---------------------------------------------------------------------------------

fn resolve_server_config(
    args: ServeArgs,
    file: FileConfig,
) -> Result<(ServerConfig, String, String)> {
    let listen_text = args
        .listen
        .or(file.listen)
        .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
    let listen: SocketAddr = listen_text
        .parse()
        .map_err(|error| anyhow!("listen {listen_text:?}: {error} (e.g. 127.0.0.1:7070)"))?;
    let store_text = args
        .store
        .or(file.store)
        .unwrap_or_else(|| "memory".to_owned());
    let store = StoreChoice::parse(&store_text).map_err(|reason| anyhow!("store: {reason}"))?;
    let rules_url = args
        .rules
        .or(file.rules)
        .unwrap_or_else(|| DEFAULT_RULES_URL.to_owned());
    let rules_table = args
        .rules_table
        .or(file.rules_table)
        .unwrap_or_else(|| tollgate_rules::DEFAULT_TABLE.to_owned());
    tollgate_rules::check_table_name(&rules_table)
        .map_err(|reason| anyhow!("rules_table {rules_table:?}: {reason}"))?;
    let reload_interval_ms = args
        .reload_interval_ms
        .or(file.reload_interval_ms)
        .unwrap_or(DEFAULT_RELOAD_INTERVAL_MS);
    if reload_interval_ms < RELOAD_INTERVAL_MS_MIN {
        bail!("reload_interval_ms must be at least {RELOAD_INTERVAL_MS_MIN}");
    }
    let body_bytes_max = args
        .body_bytes_max
        .or(file.body_bytes_max)
        .unwrap_or(DEFAULT_BODY_BYTES_MAX);
    if body_bytes_max < 256 {
        bail!("body_bytes_max must be at least 256");
    }
    let grpc_listen = match args.grpc_listen.or(file.grpc_listen) {
        Some(text) => Some(
            text.parse::<SocketAddr>()
                .map_err(|error| anyhow!("grpc_listen {text:?}: {error} (e.g. 127.0.0.1:8081)"))?,
        ),
        None => None,
    };
    let envoy_config = args.envoy_config.or(file.envoy_config);
    let path_matching = PathMatching {
        case: match args.path_case.or(file.path_case) {
            Some(text) => {
                PathCase::parse(&text).map_err(|reason| anyhow!("path_case: {reason}"))?
            }
            None => DEFAULT_PATH_MATCHING.case,
        },
        params: match args.path_params.or(file.path_params) {
            Some(text) => {
                PathParams::parse(&text).map_err(|reason| anyhow!("path_params: {reason}"))?
            }
            None => DEFAULT_PATH_MATCHING.params,
        },
    };
    let keys_per_limit_max = args.keys_per_limit_max.or(file.keys_per_limit_max);
    if keys_per_limit_max == Some(0) {
        bail!("keys_per_limit_max must be at least 1");
    }
    let pause_ms_max = args
        .pause_ms_max
        .or(file.pause_ms_max)
        .unwrap_or(DEFAULT_PAUSE_MS_MAX);
    if !(1..=tollgate::PAUSE_MS_MAX).contains(&pause_ms_max) {
        bail!(
            "pause_ms_max must be between 1 and {} (a day)",
            tollgate::PAUSE_MS_MAX
        );
    }
    let permit_secret = match env_text("TOLLGATE_PERMIT_SECRET").or(file.permit_secret) {
        Some(text) => {
            Some(parse_permit_secret(&text).map_err(|reason| anyhow!("permit_secret: {reason}"))?)
        }
        None => None,
    };
    let config = ServerConfig {
        listen,
        store,
        rules_url,
        state_url: args.state.or(file.state),
        rules_table,
        reload_interval: Duration::from_millis(reload_interval_ms),
        admin_token: token_setting("TOLLGATE_ADMIN_TOKEN", "admin_token", file.admin_token)?,
        data_token: token_setting("TOLLGATE_DATA_TOKEN", "data_token", file.data_token)?,
        allowed_origins: list_setting(
            "allowed_origins",
            args.allowed_origins.or(file.allowed_origins),
            parse_origin,
        )?,
        allowed_hosts: list_setting(
            "allowed_hosts",
            args.allowed_hosts.or(file.allowed_hosts),
            parse_host,
        )?,
        header_read_timeout: Duration::from_millis(positive(
            "header_read_timeout_ms",
            args.header_read_timeout_ms
                .or(file.header_read_timeout_ms)
                .unwrap_or(DEFAULT_HEADER_READ_TIMEOUT_MS),
        )?),
        idle_timeout: Duration::from_millis(positive(
            "idle_timeout_ms",
            args.idle_timeout_ms
                .or(file.idle_timeout_ms)
                .unwrap_or(DEFAULT_IDLE_TIMEOUT_MS),
        )?),
        connections_max: positive(
            "connections_max",
            args.connections_max
                .or(file.connections_max)
                .unwrap_or(DEFAULT_CONNECTIONS_MAX),
        )?,
        waiters_max: args
            .waiters_max
            .or(file.waiters_max)
            .unwrap_or(DEFAULT_WAITERS_MAX),
        waiters_per_limit_max: args
            .waiters_per_limit_max
            .or(file.waiters_per_limit_max)
            .unwrap_or(DEFAULT_WAITERS_PER_LIMIT_MAX),
        body_bytes_max,
        wait_ms_max: args
            .wait_ms_max
            .or(file.wait_ms_max)
            .unwrap_or(DEFAULT_WAIT_MS_MAX),
        keys_tracked_max: args
            .keys_tracked_max
            .or(file.keys_tracked_max)
            .unwrap_or(DEFAULT_KEYS_TRACKED_MAX),
        keys_per_limit_max,
        pause_ms_max,
        recover_on_start: args
            .recover_on_start
            .or(file.recover_on_start)
            .unwrap_or(true),
        permit_secret,
        shutdown_grace: Duration::from_millis(
            args.shutdown_grace_ms
                .or(file.shutdown_grace_ms)
                .unwrap_or(DEFAULT_SHUTDOWN_GRACE_MS),
        ),
        redis_namespace: args
            .redis_namespace
            .or(file.redis_namespace)
            .unwrap_or_else(|| DEFAULT_REDIS_NAMESPACE.to_owned()),
        store_fail_open: args
            .store_fail_open
            .or(file.store_fail_open)
            .unwrap_or(false),
        redis_allow_eviction: args
            .redis_allow_eviction
            .or(file.redis_allow_eviction)
            .unwrap_or(DEFAULT_REDIS_ALLOW_EVICTION),
        store_timeout: Duration::from_millis(
            args.store_timeout_ms
                .or(file.store_timeout_ms)
                .unwrap_or(DEFAULT_STORE_TIMEOUT_MS),
        ),
        grpc_listen,
        envoy_config,
        path_matching,
        forward_auth_user_header: args
            .forward_auth_user_header
            .or(file.forward_auth_user_header)
            .filter(|name| !name.trim().is_empty()),
        forward_auth_trusted_proxies: args
            .forward_auth_trusted_proxies
            .or(file.forward_auth_trusted_proxies)
            .unwrap_or_default()
            .into_iter()
            .filter(|entry| !entry.trim().is_empty())
            .collect(),
        forward_auth_ipv6_prefix_len: args
            .forward_auth_ipv6_prefix_len
            .or(file.forward_auth_ipv6_prefix_len)
            .unwrap_or(DEFAULT_FORWARD_AUTH_IPV6_PREFIX_LEN),
        tls_cert: args.tls_cert.or(file.tls_cert),
        tls_key: args.tls_key.or(file.tls_key),
    };
    let log = args.log.or(file.log).unwrap_or_else(|| "info".to_owned());
    let log_format = args
        .log_format
        .or(file.log_format)
        .unwrap_or_else(|| "text".to_owned());
    Ok((config, log, log_format))
}

/// `value` of `key`, refused when zero (a timeout of zero, or room for no connection, would
/// stop the server from answering anything).
fn positive<T: PartialEq + Default>(key: &str, value: T) -> Result<T> {
    if value == T::default() {
        bail!("{key} must be above 0");
    }
    Ok(value)
}

fn init_logging(filter: &str, format: &str) -> Result<()> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let targets: tracing_subscriber::filter::Targets = filter
        .parse()
        .map_err(|error| anyhow!("log filter {filter:?}: {error}"))?;
    let registry = tracing_subscriber::registry().with(targets);
    match format {
        "text" => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_writer(std::io::stderr),
            )
            .try_init()?,
        "json" => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init()?,
        other => bail!("log_format must be text or json, got {other:?}"),
    }
    Ok(())
}

/// Waits for SIGINT or SIGTERM. The handlers are installed when this is called, not when the
/// future is first polled: a signal sent as soon as the server says it listens must stop it
/// gracefully, not kill it by the default action.
fn shutdown_signal() -> Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        // Every ordinary stop is a clean one: a closed terminal (SIGHUP) or Ctrl-\ (SIGQUIT)
        // saves the counters like SIGTERM, rather than dying and leaving the next start to
        // hold every limit as after a crash. Rules reload by themselves, so SIGHUP has no
        // reload to ask for.
        let mut stops = Vec::new();
        for (kind, name) in [
            (SignalKind::interrupt(), "SIGINT"),
            (SignalKind::terminate(), "SIGTERM"),
            (SignalKind::hangup(), "SIGHUP"),
            (SignalKind::quit(), "SIGQUIT"),
        ] {
            let stream = signal(kind).with_context(|| format!("installing {name} handler"))?;
            stops.push((stream, name));
        }
        Ok(async move {
            let received = std::future::poll_fn(|context| {
                for (stream, name) in &mut stops {
                    if stream.poll_recv(context).is_ready() {
                        return std::task::Poll::Ready(*name);
                    }
                }
                std::task::Poll::Pending
            })
            .await;
            tracing::info!(signal = received, "stop signal received");
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

async fn serve(args: ServeArgs, file: FileConfig) -> Result<ExitCode> {
    let (mut config, log, log_format) = resolve_server_config(args, file)?;
    init_logging(&log, &log_format)?;
    let mut kept = None;
    if config.admin_token.is_none()
        && let Some(path) = admin_token_path(config.state_url())
    {
        let token = kept_token::read_or_make(&path)?;
        config.admin_token = Some(token.token.clone());
        tracing::info!(
            path = %path.display(),
            "admin token kept in this file (mode 0600); tollgate commands on this machine read it"
        );
        kept = Some((path, token));
    }
    tracing::info!(?config, "starting");
    let scheme = if config.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    tollgate_server::run(config, shutdown_signal()?, move |address, grpc| {
        // The commands send the kept token to this address alone.
        if let Some((path, token)) = &kept {
            if let Err(error) = kept_token::record_listen(path, token, address) {
                tracing::warn!(%error, "could not record where this server listens beside its admin token");
            }
            // And where this user's commands look from any directory.
            match kept_token::record_user_copy(token, address) {
                Ok(copy) => tracing::info!(
                    path = %copy.display(),
                    "admin token kept for this user's commands in any directory (mode 0600)"
                ),
                Err(error) => tracing::warn!(%error, "could not keep a copy of the admin token for this user's commands"),
            }
        }
        // Stable lines on standard output for scripts (and tests) that start on port 0.
        if let Some(grpc) = grpc {
            println!("tollgate: envoy rate limit service (gRPC) on {grpc}");
        }
        println!("tollgate: listening on {scheme}://{address}");
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

// ---- client commands -----------------------------------------------------------------------

/// Where a server whose state is in a SQLite file keeps the admin token it made: beside the
/// file.
fn admin_token_path(state_url: &str) -> Option<PathBuf> {
    let file = state_url.strip_prefix("sqlite://")?;
    let file = file.split('?').next().unwrap_or(file);
    if file.is_empty() || file == ":memory:" {
        return None;
    }
    Some(PathBuf::from(format!("{file}.admin-token")))
}

/// The admin token for a command talking to `server_url`: the environment's, the config
/// file's, or one a local server keeps (beside its SQLite state file, else in this user's copy
/// for its port), which is sent only to the server that wrote it. Also where it looked, for a
/// 401's hint.
fn admin_token(file: &FileConfig, server_url: &str) -> Result<(Option<String>, String)> {
    if let Some(token) = env_text("TOLLGATE_ADMIN_TOKEN").or_else(|| file.admin_token.clone()) {
        return Ok((
            Some(token),
            "TOLLGATE_ADMIN_TOKEN or the config file's admin_token".into(),
        ));
    }
    let rules = env_text("TOLLGATE_RULES")
        .or_else(|| file.rules.clone())
        .unwrap_or_else(|| DEFAULT_RULES_URL.to_owned());
    let state = match env_text("TOLLGATE_STATE").or_else(|| file.state.clone()) {
        Some(state) => state,
        None if rules.starts_with("file://") => DEFAULT_RULES_URL.to_owned(),
        None => rules,
    };
    let port = kept_token::url_port(server_url);
    let places: Vec<PathBuf> = admin_token_path(&state)
        .into_iter()
        .chain(port.and_then(kept_token::user_copy_path))
        .collect();
    let looked = std::iter::once("TOLLGATE_ADMIN_TOKEN, the config file's admin_token".to_owned())
        .chain(places.iter().map(|path| path.display().to_string()))
        .collect::<Vec<_>>()
        .join(", ");
    let mut foreign = None;
    for path in &places {
        match kept_token::read(path)? {
            Some(kept) if kept.belongs_to(server_url) => {
                return Ok((Some(kept.token), path.display().to_string()));
            }
            Some(kept) => foreign = foreign.or(Some((path, kept))),
            None => {}
        }
    }
    if let Some((path, kept)) = foreign {
        let written_by = kept.listen.map_or_else(
            || "a server that has not listened yet".to_owned(),
            |listen| format!("the server listening on {listen}"),
        );
        eprintln!(
            "tollgate: not sending the admin token kept in {} to {server_url}: it was made \
             by {written_by}; give TOLLGATE_ADMIN_TOKEN for another server",
            path.display()
        );
    }
    Ok((None, looked))
}

/// After a 401 from an admin command: where the token sent (or none) came from.
fn hint_unauthorized(code: ExitCode, sent: bool, looked: &str) -> ExitCode {
    if sent {
        eprintln!("tollgate: the admin token sent came from {looked}; it is not this server's");
    } else {
        eprintln!("tollgate: no admin token found; looked in {looked}");
    }
    code
}

/// The server a command talks to: `--server`, the config file's, or the local default.
fn server_url(server: &ServerArgs, file: &FileConfig) -> String {
    server
        .server
        .clone()
        .or_else(|| file.server.clone())
        .unwrap_or_else(|| DEFAULT_SERVER_URL.to_owned())
}

fn client(
    server: ServerArgs,
    file: &FileConfig,
    token: Option<String>,
    timeout: Duration,
) -> Result<Client> {
    Ok(Client::new(&server_url(&server, file), token, timeout)?)
}

/// The successful answer of a client command's request, or the exit code it ends with: 69 for
/// a server that cannot be reached (as for `acquire`: try again later, not a usage error), or
/// the error answer's code.
fn succeeded(
    sent: std::result::Result<Answer, tollgate_cli::client::ClientError>,
) -> std::result::Result<Answer, ExitCode> {
    match sent {
        Ok(answer) if answer.status.is_success() => Ok(answer),
        Ok(answer) => Err(report_error(&answer)),
        Err(error) => {
            eprintln!("tollgate: {error}");
            Err(ExitCode::from(EXIT_SERVER_FAILED))
        }
    }
}

/// `succeeded` for an admin command, saying after a 401 where the token came from.
fn admin_succeeded(
    sent: std::result::Result<Answer, tollgate_cli::client::ClientError>,
    had_token: bool,
    looked: &str,
) -> std::result::Result<Answer, ExitCode> {
    let unauthorized = matches!(&sent, Ok(answer) if answer.status.as_u16() == 401);
    succeeded(sent).map_err(|code| {
        if unauthorized {
            hint_unauthorized(code, had_token, looked)
        } else {
            code
        }
    })
}

/// Print an error answer; returns the exit code for it.
fn report_error(answer: &Answer) -> ExitCode {
    let code = answer.error_code().unwrap_or("unknown");
    let message = answer
        .error_message()
        .map_or_else(|| answer.text(), str::to_owned);
    eprintln!("tollgate: {} {code}: {message}", answer.status.as_u16());
    if answer.status.is_server_error() {
        ExitCode::from(EXIT_SERVER_FAILED)
    } else {
        ExitCode::FAILURE
    }
}

fn print_json(answer: &Answer) -> Result<()> {
    match &answer.json {
        Some(json) => println!("{}", serde_json::to_string_pretty(json)?),
        None => println!("{}", answer.text()),
    }
    Ok(())
}

fn read_rule(rule: &str) -> Result<serde_json::Value> {
    let text = if rule == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the rule from standard input")?
    } else if let Some(path) = rule.strip_prefix('@') {
        std::fs::read_to_string(path).with_context(|| format!("reading the rule from {path}"))?
    } else {
        rule.to_owned()
    };
    serde_json::from_str(&text).context("the rule is not valid JSON")
}

/// A path segment: limit names are validated by the server; encode anything that would change
/// the path's meaning.
pub(crate) fn segment(name: &str) -> String {
    let mut encoded = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b':' | b'-') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

async fn limits(
    server: ServerArgs,
    output: Output,
    action: LimitsAction,
    file: FileConfig,
) -> Result<ExitCode> {
    let (token, looked) = admin_token(&file, &server_url(&server, &file))?;
    let had_token = token.is_some();
    let client = client(server, &file, token, CLIENT_TIMEOUT)?;
    let sent = match &action {
        LimitsAction::Apply {
            file,
            dry_run,
            prune,
        } => return apply(&client, file, *dry_run, *prune).await,
        LimitsAction::List | LimitsAction::Export { .. } => {
            client.send(Method::GET, "/v1/limits", None).await
        }
        // Dispatched before a server is looked for (`run`).
        LimitsAction::Check { file } => return check_limits(file).await,
        LimitsAction::Get { name } => {
            client
                .send(Method::GET, &format!("/v1/limits/{}", segment(name)), None)
                .await
        }
        LimitsAction::Put { name, rule } => {
            let body = read_rule(rule)?;
            client
                .send(
                    Method::PUT,
                    &format!("/v1/limits/{}", segment(name)),
                    Some(&body),
                )
                .await
        }
        LimitsAction::Delete { name } => {
            client
                .send(
                    Method::DELETE,
                    &format!("/v1/limits/{}", segment(name)),
                    None,
                )
                .await
        }
        LimitsAction::Resume { name, key } => {
            let mut path = format!("/v1/limits/{}/pause", segment(name));
            if let Some(key) = key {
                path.push_str(&format!("?key={}", segment(key)));
            }
            client.send(Method::DELETE, &path, None).await
        }
    };
    let answer = match admin_succeeded(sent, had_token, &looked) {
        Ok(answer) => answer,
        Err(code) => return Ok(code),
    };
    if let LimitsAction::Export { format } = action {
        let (text, rejected) = limits_file::export(&answer, format)?;
        print!("{text}");
        if rejected > 0 {
            eprintln!(
                "tollgate: {rejected} rejected row(s) are not in force and not exported; \
                 `tollgate limits list` shows them"
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Records (a list, a limit) follow --output; the answer to a change is its JSON.
    let records = matches!(action, LimitsAction::List | LimitsAction::Get { .. });
    match (output, &answer.json) {
        (Output::Table, Some(json)) if records => print!("{}", limits_table(json)),
        _ => print_json(&answer)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `tokens`: the admin API's `/v1/tokens`, with the admin token `limits` uses.
async fn tokens(
    server: ServerArgs,
    output: Output,
    action: TokensAction,
    file: FileConfig,
) -> Result<ExitCode> {
    let (token, looked) = admin_token(&file, &server_url(&server, &file))?;
    let had_token = token.is_some();
    let client = client(server, &file, token, CLIENT_TIMEOUT)?;
    let sent = match &action {
        TokensAction::Create {
            name,
            limits,
            priority_max,
            may_pause,
        } => {
            let mut body = serde_json::json!({
                "name": name,
                "limits": limits,
                "may_pause": may_pause,
            });
            if let (Some(priority_max), Some(object)) = (priority_max, body.as_object_mut()) {
                object.insert("priority_max".into(), priority_max.clone().into());
            }
            client.send(Method::POST, "/v1/tokens", Some(&body)).await
        }
        TokensAction::List => client.send(Method::GET, "/v1/tokens", None).await,
        TokensAction::Delete { name } => {
            client
                .send(
                    Method::DELETE,
                    &format!("/v1/tokens/{}", segment(name)),
                    None,
                )
                .await
        }
    };
    let answer = match admin_succeeded(sent, had_token, &looked) {
        Ok(answer) => answer,
        Err(code) => return Ok(code),
    };
    match (&action, output, &answer.json) {
        (TokensAction::List, Output::Table, Some(json)) => print!("{}", tokens_table(json)),
        _ => print_json(&answer)?,
    }
    if let TokensAction::Create { .. } = action {
        eprintln!(
            "tollgate: the secret is shown once: the server keeps only its hash; give it to the \
             caller as its data token"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Tokens as a table, one a line.
fn tokens_table(json: &serde_json::Value) -> String {
    use serde_json::Value;
    let mut rows = vec![["NAME", "LIMITS", "PRIORITY_MAX", "MAY_PAUSE"].map(str::to_owned)];
    let tokens = json.get("tokens").and_then(Value::as_array);
    for token in tokens.into_iter().flatten() {
        let text = |field: &str| token.get(field).and_then(Value::as_str).unwrap_or("-");
        let limits: Vec<&str> = token
            .get("limits")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let may_pause = token.get("may_pause").and_then(Value::as_bool) == Some(true);
        rows.push([
            text("name").to_owned(),
            limits.join(","),
            text("priority_max").to_owned(),
            if may_pause { "yes" } else { "no" }.to_owned(),
        ]);
    }
    status::columns(&rows)
}

/// `limits check`: a summary and success, or every rejected entry (the error) and failure.
async fn check_limits(path: &Path) -> Result<ExitCode> {
    print!("{}", limits_file::check(path).await?);
    Ok(ExitCode::SUCCESS)
}

/// `limits apply`: validate the whole file, compare it with the limits in force, show the
/// difference, and (unless a dry run) make it so.
async fn apply(client: &Client, path: &Path, dry_run: bool, prune: bool) -> Result<ExitCode> {
    let wanted = limits_file::read_limits_file(path).await?;
    let answer = match succeeded(client.send(Method::GET, "/v1/limits", None).await) {
        Ok(answer) => answer,
        Err(code) => return Ok(code),
    };
    let plan = limits_file::plan(&wanted, &limits_file::limits_in_force(&answer)?);
    print!("{}", limits_file::describe(&plan, prune));
    if dry_run || plan.is_empty(prune) {
        return Ok(ExitCode::SUCCESS);
    }
    match limits_file::carry_out(client, &plan, prune).await {
        Ok(None) => Ok(ExitCode::SUCCESS),
        Ok(Some(refused)) => Ok(report_error(&refused)),
        Err(error) => {
            eprintln!("tollgate: {error}");
            Ok(ExitCode::from(EXIT_SERVER_FAILED))
        }
    }
}

/// Limits as a table, one a line, and the rows of the rules table that are not in force.
fn limits_table(json: &serde_json::Value) -> String {
    use serde_json::Value;
    let text = |value: Option<&Value>| match value {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Null) | None => "-".to_owned(),
        Some(other) => other.to_string(),
    };
    let limits: Vec<&Value> = match json.get("limits") {
        Some(Value::Array(limits)) => limits.iter().collect(),
        _ => vec![json],
    };
    let mut rows = vec![
        [
            "NAME",
            "KIND",
            "LIMIT",
            "PERIOD_MS",
            "LEASE_TTL_MS",
            "ALGORITHM",
            "PER",
            "MATCH",
        ]
        .map(str::to_owned),
    ];
    for limit in limits {
        let matched = limit
            .get("match")
            .map(|m| format!("{} {}", text(m.get("method")), text(m.get("path"))));
        rows.push([
            text(limit.get("name")),
            text(limit.get("kind")),
            text(limit.get("limit")),
            text(limit.get("period_ms")),
            text(limit.get("lease_ttl_ms")),
            text(limit.get("algorithm")),
            text(limit.get("per")),
            matched.unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    let mut table = status::columns(&rows);
    if let Some(Value::Array(rejected)) = json.get("rejected")
        && !rejected.is_empty()
    {
        table.push_str("\nrejected rows (not in force as written):\n");
        for row in rejected {
            let line = format!(
                "{} {}: {}\n",
                text(row.get("name")),
                text(row.get("column")),
                text(row.get("reason"))
            );
            table.push_str(&line);
        }
    }
    table
}

mod status;

/// Exit code of `simulate` when a limit was overdrawn (EX_SOFTWARE): a defect, never a workload's
/// fault.
const EXIT_OVERDRAWN: u8 = 70;

/// `simulate`, on a runtime of its own whose clock is paused: time moves only when every task
/// waits, straight to the next timer, so simulated hours take seconds.
fn simulate(path: &Path, json: bool, chart: Option<&Path>) -> Result<ExitCode> {
    use std::io::Write;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the workload {}", path.display()))?;
    let workload = tollgate_cli::simulate::parse(&text)
        .with_context(|| format!("workload {}", path.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let report = runtime.block_on(tollgate_cli::simulate::run(&workload, move |done| {
        if terminal {
            let filled = (done * 40.0) as usize;
            eprint!(
                "\rsimulating [{}{}] {:>3.0} %",
                "#".repeat(filled),
                " ".repeat(40 - filled),
                done * 100.0
            );
            let _ = std::io::stderr().flush();
        }
    }))?;
    if terminal {
        eprintln!();
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", tollgate_cli::simulate::table(&report));
    }
    if let Some(chart) = chart {
        std::fs::write(chart, tollgate_cli::simulate::chart(&report))
            .with_context(|| format!("writing the chart {}", chart.display()))?;
    }
    let overdrawn = report.overshoots();
    if !overdrawn.is_empty() {
        for limit in overdrawn {
            eprintln!(
                "tollgate: limit {} was overdrawn: {} units in one window, limit {}",
                limit.name, limit.max_in_window, limit.limit
            );
        }
        return Ok(ExitCode::from(EXIT_OVERDRAWN));
    }
    Ok(ExitCode::SUCCESS)
}

async fn status(
    server: ServerArgs,
    limit: Option<String>,
    key: Option<String>,
    output: Output,
    file: FileConfig,
) -> Result<ExitCode> {
    let token = env_text("TOLLGATE_DATA_TOKEN").or_else(|| file.data_token.clone());
    let client = client(server, &file, token, CLIENT_TIMEOUT)?;
    let mut path = "/v1/stats".to_owned();
    if let Some(limit) = &limit {
        path.push_str(&format!("?limit={}", segment(limit)));
        if let Some(key) = &key {
            path.push_str(&format!("&key={}", segment(key)));
        }
    }
    let answer = match succeeded(client.send(Method::GET, &path, None).await) {
        Ok(answer) => answer,
        Err(code) => return Ok(code),
    };
    let stats = answer
        .json
        .clone()
        .and_then(|json| serde_json::from_value(json).ok());
    match (output, stats) {
        (Output::Table, Some(stats)) => print!("{}", status::table(&stats)),
        _ => print_json(&answer)?,
    }
    Ok(ExitCode::SUCCESS)
}

async fn acquire(args: AcquireArgs, server: ServerArgs, file: FileConfig) -> Result<ExitCode> {
    let token = env_text("TOLLGATE_DATA_TOKEN").or_else(|| file.data_token.clone());
    let client = client(server, &file, token, CLIENT_TIMEOUT + args.wait)?;
    let wait_ms = u64::try_from(args.wait.as_millis()).unwrap_or(u64::MAX);
    let body = serde_json::to_value(AcquireBody {
        limits: args.limits.clone(),
        key: args.key.clone(),
        cost: Some(args.cost),
        priority: Some(args.priority.clone()),
        wait_ms: Some(wait_ms),
    })?;
    let answer = match client.send(Method::POST, "/v1/acquire", Some(&body)).await {
        Ok(answer) => answer,
        Err(error) => {
            eprintln!("tollgate: {error}");
            return Ok(ExitCode::from(EXIT_SERVER_FAILED));
        }
    };
    if answer.status.as_u16() == 429 {
        let denied = answer
            .json
            .clone()
            .and_then(|json| serde_json::from_value::<RateLimited>(json).ok());
        let retry = denied.as_ref().map_or(0, |denied| denied.retry_after_ms);
        let why = denied.map_or("the limit is used up", |denied| denied.reason.0.meaning());
        eprintln!(
            "tollgate: not granted within {}: {why}; retry in {}",
            tollgate_server::human_duration(args.wait),
            tollgate_server::human_duration(Duration::from_millis(retry))
        );
        return Ok(ExitCode::from(EXIT_NOT_GRANTED));
    }
    if !answer.status.is_success() {
        let code = report_error(&answer);
        return Ok(if answer.status.is_server_error() {
            code
        } else {
            ExitCode::FAILURE
        });
    }
    let grant: Granted = answer
        .json
        .clone()
        .and_then(|json| serde_json::from_value(json).ok())
        .ok_or_else(|| anyhow!("the server's grant is not a grant: {:?}", answer.json))?;
    let permit = grant.permit;
    // Renew leases at a third of their lifetime, so two missed renewals still leave time.
    let lease_ms = grant
        .limits
        .iter()
        .filter_map(|limit| limit.expires_ms)
        .min();
    let renewer = lease_ms.map(|lease_ms| {
        let client = client.clone();
        let permit = permit.clone();
        tokio::spawn(async move {
            let period = Duration::from_millis((lease_ms / 3).max(10));
            loop {
                tokio::time::sleep(period).await;
                let path = format!("/v1/permits/{permit}/renew");
                match client.send(Method::POST, &path, None).await {
                    Ok(answer) if answer.status.is_success() => {}
                    Ok(answer) => {
                        eprintln!(
                            "tollgate: lease renewal refused: {}",
                            answer.error_message().unwrap_or_default()
                        );
                        break;
                    }
                    Err(error) => eprintln!("tollgate: lease renewal failed: {error}"),
                }
            }
        })
    });
    let (program, arguments) = args
        .command
        .split_first()
        .ok_or_else(|| anyhow!("no command given after --"))?;
    let status = run_command(program, arguments).await?;
    if let Some(renewer) = renewer {
        renewer.abort();
    }
    // A command that never started made no call: refund everything. Otherwise the units were
    // (or may have been) used.
    let used = if status.is_some() { args.cost } else { 0 };
    let commit = client
        .send(
            Method::POST,
            &format!("/v1/permits/{permit}/commit"),
            Some(&serde_json::to_value(CommitBody { used: Some(used) })?),
        )
        .await;
    match commit {
        Ok(answer) if answer.status.is_success() => {}
        Ok(answer) => {
            report_error(&answer);
        }
        Err(error) => eprintln!("tollgate: commit failed: {error}"),
    }
    let code = match status {
        None => EXIT_COMMAND_NOT_STARTED,
        Some(Ok(status)) => exit_code_of(status),
        Some(Err(error)) => {
            eprintln!("tollgate: waiting for {program:?}: {error}");
            1
        }
    };
    Ok(ExitCode::from(code))
}

/// Runs `acquire`'s command to its end; `None` when it could not start. `tollgate` outlives the
/// signals that would otherwise stop it first, and commits only once the command has stopped
/// calling: had it died, an orphaned command would go on calling while its lease ran out and
/// was granted to another. SIGTERM and SIGHUP, which a supervisor or `kill` sends to this
/// process alone, are passed on to the command; Ctrl-C's SIGINT has reached it already through
/// the terminal's process group.
#[cfg(unix)]
async fn run_command(
    program: &str,
    arguments: &[String],
) -> Result<Option<std::io::Result<std::process::ExitStatus>>> {
    use rustix::process::{Pid, Signal, kill_process};
    use tokio::signal::unix::{SignalKind, signal};
    // Installed before the command starts, so no signal meets the default action (death).
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
    let Some(mut child) = spawn_command(program, arguments) else {
        return Ok(None);
    };
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(Pid::from_raw);
    loop {
        // Biased: a command that has ended is reaped first, so a signal is never passed to its
        // pid after the system could have given that pid to another process.
        let pass_on = tokio::select! {
            biased;
            status = child.wait() => return Ok(Some(status)),
            _ = terminate.recv() => Signal::TERM,
            _ = hangup.recv() => Signal::HUP,
            _ = interrupt.recv() => continue,
        };
        if let Some(pid) = pid {
            // It may have ended since: then there is nobody left to tell.
            let _ = kill_process(pid, pass_on);
        }
    }
}

#[cfg(not(unix))]
async fn run_command(
    program: &str,
    arguments: &[String],
) -> Result<Option<std::io::Result<std::process::ExitStatus>>> {
    let Some(mut child) = spawn_command(program, arguments) else {
        return Ok(None);
    };
    // Ctrl-C reaches the command too; stay alive to commit.
    loop {
        tokio::select! {
            status = child.wait() => return Ok(Some(status)),
            _ = tokio::signal::ctrl_c() => {}
        }
    }
}

/// What `acquire`'s command never inherits: the credentials `tollgate` itself was given.
const SECRET_VARIABLES: [&str; 3] = [
    "TOLLGATE_ADMIN_TOKEN",
    "TOLLGATE_DATA_TOKEN",
    "TOLLGATE_PERMIT_SECRET",
];

/// Starts `acquire`'s command, or says why it could not. The command runs under a permit; it
/// is not trusted with the credentials that grant permits or change limits.
fn spawn_command(program: &str, arguments: &[String]) -> Option<tokio::process::Child> {
    let mut command = tokio::process::Command::new(program);
    for name in SECRET_VARIABLES {
        command.env_remove(name);
    }
    command
        .args(arguments)
        .spawn()
        .inspect_err(|error| eprintln!("tollgate: cannot run {program:?}: {error}"))
        .ok()
}

/// The command's exit code, or 128 + the signal that ended it, as shells report.
fn exit_code_of(status: std::process::ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return u8::try_from((128 + signal) & 0xff).unwrap_or(1);
        }
    }
    1
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The fields serde reads for `T`: what `deserialize_struct` is told, taken before any
    /// value is read.
    fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
        struct Fields<'a>(&'a mut &'static [&'static str]);

        impl<'de> serde::Deserializer<'de> for Fields<'_> {
            type Error = serde::de::value::Error;

            fn deserialize_any<V: serde::de::Visitor<'de>>(
                self,
                _: V,
            ) -> Result<V::Value, Self::Error> {
                Err(serde::de::Error::custom("not a struct"))
            }

            fn deserialize_struct<V: serde::de::Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Self::Error> {
                *self.0 = fields;
                Err(serde::de::Error::custom("fields taken"))
            }

            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
                byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
                identifier ignored_any
            }
        }

        let mut fields: &'static [&'static str] = &[];
        let _ = T::deserialize(Fields(&mut fields));
        fields
    }

    /// One row of the configuration table: file key, environment variable, flag (if any).
    type Setting = (String, String, Option<String>);

    /// Every setting as the code reads it: each key of the config file, the flag of that name
    /// (on `serve`, or global) with its environment variable, or, for a secret, the variable
    /// alone (flags show in `ps`).
    fn settings_in_the_code() -> BTreeSet<Setting> {
        let command = <Cli as clap::CommandFactory>::command();
        let serve = command
            .find_subcommand("serve")
            .expect("a serve subcommand");
        let flags: Vec<&clap::Arg> = command
            .get_arguments()
            .chain(serve.get_arguments())
            .collect();
        let keys = fields_of::<FileConfig>();
        for flag in serve.get_arguments() {
            assert!(
                keys.contains(&flag.get_id().as_str()),
                "serve --{} has no key in the config file",
                flag.get_id()
            );
        }
        keys.iter()
            .map(|key| {
                let variable = format!("TOLLGATE_{}", key.to_uppercase());
                match flags.iter().find(|flag| flag.get_id() == *key) {
                    Some(flag) => {
                        let long = flag.get_long().expect("a long flag");
                        let env = flag.get_env().expect("an environment variable");
                        assert_eq!(env.to_str(), Some(variable.as_str()), "--{long}");
                        (key.to_string(), variable, Some(format!("--{long}")))
                    }
                    None => {
                        assert!(
                            SECRET_VARIABLES.contains(&variable.as_str()),
                            "config file key {key} has neither a flag nor a secret's variable"
                        );
                        (key.to_string(), variable, None)
                    }
                }
            })
            .collect()
    }

    /// The configuration table of the server's guide, row by row.
    fn settings_in_the_guide() -> BTreeSet<Setting> {
        let guide = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/server.md"),
        )
        .expect("docs/server.md");
        let section = guide
            .split("\n## Configuration\n")
            .nth(1)
            .expect("a section \"## Configuration\" in docs/server.md");
        let section = section.split("\n## ").next().unwrap_or(section);
        let code = |cell: &str| cell.trim().trim_matches('`').to_owned();
        section
            .lines()
            .filter(|line| line.starts_with("| `"))
            .map(|row| {
                let cells: Vec<&str> = row.split('|').skip(1).collect();
                let flag = Some(code(cells[2])).filter(|flag| flag != "—");
                (code(cells[0]), code(cells[1]), flag)
            })
            .collect()
    }

    /// The guide's table names exactly the settings the binary reads, each with its variable
    /// and flag; and the example file shows every key. A setting added, renamed or dropped in
    /// the code fails here until both say so.
    #[test]
    fn the_guide_and_the_example_name_every_setting_and_only_those() {
        let code = settings_in_the_code();
        let guide = settings_in_the_guide();
        let undocumented: Vec<_> = code.difference(&guide).collect();
        let unknown: Vec<_> = guide.difference(&code).collect();
        assert!(
            undocumented.is_empty() && unknown.is_empty(),
            "read by the binary but not in docs/server.md's configuration table: \
             {undocumented:?}; in the table but not read so: {unknown:?}"
        );
        let example = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tollgate.toml"),
        )
        .expect("examples/tollgate.toml");
        for (key, ..) in &code {
            assert!(
                example.lines().any(|line| line
                    .trim_start_matches("# ")
                    .starts_with(&format!("{key} = "))),
                "examples/tollgate.toml does not show {key}"
            );
        }
    }

    #[test]
    fn an_error_says_each_cause_once() {
        let repeated = anyhow::Error::new(std::io::Error::other("pool timed out"))
            .context("rules database: pool timed out");
        assert_eq!(said_once(&repeated), "rules database: pool timed out");
        let distinct =
            anyhow::Error::new(std::io::Error::other("connection refused")).context("store");
        assert_eq!(said_once(&distinct), "store: connection refused");
    }
}
