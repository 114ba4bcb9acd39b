"""Reading a vendor's rate-limit headers: every case of the vectors the Rust dispatcher and the
TypeScript client share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tollgate_client import read_advice

VECTORS = json.loads(
    (
        Path(__file__).resolve().parents[3]
        / "crates"
        / "dispatch"
        / "tests"
        / "vectors"
        / "vendor_headers.json"
    ).read_text()
)


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda case: str(case["name"]))
def test_vendor_header_vectors(case: dict[str, Any]) -> None:
    pairs = [(name, value) for name, value in case["headers"]]
    advice = read_advice(pairs, case["now_ms"])
    assert (advice.to_json() if advice is not None else None) == case["advice"]


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda case: str(case["name"]))
def test_vendor_header_vectors_from_an_httpx_answer(case: dict[str, Any]) -> None:
    # As a transport meets them: the bytes on the wire, in httpx's header type.
    raw = [(name.encode(), value.encode()) for name, value in case["headers"]]
    advice = read_advice(httpx.Response(200, headers=raw).headers, case["now_ms"])
    assert (advice.to_json() if advice is not None else None) == case["advice"]
