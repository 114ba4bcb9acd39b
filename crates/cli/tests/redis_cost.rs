//! What a decision through the server has Redis do, beside the same decision through the
//! library (a `Limiter` on a `RedisStore`), over the real binary on a private Redis watched with
//! `MONITOR`: a `/v1/check` on a GCRA limit, and an acquire and its commit on a sliding one,
//! each send Redis exactly the calls the library sends for the same request: one `FCALL` per
//! acquire or commit, of the same function, on the same keys (namespace aside), with the same
//! numbers, and nothing else (no `PING`, no usage read, no separate key budget call). What a
//! decision costs Redis beyond that depends on how often its key comes back, not on the path
//! (`docs/lab.md`, *The server's path and the library's*).

mod common;
#[path = "../../redis/tests/nodes/mod.rs"]
mod nodes;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use common::{Options, Server, post, put_limit};
use tollgate::{Algorithm, Limit, Limiter, LimiterConfig, PermitSecret, Policy, Request, Reserve};
use tollgate_redis::{RedisStore, RedisStoreConfig};

const GCRA: &str = r#"{"kind":"rate","limit":100,"period_ms":1000,"algorithm":"gcra","burst":100,
    "per":"user","match":{"method":"GET","path":"/cost/gcra"}}"#;
const SLIDING: &str = r#"{"kind":"rate","limit":100,"period_ms":1000,"algorithm":"sliding",
    "per":"user"}"#;
/// Keys each path decides on, each once before it is watched, so that their counters are
/// alive and their key budgets' covers run while it is: the same state on both paths.
const KEYS: usize = 4;
/// Decisions watched per path and case.
const DECISIONS: usize = 12;

/// `redis-cli MONITOR` on the private Redis: its lines as they come.
struct Monitor {
    child: Child,
    lines: Receiver<String>,
}

impl Monitor {
    fn start(port: u16) -> Monitor {
        let mut child = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "MONITOR"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-cli MONITOR");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let first = lines
            .recv_timeout(Duration::from_secs(10))
            .expect("MONITOR answers");
        assert_eq!(first.trim(), "OK", "MONITOR's first line");
        Monitor { child, lines }
    }

