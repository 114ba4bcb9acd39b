//! The configuration of `serve` and the client commands. Read in two stages (as ripgrep does):
//! raw values from the config file, the environment (`TOLLGATE_*`) and flags, merged with flags
//! winning over the environment and the environment over the file; then resolved and validated
//! into the server's `ServerConfig`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use tollgate_rules::{PathCase, PathMatching, PathParams};
use tollgate_server::{
    DEFAULT_BODY_BYTES_MAX, DEFAULT_CONNECTIONS_MAX, DEFAULT_FORWARD_AUTH_IPV6_PREFIX_LEN,
    DEFAULT_FORWARD_AUTH_NETWORK_KEYS_MAX, DEFAULT_HEADER_READ_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS,
    DEFAULT_KEYS_TRACKED_MAX, DEFAULT_LISTEN, DEFAULT_PATH_MATCHING, DEFAULT_PAUSE_MS_MAX,
    DEFAULT_REDIS_ALLOW_EVICTION, DEFAULT_REDIS_MODULE, DEFAULT_REDIS_NAMESPACE,
    DEFAULT_RELOAD_INTERVAL_MS, DEFAULT_RULES_URL, DEFAULT_SHUTDOWN_GRACE_MS,
    DEFAULT_STORE_TIMEOUT_MS, DEFAULT_WAIT_MS_MAX, DEFAULT_WAITERS_MAX,
    DEFAULT_WAITERS_PER_LIMIT_MAX, DEFAULT_WAITERS_PER_TOKEN_MAX, PathEncodedSlash,
    RELOAD_INTERVAL_MS_MIN, RedisModule, ServerConfig, StoreChoice, parse_host, parse_origin,
    parse_permit_secret,
};

use crate::cli::ServeArgs;

/// The config file, as written. Unknown keys are refused, so a typo is not silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    pub(crate) listen: Option<String>,
    pub(crate) store: Option<String>,
    pub(crate) rules: Option<String>,
    pub(crate) state: Option<String>,
    pub(crate) rules_table: Option<String>,
    pub(crate) reload_interval_ms: Option<u64>,
    pub(crate) admin_token: Option<String>,
    pub(crate) data_token: Option<String>,
    pub(crate) metrics_token: Option<String>,
    pub(crate) body_bytes_max: Option<u32>,
    pub(crate) wait_ms_max: Option<u64>,
    pub(crate) keys_tracked_max: Option<u64>,
    pub(crate) keys_per_limit_max: Option<u64>,
    pub(crate) pause_ms_max: Option<u64>,
    pub(crate) learn_floor_percent: Option<u64>,
    pub(crate) learn_ttl_ms: Option<u64>,
    pub(crate) learn_raise_every_ms: Option<u64>,
    pub(crate) min_share_normal_percent: Option<u8>,
    pub(crate) min_share_low_percent: Option<u8>,
    pub(crate) recover_on_start: Option<bool>,
    pub(crate) permit_secret: Option<String>,
    pub(crate) shutdown_grace_ms: Option<u64>,
    pub(crate) redis_namespace: Option<String>,
    pub(crate) store_fail_open: Option<bool>,
    pub(crate) redis_allow_eviction: Option<bool>,
    pub(crate) redis_module: Option<String>,
    pub(crate) store_timeout_ms: Option<u64>,
    pub(crate) grpc_listen: Option<String>,
    pub(crate) envoy_config: Option<PathBuf>,
    pub(crate) path_case: Option<String>,
    pub(crate) path_params: Option<String>,
    pub(crate) forward_auth_user_header: Option<String>,
    pub(crate) forward_auth_trusted_proxies: Option<Vec<String>>,
    pub(crate) forward_auth_ipv6_prefix_len: Option<u8>,
    pub(crate) path_encoded_slash: Option<String>,
    pub(crate) forward_auth_proxy: Option<String>,
    pub(crate) forward_auth_method_header: Option<String>,
    pub(crate) forward_auth_uri_header: Option<String>,
    pub(crate) forward_auth_network_keys_max: Option<u32>,
    pub(crate) allowed_origins: Option<Vec<String>>,
    pub(crate) allowed_hosts: Option<Vec<String>>,
    pub(crate) header_read_timeout_ms: Option<u64>,
    pub(crate) idle_timeout_ms: Option<u64>,
    pub(crate) connections_max: Option<usize>,
    pub(crate) waiters_max: Option<usize>,
    pub(crate) waiters_per_limit_max: Option<usize>,
    pub(crate) waiters_per_token_max: Option<usize>,
    pub(crate) tls_cert: Option<PathBuf>,
    pub(crate) tls_key: Option<PathBuf>,
    pub(crate) log: Option<String>,
    pub(crate) log_format: Option<String>,
    /// For client commands: the server's URL.
    pub(crate) server: Option<String>,
}

