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
import contextlib
import secrets
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO, TypeVar, cast

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
from plumbline_otel.replay.limits import ProxyLimits, truncate_text
from plumbline_otel.replay.loopback import LoopbackService, loopback_only
from plumbline_otel.replay.mcp_proxy.evidence import McpEvidence, McpTrialState
from plumbline_otel.replay.mcp_proxy.spans import ToolCallRecord, emit
from plumbline_otel.replay.mcp_proxy.upstream import RelaunchDoc, Upstream, UpstreamGone, session_closed
from plumbline_otel.replay.proxy.record import ConversationRecorder
from plumbline_otel.replay.routing import Route, RoutingTable, split_token
from plumbline_otel.replay.tape import Branch, Tape, shape_tool_result

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider
    from starlette.types import Receive, Scope, Send

    from plumbline_otel.replay.budget import TrialBudget
    from plumbline_otel.replay.contracts import JsonObject, Trial, TrialRoute

MCP_PATH = "/mcp"
ENV_URL = "PLUMBLINE_MCP_URL"
_STATE = "plumbline.mcp_proxy.trial"  # the ASGI scope key the router leaves for the handlers
_UNROUTABLE = -32001  # a server-defined JSON-RPC error code
_T = TypeVar("_T")
_CALL_ID_KEYS = ("gen_ai.tool.call.id", "toolCallId", "tool_call_id", "callId")  # where agents put the model's call id in _meta


@dataclass(frozen=True)
class McpRoute(Route):
    """One attempt's way into the MCP proxy: hand ``url`` (or ``env()``) to the agent as its MCP server."""

    @property
    def url(self) -> str:
        return f"{self.proxy_url}/t/{self.token}{MCP_PATH}"

    def env(self) -> dict[str, str]:
        """``PLUMBLINE_MCP_URL``: the Streamable HTTP endpoint this attempt's agent uses in place of its server's."""
        return {ENV_URL: self.url}


