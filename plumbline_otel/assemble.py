"""Assemble: the span records of one trace become one trajectory.

Rules users meet on day one, in the order they are applied:
1. The same LLM call traced twice (a provider SDK's own span plus an instrumentation library's,
   parent and child, or two spans with the same response id) is one LLM call.
2. Tool spans are the record of what ran. A call a model proposed in an LLM span's output is the
   same step as the tool span with its call id, or else with its name and arguments in the same
   turn; its arguments fill a tool span that carries none.
3. When a trace has no tool spans at all, the proposed calls are the tool steps, paired with
   their results from later LLM inputs by call id.
Steps are ordered by start time, then span order. Tokens add up over LLM steps only.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from typing import Any, Iterable

import orjson

from plumbline_otel.model import SpanRecord, Step, ToolCallRef, Trajectory

# A conversation or session is not a task (pydantic-ai mints a conversation per run, ADK a session
# per conversation, and one conversation holds many tasks): by default only an explicit task key
# names the task, else the normalised request. Session and conversation ids stay in the context.
DEFAULT_TASK_KEYS = ("plumbline.task.key",)
CONTEXT_PREFIX = "plumbline."
CONTEXT_KEYS = ("session.id", "gen_ai.conversation.id")


@dataclass
class _Merged:
    """LLM spans that are one call: the richest one leads, the others fill its gaps."""

    lead: SpanRecord
    members: list[SpanRecord]


def _richness(rec: SpanRecord) -> tuple[int, int, int]:
    return (len(rec.proposed_calls) + len(rec.tool_results), int(rec.content_captured), -rec.start_ns)


def _merge_llm_calls(llm: list[SpanRecord]) -> list[SpanRecord]:
    by_id = {r.span_id: r for r in llm}
    parent: dict[str, str] = {}

    def root(span_id: str) -> str:
        while span_id in parent:
            span_id = parent[span_id]
        return span_id

    by_response: dict[str, str] = {}
    for rec in llm:
        if rec.parent_span_id in by_id:  # an LLM span directly inside another LLM span
            parent[root(rec.span_id)] = root(rec.parent_span_id)
        if rec.response_id:
            first = by_response.setdefault(rec.response_id, rec.span_id)
            if root(first) != root(rec.span_id):
                parent[root(rec.span_id)] = root(first)
    groups: dict[str, list[SpanRecord]] = {}
    for rec in llm:
        groups.setdefault(root(rec.span_id), []).append(rec)
    return [_combine(members) for members in groups.values()]


def _combine(members: list[SpanRecord]) -> SpanRecord:
    if len(members) == 1:
        return members[0]
    ordered = sorted(members, key=_richness, reverse=True)
    lead = replace(ordered[0])
    for other in ordered[1:]:
        for name in ("model", "input_tokens", "output_tokens", "input_text", "output_text", "response_id", "error"):
            if getattr(lead, name) is None:
                setattr(lead, name, getattr(other, name))
    lead.start_ns = min(m.start_ns for m in members)
    return lead


def _canonical(args: Any) -> bytes:
    return orjson.dumps(args, option=orjson.OPT_SORT_KEYS)


def _tool_step(rec: SpanRecord, proposed: ToolCallRef | None) -> Step:
    args = rec.args
    source = "tool_span"
    if proposed is not None:
        source = "tool_span+llm_output"
        # No arguments, or a bare value (a one-argument tool's input): the model's object is the call.
        if rec.args_state != "structured" and isinstance(proposed.args, dict):
            args = proposed.args
    return Step(
        kind="tool_call",
        name=rec.tool_name or rec.name,
        args=args,
        result=rec.result,
        error=rec.error,
        call_id=rec.call_id or (proposed.call_id if proposed else None),
        source=source,  # type: ignore[arg-type]
        span_id=rec.span_id,
        start_ns=rec.start_ns,
    )


def _llm_step(rec: SpanRecord) -> Step:
    return Step(
        kind="llm_call",
        name=rec.model or rec.name,
        args=None,
        result=rec.output_text,
        error=rec.error,
        source="span",
        span_id=rec.span_id,
        start_ns=rec.start_ns,
        model=rec.model,
        input_tokens=rec.input_tokens,
        output_tokens=rec.output_tokens,
    )


def _turn_of(start_ns: int, llm_ends: list[tuple[int, SpanRecord]]) -> SpanRecord | None:
    """The LLM call whose turn a tool span belongs to: the last one that ended before it started."""
    owner = None
    for end_ns, rec in llm_ends:
        if end_ns <= start_ns:
            owner = rec
    return owner


def _match_proposals(tools: list[SpanRecord], llm: list[SpanRecord]) -> dict[str, ToolCallRef]:
    """Tool span id -> the model-proposed call it carried out."""
    by_call_id = {c.call_id: c for rec in llm for c in rec.proposed_calls if c.call_id}
    llm_ends = sorted(((r.end_ns, r) for r in llm), key=lambda pair: pair[0])
    used: set[int] = set()
    matches: dict[str, ToolCallRef] = {}
    for tool in tools:
        call = by_call_id.get(tool.call_id) if tool.call_id else None
        if call is None:
            owner = _turn_of(tool.start_ns, llm_ends)
            candidates = owner.proposed_calls if owner else []
            call = next(
                (c for c in candidates if id(c) not in used and c.name == tool.tool_name
                 and (tool.args_state != "structured" or _canonical(c.args) == _canonical(tool.args))),
                None,
            )
        if call is not None:
            used.add(id(call))
            matches[tool.span_id] = call
    return matches


def _proposed_steps(llm: list[SpanRecord]) -> list[Step]:
    results = {r.call_id: r for rec in llm for r in rec.tool_results}
    steps = []
    for rec in llm:
        for call in rec.proposed_calls:
            result = results.get(call.call_id) if call.call_id else None
            steps.append(Step(
                kind="tool_call",
                name=call.name,
                args=call.args,
                result=result.result if result else None,
                error="error result" if result and result.error else None,
                call_id=call.call_id,
                source="llm_output",
                span_id=rec.span_id,
                start_ns=rec.end_ns + call.index,  # after the call that proposed it, in proposal order
            ))
    return steps


def _root(records: list[SpanRecord]) -> SpanRecord:
    ids = {r.span_id for r in records}
    roots = [r for r in records if r.parent_span_id not in ids]
    agents = [r for r in records if r.step_kind == "agent"]
    top_agents = [a for a in agents if a in roots] or sorted(agents, key=lambda r: r.start_ns)[:1]
    return (top_agents or sorted(roots, key=lambda r: (r.start_ns, r.span_id)))[0]


def _task_key(root: SpanRecord, records: list[SpanRecord], input_text: str | None, keys: Iterable[str]) -> tuple[str | None, str]:
    for key in keys:
        for rec in [root, *records]:
            value = rec.attributes.get(key, rec.resource.get(key))
            if value not in (None, ""):
                return str(value), f"attribute:{key}"
    if input_text:
        normalised = re.sub(r"\s+", " ", input_text.strip().lower())
        return "input:" + hashlib.sha256(normalised.encode()).hexdigest()[:16], "input_hash"
    return None, "none"


def is_context_key(key: str) -> bool:
    """Attributes a run keeps in its context: plumbline's own, and session and conversation ids."""
    return key.startswith(CONTEXT_PREFIX) or key in CONTEXT_KEYS


