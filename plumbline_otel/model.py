"""The normalised model every stage shares: span records, steps and trajectories.

A `SpanRecord` is what one received span means, whatever convention wrote it; the store keeps one
row per (trace_id, span_id). A `Trajectory` is assembled from the span records of one trace: its
steps in order, the run's input and final output, and the task it was an attempt at. Everything
here is plain data: no I/O, no protobuf, so the analyses can be tested on hand-built values.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

# `event`: a guardrail result or an execution-state change the run reported (`RunEvent`), in order among its steps.
StepKind = Literal["tool_call", "llm_call", "agent", "other", "event"]
# `vercel_ai`: the Vercel AI SDK's own spans (AI SDK 6 and earlier, and 7's LegacyOpenTelemetry).
Convention = Literal["genai", "genai_legacy", "openinference", "traceloop", "vercel_ai", "unknown"]
# Where a tool step came from: its own span, an LLM span's output messages, or both merged.
StepSource = Literal["tool_span", "llm_output", "tool_span+llm_output", "span"]
ArgsState = Literal["structured", "unparsed", "redacted", "absent"]

REDACTED = "__REDACTED__"
# plumbline's own attributes (`runs.py` names them: task key, study, trial, …): a run's context keeps every one of
# them, whatever the task keys, and assembly and the span rows read them from any span.
CONTEXT_PREFIX = "plumbline."


class Frozen:
    """Base of the frozen data classes: pickled by their fields, for the worker processes.

    Compiled by mypyc (`_native.py`), a frozen data class cannot be unpickled attribute by
    attribute; rebuilding it from its fields works compiled and interpreted alike.
    """

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return type(self), tuple(getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]


@dataclass(frozen=True)
class ToolCallRef(Frozen):
    """A tool call proposed by a model inside an LLM span's output messages."""

    name: str
    args: Any  # dict when the arguments were JSON, the raw string otherwise, None when absent
    call_id: str | None
    index: int  # order within the LLM output

    # Written out, as `SpanRecord`'s is, so that mypyc compiles it (one per call a model proposes).
    def __init__(self, name: str, args: Any, call_id: str | None, index: int) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "call_id", call_id)
        object.__setattr__(self, "index", index)


@dataclass(frozen=True)
class ToolResultRef(Frozen):
    """A tool result seen in an LLM span's input messages, paired by call id."""

    call_id: str
    result: Any
    error: bool = False


@dataclass(frozen=True)
class ToolDecision(Frozen):
    """A `gen_ai.tool.call.decision` event: whether a proposed tool call was allowed to run."""

    outcome: str  # allow, deny, require_approval
    call_id: str | None
    tool_name: str | None


@dataclass(frozen=True)
class RunEvent(Frozen):
    """A `gen_ai.guardrail.result` or `gen_ai.execution.state.changed` event (a span event, a log record, or a
    guardrail span's own result), kept with its attributes as the producer wrote them: the convention forbids
    reading an allow or deny verdict into a guardrail's provider-native result, so a spec names the values it means."""

    name: str
    attributes: dict[str, Any]
    time_ns: int


# `gen_ai.attribution.link_type` (semantic-conventions-genai, Development): how a linked span accounts for this one.
# `CAUSED_BY_GENERATION`: the generation that requested this tool call; `RETRY_OF`: this span is another attempt of
# the linked one; `INFORMED_BY`: context only. A link without it is the plain OTel kind: this span continues work the
# linked span started (a message sent between agents, AutoGen's runtime between a Swarm's agents). Any other value
# is kept as written and read as neither.
@dataclass(frozen=True)
class SpanLink(Frozen):
    """One of a span's OTLP links: the span it points to (possibly in another trace) and what the link means."""

    trace_id: str
    span_id: str
    link_type: str | None = None


