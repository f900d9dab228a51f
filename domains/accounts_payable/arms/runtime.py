"""What every arm runs on: a traced tool runner, a traced model caller, the trial's records.

Ownership: one :class:`ToolRunner` and one :class:`ModelCaller` per trial, created by
``run_trial`` and never shared, so per-trial state (the step list, the fault injector, token
counts) cannot leak between trials. Both write their spans under the current span, which is the
trial's ``invoke_agent`` root.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Tracer

from domains.accounts_payable import tracing
from plumbline_otel.replay.identity import TRANSIENT_FAULT_KINDS as TRANSIENT_KINDS
from plumbline_otel.replay.identity import FaultPlan, TrialIdentity
from plumbline_otel.replay.runner import RetryPolicy
from plumbline_otel.replay.scope import InjectedFault, inject_fault
from plumbline_otel.runs import FAULT_INJECTED


@dataclass
class ToolStep:
    """One tool call as the agent made it (a retried call is several steps)."""

    index: int  # 1-based position among the trial's tool calls
    name: str
    call_id: str
    args: dict[str, Any]
    result: dict[str, Any] | None = None
    error: str | None = None
    error_type: str | None = None
    injected: bool = False  # the failure came from the trial's fault, not from the domain

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "call_id": self.call_id,
            "args": self.args,
            "result": self.result,
            "error": self.error,
            "error_type": self.error_type,
            "injected": self.injected,
        }


def error_type_of(exc: BaseException) -> str:
    """``error.type`` for a failed tool call: the transient kind, else the exception class."""
    kind = getattr(exc, "kind", None)
    if isinstance(kind, str) and kind in TRANSIENT_KINDS:
        return kind
    return type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    """Only the domain's TransientToolError kinds are transient; everything else is final."""
    from domains.accounts_payable.tools import TransientToolError

    return isinstance(exc, TransientToolError) and getattr(exc, "kind", None) in TRANSIENT_KINDS


def _injected(tool: str) -> None:
    """The trial's fault for this call, if due, as the domain's own transient error (same text),
    so the arms meet it exactly as they would meet a real outage."""
    from domains.accounts_payable.tools import TransientToolError

    try:
        inject_fault(tool)
    except InjectedFault as fault:
        raise TransientToolError(fault.kind, str(fault)) from fault


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


class ToolRunner:
    """Calls the domain's tools for one trial, one span per call.

    Before each call it asks the current trial's injector (``plumbline_otel.replay.inject_fault``,
    the driver's one fault mechanism) whether this call is the one to fail.
    """

    def __init__(
        self,
        sor: Any,
        tracer: Tracer,
        agent_name: str,
        call_id_prefix: str = "call",
    ) -> None:
        from domains.accounts_payable import tools

        self._tools = tools
        self._sor = sor
        self._tracer = tracer
        self._agent = agent_name
        self._prefix = call_id_prefix
        self.steps: list[ToolStep] = []

    def call(self, name: str, args: Mapping[str, Any], call_id: str | None = None) -> dict[str, Any]:
        """Run one tool; return its result or raise the domain error (span marked either way)."""
        index = len(self.steps) + 1
        call_id = call_id or f"{self._prefix}_{index:03d}"
        step = ToolStep(index, name, call_id, dict(args))
        self.steps.append(step)
        spec = self._tools.TOOLS.get(name)
        description = getattr(spec, "description", None)
        with tracing.tool_span(
            self._tracer, name, call_id, step.args, description, self._agent
        ) as span:
            try:
                _injected(name)
                result = _jsonable(self._tools.call_tool(self._sor, name, dict(args)))
            except Exception as exc:
                step.error = str(exc)
                step.error_type = error_type_of(exc)
                step.injected = isinstance(exc.__cause__, InjectedFault)
                if step.injected:
                    span.set_attribute(FAULT_INJECTED, True)
                tracing.mark_error(span, exc, step.error_type)
                raise
            step.result = result
            span.set_attribute("gen_ai.tool.call.result", tracing.dumps(result))
            return result

@dataclass
class Usage:
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


