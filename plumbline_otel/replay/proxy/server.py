"""The loopback model-API proxy: routing of trials, the HTTP server, upstream forwarding.

Server stack: the standard library's ``ThreadingHTTPServer`` (a thread per connection, HTTP/1.1
keep-alive, chunked SSE relay) with one pooled ``httpx.Client`` upstream. The proxy's work per
call is blocking by nature (the spend cap's ``flock``, the cassette's append, the SDK-shaped
relay), so an event loop would hand it to threads anyway; at 64 concurrent trials a thread per
connection is 64 mostly idle threads, and ``bench/proxy_overhead.py`` measures what it adds.
No new server dependency.

A trial reaches its route by the path prefix ``/t/<token>`` the route hands out (a random token
per attempt, so a straggler of an earlier attempt cannot be counted in a later one), or on the
bare URL by W3C ``baggage`` (``plumbline.trial.id`` and ``plumbline.trial.attempt``) or a
``traceparent`` whose trace id is the attempt's. A request that matches no open trial is refused
with a provider-shaped 403 and counted in ``unroutable``: never guessed.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
import traceback
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import httpx

from plumbline_otel.errors import ConfigError
from plumbline_otel.replay.cache import ResponseCache
from plumbline_otel.replay.limits import Holding, MemoryBudget, ProxyLimits
from plumbline_otel.replay.loopback import LoopbackService, loopback_only
from plumbline_otel.replay.perturb import ModelFaultPlan, ToolResultFaultPlan
from plumbline_otel.replay.proxy.evidence import ProxyEvidence, TrialState
from plumbline_otel.replay.proxy.exchange import handle_call, relay
from plumbline_otel.replay.proxy.record import ConversationRecorder
from plumbline_otel.replay.proxy.services import HOP_BY_HOP, Responder, refuse
from plumbline_otel.replay.proxy.wire import api_for
from plumbline_otel.replay.routing import Route, RoutingTable, split_token

if TYPE_CHECKING:
    from email.message import Message

    from opentelemetry.trace import TracerProvider

    from plumbline_otel.replay.budget import TrialBudget
    from plumbline_otel.replay.contracts import Trial, TrialRoute
    from plumbline_otel.replay.tape import Tape

DEFAULT_UPSTREAMS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
_FREE_PATHS = ("/v1/models", "/v1/messages/count_tokens")  # endpoints that cost nothing, passed through under a cap


@dataclass(frozen=True)
class ProxyRoute(Route):
    """One attempt's way into the proxy: hand ``env()`` (or the base URLs) to the agent."""

    @property
    def url(self) -> str:
        return f"{self.proxy_url}/t/{self.token}"

    @property
    def openai_base_url(self) -> str:
        """What the OpenAI SDKs take as base URL (they append ``/chat/completions``, ``/responses``)."""
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """What the Anthropic SDKs take as base URL (they append ``/v1/messages``)."""
        return self.url

    def env(self) -> dict[str, str]:
        """``OPENAI_BASE_URL`` and ``ANTHROPIC_BASE_URL`` for a subprocess agent."""
        return {"OPENAI_BASE_URL": self.openai_base_url, "ANTHROPIC_BASE_URL": self.anthropic_base_url}


