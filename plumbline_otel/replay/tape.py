"""A run as a tape: its model responses and tool results in order, for branch-point replay (issue 44).

A *tape* is what a stored run answered, step by step: step 1 is its first model response, then
the results of the tools that response proposed, then the next model response, and so on. A
branch-point replay at step ``k`` serves steps ``1 … k-1`` from the tape (the model-API proxy
answers model steps, the MCP proxy tool steps; no provider and no tool server is called), applies
the trial's perturbation at step ``k`` and lets the agent run live after it.

Two sources:

* a replay study's **cassette** (``responses.jsonl``): its entries of one trial, in the order they
  were appended, are the model steps (the exact recorded answer bytes); the request each entry
  carries (``request``, recorded by the proxy since issue 44) is what the agent sent, which is
  both what the prefix is checked against and where the tool results are read from (the next
  request's tool messages); tool results the MCP proxy recorded in the trial's run take precedence;
* a stored **production run** (``model.Trajectory``) whose LLM steps carry their output and whose
  tool steps carry their results: model steps are rendered in the API the agent speaks when it
  asks (``render_reply``), tool steps serve the recorded result.

What cannot be taped is said, never guessed: ``Tape.gaps`` lists each step whose content was not
recorded, and ``Tape.check_branch`` raises ``TapeError`` naming the first gap before ``k``.

Divergence is measured, never scored: ``request_difference`` compares the agent's request in the
prefix with the recorded one, ids and timestamps masked, and names the first difference.
All functions here are pure.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

import orjson

from plumbline_otel.model import Trajectory
from plumbline_otel.replay.jsonvalue import JsonObject, JsonValue, to_int
from plumbline_otel.replay.ledger import read_jsonl
from plumbline_otel.replay.pricing import parse_sse
from plumbline_otel.replay.proxy.wire import API_PATHS, Api, Reply, input_messages, reply_from_body, reply_from_events, tool_name

if TYPE_CHECKING:
    from plumbline_otel.replay.perturb import PerturbOptions, Variant

#: Branch-point perturbation labels carry the step: ``tool_fault@3``.
BRANCH_SEP = "@"
#: Perturbations that act on a tool step (the others act on a model step).
TOOL_STEP_PERTURBATIONS = frozenset({"tool_fault", "tool_result_fault"})
#: Perturbations that act on a user turn: at step k > 1 the user message of the turn step k opens is rewritten on
#: the wire (``Branch.rewrite_turn``); at step 1 the driver hands the agent the rewritten request, as without a branch.
TURN_PERTURBATIONS = frozenset({"paraphrase"})


class TapeError(ValueError):
    """A run that cannot be taped (or branched at the step asked), with what is missing."""


@dataclass(frozen=True)
class TapeCall:
    """A tool call a recorded model response proposed."""

    call_id: str
    name: str
    arguments: JsonValue = None


@dataclass(frozen=True)
class ModelStep:
    """One recorded model response. ``body`` (with ``content_type``) is the exact recorded answer when the
    source is a cassette; a production run's step has only ``text`` and ``calls``, rendered on demand."""

    index: int
    ordinal: int  # 1-based among the run's model steps: the attempt's model call number it answers
    text: str = ""
    calls: tuple[TapeCall, ...] = ()
    model: str | None = None
    api: Api | None = None
    status: int = 200
    content_type: str | None = None
    body: bytes | None = None
    incomplete: bool = False
    request: Mapping[str, JsonValue] | None = None  # the request the recorded agent sent for it, when recorded
    kind: Literal["model"] = "model"


@dataclass(frozen=True)
class ToolStep:
    """One recorded tool result. ``result`` is the MCP ``CallToolResult`` JSON when the MCP proxy recorded it,
    else the result as the run shows it (text or JSON)."""

    index: int
    ordinal: int  # 1-based among the run's tool steps: the attempt's tools/call number it answers
    name: str
    call_id: str | None = None
    arguments: JsonValue = None
    result: JsonValue = None
    error: str | None = None
    known: bool = True  # False: the run did not record the result
    kind: Literal["tool"] = "tool"

    def occurrence(self, steps: Sequence[ModelStep | ToolStep]) -> int:
        """Which call of its tool this is (1-based), as a ``FaultPlan.on_call`` counts it."""
        return sum(1 for s in steps if isinstance(s, ToolStep) and s.name == self.name and s.index <= self.index)


class Coverage(TypedDict):
    """What a tape holds and lacks (``Tape.coverage``)."""

    source: str
    steps: int
    model_steps: int
    tool_steps: int
    requests_recorded: int
    gaps: list[str]
    notes: list[str]


