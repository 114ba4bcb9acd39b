"""Token budgets for language-model APIs: one grant over requests, input tokens and output
tokens per period before a request goes, settled as the answer comes, on a Tollgate server.

::

    import httpx
    from tollgate_client import Client
    from tollgate_client.llm import Budget, LlmTransport

    budget = Budget(requests="openai-rpm", input="openai-itpm", output="openai-otpm")
    openai = httpx.Client(transport=LlmTransport(Client(), {"api.openai.com": budget}))

The clients' own transports take the same budgets: ``TollgateTransport(client, hosts,
llm={"api.openai.com": budget})`` (and ``AsyncTollgateTransport``), where a host also mapped in
``hosts`` has its vendor's 429s pause the fleet as well.

The transport recognises OpenAI-style (``/v1/chat/completions``, ``/v1/responses``) and
Anthropic-style (``/v1/messages``) requests to a mapped host. Another API plugs in with
``Budget(..., api=Custom(estimate=..., reader=...))``: its estimator sees each request to the
host that the built-in recognition does not claim and returns an :class:`Estimate`, or ``None``
to let the request pass unbudgeted; its reader reads the answer as :class:`UsageReader` does.
Such a request takes the same grant, top-ups, settlement and charge as the built-in APIs. Other
requests pass untouched. For each it:

1. estimates the request from its body: output is its ``max_tokens`` (``max_completion_tokens``,
   ``max_output_tokens``), else the model's documented maximum (``Budget.output_default``,
   ``Budget.models``); input is one token per byte of the body plus 8 per message and 16 per
   request, which never counts fewer tokens than a byte-level tokeniser makes (or the caller's
   own count, the request extension ``"tollgate_input_tokens"``);
2. takes one request, the input estimate and the output estimate in one acquire (``costs`` by
   limit), all or none, waiting up to ``Budget.wait_max``; a request without an output cap
   takes the ``overrun`` lease in the same acquire when the budget names one;
3. sends the request (a streaming chat request gets ``stream_options.include_usage``) and
   passes the answer on chunk by chunk, reading it as it goes: when the text streamed passes
   what is held, the difference is taken at once without waiting (a top-up; after a refusal,
   asked again no sooner than 0.1 s later), never charged while the answer streams;
4. at the end commits what the vendor reported (``usage``; the final usage chunk; Anthropic's
   ``message_start`` and ``message_delta``), the reservation limit by limit, then the top-ups,
   and refunds the rest. An answer that fails, is cut off or is closed early is charged its
   reported usage, else its input estimate and the text streamed so far (a byte a token).
   What the answer used beyond its reservation and top-ups is charged (``POST /v1/charge``):
   counted on the server at once, past the limit if need be, a debt every later acquire in the
   fleet waits out. The charge comes before the commit that gives the overrun lease back.

See ``docs/llm.md`` for the bound this keeps.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from ._async import AsyncClient
from ._errors import BadRequest, RateLimited
from ._sync import Client

__all__ = [
    "AsyncLlmTransport",
    "Budget",
    "Custom",
    "Estimate",
    "LlmTransport",
    "Reader",
    "Usage",
    "UsageReader",
    "estimate",
    "recognise",
]

INPUT_TOKENS_EXTENSION = "tollgate_input_tokens"
_KEPT_BYTES_MAX = 8 * 1024 * 1024
#: The largest count read: the largest whole number every client's language holds exactly.
_COUNT_MAX = 2**53 - 1
_TOP_UP_STEP = 64
_TOP_UP_RETRY = 0.1


def recognise(path: str) -> str | None:
    """``"chat"``, ``"responses"`` or ``"messages"`` for a path of a recognised API."""
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/messages"):
        return "messages"
    return None


@dataclass
class Budget:
    """The limits of one vendor on the server, and how its requests are estimated."""

    requests: str
    input: str
    output: str
    #: A concurrency limit of 1 taken by requests without an output cap and held until what
    #: the stream ran past its grant is charged, so that one stream at a time, fleet-wide, can
    #: outrun its estimate.
    overrun: str | None = None
    #: Output estimate of a request without a cap: the model's documented maximum.
    output_default: int = 32_768
    #: Documented maximum output by model name prefix (the longest prefix wins).
    models: dict[str, int] = field(default_factory=dict)
    per_message: int = 8
    per_request: int = 16
    #: Longest wait for a grant, in seconds.
    wait_max: float = 60.0
    #: Another API's estimator and answer reader, for the requests the built-in recognition
    #: does not claim.
    api: Custom | None = None


@dataclass
class Estimate:
    """What a request is expected to use: ``input`` and ``output`` tokens, whether the vendor
    never writes past ``output`` (``bounded``: a cap the request sets), and whether the answer
    streams (read by the built-in APIs only)."""

    input: int
    output: int
    bounded: bool
    stream: bool = False


class Reader(Protocol):
    """Reads one answer as it passes, chunk by chunk: ``usage`` is read after every chunk (for
    top-ups) and once more after ``end()`` (for the settlement)."""

    def feed(self, chunk: bytes) -> None: ...

    def end(self) -> None: ...

    @property
    def usage(self) -> Usage: ...


@dataclass(frozen=True)
class Custom:
    """Another model API: ``estimate`` gives a request's :class:`Estimate` (``None``: the
    request is not a model call and passes unbudgeted; an error is raised to the caller), and
    ``reader`` makes a fresh :class:`Reader` for each answer. Called from the sync and the
    async transports alike, so both are plain functions that do no I/O."""

    estimate: Callable[[httpx.Request], Estimate | None]
    reader: Callable[[], Reader]


def _count(value: Any) -> int | None:
    """A whole number of tokens from 0 to 2^53 - 1 (``50.0`` is 50), else ``None``: the one
    reading of a count that the Rust and TypeScript implementations share."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 <= value <= _COUNT_MAX:
        return value
    return None