    /// The commands seen until an `ECHO` of `marker`, each as its words.
    fn until(&self, marker: &str) -> Vec<Watched> {
        let mut seen = Vec::new();
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("MONITOR showed no ECHO {marker}"));
            let Some(watched) = Watched::parse(&line) else {
                continue;
            };
            if watched.words.first().map(String::as_str) == Some("ECHO")
                && watched.words.get(1).map(String::as_str) == Some(marker)
            {
                return seen;
            }
            seen.push(watched);
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One command as `MONITOR` shows it: sent by a client, or run inside a script.
#[derive(Debug)]
struct Watched {
    inside_script: bool,
    words: Vec<String>,
}

impl Watched {
    /// `1795941163.373475 [0 127.0.0.1:50614] "FCALL" "name" ...`; `[0 lua]` inside a script.
    fn parse(line: &str) -> Option<Watched> {
        let (_, rest) = line.split_once(" [")?;
        let (source, rest) = rest.split_once("] ")?;
        let mut words = Vec::new();
        let mut chars = rest.chars();
        while let Some(c) = chars.next() {
            if c != '"' {
                continue;
            }
            let mut word = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        word.push(c);
                        word.extend(chars.next());
                    }
                    '"' => break,
                    c => word.push(c),
                }
            }
            words.push(word);
        }
        Some(Watched {
            inside_script: source.ends_with(" lua"),
            words,
        })
    }

    /// The command as the other path would send it: its namespace spelled `NS`, and a
    /// counter's slot tag (a hash of the namespace among the rest) spelled `{SLOT}`.
    fn without_namespace(&self, namespace: &str) -> String {
        let (open, close) = (format!(":{namespace}:"), format!("{{{namespace}}}"));
        self.words
            .iter()
            .map(|word| {
                if let Some(numbers) = numbers_apart_from_times(word) {
                    return numbers;
                }
                let word = word.replace(&open, ":NS:").replace(&close, "{NS}");
                match word
                    .strip_prefix("tg:{")
                    .and_then(|rest| rest.split_once("}:"))
                {
                    Some((tag, rest)) if tag.bytes().all(|b| b.is_ascii_digit()) => {
                        format!("tg:{{SLOT}}:{rest}")
                    }
                    _ => word,
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The bytes `MONITOR` shows escaped (`\xHH`, `\"`, `\\`, `\n`, ...).
fn unescape(word: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut rest = word.as_bytes();
    while let Some((&first, after)) = rest.split_first() {
        rest = after;
        if first != b'\\' {
            bytes.push(first);
            continue;
        }
        let Some((&kind, after)) = rest.split_first() else {
            break;
        };
        rest = after;
        let byte = match kind {
            b'x' if rest.len() >= 2 => {
                let hex = std::str::from_utf8(&rest[..2]).expect("hex digits");
                rest = &rest[2..];
                u8::from_str_radix(hex, 16).expect("a hex byte")
            }
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'a' => 0x07,
            b'b' => 0x08,
            other => other,
        };
        bytes.push(byte);
    }
    bytes
}

/// A call's packed numbers (big-endian doubles), each as text, and an instant on Redis's
/// clock (a reservation's grant time, which a commit carries) as `TIME`: it differs from
/// call to call on any path. `None` for a word that is not such numbers.
fn numbers_apart_from_times(word: &str) -> Option<String> {
    if word.starts_with("tg:") {
        return None;
    }
    let bytes = unescape(word);
    if bytes.len() < 16 || !bytes.len().is_multiple_of(8) {
        return None;
    }
    let numbers: Vec<String> = bytes
        .chunks_exact(8)
        .map(|chunk| {
            let number = f64::from_be_bytes(chunk.try_into().expect("8 bytes"));
            // Microseconds since 1970 are past 10^15; no policy number comes near.
            if number > 1e15 {
                "TIME".to_owned()
            } else {
                number.to_string()
            }
        })
        .collect();
    Some(format!("[{}]", numbers.join(",")))
}

fn echo(port: u16, marker: &str) {
    nodes::query(port, &["ECHO", marker]).expect("ECHO");
}

/// The commands clients sent (not those scripts ran) in `watched`, namespace aside.
fn sent(watched: &[Watched], namespace: &str) -> Vec<String> {
    watched
        .iter()
        .filter(|watched| !watched.inside_script)
        .map(|watched| watched.without_namespace(namespace))
        .collect()
}

fn policy(algorithm: Algorithm) -> Policy {
    Policy::rate(100, 1_000_000, 0, algorithm, Reserve::default()).expect("a policy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_decision_sends_redis_what_a_library_decision_sends() {
    let test = "a_server_decision_sends_redis_what_a_library_decision_sends";
    let Some(binary) = nodes::redis_server(test) else {
        return;
    };
    let redis = nodes::Single::start(&binary, &[]);
    let (port, url) = (redis.node.port, redis.node.url());
    // Namespaces of one length, so that the keys' slots are spelled alike.
    let (served, library) = ("costsrv", "costlib");
    let server = Server::start_with(Options {
        args: vec!["--store", &url, "--redis-namespace", served],
        ..Options::default()
    });
    put_limit(&server, "cost-gcra", GCRA).await;
    put_limit(&server, "cost-sliding", SLIDING).await;
    let store = RedisStore::connect(RedisStoreConfig {
        url: url.clone(),
        namespace: library.to_owned(),
        fail_open: false,
        allow_eviction: false,
        module: tollgate_redis::Module::Auto,
        timeout: Duration::from_secs(10),
        // The server's default budget, which every call carries.
        keys_per_limit_max: 100_000,
    })
    .await
    .expect("connect the library's store");
    store.begin_new_namespace().await.expect("a new namespace");
    let limiter = Limiter::new(
        Arc::new(store),
        LimiterConfig {
            permit_secret: PermitSecret::random(),
            ..LimiterConfig::default()
        },
    );
    let gcra = Algorithm::Gcra { burst: 100 };
    for (name, algorithm) in [("cost-gcra", gcra), ("cost-sliding", Algorithm::Sliding)] {
        let limit = Limit::new(name, policy(algorithm), Some("user")).expect("a limit");
        limiter.set_limit(limit);
    }
    let client = server.anonymous();
    let check = async |key: &str| {
        let body = format!(r#"{{"user":"{key}","method":"GET","path":"/cost/gcra"}}"#);
        let answer = post(&client, "/v1/check", &body).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    };
    let acquire_and_commit = async |key: &str| {
        let body = format!(r#"{{"limits":["cost-sliding"],"key":"{key}"}}"#);
        let answer = post(&client, "/v1/acquire", &body).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let permit = answer.json.expect("json")["permit"]
            .as_str()
            .expect("a permit")
            .to_owned();
        let path = format!("/v1/permits/{permit}/commit");
        let answer = post(&client, &path, r#"{"used":1}"#).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    };
    let decide = async |name: &str, key: &str| {
        let request = Request::new(name).key(key);
        let request = if name == "cost-gcra" {
            request.refundable(false)
        } else {
            request
        };
        let permit = limiter
            .try_acquire(&request)
            .await
            .expect("the store answers")
            .granted()
            .expect("a grant");
        if name == "cost-sliding" {
            permit.commit(1).await.expect("a commit");
        }
    };
    let keys: Vec<String> = (0..KEYS).map(|k| format!("k{k}")).collect();
    for key in &keys {
        check(key).await;
        acquire_and_commit(key).await;
        decide("cost-gcra", key).await;
        decide("cost-sliding", key).await;
    }

    let monitor = Monitor::start(port);
    echo(port, "begin");
    monitor.until("begin");
    for n in 0..DECISIONS {
        check(&keys[n % KEYS]).await;
    }
    echo(port, "server-gcra");
    for n in 0..DECISIONS {
        acquire_and_commit(&keys[n % KEYS]).await;
    }
    echo(port, "server-sliding");
    for n in 0..DECISIONS {
        decide("cost-gcra", &keys[n % KEYS]).await;
    }
    echo(port, "library-gcra");
    for n in 0..DECISIONS {
        decide("cost-sliding", &keys[n % KEYS]).await;
    }
    echo(port, "library-sliding");
    let watched: Vec<Vec<Watched>> = [
        "server-gcra",
        "server-sliding",
        "library-gcra",
        "library-sliding",
    ]
    .into_iter()
    .map(|marker| monitor.until(marker))
    .collect();
    for (case, server_path, library_path, calls_per_decision) in [
        ("GCRA, /v1/check", &watched[0], &watched[2], 1),
        ("sliding, acquire and commit", &watched[1], &watched[3], 2),
    ] {
        let (by_server, by_library) = (sent(server_path, served), sent(library_path, library));
        assert_eq!(
            by_server.len(),
            DECISIONS * calls_per_decision,
            "{case}: the server sent Redis {} commands for {DECISIONS} decisions, \
             {calls_per_decision} expected per decision:\n{}",
            by_server.len(),
            by_server.join("\n")
        );
        if let Some(n) = (0..by_server.len()).find(|&n| by_library.get(n) != Some(&by_server[n])) {
            let words = |command: Option<&String>| -> Vec<String> {
                command.map_or_else(Vec::new, |command| {
                    command.split(' ').map(str::to_owned).collect()
                })
            };
            let (left, right) = (words(by_server.get(n)), words(by_library.get(n)));
            let differ: Vec<_> = (0..left.len().max(right.len()))
                .filter(|&w| left.get(w) != right.get(w))
                .map(|w| (w, left.get(w), right.get(w)))
                .collect();
            panic!(
                "{case}: the server's command {n} differs from the library's (word, server's, \
                 library's): {differ:?}\nserver's:\n{}\nlibrary's:\n{}",
                by_server.join("\n"),
                by_library.join("\n")
            );
        }
        assert_eq!(
            by_server.len(),
            by_library.len(),
            "{case}: as many commands"
        );
        assert!(
            by_server
                .iter()
                .all(|command| command.starts_with("FCALL ")),
            "{case}: every command is a call of the store's function:\n{}",
            by_server.join("\n")
        );
    }
}
