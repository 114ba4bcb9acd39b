"""The oracle: counts every grant and every vendor call from the workers' and the vendor's
records, never from Tollgate's own counters, and judges them against each limit.

Two views of each rate limit:

- **grants**: when each grant was decided. A library worker prints the store's decision time
  (exact); a server's client knows only that the decision fell between sending the request
  and reading the answer. A grant is counted in a window only when all of its possible times
  lie inside it, so a count above the limit is an overshoot for certain.
- **vendor**: when each call reached the vendor. A call whose delay was measured (library
  grants exactly; server grants answered within 100 ms, from sending the request) arrives up
  to D after its grant, D being the longest such delay up to 500 ms, so those that reach the
  vendor in any window of the algorithm's width minus D were all granted within one window.
  Any other call, and a late one (measured, over 500 ms), was granted between sending its
  request (or its grant) and reaching the vendor, and is counted in a window only when that
  whole span lies inside it. A view that would count nothing, or leaves more than 1 % of the
  calls late, or more than 5 % of the waited grants in no window, is blind: a failure.

Concurrency: the vendor sees each lease holder's work from its ``begin`` to its ``end``; work
counts as in flight until its end, or until the lease could have expired (the holder sends
that time with ``begin``), whichever comes first. At no time may more be in flight than the
limit, nor more from holders below high priority than the limit less the high reserve.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    CONCURRENCY_LIMITS,
    RATE_LIMITS,
    ConcurrencyLimit,
    RateLimit,
)

Interval = tuple[int, int]


def deepest_overlap(ranges: list[Interval]) -> tuple[int, int]:
    """The most half-open ranges ``[start, end)`` overlapping at one point, and that point."""
    events = [(start, 1) for start, end in ranges if end > start]
    events += [(end, -1) for start, end in ranges if end > start]
    # At one coordinate, ranges ending there (exclusive) go before ranges starting there.
    events.sort()
    depth = most = 0
    where = 0
    for at, step in events:
        depth += step
        if depth > most:
            most, where = depth, at
    return most, where


def most_in_any_window(intervals: list[Interval], width: int) -> tuple[int, int]:
    """The most intervals lying wholly inside one half-open window ``[a, a + width)``, and the
    window's start. An interval ``[lo, hi]`` lies inside it when ``a`` is in
    ``[hi - width + 1, lo]``; the answer is the deepest overlap of those ranges."""
    return deepest_overlap([(hi - width + 1, lo + 1) for lo, hi in intervals])


def most_in_aligned_window(intervals: list[Interval], width: int) -> tuple[int, int]:
    """The most intervals lying wholly inside one aligned window ``[k * width, (k + 1) *
    width)``, and that window's start."""
    per_window: dict[int, int] = defaultdict(int)
    for lo, hi in intervals:
        if lo // width == hi // width:
            per_window[lo // width] += 1
    if not per_window:
        return 0, 0
    window, most = max(per_window.items(), key=lambda item: item[1])
    return most, window * width


@dataclass
class Grant:
    call: str
    limits: tuple[str, ...]
    priority: str
    lo: int
    hi: int
    exact: bool
    #: The longest wait the client asked for (ms); 0 for library grants.
    wait_ms: int = 0


@dataclass
class Lease:
    lease: str
    limit: str
    priority: str
    fence: int


@dataclass
class Renewal:
    lease: str
    limit: str
    outcome: str
    sent: int
    received: int
    expired_by: int
    source: str


@dataclass
class Records:
    grants: list[Grant] = field(default_factory=list)
    leases: dict[str, Lease] = field(default_factory=dict)
    renewals: list[Renewal] = field(default_factory=list)
    #: (second, kind, detail) -> count, for the server path and for the library path.
    counts: dict[str, dict[tuple[int, str, str], int]] = field(
        default_factory=lambda: {"server": defaultdict(int), "library": defaultdict(int)}
    )
    #: Vendor: (arrival, kind, limit, id, pid, fence, until, accepted).
    vendor: list[tuple[int, str, str, str, int, int, int, bool]] = field(default_factory=list)


def read_lines(path: Path) -> list[list[str]]:
    """A record file's lines, split; a torn last line (a worker killed mid-write) dropped."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] != "":
        lines = lines[:-1]
    return [line.split() for line in lines if line]


def load(worker_files: list[Path], library_files: list[Path], vendor_file: Path) -> Records:
    records = Records()
    for path in worker_files:
        for words in read_lines(path):
            kind = words[0]
            if kind == "g" and len(words) == 7:
                records.grants.append(
                    Grant(
                        call=words[1],
                        limits=tuple(words[2].split(",")),
                        priority=words[3],
                        lo=int(words[5]),
                        hi=int(words[6]),
                        exact=False,
                        wait_ms=int(words[4]),
                    )
                )
            elif kind == "L" and len(words) == 7:
                records.leases[words[1]] = Lease(words[1], words[2], words[3], int(words[4]))
            elif kind == "r" and len(words) == 7:
                records.renewals.append(
                    Renewal(
                        lease=words[1],
                        limit=words[2],
                        outcome=words[3],
                        sent=int(words[4]),
                        received=int(words[5]),
                        expired_by=int(words[6]),
                        source=path.stem,
                    )
                )
            elif kind == "c" and len(words) == 5:
                records.counts["server"][(int(words[1]), words[2], words[3])] += int(words[4])
    for path in library_files:
        for words in read_lines(path):
            if words[0] == "G" and len(words) == 5:
                decided = int(words[3])
                records.grants.append(
                    Grant(
                        call=words[1],
                        limits=(words[2],),
                        priority="normal",
                        lo=decided,
                        hi=decided,
                        exact=True,
                    )
                )
            elif words[0] == "c" and len(words) == 5:
                records.counts["library"][(int(words[1]), words[2], words[3])] += int(words[4])
    for line in vendor_file.read_text(encoding="utf-8").splitlines():
        arrival, kind, limit, ident, pid, fence, until, accepted = line.split(",")
        records.vendor.append(
            (int(arrival), kind, limit, ident, int(pid), int(fence), int(until), accepted == "1")
        )
    return records


def percentile(values: list[int], fraction: float) -> int:
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def delay_summary(values: list[int]) -> dict[str, int]:
    return {
        "count": len(values),
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values, default=0),
    }


#: The share of a limit's waited server grants that may span a whole window (and so fit in no
#: window of either view) before the judgement counts as blind to them.
WAITED_UNCOUNTABLE_SHARE_MAX = 0.05

#: A call that reached the vendor more than this long after its grant (a stalled worker or a
#: starved machine) is "late": it does not set D, the delay that shortens every vendor window
#: (one stall would otherwise shorten them to nothing), and is counted by its own span, from
#: its grant (or its request) to its arrival, as a waited grant's call is.
LATE_DELAY_US = 500_000
#: The share of a limit's calls that may be late before the vendor view counts as blind.
LATE_SHARE_MAX = 0.01

#: A server grant's delay counts as measured when its request was answered within this long:
#: its decision then lies within that span of the answer.
MEASURED_BRACKET_US = 100_000


def delay_measured(grant: Grant) -> bool:
    """Whether a grant's delay to the vendor is known, exactly or to within the bracket."""
    return grant.exact or grant.hi - grant.lo <= MEASURED_BRACKET_US


def delays(records: Records) -> dict[str, Any]:
    """Grant-to-call delays, in microseconds.

    - library grants: exact, from the store's decision to the vendor's receipt;
    - server grants answered within 100 ms of the request: an upper bound, from sending the
      request (the decision came later) to the vendor's receipt, the answer's way back in it;
    - other server grants (that waited, or whose answer was slow): only a lower bound is
      known, from reading the answer.

    The longest delay D is the largest of the first two: every call of those reached the
    vendor within D of its grant. Of the other calls, only that their grant came after their
    request was sent is sure (``judge_rate``).
    """
    arrivals: dict[tuple[str, str], int] = {}
    for arrival, kind, limit, ident, *_ in records.vendor:
        if kind == "call":
            arrivals[(ident, limit)] = arrival
    exact: list[int] = []
    measured: list[int] = []
    from_answer: list[int] = []
    unmatched = 0
    for grant in records.grants:
        for limit in grant.limits:
            arrived = arrivals.get((grant.call, limit))
            if arrived is None:
                unmatched += 1
            elif grant.exact:
                exact.append(arrived - grant.lo)
            elif delay_measured(grant):
                measured.append(arrived - grant.lo)
            else:
                from_answer.append(arrived - grant.hi)
    prompt = [d for d in exact + measured if d <= LATE_DELAY_US]
    return {
        "library_exact_us": delay_summary(exact),
        "server_prompt_upper_bound_us": delay_summary(measured),
        "server_other_from_answer_us": delay_summary(from_answer),
        "max_us": max(prompt, default=0),
        "late_calls": len(exact) + len(measured) - len(prompt),
        "grants_without_vendor_call": unmatched,
    }


def judge_rate(limit: RateLimit, records: Records, slack_us: int) -> dict[str, Any]:
    bound, width = limit.bound()
    aligned = limit.algorithm == "fixed"
    count = most_in_aligned_window if aligned else most_in_any_window
    grants = [g for g in records.grants if limit.name in g.limits]
    intervals = [(g.lo, g.hi) for g in grants]
    most_granted, granted_at = count(intervals, width)
    by_call = {g.call: g for g in grants}
    calls = [
        (a, ident)
        for a, kind, name, ident, *_ in records.vendor
        if kind == "call" and name == limit.name
    ]
    # A call whose delay was measured arrived within the longest measured delay of its grant;
    # of another, only that it was granted after its request was sent is sure.
    # A late call (``LATE_DELAY_US``) is counted like the latter.
    vendor_intervals = []
    late = 0
    for arrival, ident in calls:
        grant = by_call.get(ident)
        if grant is None:
            vendor_intervals.append((arrival - slack_us, arrival))
        elif delay_measured(grant) and arrival - grant.lo <= LATE_DELAY_US:
            vendor_intervals.append((arrival - slack_us, arrival))
        else:
            late += delay_measured(grant)
            vendor_intervals.append((grant.lo, arrival))
    most_called, called_at = count(vendor_intervals, width)
    # Blind spots, each a failure (``blind``): with the longest grant-to-call delay as long as a
    # window, no vendor window of width minus that delay is left, and the vendor view counts
    # nothing; a server grant that waited, bracketed by a span as long as a window, fits no
    # window in either view. A few such grants are the price of bracketing; most of them
    # uncounted would leave waited grants, the path that hands out room as it frees, unjudged.
    waited = [g for g in grants if not g.exact and g.wait_ms > 0]
    waited_uncountable = sum(1 for g in waited if g.hi - g.lo >= width)
    blind: list[str] = []
    if calls and slack_us >= width:
        blind.append(
            f"the longest grant-to-call delay ({slack_us / 1_000:.0f} ms) reaches the window "
            f"({width / 1_000:.0f} ms): the vendor view counts no call of a timed grant"
        )
    if late > LATE_SHARE_MAX * len(calls):
        blind.append(
            f"{late} of {len(calls)} calls reached the vendor over "
            f"{LATE_DELAY_US / 1_000:.0f} ms after their grant: counted by their own spans only"
        )
    if waited and waited_uncountable > WAITED_UNCOUNTABLE_SHARE_MAX * len(waited):
        blind.append(
            f"{waited_uncountable} of {len(waited)} waited server grants span a whole window "
            f"and cannot be counted"
        )
    result: dict[str, Any] = {
        "algorithm": limit.algorithm,
        "bound": bound,
        "window_ms": width / 1_000,
        "aligned_windows": aligned,
        "grants": len(grants),
        "grants_exact_time": sum(1 for g in grants if g.exact),
        "most_granted_in_a_window": most_granted,
        "most_granted_window_start_us": granted_at,
        "waited_server_grants": len(waited),
        "waited_server_grants_uncountable": waited_uncountable,
        "blind": blind,
        "vendor_calls": len(calls),
        "vendor_calls_late": late,
        "vendor_window_ms": (width - slack_us) / 1_000,
        "most_vendor_calls_in_a_window": most_called,
        "most_vendor_calls_window_start_us": called_at,
        # The most units above the bound in one window, in either view.
        "overshoot": max(0, most_granted - bound, most_called - bound),
    }
    if limit.margin_ms and limit.algorithm == "sliding":
        # What the vendor itself would count in its own period, had the margin covered every
        # delay (it does when the longest delay is below the margin).
        most_in_period, _ = most_in_any_window([(a, a) for a, _ in calls], limit.period_ms * 1_000)
        result["vendor_calls_in_its_own_period"] = most_in_period
        result["margin_covers_delay"] = slack_us <= limit.margin_ms * 1_000
    if limit.reserve_high or limit.reserve_normal:
        result["reserves"] = judge_reserves(limit, grants, count, width)
        result["overshoot"] = max(
            result["overshoot"], *(r["over"] for r in result["reserves"].values())
        )
    return result


def judge_reserves(
    limit: RateLimit, grants: list[Grant], count: Any, width: int
) -> dict[str, dict[str, int]]:
    """Units below high priority never take the high reserve, and low never the normal one."""
    checks = {
        "normal_and_low": ({"normal", "low"}, limit.limit - limit.reserve_high),
        "low": ({"low"}, limit.limit - limit.reserve_high - limit.reserve_normal),
    }
    if limit.algorithm == "gcra":
        # The burst is what a gcra limit lends at once; its reserves are parts of it.
        burst = limit.burst if limit.burst is not None else limit.limit
        checks = {
            "normal_and_low": ({"normal", "low"}, burst - limit.reserve_high + limit.limit - 1),
            "low": (
                {"low"},
                burst - limit.reserve_high - limit.reserve_normal + limit.limit - 1,
            ),
        }
    out: dict[str, dict[str, int]] = {}
    for name, (priorities, bound) in checks.items():
        most, _ = count([(g.lo, g.hi) for g in grants if g.priority in priorities], width)
        out[name] = {"bound": bound, "most": most, "over": max(0, most - bound)}
    return out


def judge_concurrency(limit: ConcurrencyLimit, records: Records, end_us: int) -> dict[str, Any]:
    begins: dict[str, tuple[int, int]] = {}
    ends: dict[str, int] = {}
    refused_writes = 0
    for arrival, kind, name, ident, _pid, _fence, until, accepted in records.vendor:
        if name != limit.name:
            continue
        if not accepted:
            refused_writes += 1
        if kind == "begin" and accepted:
            begins[ident] = (arrival, until)
        elif kind == "end":
            ends[ident] = arrival
    work: list[Interval] = []
    below_high: list[Interval] = []
    for ident, (start, until) in begins.items():
        interval = (start, min(ends.get(ident, end_us), until))
        work.append(interval)
        lease = records.leases.get(ident.rsplit(".", 1)[0])
        if lease is not None and lease.priority != "high":
            below_high.append(interval)
    most, when = deepest_overlap(work)
    most_below_high, _ = deepest_overlap(below_high)
    bound_below_high = limit.limit - limit.reserve_high
    return {
        "limit": limit.limit,
        "leases": sum(1 for lease in records.leases.values() if lease.limit == limit.name),
        "work_segments": len(work),
        "most_in_flight": most,
        "most_in_flight_at_us": when,
        "most_in_flight_below_high": most_below_high,
        "bound_below_high": bound_below_high,
        "stale_writes_refused_by_vendor": refused_writes,
        "overshoot": max(0, most - limit.limit, most_below_high - bound_below_high),
    }


def judge_renewals(records: Records) -> dict[str, int]:
    """Renewals that came surely after the lease had expired (its holder stalled past the
    TTL) must be refused; an accepted one is a fencing failure."""
    out = {
        "renewed": 0,
        "refused_after_stall": 0,
        "refused_lease_lost_otherwise": 0,
        "accepted_after_expiry": 0,
        "failed": 0,
    }
    for renewal in records.renewals:
        late = renewal.sent > renewal.expired_by
        if renewal.outcome == "ok":
            out["accepted_after_expiry" if late else "renewed"] += 1
        elif renewal.outcome == "refused":
            out["refused_after_stall" if late else "refused_lease_lost_otherwise"] += 1
        else:
            out["failed"] += 1
    return out


def per_second(counts: dict[tuple[int, str, str], int], kinds: set[str]) -> dict[int, int]:
    seconds: dict[int, int] = defaultdict(int)
    for (second, kind, _detail), count in counts.items():
        if kind in kinds:
            seconds[second] += count
    return seconds


def by_detail(counts: dict[tuple[int, str, str], int], kind: str) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for (_second, k, detail), count in counts.items():
        if k == kind:
            out[detail] += count
    return dict(sorted(out.items()))


def load_summary(records: Records, start: float, end: float) -> dict[str, Any]:
    """Decisions per second: grants and denials answered to the servers' clients, plus the
    grants of the library workers (which print no denials)."""
    server = per_second(records.counts["server"], {"grant", "deny"})
    library = per_second(records.counts["library"], {"grant"})
    first, last = int(start), int(end)
    seconds = range(first, last)
    totals = [server.get(s, 0) + library.get(s, 0) for s in seconds]
    buckets = [sum(totals[i : i + 10]) / 10 for i in range(0, len(totals) - 9, 10)]
    span = max(1, len(totals))
    return {
        "decisions": sum(totals),
        "server_decisions": sum(server.get(s, 0) for s in seconds),
        "library_grants": sum(library.get(s, 0) for s in seconds),
        "decisions_per_s": round(sum(totals) / span, 1),
        "lowest_10s_decisions_per_s": round(min(buckets, default=0.0), 1),
        "highest_10s_decisions_per_s": round(max(buckets, default=0.0), 1),
    }


def judge(records: Records, load_from: float, load_to: float, end: float) -> dict[str, Any]:
    """The verdict on a run: load counted over ``[load_from, load_to)``; work still open at
    ``end`` (its holder killed) counted until then, or until its lease could have expired."""
    delay = delays(records)
    slack = delay["max_us"]
    end_us = int(end * 1e6)
    return {
        "load": load_summary(records, load_from, load_to),
        "delays": delay,
        "rate": {limit.name: judge_rate(limit, records, slack) for limit in RATE_LIMITS},
        "concurrency": {
            limit.name: judge_concurrency(limit, records, end_us) for limit in CONCURRENCY_LIMITS
        },
        "renewals": judge_renewals(records),
        "errors": {
            "server": by_detail(records.counts["server"], "error"),
            "library": by_detail(records.counts["library"], "error"),
        },
        "denials": by_detail(records.counts["server"], "deny"),
    }