def _field(value: Any, key: str) -> Any:
    """``value[key]`` when ``value`` is an object; an answer of an odd shape reads as absent."""
    return value.get(key) if isinstance(value, dict) else None


def _cap(body: dict[str, Any], fields: tuple[str, ...]) -> int | None:
    for name in fields:
        value = body.get(name)
        if value is None:
            continue
        cap = _count(value)
        if cap is None:
            raise ValueError(f"{name}: must be a whole number of tokens")
        return cap
    return None


def estimate(api: str, body: bytes, budget: Budget, input_tokens: int | None = None) -> Estimate:
    """A request's estimate; errors name the field."""
    try:
        json_body = json.loads(body)
    except ValueError as error:
        raise ValueError(f"body: not JSON: {error}") from None
    if not isinstance(json_body, dict):
        raise ValueError("body: must be a JSON object")
    fields = {
        "chat": ("max_completion_tokens", "max_tokens"),
        "responses": ("max_output_tokens",),
        "messages": ("max_tokens",),
    }[api]
    output = _cap(json_body, fields)
    bounded = output is not None
    if output is None:
        model = json_body.get("model")
        model = model if isinstance(model, str) else ""
        matching = [prefix for prefix in budget.models if model.startswith(prefix)]
        output = budget.models[max(matching, key=len)] if matching else budget.output_default
    messages = sum(
        len(value) if isinstance(value, list) else 1
        for value in (json_body.get("messages"), json_body.get("input"))
        if value is not None
    ) + int(json_body.get("system") is not None or json_body.get("instructions") is not None)
    guess = len(body) + budget.per_message * messages + budget.per_request
    return Estimate(
        input=max(1, input_tokens if input_tokens is not None else guess),
        output=max(1, output),
        bounded=bounded,
        stream=json_body.get("stream") is True,
    )


@dataclass
class Usage:
    input: int | None = None
    output: int | None = None
    #: Bytes of generated text streamed so far: never fewer than the tokens they hold.
    streamed: int = 0
    finished: bool = False
    failed: bool = False


