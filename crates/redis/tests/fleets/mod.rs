//! Fleets of worker processes (`tollgate-fleet-worker`) and the outside count of their grants,
//! shared by the fleet, cluster and Sentinel tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

fn worker_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tollgate-fleet-worker"))
}

pub struct Fleet {
    children: Vec<Child>,
}

pub struct Run {
    pub name: String,
    pub limit: u64,
    pub period_ms: u64,
    pub acquirers: u64,
    pub duration_ms: u64,
    pub algorithm: &'static str,
}

impl Fleet {
    pub fn start(url: &str, namespace: &str, run: &Run, skews: &[Option<&str>]) -> Fleet {
        let binary = worker_binary();
        let children = skews
            .iter()
            .map(|skew| {
                let mut command = Command::new(&binary);
                command
                    .args([
                        url,
                        namespace,
                        &run.name,
                        &run.limit.to_string(),
                        &run.period_ms.to_string(),
                        &run.acquirers.to_string(),
                        &run.duration_ms.to_string(),
                        run.algorithm,
                    ])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit());
                if let Some(offset) = skew {
                    command
                        .env(
                            "LD_PRELOAD",
                            faketime_library().expect("checked by the caller"),
                        )
                        .env("FAKETIME", offset)
                        .env("FAKETIME_DONT_RESET", "1");
                }
                command.spawn().expect("start a fleet worker")
            })
            .collect();
        Fleet { children }
    }

    /// Every grant's decision time, and the total of errors the workers met.
    pub fn collect(self) -> (Vec<u64>, u64) {
        let (by_limit, errors) = self.collect_by_limit();
        let mut grants: Vec<u64> = by_limit.into_values().flatten().collect();
        grants.sort_unstable();
        (grants, errors)
    }

    /// Every grant's decision time per limit, and the total of errors the workers met.
    pub fn collect_by_limit(mut self) -> (BTreeMap<String, Vec<u64>>, u64) {
        let mut grants: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut errors = 0;
        for mut child in std::mem::take(&mut self.children) {
            let stdout = child.stdout.take().expect("piped");
            for line in BufReader::new(stdout).lines() {
                let line = line.expect("worker output");
                let mut words = line.split_whitespace();
                match words.next() {
                    Some("grant") => {
                        let at: u64 = words.next().and_then(|w| w.parse().ok()).expect("time");
                        let limit = words.nth(1).unwrap_or_default().to_owned();
                        grants.entry(limit).or_default().push(at);
                    }
                    Some("error") => errors += 1,
                    _ => {}
                }
            }
            let status = child.wait().expect("worker exit");
            assert!(status.success(), "a worker failed: {status}");
        }
        for times in grants.values_mut() {
            times.sort_unstable();
        }
        (grants, errors)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
        }
    }
}

pub fn faketime_library() -> Option<&'static str> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
    ]
    .into_iter()
    .find(|path| std::path::Path::new(path).exists())
}

/// The most grants in any half-open window `[t, t + period)` (sliding) or aligned window
/// (fixed), from the grants' decision times.
pub fn most_in_a_window(grants: &[u64], period_us: u64, algorithm: &str) -> u64 {
    if algorithm == "fixed" {
        let mut per_window = BTreeMap::new();
        for at in grants {
            *per_window.entry(at / period_us).or_insert(0u64) += 1;
        }
        return per_window.into_values().max().unwrap_or(0);
    }
    let mut most = 0;
    let mut start = 0;
    for end in 0..grants.len() {
        while grants[end] - grants[start] >= period_us {
            start += 1;
        }
        most = most.max((end - start + 1) as u64);
    }
    most
}