@dataclass(frozen=True)
class Tape:
    """A run's steps in order (1-based ``index``), where they came from, and what is missing."""

    source: str
    steps: tuple[ModelStep | ToolStep, ...]
    gaps: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def model_steps(self) -> tuple[ModelStep, ...]:
        return tuple(s for s in self.steps if isinstance(s, ModelStep))

    @property
    def tool_steps(self) -> tuple[ToolStep, ...]:
        return tuple(s for s in self.steps if isinstance(s, ToolStep))

    def step(self, index: int) -> ModelStep | ToolStep:
        if not 1 <= index <= len(self.steps):
            raise TapeError(f"{self.source}: no step {index} (the run has {len(self.steps)})")
        return self.steps[index - 1]

    def model_call(self, ordinal: int) -> ModelStep | None:
        """The recorded answer to the attempt's model call number ``ordinal``."""
        steps = self.model_steps
        return steps[ordinal - 1] if 1 <= ordinal <= len(steps) else None

    def tool_call(self, ordinal: int) -> ToolStep | None:
        """The recorded result of the attempt's tools/call number ``ordinal``."""
        steps = self.tool_steps
        return steps[ordinal - 1] if 1 <= ordinal <= len(steps) else None

    def branch_points(self, perturbation: str) -> list[int]:
        """The steps ``perturbation`` can branch at: tool steps for tool faults, the model steps that open a user
        turn for a paraphrase (``user_turns``), model steps for the rest."""
        if perturbation in TOOL_STEP_PERTURBATIONS:
            return [s.index for s in self.tool_steps]
        if perturbation in TURN_PERTURBATIONS:
            return sorted(self.user_turns())
        return [s.index for s in self.model_steps]

    def user_turns(self) -> dict[int, str]:
        """The model steps that open a user turn, with the turn's user text: step 1 always (its text, when recorded),
        and each later model step whose recorded request carries a user message the previous one did not (a
        conversation's next turn). A run with no recorded requests (a production run) has only its first turn."""
        turns: dict[int, str] = {}
        before = 0
        for n, step in enumerate(self.model_steps):
            texts = user_texts(step.api or "chat", step.request) if step.request is not None else []
            if n == 0:
                turns[step.index] = texts[-1] if texts else ""
            elif len(texts) > before and texts:
                turns[step.index] = texts[-1]
            before = len(texts) if step.request is not None else before
        return turns

    def check_branch(self, at: int, perturbation: str) -> ModelStep | ToolStep:
        """The step ``at`` is, if the run can be branched there under ``perturbation``; else ``TapeError`` saying why."""
        step = self.step(at)
        if perturbation in TOOL_STEP_PERTURBATIONS and not isinstance(step, ToolStep):
            raise TapeError(f"{self.source}: {perturbation} branches at a tool step; step {at} is a model response "
                            f"(tool steps: {', '.join(map(str, self.branch_points(perturbation))) or 'none'})")
        if perturbation not in TOOL_STEP_PERTURBATIONS and not isinstance(step, ModelStep):
            raise TapeError(f"{self.source}: {perturbation} branches at a model step; step {at} is a tool result "
                            f"(model steps: {', '.join(map(str, self.branch_points(perturbation))) or 'none'})")
        if perturbation in TURN_PERTURBATIONS and at not in self.user_turns():
            raise TapeError(f"{self.source}: {perturbation} branches at a user turn; step {at} continues an earlier turn "
                            f"(user turns: {', '.join(map(str, self.branch_points(perturbation)))}; a run that is no "
                            "conversation has only step 1)")
        for earlier in self.steps[:at - 1]:
            if isinstance(earlier, ToolStep) and not earlier.known:
                raise TapeError(f"{self.source}: step {earlier.index} ({earlier.name}) has no recorded result, so the prefix "
                                f"up to step {at} cannot be served")
            if isinstance(earlier, ModelStep) and earlier.body is None and not (earlier.text or earlier.calls):
                raise TapeError(f"{self.source}: step {earlier.index} (a model call) has no recorded output")
        return step

    def coverage(self) -> Coverage:
        """What the tape holds and lacks, for the user deciding whether a run can be branched."""
        return {"source": self.source, "steps": len(self.steps), "model_steps": len(self.model_steps),
                "tool_steps": len(self.tool_steps), "requests_recorded": sum(1 for s in self.model_steps if s.request is not None),
                "gaps": list(self.gaps), "notes": list(self.notes)}


# --- parsing a branch request --------------------------------------------------------------------


def parse_branch_at(text: str) -> Literal["each"] | tuple[int, ...]:
    """``--branch-at``: ``each``, one step, or a comma-separated list of steps (1-based)."""
    text = text.strip()
    if text == "each":
        return "each"
    try:
        steps = tuple(sorted({int(p) for p in text.split(",") if p.strip()}))
    except ValueError:
        raise TapeError(f"--branch-at {text!r}: give 'each', a step number or a comma-separated list of them") from None
    if not steps or steps[0] < 1:
        raise TapeError(f"--branch-at {text!r}: steps are numbered from 1")
    return steps


