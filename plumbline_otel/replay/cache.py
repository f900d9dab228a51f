"""Response cache for model calls: keyed by trial identity *and* request, one JSONL file per study.

The key is sha256 of canonical JSON of the trial identity (trial id, perturbation, variant,
repeat), the occurrence of this exact request within the attempt (0, 1, … for a request sent
again in the same trial), and the request itself (method, path, body; tool lists in name order,
so an incidental reordering of tools does not miss). Two repeats of one request therefore have
two entries and are sampled independently; a content-only key would serve k repeats one answer
and fake perfect consistency. Re-running a trial replays exactly its own recorded answers.

Modes: ``record`` (serve hits, call and record misses), ``replay`` (offline: a miss is refused
and the trial is recorded missing, never run against a live model), ``off``.

It is an HTTP transport under the real ``anthropic`` client (``anthropic_client`` builds one),
so the client code path is the one users run; the transport also meters each live call against
the trial's budget before sending it (``scope.TrialScope.charge``) and records its cost after.
A refused call (budget, offline miss) gets a non-retryable error response and the trial scope
says why, so the driver records the trial as missing, not as an agent failure. Streamed calls
are metered and cached too: the stream passes through to the client as it arrives while a
``pricing.UsageAccumulator`` reads its usage, and the whole stream is recorded when it ends. Cost
is priced from the provider's full usage (cache reads and writes included) by ``pricing.price``,
the same extraction the model-API proxy uses.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import orjson

from plumbline_otel.errors import ConfigError
from plumbline_otel.replay.budget import price_of
from plumbline_otel.replay.identity import TrialIdentity
from plumbline_otel.replay.jsonvalue import JsonObject
from plumbline_otel.replay.ledger import append_line, read_jsonl
from plumbline_otel.replay.pricing import Usage, UsageAccumulator, extract_usage, parse_sse, price
from plumbline_otel.replay.scope import Cassette, TrialScope, current_scope

if TYPE_CHECKING:
    import anthropic

MODES = ("record", "replay", "off")
_OVERHEAD_TOKENS = 1000
_DROP_HEADERS = {"content-encoding", "content-length", "transfer-encoding", "connection"}


def _canonical(value: object) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)


def request_content(method: str, path: str, body: JsonObject) -> JsonObject:
    """What identifies a request's content: method, path and body, tools in name order."""
    body = dict(body)
    if isinstance(tools := body.get("tools"), list):
        body["tools"] = sorted(tools, key=lambda t: str(t.get("name", "")) if isinstance(t, dict) else str(t))
    return {"method": method.upper(), "path": path, "body": body}


def content_digest(content: Mapping[str, object]) -> str:
    return hashlib.sha256(_canonical(content)).hexdigest()


def cache_key(identity: TrialIdentity, content: Mapping[str, object], occurrence: int = 0) -> str:
    """The cache key: trial identity + occurrence + request content. The study's own name (the trial id's first part)
    is not in it, so another study of the same plan replays this one's exchanges (``replay --cassette``)."""
    trial = {"trial_id": identity.trial_id.partition("/")[2] or identity.trial_id, "perturbation": identity.perturbation,
             "variant": identity.variant, "repeat": identity.repeat}
    return hashlib.sha256(_canonical({"trial": trial, "occurrence": occurrence, "request": content})).hexdigest()


class ResponseCache:
    """Recorded responses of one study, in a JSONL file (loaded at open, appended per new entry); a `scope.Cassette`."""

    def __init__(self, path: str | Path, mode: str = "record") -> None:
        if mode not in MODES:
            raise ConfigError(f"cache mode {mode!r}: expected one of {', '.join(MODES)}")
        self.path = Path(path)
        self.mode = mode
        self._entries: dict[str, JsonObject] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.recorded = 0
        if self.path.exists():
            for entry in read_jsonl(self.path.read_bytes().splitlines()):  # a torn last line from a crash: the rest is good
                self._entries[str(entry["key"])] = entry

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> JsonObject | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
            else:
                self.hits += 1
            return entry

    def put(self, entry: JsonObject) -> None:
        line = orjson.dumps(entry) + b"\n"
        key = str(entry["key"])
        with self._lock:
            if key in self._entries:
                return
            append_line(self.path, line)
            self._entries[key] = entry
            self.recorded += 1


# --- the transport -----------------------------------------------------------------------------