class ModelCaller:
    """Messages API calls for one trial, each in a ``chat {model}`` span.

    The trial id travels to the server in an ``x-plumbline-trial-id`` header: the offline
    simulated model seeds its imperfections with it; the real API ignores it.
    """

    def __init__(
        self,
        client: Any,
        model: str,
        tracer: Tracer,
        *,
        capture_content: bool = True,
        trial_id: str | None = None,
        max_tokens: int = 1024,
        temperature: float | None = None,
    ) -> None:
        self._client = client
        self.model = model
        self._tracer = tracer
        self._capture = capture_content
        self._headers = {"x-plumbline-trial-id": trial_id} if trial_id else {}
        self._max_tokens = max_tokens
        self._temperature = temperature
        self.usage = Usage()
        self.response_models: list[str] = []  # distinct, in order of first appearance
        base = getattr(client, "base_url", None)
        self._server_host = getattr(base, "host", None)
        self._server_port = getattr(base, "port", None)

    def create(
        self,
        *,
        system: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self._max_tokens,
            "system": system,
            "messages": list(messages),
        }
        if tools:
            kwargs["tools"] = list(tools)
        if tool_choice:
            kwargs["tool_choice"] = dict(tool_choice)
        if self._temperature is not None:  # anthropic 2.x dropped the keyword; the API still takes the field
            kwargs["extra_body"] = {"temperature": self._temperature}
        if self._headers:
            kwargs["extra_headers"] = self._headers
        with tracing.chat_span(
            self._tracer,
            self.model,
            system=system,
            messages=messages,
            tools=tools,
            max_tokens=self._max_tokens,
            capture_content=self._capture,
            server_address=self._server_host,
            server_port=self._server_port,
        ) as span:
            if self._temperature is not None:
                span.set_attribute("gen_ai.request.temperature", self._temperature)
            response = self._client.messages.create(**kwargs)
            tracing.record_response(span, response, self._capture)
        self.usage.calls += 1
        if response.model not in self.response_models:
            self.response_models.append(response.model)
        self.usage.input_tokens += int(response.usage.input_tokens or 0)
        self.usage.output_tokens += int(response.usage.output_tokens or 0)
        return response


# The agent's own retry of transient tool errors (the arm's behaviour under test), in the
# driver's RetryPolicy shape.
NO_RETRY = RetryPolicy(max_attempts=1)


def call_with_retry(
    runner: ToolRunner, policy: RetryPolicy, name: str, args: Mapping[str, Any]
) -> dict[str, Any]:
    """Call a tool; on a transient error sleep and try again, up to ``policy.max_attempts``."""
    attempt = 1
    while True:
        try:
            return runner.call(name, args)
        except Exception as exc:
            if attempt >= policy.max_attempts or not is_transient(exc):
                raise
            time.sleep(policy.delay(attempt))
            attempt += 1


@dataclass
class ArmOutcome:
    """What an arm returns: its final answer, and why it failed to act, if it did."""

    final_answer: str
    agent_error: str | None = None  # "interpretation failed", "turn limit", ...


@dataclass
class TrialResult:
    """One task run by one arm: the trace, the steps, the grade and the fault's fate."""

    arm: str
    task_id: str
    model: str
    request_text: str
    trial: TrialIdentity | None
    trace_id: str
    final_answer: str
    steps: list[ToolStep]
    grade: Any
    passed: bool
    fault: FaultPlan | None = None
    fault_fired: bool = False
    fault_step: int | None = None
    agent_error: str | None = None
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    duration_s: float = 0.0
    response_models: list[str] = field(default_factory=list)

    def tool_path(self) -> list[str]:
        return [s.name for s in self.steps]

    def as_dict(self) -> dict[str, Any]:
        grade = self.grade
        if hasattr(grade, "export"):
            grade = grade.export()
        elif hasattr(grade, "as_dict"):
            grade = grade.as_dict()
        elif hasattr(grade, "__dataclass_fields__"):
            from dataclasses import asdict

            grade = asdict(grade)
        return {
            "arm": self.arm,
            "task_id": self.task_id,
            "model": self.model,
            "trial": self.trial.attributes() if self.trial else None,
            "trace_id": self.trace_id,
            "final_answer": self.final_answer,
            "steps": [s.as_dict() for s in self.steps],
            "grade": _jsonable(grade),
            "passed": self.passed,
            "fault": str(self.fault) if self.fault else None,
            "fault_fired": self.fault_fired,
            "fault_step": self.fault_step,
            "agent_error": self.agent_error,
            "model_calls": self.model_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "duration_s": round(self.duration_s, 4),
            "response_models": self.response_models,
        }
