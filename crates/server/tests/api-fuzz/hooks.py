"""Checks of scripts/api-fuzz beyond schemathesis' own, loaded through SCHEMATHESIS_HOOKS.

- `error_names_its_field`: every 4xx answer is the server's JSON error, its `error.code` is the
  one its status stands for, and where the document says the body names the field at fault
  (`error.field` required in the documented schema), the field names something the request
  has: a parameter, a documented body property, a property the request sent, `body`, or
  `query` where the operation takes a query.
- `retry_after_matches_body`: a 429's `Retry-After` is its `retry_after_ms` in whole seconds,
  rounded up.

Environment: API_FUZZ_URL, the server's base URL (its /openapi.json is read once).
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from typing import Any

import schemathesis

# The error code each 4xx status stands for (docs/server.md, "HTTP API v1").
CODES = {
    400: {"bad_request"},
    401: {"unauthorized"},
    403: {"bad_request", "forbidden"},
    404: {"not_found"},
    405: {"bad_request"},
    409: {"conflict"},
    415: {"bad_request"},
    429: {"rate_limited"},
}

_document: dict[str, Any] | None = None


def document() -> dict[str, Any]:
    global _document
    if _document is None:
        with urllib.request.urlopen(os.environ["API_FUZZ_URL"] + "/openapi.json", timeout=30) as answer:
            _document = json.load(answer)
    return _document


def resolve(node: Any) -> Any:
    """`node` with a local `$ref` followed (repeatedly)."""
    while isinstance(node, dict) and isinstance(node.get("$ref"), str):
        target: Any = document()
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        node = target
    return node


def operation_of(case: schemathesis.Case) -> dict[str, Any]:
    path = document()["paths"].get(case.operation.path, {})
    return path.get(case.operation.method.lower(), {})


def field_documented(case: schemathesis.Case, status: int) -> bool | None:
    """Whether the documented answer with `status` names `error.field` (None: not documented)."""
    response = operation_of(case).get("responses", {}).get(str(status))
    if response is None:
        return None
    schema = resolve(resolve(response).get("content", {}).get("application/json", {}).get("schema"))
    if not isinstance(schema, dict):
        return None
    error = resolve(schema.get("properties", {}).get("error"))
    return isinstance(error, dict) and "field" in error.get("required", [])


def properties(schema: Any) -> set[str]:
    """The property names a body schema documents, in any of its alternatives."""
    schema = resolve(schema)
    if not isinstance(schema, dict):
        return set()
    names = set(schema.get("properties", {}))
    for keyword in ("oneOf", "anyOf", "allOf"):
        for alternative in schema.get(keyword, []):
            names |= properties(alternative)
    return names


def request_names(case: schemathesis.Case) -> set[str]:
    """Everything a refusal of this request may name as its field."""
    # The HTTP layer's refusals (403, 415) name the header at fault.
    names = {"body", "Host", "Origin", "Content-Type"}
    operation = operation_of(case)
    for parameter in map(resolve, operation.get("parameters", [])):
        names.add(parameter.get("name"))
        if parameter.get("in") == "query":
            names.add("query")
    body = resolve(operation.get("requestBody", {}))
    names.update(properties(body.get("content", {}).get("application/json", {}).get("schema")))
    for sent in (case.body, case.query, case.path_parameters):
        if isinstance(sent, dict):
            names.update(str(key) for key in sent)
    return names


@schemathesis.check
def error_names_its_field(ctx: schemathesis.CheckContext, response: schemathesis.Response,
                          case: schemathesis.Case) -> bool | None:
    status = response.status_code
    if not 400 <= status < 500:
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"a {status} answer that is not JSON: {response.content[:200]!r}")
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        raise AssertionError(f"a {status} answer without an `error` object: {body!r}")
    code = error.get("code")
    if code not in CODES.get(status, set()):
        raise AssertionError(f"a {status} answer with code {code!r}; expected one of "
                             f"{sorted(CODES.get(status, set()))}")
    if not isinstance(error.get("message"), str) or not error["message"]:
        raise AssertionError(f"a {status} answer without a message: {body!r}")
    field = error.get("field")
    documented = field_documented(case, status)
    if documented:
        if not isinstance(field, str) or not field:
            raise AssertionError(f"the document says a {status} names its field; this one does "
                                 f"not: {body!r}")
        # A nested field names its path (`reserve.high`); a parameter may itself hold a `.`.
        root = re.split(r"[.\[]", field, maxsplit=1)[0]
        names = request_names(case)
        if field not in names and root not in names:
            raise AssertionError(f"field {field!r} names nothing in the request (it has "
                                 f"{sorted(names)}): {body!r}")
    elif field is not None:
        raise AssertionError(f"a {status} answer names field {field!r}, which the document "
                             f"does not say it does: {body!r}")
    return True


@schemathesis.check
def retry_after_matches_body(ctx: schemathesis.CheckContext, response: schemathesis.Response,
                             case: schemathesis.Case) -> bool | None:
    if response.status_code != 429:
        return None
    body = json.loads(response.content)
    header = response.headers.get("retry-after")
    if not header:
        raise AssertionError("a 429 without Retry-After")
    seconds = int(header[0])
    expected = -(-body["retry_after_ms"] // 1000)
    if seconds != expected:
        raise AssertionError(f"Retry-After: {seconds}, but retry_after_ms is "
                             f"{body['retry_after_ms']} (expected {expected} s)")
    return True


@schemathesis.hook
def map_case(context: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
    """`costs` names limits among the request's `limits` (the document says so in prose, which a
    schema cannot): a positive case's generated names are put onto those limits, so that it
    stays valid; a negative one is left as generated."""
    body = case.body
    meta = getattr(case, "meta", None)
    positive = meta is not None and meta.generation.mode.is_positive
    if not (positive and isinstance(body, dict)):
        return case
    limits, costs = body.get("limits"), body.get("costs")
    if not (isinstance(costs, dict) and costs and isinstance(limits, list) and limits):
        return case
    names = [name for name in limits if isinstance(name, str)]
    if not names:
        return case
    body["costs"] = {names[index % len(names)]: units for index, units in enumerate(costs.values())}
    return case