def _usage_of(usage: Any) -> tuple[int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None
    input_tokens = _count(usage.get("prompt_tokens"))
    base = _count(usage.get("input_tokens"))
    if input_tokens is None and base is not None:
        # Cached input counts too: erring high.
        input_tokens = (
            base
            + (_count(usage.get("cache_creation_input_tokens")) or 0)
            + (_count(usage.get("cache_read_input_tokens")) or 0)
        )
    output = _count(usage.get("completion_tokens"))
    if output is None:
        output = _count(usage.get("output_tokens"))
    return input_tokens, output


def _text(value: Any) -> int:
    # A lone surrogate (which JSON can spell) counts as the three bytes of its replacement.
    return len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else 0


class UsageReader:
    """Reads one answer chunk by chunk, JSON or server-sent events, holding nothing back."""

    def __init__(self, events: bool) -> None:
        self.events = events
        self.usage = Usage()
        self._line = bytearray()
        #: The data lines of the event being read, joined with a line feed when it ends.
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._kept = bytearray()
        self._over = False

    def _note(self, found: tuple[int | None, int | None]) -> None:
        if found[0] is not None:
            self.usage.input = found[0]
        if found[1] is not None:
            self.usage.output = found[1]

    def feed(self, chunk: bytes) -> None:
        if not self.events:
            if len(self._kept) + len(chunk) > _KEPT_BYTES_MAX:
                self._over, self._kept = True, bytearray()
            if not self._over:
                self._kept += chunk
            return
        self._line += chunk
        start = 0
        while (end := self._line.find(b"\n", start)) >= 0:
            line = bytes(self._line[start:end])
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                self._dispatch()
            elif line.startswith(b"data:"):
                value = line[5:]
                value = value[1:] if value.startswith(b" ") else value
                if self._data_bytes + len(value) <= _KEPT_BYTES_MAX:
                    self._data.append(value)
                    self._data_bytes += len(value)
        del self._line[:start]
        # A line longer than any event kept is read no further.
        del self._line[_KEPT_BYTES_MAX:]

    def _dispatch(self) -> None:
        data = b"\n".join(self._data)
        self._data, self._data_bytes = [], 0
        self._event(data)

    def end(self) -> None:
        if self.events:
            self._dispatch()
            return
        if self._over:
            return
        try:
            answer = json.loads(bytes(self._kept))
        except ValueError:
            return
        if isinstance(answer, dict):
            self._note(_usage_of(answer.get("usage")))
            self.usage.failed = answer.get("error") is not None
            self.usage.finished = not self.usage.failed

    def _event(self, data: bytes) -> None:
        if not data:
            return
        if data == b"[DONE]":
            self.usage.finished = True
            return
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        kind = kind if isinstance(kind, str) else ""
        if kind == "message_start":
            self._note(_usage_of(_field(event.get("message"), "usage")))
        elif kind == "message_delta":
            self._note(_usage_of(event.get("usage")))
        elif kind == "content_block_delta":
            delta = event.get("delta")
            self.usage.streamed += sum(
                _text(_field(delta, k)) for k in ("text", "partial_json", "thinking")
            )
        elif kind == "message_stop":
            self.usage.finished = True
        elif kind in ("error", "response.failed", "response.error"):
            self.usage.failed = True
            self._note(_usage_of(_field(event.get("response"), "usage")))
        elif kind.startswith("response.") and kind.endswith(".delta"):
            self.usage.streamed += _text(event.get("delta"))
        elif kind in ("response.completed", "response.incomplete"):
            self._note(_usage_of(_field(event.get("response"), "usage")))
            self.usage.finished = True
        else:
            if event.get("error") is not None:
                self.usage.failed = True
            choices = event.get("choices")
            for choice in choices if isinstance(choices, list) else []:
                delta = _field(choice, "delta")
                self.usage.streamed += _text(_field(delta, "content")) + _text(
                    _field(delta, "refusal")
                )
                calls = _field(delta, "tool_calls")
                for call in calls if isinstance(calls, list) else []:
                    self.usage.streamed += _text(_field(_field(call, "function"), "arguments"))
            self._note(_usage_of(event.get("usage")))


def _with_usage_chunk(api: str, found: Estimate, body: bytes) -> bytes | None:
    """A streaming chat request's body with ``stream_options.include_usage``, if it lacks it."""
    if api != "chat" or not found.stream:
        return None
    parsed = json.loads(body)
    options = parsed.get("stream_options")
    if isinstance(options, dict) and "include_usage" in options:
        return None
    parsed["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
    }
    return json.dumps(parsed).encode()


def _checked(found: Any) -> Estimate:
    """A custom estimator's answer, refused with the field and the reason when it is not one."""
    if not isinstance(found, Estimate):
        raise TypeError(f"estimate: must return an Estimate or None, not {type(found).__name__}")
    for name in ("input", "output"):
        if _count(getattr(found, name)) is None:
            raise ValueError(f"Estimate.{name}: must be a whole number of tokens")
    return Estimate(
        input=max(1, int(found.input)),
        output=max(1, int(found.output)),
        bounded=bool(found.bounded),
        stream=bool(found.stream),
    )


def _built_in_reader(response: httpx.Response) -> Reader:
    return UsageReader(response.headers.get("content-type", "").startswith("text/event-stream"))


def _prepare(
    request: httpx.Request, hosts: Mapping[str, Budget]
) -> tuple[httpx.Request, Budget, Estimate, Callable[[httpx.Response], Reader]] | None:
    """The request to send, its budget, its estimate and the reader of its answer, or ``None``
    when it passes unbudgeted: the one choice the sync and async transports share."""
    host = (
        request.url.host if request.url.port is None else f"{request.url.host}:{request.url.port}"
    )
    budget = hosts.get(host) or hosts.get(request.url.host)
    if budget is None:
        return None
    api = recognise(request.url.path)
    if api is None or request.method != "POST":
        custom = budget.api
        if custom is None:
            return None
        found = custom.estimate(request)
        if found is None:
            return None
        make = custom.reader
        return request, budget, _checked(found), lambda _response: make()
    body = request.content
    counted = request.extensions.get(INPUT_TOKENS_EXTENSION)
    found = estimate(api, body, budget, _count(counted))
    rewritten = _with_usage_chunk(api, found, body)
    if rewritten is not None:
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
        request = httpx.Request(
            request.method,
            request.url,
            headers=headers,
            content=rewritten,
            extensions=request.extensions,
        )
    return request, budget, found, _built_in_reader


def _charged(found: Estimate, usage: Usage) -> tuple[int, int]:
    # Read as counts: a plugged-in reader's figure that is not one is not read.
    streamed = _count(usage.streamed) or 0
    streamed = min(streamed, found.output) if found.bounded else streamed
    reported_input, reported_output = _count(usage.input), _count(usage.output)
    # Until the answer is finished, a reported output (Anthropic's message_start says 1) is
    # only a floor: the text streamed counts when it is more.
    if reported_output is None:
        output = streamed
    elif usage.finished:
        output = reported_output
    else:
        output = max(reported_output, streamed)
    return (reported_input if reported_input is not None else found.input, output)


def _by_limit(budget: Budget, input_tokens: int, output_tokens: int) -> dict[str, int]:
    """Input and output tokens by limit name: added together when one limit counts both (a
    vendor with one TPM names it as both ``input`` and ``output``)."""
    each = {budget.input: input_tokens}
    each[budget.output] = each.get(budget.output, 0) + output_tokens
    return each


def _asks(budget: Budget, found: Estimate) -> tuple[list[str], dict[str, int]]:
    """What one request asks of the server in its one acquire: the limits (the request, its
    input and output tokens, and the overrun lease when it sets no output cap) and the tokens
    by limit name (one request is the cost of the rest)."""
    limits = list(dict.fromkeys([budget.requests, budget.input, budget.output]))
    if not found.bounded and budget.overrun is not None:
        limits.append(budget.overrun)
    return limits, _by_limit(budget, found.input, found.output)


def _answer(
    response: httpx.Response,
    stream: httpx.SyncByteStream | httpx.AsyncByteStream,
    request: httpx.Request,
) -> httpx.Response:
    """The vendor's answer as the caller gets it: its status, headers and extensions, over
    `stream` (its body read whole, or metered as it is read)."""
    return httpx.Response(
        response.status_code,
        headers=response.headers,
        stream=stream,
        extensions=response.extensions,
        request=request,
    )


class _Held:
    """One request's grant, its top-ups and its settlement; shared by the sync and async
    transports, which do only the calls."""

    def __init__(self, budget: Budget, found: Estimate, permit: Any) -> None:
        self.budget = budget
        self.found = found
        #: The reservation: one request, the estimates, and the overrun lease if taken.
        self.permit = permit
        self.extra: list[tuple[int, Any]] = []  # (0 input / 1 output, permit)
        self.topped = [0, 0]
        self.retry_at = 0.0
        self.sent_at: float | None = None

    def needs(self, usage: Usage) -> list[tuple[int, str, int]]:
        """Top-ups due for what the answer showed: (0 input / 1 output, limit, tokens)."""
        if time.monotonic() < self.retry_at:
            return []
        shown = _charged(self.found, usage)
        held = (self.found.input, self.found.output)
        due = []
        for kind in (0, 1):
            need = shown[kind] - held[kind] - self.topped[kind]
            if need > 0:
                tokens = -(-need // _TOP_UP_STEP) * _TOP_UP_STEP
                due.append((kind, self.budget.output if kind else self.budget.input, tokens))
        return due

    def topped_up(self, kind: int, tokens: int, permit: Any) -> None:
        self.extra.append((kind, permit))
        self.topped[kind] += tokens

    def refused(self) -> None:
        """A top-up was refused: asked again no sooner than _TOP_UP_RETRY from now. Not charged
        while streaming: the text streamed is only an upper bound on the tokens, and a charge is
        never given back; the settlement charges what the vendor reports past the grant."""
        self.retry_at = time.monotonic() + _TOP_UP_RETRY

    def plan(
        self, used: tuple[int, int]
    ) -> tuple[dict[str, int], list[tuple[Any, int]], dict[str, int]]:
        """The settlement of ``used`` (input, output) tokens: the reservation's commit by limit,
        each top-up's commit, and what is left past them to charge (empty when nothing is)."""
        left = list(used)
        own = [
            min(left[kind], held) for kind, held in enumerate((self.found.input, self.found.output))
        ]
        for kind in (0, 1):
            left[kind] -= own[kind]
        parts = []
        for kind, permit in self.extra:
            part = min(left[kind], permit.cost)
            left[kind] -= part
            parts.append((permit, part))
        commit = {self.budget.requests: 1, **_by_limit(self.budget, own[0], own[1])}
        past = {name: units for name, units in _by_limit(self.budget, *left).items() if units}
        return commit, parts, past

    def sent_after(self) -> float | None:
        if self.sent_at is None:
            return None
        granted_at: float = self.permit.granted_at
        return max(0.0, self.sent_at - granted_at)


class LlmTransport(httpx.BaseTransport):
    """A blocking httpx transport that keeps model calls inside a token budget (see the module
    documentation). ``hosts`` maps a host name (or ``host:port``) to its :class:`Budget`."""

    def __init__(
        self,
        client: Client,
        hosts: Mapping[str, Budget],
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._client = client
        self._hosts = dict(hosts)
        self._inner = transport if transport is not None else httpx.HTTPTransport()

    def _reserve(self, budget: Budget, found: Estimate) -> _Held:
        limits, costs = _asks(budget, found)
        permit = self._client.acquire(limits, costs=costs, wait=budget.wait_max)
        return _Held(budget, found, permit)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        prepared = _prepare(request, self._hosts)
        if prepared is None:
            return self._inner.handle_request(request)
        request, budget, found, make_reader = prepared
        held = self._reserve(budget, found)
        held.sent_at = time.monotonic()
        try:
            response = self._inner.handle_request(request)
        except httpx.ConnectError:
            self.settle(held, (0, 0))
            raise
        except BaseException:
            self.settle(held, (found.input, found.output))
            raise
        if response.status_code >= 400:
            # A refusal or an error answer: the vendor charges no tokens.
            content = response.read()
            response.close()
            self.settle(held, (0, 0))
            return _answer(response, httpx.ByteStream(content), request)
        stream = _MeteredStream(self, held, response, make_reader(response))
        return _answer(response, stream, request)

    def top_up(self, held: _Held, usage: Usage) -> None:
        for kind, limit, tokens in held.needs(usage):
            try:
                permit = self._client.acquire(limit, cost=tokens)
            except (RateLimited, BadRequest):
                # Refused, or more than the limit can ever grant: the settlement charges it.
                held.refused()
                continue
            held.topped_up(kind, tokens, permit)

    def settle(self, held: _Held, used: tuple[int, int]) -> None:
        commit, parts, past = held.plan(used)
        # Charged before the commit that gives the overrun lease back: no other uncapped
        # stream starts before the fleet counts this one's excess.
        if past:
            self._client.charge(list(past), costs=past)
        for permit, part in parts:
            permit.commit(part)
        held.permit.commit(commit, sent_after=held.sent_after())

    def close(self) -> None:
        self._inner.close()


class _MeteredStream(httpx.SyncByteStream):
    def __init__(
        self, transport: LlmTransport, held: _Held, response: httpx.Response, reader: Reader
    ) -> None:
        self._transport, self._held = transport, held
        self._response, self._reader = response, reader
        self._settled = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._response.iter_raw():
                self._reader.feed(chunk)
                self._transport.top_up(self._held, self._reader.usage)
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        if self._settled:
            return
        self._settled = True
        try:
            self._response.close()
        finally:
            self._reader.end()
            used = _charged(self._held.found, self._reader.usage)
            self._transport.settle(self._held, used)


class AsyncLlmTransport(httpx.AsyncBaseTransport):
    """The asyncio twin of :class:`LlmTransport`."""

    def __init__(
        self,
        client: AsyncClient,
        hosts: Mapping[str, Budget],
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._client = client
        self._hosts = dict(hosts)
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def _reserve(self, budget: Budget, found: Estimate) -> _Held:
        limits, costs = _asks(budget, found)
        permit = await self._client.acquire(limits, costs=costs, wait=budget.wait_max)
        return _Held(budget, found, permit)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        prepared = _prepare(request, self._hosts)
        if prepared is None:
            return await self._inner.handle_async_request(request)
        request, budget, found, make_reader = prepared
        held = await self._reserve(budget, found)
        held.sent_at = time.monotonic()
        try:
            response = await self._inner.handle_async_request(request)
        except httpx.ConnectError:
            await self.settle(held, (0, 0))
            raise
        except BaseException:
            await self.settle(held, (found.input, found.output))
            raise
        if response.status_code >= 400:
            content = await response.aread()
            await response.aclose()
            await self.settle(held, (0, 0))
            return _answer(response, httpx.ByteStream(content), request)
        stream = _AsyncMeteredStream(self, held, response, make_reader(response))
        return _answer(response, stream, request)

    async def top_up(self, held: _Held, usage: Usage) -> None:
        for kind, limit, tokens in held.needs(usage):
            try:
                permit = await self._client.acquire(limit, cost=tokens)
            except (RateLimited, BadRequest):
                # Refused, or more than the limit can ever grant: the settlement charges it.
                held.refused()
                continue
            held.topped_up(kind, tokens, permit)

    async def settle(self, held: _Held, used: tuple[int, int]) -> None:
        commit, parts, past = held.plan(used)
        # Charged before the commit that gives the overrun lease back (see LlmTransport).
        if past:
            await self._client.charge(list(past), costs=past)
        for permit, part in parts:
            await permit.commit(part)
        await held.permit.commit(commit, sent_after=held.sent_after())

    async def aclose(self) -> None:
        await self._inner.aclose()


class _AsyncMeteredStream(httpx.AsyncByteStream):
    def __init__(
        self,
        transport: AsyncLlmTransport,
        held: _Held,
        response: httpx.Response,
        reader: Reader,
    ) -> None:
        self._transport, self._held = transport, held
        self._response, self._reader = response, reader
        self._settled = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                self._reader.feed(chunk)
                await self._transport.top_up(self._held, self._reader.usage)
                yield chunk
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._settled:
            return
        self._settled = True
        try:
            await self._response.aclose()
        finally:
            self._reader.end()
            used = _charged(self._held.found, self._reader.usage)
            await self._transport.settle(self._held, used)