def branch_label(perturbation: str, at: int) -> str:
    return f"{perturbation}{BRANCH_SEP}{at}"


def base_perturbation(label: str) -> str:
    """``tool_fault@3`` → ``tool_fault``: what the exposure rules of a branch cell are those of."""
    return label.partition(BRANCH_SEP)[0]


def branch_step(label: str) -> int | None:
    """``tool_fault@3`` → 3; None for a label that is no branch point."""
    _, sep, step = label.partition(BRANCH_SEP)
    return int(step) if sep and step.isdigit() else None


def branch_metadata(tape: Tape, perturbation: str, at: int, metadata: Mapping[str, JsonValue]) -> JsonObject:
    """A variant's metadata for a branch at ``at``: its fault re-aimed at the tape's step (``on_call`` counted the
    way the injector, the MCP proxy and the model-API proxy count calls), and ``branch_at`` for the driver."""
    step = tape.check_branch(at, perturbation)
    out: JsonObject = {**dict(metadata), "branch_at": at}
    fault, result_fault, model_fault = out.get("fault"), out.get("tool_result_fault"), out.get("model_fault")
    if isinstance(step, ToolStep):
        if perturbation == "tool_fault" and isinstance(fault, Mapping):
            out["fault"] = {**fault, "tool": step.name, "on_call": step.occurrence(tape.steps), "times": 1}
        if perturbation == "tool_result_fault" and isinstance(result_fault, Mapping):
            out["tool_result_fault"] = {**result_fault, "tool": step.name, "on_call": step.occurrence(tape.steps)}
    elif isinstance(step, ModelStep) and perturbation == "model_fault" and isinstance(model_fault, Mapping):
        out["model_fault"] = {**model_fault, "on_call": step.ordinal, "times": 1}
    return out


def branch_points(tape: Tape, perturbation: str, wanted: str | Sequence[int]) -> list[int]:
    """The steps to branch at: every applicable step for ``each``, else the listed ones (each checked)."""
    if isinstance(wanted, str):
        wanted = parse_branch_at(wanted)
    if wanted == "each":
        return tape.branch_points(perturbation)
    for at in wanted:
        tape.check_branch(at, perturbation)
    return list(wanted)


# --- from a cassette -------------------------------------------------------------------------------


def cassette_entries(lines: Iterable[bytes], trial_suffix: str) -> list[JsonObject]:
    """The entries of one trial (its id without the study's name: ``task/perturbation/variant/kN``), in recorded order."""
    return [entry for entry in read_jsonl(lines) if str(entry.get("trial_id") or "").partition("/")[2] == trial_suffix]


def _entry_body(entry: Mapping[str, object]) -> bytes:
    import base64

    if entry.get("body_encoding") == "base64":
        encoded = entry["body"]
        if not isinstance(encoded, str):  # b64decode's own TypeError, said where
            raise TypeError(f"a cassette entry's base64 body is text, not {type(encoded).__name__}")
        return base64.b64decode(encoded)
    return str(entry.get("body") or "").encode("utf-8")


def reply_of(api: Api, content_type: str | None, body: bytes) -> Reply:
    """What a recorded answer said (text and proposed calls), plain or streamed."""
    if "event-stream" in (content_type or ""):
        return reply_from_events(api, parse_sse(body))
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Reply()
    return reply_from_body(api, parsed) if isinstance(parsed, dict) else Reply()


def _request_results(api: Api, request: Mapping[str, object]) -> dict[str, JsonValue]:
    """Tool results a request carries, by call id."""
    out: dict[str, JsonValue] = {}
    for message in input_messages(api, request):
        for part in _parts(message):
            if part.get("type") == "tool_call_response" and part.get("id") is not None:
                out[str(part["id"])] = _content_text(part.get("response"))
    return out


def _parts(message: Mapping[str, JsonValue]) -> list[JsonObject]:
    """The parts of a message ``input_messages`` built (a list of objects, always)."""
    parts = message.get("parts")
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


_TEXT_ITEMS = frozenset({"text", "input_text", "output_text"})


def _content_text(value: JsonValue) -> JsonValue:
    """A tool result as the tool returned it: a list of text content items (the Responses API's structured
    ``function_call_output``, as the OpenAI Agents SDK sends an MCP result), or its JSON, is its text."""
    items: JsonValue = value
    if isinstance(value, str) and value.startswith("[{"):
        try:
            items = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    if isinstance(items, list) and items:
        texts = [i for i in items if isinstance(i, Mapping) and i.get("type") in _TEXT_ITEMS]
        if len(texts) == len(items):
            return "".join(str(i.get("text") or "") for i in texts)
    return value


def _api(value: object) -> Api:
    """A cassette entry's API (absent: ``chat``); TapeError for one the proxy never records."""
    for api in API_PATHS.values():
        if value == api:
            return api
    if not value:
        return "chat"
    raise TapeError(f"a cassette entry's api {value!r} is none of {', '.join(API_PATHS.values())}")


