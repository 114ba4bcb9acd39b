"""Estimating a language-model request and reading its answer's usage: every case of the vectors
the Rust dispatcher and the TypeScript client share, the answers also fed split at every byte,
byte by byte, and cut at every byte."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tollgate_client.llm import Budget, Usage, UsageReader, estimate, recognise

_VECTORS = Path(__file__).resolve().parents[3] / "crates" / "dispatch" / "tests" / "vectors"
ESTIMATE = json.loads((_VECTORS / "llm_estimate.json").read_text(encoding="utf-8"))
USAGE = json.loads((_VECTORS / "llm_usage.json").read_text(encoding="utf-8"))


def test_the_vectors_were_read() -> None:
    assert len(ESTIMATE["cases"]) >= 30
    assert len(USAGE["cases"]) >= 30


@pytest.mark.parametrize("case", ESTIMATE["cases"], ids=lambda case: str(case["name"]))
def test_estimate_vectors(case: dict[str, Any]) -> None:
    expect = case["expect"]
    api = recognise(case["path"])
    assert api == expect["api"]
    if api is None:
        return
    config = {**ESTIMATE["config"], **case.get("config", {})}
    budget = Budget(requests="r", input="i", output="o", **config)
    body = case["body"].encode()
    if "error" in expect:
        with pytest.raises(ValueError, match="^" + expect["error"] + ": "):
            estimate(api, body, budget, case.get("input_tokens"))
        return
    found = estimate(api, body, budget, case.get("input_tokens"))
    assert {"api": api, **dataclasses.asdict(found)} == expect


def _read(events: bool, chunks: list[bytes]) -> Usage:
    reader = UsageReader(events)
    for chunk in chunks:
        reader.feed(chunk)
    reader.end()
    return reader.usage


@pytest.mark.parametrize("case", USAGE["cases"], ids=lambda case: str(case["name"]))
def test_usage_vectors(case: dict[str, Any]) -> None:
    events = case["events"]
    body = case["body"].encode()
    whole = _read(events, [body])
    assert dataclasses.asdict(whole) == case["expect"]
    # Chunks split anywhere, mid-line or mid-character, read the same.
    for at in range(len(body) + 1):
        assert _read(events, [body[:at], body[at:]]) == whole, f"split at {at}"
    assert _read(events, [body[at : at + 1] for at in range(len(body))]) == whole
    # Cut at any byte: read without fault, never more text than the whole.
    for at in range(len(body)):
        assert _read(events, [body[:at]]).streamed <= whole.streamed, f"cut at {at}"
