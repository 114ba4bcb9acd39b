//! Private Redis processes for the tests that need Redis servers of their own (a cluster,
//! Sentinels, a Redis to restart or kill): started on free loopback ports in a temporary
//! directory, each a child of the test, and all killed when the value that owns them is dropped
//! (a failed test included).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `redis-server` to start, if the machine has one; tests that need it say loudly when it
/// is missing.
pub fn redis_server(test: &str) -> Option<PathBuf> {
    std::env::var("TOLLGATE_TEST_REDIS").ok().or_else(|| {
        tollgate::conformance::skipped(&format!(
            "{test}: TOLLGATE_TEST_REDIS is unset, so no Redis test runs"
        ));
        None
    })?;
    Some(installed_redis_server().unwrap_or_else(|| {
        panic!("{test}: TOLLGATE_TEST_REDIS is set but no redis-server was found to start nodes")
    }))
}

/// The machine's `redis-server`, if it has one.
pub fn installed_redis_server() -> Option<PathBuf> {
    ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
        .into_iter()
        .map(PathBuf::from)
        .find(|candidate| candidate.exists())
}

/// A loopback port free now, with its cluster bus port (+10,000) free too.
fn free_port() -> u16 {
    loop {
        let port = 17_000 + (fastrand::u16(..10_000));
        let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

/// One Redis process.
pub struct Node {
    pub port: u16,
    child: Option<Child>,
    args: Vec<String>,
    binary: PathBuf,
}

impl Node {
    fn start(binary: &Path, args: Vec<String>, port: u16) -> Node {
        let mut node = Node {
            port,
            child: None,
            args,
            binary: binary.to_owned(),
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.binary)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        wait_until(Duration::from_secs(10), "the node to answer", || {
            self.query(&["PING"]).is_ok()
        });
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `kill -9`: the process is gone at once, with whatever it had not replicated.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start the process again on the same port and files (empty: nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// One command through `redis-cli`, its answer as text.
    pub fn query(&self, args: &[&str]) -> Result<String, String> {
        query(self.port, args)
    }

    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        info_field(self.port, section, field)
    }
}

/// One command through `redis-cli` to the Redis on loopback `port`, its answer as text.
pub fn query(port: u16, args: &[&str]) -> Result<String, String> {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map_err(|error| error.to_string())?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() || text.starts_with("ERR") || text.contains("Connection refused") {
        return Err(text + &String::from_utf8_lossy(&output.stderr));
    }
    Ok(text)
}

/// One field of `INFO section` of the Redis on loopback `port`.
pub fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    let text = query(port, &["INFO", section]).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .map(|value| value.trim().to_owned())
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One Redis on its own, started with `extra` arguments (`--maxmemory 2mb`, an eviction
/// policy...), in a temporary directory; killed when dropped.
pub struct Single {
    pub node: Node,
    _dir: tempfile::TempDir,
}

impl Single {
    pub fn start(binary: &Path, extra: &[&str]) -> Single {
        let dir = tempfile::tempdir().expect("temporary directory");
        let port = free_port();
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir.path().display().to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect();
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        Single {
            node: Node::start(binary, args, port),
            _dir: dir,
        }
    }
}

/// A Redis Cluster of `masters` masters with one replica each.
pub struct Cluster {
    pub nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    pub fn start(binary: &Path, masters: usize) -> Cluster {
        Cluster::start_with(binary, masters, &[])
    }

    /// `start`, every node given the arguments `extra` too.
    pub fn start_with(binary: &Path, masters: usize, extra: &[String]) -> Cluster {
        let dir = tempfile::tempdir().expect("temporary directory");
        let nodes: Vec<Node> = (0..masters * 2)
            .map(|_| {
                let port = free_port();
                let args = vec![
                    "--port".into(),
                    port.to_string(),
                    "--bind".into(),
                    "127.0.0.1".into(),
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    dir.path()
                        .join(format!("nodes-{port}.conf"))
                        .display()
                        .to_string(),
                    "--cluster-node-timeout".into(),
                    "1000".into(),
                    "--dir".into(),
                    dir.path().display().to_string(),
                    "--save".into(),
                    String::new(),
                    "--appendonly".into(),
                    "no".into(),
                    "--dbfilename".into(),
                    format!("dump-{port}.rdb"),
                ];
                let args = args.into_iter().chain(extra.iter().cloned()).collect();
                Node::start(binary, args, port)
            })
            .collect();
        if masters >= 3 {
            let addresses: Vec<String> = nodes
                .iter()
                .map(|node| format!("127.0.0.1:{}", node.port))
                .collect();
            let output = Command::new("redis-cli")
                .arg("--cluster")
                .arg("create")
                .args(&addresses)
                .args(["--cluster-replicas", "1", "--cluster-yes"])
                .output()
                .expect("redis-cli --cluster create");
            assert!(
                output.status.success(),
                "cluster create failed: {}",
                String::from_utf8_lossy(&output.stdout)
            );
        } else {
            // `redis-cli --cluster create` refuses fewer than three masters: assemble by hand.
            assemble(&nodes, masters);
        }
        let cluster = Cluster { nodes, _dir: dir };
        cluster.wait_healthy();
        cluster
    }

    /// The nodes that are masters now, as a running node sees it.
    pub fn masters(&self) -> Vec<&Node> {
        self.in_role("master")
    }

    /// The nodes that are replicas now.
    pub fn replicas(&self) -> Vec<&Node> {
        self.in_role("slave")
    }

    /// The live nodes whose `CLUSTER NODES` flags hold `role`.
    fn in_role(&self, role: &str) -> Vec<&Node> {
        self.view()
            .into_iter()
            .filter(|(_, _, flags, _)| flags.contains(role) && !flags.contains("fail"))
            .filter_map(|(_, port, _, _)| self.nodes.iter().find(|node| node.port == port))
            .collect()
    }

    /// Every running node sees the cluster as `ok`, with every replica attached.
    pub fn wait_healthy(&self) {
        wait_until(Duration::from_secs(30), "the cluster to be healthy", || {
            self.nodes
                .iter()
                .filter(|node| node.is_running())
                .all(|node| {
                    node.query(&["CLUSTER", "INFO"])
                        .map(|info| info.contains("cluster_state:ok"))
                        .unwrap_or(false)
                        && node
                            .query(&["CLUSTER", "NODES"])
                            .map(|nodes| !nodes.contains("fail") && !nodes.contains("handshake"))
                            .unwrap_or(false)
                })
        });
    }

    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!("redis-cluster://{}", seeds.join(","))
    }

    /// A node that runs.
    pub fn running(&self) -> &Node {
        self.nodes
            .iter()
            .find(|node| node.is_running())
            .expect("a running node")
    }

    /// A running node's view of the cluster: `(node id, port, flags, slots)` per node.
    pub fn view(&self) -> Vec<(String, u16, String, String)> {
        let node = self.running();
        let text = node.query(&["CLUSTER", "NODES"]).expect("cluster nodes");
        text.lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                let port = fields.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
                Some((
                    fields[0].to_owned(),
                    port,
                    fields.get(2)?.to_string(),
                    fields[8.min(fields.len())..].join(" "),
                ))
            })
            .collect()
    }

    /// The slot of `key`, as the cluster computes it.
    pub fn keyslot(&self, key: &str) -> u16 {
        self.running()
            .query(&["CLUSTER", "KEYSLOT", key])
            .expect("keyslot")
            .trim()
            .parse()
            .expect("a slot")
    }

    /// The index in `nodes` of the master that serves `slot`, as a running node sees it.
    pub fn master_of(&self, slot: u16) -> usize {
        for (_, port, flags, slots) in self.view() {
            if !flags.contains("master") || flags.contains("fail") {
                continue;
            }
            let serves = slots.split(' ').any(|range| {
                let mut ends = range.split('-').map(|end| end.parse::<u16>());
                match (ends.next(), ends.next()) {
                    (Some(Ok(start)), Some(Ok(end))) => (start..=end).contains(&slot),
                    (Some(Ok(only)), None) => only == slot,
                    _ => false,
                }
            });
            if serves {
                return self
                    .nodes
                    .iter()
                    .position(|node| node.port == port)
                    .expect("a known node");
            }
        }
        panic!("no master serves slot {slot}: {:?}", self.view());
    }

    /// The node id of `nodes[index]`.
    pub fn id(&self, index: usize) -> String {
        self.nodes[index]
            .query(&["CLUSTER", "MYID"])
            .expect("myid")
            .trim()
            .to_owned()
    }

    /// Move `slot` from the master that serves it to `nodes[to]`, key by key, as a reshard
    /// does: `SETSLOT IMPORTING`/`MIGRATING`, `MIGRATE` in batches, then `SETSLOT NODE`.
    pub fn migrate_slot(&self, slot: u16, to: usize) {
        let from = self.master_of(slot);
        let (from_id, to_id) = (self.id(from), self.id(to));
        let slot_text = slot.to_string();
        let target = &self.nodes[to];
        let source = &self.nodes[from];
        target
            .query(&["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from_id])
            .expect("importing");
        source
            .query(&["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to_id])
            .expect("migrating");
        loop {
            let keys = source
                .query(&["CLUSTER", "GETKEYSINSLOT", &slot_text, "10"])
                .expect("keys in slot");
            let keys: Vec<&str> = keys.lines().filter(|key| !key.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = target.port.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            source.query(&args).expect("migrate");
            // A migration takes time under load; the store must wait it out, not fail.
            std::thread::sleep(Duration::from_millis(20));
        }
        for node in self.nodes.iter().filter(|node| node.is_running()) {
            let _ = node.query(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id]);
        }
    }
}

/// `nodes[..masters]` serve the slots in equal ranges, `nodes[masters + i]` replicates
/// `nodes[i]`.
fn assemble(nodes: &[Node], masters: usize) {
    let first = &nodes[0];
    for node in &nodes[1..] {
        first
            .query(&["CLUSTER", "MEET", "127.0.0.1", &node.port.to_string()])
            .expect("cluster meet");
    }
    for (index, node) in nodes[..masters].iter().enumerate() {
        let start = index * 16_384 / masters;
        let end = (index + 1) * 16_384 / masters - 1;
        node.query(&[
            "CLUSTER",
            "ADDSLOTSRANGE",
            &start.to_string(),
            &end.to_string(),
        ])
        .expect("cluster addslotsrange");
    }
    wait_until(Duration::from_secs(30), "the nodes to meet", || {
        nodes.iter().all(|node| {
            node.query(&["CLUSTER", "NODES"])
                .map(|text| text.lines().count() == nodes.len() && !text.contains("handshake"))
                .unwrap_or(false)
        })
    });
    for (index, replica) in nodes[masters..].iter().enumerate() {
        let master = nodes[index].query(&["CLUSTER", "MYID"]).expect("myid");
        replica
            .query(&["CLUSTER", "REPLICATE", master.trim()])
            .expect("cluster replicate");
    }
    wait_until(Duration::from_secs(30), "the replicas to sync", || {
        nodes[masters..].iter().all(|replica| {
            replica
                .info_field("replication", "master_link_status")
                .as_deref()
                == Some("up")
        })
    });
}

/// One master, one replica, and three Sentinels watching them as `master_name`.
pub struct Sentinels {
    pub master: Node,
    pub replica: Node,
    pub sentinels: Vec<Node>,
    pub master_name: String,
    _dir: tempfile::TempDir,
}

impl Sentinels {
    pub fn start(binary: &Path, master_name: &str) -> Sentinels {
        let dir = tempfile::tempdir().expect("temporary directory");
        let data = |port: u16| -> Vec<String> {
            vec![
                "--port".into(),
                port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--save".into(),
                String::new(),
                "--appendonly".into(),
                "no".into(),
                "--dir".into(),
                dir.path().display().to_string(),
                "--dbfilename".into(),
                format!("dump-{port}.rdb"),
            ]
        };
        let master_port = free_port();
        let master = Node::start(binary, data(master_port), master_port);
        let replica_port = free_port();
        let mut replica_args = data(replica_port);
        replica_args.extend([
            "--replicaof".into(),
            "127.0.0.1".into(),
            master_port.to_string(),
        ]);
        let replica = Node::start(binary, replica_args, replica_port);
        let sentinels = (0..3)
            .map(|_| {
                let port = free_port();
                let config = dir.path().join(format!("sentinel-{port}.conf"));
                std::fs::write(
                    &config,
                    format!(
                        "port {port}\nbind 127.0.0.1\n\
                         sentinel monitor {master_name} 127.0.0.1 {master_port} 2\n\
                         sentinel down-after-milliseconds {master_name} 1000\n\
                         sentinel failover-timeout {master_name} 5000\n\
                         sentinel parallel-syncs {master_name} 1\n"
                    ),
                )
                .expect("sentinel config");
                Node::start(
                    binary,
                    vec![config.display().to_string(), "--sentinel".into()],
                    port,
                )
            })
            .collect();
        let set = Sentinels {
            master,
            replica,
            sentinels,
            master_name: master_name.to_owned(),
            _dir: dir,
        };
        wait_until(Duration::from_secs(30), "the replica to sync", || {
            set.replica
                .info_field("replication", "master_link_status")
                .as_deref()
                == Some("up")
        });
        wait_until(
            Duration::from_secs(30),
            "the Sentinels to see the replica",
            || {
                set.sentinels.iter().all(|sentinel| {
                    sentinel
                        .query(&["SENTINEL", "REPLICAS", master_name])
                        .map(|text| text.contains(&set.replica.port.to_string()))
                        .unwrap_or(false)
                })
            },
        );
        set
    }

    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!(
            "redis-sentinel://{}/{}",
            sentinels.join(","),
            self.master_name
        )
    }

    /// The port of the master the Sentinels name now.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|sentinel| {
            let text = sentinel
                .query(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.master_name])
                .ok()?;
            text.lines().nth(1)?.trim().parse().ok()
        })
    }
}
