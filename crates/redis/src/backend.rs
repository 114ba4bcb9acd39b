//! Where the store's commands go: one Redis, a Redis Cluster, or the master a set of Sentinels
//! names. This module owns the URL forms, connecting, following a cluster's redirections and a
//! Sentinel failover, and which node the wake-up subscription listens on; the store above it
//! sends commands and reads answers the same way on all three.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, RedisError, RedisResult, Value};

/// What a store URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// `redis://` or `rediss://`: one Redis, as the URL says.
    Single(String),
    /// `redis-cluster://HOST:PORT[,HOST:PORT...]`: the seed nodes, as `redis://` URLs.
    Cluster(Vec<String>),
    /// `redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]`.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
        db: i64,
    },
}

impl Target {
    /// Read a store URL; the error says what is wrong with it.
    pub(crate) fn parse(url: &str) -> Result<Target, String> {
        if url.starts_with("redis://") || url.starts_with("rediss://") {
            return Ok(Target::Single(url.to_owned()));
        }
        let (cluster, rest) = if let Some(rest) = url.strip_prefix("redis-cluster://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("redis-sentinel://") {
            (false, rest)
        } else {
            return Err(
                "must start with redis://, rediss://, redis-cluster:// or redis-sentinel://".into(),
            );
        };
        let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match hosts.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, hosts),
        };
        let mut nodes = Vec::new();
        for host in hosts.split(',') {
            let Some((name, port)) = host.rsplit_once(':') else {
                return Err(format!("node {host:?} must be HOST:PORT"));
            };
            if name.is_empty() || port.parse::<u16>().map_or(true, |port| port == 0) {
                return Err(format!("node {host:?} must be HOST:PORT"));
            }
            nodes.push(match userinfo {
                Some(userinfo) => format!("redis://{userinfo}@{host}"),
                None => format!("redis://{host}"),
            });
        }
        if cluster {
            if !path.is_empty() {
                return Err("a cluster has one database: no path after the nodes".into());
            }
            return Ok(Target::Cluster(nodes));
        }
        let mut parts = path.split('/');
        let master = parts.next().unwrap_or_default();
        if master.is_empty() {
            return Err("must name the master after the Sentinels: .../MASTER_NAME".into());
        }
        let db = match parts.next() {
            None | Some("") => 0,
            Some(db) => db
                .parse::<i64>()
                .ok()
                .filter(|db| *db >= 0)
                .ok_or_else(|| format!("database {db:?} must be a number"))?,
        };
        if parts.next().is_some() {
            return Err("nothing may follow .../MASTER_NAME/DB".into());
        }
        Ok(Target::Sentinel {
            sentinels: nodes,
            master: master.to_owned(),
            db,
        })
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster(_))
    }
}

/// The connection commands go through.
pub(crate) enum Backend {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Box<Follower>),
}

impl Backend {
    /// Connect to what `target` names; `timeout` bounds each attempt and each answer.
    pub(crate) async fn connect(target: &Target, timeout: Duration) -> RedisResult<Backend> {
        match target {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                Ok(Backend::Single(manager(client, timeout).await?))
            }
            Target::Cluster(nodes) => {
                // Redirections (MOVED, ASK) are followed, and TRYAGAIN and CLUSTERDOWN retried
                // with short waits, inside the store's own deadline for the operation. (The
                // client computes 2^retry for its backoff: more than about 60 retries overflows.)
                let client = redis::cluster::ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(40)
                    .min_retry_wait(5)
                    .max_retry_wait(100)
                    .build()?;
                Ok(Backend::Cluster(client.get_async_connection().await?))
            }
            Target::Sentinel {
                sentinels,
                master,
                db,
            } => {
                let info = SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(redis::RedisConnectionInfo::default().set_db(*db));
                let client = SentinelClient::build(
                    sentinels.clone(),
                    master.clone(),
                    Some(info),
                    SentinelServerType::Master,
                )?;
                let follower = Follower {
                    sentinel: tokio::sync::Mutex::new(client),
                    current: Mutex::new(None),
                    timeout,
                };
                follower.connection().await?;
                Ok(Backend::Sentinel(Box::new(follower)))
            }
        }
    }

    /// Send one command and read its answer.
    pub(crate) async fn query(&self, command: &Cmd) -> RedisResult<Value> {
        match self {
            Backend::Single(connection) => command.query_async(&mut connection.clone()).await,
            Backend::Cluster(connection) => command.query_async(&mut connection.clone()).await,
            Backend::Sentinel(follower) => follower.query(command).await,
        }
    }

    /// Send one command to the master of `slot` on a cluster (a command the client cannot
    /// route by its arguments, as it routes `FCALL`), elsewhere as `query` does.
    pub(crate) async fn query_slot(&self, command: &Cmd, slot: u16) -> RedisResult<Value> {
        self.query_routed(command, Route::new(slot, SlotAddr::Master))
            .await
    }

    /// `query_slot` for the slot `key` hashes to (its tag's).
    pub(crate) async fn query_key(&self, command: &Cmd, key: &str) -> RedisResult<Value> {
        self.query_routed(command, Route::with_key(key, SlotAddr::Master))
            .await
    }

    async fn query_routed(&self, command: &Cmd, route: Route) -> RedisResult<Value> {
        match self {
            Backend::Cluster(connection) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                connection
                    .clone()
                    .route_command(command.clone(), routing)
                    .await
            }
            _ => self.query(command).await,
        }
    }

    /// Send one command to every master (one Redis is its own), each answer by its node.
    pub(crate) async fn query_masters(
        &self,
        command: &Cmd,
    ) -> RedisResult<Vec<(String, RedisResult<Value>)>> {
        let Backend::Cluster(connection) = self else {
            return Ok(vec![("redis".to_owned(), self.query(command).await)]);
        };
        let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let answer = connection
            .clone()
            .route_command(command.clone(), routing)
            .await?;
        let Value::Map(answers) = answer else {
            return Err(RedisError::from((
                redis::ErrorKind::Client,
                "a command to every master answered other than one answer per node",
            )));
        };
        Ok(answers
            .into_iter()
            .map(|(node, answer)| {
                let node = match node {
                    Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                    other => format!("{other:?}"),
                };
                let answer = match answer {
                    Value::ServerError(error) => Err(RedisError::from(error)),
                    value => Ok(value),
                };
                (node, answer)
            })
            .collect())
    }

    /// A client for the node the wake-up subscription listens on: any node of a cluster (a
    /// `PUBLISH` reaches every node), the current master under Sentinel.
    pub(crate) async fn subscription_client(
        &self,
        target: &Target,
        attempt: usize,
    ) -> RedisResult<redis::Client> {
        match target {
            Target::Single(url) => redis::Client::open(url.as_str()),
            Target::Cluster(nodes) => redis::Client::open(nodes[attempt % nodes.len()].as_str()),
            Target::Sentinel { .. } => match self {
                Backend::Sentinel(follower) => {
                    follower.sentinel.lock().await.async_get_client().await
                }
                _ => Err(RedisError::from((
                    redis::ErrorKind::Client,
                    "a Sentinel target on another backend",
                ))),
            },
        }
    }
}