def _request_of(entry: Mapping[str, object] | None) -> Mapping[str, JsonValue] | None:
    """The request a cassette entry recorded (a JSON object), or None."""
    request = entry.get("request") if entry is not None else None
    return request if isinstance(request, dict) else None


def tape_from_cassette(entries: Sequence[Mapping[str, JsonValue]], source: str, run: Trajectory | None = None) -> Tape:
    """A replay trial's tape from its cassette entries (``cassette_entries``), with the MCP proxy's recorded tool
    results from ``run`` (the trial's run in the store) when given."""
    if not entries:
        raise TapeError(f"{source}: the cassette holds no exchange of this trial")
    recorded_tools = {}
    if run is not None:
        for s in run.tool_steps:
            if s.call_id:
                recorded_tools[s.call_id] = s
    steps: list[ModelStep | ToolStep] = []
    gaps: list[str] = []
    notes: list[str] = []
    tool_ordinal = 0
    for n, entry in enumerate(entries, 1):
        api = _api(entry.get("api"))
        body = _entry_body(entry)
        content_type, model = entry.get("content_type"), entry.get("model")
        ctype = None if content_type is None else str(content_type)
        reply = reply_of(api, ctype, body)
        request = _request_of(entry)
        if entry.get("incomplete"):
            gaps.append(f"step {len(steps) + 1}: the recorded answer was cut short")
        calls = tuple(TapeCall(c.id, c.name, c.arguments) for c in reply.tool_calls)
        steps.append(ModelStep(len(steps) + 1, n, reply.text, calls, None if model is None else str(model), api,
                               to_int(entry.get("status") or 200), ctype, body, bool(entry.get("incomplete")), request))
        following = entries[n] if n < len(entries) else None
        following_request = _request_of(following)
        results = _request_results(api, following_request) if following_request is not None else {}
        for call in calls:
            tool_ordinal += 1
            if call.call_id in recorded_tools:
                s = recorded_tools[call.call_id]
                steps.append(ToolStep(len(steps) + 1, tool_ordinal, call.name, call.call_id, call.arguments, s.result, s.error))
            elif call.call_id in results:
                steps.append(ToolStep(len(steps) + 1, tool_ordinal, call.name, call.call_id, call.arguments, results[call.call_id]))
            else:
                known = following is None  # the run ended on this proposal: nothing after it to serve
                steps.append(ToolStep(len(steps) + 1, tool_ordinal, call.name, call.call_id, call.arguments, None, None, known=known))
                if not known:
                    gaps.append(f"step {len(steps)}: the result of {call.name} ({call.call_id}) was not recorded "
                                f"({'the next request was not recorded' if following_request is None else 'not in the next request'})")
    if not any(s.request is not None for s in steps if isinstance(s, ModelStep)):
        notes.append("no recorded requests (a cassette from before issue 44): the prefix is checked on its tool results only")
    return Tape(source, tuple(steps), tuple(gaps), tuple(notes))


# --- from a production run -------------------------------------------------------------------------


def tape_from_trajectory(run: Trajectory) -> Tape:
    """A production run's tape: each LLM step's output (and the tool calls it proposed), each tool step's result.

    Raises ``TapeError`` when the run has no model step; content that was not captured is listed in ``gaps``."""
    source = f"run {run.trajectory_id}"
    steps: list[ModelStep | ToolStep] = []
    gaps: list[str] = []
    model_ordinal = tool_ordinal = 0
    ordered = [s for s in run.steps if s.kind in ("llm_call", "tool_call")]
    i = 0
    while i < len(ordered):
        s = ordered[i]
        if s.kind == "llm_call":
            model_ordinal += 1
            j = i + 1
            proposed = []
            while j < len(ordered) and ordered[j].kind == "tool_call":
                proposed.append(ordered[j])
                j += 1
            text = _llm_text(s.result)
            calls = tuple(TapeCall(p.call_id or f"call_{model_ordinal}_{n}", p.name, p.args) for n, p in enumerate(proposed))
            if any(g.startswith("content") for g in s.gaps) or (s.result is None and not proposed):
                gaps.append(f"step {len(steps) + 1}: the model call's output was not captured ({', '.join(s.gaps) or 'no output'})")
            steps.append(ModelStep(len(steps) + 1, model_ordinal, text, calls, s.model))
            for n, p in enumerate(proposed):
                tool_ordinal += 1
                known = p.result is not None or p.error is not None
                if not known:
                    gaps.append(f"step {len(steps) + 1}: the result of {p.name} was not captured ({', '.join(p.gaps) or 'no result'})")
                steps.append(ToolStep(len(steps) + 1, tool_ordinal, p.name, calls[n].call_id, p.args, p.result, p.error, known))
            i = j
        else:  # a tool step before any model call (a framework's pre-step): served like any other
            tool_ordinal += 1
            steps.append(ToolStep(len(steps) + 1, tool_ordinal, s.name, s.call_id, s.args, s.result, s.error,
                                  s.result is not None or s.error is not None))
            i += 1
    if model_ordinal == 0:
        raise TapeError(f"{source}: no model call in the run, so there is nothing to tape")
    return Tape(source, tuple(steps), tuple(gaps), ("a production run: answers are rendered from its messages, "
                                                     "its requests are not recorded, so the prefix is checked on tool results only",))


