"""The chaos soak: a fleet acquiring on several limits through Tollgate servers and through the
library, all on one private Redis, while faults are injected on a seeded schedule; then an
oracle that counts every grant and every vendor call itself judges the run.

Run by ``scripts/soak`` (which builds the binaries and the virtual environment); see
``tests/soak/README.md`` for what runs, what is injected and what the report means.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import oracle
from common import (
    CONCURRENCY_LIMITS,
    FLOOD_LIMIT,
    FLOOD_RULE_CAPPED,
    FLOOD_RULE_REDIS,
    NAMESPACE,
    RATE_LIMITS,
    free_port,
    process_rss_kib,
    rate_limit,
    write_json,
)

HERE = Path(__file__).resolve().parent
#: Where libfaketime's library may be: the list every script reads.
FAKETIME_LIBRARIES = tuple(
    line.strip()
    for line in (HERE.parent / "faketime-libraries").read_text().splitlines()
    if line.strip()
)
#: The link impairment, as netem takes it.
NETEM = ("delay", "20ms", "10ms", "loss", "2%")
#: The memory-store server's key cap (`--keys-tracked-max`).
KEYS_TRACKED_MAX = 50_000
LEASE_TTL_MAX_S = max(limit.lease_ttl_ms for limit in CONCURRENCY_LIMITS) / 1_000


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1h``, ``1h30m`` to seconds."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 10m, 1h)")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(number) * scale[unit] for number, unit in parts)


def log(message: str) -> None:
    print(f"soak {time.strftime('%H:%M:%S')} {message}", flush=True)


def run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=check)


@dataclass
class Proc:
    """A process the soak started, with what it needs to restart it."""

    name: str
    command: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None
    stopped: bool = False

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.popen = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        self.stopped = False

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, number: int) -> None:
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(number)

    def kill(self) -> None:
        if self.popen is not None:
            if self.stopped:
                self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.popen.wait()

    def terminate(self, grace: float) -> bool:
        """SIGTERM, then SIGKILL after ``grace`` seconds; whether it stopped by itself."""
        if self.popen is None or not self.alive():
            return True
        if self.stopped:
            self.signal(signal.SIGCONT)
            self.stopped = False
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(grace)
            return True
        except subprocess.TimeoutExpired:
            self.kill()
            return False


@dataclass(order=True)
class Event:
    at: float
    order: int
    kind: str = field(compare=False)
    action: Callable[[], None] = field(compare=False)


@dataclass
class Network:
    """The namespace that one replica runs in, and how its link is impaired."""

    namespace: str | None = None
    host_link: str | None = None
    ns_link: str | None = None
    host_ip: str = "127.0.0.1"
    ns_ip: str = "127.0.0.1"
    netem: bool = False
    #: Why there is no namespace, or no netem: a line for the report.
    notes: list[str] = field(default_factory=list)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.duration: float = args.duration
        self.seed: int = args.seed
        self.random = random.Random(self.seed)
        self.binaries = Path(args.binaries)
        self.flood_keys: int = args.flood_keys
        self.keep: bool = args.keep
        self.report_path = Path(args.report)
        self.dir = Path(tempfile.mkdtemp(prefix="tollgate-soak-"))
        self.records = self.dir / "records"
        self.logs = self.dir / "logs"
        self.records.mkdir()
        self.logs.mkdir()
        self.procs: dict[str, Proc] = {}
        self.network = Network()
        self.faults: dict[str, int] = {}
        self.fault_log: list[dict[str, Any]] = []
        self.stops: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.events: list[Event] = []
        self.event_order = 0
        self.generation: dict[str, int] = {}
        #: The record tag of the process now in each slot.
        self.tags: dict[str, str] = {}
        self.impaired = False
        self.impaired_seconds = 0.0
        self.impaired_since = 0.0
        self.admin_token = os.urandom(16).hex()
        # Server c listens beyond loopback (in the network namespace), where a data token is
        # required; every server has it, and every process started here reads it from
        # TOLLGATE_SOAK_DATA_TOKEN.
        self.data_token = os.urandom(16).hex()
        os.environ["TOLLGATE_SOAK_DATA_TOKEN"] = self.data_token
        self.data_headers = {"authorization": f"Bearer {self.data_token}"}
        self.permit_secret = os.urandom(16).hex()
        self.faketime = next((p for p in FAKETIME_LIBRARIES if Path(p).exists()), None)
        self.redis_port = free_port()
        self.ports = {"a": free_port(), "b": free_port(), "capped": free_port()}
        self.ns_port = 7070
        self.relay_ports = {"server": free_port(), "redis": 0}
        self.vendor_port = free_port()
        self.worker_files: list[Path] = []
        self.library_files: list[Path] = []
        self.started_at = 0.0
        self.stopped_at = 0.0
        self.deadline_at = 0.0

    # ---- processes ---------------------------------------------------------------------------

    def spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, command, self.logs / f"{name}.log", env)
        proc.start()
        self.procs[name] = proc
        return proc

    def python(self, script: str, *args: str) -> list[str]:
        return [sys.executable, str(HERE / script), *args]

    def wait_for(self, what: str, ready: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{what} not ready after {timeout:.0f} s (logs in {self.logs})")

    # ---- the network namespace ---------------------------------------------------------------

    def set_up_network(self) -> None:
        pid = os.getpid()
        namespace = f"tgsoak{pid}"
        host_link, ns_link = f"tgsh{pid}"[:15], f"tgsn{pid}"[:15]
        subnet = f"10.213.{pid % 250}"
        probe = run("ip", "netns", "add", namespace, check=False)
        if probe.returncode != 0:
            self.network.notes.append(
                "NO NETWORK NAMESPACE: `ip netns add` failed: "
                + (probe.stderr.strip() or f"exit {probe.returncode}")
                + "; replica c runs on loopback and the latency+loss fault is SKIPPED"
            )
            return
        self.network.namespace = namespace
        (self.dir / "netns").write_text(f"{namespace}\n{host_link}\n", encoding="utf-8")
        steps = [
            ("ip", "link", "add", host_link, "type", "veth", "peer", "name", ns_link),
            ("ip", "link", "set", ns_link, "netns", namespace),
            ("ip", "addr", "add", f"{subnet}.1/30", "dev", host_link),
            ("ip", "link", "set", host_link, "up"),
            (
                "ip",
                "netns",
                "exec",
                namespace,
                "ip",
                "addr",
                "add",
                f"{subnet}.2/30",
                "dev",
                ns_link,
            ),
            ("ip", "netns", "exec", namespace, "ip", "link", "set", ns_link, "up"),
            ("ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up"),
        ]
        for step in steps:
            run(*step)
        self.network.host_link, self.network.ns_link = host_link, ns_link
        self.network.host_ip, self.network.ns_ip = f"{subnet}.1", f"{subnet}.2"
        qdisc = run(
            "ip", "netns", "exec", namespace,
            "tc", "qdisc", "add", "dev", ns_link, "root", "netem", *NETEM, check=False,
        )  # fmt: skip
        if qdisc.returncode == 0:
            run("ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", ns_link, "root")
            self.network.netem = True
        else:
            self.network.notes.append(
                "NO NETEM: `tc qdisc add dev "
                + ns_link
                + " root netem "
                + " ".join(NETEM)
                + "` in the namespace failed: "
                + (qdisc.stderr.strip() or f"exit {qdisc.returncode}")
                + " (the kernel has no sch_netem). Latency and loss are EMULATED instead, by"
                " the TCP relay on the namespace's veth path: each chunk held 20 ms +- 10 ms,"
                " 2% of chunks held one more 200 ms retransmission timeout"
            )

    def tear_down_network(self) -> None:
        if self.network.namespace:
            run("ip", "netns", "del", self.network.namespace, check=False)
        if self.network.host_link:
            run("ip", "link", "del", self.network.host_link, check=False)

    def netem(self, on: bool) -> None:
        assert self.network.namespace and self.network.ns_link and self.network.host_link
        verb = "add" if on else "del"
        tail = ("root", "netem", *NETEM) if on else ("root",)
        run(
            "ip", "netns", "exec", self.network.namespace,
            "tc", "qdisc", verb, "dev", self.network.ns_link, *tail, check=False,
        )  # fmt: skip
        run("tc", "qdisc", verb, "dev", self.network.host_link, *tail, check=False)

    # ---- Redis -------------------------------------------------------------------------------

    def start_redis(self) -> None:
        self.spawn(
            "redis",
            [
                "redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.dir),
            ],
        )  # fmt: skip
        self.wait_for("redis-server", lambda: self.redis("PING", check=False) == "PONG")

    def redis(self, *command: str, check: bool = True) -> str:
        result = run("redis-cli", "-p", str(self.redis_port), *command, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(command)}: {result.stderr.strip()}")
        return result.stdout.strip()

    def redis_info(self) -> dict[str, str]:
        info: dict[str, str] = {}
        for line in self.redis("INFO", "memory", check=False).splitlines():
            key, _, value = line.partition(":")
            if value:
                info[key] = value.strip()
        return info

    # ---- servers -----------------------------------------------------------------------------

    def server_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "TOLLGATE_ADMIN_TOKEN": self.admin_token,
                "TOLLGATE_DATA_TOKEN": self.data_token,
                "TOLLGATE_PERMIT_SECRET": self.permit_secret,
                "TOLLGATE_LOG": "warn,tollgate_server=info,tollgate_redis=info",
            }
        )
        return env

    def server_command(self, replica: str) -> list[str]:
        binary = str(self.binaries / "tollgate")
        rules = f"sqlite://{self.dir / 'rules.db'}"
        common = ["--rules", rules, "--reload-interval-ms", "500", "--redis-namespace", NAMESPACE]
        if replica == "c":
            store = f"redis://{self.network.host_ip}:{self.relay_ports['redis']}/0"
            command = [binary, "serve", "--listen", f"{self.network.ns_ip}:{self.ns_port}"]
            command += ["--store", store, *common]
            if self.network.namespace:
                return ["ip", "netns", "exec", self.network.namespace, *command]
            return command
        store = f"redis://127.0.0.1:{self.redis_port}/0"
        listen = f"127.0.0.1:{self.ports[replica]}"
        return [binary, "serve", "--listen", listen, "--store", store, *common]

    def server_url(self, replica: str) -> str:
        if replica == "c":
            return f"http://127.0.0.1:{self.relay_ports['server']}"
        return f"http://127.0.0.1:{self.ports[replica]}"

    def start_server(self, replica: str) -> None:
        self.spawn(f"server-{replica}", self.server_command(replica), self.server_env())

    def ready(self, url: str) -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def admin(self, url: str, method: str, path: str, body: Any = None) -> Any:
        response = httpx.request(
            method,
            f"{url}{path}",
            json=body,
            headers={"authorization": f"Bearer {self.admin_token}"},
            timeout=10.0,
        )
        response.raise_for_status()
        return response.json()

    def limits_in_force(self, url: str) -> set[str]:
        try:
            listed = self.admin(url, "GET", "/v1/limits")
        except httpx.HTTPError:
            return set()
        return {limit["name"] for limit in listed.get("limits", [])}

    def serves_limits(self, url: str, expected: set[str]) -> bool:
        return self.limits_in_force(url) >= expected

    def start_servers(self) -> None:
        self.start_server("a")
        self.wait_for("server a", lambda: self.ready(self.server_url("a")))
        a = self.server_url("a")
        for rate in RATE_LIMITS:
            self.admin(a, "PUT", f"/v1/limits/{rate.name}", rate.rule())
        for concurrency in CONCURRENCY_LIMITS:
            self.admin(a, "PUT", f"/v1/limits/{concurrency.name}", concurrency.rule())
        self.admin(a, "PUT", f"/v1/limits/{FLOOD_LIMIT}", FLOOD_RULE_REDIS)
        expected = self.limits_in_force(a)
        self.start_server("b")
        self.start_server("c")
        for replica in ("b", "c"):
            url = self.server_url(replica)
            self.wait_for(f"server {replica}", functools.partial(self.ready, url))
            self.wait_for(
                f"limits on server {replica}",
                functools.partial(self.serves_limits, url, expected),
            )
        # The key cap lives on the memory store: a server of its own, with the flood's limit.
        capped_rules = f"sqlite://{self.dir / 'capped.db'}"
        self.spawn(
            "server-capped",
            [
                str(self.binaries / "tollgate"), "serve",
                "--listen", f"127.0.0.1:{self.ports['capped']}",
                "--store", "memory", "--keys-tracked-max", str(KEYS_TRACKED_MAX),
                "--rules", capped_rules,
            ],
            self.server_env(),
        )  # fmt: skip
        capped = f"http://127.0.0.1:{self.ports['capped']}"
        self.wait_for("the capped server", lambda: self.ready(capped))
        self.admin(capped, "PUT", f"/v1/limits/{FLOOD_LIMIT}", FLOOD_RULE_CAPPED)

    def start_relay(self) -> None:
        self.relay_ports["redis"] = free_port(self.network.host_ip)
        ready = self.dir / "relay.json"
        self.spawn(
            "relay",
            self.python(
                "relay.py", str(ready), "20", "10", "2", "200",
                f"127.0.0.1:{self.relay_ports['server']}={self.network.ns_ip}:{self.ns_port}",
                f"{self.network.host_ip}:{self.relay_ports['redis']}=127.0.0.1:{self.redis_port}",
            ),
        )  # fmt: skip
        self.wait_for("the relay", ready.exists)

    # ---- workers -----------------------------------------------------------------------------

    def next_tag(self, slot: str) -> str:
        generation = self.generation.get(slot, 0)
        self.generation[slot] = generation + 1
        self.tags[slot] = f"{slot}g{generation}"
        return self.tags[slot]

    def start_worker(self, role: str, slot: str, servers: list[str], tasks: int) -> None:
        tag = self.next_tag(slot)
        path = self.records / f"{tag}.txt"
        self.worker_files.append(path)
        self.spawn(
            slot,
            self.python(
                "worker.py",
                role,
                tag,
                ",".join(servers),
                f"http://127.0.0.1:{self.vendor_port}",
                str(path),
                str(self.random.randrange(2**32)),
                str(tasks),
            ),
        )

    def start_library(self, slot: str, limit_name: str, skew: str | None) -> None:
        tag = self.next_tag(slot)
        path = self.records / f"{tag}.txt"
        self.library_files.append(path)
        limit = rate_limit(limit_name)
        # The library worker's policy has no margin, reserve or burst: the limit it takes must
        # be one whose rule on the servers is the same policy.
        assert limit.shared_with_library, limit_name
        remaining_ms = int((self.duration + 60) * 1_000)
        if skew is not None:
            self.count("clock skew: library worker started with a skewed clock")
            self.fault_log.append({"at": time.time(), "kind": "skew", "slot": slot, "skew": skew})
        self.spawn(
            slot,
            self.python(
                "library.py", tag, str(self.binaries / "tollgate-fleet-worker"),
                f"redis://127.0.0.1:{self.redis_port}/", limit.name, str(limit.limit),
                str(limit.period_ms), limit.algorithm, "6", str(remaining_ms),
                f"http://127.0.0.1:{self.vendor_port}", str(path),
                skew or "-", self.faketime or "-",
            ),
        )  # fmt: skip

    def server_orders(self) -> list[list[str]]:
        urls = [self.server_url(replica) for replica in ("a", "b", "c")]
        return [urls[i:] + urls[:i] for i in range(len(urls))]

    def start_fleet(self) -> None:
        ready = self.dir / "vendor.json"
        self.spawn("vendor", self.python("vendor.py", str(self.vendor_port), str(ready)))
        self.wait_for("the vendor", ready.exists)
        orders = self.server_orders()
        for index in range(3):
            self.start_worker("rate", f"rate{index}", orders[index % 3], tasks=6)
        for index in range(3):
            self.start_worker("holder", f"holder{index}", orders[(index + 1) % 3], tasks=3)
        skewed = self.faketime is not None
        self.start_library("library0", "vendor-sliding", None)
        self.start_library("library1", "vendor-sliding", "+7s" if skewed else None)
        self.start_library("library2", "vendor-fixed", "-5s" if skewed else None)
        targets = [
            f"redis-a=127.0.0.1:{self.ports['a']}",
            f"redis-b=127.0.0.1:{self.ports['b']}",
            f"capped=127.0.0.1:{self.ports['capped']}",
        ]
        self.spawn(
            "flood",
            ["nice", "-n", "10", *self.python(
                "flood.py", str(self.flood_keys), str(self.dir / "flood.json"), ",".join(targets)
            )],
        )  # fmt: skip

    # ---- faults ------------------------------------------------------------------------------

    def count(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def schedule(self, at: float, kind: str, action: Callable[[], None]) -> None:
        self.event_order += 1
        heapq.heappush(self.events, Event(at, self.event_order, kind, action))

    def plan(self) -> None:
        """Each fault recurs at a mean interval, jittered, between a warm-up and a settling
        span; the seed fixes the whole plan."""
        start, end = self.started_at + 10.0, self.started_at + self.duration - 15.0
        every: list[tuple[str, float, Callable[[], None]]] = [
            ("kill -9 lease holder", 25.0, self.kill_holder),
            ("SIGSTOP lease holder past TTL", 40.0, self.stop_holder),
            ("Redis kill -9 and restart empty", 120.0, self.restart_redis),
            ("Redis FLUSHALL", 120.0, self.flush_redis),
            ("latency+loss window", 90.0, self.impair),
            ("server replica kill -9 and restart", 150.0, self.kill_replica),
            ("library worker restarted with a new clock skew", 60.0, self.reskew),
        ]
        for kind, interval, action in every:
            # The first one within the run however short it is, then about every interval.
            at = start + self.random.uniform(0.0, min(interval, end - start))
            while at < end:
                self.schedule(at, kind, action)
                at += interval * self.random.uniform(0.6, 1.4)
        sample_at = self.started_at + 5.0
        while sample_at < self.started_at + self.duration:
            self.schedule(sample_at, "sample", self.sample)
            sample_at += 5.0

    def holders(self) -> list[Proc]:
        return [
            proc
            for name, proc in self.procs.items()
            if name.startswith("holder") and proc.alive() and not proc.stopped
        ]

    def holder_at_work(self) -> Proc | None:
        """A holder process in the middle of work under a lease (the vendor knows which)."""
        try:
            busy = set(httpx.get(f"http://127.0.0.1:{self.vendor_port}/holders").json())
        except httpx.HTTPError:
            busy = set()
        candidates = [proc for proc in self.holders() if proc.pid in busy] or self.holders()
        return self.random.choice(candidates) if candidates else None

    def kill_holder(self) -> None:
        proc = self.holder_at_work()
        if proc is None:
            return
        proc.kill()
        self.count("kill -9 lease holder")
        self.fault_log.append({"at": time.time(), "kind": "kill -9 holder", "pid": proc.pid})
        index = int(proc.name.removeprefix("holder"))
        self.start_worker("holder", proc.name, self.server_orders()[(index + 1) % 3], tasks=3)

    def stop_holder(self) -> None:
        proc = self.holder_at_work()
        if proc is None:
            return
        held = LEASE_TTL_MAX_S * 1.5 + self.random.uniform(0.5, 1.5)
        proc.signal(signal.SIGSTOP)
        proc.stopped = True
        self.count("SIGSTOP lease holder past TTL")
        stop = {
            "pid": proc.pid,
            "tag": self.tags[proc.name],
            "stopped_at": time.time(),
            "for_s": round(held, 3),
        }
        self.stops.append(stop)

        def resume() -> None:
            if proc.stopped:
                proc.signal(signal.SIGCONT)
                proc.stopped = False
                stop["continued_at"] = time.time()

        self.schedule(time.time() + held, "SIGCONT", resume)

    def restart_redis(self) -> None:
        self.procs["redis"].kill()
        self.count("Redis kill -9 and restart empty")
        self.fault_log.append({"at": time.time(), "kind": "redis restart"})
        time.sleep(self.random.uniform(0.2, 1.0))
        self.start_redis()

    def flush_redis(self) -> None:
        self.redis("FLUSHALL", check=False)
        self.count("Redis FLUSHALL")
        self.fault_log.append({"at": time.time(), "kind": "redis flushall"})

    def impair(self) -> None:
        if self.impaired or self.network.namespace is None:
            return
        span = 20.0
        self.set_impaired(True)
        self.count("latency+loss window")
        self.fault_log.append({"at": time.time(), "kind": "latency+loss", "for_s": span})
        self.schedule(time.time() + span, "latency+loss end", lambda: self.set_impaired(False))

    def set_impaired(self, on: bool) -> None:
        if on == self.impaired:
            return
        if self.network.netem:
            self.netem(on)
        else:
            self.procs["relay"].signal(signal.SIGUSR1 if on else signal.SIGUSR2)
        self.impaired = on
        if on:
            self.impaired_since = time.time()
        else:
            self.impaired_seconds += time.time() - self.impaired_since

    def kill_replica(self) -> None:
        replica = self.random.choice(("b", "c"))
        self.procs[f"server-{replica}"].kill()
        self.count("server replica kill -9 and restart")
        self.fault_log.append({"at": time.time(), "kind": "replica kill", "replica": replica})
        time.sleep(self.random.uniform(0.5, 1.5))
        self.start_server(replica)

    def reskew(self) -> None:
        if self.faketime is None:
            return
        slot = self.random.choice(("library1", "library2"))
        proc = self.procs[slot]
        proc.terminate(5.0)
        seconds = self.random.randint(2, 30)
        skew = f"{self.random.choice('+-')}{seconds}s"
        limit_name = "vendor-fixed" if slot == "library2" else "vendor-sliding"
        self.count("kill -9 library worker (restarted with a new skew)")
        self.start_library(slot, limit_name, skew)

    def sample(self) -> None:
        info = self.redis_info()
        sample: dict[str, Any] = {
            "at": time.time(),
            "redis_used_memory": int(info.get("used_memory", "0")),
        }
        try:
            stats = httpx.get(
                f"http://127.0.0.1:{self.ports['capped']}/v1/stats",
                headers=self.data_headers,
                timeout=2.0,
            )
            sample["capped_keys_tracked"] = stats.json()["store"].get("keys_tracked")
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        flood = self.flood_progress()
        self.samples.append(sample)
        elapsed = time.time() - self.started_at
        log(
            f"{elapsed:5.0f}s faults={sum(self.faults.values())} "
            f"redis={sample['redis_used_memory'] / 2**20:.1f}MiB "
            f"capped_keys={sample.get('capped_keys_tracked')} "
            f"flood_keys={flood.get('keys_sent', 0)} ({flood.get('keys_per_s', 0)}/s)"
        )

    def flood_progress(self) -> dict[str, Any]:
        try:
            value: dict[str, Any] = json.loads((self.dir / "flood.json").read_text())
            return value
        except (OSError, ValueError):
            return {}

    # ---- the run -----------------------------------------------------------------------------

    def run(self) -> int:
        log(f"seed {self.seed}; duration {self.duration:.0f} s; work directory {self.dir}")
        if self.faketime is None:
            self.network.notes.append(
                "NO LIBFAKETIME: no skewed clocks (install Debian's faketime package)"
            )
        self.set_up_network()
        for note in self.network.notes:
            log("!!! " + note)
        self.start_redis()
        self.start_relay()
        self.start_servers()
        self.started_at = time.time()
        self.start_fleet()
        self.plan()
        deadline = self.started_at + self.duration
        while self.events and self.events[0].at < deadline:
            event = heapq.heappop(self.events)
            pause = event.at - time.time()
            if pause > 0:
                time.sleep(pause)
            event.action()
        time.sleep(max(0.0, deadline - time.time()))
        return self.finish()

    def finish(self) -> int:
        self.deadline_at = time.time()
        # Undo what is still in force: stopped holders resume, the link heals.
        for proc in self.procs.values():
            if proc.stopped:
                proc.signal(signal.SIGCONT)
                proc.stopped = False
        if self.impaired:
            self.set_impaired(False)
        log("stopping the workers")
        unstopped = []
        for name, proc in self.procs.items():
            if name.startswith(("rate", "holder", "library", "flood")):
                proc.signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            if name.startswith(("rate", "holder", "library", "flood")) and not proc.terminate(30.0):
                unstopped.append(name)
        self.stopped_at = time.time()
        # Every lease still held has now ended or will within one TTL.
        time.sleep(LEASE_TTL_MAX_S + 1.0)
        leases = self.lease_usage()
        memory = self.memory()
        # The flood's counters on Redis expire one window after their last use.
        flood_window = FLOOD_RULE_REDIS["period_ms"] / 1_000
        time.sleep(max(0.0, self.stopped_at + flood_window + 1.0 - time.time()))
        memory["redis_used_memory_after_flood_window"] = int(
            self.redis_info().get("used_memory", "0")
        )
        memory["redis_keys_after_flood_window"] = int(self.redis("DBSIZE", check=False) or 0)
        flood = self.flood_progress()
        vendor_file = self.dir / "vendor.csv"
        httpx.get(
            f"http://127.0.0.1:{self.vendor_port}/dump", params={"path": str(vendor_file)},
            timeout=120.0,
        )  # fmt: skip
        self.procs["relay"].terminate(5.0)
        relay = json.loads((self.dir / "relay.json").read_text())
        for name in ("server-a", "server-b", "server-c", "server-capped", "vendor", "redis"):
            self.procs[name].terminate(15.0)
        log("judging")
        records = oracle.load(self.worker_files, self.library_files, vendor_file)
        verdict = oracle.judge(records, self.started_at + 5.0, self.deadline_at, self.stopped_at)
        report = self.report(verdict, leases, memory, flood, relay, unstopped)
        write_json(self.report_path, report)
        print_report(report)
        log(f"report written to {self.report_path}")
        return 0 if report["passed"] else 1

    def lease_usage(self) -> dict[str, Any]:
        """Leases leaked, judged from outside: with every worker stopped and one TTL gone, a
        request for the whole of each concurrency limit at high priority must be granted (and is
        then released). A lease still held, whatever Tollgate reports, refuses it. `used` from
        `GET /v1/stats`, Tollgate's own account, is kept beside it for the report."""
        out: dict[str, Any] = {}
        for limit in CONCURRENCY_LIMITS:
            entry: dict[str, Any] = {"limit": limit.limit}
            try:
                answer = httpx.post(
                    f"{self.server_url('a')}/v1/acquire",
                    json={"limits": [limit.name], "cost": limit.limit, "priority": "high"},
                    headers=self.data_headers,
                    timeout=10.0,
                )
                body = answer.json()
                entry["whole_limit_status"] = answer.status_code
                if answer.status_code == 200:
                    entry["leaked"] = 0
                    httpx.post(
                        f"{self.server_url('a')}/v1/permits/{body['permit']}/commit",
                        json={"used": limit.limit},
                        headers=self.data_headers,
                        timeout=10.0,
                    ).raise_for_status()
                else:
                    # Refused: at least one lease is still held (or the answer says why not).
                    entry["leaked"] = None if answer.status_code != 429 else 1
                    entry["refusal"] = body
            except (httpx.HTTPError, ValueError, KeyError) as error:
                entry["leaked"] = None
                entry["error"] = repr(error)
            try:
                stats = httpx.get(
                    f"{self.server_url('a')}/v1/stats",
                    params={"limit": limit.name},
                    headers=self.data_headers,
                    timeout=10.0,
                ).json()
                entry["used_by_stats"] = stats["limits"][0]["usage"].get("used")
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as error:
                entry["used_by_stats"] = None
                entry["stats_error"] = repr(error)
            out[limit.name] = entry
        return out

    def memory(self) -> dict[str, Any]:
        info = self.redis_info()
        capped: dict[str, Any] = {}
        try:
            stats = httpx.get(
                f"http://127.0.0.1:{self.ports['capped']}/v1/stats",
                headers=self.data_headers,
                timeout=10.0,
            )
            capped = stats.json()["store"]
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        return {
            "redis_used_memory": int(info.get("used_memory", "0")),
            "redis_used_memory_peak": int(info.get("used_memory_peak", "0")),
            "redis_keys": int(self.redis("DBSIZE", check=False) or 0),
            "redis_used_memory_most_sampled": max(
                (s["redis_used_memory"] for s in self.samples), default=0
            ),
            "capped_keys_tracked": capped.get("keys_tracked"),
            "capped_keys_tracked_max": capped.get("keys_tracked_max"),
            # Unread samples stay None: a count that could not be read is not a count of 0.
            "capped_keys_tracked_most_sampled": max(
                (s["capped_keys_tracked"] for s in self.samples
                 if isinstance(s.get("capped_keys_tracked"), int)),
                default=None,
            ),
            "capped_keys_tracked_samples_unread": sum(
                1 for s in self.samples if not isinstance(s.get("capped_keys_tracked"), int)
            ),
            "capped_server_rss_kib": process_rss_kib(self.procs["server-capped"].pid),
            "replica_rss_kib": {
                replica: process_rss_kib(self.procs[f"server-{replica}"].pid)
                for replica in ("a", "b")
            },
        }

    def fenced_stops(self) -> dict[str, Any]:
        """What each SIGSTOP led to: after it was continued, the stopped holder's renewal
        of a lease that had surely expired meanwhile was refused, or it held no lease then."""
        refused_after: dict[str, list[int]] = {}
        for path in self.worker_files:
            for words in oracle.read_lines(path):
                if words[0] == "r" and words[3] == "refused" and int(words[4]) > int(words[6]):
                    refused_after.setdefault(path.stem, []).append(int(words[4]))
        refused = 0
        for stop in self.stops:
            times = refused_after.get(stop["tag"], [])
            stop["renewal_refused"] = any(at >= stop["stopped_at"] * 1e6 for at in times)
            refused += stop["renewal_refused"]
        return {"stops": len(self.stops), "stopped_holder_renewal_refused": refused}

    def report(
        self,
        verdict: dict[str, Any],
        leases: dict[str, Any],
        memory: dict[str, Any],
        flood: dict[str, Any],
        relay: dict[str, Any],
        unstopped: list[str],
    ) -> dict[str, Any]:
        overshoot = {name: r["overshoot"] for name, r in verdict["rate"].items()}
        overshoot.update({name: c["overshoot"] for name, c in verdict["concurrency"].items()})
        leaked = sum((lease.get("leaked") or 0) for lease in leases.values())
        unknown_leases = [name for name, lease in leases.items() if lease.get("leaked") is None]
        failures = [f"overshoot on {name}: {n}" for name, n in overshoot.items() if n]
        for name, judged in verdict["rate"].items():
            failures.extend(f"{name}: blind: {why}" for why in judged["blind"])
        if leaked:
            failures.append(f"leases leaked on {[n for n, l in leases.items() if l.get('leaked')]}")
        if unknown_leases:
            failures.append(f"whether leases leaked could not be told: {unknown_leases}")
        # The key cap is read from the memory store's own stats: its keys live in its process,
        # where nothing outside can count them (Redis's keys, SCAN, are the other stores').
        tracked = memory["capped_keys_tracked"]
        most_sampled = memory["capped_keys_tracked_most_sampled"]
        if not isinstance(tracked, int) or most_sampled is None:
            failures.append("the memory store's key count could not be read")
        over_cap = any(
            isinstance(count, int) and count > KEYS_TRACKED_MAX for count in (tracked, most_sampled)
        )
        if verdict["renewals"]["accepted_after_expiry"]:
            failures.append("a lease was renewed after it had expired")
        if over_cap:
            failures.append("the memory store tracks more keys than its cap")
        if os.environ.get("CI") == "true" and not self.network.namespace:
            # CI runs every part: a fault that could not be injected fails the run there.
            failures.append("SKIPPED under CI=true: the latency+loss fault (no network namespace)")
        faults = dict(sorted(self.faults.items()))
        if self.impaired_seconds:
            faults["latency+loss seconds"] = round(self.impaired_seconds)
        return {
            "passed": not failures,
            "failures": failures,
            "seed": self.seed,
            "duration_s": round(self.deadline_at - self.started_at, 1),
            "notes": self.network.notes,
            "latency_loss_by": (
                "netem"
                if self.network.netem
                else "relay emulation"
                if self.network.namespace
                else "skipped"
            ),
            "load": verdict["load"],
            "faults": faults,
            "sigstop": self.fenced_stops() | {"stops_detail": self.stops},
            "renewals": verdict["renewals"],
            "overshoot": overshoot,
            "rate": verdict["rate"],
            "concurrency": verdict["concurrency"],
            "delays": verdict["delays"],
            "leases_leaked": leaked,
            "leases": leases,
            "memory": memory,
            "flood": flood,
            "relay": relay,
            "errors": verdict["errors"],
            "denials": verdict["denials"],
            "workers_that_did_not_stop_on_sigterm": unstopped,
            "fault_log": self.fault_log,
        }

    # ---- cleanup -----------------------------------------------------------------------------

    def clean_up(self, failed: bool) -> None:
        for proc in self.procs.values():
            if proc.alive():
                proc.kill()
        self.tear_down_network()
        if self.keep or failed:
            log(f"kept the work directory {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def mib(value: float | int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"


def print_report(report: dict[str, Any]) -> None:
    load = report["load"]
    lines = [
        "",
        "=" * 78,
        f"TOLLGATE SOAK  seed {report['seed']}  duration {report['duration_s']:.0f} s  "
        + ("PASSED" if report["passed"] else "FAILED"),
        "=" * 78,
    ]
    lines += [f"!!! {note}" for note in report["notes"]]
    lines += [
        "",
        "LOAD HELD",
        f"  decisions                 {load['decisions']:>10}  ({load['server_decisions']} through"
        f" servers, {load['library_grants']} library grants)",
        f"  decisions/s               {load['decisions_per_s']:>10}  (lowest 10 s:"
        f" {load['lowest_10s_decisions_per_s']}, highest: {load['highest_10s_decisions_per_s']})",
        f"  key flood decisions/s     {report['flood'].get('keys_per_s', 0):>10}  (one per key,"
        " on top of the above)",
        "",
        "FAULTS INJECTED",
    ]
    lines += [f"  {kind:<52}{count:>8}" for kind, count in report["faults"].items()]
    lines += [f"  latency+loss applied by: {report['latency_loss_by']}"]
    flood = report["flood"]
    lines += [
        f"  key flood: {flood.get('keys_sent', 0)} distinct keys of {flood.get('keys_max', 0)}"
        f" in {flood.get('elapsed_s', 0):.0f} s ({flood.get('keys_per_s', 0)} keys/s)",
    ]
    if flood.get("keys_per_s") and flood.get("keys_sent", 0) < flood.get("keys_max", 0):
        minutes = flood["keys_max"] / flood["keys_per_s"] / 60
        lines.append(
            f"    NOT all {flood['keys_max']} keys: at this rate they take {minutes:.0f} min"
            " (--duration longer, or --flood-keys fewer)"
        )
    for target, answers in sorted(flood.get("answers", {}).items()):
        lines.append(f"    {target:<10} {json.dumps(answers, sort_keys=True)}")
    lines += ["", "OVERSHOOT (must be 0)"]
    lines.append(
        f"  {'limit':<16}{'algorithm':<10}{'bound':>6}{'window':>9}{'grants':>9}"
        f"{'most':>6}{'vendor':>8}{'window':>9}{'most':>6}{'over':>6}"
    )
    for name, rate in report["rate"].items():
        lines.append(
            f"  {name:<16}{rate['algorithm']:<10}{rate['bound']:>6}{rate['window_ms']:>7.0f}ms"
            f"{rate['grants']:>9}{rate['most_granted_in_a_window']:>6}{rate['vendor_calls']:>8}"
            f"{rate['vendor_window_ms']:>7.0f}ms{rate['most_vendor_calls_in_a_window']:>6}"
            f"{rate['overshoot']:>6}"
        )
        for level, check in rate.get("reserves", {}).items():
            lines.append(
                f"    reserve: {level:<16} most {check['most']} <= {check['bound']}"
                f"  over {check['over']}"
            )
    for name, conc in report["concurrency"].items():
        lines.append(
            f"  {name:<16}{'leases':<10}{conc['limit']:>6}{'':>9}{conc['leases']:>9}"
            f"{conc['most_in_flight']:>6}   in flight at the vendor; below high"
            f" {conc['most_in_flight_below_high']} <= {conc['bound_below_high']};"
            f" over {conc['overshoot']}"
        )
    delays = report["delays"]
    exact = delays["library_exact_us"]
    prompt = delays["server_prompt_upper_bound_us"]
    other = delays["server_other_from_answer_us"]
    lines += [
        f"  grant-to-vendor delay: library, exact: max {exact['max'] / 1e3:.1f} ms, p99"
        f" {exact['p99'] / 1e3:.1f} ms; server, answered within 100 ms (upper bound): max"
        f" {prompt['max'] / 1e3:.1f} ms, p99 {prompt['p99'] / 1e3:.1f} ms;",
        f"  server, other (from reading the answer; counted from the request): max"
        f" {other['max'] / 1e3:.1f} ms, p99 {other['p99'] / 1e3:.1f} ms",
        f"  vendor windows are shortened by the longest delay up to 500 ms,"
        f" {delays['max_us'] / 1e3:.1f} ms; {delays['late_calls']} calls later than that,"
        f" counted by their own spans; {delays['grants_without_vendor_call']} grants made no"
        " vendor call",
        "",
        "FENCING",
    ]
    sigstop = report["sigstop"]
    renewals = report["renewals"]
    stale = sum(c["stale_writes_refused_by_vendor"] for c in report["concurrency"].values())
    lines += [
        f"  SIGSTOPs past the TTL {sigstop['stops']}; stopped holder's renewal refused (409)"
        f" {sigstop['stopped_holder_renewal_refused']}",
        f"  renewals: ok {renewals['renewed']}, refused after a stall"
        f" {renewals['refused_after_stall']},"
        f" refused otherwise (lease lost with Redis) {renewals['refused_lease_lost_otherwise']},"
        f" failed {renewals['failed']}, ACCEPTED AFTER EXPIRY {renewals['accepted_after_expiry']}",
        f"  stale fenced writes refused by the vendor: {stale}",
        "",
        f"LEASES LEAKED (must be 0; the whole limit asked for and granted): "
        f"{report['leases_leaked']}  "
        + ", ".join(
            f"{name} whole limit: {lease.get('whole_limit_status')}, "
            f"used by stats={lease.get('used_by_stats')}"
            for name, lease in report["leases"].items()
        ),
        "",
        "MEMORY AT THE END",
    ]
    memory = report["memory"]
    lines += [
        f"  Redis used_memory {mib(memory['redis_used_memory'])} (peak"
        f" {mib(memory['redis_used_memory_peak'])}, most sampled"
        f" {mib(memory['redis_used_memory_most_sampled'])}), keys {memory['redis_keys']}",
        f"  Redis one flood window later: used_memory"
        f" {mib(memory['redis_used_memory_after_flood_window'])},"
        f" keys {memory['redis_keys_after_flood_window']}",
        f"  memory store: keys tracked {memory['capped_keys_tracked']} of cap"
        f" {memory['capped_keys_tracked_max']} (most sampled"
        f" {memory['capped_keys_tracked_most_sampled']}), RSS"
        f" {mib((memory['capped_server_rss_kib'] or 0) * 1024)}",
        "",
        "ERRORS SEEN BY CALLERS, BY CODE",
        f"  through servers: {json.dumps(report['errors']['server'], sort_keys=True)}",
        f"  library:         {json.dumps(report['errors']['library'], sort_keys=True)}",
        f"  denials (429) by reason: {json.dumps(report['denials'], sort_keys=True)}",
        "",
    ]
    if report["failures"]:
        lines += ["FAILURES"] + [f"  {failure}" for failure in report["failures"]] + [""]
    print("\n".join(lines), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=parse_duration, default=600.0, help="e.g. 10m, 90s")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--flood-keys", type=int, default=10_000_000)
    parser.add_argument("--binaries", required=True, help="directory of tollgate binaries")
    parser.add_argument("--report", default=str(HERE / "out" / "report.json"))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**31)
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    soak = Soak(args)

    def interrupted(_signal: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    failed = True
    try:
        status = soak.run()
        failed = status != 0
        return status
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except Exception:
        traceback.print_exc()
        return 2
    finally:
        soak.clean_up(failed)


if __name__ == "__main__":
    sys.exit(main())