pub(crate) fn read_file_config(path: Option<&Path>) -> Result<FileConfig> {
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
pub(crate) fn env_text(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

pub(crate) fn resolve_server_config(
    args: ServeArgs,
    file: FileConfig,
) -> Result<(ServerConfig, String, String)> {
    let learn = learn_config(&args, &file)?;
    let shares = tollgate::Shares::new(
        args.min_share_normal_percent
            .or(file.min_share_normal_percent)
            .unwrap_or(0),
        args.min_share_low_percent
            .or(file.min_share_low_percent)
            .unwrap_or(0),
    )
    .map_err(|_| {
        anyhow!("min_share_normal_percent and min_share_low_percent together must be at most 100")
    })?;
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
    let path_encoded_slash = match args.path_encoded_slash.or(file.path_encoded_slash) {
        Some(text) => PathEncodedSlash::parse(&text)
            .map_err(|reason| anyhow!("path_encoded_slash: {reason}"))?,
        None => PathEncodedSlash::default(),
    };
    let forward_auth_network_keys_max = args
        .forward_auth_network_keys_max
        .or(file.forward_auth_network_keys_max)
        .unwrap_or(DEFAULT_FORWARD_AUTH_NETWORK_KEYS_MAX);
    if forward_auth_network_keys_max == 0 {
        bail!(
            "forward_auth_network_keys_max must be at least 1 (a network's clients then all share \
             its one key)"
        );
    }
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
    let redis_module = match args.redis_module.or(file.redis_module) {
        Some(text) => text
            .parse::<RedisModule>()
            .map_err(|reason| anyhow!("redis_module: {reason}"))?,
        None => DEFAULT_REDIS_MODULE,
    };
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
        metrics_token: token_setting(
            "TOLLGATE_METRICS_TOKEN",
            "metrics_token",
            file.metrics_token,
        )?,
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
        waiters_per_token_max: args
            .waiters_per_token_max
            .or(file.waiters_per_token_max)
            .unwrap_or(DEFAULT_WAITERS_PER_TOKEN_MAX),
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
        learn,
        shares,
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
        redis_module,
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
        path_encoded_slash,
        forward_auth_proxy: args
            .forward_auth_proxy
            .or(file.forward_auth_proxy)
            .filter(|name| !name.trim().is_empty()),
        forward_auth_method_header: args
            .forward_auth_method_header
            .or(file.forward_auth_method_header)
            .filter(|name| !name.trim().is_empty()),
        forward_auth_uri_header: args
            .forward_auth_uri_header
            .or(file.forward_auth_uri_header)
            .filter(|name| !name.trim().is_empty()),
        forward_auth_network_keys_max,
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

/// The learning bounds: each setting from the flags, the environment or the file, checked.
fn learn_config(args: &ServeArgs, file: &FileConfig) -> Result<tollgate::LearnConfig> {
    let defaults = tollgate::LearnConfig::default();
    let floor_percent = args
        .learn_floor_percent
        .or(file.learn_floor_percent)
        .unwrap_or(defaults.floor_percent);
    if !(1..=100).contains(&floor_percent) {
        bail!("learn_floor_percent must be between 1 and 100");
    }
    let span = |name: &str, value: Option<u64>, default: Duration| -> Result<Duration> {
        let ms = value.unwrap_or(u64::try_from(default.as_millis()).unwrap_or(u64::MAX));
        if !(1_000..=86_400_000).contains(&ms) {
            bail!("{name} must be between 1000 and 86400000 (a day)");
        }
        Ok(Duration::from_millis(ms))
    };
    Ok(tollgate::LearnConfig {
        floor_percent,
        ttl: span(
            "learn_ttl_ms",
            args.learn_ttl_ms.or(file.learn_ttl_ms),
            defaults.ttl,
        )?,
        raise_every: span(
            "learn_raise_every_ms",
            args.learn_raise_every_ms.or(file.learn_raise_every_ms),
            defaults.raise_every,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::cli::Cli;
    use crate::supervise::SECRET_VARIABLES;

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
            tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR"))
                .join("../../docs/server.md"),
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
            tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR"))
                .join("../../examples/tollgate.toml"),
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
}
