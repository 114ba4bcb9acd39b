"""Which server a kept admin token goes to, where it is looked for, and the proof a server gives
before it is sent: the cases every implementation shares (crates/cli/tests/vectors/
kept_token.json; the ``tollgate`` commands and the TypeScript client answer them too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tollgate_client._kept import (
    PROOF_LABEL,
    PROOF_NONCE_PARAMETER,
    PROOF_PATH,
    base_for,
    belongs_to,
    proof,
    proof_nonce,
    proved,
    user_copy_path,
)

VECTORS = json.loads(
    (
        Path(__file__).resolve().parents[3]
        / "crates"
        / "cli"
        / "tests"
        / "vectors"
        / "kept_token.json"
    ).read_text()
)


@pytest.mark.parametrize("case", VECTORS["belongs"], ids=lambda case: repr(case))
def test_a_kept_token_goes_where_the_vectors_say(case: dict[str, Any]) -> None:
    assert belongs_to(case["listen"], case["url"]) is case["sends"]


@pytest.mark.parametrize("case", VECTORS["user_copy"], ids=lambda case: repr(case))
def test_the_user_copy_is_looked_for_where_the_vectors_say(
    case: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("XDG_STATE_HOME", "HOME"):
        if case[name] is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, case[name])
    path = user_copy_path(case["port"])
    assert (None if path is None else str(path)) == case["path"]


# ---- the proof, shared with the server and the other clients ---------------------------------


def test_the_proof_constants_and_answers_are_the_shared_ones() -> None:
    vectors = VECTORS["proof"]
    assert vectors["path"] == PROOF_PATH
    assert vectors["nonce_parameter"] == PROOF_NONCE_PARAMETER
    assert vectors["label"] == PROOF_LABEL
    assert vectors["nonce_hex_min"] <= len(proof_nonce()) <= vectors["nonce_hex_max"]
    assert len(vectors["cases"]) >= 5, "the vectors were read"
    for case in vectors["cases"]:
        assert proof(case["token"], case["listen"], case["nonce"]) == case["proof"], case
        answer = {"proof": case["proof"]}
        assert proved(case["token"], case["listen"], case["nonce"], answer)
        assert not proved(case["token"], case["listen"], case["nonce"], {"proof": "0" * 64})
        assert not proved(case["token"], case["listen"], case["nonce"], None)


@pytest.mark.parametrize("case", VECTORS["connect"], ids=lambda case: repr(case))
def test_a_kept_token_is_sent_to_the_address_the_vectors_say(case: dict[str, Any]) -> None:
    assert base_for(case["listen"], case["url"]) == case["base"]