class ModelProxy(LoopbackService):
    """A model-API proxy on 127.0.0.1 for the trials of one study (see the package docstring)."""

    def __init__(self, upstreams: Mapping[str, str] | None = None, cache: ResponseCache | None = None, *,
                 host: str = "127.0.0.1", port: int = 0, api_keys: Mapping[str, str] | None = None,
                 pass_agent_auth: bool = False, tracer_provider: TracerProvider | None = None,
                 timeout_s: float = 600.0, env: Mapping[str, str] | None = None, limits: ProxyLimits | None = None,
                 recorder: ConversationRecorder | None = None) -> None:
        """``upstreams``: provider ("openai", "anthropic") → base URL, defaulting to ``OPENAI_BASE_URL`` /
        ``ANTHROPIC_BASE_URL`` of ``env`` (this process's environment) and then the public APIs.
        ``api_keys`` likewise from ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``; a provider with a key
        gets it on every forwarded call (the agent may hold a dummy), one without gets the agent's
        own auth header, as does every provider when ``pass_agent_auth``. ``limits``: what one
        request, one answer and all calls together may hold (``limits.ProxyLimits``; default from
        ``PLUMBLINE_PROXY_*`` of ``env``). ``timeout_s`` bounds each read from the provider: a
        provider silent that long has failed the call. ``recorder``: record mode (``record``): spans go
        into one trace per agent conversation, as ordinary traffic, instead of under the trial."""
        loopback_only(host, "model proxy")
        env = os.environ if env is None else env
        self.upstreams = {"openai": env.get("OPENAI_BASE_URL") or DEFAULT_UPSTREAMS["openai"],
                          "anthropic": env.get("ANTHROPIC_BASE_URL") or DEFAULT_UPSTREAMS["anthropic"],
                          **dict(upstreams or {})}
        keys = {"openai": env.get("OPENAI_API_KEY"), "anthropic": env.get("ANTHROPIC_API_KEY"), **dict(api_keys or {})}
        self.api_keys = {k: v for k, v in keys.items() if v}
        self.pass_agent_auth = pass_agent_auth
        self.limits = limits or ProxyLimits.from_env(env)
        self.recorder = recorder
        self.memory = MemoryBudget(self.limits.max_held_bytes)
        self.bad_requests = 0  # malformed or oversize requests refused before they were read (any route)
        self.internal_errors = 0
        self.cache = cache
        self.tracer_provider = tracer_provider
        self.host, self.port = host, port
        self.unroutable = 0
        self.unroutable_reasons: deque[str] = deque(maxlen=50)
        self.span_errors = 0
        self.http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0), trust_env=False,
                                 limits=httpx.Limits(max_connections=512, max_keepalive_connections=128))
        self._lock = threading.Lock()
        self._table: RoutingTable[TrialState] = RoutingTable("proxy", self._lock)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Listen (port 0: a free one) and serve in a background thread."""
        if self._server is not None:
            return
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server = _Server((self.host, self.port), _Handler, family, self)
        self.port = server.server_address[1]
        for provider, base in self.upstreams.items():
            if base.rstrip("/").startswith(self.url):
                server.server_close()
                raise ConfigError(f"the {provider} upstream {base} is this proxy itself: set it to the real provider")
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="plumbline-model-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.http.close()

    # --- trials -----------------------------------------------------------------------------------

    def open_trial(self, trial: Trial, budget: TrialBudget | None = None, tape: Tape | None = None) -> ProxyRoute:
        """Route one attempt through the proxy: its plan comes from ``trial.metadata``.

        ``tape``: a branch-point replay (``metadata["branch_at"]``): model calls before that step are answered from
        the tape, never the provider, and checked against the recorded requests (``replay.tape``)."""
        from plumbline_otel.replay.tape import Branch  # the tape reads the wire module of this package

        meta, step = trial.metadata, trial.branch_at
        state = TrialState(trial, budget, secrets.token_urlsafe(12),
                           model_fault=ModelFaultPlan.from_dict(trial.plan("model_fault")),
                           tool_result_fault=ToolResultFaultPlan.from_dict(trial.plan("tool_result_fault")),
                           decoys=trial.decoy_specs(),
                           sampling={k: meta[k] for k in ("temperature", "top_p", "seed") if meta.get(k) is not None},
                           branch=Branch(tape, step) if tape is not None and step else None)
        self._table.open(state)
        return ProxyRoute(self.url, state.token, trial.identity.trial_id, trial.identity.attempt)

    def close_trial(self, route: TrialRoute, wait_s: float = 30.0) -> ProxyEvidence:
        """Stop routing the attempt and return what the proxy witnessed in it.

        Calls still being served (an answer relayed but not yet accounted, a held timeout fault)
        are waited for up to ``wait_s``, so their cost and faults are in the evidence.
        """
        state = self._table.close(route)
        state.wait_idle(wait_s)
        return state.evidence()

    def resolve(self, token: str | None, headers: Message) -> tuple[TrialState | None, str]:
        """The open trial a request belongs to, entered (``TrialState.leave`` when served), or None and why not.

        Entered under the routing lock, so a concurrent ``close_trial`` either refuses the request
        or waits for it: a call is never served on a route whose evidence was already taken.
        """
        return self._table.resolve(token, headers.get_all("baggage") or [], headers.get("traceparent"), TrialState.enter)

    # --- upstream ----------------------------------------------------------------------------------

    def upstream_url(self, provider: str, path: str) -> str:
        base = self.upstreams[provider].rstrip("/")
        if base.endswith("/v1") and path.startswith("/v1/"):
            path = path[3:]
        return base + path

    def upstream_headers(self, provider: str, headers: Mapping[str, str]) -> dict[str, str]:
        """The agent's headers minus hop-by-hop ones, with the proxy's key unless the agent's passes."""
        out = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in ("host", "accept-encoding")}
        key = self.api_keys.get(provider)
        if key and not self.pass_agent_auth:
            for name in [k for k in out if k.lower() in ("authorization", "x-api-key")]:
                del out[name]
            out["x-api-key" if provider == "anthropic" else "authorization"] = key if provider == "anthropic" else f"Bearer {key}"
        out["accept-encoding"] = "identity"
        return out

    def span_failed(self) -> None:
        """A call's span could not be written (`exchange.ProxyServices`): counted, the call served all the same."""
        self.span_errors += 1

    def passthrough(self, state: TrialState, method: str, path: str, raw: bytes, headers: Mapping[str, str],
                    out: Responder) -> None:
        """An endpoint that is not a model call (model lists, token counts): forwarded, counted, not metered."""
        provider = "anthropic" if path.startswith("/v1/messages") or "anthropic-version" in {k.lower() for k in headers} else "openai"
        capped = state.budget is not None and state.budget.cap.limit is not None
        if method != "GET" and capped and path.rstrip("/") not in _FREE_PATHS:
            refuse(out, provider, 403, "plumbline_unmetered", f"plumbline proxy: {method} {path} cannot be metered, so a spend cap refuses it")
            return
        with state.lock:
            state.passthrough += 1
        holding = Holding(self.memory)
        try:
            with self.http.stream(method, self.upstream_url(provider, path), content=raw or None,
                                  headers=self.upstream_headers(provider, headers)) as response:
                relay(out, response.status_code, [(k, v) for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP],
                      response.iter_bytes(), sse="event-stream" in (response.headers.get("content-type") or ""), strip_usage=False,
                      cut_after=None, provider=provider, limit=self.limits.max_response_bytes, holding=holding)
        except httpx.HTTPError as exc:
            refuse(out, provider, 502, "api_error", f"plumbline proxy: upstream failed: {type(exc).__name__}: {exc}")
        finally:
            holding.release()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # 64 trials connecting at once must not overflow the listen backlog

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], family: socket.AddressFamily,
                 proxy: ModelProxy) -> None:
        self.address_family = family
        self.proxy = proxy
        super().__init__(address, handler)