_SDK_REPR = re.compile(r"^\[?(Response\w*|ChatCompletion\w*)\(")


def _llm_text(result: object) -> str:
    """The text a recorded model step answered. Some tracings record the output message itself (a dict, or its
    Python repr: ``{'content': None, 'role': 'assistant', …}``) or an SDK object's repr
    (``ResponseFunctionToolCall(…)``) where the answer was only tool calls: those are no text of the answer."""
    if result is None:
        return ""
    value: object = result
    if isinstance(result, str):
        if _SDK_REPR.match(result):
            return ""
        if not result.startswith("{"):
            return result
        try:
            value = orjson.loads(result)
        except orjson.JSONDecodeError:
            import ast

            try:
                value = ast.literal_eval(result)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return result
    if isinstance(value, Mapping) and ("content" in value or value.get("role") == "assistant"):
        content = value.get("content")
        if isinstance(content, list):
            return "".join(str(c.get("text") or "") for c in content if isinstance(c, Mapping))
        return "" if content is None else str(content)
    return result if isinstance(result, str) else orjson.dumps(result, default=str).decode()


def render_reply(step: ModelStep, api: Api, stream: bool, model: str, include_usage: bool) -> tuple[str, bytes]:
    """A production step's answer in the agent's API (content type, bytes), the recorded call ids kept."""
    from plumbline_otel.replay.proxy.simulated import SimReply, body_for, stream_for

    reply = SimReply(text=step.text, tool_calls=[(c.name, _as_object(c.arguments)) for c in step.calls], input_tokens=0, output_tokens=0)
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0} if api == "chat" else {"input_tokens": 0, "output_tokens": 0}
    ids = {f"call_{step.ordinal}_{i}": c.call_id for i, c in enumerate(step.calls)}
    if stream:
        chunks = b"".join(stream_for(api, step.model or model, reply, usage, step.ordinal, include_usage))
        out, ctype = chunks, "text/event-stream"
    else:
        out, ctype = orjson.dumps(body_for(api, step.model or model, reply, usage, step.ordinal)), "application/json"
    for made, recorded in ids.items():
        out = out.replace(made.encode(), recorded.encode())
    return ctype, out


def _as_object(value: JsonValue) -> JsonObject:
    if isinstance(value, str):
        try:
            parsed: JsonValue = orjson.loads(value)
        except orjson.JSONDecodeError:
            return {"input": value}
        value = parsed
    return dict(value) if isinstance(value, dict) else {"input": value}



def structured_for(text: str, output_schema: Mapping[str, object] | None) -> JsonObject | None:
    """The structured content a tool with ``output_schema`` would have returned beside its text ``text``, for a tape's
    result served by the MCP proxy (a recorded run keeps the text; an MCP client checks structured content against
    the tool's declared output schema and refuses a result without it). None: the tool declares no output schema,
    or the text cannot be read as its structured content."""
    if not isinstance(output_schema, Mapping):
        return None
    props = output_schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    try:
        parsed: JsonValue = orjson.loads(text)
    except orjson.JSONDecodeError:
        parsed = None
    required = output_schema.get("required") or ["result"]
    if not isinstance(required, Iterable):  # list()'s own TypeError, said where
        raise TypeError(f"an output schema's required is a list, not {type(required).__name__}")
    if set(props) == {"result"} and list(required) == ["result"] and not (
            isinstance(parsed, Mapping) and set(parsed) == {"result"}):
        wrapped = props["result"] if isinstance(props["result"], Mapping) else {}
        return {"result": text if wrapped.get("type") == "string" or parsed is None else parsed}  # a wrapped return value
    return dict(parsed) if isinstance(parsed, Mapping) else None


def shape_tool_result(result: object, output_schema: Mapping[str, object] | None) -> object:
    """An MCP ``CallToolResult`` served from a tape, with the structured content its tool's output schema asks for
    (``structured_for``) when the recording had only its text; an error result, or one that has it, unchanged.
    (Read by its fields' names, so any MCP SDK's result passes; the caller knows which it gave.)"""
    if getattr(result, "is_error", False) or getattr(result, "structured_content", None) is not None:
        return result
    text = "".join(str(getattr(c, "text", "") or "") for c in getattr(result, "content", None) or [])
    structured = structured_for(text, output_schema)
    if structured is None:
        return result
    from pydantic import BaseModel

    if not isinstance(result, BaseModel):  # model_copy's AttributeError, said as what it is
        raise TypeError(f"an MCP result is a pydantic model, not {type(result).__name__}")
    return result.model_copy(update={"structured_content": structured})