async fn manager(client: redis::Client, timeout: Duration) -> RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1);
    ConnectionManager::new_with_config(client, config).await
}

/// The master the Sentinels name, followed through failovers: a connection that fails, or a
/// node that answers as a replica (`READONLY`), is dropped, and the next command asks the
/// Sentinels again.
pub(crate) struct Follower {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<ConnectionManager>>,
    timeout: Duration,
}

impl Follower {
    async fn connection(&self) -> RedisResult<ConnectionManager> {
        if let Some(connection) = self.current.lock().ok().and_then(|slot| slot.clone()) {
            return Ok(connection);
        }
        let client = self.sentinel.lock().await.async_get_client().await?;
        let connection = manager(client, self.timeout).await?;
        if let Ok(mut slot) = self.current.lock() {
            *slot = Some(connection.clone());
        }
        Ok(connection)
    }

    /// Forget the master after an answer that says it is gone or no longer the master; whether
    /// it did.
    fn forget_on<T>(&self, answer: &RedisResult<T>) -> bool {
        let Err(error) = answer else {
            return false;
        };
        let moved = error.is_io_error()
            || error.is_connection_refusal()
            || error.is_connection_dropped()
            || error.is_timeout()
            || matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"));
        if moved && let Ok(mut slot) = self.current.lock() {
            *slot = None;
        }
        moved
    }

    /// Send `command` to the master, asking the Sentinels once more if the one it went to is
    /// gone. A command whose answer was lost may so run twice: a decision then counts twice
    /// (fewer grants, never more), a commit answers that its permit is gone.
    async fn query(&self, command: &Cmd) -> RedisResult<Value> {
        let mut connection = self.connection().await?;
        let answer = command.query_async(&mut connection).await;
        if !self.forget_on(&answer) {
            return answer;
        }
        let mut connection = self.connection().await?;
        let answer = command.query_async(&mut connection).await;
        self.forget_on(&answer);
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_are_read_or_refused_with_the_reason() {
        assert_eq!(
            Target::parse("redis://127.0.0.1:6379/2"),
            Ok(Target::Single("redis://127.0.0.1:6379/2".into()))
        );
        assert_eq!(
            Target::parse("redis-cluster://10.0.0.1:7000,10.0.0.2:7001"),
            Ok(Target::Cluster(vec![
                "redis://10.0.0.1:7000".into(),
                "redis://10.0.0.2:7001".into()
            ]))
        );
        assert_eq!(
            Target::parse("redis-cluster://user:secret@h:7000"),
            Ok(Target::Cluster(vec!["redis://user:secret@h:7000".into()]))
        );
        assert_eq!(
            Target::parse("redis-sentinel://s1:26379,s2:26380/mymaster/3"),
            Ok(Target::Sentinel {
                sentinels: vec!["redis://s1:26379".into(), "redis://s2:26380".into()],
                master: "mymaster".into(),
                db: 3,
            })
        );
        assert_eq!(
            Target::parse("redis-sentinel://s1:26379/mymaster"),
            Ok(Target::Sentinel {
                sentinels: vec!["redis://s1:26379".into()],
                master: "mymaster".into(),
                db: 0,
            })
        );
        for (bad, says) in [
            ("memcached://h:1", "must start with"),
            ("redis-cluster://h", "HOST:PORT"),
            ("redis-cluster://h:0", "HOST:PORT"),
            ("redis-cluster://h:7000,:7001", "HOST:PORT"),
            ("redis-cluster://h:7000/1", "one database"),
            ("redis-sentinel://s:26379", "name the master"),
            ("redis-sentinel://s:26379/", "name the master"),
            ("redis-sentinel://s:26379/m/x", "must be a number"),
            ("redis-sentinel://s:26379/m/1/2", "nothing may follow"),
        ] {
            let error = Target::parse(bad).expect_err(bad);
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