class _Responder:
    """Writes an answer on the handler's connection: whole, cut short, or as a chunked SSE stream."""

    def __init__(self, handler: _Handler) -> None:
        self.h = handler
        self.gone = False
        self.started = False  # a status line went out: nothing but body bytes (or a dropped connection) may follow
        self.done = False  # the whole answer went out: the connection is in a clean state
        self.status = 0
        self.call: int | None = None

    def _head(self, status: int, headers: list[tuple[str, str]], extra: list[tuple[str, str]]) -> None:
        if self.started:  # a second answer on one request would land inside the first one's body
            raise RuntimeError(f"plumbline proxy: a second answer ({status}) to one request")
        self.started, self.status = True, status
        self.h.send_response(status)
        for k, v in [*headers, *extra]:
            self.h.send_header(k, v)
        self.h.end_headers()

    def _put(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            self.h.wfile.write(data)
        except OSError:
            self.gone = True  # the agent hung up; upstream is still drained so the call is metered
            self.h.close_connection = True

    def send(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
        self._head(status, headers, [("content-length", str(len(payload)))])
        self._put(payload)
        self.done = True

    def send_cut(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
        self._head(status, headers, [("content-length", str(len(payload)))])
        self._put(payload[:len(payload) // 2])
        self.abort()

    def start_stream(self, status: int, headers: list[tuple[str, str]]) -> None:
        self._head(status, headers, [("transfer-encoding", "chunked")])

    def write(self, data: bytes) -> None:
        if data:
            self._put(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        self._put(b"0\r\n\r\n")
        self.done = True

    def abort(self) -> None:
        """Drop the connection mid-answer (a cut stream): no terminator, the socket shut."""
        self.h.close_connection = True
        self.gone = True
        try:
            self.h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes: no 40 ms delayed-ACK stall
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return  # the proxy's record is its evidence and spans, not an access log

    def _refuse_request(self, status: int, message: str, state: TrialState | None) -> None:
        """A request the proxy will not read: a clear 4xx (provider-shaped), the connection closed after it."""
        proxy = self.server.proxy
        with proxy._lock:
            proxy.bad_requests += 1
        if state is not None:
            state.proxy_failed(None, status, "request_too_large" if status == 413 else "bad_request_framing", message)
        self.close_connection = True
        provider = "anthropic" if self.path.split("?")[0].endswith("/v1/messages") else "openai"
        out = _Responder(self)
        refuse(out, provider, status, "request_too_large" if status == 413 else "invalid_request_error", f"plumbline proxy: {message}")
        self._drain_unread()

    def _drain_unread(self, seconds: float = 2.0) -> None:
        """Discard what the client is still sending, for a moment, so it reads the refusal rather than a reset.

        Closing a socket with unread bytes makes the kernel send RST, and a client still writing
        its body would see "connection reset" instead of the 413. Nothing read here is kept.
        """
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                self.connection.settimeout(left)
                if not self.connection.recv(1 << 16):
                    break
        except OSError:
            pass

    def _body(self, holding: Holding) -> tuple[bytes | None, int, str]:
        """The request body, read up to the proxy's limit; (None, status, why) when it is refused unread.

        ``Content-Length`` must be one non-negative decimal; a chunked body must be well framed.
        Nothing past ``max_request_bytes`` is read, so an oversize body costs no memory.
        """
        limits = self.server.proxy.limits
        limit = limits.max_request_bytes
        too_big = f"the request body is larger than the proxy's limit of {limit} bytes (PLUMBLINE_PROXY_MAX_REQUEST_MIB)"
        busy = "the proxy holds as much as PLUMBLINE_PROXY_MAX_HELD_MIB allows across its calls; retry"
        encoding = (self.headers.get("transfer-encoding") or "").lower()
        if encoding:
            if [p.strip() for p in encoding.split(",")][-1] != "chunked":
                return None, 400, f"Transfer-Encoding {encoding!r} is not supported (only chunked)"
            data = bytearray()
            while True:
                line = self.rfile.readline(1026)
                size_text = line.split(b";")[0].strip()
                try:
                    if not line.endswith(b"\n") or not size_text or size_text.startswith((b"-", b"+")):
                        raise ValueError(line[:40])
                    size = int(size_text, 16)
                except ValueError:
                    return None, 400, f"malformed chunk size line {bytes(line[:40])!r} in a chunked body"
                if size == 0:
                    for _ in range(64):  # trailers, then the blank line
                        if self.rfile.readline(8192) in (b"\r\n", b"\n", b""):
                            return bytes(data), 0, ""
                    return None, 400, "too many trailer lines after a chunked body"
                if len(data) + size > limit:
                    return None, 413, too_big
                if not holding.take(size):
                    return None, 503, busy
                chunk = self.rfile.read(size)
                if len(chunk) != size or self.rfile.readline(3) not in (b"\r\n", b"\n"):
                    return None, 400, "a chunk of the chunked body is shorter than its size line says, or not followed by CRLF"
                data += chunk
        values = self.headers.get_all("content-length") or []
        if not values:
            return b"", 0, ""
        texts = {v.strip() for value in values for v in value.split(",")}
        if len(texts) != 1 or not next(iter(texts)).isdigit():
            return None, 400, f"Content-Length {', '.join(values)!r} is not one non-negative integer"
        length = int(next(iter(texts)))
        if length > limit:
            return None, 413, too_big
        if not holding.take(length):
            return None, 503, busy
        raw = self.rfile.read(length) if length else b""
        if len(raw) != length:
            return None, 400, f"the body ended after {len(raw)} of its {length} bytes"
        return raw, 0, ""

    def _dispatch(self, method: str) -> None:
        proxy = self.server.proxy
        path, _, query = self.path.partition("?")
        token, path = split_token(path)
        out = _Responder(self)
        state, why = proxy.resolve(token, self.headers)
        provider = "anthropic" if path.startswith("/v1/messages") else "openai"
        holding = Holding(proxy.memory)
        try:
            raw, status, problem = self._body(holding)
            if raw is None:
                self._refuse_request(status, problem, state)
                return
            if state is None:
                with proxy._lock:
                    proxy.unroutable += 1
                    proxy.unroutable_reasons.append(f"{method} {path}: {why}")
                refuse(out, provider, 403, "plumbline_unroutable", f"plumbline proxy: request matches no open trial ({why})")
                return
            try:
                self._serve(proxy, state, method, path, query, raw, out)
            except Exception as exc:  # noqa: BLE001 - the proxy's own failure: said to the agent and in the evidence, never a traceback
                self._internal_error(proxy, state, out, provider, exc)
        finally:
            holding.release()
            if state is not None:  # entered by resolve: close_trial waits for this call
                state.leave()

    def _internal_error(self, proxy: ModelProxy, state: TrialState, out: _Responder, provider: str, exc: Exception) -> None:
        """An exception inside the proxy: in ``proxy_errors``; a 500 if nothing was answered yet, the connection
        dropped if an answer was half sent, and nothing more if the agent already had its whole answer."""
        with proxy._lock:
            proxy.internal_errors += 1
        where = traceback.extract_tb(exc.__traceback__)[-1:]
        at = f" at {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno}" if where else ""
        detail = f"{type(exc).__name__}: {exc}{at}"
        if not out.started:
            refuse(out, provider, 500, "api_error", f"plumbline proxy internal error (not the provider's, not the agent's): {detail}")
            status = 500
        elif not out.done:
            out.abort()
            status = 0
        else:
            status = out.status
        state.proxy_failed(out.call, status, "internal", detail)

    def _serve(self, proxy: ModelProxy, state: TrialState, method: str, path: str, query: str, raw: bytes, out: _Responder) -> None:
        headers = {k: v for k, v in self.headers.items()}
        api = api_for(path)
        if method == "POST" and api is not None:
            handle_call(proxy, state, api, path, raw, headers, out)
        else:
            proxy.passthrough(state, method, f"{path}?{query}" if query else path, raw, headers, out)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self._dispatch("POST")

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