# --- user turns -------------------------------------------------------------------------------------


def user_texts(api: Api, body: Mapping[str, object]) -> list[str]:
    """The text of each user message a request carries, in order (tool results, which the Messages API puts in user
    messages, are not user text)."""
    out = []
    for message in input_messages(api, body):
        if message.get("role") != "user":
            continue
        texts = [str(p.get("content") or "") for p in _parts(message) if p.get("type") == "text"]
        if texts:
            out.append("".join(texts))
    return out


def replace_user_text(api: Api, body: JsonObject, original: str, new: str) -> int:
    """Rewrite, in place, every user message of ``body`` whose text is ``original`` (whitespace aside) to ``new``;
    how many were rewritten. A message whose content is a list keeps its first text block, with the new text."""
    want = original.strip()
    if not want:
        return 0
    text = body.get("input")
    if api == "responses" and isinstance(text, str):
        if text.strip() == want:
            body["input"] = new
            return 1
        return 0
    messages = body.get("input") if api == "responses" else body.get("messages")
    count = 0
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict) or message.get("role") != "user" or message.get("type") not in (None, "message"):
            continue
        content = message.get("content")
        if isinstance(content, str):
            if content.strip() == want:
                message["content"] = new
                count += 1
            continue
        if not isinstance(content, list):
            continue
        texts = [b for b in content if isinstance(b, dict) and b.get("type") in _TEXT_ITEMS]
        if texts and "".join(str(b.get("text") or "") for b in texts).strip() == want:
            texts[0]["text"] = new
            message["content"] = [b for b in content if not any(b is t for t in texts[1:])]
            count += 1
    return count

# --- divergence ------------------------------------------------------------------------------------

_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)
_ID_KEYS = frozenset({"id", "tool_call_id", "call_id", "tool_use_id"})
_IGNORED = frozenset({"stream_options", "metadata", "user", "store"})


def _mask(value: JsonValue) -> JsonValue:
    """Ids and timestamps (the declared tolerances) masked out of a request's content."""
    if isinstance(value, str):
        return _UUID.sub("<uuid>", _TIMESTAMP.sub("<time>", value))
    if isinstance(value, Mapping):
        return _mask_object(value)
    if isinstance(value, list):
        return [_mask(v) for v in value]
    return value


def _mask_object(value: Mapping[str, JsonValue]) -> JsonObject:
    return {k: ("<id>" if k in _ID_KEYS else _mask(v)) for k, v in value.items()}


def comparable_request(api: Api, body: Mapping[str, JsonValue]) -> JsonObject:
    """What a request means for divergence: its model, messages (as GenAI parts), tools by name and parameters."""
    offered = body.get("tools") or []
    if not isinstance(offered, list | str | Mapping):  # what iterating it gave: a TypeError
        raise TypeError(f"a request's tools are a list, not {type(offered).__name__}")
    tools: list[JsonValue] = [*sorted(str(tool_name(api, t)) for t in offered if isinstance(t, Mapping))]
    rest = {k: v for k, v in body.items() if k not in _IGNORED and k not in ("messages", "input", "system", "instructions", "tools")}
    messages: list[JsonValue] = [*input_messages(api, body)]
    return _mask_object({"messages": messages, "tools": tools, **rest})