def _context(root: SpanRecord, records: list[SpanRecord]) -> dict[str, Any]:
    context = {k: v for k, v in root.resource.items() if is_context_key(k)}
    for key in CONTEXT_KEYS:  # a session or conversation id may sit on any span of the run
        value = next((r.attributes[key] for r in records if r.attributes.get(key) not in (None, "")), None)
        if value is not None:
            context[key] = value
    context.update({k: v for k, v in root.attributes.items() if is_context_key(k)})
    return context


def _final_output(root: SpanRecord, records: list[SpanRecord], llm: list[SpanRecord]) -> str | None:
    """The agent's answer; a trailing newline is presentation (strands' `str(AgentResult)` adds one)."""
    text = _answer(root, records, llm)
    return text.rstrip("\n") if text else text


def _answer(root: SpanRecord, records: list[SpanRecord], llm: list[SpanRecord]) -> str | None:
    kept_as_is = root.output_text if "output:unrecognised" in root.shapes else None
    if root.output_text and not kept_as_is:
        return root.output_text
    answers = [r.output_text for r in records if "step:answer_tool" in r.shapes and r.output_text]
    if answers:  # a framework's answer tool (smolagents final_answer) carries the answer
        return answers[-1]
    for rec in sorted(llm, key=lambda r: r.end_ns, reverse=True):
        if rec.output_text and not rec.proposed_calls:
            return rec.output_text
    return kept_as_is