@dataclass(slots=True)  # a shard holds thousands per trace: no per-record attribute dict
class SpanRecord:
    """One received span, normalised. Field names are the store's column names."""

    trace_id: str  # 32 lower-case hex
    span_id: str  # 16 lower-case hex
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    kind: int = 0
    status_code: int = 0
    status_message: str = ""
    service_name: str | None = None
    service_version: str | None = None
    scope_name: str = ""
    convention: Convention = "unknown"
    step_kind: StepKind = "other"
    tool_name: str | None = None
    call_id: str | None = None
    args: Any = None
    args_state: ArgsState = "absent"
    result: Any = None
    error: str | None = None
    model: str | None = None
    provider: str | None = None
    response_id: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    finish_reasons: list[str] = field(default_factory=list)
    agent_name: str | None = None
    handoff_to: str | None = None  # a hand-off span: the agent control passed to
    input_text: str | None = None
    output_text: str | None = None
    content_captured: bool = False
    proposed_calls: list[ToolCallRef] = field(default_factory=list)
    tool_results: list[ToolResultRef] = field(default_factory=list)
    unknown_keys: list[str] = field(default_factory=list)
    # Framework wrappers and dumps met on this span, as "<field>:<shape>" (e.g. "args:smolagents_call").
    shapes: list[str] = field(default_factory=list)
    # Which key a field was read from, as "<field>:<key>" ("args:gen_ai.tool.call.arguments", "content:log:<event>").
    evidence: list[str] = field(default_factory=list)
    # Tool call decisions folded in from log records (not stored with the span: read with it from the logs table).
    decisions: list[ToolDecision] = field(default_factory=list)
    dropped_attributes_count: int = 0
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    # `gen_ai.usage.cost.amount`/`.currency`/`.source` as the producer reported them (`provider`: the response
    # carried it; `local`: the emitter priced it): a witness of cost, never the replay meter's own metering.
    cost_amount: float | None = None
    cost_currency: str | None = None
    cost_source: str | None = None
    run_events: list[RunEvent] = field(default_factory=list)
    links: list[SpanLink] = field(default_factory=list)

    # Written out, not generated: mypyc compiles this one to C, while the `dataclasses` module's
    # generated `__init__` stays interpreted (mypyc issue #817) and made building a record a tenth of
    # normalising a span. `tests/core/test_native.py` holds it to the fields above.
    def __init__(
        self, trace_id: str, span_id: str, parent_span_id: str | None, name: str, start_ns: int, end_ns: int, kind: int = 0, status_code: int = 0,
        status_message: str = "", service_name: str | None = None, service_version: str | None = None, scope_name: str = "",
        convention: Convention = "unknown", step_kind: StepKind = "other", tool_name: str | None = None, call_id: str | None = None,
        args: Any = None, args_state: ArgsState = "absent", result: Any = None, error: str | None = None, model: str | None = None,
        provider: str | None = None, response_id: str | None = None, input_tokens: int | None = None, output_tokens: int | None = None,
        cache_read_tokens: int | None = None, cache_write_tokens: int | None = None, finish_reasons: list[str] | None = None,
        agent_name: str | None = None, handoff_to: str | None = None, input_text: str | None = None, output_text: str | None = None,
        content_captured: bool = False, proposed_calls: list[ToolCallRef] | None = None, tool_results: list[ToolResultRef] | None = None,
        unknown_keys: list[str] | None = None, shapes: list[str] | None = None, evidence: list[str] | None = None,
        decisions: list[ToolDecision] | None = None, dropped_attributes_count: int = 0, attributes: dict[str, Any] | None = None,
        resource: dict[str, Any] | None = None, cost_amount: float | None = None, cost_currency: str | None = None,
        cost_source: str | None = None, run_events: list[RunEvent] | None = None, links: list[SpanLink] | None = None,
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_span_id = parent_span_id
        self.name = name
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.kind = kind
        self.status_code = status_code
        self.status_message = status_message
        self.service_name = service_name
        self.service_version = service_version
        self.scope_name = scope_name
        self.convention = convention
        self.step_kind = step_kind
        self.tool_name = tool_name
        self.call_id = call_id
        self.args = args
        self.args_state = args_state
        self.result = result
        self.error = error
        self.model = model
        self.provider = provider
        self.response_id = response_id
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.cache_read_tokens = cache_read_tokens
        self.cache_write_tokens = cache_write_tokens
        self.finish_reasons = [] if finish_reasons is None else finish_reasons
        self.agent_name = agent_name
        self.handoff_to = handoff_to
        self.input_text = input_text
        self.output_text = output_text
        self.content_captured = content_captured
        self.proposed_calls = [] if proposed_calls is None else proposed_calls
        self.tool_results = [] if tool_results is None else tool_results
        self.unknown_keys = [] if unknown_keys is None else unknown_keys
        self.shapes = [] if shapes is None else shapes
        self.evidence = [] if evidence is None else evidence
        self.decisions = [] if decisions is None else decisions
        self.dropped_attributes_count = dropped_attributes_count
        self.attributes = {} if attributes is None else attributes
        self.resource = {} if resource is None else resource
        self.cost_amount = cost_amount
        self.cost_currency = cost_currency
        self.cost_source = cost_source
        self.run_events = [] if run_events is None else run_events
        self.links = [] if links is None else links


@dataclass(frozen=True)
class Step(Frozen):
    """What one span (or one model-proposed call) means for the agent run."""

    kind: StepKind
    name: str
    args: Any = None
    result: Any = None
    error: str | None = None
    call_id: str | None = None
    source: StepSource = "span"
    span_id: str | None = None
    start_ns: int = 0
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    finish_reasons: tuple[str, ...] = ()
    # Where the step's evidence came from (a tool step's arguments, an LLM step's content): "tool_span",
    # "message_part", "span_event", "log_record" or "vendor_key:<key>"; None when there was none.
    evidence: str | None = None
    # Why a value is missing ("args:content_capture_off", "result:attribute_absent", "args:unknown_key:<key>").
    gaps: tuple[str, ...] = ()
    # An LLM step's cost as its producer reported it (`gen_ai.usage.cost.*`; source `provider` or `local`).
    cost_amount: float | None = None
    cost_currency: str | None = None
    cost_source: str | None = None

    # Written out, as `SpanRecord`'s is, so that mypyc compiles it (a step is built for nearly every span);
    # frozen, so its fields are set past the data class's `__setattr__`.
    def __init__(
        self, kind: StepKind, name: str, args: Any = None, result: Any = None, error: str | None = None, call_id: str | None = None,
        source: StepSource = "span", span_id: str | None = None, start_ns: int = 0, model: str | None = None, input_tokens: int | None = None,
        output_tokens: int | None = None, cache_read_tokens: int | None = None, cache_write_tokens: int | None = None,
        finish_reasons: tuple[str, ...] = (), evidence: str | None = None, gaps: tuple[str, ...] = (),
        cost_amount: float | None = None, cost_currency: str | None = None, cost_source: str | None = None,
    ) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "result", result)
        object.__setattr__(self, "error", error)
        object.__setattr__(self, "call_id", call_id)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "span_id", span_id)
        object.__setattr__(self, "start_ns", start_ns)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "input_tokens", input_tokens)
        object.__setattr__(self, "output_tokens", output_tokens)
        object.__setattr__(self, "cache_read_tokens", cache_read_tokens)
        object.__setattr__(self, "cache_write_tokens", cache_write_tokens)
        object.__setattr__(self, "finish_reasons", finish_reasons)
        object.__setattr__(self, "evidence", evidence)
        object.__setattr__(self, "gaps", gaps)
        object.__setattr__(self, "cost_amount", cost_amount)
        object.__setattr__(self, "cost_currency", cost_currency)
        object.__setattr__(self, "cost_source", cost_source)

    @property
    def failed(self) -> bool:
        """A failed call did not happen: invariants treat it as absent."""
        return self.error is not None

    def export(self) -> dict[str, Any]:
        """The stable export shape of docs/architecture.md, "The model"."""
        return {
            "kind": self.kind,
            "name": self.name,
            "args": self.args,
            "result": self.result,
            "error": self.error,
            "call_id": self.call_id,
            "source": self.source,
        }