def first_difference(recorded: object, sent: object, path: str = "") -> str | None:
    """The first place two JSON values differ, as ``path: recorded … ≠ sent …``; None when equal."""
    if isinstance(recorded, Mapping) and isinstance(sent, Mapping):
        for key in sorted(set(recorded) | set(sent), key=str):
            if key not in sent:
                return f"{path}.{key}: recorded {_short(recorded[key])}, absent in the agent's request"
            if key not in recorded:
                return f"{path}.{key}: not recorded, the agent sent {_short(sent[key])}"
            found = first_difference(recorded[key], sent[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(recorded, list) and isinstance(sent, list):
        for i, (a, b) in enumerate(zip(recorded, sent, strict=False)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        if len(recorded) != len(sent):
            return f"{path}: {len(recorded)} recorded item(s), the agent sent {len(sent)}"
        return None
    if recorded != sent:
        return f"{path or 'request'}: recorded {_short(recorded)}, the agent sent {_short(sent)}"
    return None


def _short(value: object, limit: int = 80) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return repr(text if len(text) <= limit else text[:limit] + "…")


def request_difference(tape: Tape, step: ModelStep, api: Api, body: Mapping[str, JsonValue]) -> str | None:
    """How the agent's request for model step ``step`` differs from the recording (None: it does not).

    With the recorded request, the whole request is compared (ids and timestamps masked). Without one (a production
    run, an older cassette), the tool results the request carries are compared with the tape's: an agent that
    executes its own tools re-executes them in the prefix, and a result that differs is a divergence."""
    if step.request is not None:
        return first_difference(comparable_request(api, step.request), comparable_request(api, body))
    recorded = {s.call_id: s for s in tape.tool_steps if s.call_id and s.index < step.index and s.known}
    for call_id, sent in _request_results(api, body).items():
        s = recorded.get(call_id)
        if s is None:
            continue
        if _result_text(s.result if s.error is None else s.error) != _result_text(sent):
            return f"the result of {s.name} (step {s.index}): recorded {_short(_result_text(s.result))}, the agent sent {_short(_result_text(sent))}"
    return None


def _result_text(value: JsonValue) -> str:
    """A tool result as text for comparison: an MCP result's text parts, a string as is, JSON otherwise."""
    content = value.get("content") if isinstance(value, Mapping) else None
    if isinstance(content, list):
        return "".join(str(c.get("text") or "") for c in content if isinstance(c, Mapping))
    if isinstance(value, str):
        try:
            parsed: JsonValue = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
        return value if isinstance(parsed, str) else orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str).decode()


@dataclass
class Branch:
    """What one route serves from: the tape and the step the trial branches at (prefix: steps before it)."""

    tape: Tape
    at: int
    diverged: list[JsonObject] = field(default_factory=list)  # {step, call, detail}: the first is the trial's reason

    def serves_model_call(self, call: int) -> ModelStep | None:
        """The recorded answer for model call ``call`` when it is in the prefix, else None (live)."""
        step = self.tape.model_call(call)
        return step if step is not None and step.index < self.at else None

    def serves_tool_call(self, call: int) -> ToolStep | None:
        """The recorded result for the attempt's tools/call number ``call`` when it is in the prefix, else None (live)."""
        step = self.tape.tool_call(call)
        return step if step is not None and step.index < self.at else None

    def decoys_due(self, tool_calls: int) -> bool:
        """Whether a ``tools/list`` made after ``tool_calls`` tool calls is for step ``at`` or later: decoys are offered
        from the branch point on, never in the prefix (whose requests must match the recording, which had none)."""
        return tool_calls >= sum(1 for s in self.tape.tool_steps if s.index < self.at)

    def rewrite_turn(self, metadata: Mapping[str, JsonValue], api: Api, body: JsonObject, call: int) -> bool:
        """A paraphrased user turn at step ``at`` (``metadata["turn_paraphrase"]``, made by ``branch_variants``): from
        the model call that step is on, the turn's user message is the guard-checked paraphrase in every request (the
        agent keeps the original in its history). At that call, a request without the recorded turn is a divergence:
        the paraphrase cannot reach the model, so the trial is missing with why, never scored. Whether ``body`` changed."""
        turn = metadata.get("turn_paraphrase")
        if not isinstance(turn, Mapping) or call < to_int(turn.get("call") or 0):
            return False
        changed = replace_user_text(api, body, str(turn.get("original") or ""), str(turn.get("text") or ""))
        if not changed and call == to_int(turn.get("call") or 0):
            self.diverged.append({"step": self.at, "call": call, "detail": (
                f"the user turn the paraphrase replaces is not in the agent's request: recorded {_short(turn.get('original'))}")})
        return changed > 0


def branch_variants(variants: Sequence[Variant], tape: Tape | None, wanted: str | Sequence[int] | None,
                    missing: str = "", options: PerturbOptions | None = None, task_input: str | None = None) -> list[Variant]:
    """A task's variants (``perturb.Variant``) as branch points: one per step, labelled ``perturbation@k``.

    ``wanted`` None: the variants unchanged (no ``--branch-at``). Without a tape, or when a step cannot be
    branched at, the variant is kept rejected with the reason (what the run lacks), never run from the start.
    A paraphrase at a later user turn (``turn_variant``) paraphrases that turn's text through ``options``'
    paraphraser and the guard, and hands the agent the task's own request (``task_input``, else the tape's first
    user turn): the prefix stays the recorded one."""
    from dataclasses import replace

    if wanted is None:
        return list(variants)
    if task_input is None:  # a variant that leaves the text alone carries the task's request as it is
        from plumbline_otel.replay.perturb import PERTURBATIONS

        task_input = next((v.text for v in variants if v.perturbation in PERTURBATIONS and not PERTURBATIONS[v.perturbation].changes_text), None)
    out: list[Variant] = []
    for v in variants:
        if v.rejected:
            out.append(v)
            continue
        if tape is None:
            out.append(replace(v, rejected=f"branch-at: the task's run cannot be taped: {missing or 'no tape'}"))
            continue
        try:
            points = branch_points(tape, v.perturbation, wanted)
        except TapeError as exc:
            out.append(replace(v, rejected=f"branch-at: {exc}"))
            continue
        for at in points:
            try:
                meta = branch_metadata(tape, v.perturbation, at, v.metadata)
            except TapeError as exc:
                out.append(replace(v, perturbation=branch_label(v.perturbation, at), rejected=f"branch-at: {exc}"))
                continue
            if v.perturbation in TURN_PERTURBATIONS and at > 1:
                out.append(turn_variant(v, tape, at, meta, options, task_input))
                continue
            out.append(replace(v, perturbation=branch_label(v.perturbation, at), metadata=meta))
    return out


def turn_variant(variant: Variant, tape: Tape, at: int, metadata: Mapping[str, JsonValue], options: PerturbOptions | None = None,
                 task_input: str | None = None) -> Variant:
    """A paraphrase variant at the user turn step ``at`` opens: that turn's recorded text paraphrased by the study's
    paraphraser (``perturb.PerturbOptions``; the templates by default) and checked by the guard against it, the
    variant's own index chosen; the agent gets the task's request unchanged, the model-API proxy rewrites the turn
    from step ``at`` on (``Branch.rewrite_turn``). Rejected with the guard's reason, or when the turn's text was not
    recorded."""
    from dataclasses import replace

    from plumbline_otel.replay.perturb import PerturbOptions, build_variants
    from plumbline_otel.replay.tasks import ReplayTask

    label = branch_label(variant.perturbation, at)
    original = tape.user_turns().get(at, "")
    first = tape.user_turns().get(1, "")
    request = task_input if task_input is not None else first
    if not original or not request:
        return replace(variant, perturbation=label, text=request or variant.text,
                       rejected=f"branch-at: step {at}: the user turn's text was not recorded")
    turn = ReplayTask(variant.task_key, original, tape.source)
    built = [v for v in build_variants(turn, [variant.perturbation], options or PerturbOptions())]
    index = str(variant.variant_id).partition("-")[0]
    chosen = next((v for v in built if str(v.variant_id).partition("-")[0] == index), built[0] if built else None)
    if chosen is None:
        return replace(variant, perturbation=label, text=request, rejected=f"branch-at: step {at}: no paraphrase of the turn")
    meta: JsonObject = {**dict(metadata), **dict(chosen.metadata),
            "turn_paraphrase": {"call": tape.step(at).ordinal if isinstance(tape.step(at), ModelStep) else at,
                                "original": original, "text": chosen.text}}
    return replace(variant, perturbation=label, variant_id=chosen.variant_id, text=request, metadata=meta,
                   rejected=None if chosen.rejected is None else f"guard (user turn at step {at}): {chosen.rejected}")


def tape_for_task(cassette: Path, task_key: str, run: Trajectory | None = None) -> Tape:
    """The tape of a task's recorded baseline trial (repeat 0) in a study's cassette (``<state>/responses.jsonl``)."""
    lines = cassette.read_bytes().splitlines() if cassette.is_file() else []
    chosen: dict[str, list[JsonObject]] = {}
    for entry in read_jsonl(lines):
        parts = str(entry.get("trial_id") or "").split("/")
        if len(parts) == 5 and parts[1] == task_key and parts[2] == "baseline" and parts[4] == "k0":
            chosen.setdefault(parts[3], []).append(entry)
    if not chosen:
        raise TapeError(f"{cassette}: no recorded baseline trial (repeat 0) of task {task_key}")
    variant = sorted(chosen)[0]
    return tape_from_cassette(chosen[variant], f"{cassette} task {task_key}", run)


def replay_from_here(run: Trajectory, db: str | None) -> JsonObject:
    """Each step a run can be replayed from (`replay --branch-at`, issue 44): its command, or why it cannot be, with
    what the run's recording lacks. A tool step branches under a tool fault, a model step under a model fault."""
    try:
        tape = tape_from_trajectory(run)
    except TapeError as exc:
        return {"error": str(exc), "points": [], "gaps": []}
    where = f"--db {shlex.quote(db)} " if db else ""
    points: list[JsonValue] = []
    for step in tape.steps:
        perturbation = "tool_fault" if isinstance(step, ToolStep) else "model_fault"
        try:
            tape.check_branch(step.index, perturbation)
            why = None
        except TapeError as exc:
            why = str(exc)
        points.append({"index": step.index, "kind": step.kind, "name": step.name if isinstance(step, ToolStep) else (step.model or "model"),
                       "perturbation": perturbation, "why": why,
                       "command": None if why else (
                           f"plumbline replay {where}--agent {shlex.quote(run.service or 'AGENT')} --task {shlex.quote(run.task_key or 'TASK')} "
                           f"--study branch-{step.index} --branch-at {step.index} --perturbations {perturbation} --proxy "
                           f"--adapter 'command:YOUR AGENT' --otlp-file branch.jsonl")})
    return {"error": None, "points": points, "gaps": list(tape.gaps)}
