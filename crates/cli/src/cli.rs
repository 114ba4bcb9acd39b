//! The command line as clap reads it: the global options, the commands and their arguments,
//! and the help's exit codes. Defaults that the config file may also set are applied by
//! `config`, not here, so a flag left out can fall back to the environment or the file.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tollgate_cli::parse_duration;

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
        79   acquire: the lease was lost while the command ran (the command was stopped, \
        unless --on-lease-lost keep-running)\n  \
        127  acquire: the command could not be started"
)]
pub(crate) struct Cli {
    /// TOML config file (see docs/server.md for its keys).
    #[arg(
        short,
        long,
        global = true,
        env = "TOLLGATE_CONFIG",
        value_name = "FILE"
    )]
    pub(crate) config: Option<PathBuf>,
    /// The server the client commands talk to (or the config file's `server`)
    /// [default: http://127.0.0.1:7070].
    #[arg(
        short,
        long,
        global = true,
        env = "TOLLGATE_SERVER",
        value_name = "URL"
    )]
    pub(crate) server: Option<String>,
    /// How the client commands print records: `table` for people, `json` for programs
    /// [default: table on a terminal, json when piped or redirected].
    #[arg(short, long, global = true, value_enum, value_name = "FORMAT")]
    pub(crate) output: Option<Output>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
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
    /// A lost lease stops COMMAND (see --on-lease-lost) and exits 79.
    Acquire(AcquireArgs),
}

/// The server a client command talks to, as `--server` (or `TOLLGATE_SERVER`) gave it.
#[derive(Debug)]
pub(crate) struct ServerArgs {
    pub(crate) server: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    Json,
    Table,
}

