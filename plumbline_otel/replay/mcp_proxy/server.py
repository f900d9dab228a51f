"""The loopback MCP proxy: routing of trials, the Streamable HTTP server, the upstream MCP client.

Built on the MCP Python SDK (``mcp``): its low-level ``Server`` answers the agent (both protocol
eras: the initialize handshake and the sessionless 2026-07-28 single exchange) behind its
``StreamableHTTPSessionManager`` in **stateless** mode, so no request is ever tied to an MCP
session, and its ``Client`` holds the one upstream connection (a Streamable HTTP URL, or a stdio
server the proxy launches and bridges). uvicorn serves it on an asyncio loop in a background
thread, so the driver-facing API is synchronous, like ``replay.proxy.ModelProxy``.

A request reaches its trial by the path ``/t/<token>/mcp`` its route hands out (a random token per
attempt, so a straggler of an earlier attempt is never counted in a later one), or on the bare
``/mcp`` by W3C ``baggage`` (``plumbline.trial.id`` and ``plumbline.trial.attempt``) or a
``traceparent`` whose trace id is the attempt's. A request matching no open trial is refused
(HTTP 403 with a JSON-RPC error) and counted in ``unroutable``: never guessed, and never keyed on
an ``Mcp-Session-Id`` (the protocol's newest revision has none).
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO, cast

import mcp.types as types
import orjson
import uvicorn
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

from plumbline_otel.errors import ConfigError
from plumbline_otel.replay.loopback import LoopbackService, loopback_only, parse_baggage
from plumbline_otel.replay.mcp_proxy.evidence import McpEvidence, McpTrialState
from plumbline_otel.replay.mcp_proxy.spans import ToolCallRecord, emit
from plumbline_otel.runs import TRIAL_ATTEMPT, TRIAL_ID

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider
    from starlette.types import Receive, Scope, Send

    from plumbline_otel.replay.adapters import Trial
    from plumbline_otel.replay.budget import TrialBudget

MCP_PATH = "/mcp"
ENV_URL = "PLUMBLINE_MCP_URL"
_STATE = "plumbline.mcp_proxy.trial"  # the ASGI scope key the router leaves for the handlers
_UNROUTABLE = -32001  # a server-defined JSON-RPC error code
_CALL_ID_KEYS = ("gen_ai.tool.call.id", "toolCallId", "tool_call_id", "callId")  # where agents put the model's call id in _meta


@dataclass(frozen=True)
class McpRoute:
    """One attempt's way into the MCP proxy: hand ``url`` (or ``env()``) to the agent as its MCP server."""

    proxy_url: str
    token: str
    trial_id: str
    attempt: int

    @property
    def url(self) -> str:
        return f"{self.proxy_url}/t/{self.token}{MCP_PATH}"

    def env(self) -> dict[str, str]:
        """``PLUMBLINE_MCP_URL``: the Streamable HTTP endpoint this attempt's agent uses in place of its server's."""
        return {ENV_URL: self.url}


def decoy_tool(spec: Mapping[str, Any]) -> types.Tool:
    """An MCP tool from a decoy spec (``perturb.DECOY_TOOLS`` shape: name, description, input_schema)."""
    schema = spec.get("input_schema") or spec.get("inputSchema") or spec.get("parameters") or {"type": "object", "properties": {}}
    return types.Tool(name=str(spec["name"]), description=spec.get("description"), input_schema=dict(schema))


