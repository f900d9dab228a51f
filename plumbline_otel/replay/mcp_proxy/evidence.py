"""What the MCP proxy witnessed in one attempt of one trial, kept per route and frozen at close.

``McpTrialState`` is the live account the request handlers update (under its lock: the handlers
run on the proxy's event loop while the driver opens and closes routes from its own threads);
``McpEvidence`` is its frozen summary, which the driver writes into the trial's record so that
exposure to a ``tool_fault`` never depends on the agent's own report.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import mcp.types as types
import orjson

from plumbline_otel.replay.identity import FaultPlan
from plumbline_otel.replay.jsonvalue import JsonObject, to_int
from plumbline_otel.replay.tape import Branch, ToolStep, first_difference

if TYPE_CHECKING:
    from plumbline_otel.replay.adapters import Trial
    from plumbline_otel.replay.budget import TrialBudget


@dataclass(frozen=True)
class McpEvidence:
    """One attempt as the MCP proxy saw it.

    ``faults`` is the witness a ``tool_fault`` cell is decided on: each ``{tool, call, error}`` is a
    ``tools/call`` the proxy answered with the plan's error without calling the server. ``unroutable``
    counts requests the proxy refused (no open route) while this route was open: they belong to no
    trial, so a non-zero count says only that some agent missed its route in that window.

    Whose fault a failure was, so the driver never blames the agent for it: ``server_died`` lists
    each request during which the tool server went away, ``{call, tool, detail, kind, relaunched}``
    (``call`` and ``tool`` None for a listing or a read): ``kind`` is ``died`` (a stdio server's
    process exited), ``unreachable`` (an HTTP server did not answer at the transport level) or
    ``timeout`` (no answer within the proxy's timeout), and ``relaunched`` whether the proxy had a
    new server up by the time the route closed. ``relaunches`` counts the proxy's relaunches of
    the server while this route was open. ``proxy_errors`` lists the proxy's own failures and limit
    refusals, ``{call, tool, detail, kind}`` (``internal``, ``request_too_large``, ``bad_request``).
    """

    witness: ClassVar[str] = "mcp_proxy"  # who saw it, in the driver's record and the certificate's evidence_from

    trial_id: str
    attempt: int
    calls: int  # tools/call requests through this route, faulted and decoy calls included
    calls_by_tool: dict[str, int]
    upstream_calls: int  # of those, how many reached the MCP server
    upstream_errors: int  # of those, how many the server (or the way to it) answered with a protocol error
    lists: int  # tools/list requests
    faults: tuple[JsonObject, ...]  # {tool, call, error}
    decoys_offered: tuple[str, ...]
    decoys_called: tuple[JsonObject, ...]  # {tool, call}, in call order
    passthrough: int  # other methods forwarded (resources, prompts)
    unroutable: int
    server_died: tuple[JsonObject, ...] = ()  # {call, tool, detail, kind, relaunched}
    proxy_errors: tuple[JsonObject, ...] = ()  # {call, tool, detail, kind}
    relaunches: int = 0
    # Branch-point replay (issue 44): tool calls answered from the run's tape, and where the agent's call in the prefix
    # differed from the recorded one ({step, call, detail}; the driver makes the trial missing).
    tape_served: int = 0
    diverged: tuple[JsonObject, ...] = ()

    @property
    def fault_fired(self) -> bool:
        return bool(self.faults)

    @property
    def decoy_called(self) -> bool:
        return bool(self.decoys_called)

    def as_dict(self) -> JsonObject:
        return {
            "trial_id": self.trial_id, "attempt": self.attempt, "calls": self.calls,
            "calls_by_tool": dict(self.calls_by_tool), "upstream_calls": self.upstream_calls,
            "upstream_errors": self.upstream_errors, "lists": self.lists, "faults": [dict(f) for f in self.faults],
            "decoys_offered": list(self.decoys_offered), "decoys_called": [dict(d) for d in self.decoys_called],
            "passthrough": self.passthrough, "unroutable": self.unroutable,
            "server_died": [dict(d) for d in self.server_died], "proxy_errors": [dict(e) for e in self.proxy_errors],
            "relaunches": self.relaunches,
            **({"tape_served": self.tape_served, "diverged": [dict(d) for d in self.diverged]}
               if self.tape_served or self.diverged else {}),
        }


@dataclass
class McpTrialState:
    """The live account of one route (one attempt of one trial)."""

    trial: Trial
    budget: TrialBudget | None
    token: str
    fault: FaultPlan | None = None
    decoys: dict[str, JsonObject] = field(default_factory=dict)  # name -> spec, in the order offered
    calls: int = 0
    calls_by_tool: dict[str, int] = field(default_factory=dict)
    upstream_calls: int = 0
    upstream_errors: int = 0
    lists: int = 0
    faults: list[JsonObject] = field(default_factory=list)
    decoys_offered: list[str] = field(default_factory=list)
    decoys_called: list[JsonObject] = field(default_factory=list)
    passthrough: int = 0
    unroutable_at_open: int = 0
    relaunches_at_open: int = 0
    server_died: list[JsonObject] = field(default_factory=list)
    proxy_errors: list[JsonObject] = field(default_factory=list)
    closed: bool = False
    branch: Branch | None = None  # a branch-point replay: the prefix's tool calls are served from its tape (issue 44)
    tape_served: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def next_call(self, tool: str) -> int:
        """Count a tools/call of ``tool``; its 1-based index among this attempt's calls of that tool."""
        with self.lock:
            self.calls += 1
            n = self.calls_by_tool.get(tool, 0) + 1
            self.calls_by_tool[tool] = n
            return n

    def fault_fires(self, tool: str, call: int) -> bool:
        """Whether call number ``call`` of ``tool`` is one the plan fails (``scope.FaultInjector``'s rule)."""
        plan = self.fault
        return plan is not None and plan.tool == tool and plan.on_call <= call < plan.on_call + plan.times

    def add_fault(self, tool: str, call: int, error: str) -> None:
        with self.lock:
            self.faults.append({"tool": tool, "call": call, "error": error})

    def offered(self, names: list[str]) -> None:
        with self.lock:
            self.lists += 1
            for name in names:
                if name not in self.decoys_offered:
                    self.decoys_offered.append(name)

    def add_decoy_call(self, tool: str, call: int) -> None:
        with self.lock:
            self.decoys_called.append({"tool": tool, "call": call})

    def upstream(self, error: bool) -> None:
        with self.lock:
            self.upstream_calls += 1
            self.upstream_errors += int(error)

    def server_gone(self, call: int | None, tool: str | None, detail: str, kind: str, generation: int) -> None:
        """Note a request during which the tool server went away (``generation``: the connection it was sent on)."""
        with self.lock:
            self.server_died.append({"call": call, "tool": tool, "detail": detail, "kind": kind, "_generation": generation})

    def proxy_failed(self, call: int | None, tool: str | None, detail: str, kind: str) -> None:
        """Note the proxy's own failure or limit refusal on a request of this attempt."""
        with self.lock:
            self.proxy_errors.append({"call": call, "tool": tool, "detail": detail, "kind": kind})

    def from_tape(self, step: ToolStep, tool: str, arguments: Mapping[str, object] | None) -> types.CallToolResult:
        """The recorded result of a prefix call, or (the agent called another tool, or with other arguments) an error
        result and the divergence noted: the trial is then missing, never scored."""
        difference = None
        if step.name != tool:
            difference = f"tool call {step.ordinal}: recorded {step.name!r}, the agent called {tool!r}"
        else:
            recorded = _as_arguments(step.arguments)
            if recorded is not None and recorded != (arguments or {}):
                difference = first_difference(recorded, arguments or {}, f"{tool} arguments")
        with self.lock:
            if difference is not None:
                assert self.branch is not None
                self.branch.diverged.append({"step": step.index, "call": self.calls, "detail": difference})
                return types.CallToolResult(content=[types.TextContent(type="text", text=f"plumbline: diverged at step {step.index}: {difference}")],
                                            is_error=True)
            self.tape_served += 1
        return tool_result(step)

    def evidence(self, unroutable_now: int, generation_now: int = 0, relaunches: Sequence[object] | None = None) -> McpEvidence:
        """The frozen summary; ``generation_now`` (the upstream connection's number now) tells whether a dead
        server was relaunched, ``relaunches`` (the proxy's list so far) how many relaunches fell in this route's life."""
        with self.lock:
            identity = self.trial.identity
            return McpEvidence(
                trial_id=identity.trial_id, attempt=identity.attempt, calls=self.calls,
                calls_by_tool=dict(self.calls_by_tool), upstream_calls=self.upstream_calls,
                upstream_errors=self.upstream_errors, lists=self.lists, faults=tuple(dict(f) for f in self.faults),
                decoys_offered=tuple(self.decoys_offered), decoys_called=tuple(dict(d) for d in self.decoys_called),
                passthrough=self.passthrough, unroutable=unroutable_now - self.unroutable_at_open,
                server_died=tuple({**{k: v for k, v in d.items() if k != "_generation"}, "relaunched": generation_now > to_int(d["_generation"])}
                                  for d in self.server_died),
                proxy_errors=tuple(dict(e) for e in self.proxy_errors),
                relaunches=max(0, len(relaunches or []) - self.relaunches_at_open),
                tape_served=self.tape_served, diverged=tuple(dict(d) for d in self.branch.diverged) if self.branch else ())


def _as_arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return None  # unreadable recorded arguments: the tool's name is all that is compared
    return value


def tool_result(step: ToolStep) -> types.CallToolResult:
    """A recorded tool result as MCP answers it: the MCP proxy's own record as it was, else the run's text."""
    value = step.result
    if isinstance(value, str):
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("content"), list):
            value = parsed
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        return types.CallToolResult.model_validate(value)
    if step.error is not None and value is None:
        return types.CallToolResult(content=[types.TextContent(type="text", text=step.error)], is_error=True)
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=step.error is not None)