@dataclass(frozen=True)
class Trajectory(Frozen):
    """The steps of one agent run in order, with its input, output and task."""

    trajectory_id: str
    trace_id: str
    task_key: str | None
    task_key_source: str  # "attribute:<name>", "input_hash" or "none"
    service: str | None
    service_version: str | None
    agent_name: str | None
    input: str | None
    final_output: str | None
    conventions: tuple[str, ...]
    steps: tuple[Step, ...]
    start_ns: int = 0
    end_ns: int = 0
    # Attributes of the run (resource and root span), e.g. plumbline.trial.id, plumbline.perturbation.
    context: dict[str, Any] = field(default_factory=dict)

    # Written out, as `SpanRecord`'s is, so that mypyc compiles it (one per run).
    def __init__(
        self, trajectory_id: str, trace_id: str, task_key: str | None, task_key_source: str, service: str | None, service_version: str | None,
        agent_name: str | None, input: str | None, final_output: str | None, conventions: tuple[str, ...], steps: tuple[Step, ...],
        start_ns: int = 0, end_ns: int = 0, context: dict[str, Any] | None = None,
    ) -> None:
        object.__setattr__(self, "trajectory_id", trajectory_id)
        object.__setattr__(self, "trace_id", trace_id)
        object.__setattr__(self, "task_key", task_key)
        object.__setattr__(self, "task_key_source", task_key_source)
        object.__setattr__(self, "service", service)
        object.__setattr__(self, "service_version", service_version)
        object.__setattr__(self, "agent_name", agent_name)
        object.__setattr__(self, "input", input)
        object.__setattr__(self, "final_output", final_output)
        object.__setattr__(self, "conventions", conventions)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "start_ns", start_ns)
        object.__setattr__(self, "end_ns", end_ns)
        object.__setattr__(self, "context", {} if context is None else context)

    @property
    def tool_steps(self) -> tuple[Step, ...]:
        """The tool calls, in order; what most invariants look at."""
        return tuple(s for s in self.steps if s.kind == "tool_call")

    def export(self) -> dict[str, Any]:
        """One JSON line of `plumbline trajectories`."""
        return {
            "trajectory_id": self.trajectory_id,
            "trace_id": self.trace_id,
            "task_key": self.task_key,
            "task_key_source": self.task_key_source,
            "service": self.service,
            "service_version": self.service_version,
            "agent_name": self.agent_name,
            "input": self.input,
            "final_output": self.final_output,
            "conventions": list(self.conventions),
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "context": self.context,
            "steps": [s.export() for s in self.steps],
        }
