"""Which server a kept admin token goes to, and where it is looked for: the cases every
implementation shares (crates/cli/tests/vectors/kept_token.json; the ``tollgate`` commands and
the TypeScript client answer them too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tollgate_client._kept import belongs_to, user_copy_path

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