def decoy_tool(spec: Mapping[str, object]) -> types.Tool:
    """An MCP tool from a decoy spec (``perturb.DECOY_TOOLS`` shape: name, description, input_schema)."""
    schema = spec.get("input_schema") or spec.get("inputSchema") or spec.get("parameters") or {"type": "object", "properties": {}}
    description = spec.get("description")
    if not isinstance(schema, Mapping):
        raise ConfigError(f"decoy tool {spec.get('name')!r}: its input schema is not a JSON object")
    return types.Tool(name=str(spec["name"]), description=description if isinstance(description, str) else None,
                      input_schema=dict(schema))


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
                 start_timeout_s: float = 30.0, limits: ProxyLimits | None = None, max_relaunches: int = 5,
                 recorder: ConversationRecorder | None = None) -> None:
        """``upstream``: a Streamable HTTP MCP server URL, or a stdio server's argv, which the proxy
        launches at ``start`` (with ``env`` over the SDK's safe default environment, in ``cwd``, its
        stderr to ``errlog``) and stops at ``stop``. ``timeout_s`` bounds one upstream call. A server
        that dies is relaunched (``upstream.Upstream``: back-off, at most ``max_relaunches`` in a row
        with no successful call between). ``limits``: the request body and span payload limits
        (``limits.ProxyLimits``, default from ``PLUMBLINE_PROXY_*``). ``recorder``: record mode, tool
        spans join the model proxy's agent conversations (``proxy.record``)."""
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
        self.limits = limits or ProxyLimits.from_env()
        self.max_relaunches = max_relaunches
        self.recorder = recorder
        self.internal_errors = 0
        self._upstream: Upstream | None = None
        self.unroutable = 0
        self.unroutable_reasons: deque[str] = deque(maxlen=50)
        self.span_errors = 0
        self.upstream_tools: tuple[str, ...] = ()  # the server's tools, as last listed
        self.output_schemas: dict[str, Any] = {}  # their declared output schemas: a tape's result is shaped to them (issue 44)
        self._lock = threading.Lock()
        self._table: RoutingTable[McpTrialState] = RoutingTable("MCP proxy", self._lock)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._uvicorn: uvicorn.Server | None = None
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

    def open_trial(self, trial: Trial, budget: TrialBudget | None = None, tape: Tape | None = None) -> McpRoute:
        """Route one attempt through the proxy: its fault is ``trial.fault``, its decoys ``trial.metadata["decoy_tools"]``.

        ``budget`` is accepted so both proxies are opened alike; tool calls cost nothing here. ``tape``: a
        branch-point replay (``metadata["branch_at"]``): tool calls before that step are answered with the
        tape's results, the tool server never called (``replay.tape``)."""
        decoys: dict[str, JsonObject] = {}
        for spec in trial.decoy_specs():
            if not spec.get("name"):
                raise ConfigError(f"trial {trial.trial_id}: decoy tool spec {spec!r} has no name")
            decoys[str(spec["name"])] = spec
        state = McpTrialState(trial, budget, secrets.token_urlsafe(12), fault=trial.fault or trial.identity.fault,
                              decoys=decoys)
        if tape is not None and trial.branch_at:
            state.branch = Branch(tape, trial.branch_at)

        def opened(state: McpTrialState) -> None:  # the counters it is measured against, as the route opens
            state.unroutable_at_open = self.unroutable
            state.relaunches_at_open = len(self._upstream.relaunches) if self._upstream is not None else 0

        self._table.open(state, opened)
        return McpRoute(self.url, state.token, trial.identity.trial_id, trial.identity.attempt)

    def close_trial(self, route: TrialRoute) -> McpEvidence:
        """Stop routing the attempt and return what the proxy witnessed in it."""
        unroutable = 0

        def closed(_: McpTrialState) -> None:
            nonlocal unroutable
            unroutable = self.unroutable

        state = self._table.close(route, closed)
        upstream = self._upstream
        return state.evidence(unroutable, upstream.generation if upstream else 0, upstream.snapshot() if upstream else [])

    @property
    def relaunches(self) -> list[RelaunchDoc]:
        """Every relaunch of the tool server so far: when, why, whether it came back."""
        return self._upstream.snapshot() if self._upstream is not None else []

    def resolve(self, token: str | None, headers: Mapping[str, str]) -> tuple[McpTrialState | None, str]:
        """The open trial a request belongs to, or None and why not."""
        return self._table.resolve(token, headers.get("baggage"), headers.get("traceparent"))

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

    def _make_client(self) -> Client:
        """A fresh connection to the tool server (a stdio server: a fresh process)."""
        if isinstance(self.upstream, str):
            return Client(self.upstream, cache=None, read_timeout_seconds=self.timeout_s)
        params = StdioServerParameters(command=self.upstream[0], args=list(self.upstream[1:]), env=self.env or None, cwd=self.cwd)
        return Client(stdio_client(params, errlog=self.errlog or sys.stderr), cache=None, read_timeout_seconds=self.timeout_s)

    async def _main(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        upstream = self._upstream = Upstream(self._make_client, _describe, self.max_relaunches)
        supervisor = asyncio.create_task(upstream.run(), name="plumbline-mcp-upstream")
        try:
            await self._serve(sock, await upstream.first_client())
        finally:
            supervisor.cancel()
            with contextlib.suppress(BaseException):
                await supervisor

    async def _serve(self, sock: socket.socket, client: Client) -> None:
        async with AsyncExitStack() as stack:
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
        token, path = split_token(scope["path"])
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
        if scope["method"] == "POST":
            body, status, problem = await _read_body(receive, headers, self.limits.max_request_bytes)
            if body is None:
                state.proxy_failed(None, None, f"HTTP {status}: {problem}", "request_too_large" if status == 413 else "bad_request")
                await _reply(send, status, {"jsonrpc": "2.0", "id": None, "error": {
                    "code": types.INVALID_REQUEST, "message": f"plumbline MCP proxy: {problem}"}})
                return
            receive = _replayed(body, receive)
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
        cursor = types.PaginatedRequestParams(cursor=params.cursor if params else None)
        page = await self._idempotent(state, "tools/list", lambda client: client.session.list_tools(params=cursor))
        names = {tool.name for tool in page.tools}
        self.output_schemas.update((tool.name, tool.output_schema) for tool in page.tools)
        if params is None or params.cursor is None:
            self.upstream_tools = tuple(sorted(names))
        tools = list(page.tools)
        offered: list[str] = []
        if page.next_cursor is None and (state.branch is None or state.branch.decoys_due(state.calls)):  # the decoys go on the last page, after every tool of the server's (a branch-point replay: from the branch point on)
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
        served = state.branch.serves_tool_call(state.calls) if state.branch is not None else None
        try:
            if served is not None:  # the prefix of a branch-point replay: the recorded result, the server never called
                rec.source = "tape"
                result = cast(types.CallToolResult, shape_tool_result(state.from_tape(served, tool, arguments), self.output_schemas.get(tool)))
            elif tool in state.decoys and tool not in self.upstream_tools:
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
            rec.result, cut = truncate_text(result.model_dump_json(by_alias=True, exclude_none=True), self.limits.span_payload_bytes)
            rec.truncated = ["gen_ai.tool.call.result"] if cut else []
            rec.is_error = result.is_error
            if result.is_error:
                rec.error_message = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))[:500] or None
        except BaseException as exc:  # a protocol error for the agent, or the call cancelled: still a span
            rec.ended_ns = time.time_ns()
            if rec.error_type is None:
                rec.error_type, rec.error_message = type(exc).__name__, _describe(exc)
                if isinstance(exc, Exception) and not isinstance(exc, MCPError):  # the proxy's own failure, not the server's
                    with self._lock:
                        self.internal_errors += 1
                    state.proxy_failed(call, tool, _describe(exc), "internal")
                    self._emit(rec)
                    raise MCPError(code=types.INTERNAL_ERROR,
                                   message=f"plumbline MCP proxy internal error (not the tool's, not the agent's): {_describe(exc)}") from exc
            self._emit(rec)
            raise
        rec.ended_ns = time.time_ns()
        # Written before the agent has its answer, so a finished agent's tool calls are all exported; off the
        # loop, so a slow exporter holds up this call only, never the other trials'.
        await asyncio.to_thread(self._emit, rec)
        return result

    async def _client_for(self, state: McpTrialState, call: int | None, tool: str | None) -> tuple[Client, int]:
        """The live connection, waiting for a relaunch if the server is down; a ``server_died`` error if it stays down."""
        assert self._upstream is not None
        try:
            return await self._upstream.client(self.start_timeout_s)
        except UpstreamGone as exc:
            state.server_gone(call, tool, str(exc), "died" if isinstance(self.upstream, tuple) else "unreachable", self._upstream.generation)
            raise MCPError(code=types.INTERNAL_ERROR, message=f"plumbline MCP proxy: tool server died: {exc}") from exc

    def _death(self, client: Client, generation: int, exc: BaseException) -> str | None:
        """Whether ``exc`` means the connection to the server is gone (and a relaunch is under way); how, if so."""
        assert self._upstream is not None
        closed = isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED
        if closed or session_closed(client):
            self._upstream.died(generation, f"a call saw the connection close: {_describe(exc)}")
            return "died" if isinstance(self.upstream, tuple) else "unreachable"
        if not isinstance(exc, MCPError):  # a transport error: the HTTP server is unreachable, or the stdio pipe broke
            self._upstream.died(generation, f"a call's transport failed: {_describe(exc)}")
            return "died" if isinstance(self.upstream, tuple) else "unreachable"
        if exc.code == types.REQUEST_TIMEOUT:
            return "timeout"
        return None

    async def _upstream_call(self, state: McpTrialState, params: types.CallToolRequestParams,
                             rec: ToolCallRecord) -> types.CallToolResult:
        client, generation = await self._client_for(state, rec.call, params.name)
        try:
            result = await client.session.call_tool(params.name, params.arguments)
        except Exception as exc:
            state.upstream(error=True)
            rec.error_type = f"jsonrpc.{exc.code}" if isinstance(exc, MCPError) else type(exc).__name__
            rec.error_message = exc.message if isinstance(exc, MCPError) else _describe(exc)
            how = self._death(client, generation, exc)
            if how is not None:  # never sent again: the tool may have acted before the server went
                detail = (f"no answer within {self.timeout_s:g}s" if how == "timeout" else
                          f"the tool server {'died' if how == 'died' else 'was unreachable'} during this call: {_describe(exc)}")
                state.server_gone(rec.call, params.name, detail, how, generation)
                raise MCPError(code=types.INTERNAL_ERROR, message=f"plumbline MCP proxy: tool server died: {detail}"
                               if how != "timeout" else f"plumbline MCP proxy: tool server timed out: {detail}") from exc
            if isinstance(exc, MCPError):
                raise
            raise MCPError(code=types.INTERNAL_ERROR, message=f"plumbline MCP proxy: upstream failed: {_describe(exc)}") from exc
        state.upstream(error=False)
        assert self._upstream is not None
        self._upstream.succeeded()
        return result

    async def _idempotent(self, state: McpTrialState, method: str, send: Callable[[Client], Awaitable[_T]]) -> _T:
        """A request that changes nothing on the server (a listing, a read): sent again once on a relaunched
        server if the connection died under it."""
        for attempt in (1, 2):
            client, generation = await self._client_for(state, None, None)
            try:
                return await send(client)
            except Exception as exc:
                how = self._death(client, generation, exc)
                if how is None or how == "timeout" or attempt == 2:
                    if how is not None:
                        state.server_gone(None, None, f"{method}: {_describe(exc)}", how, generation)
                    raise
        raise AssertionError("unreachable")

    def _forward(self, method: str, result_type: type[types.Result]) -> Any:
        """A handler that passes ``method`` through to the server unchanged (counted, not spanned)."""
        async def handler(ctx: ServerRequestContext[Any, Any], params: types.RequestParams) -> types.Result:
            state = self._state(ctx)
            with state.lock:
                state.passthrough += 1
            raw = params.model_dump(mode="json", by_alias=True, exclude_none=True)
            return await self._idempotent(state, method, lambda client: client.session.send_request(
                _RawRequest(method=method, params=raw or None), result_type))
        return handler

    def _emit(self, rec: ToolCallRecord) -> None:
        if self.tracer_provider is None:
            return
        try:
            parent = self.recorder.tool_call(rec.tool) if self.recorder is not None else None
            emit(self.tracer_provider, rec, self.limits.span_payload_bytes, parent)
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


async def _read_body(receive: Receive, headers: Mapping[str, str], limit: int) -> tuple[bytes | None, int, str]:
    """The request body, read up to ``limit`` bytes; (None, status, why) past it, with nothing more read."""
    too_big = f"the request body is larger than the proxy's limit of {limit} bytes (PLUMBLINE_PROXY_MAX_REQUEST_MIB)"
    declared = headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        return None, 413, too_big
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None, 400, "the client left before its request body ended"
        body += message.get("body", b"")
        if len(body) > limit:
            return None, 413, too_big
        if not message.get("more_body", False):
            return bytes(body), 0, ""


def _replayed(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the body already read, then whatever the connection says next (a disconnect)."""
    sent = False

    async def again() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return again


async def _reply(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = orjson.dumps(body)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
