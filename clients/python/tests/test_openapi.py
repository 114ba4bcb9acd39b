"""The client's reading of answers against the real server's /openapi.json: every error code
the document names has a class here (and every class's code is one the document names), every
denial reason the document names is one ``RateLimited`` documents, and every field the client
reads from an answer is a property of that answer's schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

import tollgate_client._errors as errors
from _support import Server


def document(server: Server) -> dict[str, Any]:
    answer = httpx.get(f"{server.url}/openapi.json", timeout=30)
    answer.raise_for_status()
    document: dict[str, Any] = answer.json()
    return document


def objects(node: Any) -> Iterator[dict[str, Any]]:
    """Every object of the document, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from objects(value)


def enums(document: dict[str, Any], field: str, beside: str | None = None) -> set[str]:
    """The values a property named `field` may take, wherever the document enumerates them
    (with `beside`: only in objects that also have that property)."""
    found: set[str] = set()
    for node in objects(document):
        properties = node.get("properties")
        if not isinstance(properties, dict) or field not in properties:
            continue
        if beside is not None and beside not in properties:
            continue
        schema = properties[field]
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            schema = document["components"]["schemas"][name]
        found.update(value for value in schema.get("enum", []) if isinstance(value, str))
    return found


def test_every_error_code_the_document_names_has_a_class(server: Server) -> None:
    codes = enums(document(server), "code", beside="message")
    assert {"rate_limited", "bad_request"} <= codes, codes
    classes = set(errors._BY_CODE)
    assert codes <= classes, codes - classes
    # `internal` is a 500, which the document does not describe; `unreachable` is the client's.
    assert classes - codes <= {"internal", "unreachable"}, classes - codes


def test_every_reason_the_document_names_is_documented(server: Server) -> None:
    reasons = enums(document(server), "reason")
    assert reasons >= {"capacity", "paused"}, reasons
    documented = errors.RateLimited.__doc__ or ""
    for reason in reasons:
        assert f"``{reason}``" in documented, (reason, documented)


def test_every_field_the_client_reads_is_in_the_answers_schema(server: Server) -> None:
    schemas = document(server)["components"]["schemas"]
    # What _models.parse_limits and parse_check read, and what _errors reads from a 429.
    read = {
        "LimitView": {"name", "remaining", "reset_ms", "fence", "expires_ms"},
        "CheckAnswer": {"allowed", "path", "matched", "limits", "permit"},
        "CheckDenied": {"allowed", "path", "matched", "limits", "retry_after_ms", "reason"},
        "RateLimited": {"error", "retry_after_ms", "reason", "limits"},
        # What _models.learn_result reads.
        "LearnAnswer": {
            "limit",
            "configured",
            "effective",
            "paused_ms",
            "learned",
            "delay_ms",
            "margin_ms",
        },
        "LearnedLimitView": {"limit", "kind", "source", "expires_in_ms"},
    }
    for name, fields in read.items():
        properties = set(schemas[name]["properties"])
        assert fields <= properties, (name, fields - properties)
