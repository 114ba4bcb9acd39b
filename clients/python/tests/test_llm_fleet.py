"""Token budgets judged by the model, across processes: three worker processes
(``_llm_worker.py``, three threads each) call ``tollgate-mock-model`` through
``TollgateTransport(..., llm=...)`` and one real ``tollgate`` server for
``TOLLGATE_LLM_SECONDS`` (20), with mixed APIs, streamed and whole answers of random lengths,
every request capped, and calls failed, cut off or cancelled. The figures are the model's own
count, never Tollgate's: no 429 and no window over any of its limits. The output per minute it
counted is printed (``pytest -s`` shows it; ``docs/lab.md`` records it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from _support import Server, find_binary, unique
from test_llm import MockModel
from tollgate_client import Client

PROCESSES = 3
CALLERS = 3
PERIOD_MS = 5_000
RPM, ITPM, OTPM = 200, 60_000, 6_000
WORKER = Path(__file__).with_name("_llm_worker.py")


def _model_binary() -> str | None:
    try:
        tollgate = find_binary()
    except RuntimeError:
        return None
    binary = os.environ.get("TOLLGATE_MOCK_MODEL_BIN") or str(
        Path(tollgate).parent / "tollgate-mock-model"
    )
    return binary if os.access(binary, os.X_OK) else None


def _skip_loudly(why: str) -> None:
    message = f"SKIPPED the token-budget fleet test: {why}"
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    print(f"\n*** {message} ***", file=sys.stderr)
    warnings.warn(message, stacklevel=2)
    pytest.skip(message)


def test_three_processes_with_max_tokens_never_pass_the_models_limits(
    client: Client, server: Server, tmp_path: Path
) -> None:
    if _model_binary() is None:
        _skip_loudly(
            "no tollgate-mock-model beside the tollgate binary (cargo build -p tollgate-fleet "
            "--bin tollgate-mock-model, or set TOLLGATE_MOCK_MODEL_BIN)"
        )
    seconds = float(os.environ.get("TOLLGATE_LLM_SECONDS", "20"))
    names = {kind: unique(f"llm-{kind}") for kind in ("requests", "input", "output", "overrun")}
    client.limits.put(names["requests"], kind="rate", limit=RPM, period_ms=PERIOD_MS)
    client.limits.put(names["input"], kind="rate", limit=ITPM, period_ms=PERIOD_MS)
    client.limits.put(names["output"], kind="rate", limit=OTPM, period_ms=PERIOD_MS)
    client.limits.put(names["overrun"], kind="concurrency", limit=1, lease_ttl_ms=120_000)
    model = MockModel(
        tmp_path / "model",
        *("--rpm", str(RPM), "--itpm", str(ITPM), "--otpm", str(OTPM)),
        *("--period-ms", str(PERIOD_MS)),
    )
    workers: list[subprocess.Popen[str]] = []
    try:
        for seed in range(1, PROCESSES + 1):
            worker = subprocess.Popen(
                [
                    *(sys.executable, str(WORKER), server.url, model.url, str(CALLERS)),
                    *(str(seconds), str(seed), json.dumps(names)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            workers.append(worker)
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:  # the fleet starts together, once every process is up
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        sent = [0, 0, 0]
        for worker in workers:
            out, _ = worker.communicate(timeout=seconds + 120)
            (line,) = [line for line in out.splitlines() if line.startswith("stats ")]
            sent = [a + int(b) for a, b in zip(sent, line.split()[1:], strict=True)]
        report = model.report()
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
        model.stop()
    span_minutes = seconds / 60
    print(
        f"\nmodel's count: {report['output_tokens']} output tokens in {seconds:.0f} s "
        f"({report['output_tokens'] / span_minutes:.0f} per minute; its limit "
        f"{OTPM * 60_000 // PERIOD_MS} per minute), {report['input_tokens']} input, "
        f"{report['ok']} calls; most output in any {PERIOD_MS} ms window "
        f"{report['most_output_in_any_window']} of {OTPM}, input "
        f"{report['most_input_in_any_window']} of {ITPM}, requests "
        f"{report['most_requests_in_any_window']} of {RPM}; 429s {report['limited']}; "
        f"use {report['output_used_share_steady']}; workers sent/429/errors {sent}"
    )
    assert sent[0] > 0, sent
    assert sent[2] == 0, sent
    assert report["limited"] == 0, report
    assert report["most_output_in_any_window"] <= OTPM, report
    assert report["most_input_in_any_window"] <= ITPM, report
    assert report["most_requests_in_any_window"] <= RPM, report
    assert report["failed"] + report["cut"] + report["cancelled"] > 0, report
    # Safety is the assertion; this floor only shows the fleet ran at all.
    assert (report["output_used_share_steady"] or 0) >= 0.3, report