def http_module() -> ModuleType:
    """The HTTP library the installed ``anthropic`` client is built on (``httpx`` or ``httpx2``)."""
    try:
        import anthropic._base_client as base
        module = getattr(base, "httpx2", None) or getattr(base, "httpx", None)
        if isinstance(module, ModuleType):
            return module
    except ImportError:  # pragma: no cover - anthropic is a dependency
        pass
    import httpx

    return httpx


_CLASSES: dict[int, type] = {}


def _transport_class(module: Any) -> type:
    if id(module) in _CLASSES:
        return _CLASSES[id(module)]

    class CachingTransport(module.BaseTransport):  # type: ignore[misc]
        """Serves recorded responses for the current trial and records (and meters) live ones."""

        def __init__(self, inner: Any = None) -> None:
            self.inner = inner if inner is not None else module.HTTPTransport()

        def handle_request(self, request: Any) -> Any:
            scope = current_scope()
            if scope is None or request.method.upper() != "POST":
                return self.inner.handle_request(request)
            raw = request.read()
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return self.inner.handle_request(request)
            if not isinstance(body, dict):
                return self.inner.handle_request(request)
            return _handle(module, self.inner, scope, request, raw, body)

        def close(self) -> None:
            self.inner.close()

    _CLASSES[id(module)] = CachingTransport
    return CachingTransport


def _refuse(module: Any, request: Any, status: int, reason: str) -> Any:
    body = {"type": "error", "error": {"type": "plumbline_replay_refused", "message": reason}}
    return module.Response(status, headers={"content-type": "application/json", "x-should-retry": "false"},
                           content=orjson.dumps(body), request=request)


def _estimate(raw: bytes, body: dict[str, Any], rates: tuple[float, float]) -> float:
    """An upper bound before the call: a token covers at least one byte, plus the API's own prompt
    for tools; the output cannot pass max_tokens. Settled at the real usage after the call."""
    return ((len(raw) + _OVERHEAD_TOKENS) * rates[0] + int(body.get("max_tokens") or 4096) * rates[1]) / 1_000_000


def _charge(scope: TrialScope, model: Any, raw: bytes, body: dict[str, Any]) -> str | None:
    """Make room in the trial's budget for this call; the refusal reason, or None when it may go."""
    budget = scope.budget
    if budget is None or budget.cap.limit is None:
        return None
    rates = price_of(model if isinstance(model, str) else None)
    if rates is None:
        # A model with no price cannot be bounded by the cap, so the call is refused, not guessed.
        scope.abort_reason = f"budget: model {model!r} has no price, so a spend cap cannot bound it"
        return scope.abort_reason
    try:
        scope.charge(_estimate(raw, body, rates))
    except Exception:
        return scope.abort_reason or "budget: spend cap reached"
    return None


def _meter(scope: TrialScope, model: Any, usage: Usage | None, raw: bytes, body: dict[str, Any]) -> None:
    """Record a finished call's exact cost (full usage, cache tokens included) against the trial; a call whose usage
    never came is charged the pre-call upper bound from its text (labelled estimated), never $0."""
    name = model if isinstance(model, str) else None
    if usage is not None:
        scope.spent(price(name, usage) or 0.0)
        return
    rates = price_of(name)
    scope.unseen(_estimate(raw, body, rates) if rates is not None else None)