#[derive(Subcommand, Debug)]
pub(crate) enum LimitsAction {
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
    /// Forget what a rate limit counts, after a mistaken lockout: its usage, open reservations
    /// and own pause (with --key, that key's; required for a limit counted per key), in every
    /// replica sharing the store. Not for a concurrency limit, whose leases end by themselves.
    Reset {
        name: String,
        /// For a limit counted per key: the key whose usage to forget.
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
pub(crate) enum TokensAction {
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
pub(crate) struct AcquireArgs {
    /// The limits to take from (all or none).
    #[arg(required = true, value_name = "LIMIT")]
    pub(crate) limits: Vec<String>,
    /// Key, for limits counted per key (e.g. a user or account id).
    #[arg(short, long)]
    pub(crate) key: Option<String>,
    /// high, normal or low.
    #[arg(short, long, default_value = "normal")]
    pub(crate) priority: String,
    /// Units to take.
    #[arg(long, default_value_t = 1)]
    pub(crate) cost: u64,
    /// How long to wait for a permit: 0, 500ms, 2s, 1m (capped by the server's wait_ms_max).
    #[arg(short, long, default_value = "0", value_parser = parse_duration)]
    pub(crate) wait: Duration,
    /// What to do with COMMAND when its lease is lost (the server no longer knows the permit,
    /// as after a restart, or renewals failed until the lease expired): `stop` it (SIGTERM,
    /// then SIGKILL after --kill-grace), or let it `keep-running`; either way acquire exits 79.
    #[arg(long, value_enum, default_value = "stop", value_name = "WHAT")]
    pub(crate) on_lease_lost: crate::supervise::OnLeaseLost,
    /// After a lost lease, how long COMMAND gets between SIGTERM and SIGKILL: 0, 500ms, 2s, 1m.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) kill_grace: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:7070].
    #[arg(long, env = "TOLLGATE_LISTEN", value_name = "ADDR")]
    pub(crate) listen: Option<String>,
    /// `memory`, redis://HOST:PORT/DB, redis-cluster://HOST:PORT[,HOST:PORT...] or
    /// redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB] [default: memory].
    #[arg(long, env = "TOLLGATE_STORE", value_name = "STORE")]
    pub(crate) store: Option<String>,
    /// Rules: a database, sqlite://FILE, postgres://..., mysql://..., or a read-only limits
    /// file, file://limits.toml (or .yaml) [default: sqlite://tollgate.db].
    #[arg(long, env = "TOLLGATE_RULES", value_name = "URL")]
    pub(crate) rules: Option<String>,
    /// Database the server remembers its store in across restarts
    /// [default: the rules database; with a limits file, sqlite://tollgate.db].
    #[arg(long, env = "TOLLGATE_STATE", value_name = "URL")]
    pub(crate) state: Option<String>,
    /// Rules table name [default: tollgate_limits].
    #[arg(long, env = "TOLLGATE_RULES_TABLE", value_name = "NAME")]
    pub(crate) rules_table: Option<String>,
    /// How often to re-read the rules table, ms [default: 2000].
    #[arg(long, env = "TOLLGATE_RELOAD_INTERVAL_MS", value_name = "MS")]
    pub(crate) reload_interval_ms: Option<u64>,
    /// Longest wait honoured, ms [default: 60000].
    #[arg(long, env = "TOLLGATE_WAIT_MS_MAX", value_name = "MS")]
    pub(crate) wait_ms_max: Option<u64>,
    /// Largest request body, bytes [default: 65536].
    #[arg(long, env = "TOLLGATE_BODY_BYTES_MAX", value_name = "BYTES")]
    pub(crate) body_bytes_max: Option<u32>,
    /// Memory store: counters tracked at most, over every limit [default: 1000000].
    #[arg(long, env = "TOLLGATE_KEYS_TRACKED_MAX", value_name = "N")]
    pub(crate) keys_tracked_max: Option<u64>,
    /// Keys one limit counted per key may have counters of at once (memory store and Redis),
    /// unless its rule sets keys_max [default: a tenth of keys_tracked_max].
    #[arg(long, env = "TOLLGATE_KEYS_PER_LIMIT_MAX", value_name = "N")]
    pub(crate) keys_per_limit_max: Option<u64>,
    /// Longest pause, ms; longer ones are cut to it (at most 86400000, a day)
    /// [default: 3600000].
    #[arg(long, env = "TOLLGATE_PAUSE_MS_MAX", value_name = "MS")]
    pub(crate) pause_ms_max: Option<u64>,
    /// The lowest an outbound client's lesson (`POST /v1/learn`) may take a limit, in percent
    /// of its configured limit (1 to 100; 100 lets nothing lower it) [default: 10].
    #[arg(long, env = "TOLLGATE_LEARN_FLOOR_PERCENT", value_name = "PERCENT")]
    pub(crate) learn_floor_percent: Option<u64>,
    /// How long a quota a vendor advertised holds unless taught again, ms (1000 to 86400000)
    /// [default: 600000].
    #[arg(long, env = "TOLLGATE_LEARN_TTL_MS", value_name = "MS")]
    pub(crate) learn_ttl_ms: Option<u64>,
    /// How often a limit halved by rate-limit answers climbs back a twentieth of its
    /// configured limit, ms (1000 to 86400000) [default: 60000].
    #[arg(long, env = "TOLLGATE_LEARN_RAISE_EVERY_MS", value_name = "MS")]
    pub(crate) learn_raise_every_ms: Option<u64>,
    /// Percent of each rate limit's period that `normal` requests get while they wait, ahead
    /// of `high` when they were granted less over the last period (0 to 100, with
    /// `--min-share-low-percent` at most 100) [default: 0, strict priority].
    #[arg(
        long,
        env = "TOLLGATE_MIN_SHARE_NORMAL_PERCENT",
        value_name = "PERCENT"
    )]
    pub(crate) min_share_normal_percent: Option<u8>,
    /// The same for `low`, ahead of `high` and `normal` [default: 0, strict priority].
    #[arg(long, env = "TOLLGATE_MIN_SHARE_LOW_PERCENT", value_name = "PERCENT")]
    pub(crate) min_share_low_percent: Option<u8>,
    /// Memory store: after an unclean stop, put back each counter's last record with its
    /// budget held back, and hold concurrency limits until one lease TTL after the previous run
    /// last granted, since what it granted may still count
    /// [default: true].
    #[arg(long, env = "TOLLGATE_RECOVER_ON_START", value_name = "BOOL")]
    pub(crate) recover_on_start: Option<bool>,
    /// Time in-flight requests get to finish on shutdown, ms
    /// [default: 10000].
    #[arg(long, env = "TOLLGATE_SHUTDOWN_GRACE_MS", value_name = "MS")]
    pub(crate) shutdown_grace_ms: Option<u64>,
    /// Redis store: namespace of every key; replicas sharing a quota share it
    /// [default: tollgate].
    #[arg(long, env = "TOLLGATE_REDIS_NAMESPACE", value_name = "NAME")]
    pub(crate) redis_namespace: Option<String>,
    /// Redis store: grant when Redis is unreachable (fail-open) instead of answering
    /// store_unavailable [default: false].
    #[arg(long, env = "TOLLGATE_STORE_FAIL_OPEN", value_name = "BOOL")]
    pub(crate) store_fail_open: Option<bool>,
    /// Redis store: start on a Redis whose maxmemory-policy may evict Tollgate's keys (any
    /// but noeviction); every call then watches for evictions, and a counter missing after
    /// one is held for a period [default: false].
    #[arg(long, env = "TOLLGATE_REDIS_ALLOW_EVICTION", value_name = "BOOL")]
    pub(crate) redis_allow_eviction: Option<bool>,
    /// Redis store: decide acquires with the Redis module tollgate-redis-module: `auto` when
    /// Redis has it loaded, `on` (refuse to start without it) or `off` [default: auto].
    #[arg(long, env = "TOLLGATE_REDIS_MODULE", value_name = "auto|on|off")]
    pub(crate) redis_module: Option<String>,
    /// Redis store: time one operation may take, ms [default: 1000].
    #[arg(long, env = "TOLLGATE_STORE_TIMEOUT_MS", value_name = "MS")]
    pub(crate) store_timeout_ms: Option<u64>,
    /// Serve Envoy's rate limit service (gRPC ShouldRateLimit) on ADDR, e.g. 127.0.0.1:8081
    /// [default: off].
    #[arg(long, env = "TOLLGATE_GRPC_LISTEN", value_name = "ADDR")]
    pub(crate) grpc_listen: Option<String>,
    /// envoyproxy/ratelimit's YAML configuration for the gRPC service: a file, or a directory
    /// of *.yaml files (one domain each); re-read when it changes.
    #[arg(long, env = "TOLLGATE_ENVOY_CONFIG", value_name = "PATH")]
    pub(crate) envoy_config: Option<PathBuf>,
    /// How /v1/check reads paths, as the application's router does: `sensitive` (/Users is
    /// not /users) or `insensitive` [default: sensitive].
    #[arg(long, env = "TOLLGATE_PATH_CASE", value_name = "CASE")]
    pub(crate) path_case: Option<String>,
    /// How /v1/check reads `;` in a path segment, as the application's router does: `keep`
    /// (an ordinary character) or `strip` (it starts parameters, dropped: /a;v=1 is /a)
    /// [default: keep].
    #[arg(long, env = "TOLLGATE_PATH_PARAMS", value_name = "PARAMS")]
    pub(crate) path_params: Option<String>,
    /// /v1/forward-auth: the request header that names the user, set by the reverse proxy
    /// after its own authentication (e.g. X-User); without it, the client's address
    /// [default: none].
    #[arg(long, env = "TOLLGATE_FORWARD_AUTH_USER_HEADER", value_name = "NAME")]
    pub(crate) forward_auth_user_header: Option<String>,
    /// /v1/forward-auth: the proxies whose X-Forwarded-For is believed, comma-separated
    /// addresses or networks (127.0.0.1, 10.0.0.0/8) [default: none: the peer is the client].
    #[arg(
        long,
        env = "TOLLGATE_FORWARD_AUTH_TRUSTED_PROXIES",
        value_name = "CIDRS",
        value_delimiter = ','
    )]
    pub(crate) forward_auth_trusted_proxies: Option<Vec<String>>,
    /// /v1/forward-auth: bits of an IPv6 client's address that name one client, 32 to 128
    /// [default: 64].
    #[arg(
        long,
        env = "TOLLGATE_FORWARD_AUTH_IPV6_PREFIX_LEN",
        value_name = "BITS"
    )]
    pub(crate) forward_auth_ipv6_prefix_len: Option<u8>,
    /// How /v1/check and /v1/forward-auth read %2F in a path: `both` (counted under the rules
    /// of the path as written and of the path decoded, as WSGI/ASGI servers and nginx's
    /// proxy_pass with a URI read it) or `segment` (as written only) [default: both].
    #[arg(long, env = "TOLLGATE_PATH_ENCODED_SLASH", value_name = "READING")]
    pub(crate) path_encoded_slash: Option<String>,
    /// /v1/forward-auth: the proxy in front, `nginx` (X-Original-Method, X-Original-URI),
    /// `caddy` or `traefik` (X-Forwarded-Method, X-Forwarded-Uri); a request carrying such a
    /// header the proxy does not set is refused [default: X-Forwarded-Method and
    /// X-Forwarded-Uri, refusing X-Original-*].
    #[arg(long, env = "TOLLGATE_FORWARD_AUTH_PROXY", value_name = "PROXY")]
    pub(crate) forward_auth_proxy: Option<String>,
    /// /v1/forward-auth: the header the original method is read from, instead of the
    /// proxy's [default: the proxy's].
    #[arg(long, env = "TOLLGATE_FORWARD_AUTH_METHOD_HEADER", value_name = "NAME")]
    pub(crate) forward_auth_method_header: Option<String>,
    /// /v1/forward-auth: the header the original URI is read from, instead of the proxy's
    /// [default: the proxy's].
    #[arg(long, env = "TOLLGATE_FORWARD_AUTH_URI_HEADER", value_name = "NAME")]
    pub(crate) forward_auth_uri_header: Option<String>,
    /// /v1/forward-auth: clients (IPv4 addresses, IPv6 prefixes) of one network (IPv4 /24,
    /// IPv6 /48) with keys of their own at once; the network's further clients share one key
    /// [default: 256].
    #[arg(
        long,
        env = "TOLLGATE_FORWARD_AUTH_NETWORK_KEYS_MAX",
        value_name = "COUNT"
    )]
    pub(crate) forward_auth_network_keys_max: Option<u32>,
    /// Origins whose pages may call the API from a browser (CORS), comma-separated, e.g.
    /// https://app.example [default: none; the server's own dashboard always may].
    #[arg(
        long,
        env = "TOLLGATE_ALLOWED_ORIGINS",
        value_name = "ORIGINS",
        value_delimiter = ','
    )]
    pub(crate) allowed_origins: Option<Vec<String>>,
    /// Host names the server answers to besides localhost, 127.0.0.1 and [::1], comma-separated
    /// (`name` or `name:port`); against DNS rebinding [default: none].
    #[arg(
        long,
        env = "TOLLGATE_ALLOWED_HOSTS",
        value_name = "HOSTS",
        value_delimiter = ','
    )]
    pub(crate) allowed_hosts: Option<Vec<String>>,
    /// Time a client gets to send a request's head, and then its body, ms [default: 10000].
    #[arg(long, env = "TOLLGATE_HEADER_READ_TIMEOUT_MS", value_name = "MS")]
    pub(crate) header_read_timeout_ms: Option<u64>,
    /// An idle keep-alive connection is closed after this, ms [default: 120000].
    #[arg(long, env = "TOLLGATE_IDLE_TIMEOUT_MS", value_name = "MS")]
    pub(crate) idle_timeout_ms: Option<u64>,
    /// Open HTTP connections at most; lowered to what the open-file limit leaves
    /// [default: 4096].
    #[arg(long, env = "TOLLGATE_CONNECTIONS_MAX", value_name = "N")]
    pub(crate) connections_max: Option<usize>,
    /// Acquires waiting for room at once, over every limit; lowered to half the connections
    /// [default: 1024].
    #[arg(long, env = "TOLLGATE_WAITERS_MAX", value_name = "N")]
    pub(crate) waiters_max: Option<usize>,
    /// Acquires waiting for room at once on one limit [default: 256].
    #[arg(long, env = "TOLLGATE_WAITERS_PER_LIMIT_MAX", value_name = "N")]
    pub(crate) waiters_per_limit_max: Option<usize>,
    /// Acquires of one scoped token waiting for room at once [default: 64].
    #[arg(long, env = "TOLLGATE_WAITERS_PER_TOKEN_MAX", value_name = "N")]
    pub(crate) waiters_per_token_max: Option<usize>,
    /// TLS on the HTTP and gRPC listeners: the certificate chain, a PEM file; give --tls-key
    /// too. Reloaded when the files change [default: off].
    #[arg(long, env = "TOLLGATE_TLS_CERT", value_name = "FILE")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, a PEM file.
    #[arg(long, env = "TOLLGATE_TLS_KEY", value_name = "FILE")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Log filter, e.g. `info` or `warn,tollgate_server=debug` [default: info].
    #[arg(long, env = "TOLLGATE_LOG", value_name = "FILTER")]
    pub(crate) log: Option<String>,
    /// `text` or `json` [default: text].
    #[arg(long, env = "TOLLGATE_LOG_FORMAT", value_name = "FORMAT")]
    pub(crate) log_format: Option<String>,
}