class McpProxy(LoopbackService):
    """An MCP proxy on 127.0.0.1 for the trials of one study (see the module docstring).

        proxy = McpProxy(["python", "-m", "my_tools_server"], tracer_provider=provider)
        proxy.start()
        route = proxy.open_trial(trial)
        run_agent(env={**os.environ, **route.env()})   # the agent's MCP server URL := route.url
        evidence = proxy.close_trial(route)
        proxy.stop()
    """

    def __init__(self, upstream: str | Sequence[str], *, host: str = "127.0.0.1", port: int = 0,
                 tracer_provider: TracerProvider | None = None, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, errlog: TextIO | None = None, timeout_s: float = 600.0,
                 start_timeout_s: float = 30.0) -> None:
        """``upstream``: a Streamable HTTP MCP server URL, or a stdio server's argv, which the proxy
        launches at ``start`` (with ``env`` over the SDK's safe default environment, in ``cwd``, its
        stderr to ``errlog``) and stops at ``stop``. ``timeout_s`` bounds one upstream call."""
        loopback_only(host, "MCP proxy")
        if isinstance(upstream, str):
            if not upstream.startswith(("http://", "https://")):
                raise ConfigError(f"MCP upstream {upstream!r}: a Streamable HTTP URL, or a stdio server command as a list of arguments")
            self.upstream: str | tuple[str, ...] = upstream
        else:
            argv = tuple(str(a) for a in upstream)
            if not argv:
                raise ConfigError("MCP upstream: an empty stdio server command")
            self.upstream = argv
        self.host, self.port = host, port
        self.tracer_provider = tracer_provider
        self.env = dict(env or {})
        self.cwd = cwd
        self.errlog = errlog
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.unroutable = 0
        self.unroutable_reasons: deque[str] = deque(maxlen=50)
        self.span_errors = 0
        self.upstream_tools: tuple[str, ...] = ()  # the server's tools, as last listed
        self._routes: dict[str, McpTrialState] = {}
        self._by_attempt: dict[tuple[str, int], McpTrialState] = {}
        self._by_trace: dict[str, McpTrialState] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._uvicorn: uvicorn.Server | None = None
        self._client: Client | None = None
        self._manager: StreamableHTTPSessionManager | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect upstream (launching a stdio server), then listen (port 0: a free one) in a background thread."""
        if self._thread is not None:
            return
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say so, and without it every
        # response written in two parts (head, body) waits out a 40 ms delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"MCP proxy cannot listen on {self.host}:{self.port}: {exc}") from exc
        self.port = sock.getsockname()[1]
        if isinstance(self.upstream, str) and self.upstream.rstrip("/").startswith(self.url):
            sock.close()
            raise ConfigError(f"the MCP upstream {self.upstream} is this proxy itself: set it to the real server")
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(sock,), name="plumbline-mcp-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.start_timeout_s):
            self.stop()
            raise ConfigError(f"MCP proxy: upstream {self._upstream_text()} not ready within {self.start_timeout_s:g}s")
        if self._error is not None:
            error = self._error
            self._thread.join(5.0)
            self._thread = None
            raise ConfigError(f"MCP proxy: cannot connect to upstream {self._upstream_text()}: {_describe(error)}") from error

    def stop(self) -> None:
        """Stop serving, close the upstream connection (a stdio server is terminated); idempotent."""
        thread, server = self._thread, self._uvicorn
        if thread is None:
            return
        if server is not None:
            server.should_exit = True
        elif self._loop is not None and not self._ready.is_set():  # still connecting upstream: give up on it
            self._loop.call_soon_threadsafe(_cancel_all)
        thread.join(15.0)
        self._thread = None
        self._uvicorn = None

    @property
    def bare_url(self) -> str:
        """The endpoint without a route, for agents that propagate the trial in ``baggage``."""
        return f"{self.url}{MCP_PATH}"

    def _upstream_text(self) -> str:
        return self.upstream if isinstance(self.upstream, str) else " ".join(self.upstream)

    # --- trials -----------------------------------------------------------------------------------

    def open_trial(self, trial: Trial, budget: TrialBudget | None = None) -> McpRoute:
        """Route one attempt through the proxy: its fault is ``trial.fault``, its decoys ``trial.metadata["decoy_tools"]``.

        ``budget`` is accepted so both proxies are opened alike; tool calls cost nothing here."""
        decoys: dict[str, dict[str, Any]] = {}
        for spec in trial.metadata.get("decoy_tools") or []:
            if not isinstance(spec, Mapping) or not spec.get("name"):
                raise ConfigError(f"trial {trial.trial_id}: decoy tool spec {spec!r} has no name")
            decoys[str(spec["name"])] = dict(spec)
        state = McpTrialState(trial, budget, secrets.token_urlsafe(12), fault=trial.fault or trial.identity.fault,
                              decoys=decoys)
        identity = trial.identity
        with self._lock:
            if (identity.trial_id, identity.attempt) in self._by_attempt:
                raise ConfigError(f"trial {identity.trial_id} attempt {identity.attempt} already has an open MCP proxy route")
            state.unroutable_at_open = self.unroutable
            self._routes[state.token] = state
            self._by_attempt[(identity.trial_id, identity.attempt)] = state
            self._by_trace[identity.trace_id] = state
        return McpRoute(self.url, state.token, identity.trial_id, identity.attempt)

    def close_trial(self, route: McpRoute) -> McpEvidence:
        """Stop routing the attempt and return what the proxy witnessed in it."""
        with self._lock:
            state = self._routes.pop(route.token, None)
            if state is None:
                raise ConfigError(f"no open MCP proxy route for trial {route.trial_id} attempt {route.attempt}")
            identity = state.trial.identity
            self._by_attempt.pop((identity.trial_id, identity.attempt), None)
            self._by_trace.pop(identity.trace_id, None)
            state.closed = True
            unroutable = self.unroutable
        return state.evidence(unroutable)

    def resolve(self, token: str | None, headers: Mapping[str, str]) -> tuple[McpTrialState | None, str]:
        """The open trial a request belongs to, or None and why not."""
        with self._lock:
            if token is not None:
                state = self._routes.get(token)
                return (state, "") if state else (None, f"path token {token[:6]}… is not an open trial route")
            bag = parse_baggage(headers.get("baggage"))
            if TRIAL_ID in bag:
                try:
                    key = (bag[TRIAL_ID], int(bag.get(TRIAL_ATTEMPT, "")))
                except ValueError:
                    return None, f"baggage names trial {bag[TRIAL_ID]!r} without a numeric {TRIAL_ATTEMPT}"
                state = self._by_attempt.get(key)
                return (state, "") if state else (None, f"baggage names trial {key[0]!r} attempt {key[1]}, which is not open")
            parts = (headers.get("traceparent") or "").split("-")
            if len(parts) >= 2 and parts[1] in self._by_trace:
                return self._by_trace[parts[1]], ""
        return None, "no /t/<token> path prefix, no plumbline.trial.id baggage and no traceparent of an open trial"

    # --- the loop thread -------------------------------------------------------------------------

    def _run(self, sock: socket.socket) -> None:
        try:
            asyncio.run(self._main(sock))
        except BaseException as exc:  # reported by start(), or lost after stop()
            if not self._ready.is_set():
                self._error = exc
        finally:
            sock.close()
            self._ready.set()

    async def _main(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        async with AsyncExitStack() as stack:
            if isinstance(self.upstream, str):
                client = Client(self.upstream, cache=None, read_timeout_seconds=self.timeout_s)
            else:
                params = StdioServerParameters(command=self.upstream[0], args=list(self.upstream[1:]), env=self.env or None,
                                               cwd=self.cwd)
                client = Client(stdio_client(params, errlog=self.errlog or sys.stderr), cache=None,
                                read_timeout_seconds=self.timeout_s)
            self._client = await stack.enter_async_context(client)
            server = self._build_server(client.server_capabilities)
            self._manager = StreamableHTTPSessionManager(
                app=server, stateless=True, json_response=False,
                security_settings=TransportSecuritySettings(
                    enable_dns_rebinding_protection=True,
                    allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
                    allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]))
            await stack.enter_async_context(self._manager.run())
            config = uvicorn.Config(self._asgi, interface="asgi3", lifespan="off", proxy_headers=False, log_level="warning", access_log=False,
                                    timeout_graceful_shutdown=2, backlog=1024)
            self._uvicorn = uvicorn.Server(config)
            serving = asyncio.create_task(self._uvicorn.serve(sockets=[sock]))
            while not self._uvicorn.started and not serving.done():
                await asyncio.sleep(0.005)
            if serving.done():
                await serving  # raises why it could not serve
            self._ready.set()
            await serving

    def _build_server(self, caps: types.ServerCapabilities) -> Server[Any]:
        server: Server[Any] = Server("plumbline-mcp-proxy", version="1", on_list_tools=self._list_tools,
                                     on_call_tool=self._call_tool,
                                     get_tool_input_schema=lambda _name: None)  # the server validates arguments, not the proxy
        server.middleware = []  # the proxy writes its own spans, under the trial's trace; not a SERVER span per message
        if caps.prompts is not None:
            server.add_request_handler("prompts/list", types.PaginatedRequestParams, self._forward("prompts/list", types.ListPromptsResult))
            server.add_request_handler("prompts/get", types.GetPromptRequestParams, self._forward("prompts/get", types.GetPromptResult))
        if caps.resources is not None:
            server.add_request_handler("resources/list", types.PaginatedRequestParams,
                                       self._forward("resources/list", types.ListResourcesResult))
            server.add_request_handler("resources/templates/list", types.PaginatedRequestParams,
                                       self._forward("resources/templates/list", types.ListResourceTemplatesResult))
            server.add_request_handler("resources/read", types.ReadResourceRequestParams,
                                       self._forward("resources/read", types.ReadResourceResult))
        return server

    # --- HTTP: routing ---------------------------------------------------------------------------

    async def _asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        token = None
        if path.startswith("/t/"):
            token, _, rest = path[3:].partition("/")
            path = "/" + rest
        if path.rstrip("/") != MCP_PATH:
            await _reply(send, 404, {"jsonrpc": "2.0", "id": None,
                                     "error": {"code": -32601, "message": f"plumbline MCP proxy: no endpoint {path} (use {MCP_PATH})"}})
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        state, why = self.resolve(token, headers)
        if state is None:
            with self._lock:
                self.unroutable += 1
                self.unroutable_reasons.append(f"{scope['method']} {scope['path']}: {why}")
            await _reply(send, 403, {"jsonrpc": "2.0", "id": None, "error": {
                "code": _UNROUTABLE, "message": f"plumbline MCP proxy: request matches no open trial ({why})"}})
            return
        assert self._manager is not None
        inner = dict(scope, path=MCP_PATH, raw_path=MCP_PATH.encode())
        inner[_STATE] = state
        await self._manager.handle_request(inner, receive, send)

    def _state(self, ctx: ServerRequestContext[Any, Any]) -> McpTrialState:
        request = ctx.request
        state = request.scope.get(_STATE) if request is not None else None
        if not isinstance(state, McpTrialState):  # every request passed the router; this is a transport the proxy did not expect
            raise MCPError(code=_UNROUTABLE, message="plumbline MCP proxy: request reached no trial route")
        return state

    # --- MCP: handlers ---------------------------------------------------------------------------

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        state = self._state(ctx)
        assert self._client is not None
        page = await self._client.session.list_tools(params=types.PaginatedRequestParams(cursor=params.cursor if params else None))
        names = {tool.name for tool in page.tools}
        if params is None or params.cursor is None:
            self.upstream_tools = tuple(sorted(names))
        tools = list(page.tools)
        offered: list[str] = []
        if page.next_cursor is None:  # the decoys go on the last page, after every tool of the server's
            for name, spec in state.decoys.items():
                if name not in names and name not in self.upstream_tools:
                    tools.append(decoy_tool(spec))
                    offered.append(name)
        state.offered(offered)
        return types.ListToolsResult(tools=tools, next_cursor=page.next_cursor)

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        state = self._state(ctx)
        started = time.time_ns()
        tool, arguments = params.name, params.arguments
        call = state.next_call(tool)
        meta = cast(Mapping[str, Any], params.meta or {})
        rec = ToolCallRecord(identity=state.trial.identity, tool=tool, call=call, arguments=arguments, started_ns=started,
                             ended_ns=started, source="upstream", protocol_version=ctx.protocol_version,
                             request_id=ctx.request_id,
                             tool_call_id=next((str(meta[k]) for k in _CALL_ID_KEYS if meta.get(k)), None))
        try:
            if tool in state.decoys and tool not in self.upstream_tools:
                state.add_decoy_call(tool, call)
                rec.source = "decoy"
                result = _error_result(f"{tool} is unavailable: the tool service did not answer")
            elif state.fault_fires(tool, call):
                assert state.fault is not None
                message = state.fault.error_message
                state.add_fault(tool, call, message)
                rec.source, rec.fault_kind = "fault", state.fault.kind
                result = _error_result(message)
            else:
                result = await self._upstream_call(state, params, rec)
            rec.result = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            rec.is_error = result.is_error
            if result.is_error:
                rec.error_message = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))[:500] or None
        except BaseException as exc:  # a protocol error for the agent, or the call cancelled: still a span
            rec.ended_ns = time.time_ns()
            if rec.error_type is None:
                rec.error_type, rec.error_message = type(exc).__name__, _describe(exc)
            self._emit(rec)
            raise
        rec.ended_ns = time.time_ns()
        # Written before the agent has its answer, so a finished agent's tool calls are all exported; off the
        # loop, so a slow exporter holds up this call only, never the other trials'.
        await asyncio.to_thread(self._emit, rec)
        return result

    async def _upstream_call(self, state: McpTrialState, params: types.CallToolRequestParams,
                             rec: ToolCallRecord) -> types.CallToolResult:
        assert self._client is not None
        try:
            result = await self._client.session.call_tool(params.name, params.arguments)
        except MCPError as exc:
            state.upstream(error=True)
            rec.error_type, rec.error_message = f"jsonrpc.{exc.code}", exc.message
            raise
        except Exception as exc:
            state.upstream(error=True)
            rec.error_type, rec.error_message = type(exc).__name__, _describe(exc)
            raise MCPError(code=types.INTERNAL_ERROR, message=f"plumbline MCP proxy: upstream failed: {_describe(exc)}") from exc
        state.upstream(error=False)
        return result

    def _forward(self, method: str, result_type: type[types.Result]) -> Any:
        """A handler that passes ``method`` through to the server unchanged (counted, not spanned)."""
        async def handler(ctx: ServerRequestContext[Any, Any], params: types.RequestParams) -> types.Result:
            state = self._state(ctx)
            with state.lock:
                state.passthrough += 1
            assert self._client is not None
            raw = params.model_dump(mode="json", by_alias=True, exclude_none=True)
            return await self._client.session.send_request(
                _RawRequest(method=method, params=raw or None), result_type)
        return handler

    def _emit(self, rec: ToolCallRecord) -> None:
        if self.tracer_provider is None:
            return
        try:
            emit(self.tracer_provider, rec)
        except Exception:  # a span that cannot be written must not fail the agent's call
            with self._lock:
                self.span_errors += 1


class _RawRequest(types.Request[dict[str, Any] | None, str]):
    """A request forwarded as the agent sent it (method and params as wire JSON)."""

    method: str
    params: dict[str, Any] | None = None


def _cancel_all() -> None:
    for task in asyncio.all_tasks():
        task.cancel()


def _error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _describe(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", None)  # an exception group (anyio's task groups raise them)
    if isinstance(inner, (list, tuple)) and inner:
        return "; ".join(_describe(e) for e in inner)
    return f"{type(exc).__name__}: {exc}"


async def _reply(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = orjson.dumps(body)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