def _handle(module: Any, inner: Any, scope: TrialScope, request: Any, raw: bytes, body: dict[str, Any]) -> Any:
    scope.observe_request(body)  # the driver sees whether the variant's decoys and sampling reach the model
    content = request_content(request.method, request.url.path, body)
    occurrence = scope.occurrence(content_digest(content))
    key = cache_key(scope.identity, content, occurrence)
    cache = scope.cache if scope.cache is not None and scope.cache.mode != "off" else None
    if cache is not None:
        entry = cache.get(key)
        if entry is not None:
            scope.cache_hits += 1
            headers = {"content-type": entry.get("content_type") or "application/json", "x-plumbline-cache": "hit"}
            return module.Response(entry["status"], headers=headers, content=str(entry["body"]).encode(), request=request)
        scope.cache_misses += 1
        if cache.mode == "replay":
            scope.abort_reason = (f"offline: no recorded response for trial {scope.identity.trial_id} "
                                  f"(request {content_digest(content)[:12]}, occurrence {occurrence})")
            return _refuse(module, request, 424, scope.abort_reason)
    model = body.get("model")
    refused = _charge(scope, model, raw, body)
    if refused is not None:
        return _refuse(module, request, 402, refused)
    started = time.perf_counter()
    response = inner.handle_request(request)
    scope.model_calls += 1
    record = _recorder(cache, scope, key, occurrence, request.url.path, model, response.status_code,
                       response.headers.get("content-type"), started)
    kept = [(k, v) for k, v in response.headers.items() if k.lower() not in _DROP_HEADERS]
    if "text/event-stream" in (response.headers.get("content-type") or ""):
        stream = _metered_stream(module, response, scope, model, record, raw, body)
        return module.Response(response.status_code, headers=kept, stream=stream, request=request)
    payload = response.read()
    parsed: Any = None
    if 200 <= response.status_code < 300:
        try:
            parsed = orjson.loads(payload)
        except orjson.JSONDecodeError:
            parsed = None
    if 200 <= response.status_code < 300:
        _meter(scope, model, extract_usage(parsed) if isinstance(parsed, dict) else None, raw, body)
    else:
        scope.spent(0.0)  # an error answer is not billed: metered, at nothing
    if parsed is not None:
        record(payload)
    return module.Response(response.status_code, headers=kept, content=payload, request=request)


def _recorder(cache: Cassette | None, scope: TrialScope, key: str, occurrence: int, path: str, model: Any,
              status: int, content_type: str | None, started: float) -> Any:
    """A function that records this exchange's response body in the cache (a no-op without one)."""
    def record(payload: bytes) -> None:
        if cache is None or not 200 <= status < 300:
            return
        identity = scope.identity
        cache.put({
            "key": key, "trial_id": identity.trial_id, "perturbation": identity.perturbation,
            "variant": identity.variant, "repeat": identity.repeat, "occurrence": occurrence,
            "path": path, "model": model, "status": status, "content_type": content_type,
            "body": payload.decode("utf-8"), "latency_ms": round((time.perf_counter() - started) * 1000, 1),
            "recorded_at": time.time(),
        })
    return record


def _metered_stream(module: Any, response: Any, scope: TrialScope, model: Any, record: Any, raw: bytes,
                    body: dict[str, Any]) -> Any:
    """The upstream SSE stream, passed on chunk by chunk; metered once it ends, or once the caller closes it part-way
    (an abandoned stream is metered for what it cost, not left to a garbage collector), and recorded when complete."""
    class MeteredStream(module.SyncByteStream):  # type: ignore[misc]
        def __init__(self) -> None:
            self.chunks: list[bytes] = []
            self.metered = False

        def __iter__(self) -> Iterator[bytes]:
            complete = False
            try:
                for chunk in response.iter_bytes():
                    self.chunks.append(chunk)
                    yield chunk
                complete = True
            finally:
                self._finish(complete)

        def _finish(self, complete: bool) -> None:
            if self.metered:
                return
            self.metered = True
            received = b"".join(self.chunks)
            meter = UsageAccumulator()
            for event in parse_sse(received):
                meter.feed(event)
            _meter(scope, model, meter.usage if complete else None, raw, body)  # cut short: the provider's own usage is unknown
            if complete:
                record(received)

        def close(self) -> None:
            self._finish(False)
            response.close()

    return MeteredStream()


def caching_transport(inner: object = None, module: ModuleType | None = None) -> object:
    """A caching, metering transport for the HTTP library ``module`` (default: the anthropic client's), around ``inner``
    (a transport of that library; default its ``HTTPTransport``): an instance of the library's ``BaseTransport``."""
    module = module or http_module()
    return _transport_class(module)(inner)


def anthropic_client(base_url: str | None = None, api_key: str | None = None, *, inner_transport: object = None,
                     max_retries: int | None = None) -> anthropic.Anthropic:
    """An ``anthropic.Anthropic`` client whose requests go through the cache of the current trial.

    Outside a replay (no current trial) it behaves exactly like a plain client.
    """
    import anthropic

    module = http_module()
    http_client = module.Client(transport=caching_transport(inner_transport, module), timeout=600.0)
    key = api_key or os.environ.get("ANTHROPIC_API_KEY") or "offline"
    retries = anthropic.DEFAULT_MAX_RETRIES if max_retries is None else max_retries
    return anthropic.Anthropic(base_url=base_url, api_key=key, http_client=http_client, max_retries=retries)