def _has_evidence(rec: SpanRecord) -> bool:
    return bool(rec.content_captured or rec.proposed_calls or rec.input_tokens or rec.output_tokens or rec.output_text)


def _without_preparation(llm: list[SpanRecord]) -> list[SpanRecord]:
    """Drop LLM-kind spans that made no request: no content and no tokens beside a sibling that has them.

    LlamaIndex opens one for local preparation (`…_prepare_chat_with_tools`) next to the real call.
    Only a span whose recorded payload held no chat counts as such: with content capture off a
    real call can lack content and tokens too (a stream without usage), and it stays a call.
    """
    real_parents = {r.parent_span_id for r in llm if _has_evidence(r)}
    return [r for r in llm if not ("step:no_model_request" in r.shapes and not _has_evidence(r) and r.parent_span_id in real_parents)]


def assemble(records: list[SpanRecord], task_keys: Iterable[str] = DEFAULT_TASK_KEYS) -> Trajectory | None:
    """One trace's span records (any order, possibly incomplete) as a trajectory; None when it is no run.

    A trace with no steps (LangChain under Traceloop puts a lone `create_agent` span in its own
    trace) is no run, unless it carries plumbline's own run attributes (a trial-status marker).
    """
    records = sorted(records, key=lambda r: (r.start_ns, r.span_id))
    root = _root(records)
    llm = _merge_llm_calls(_without_preparation([r for r in records if r.step_kind == "llm_call"]))
    tools = [r for r in records if r.step_kind == "tool_call"]
    if tools:
        matches = _match_proposals(tools, llm)
        tool_steps = [_tool_step(t, matches.get(t.span_id)) for t in tools]
    else:
        tool_steps = _proposed_steps(llm)
    agents = [
        Step(kind="agent", name=a.agent_name or a.name, error=a.error, span_id=a.span_id, start_ns=a.start_ns)
        for a in records if a.step_kind == "agent" and a is not root
    ]
    order = {r.span_id: i for i, r in enumerate(records)}
    steps = sorted([*tool_steps, *(_llm_step(r) for r in llm), *agents], key=lambda s: (s.start_ns, order.get(s.span_id or "", 0)))
    context = _context(root, records)
    if not steps and not any(k.startswith(CONTEXT_PREFIX) for k in context):
        return None
    first_llm = next((r for r in sorted(llm, key=lambda r: r.start_ns) if r.input_text), None)
    # A root input of a shape we could not read is kept only when no LLM span has the request.
    root_input = None if "input:unrecognised" in root.shapes else root.input_text
    input_text = root_input or (first_llm.input_text if first_llm else None) or root.input_text
    task_key, source = _task_key(root, records, input_text, task_keys)
    return Trajectory(
        trajectory_id=root.trace_id,
        trace_id=root.trace_id,
        task_key=task_key,
        task_key_source=source,
        service=root.service_name,
        service_version=root.service_version,
        agent_name=next((r.agent_name for r in records if r.agent_name), None),
        input=input_text,
        final_output=_final_output(root, records, llm),
        conventions=tuple(sorted({r.convention for r in records if r.convention != "unknown"})),
        steps=tuple(steps),
        start_ns=records[0].start_ns,
        end_ns=max(r.end_ns for r in records),
        context=context,
    )
