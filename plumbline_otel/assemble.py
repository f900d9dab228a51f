"""Assemble: the span records of one trace become one trajectory.

Rules users meet on day one, in the order they are applied:
1. The same LLM call traced twice (a provider SDK's own span plus an instrumentation library's,
   parent and child, two spans with the same response id, or two instrumentations' spans of one
   streamed call that overlap in time in the same place of the run and agree on what they both
   recorded) is one LLM call.
2. Tool spans are the record of what ran. A call a model proposed in an LLM span's output is the
   same step as the tool span with its call id, or else with its name and arguments in the same
   turn; its arguments fill a tool span that carries none.
3. When a trace has no tool spans at all, the proposed calls are the tool steps, paired with
   their results from later LLM inputs by call id.
4. One call traced at several layers (a framework's tool span around an MCP client span around the
   MCP server's span) is one step: a tool span inside a tool span of the same name is merged into it.
5. A proposed call a `gen_ai.tool.call.decision` denied (or held for an approval that never came)
   did not run: it is a failed step whose error says so, never a successful one.
6. Several runs in one trace (several root agent spans, or a conversation's turns) are several
   trajectories; a trace of one run keeps the trace id as its trajectory id. A turn is found by its
   span (`handle_conversation_turn`, a top-level agent span) or, where turns have no agent span of
   their own, by its first model call: one whose request holds an answered user message and then a
   new one (normalise marks it `step:new_user_turn`).
7. A guardrail result or an execution-state change the run reported is an `event` step at its time.
8. Span links (`SpanLink`): a trace whose root span links, with no attribution, to a span of another trace
   continues the work of that span (AutoGen's runtime carries a Swarm's hand-off from one agent's trace to the
   next's this way): given both traces, the root is assembled as that span's child, so one run spans them. A tool
   span linked `CAUSED_BY_GENERATION` to an LLM span carries out a call of that generation; a span another
   links `RETRY_OF` to was an earlier attempt of the same step, and only the last attempt is a step.
   Traces of one model call each (an agent loop under an SDK's zero-code instrumentation only) are linked the same
   way by the store when a request continues another trace's conversation without opening a new user turn
   (`threads.py`): given together, their records are one run with the first trace's id.
9. A tool span calling `transfer_to_<agent>` (or `handoff_to_<agent>`) of an agent that then runs in the same run
   is a hand-off, named by the function the model called, not a tool call.
Steps are ordered by start time, then span order. Tokens add up over LLM steps only.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import orjson

from plumbline_otel.model import CONTEXT_PREFIX, SpanRecord, Step, ToolCallRef, ToolResultRef, Trajectory
from plumbline_otel.normalise import VENDOR_ARGS_KEYS, VENDOR_RESULT_KEYS, unwrap_scoped_result
from plumbline_otel.runs import TASK_KEY

# A conversation or session is not a task (pydantic-ai mints a conversation per run, ADK a session
# per conversation, and one conversation holds many tasks): by default only an explicit task key
# names the task, else the normalised request. Session and conversation ids stay in the context.
DEFAULT_TASK_KEYS = (TASK_KEY,)
RESOURCE_PREFIX = "resource."  # a task key naming an attribute of the resource only (`task_key_value`)
CONTEXT_KEYS = ("session.id", "gen_ai.conversation.id")
# A trace of more spans is never held whole as records: a shard lets it go when it reaches this
# many, and the store rebuilds it run by run (`split_runs` on a few columns, then a batch of runs at
# a time), reading at most this many of its spans back into records at once (or one longer run).
# A long-running agent's trace (a chat of thousands of turns) grows without end.
LONG_TRACE_SPANS = 2_000


def _richness(rec: SpanRecord) -> tuple[int, int, int]:
    return (len(rec.proposed_calls) + len(rec.tool_results), int(rec.content_captured), -rec.start_ns)


def _find(parent: dict[str, str], span_id: str) -> str:
    while span_id in parent:
        span_id = parent[span_id]
    return span_id


def _merge_llm_calls(llm: list[SpanRecord], records: list[SpanRecord]) -> list[SpanRecord]:
    by_id = {r.span_id: r for r in llm}
    parent: dict[str, str] = {}
    by_response: dict[str, str] = {}
    for rec in llm:
        if rec.parent_span_id in by_id:  # an LLM span directly inside another LLM span
            parent[_find(parent, rec.span_id)] = _find(parent, rec.parent_span_id)
        if rec.response_id:
            first = by_response.setdefault(rec.response_id, rec.span_id)
            if _find(parent, first) != _find(parent, rec.span_id):
                parent[_find(parent, rec.span_id)] = _find(parent, first)
    _merge_twins(llm, records, parent)
    groups: dict[str, list[SpanRecord]] = {}
    for rec in llm:
        groups.setdefault(_find(parent, rec.span_id), []).append(rec)
    return [_combine(members) for members in groups.values()]


def _place(rec: SpanRecord, spans: dict[str, SpanRecord]) -> str | None:
    """The nearest agent span above a span: where in the run it was made."""
    parent, seen = rec.parent_span_id, set()
    while parent is not None and parent in spans and parent not in seen:
        seen.add(parent)
        if spans[parent].step_kind == "agent":
            return parent
        parent = spans[parent].parent_span_id
    return None


def _overlap(a: SpanRecord, b: SpanRecord) -> float:
    """How much two spans overlap, as a share of the shorter one (1.0: one holds the other)."""
    inside = min(a.end_ns, b.end_ns) - max(a.start_ns, b.start_ns)
    shorter = min(a.end_ns - a.start_ns, b.end_ns - b.start_ns)
    if inside < 0:
        return 0.0
    return 1.0 if shorter <= 0 else min(1.0, inside / shorter)


def _twin_agreement(a: SpanRecord, b: SpanRecord) -> int:
    """How many things two spans of one call both recorded alike; -1 when one of them differs."""
    agreed = 0
    for mine, theirs in ((a.output_text, b.output_text), (a.input_text, b.input_text), (a.input_tokens, b.input_tokens),
                         (a.output_tokens, b.output_tokens),
                         ([(c.name, c.call_id) for c in a.proposed_calls] or None, [(c.name, c.call_id) for c in b.proposed_calls] or None)):
        if mine is None or theirs is None:
            continue
        if mine != theirs:
            return -1
        agreed += 1
    if a.model and b.model:  # a dated snapshot ("gpt-4o-mini-2024-07-18") is its family's model
        if not (a.model.startswith(b.model) or b.model.startswith(a.model)):
            return -1
        agreed += 1
    return agreed


def _merge_twins(llm: list[SpanRecord], records: list[SpanRecord], parent: dict[str, str]) -> None:
    """Join, in `parent`, the spans two instrumentations wrote of one call when nothing else ties them.

    A streamed call traced by an OpenInference span and by the SDK's own span: neither is inside the other,
    and the OpenInference span has no response id. They are one call when they come from different
    instrumentation scopes, overlap for at least half the shorter one, sit under the same agent span, do not
    disagree on a response id, model, tokens, texts or proposed calls, and agree on at least one of them.
    Best-overlapping pairs join first, and a call never holds two spans of one scope: parallel calls, each
    traced twice, pair up with their own twins.
    """
    if len({r.scope_name for r in llm}) < 2:
        return
    spans = {r.span_id: r for r in records}
    place = {r.span_id: _place(r, spans) for r in llm}
    ordered = sorted(llm, key=lambda r: r.start_ns)
    pairs: list[tuple[float, int, int, SpanRecord, SpanRecord]] = []
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            if b.start_ns > a.end_ns:
                break
            if a.scope_name == b.scope_name or place[a.span_id] != place[b.span_id] or (
                    a.response_id and b.response_id and a.response_id != b.response_id):
                continue
            share, agreed = _overlap(a, b), _twin_agreement(a, b)
            if share >= 0.5 and agreed > 0:
                pairs.append((share, agreed, -i, a, b))
    scopes: dict[str, set[str]] = {r.span_id: {r.scope_name} for r in llm}
    for _, _, _, a, b in sorted(pairs, key=lambda p: p[:3], reverse=True):
        ra, rb = _find(parent, a.span_id), _find(parent, b.span_id)
        if ra != rb and scopes[ra].isdisjoint(scopes[rb]):
            parent[rb] = ra
            scopes[ra] |= scopes[rb]


def _combine(members: list[SpanRecord]) -> SpanRecord:
    if len(members) == 1:
        return members[0]
    ordered = sorted(members, key=_richness, reverse=True)
    lead = replace(ordered[0])
    for other in ordered[1:]:
        for name in ("model", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "input_text",
                     "output_text", "response_id", "error"):
            if getattr(lead, name) is None:
                setattr(lead, name, getattr(other, name))
        if not lead.finish_reasons:
            lead.finish_reasons = list(other.finish_reasons)
        if lead.cost_amount is None and other.cost_amount is not None:  # the amount with its own currency and source
            lead.cost_amount, lead.cost_currency, lead.cost_source = other.cost_amount, other.cost_currency, other.cost_source
    lead.start_ns = min(m.start_ns for m in members)
    return lead


def _ids_from_next_request(llm: list[SpanRecord]) -> list[SpanRecord]:
    """Calls a response proposed without ids take them from the next request, which sends their results back.

    An instrumentation that records a response's calls in an older form without their ids (LiteLLM's callback:
    `gen_ai.completion.{j}.function_call`) leaves them unpaired with their results; the next request's history
    answers them in the order they were proposed, so its results that no earlier request carried are theirs, when
    there are as many of them as calls. Only calls without an id are given one.
    """
    ordered = sorted(llm, key=lambda r: r.start_ns)
    seen: set[str] = set()
    out: dict[str, SpanRecord] = {}
    for i, rec in enumerate(ordered):
        seen.update(r.call_id for r in rec.tool_results)
        calls = rec.proposed_calls
        if not calls or any(c.call_id for c in calls):
            continue
        later = next((r for r in ordered[i + 1:] if r.start_ns >= rec.end_ns and r.tool_results), None)
        fresh = [r for r in later.tool_results if r.call_id not in seen] if later else []
        if len(fresh) == len(calls):
            out[rec.span_id] = replace(rec, proposed_calls=[replace(c, call_id=r.call_id) for c, r in zip(calls, fresh)])
    return [out.get(r.span_id, r) for r in llm]


def _canonical(args: Any) -> bytes:
    return orjson.dumps(args, option=orjson.OPT_SORT_KEYS)


def _key_evidence(rec: SpanRecord, what: str) -> str | None:
    """The kind of place a span field was read from (see `Step.evidence`)."""
    key = next((e.split(":", 1)[1] for e in rec.evidence if e.startswith(what + ":")), None)
    if key is None:
        return None
    if key.startswith("log:"):
        return "log_record"
    if key.startswith("event:"):
        return "span_event"
    if key in VENDOR_ARGS_KEYS or key in VENDOR_RESULT_KEYS:
        return f"vendor_key:{key}"
    return "tool_span"


def _gap(rec: SpanRecord, what: str, content_seen: bool) -> str:
    """Why a value is missing: capture off (redacted, or no content anywhere in the trace), a key we could not map,
    or, when content was captured elsewhere in the trace, an instrumentation that does not write it."""
    if what == "args" and rec.args_state == "redacted":
        return f"{what}:content_capture_off"
    if rec.unknown_keys:
        return f"{what}:unknown_key:{rec.unknown_keys[0]}"
    return f"{what}:attribute_absent" if content_seen else f"{what}:content_capture_off"


def _tool_step(rec: SpanRecord, proposed: ToolCallRef | None, results: dict[str, ToolResultRef], content_seen: bool) -> Step:
    args = rec.args
    source = "tool_span"
    evidence = _key_evidence(rec, "args") if rec.args_state != "absent" else None
    if proposed is not None:
        source = "tool_span+llm_output"
        # No arguments, or a bare value (a one-argument tool's input): the model's object is the call.
        if (rec.args_state != "structured" and isinstance(proposed.args, dict)) or _padded(rec.args, proposed.args):
            args, evidence = proposed.args, "message_part"
    call_id = rec.call_id or (proposed.call_id if proposed else None)
    result, error = rec.result, rec.error
    if result is None and call_id in results:  # the span records no result; the next model request does
        result, _ = unwrap_scoped_result(results[call_id].result, rec.scope_name)
        if error is None and results[call_id].error:
            error = "error result"
    gaps = tuple(g for g, missing in ((_gap(rec, "args", content_seen), args is None),
                                      (_gap(rec, "result", content_seen), result is None and error is None)) if missing)
    # The name the model called the tool by, where the span shows a display name of it (see `_same_tool`).
    name = proposed.name if proposed is not None and (rec.tool_name is None or _same_tool(proposed.name, rec.tool_name)) else rec.tool_name or rec.name
    return Step(
        kind="tool_call",
        name=name,
        args=args,
        result=result,
        error=error,
        call_id=call_id,
        source=source,  # type: ignore[arg-type]
        span_id=rec.span_id,
        start_ns=rec.start_ns,
        evidence=evidence,
        gaps=gaps,
    )


def _padded(recorded: Any, proposed: Any) -> bool:
    """The span's arguments are the model's call plus keys set to null that the model did not send: the tool got the
    model's call (Semantic Kernel records an agent-as-plugin's unused `instructions_override: null` among the
    arguments of every tool call its sub-agent makes; a function is passed only the parameters it declares)."""
    if not (isinstance(recorded, dict) and isinstance(proposed, dict)) or len(recorded) <= len(proposed):
        return False
    return all(k in recorded and recorded[k] == v for k, v in proposed.items()) \
        and all(v is None for k, v in recorded.items() if k not in proposed)


def _llm_step(rec: SpanRecord, content_seen: bool) -> Step:
    content = next((e for e in rec.evidence if e.startswith("content:")), None)
    evidence = ("log_record" if content else "span") if rec.content_captured else None
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
        cache_read_tokens=rec.cache_read_tokens,
        cache_write_tokens=rec.cache_write_tokens,
        finish_reasons=tuple(rec.finish_reasons),
        evidence=evidence,
        gaps=() if rec.content_captured else (_gap(rec, "content", content_seen),),
        cost_amount=rec.cost_amount,
        cost_currency=rec.cost_currency,
        cost_source=rec.cost_source,
    )


def _event_steps(records: list[SpanRecord]) -> list[Step]:
    """Guardrail results and execution-state changes, each a step at its time, its attributes as reported."""
    return [Step(kind="event", name=e.name, args=e.attributes, span_id=r.span_id, start_ns=e.time_ns)
            for r in records for e in r.run_events]


def _turn_of(start_ns: int, llm_starts: list[tuple[int, SpanRecord]]) -> SpanRecord | None:
    """The LLM call whose turn a tool span belongs to: the last one that started before it did.

    Usually that call has ended by then; a tool run while its response still streams (the AI SDK), or
    traced inside the model step that proposed it (Mastra, AI SDK 7), starts before its call ends.
    """
    owner = None
    for begin_ns, rec in llm_starts:
        if begin_ns <= start_ns:
            owner = rec
    return owner


def _match_proposals(tools: list[SpanRecord], llm: list[SpanRecord]) -> dict[str, ToolCallRef]:
    """Tool span id -> the model-proposed call it carried out."""
    by_call_id = {c.call_id: c for rec in llm for c in rec.proposed_calls if c.call_id}
    llm_starts = sorted(((r.start_ns, r) for r in llm), key=lambda pair: pair[0])
    by_span = {r.span_id: r for r in llm}
    used: set[int] = set()
    matches: dict[str, ToolCallRef] = {}
    for tool in tools:
        call = by_call_id.get(tool.call_id) if tool.call_id else None
        if call is None:
            # The generation that requested the call, when the span links to it; else the turn it ran in.
            owner = next((by_span[link.span_id] for link in tool.links
                          if link.link_type == "CAUSED_BY_GENERATION" and link.span_id in by_span), None) \
                or _turn_of(tool.start_ns, llm_starts)
            candidates = owner.proposed_calls if owner else []
            call = next(
                (c for c in candidates if id(c) not in used and _same_tool(c.name, tool.tool_name, tool.args_state)
                 and (tool.args_state != "structured" or _canonical(c.args) == _canonical(tool.args))),
                None,
            )
        if call is not None:
            used.add(id(call))
            matches[tool.span_id] = call
    return matches


def _same_tool(model_name: str, span_name: str | None, args_state: str = "") -> bool:
    """The model's name for a tool and a span's: equal, or the span's a display name of it ("Delegate work to
    coworker" for `delegate_work_to_coworker`, CrewAI's tool spans); a span that names no tool (named by the
    tool's class, normalise's `tool_named_by_class`) is the call whose arguments it ran, when it recorded them."""
    if span_name is None:
        return args_state == "structured"
    return model_name == span_name or _slug(model_name) == _slug(span_name)


def _proposed_step(rec: SpanRecord, call: ToolCallRef, result: ToolResultRef | None, blocked: str | None) -> Step:
    error = blocked or ("error result" if result and result.error else None)
    return Step(
        kind="tool_call",
        name=call.name,
        args=call.args,
        result=result.result if result and not blocked else None,
        error=error,
        call_id=call.call_id,
        source="llm_output",
        span_id=rec.span_id,
        start_ns=rec.end_ns + call.index,  # after the call that proposed it, in proposal order
        evidence="message_part",
        gaps=("result:attribute_absent",) if result is None and error is None else (),
    )


def _proposed_steps(llm: list[SpanRecord], blocked: dict[str, str]) -> list[Step]:
    results = {r.call_id: r for rec in llm for r in rec.tool_results}
    return [_proposed_step(rec, call, results.get(call.call_id) if call.call_id else None, blocked.get(call.call_id or ""))
            for rec in llm for call in rec.proposed_calls]


def _blocked_calls(records: list[SpanRecord]) -> dict[str, str]:
    """Call id -> why the call did not run, from `gen_ai.tool.call.decision` records.

    `deny` stops a call; `require_approval` stops it unless a later `allow` for the same call came.
    """
    outcome: dict[str, str] = {}
    for rec in records:
        for decision in rec.decisions:
            if decision.call_id and (decision.outcome != "require_approval" or outcome.get(decision.call_id) != "allow"):
                outcome[decision.call_id] = decision.outcome
    reasons = {"deny": "not run: the tool call decision was deny",
               "require_approval": "not run: the tool call required approval and none was given"}
    return {call_id: reasons[o] for call_id, o in outcome.items() if o in reasons}


# Module functions, not closures: a compiled closure's environment makes a reference cycle, and shard workers
# leave the cycle collector off (tests/core/test_pipeline.py).
def _layer_above(rec: SpanRecord, tools: dict[str, SpanRecord], spans: dict[str, SpanRecord]) -> SpanRecord | None:
    """The nearest tool-span ancestor, past spans that are neither, not past an agent or a model call."""
    parent, seen = rec.parent_span_id, set()
    while parent is not None and parent in spans and parent not in seen:
        seen.add(parent)
        if parent in tools:
            return tools[parent]
        if spans[parent].step_kind in ("agent", "llm_call"):
            return None
        parent = spans[parent].parent_span_id
    return None


def _outermost_layer(rec: SpanRecord, tools: dict[str, SpanRecord], spans: dict[str, SpanRecord]) -> SpanRecord:
    seen = {rec.span_id}
    layer = _layer_above(rec, tools, spans)
    while layer is not None and layer.span_id not in seen and (
            layer.tool_name == rec.tool_name or "step:mcp_tools_call" in rec.shapes
            # A tool-kind span directly inside a tool span that names no tool of its own (BeeAI's `error` span of a
            # failing call, under OpenInference) is an event of that call, not a call.
            or ("step:tool_named_by_span" in rec.shapes and rec.parent_span_id == layer.span_id)):
        seen.add(layer.span_id)
        rec, layer = layer, _layer_above(layer, tools, spans)
    return rec


def _merge_tool_layers(tools: list[SpanRecord], records: list[SpanRecord]) -> list[SpanRecord]:
    """One call traced at several layers (framework → MCP client → MCP server) is one call.

    A tool span's layer above is its nearest tool-span ancestor, past spans that are neither (a session's or
    transport's spans) but not past an agent or a model call (a sub-agent's tools are its own calls); it is
    the same call when it is the same tool, or when the inner span is an MCP `tools/call` span (the framework
    may name the tool otherwise). The outermost span is the step (what the agent did); the inner ones fill
    what it lacks (arguments, result, call id, evidence), and an error anywhere is the call's error.
    """
    by_id = {t.span_id: t for t in tools}
    spans = {r.span_id: r for r in records}

    groups: dict[str, list[SpanRecord]] = {}
    for rec in tools:
        groups.setdefault(_outermost_layer(rec, by_id, spans).span_id, []).append(rec)
    merged = []
    for span_id, members in groups.items():
        lead = by_id[span_id]
        if len(members) > 1:
            lead = replace(lead, evidence=list(lead.evidence))
            for inner in members:
                if inner is by_id[span_id]:
                    continue
                if lead.args_state in ("absent", "redacted") and inner.args_state in ("structured", "unparsed"):
                    lead.args, lead.args_state = inner.args, inner.args_state
                    lead.evidence = [e for e in lead.evidence if not e.startswith("args:")] + [e for e in inner.evidence if e.startswith("args:")]
                if lead.result is None and inner.result is not None:
                    lead.result = inner.result
                    lead.evidence += [e for e in inner.evidence if e.startswith("result:")]
                lead.call_id = lead.call_id or inner.call_id
                lead.error = lead.error or inner.error
        merged.append(lead)
    return merged


def _root(records: list[SpanRecord]) -> SpanRecord:
    ids = {r.span_id for r in records}
    roots = [r for r in records if r.parent_span_id not in ids]
    agents = [r for r in records if r.step_kind == "agent"]
    # A root chain or workflow span that records the run's request is the run, before any agent beneath it.
    top_agents = [a for a in agents if a in roots] or [r for r in roots if "step:run_root" in r.shapes][:1] \
        or sorted(agents, key=lambda r: r.start_ns)[:1]
    return (top_agents or sorted(roots, key=lambda r: (r.start_ns, r.span_id)))[0]


def _task_key(root: SpanRecord, records: list[SpanRecord], input_text: str | None, keys: Iterable[str]) -> tuple[str | None, str]:
    for key in keys:
        for rec in [root, *records]:
            value = task_key_value(key, rec.attributes, rec.resource)
            if value is not None:
                return value, f"attribute:{key}"
    if input_text:
        normalised = re.sub(r"\s+", " ", input_text.strip().lower())
        return "input:" + hashlib.sha256(normalised.encode()).hexdigest()[:16], "input_hash"
    return None, "none"


def task_key_value(key: str, attributes: dict[str, Any], resource: dict[str, Any]) -> str | None:
    """A task key as users name it, read from one span's attributes and its resource.

    Users name what their traffic has: an attribute of the span or of its resource by its name
    (`session.id`, `langgraph.thread_id`, or a baggage entry the baggage span processor copied);
    `resource.<name>` for the resource's attribute only; or a path into a JSON-valued attribute, as
    instrumentations record metadata (`metadata.task_id` in OpenInference's `metadata`). The name
    as written wins over a path, so an attribute whose name has dots is never read as one.
    """
    value = attributes.get(key, resource.get(key))
    if value in (None, ""):
        value = _path_value(key.removeprefix(RESOURCE_PREFIX), resource) if key.startswith(RESOURCE_PREFIX) else None
    if value in (None, ""):
        value = _path_value(key, attributes)
        value = _path_value(key, resource) if value in (None, "") else value
    if value in (None, ""):
        return None
    return ("true" if value else "false") if isinstance(value, bool) else str(value)  # OTLP's text of a bool, as stored


def _path_value(key: str, attributes: dict[str, Any]) -> Any:
    """`a.b.c` as attribute `a.b.c`, else field `c` of JSON attribute `a.b`, else field `b.c` of `a`."""
    if not attributes:  # a held record's map, trimmed to what assembly reads, is mostly empty
        return None
    if attributes.get(key) not in (None, ""):
        return attributes[key]
    for head, path in _cuts(key):
        if head in attributes:
            value = _field(attributes[head], path)
            if value is not None:
                return value
    return None


_CUTS: dict[str, list[tuple[str, list[str]]]] = {}


def _cuts(key: str) -> list[tuple[str, list[str]]]:
    """`key`'s (attribute, path in it) readings for `_path_value`, longest attribute first; split once per key
    (a run's every span is asked for every task key)."""
    cuts = _CUTS.get(key)
    if cuts is None:
        parts = key.split(".")
        cuts = _CUTS[key] = [(".".join(parts[:cut]), parts[cut:]) for cut in range(len(parts) - 1, 0, -1)]
    return cuts


def _field(value: Any, path: list[str]) -> Any:
    """A scalar at `path` inside a map or a JSON object (text, as attributes carry it), else None."""
    if isinstance(value, str) and value.lstrip()[:1] == "{":
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value if isinstance(value, (str, int, float, bool)) else None


def task_key_attributes(task_keys: Iterable[str]) -> frozenset[str]:
    """The attribute names (of a span or its resource) the task keys may be read from (`task_key_value`)."""
    names: set[str] = set()
    for key in task_keys:
        for name in (key, key.removeprefix(RESOURCE_PREFIX)):
            parts = name.split(".")
            names.update(".".join(parts[:cut]) for cut in range(1, len(parts) + 1))
    return frozenset(names)


def assembly_keys(task_keys: Iterable[str]) -> frozenset[str]:
    """The attribute keys `trim_for_assembly` keeps, besides plumbline's own (`CONTEXT_PREFIX`)."""
    return task_key_attributes(task_keys) | frozenset(CONTEXT_KEYS)


def assembly_attributes(attributes: dict[str, Any], keep: frozenset[str]) -> dict[str, Any]:
    """The attributes assembly reads (task and context keys) of one span's or resource's map."""
    return {k: v for k, v in attributes.items() if k in keep or k.startswith(CONTEXT_PREFIX)}


def trim_for_assembly(rec: SpanRecord, keep: frozenset[str], resources: dict[int, dict[str, Any]]) -> None:
    """Drop, in place, the attributes assembly never reads; the same runs come of the record.

    A shard holds its traces' records until they go quiet, after their rows were built: without
    the raw attribute maps (an LLM span's whole conversation, as text) a held record costs a
    fraction of the memory. The spans of one ResourceSpans share one resource map, so `resources`
    (by the map's id, for one request) trims it once and they keep sharing the trimmed one.
    """
    rec.attributes = assembly_attributes(rec.attributes, keep)
    trimmed = resources.get(id(rec.resource))
    if trimmed is None:
        trimmed = resources[id(rec.resource)] = assembly_attributes(rec.resource, keep)
    rec.resource = trimmed


CONTEXT_ONLY = assembly_keys(())  # the keys of a run's context (with plumbline's own, `CONTEXT_PREFIX`)


def _context(root: SpanRecord, records: list[SpanRecord]) -> dict[str, Any]:
    context = assembly_attributes(root.resource, CONTEXT_ONLY)
    for key in CONTEXT_KEYS:  # a session or conversation id may sit on any span of the run
        value = next((r.attributes[key] for r in records if r.attributes.get(key) not in (None, "")), None)
        if value is not None:
            context[key] = value
    context.update(assembly_attributes(root.attributes, CONTEXT_ONLY))
    return context


def _final_output(root: SpanRecord, records: list[SpanRecord], llm: list[SpanRecord]) -> str | None:
    """The agent's answer; a trailing newline is presentation (strands' `str(AgentResult)` adds one)."""
    text = _answer(root, records, llm)
    return text.rstrip("\n") if text else text


def _answer(root: SpanRecord, records: list[SpanRecord], llm: list[SpanRecord]) -> str | None:
    kept_as_is = root.output_text if "output:unrecognised" in root.shapes else None
    # A run with no span of its own (a conversation's turn found by its first model call, `_user_turn_roots`) has
    # that call as its root: what the call answered is the turn's first reply ("I'll look the invoice up"), not
    # its answer, which is the last reply's text like any run's.
    if root.output_text and not kept_as_is and root.step_kind != "llm_call":
        return root.output_text
    answers = [r.output_text for r in records if "step:answer_tool" in r.shapes and r.output_text]
    if answers:  # a framework's answer tool (smolagents final_answer) carries the answer
        return answers[-1]
    for rec in sorted(llm, key=lambda r: r.end_ns, reverse=True):
        # A span-level finish reason of tool calls means the text came with calls the span did not record.
        if rec.output_text and not rec.proposed_calls and not _TOOL_FINISH.intersection(rec.finish_reasons):
            return rec.output_text
    return kept_as_is


_TOOL_FINISH = {"tool_calls", "tool_call", "tool_use", "function_call", "tool-calls"}  # the last: the AI SDK's


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


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _handoff_calls(records: list[SpanRecord], llm: list[SpanRecord], tool_names: set[str | None]) -> dict[str, ToolCallRef]:
    """Hand-off span id -> the call the model made to hand off (the OpenAI Agents SDK's `transfer_to_billing_agent`):
    a call proposed in the hand-off's turn that no tool span carried out and that names the target, or a transfer."""
    llm_starts = sorted(((r.start_ns, r) for r in llm), key=lambda pair: pair[0])
    out: dict[str, ToolCallRef] = {}
    used: set[int] = set()
    for rec in records:
        if not rec.handoff_to:
            continue
        owner = _turn_of(rec.start_ns, llm_starts)
        target = _slug(rec.handoff_to)
        for call in owner.proposed_calls if owner else []:
            if id(call) not in used and call.name not in tool_names and (
                    (target and target in _slug(call.name)) or call.name.startswith(("transfer_to", "handoff"))):
                out[rec.span_id] = call
                used.add(id(call))
                break
    return out


def _retried(records: list[SpanRecord]) -> set[str]:
    """The spans a later span links to as `RETRY_OF`: earlier attempts of a step, not steps of their own."""
    return {link.span_id for r in records for link in r.links if link.link_type == "RETRY_OF"}


def _handoff_tools(records: list[SpanRecord]) -> list[SpanRecord]:
    """Tool spans that hand the run to an agent (rule 9) as hand-off spans; the others as they are."""
    agents: dict[str, int] = {}
    for r in records:
        if r.step_kind == "agent" and r.agent_name:
            agents.setdefault(_slug(r.agent_name), r.start_ns)
    if not agents:
        return records
    out = []
    for r in records:
        name = _slug(r.tool_name or "") if r.step_kind == "tool_call" else ""
        target = name.removeprefix("transfer_to_") if name.startswith("transfer_to_") else name.removeprefix("handoff_to_")
        if target != name and agents.get(target, -1) >= r.start_ns:
            r = replace(r, step_kind="agent", handoff_to=target)
        out.append(r)
    return out


def _tool_steps(records: list[SpanRecord], llm: list[SpanRecord], handoffs: dict[str, ToolCallRef]) -> tuple[list[Step], dict[str, tuple[str, int]]]:
    """The run's tool calls, and per tool span the call it carried out: (the model response that proposed it, its place
    there). Parallel calls may start in the same instant or in any order, and the model's proposals need not carry
    the call ids the spans do."""
    blocked = _blocked_calls(records)
    retried = _retried(records)
    tools = _merge_tool_layers([r for r in records if r.step_kind == "tool_call" and r.span_id not in retried], records)
    if not tools:
        handed = {id(c) for c in handoffs.values()}
        return _proposed_steps([replace(r, proposed_calls=[c for c in r.proposed_calls if id(c) not in handed])
                                if any(id(c) in handed for c in r.proposed_calls) else r for r in llm], blocked), {}
    matches = _match_proposals(tools, llm)
    results = {r.call_id: r for rec in llm for r in rec.tool_results}
    content_seen = any(r.content_captured for r in llm) or any(r.args_state == "structured" for r in tools)
    steps = [_tool_step(t, matches.get(t.span_id), results, content_seen) for t in tools]
    ran = {s.call_id for s in steps if s.call_id}
    carried = {id(c) for c in matches.values()} | {id(c) for c in handoffs.values()}
    unmatched_tools = {t.tool_name for t in tools if t.span_id not in matches}
    answered_at: dict[str, int] = {}  # call id -> start of the first model request that carries its result
    for rec in sorted(llm, key=lambda r: r.start_ns):
        for result in rec.tool_results:
            answered_at.setdefault(result.call_id, rec.start_ns)
    for rec in llm:
        for call in rec.proposed_calls:
            if id(call) in carried or (call.call_id and call.call_id in ran):
                continue
            if call.call_id in blocked:  # a call stopped before it ran has no tool span: its proposal is the (failed) step
                steps.append(_proposed_step(rec, call, None, blocked[call.call_id]))
            elif call.call_id in results and call.name not in unmatched_tools:
                # Proposed and answered, but no tool span carried it out (a tool the instrumentation does not
                # trace, an MCP tool run by the provider's client): the proposal and its answer are the step.
                step = _proposed_step(rec, call, results[call.call_id], None)
                # It ran after the traced calls of its turn began and before the request that carries its answer.
                before = answered_at.get(call.call_id or "", step.start_ns) - len(rec.proposed_calls) + call.index
                steps.append(replace(step, start_ns=max(step.start_ns, before)))
    response_of = {id(c): rec.span_id for rec in llm for c in rec.proposed_calls}
    return steps, {span_id: (response_of.get(id(call), span_id), call.index) for span_id, call in matches.items()}


def _in_proposal_order(steps: list[Step], place: dict[str, tuple[str, int]]) -> list[Step]:
    """The steps with the calls of each model response in the order it proposed them, in the places they took.

    Parallel calls a framework runs concurrently (CrewAI's thread pool) start in whatever order the scheduler picks;
    the response's order is the run's. Only the calls trade places: every other step keeps its place by start time.
    """
    slots: dict[str, list[int]] = {}
    for i, step in enumerate(steps):
        if step.span_id in place:
            slots.setdefault(place[step.span_id][0], []).append(i)
    out = list(steps)
    for taken in slots.values():
        if len(taken) > 1:
            for i, step in zip(taken, sorted((steps[i] for i in taken), key=lambda s: place[s.span_id or ""][1])):
                out[i] = step
    return out


def _inner_a2a_layer(rec: SpanRecord, spans: dict[str, SpanRecord]) -> bool:
    """One call of a remote agent seen at several layers (the A2A client's span, the server's, the remote agent's
    own `invoke_agent`) is one agent step, the outermost: an agent span whose nearest agent span above is an A2A
    span of the same agent is a layer of that call."""
    above = _place(rec, spans)
    outer = spans.get(above) if above is not None else None
    return outer is not None and "step:a2a" in outer.shapes and outer.agent_name == rec.agent_name


def _agent_step(rec: SpanRecord, call: ToolCallRef | None = None) -> Step:
    """An agent's step; a hand-off is named by the function the model called to hand off, when the trace has it."""
    if call is not None:
        return Step(kind="agent", name=call.name, args=call.args, call_id=call.call_id, error=rec.error, span_id=rec.span_id,
                    start_ns=rec.start_ns, source="tool_span+llm_output")
    name = f"handoff to {rec.handoff_to}" if rec.handoff_to else rec.agent_name or rec.name
    return Step(kind="agent", name=name, error=rec.error, span_id=rec.span_id, start_ns=rec.start_ns)


def assemble(records: list[SpanRecord], task_keys: Iterable[str] = DEFAULT_TASK_KEYS, trajectory_id: str | None = None) -> Trajectory | None:
    """One run's span records (any order, possibly incomplete) as a trajectory; None when it is no run.

    A trace with no steps (LangChain under Traceloop puts a lone `create_agent` span in its own
    trace) is no run, unless it carries plumbline's own run attributes (a trial-status marker).
    `assemble_runs` splits a trace holding several runs first.
    """
    records = _handoff_tools(sorted(records, key=lambda r: (r.start_ns, r.span_id)))
    root = _root(records)
    retried = _retried(records)
    llm = _ids_from_next_request(_merge_llm_calls(_without_preparation([r for r in records if r.step_kind == "llm_call" and r.span_id not in retried]), records))
    handoffs = _handoff_calls(records, llm, {r.tool_name for r in records if r.step_kind == "tool_call"})
    tool_steps, proposal_place = _tool_steps(records, llm, handoffs)
    spans = {r.span_id: r for r in records}
    agents = [_agent_step(a, handoffs.get(a.span_id)) for a in records
              if a.step_kind == "agent" and a is not root and not _inner_a2a_layer(a, spans)]
    order = {r.span_id: i for i, r in enumerate(records)}
    content_seen = any(r.content_captured for r in llm)
    # Parallel calls may start in the same instant (the JS SDK stamps starts to the millisecond): then the
    # order the model proposed them in decides, not the span ids: by call id, or by the proposal a span carried out
    # (OpenInference's LangChain JS writes no ids in the model's flattened tool calls).
    proposed = {c.call_id: c.index for r in llm for c in r.proposed_calls if c.call_id}
    steps = sorted([*tool_steps, *(_llm_step(r, content_seen) for r in llm), *agents, *_event_steps(records)],
                   key=lambda s: (s.start_ns, proposed.get(s.call_id or "", proposal_place.get(s.span_id or "", ("", 0))[1]),
                                  order.get(s.span_id or "", 0)))
    steps = _in_proposal_order(steps, proposal_place)
    final_output = _final_output(root, records, llm)
    steps = _without_answer_calls(steps, final_output)
    context = _context(root, records)
    if not steps and not any(k.startswith(CONTEXT_PREFIX) for k in context):
        return None
    first_llm = next((r for r in sorted(llm, key=lambda r: r.start_ns) if r.input_text), None)
    # A root input of a shape we could not read is kept only when no LLM span has the request.
    root_input = None if "input:unrecognised" in root.shapes else root.input_text
    input_text = root_input or (first_llm.input_text if first_llm else None) or root.input_text
    task_key, source = _task_key(root, records, input_text, task_keys)
    return Trajectory(
        trajectory_id=trajectory_id or root.trace_id,
        trace_id=root.trace_id,
        task_key=task_key,
        task_key_source=source,
        service=root.service_name,
        service_version=root.service_version,
        agent_name=next((r.agent_name for r in records if r.agent_name), None),
        input=input_text,
        final_output=final_output,
        conventions=tuple(sorted({r.convention for r in records if r.convention != "unknown"})),
        steps=tuple(steps),
        start_ns=records[0].start_ns,
        end_ns=max(r.end_ns for r in records),
        context=context,
    )


def _answer_arg(args: Any) -> str | None:
    """The one text a call's arguments carry (`{"response": "…"}`), whitespace-normalised; None for any other."""
    values = list(args.values()) if isinstance(args, dict) else []
    return " ".join(values[0].split()) if len(values) == 1 and isinstance(values[0], str) else None


def _without_answer_calls(steps: list[Step], answer: str | None) -> list[Step]:
    """The steps without the framework's answer tool: a call after the run's last model call whose one argument is the
    run's answer (BeeAI's `final_answer(response=…)`, smolagents' `final_answer(answer=…)`, any framework's), and the
    framework's spans of the same name beside it (BeeAI's AGENT span of the answer's stream). The model hands the
    answer over by calling it; the call ends the run and does nothing of the user's, so it is the answer, not a tool
    call. A call the model made before answering (its result went back to the model) is never one."""
    if not answer:
        return steps
    last_llm = max((i for i, s in enumerate(steps) if s.kind == "llm_call"), default=-1)
    said = " ".join(answer.split())
    names = {s.name for s in steps[last_llm + 1:] if s.kind == "tool_call" and _answer_arg(s.args) == said}
    if not names:
        return steps
    return [s for i, s in enumerate(steps) if i <= last_llm or s.kind not in ("tool_call", "agent") or s.name not in names]


def _run_roots(records: list[SpanRecord]) -> list[SpanRecord]:
    """The spans that each start one run: a conversation's turns, else several root agent spans, else (beneath a
    root that holds no run's request) several top-level agent spans, else the turns the model calls open; [] for
    one run."""
    by_id = {r.span_id: r for r in records}

    def under(rec: SpanRecord, roots: set[str]) -> bool:
        seen = set()
        parent = rec.parent_span_id
        while parent in by_id and parent not in seen:
            if parent in roots:
                return True
            seen.add(parent)
            parent = by_id[parent].parent_span_id
        return False

    turns = [r for r in records if "step:conversation_turn" in r.shapes]
    turn_ids = {t.span_id for t in turns}
    top_turns = [t for t in turns if not under(t, turn_ids)]
    if len(top_turns) > 1:
        return top_turns
    root_agents = [r for r in records if r.step_kind == "agent" and r.parent_span_id not in by_id and not r.handoff_to]
    if len(root_agents) > 1:
        return root_agents
    if any("step:run_root" in r.shapes for r in records):  # a root that holds the run's request is one run
        return []
    # Several agent runs beneath one span that is no run itself: a conversation's turns, an MCP client's
    # connection-lifetime session, a web request's span. Agents inside an agent are its sub-agents.
    agents = {r.span_id for r in records if r.step_kind == "agent" and not r.handoff_to}
    top = [r for r in records if r.span_id in agents and not under(r, agents)]
    return top if len(top) > 1 else _user_turn_roots(records, by_id)


def _user_turn_roots(records: list[SpanRecord], by_id: dict[str, SpanRecord]) -> list[SpanRecord]:
    """A conversation's turns found by their model calls: the first model call of the trace, and each that opens a
    new user turn (normalise marks it `step:new_user_turn`), each start the turn of a run; [] for fewer than two.

    A turn is the outermost span above its first call that holds no other turn's first call: the framework's own
    span of one turn (LangGraph's graph invocation, the OpenAI Agents SDK's run) under the span that holds the
    whole conversation (the app's, or one agent span for it all); with no such span, the call itself, and the
    turn's other spans follow it by start time (`_owner`). An LLM span inside another (one call traced twice) is
    not a turn of its own, nor is one that starts before the turn before it ended its first call (one call traced
    by two instrumentations side by side: Traceloop for Node's LangChain span and its OpenAI span).
    """
    llm = sorted((r for r in records if r.step_kind == "llm_call"), key=lambda r: (r.start_ns, r.span_id))
    firsts: list[SpanRecord] = []
    for i, r in enumerate(llm):
        if i == 0 or ("step:new_user_turn" in r.shapes and r.start_ns >= firsts[-1].end_ns):
            firsts.append(r)
    if len(firsts) < 2:
        return []
    first_ids = {r.span_id for r in firsts}
    holds: dict[str, int] = {}
    chains: list[list[str]] = []
    for first in firsts:
        chain, parent = [first.span_id], first.parent_span_id
        while parent in by_id and parent not in chain:
            chain.append(parent)
            parent = by_id[parent].parent_span_id
        if first_ids.intersection(chain[1:]):
            continue
        for span_id in chain:
            holds[span_id] = holds.get(span_id, 0) + 1
        chains.append(chain)
    if len(chains) < 2:
        return []
    roots = []
    for chain in chains:
        alone = [span_id for span_id in chain if holds[span_id] == 1]
        roots.append(by_id[alone[-1]])
    return roots


def _owner(rec: SpanRecord, by_id: dict[str, SpanRecord], roots: list[SpanRecord], root_ids: set[str],
           starts: list[int]) -> SpanRecord | None:
    """The run a span belongs to: its nearest run-root ancestor, else the run that had started when it did.

    `roots` are sorted by start and `starts` are their start times, so the fallback is a bisection:
    a trace of a long-running agent holds thousands of runs, and a scan per span would be quadratic.
    """
    current: SpanRecord | None = rec
    seen: set[str] = set()
    while current is not None and current.span_id not in seen:
        if current.span_id in root_ids:
            return current
        seen.add(current.span_id)
        current = by_id.get(current.parent_span_id or "")
    started = bisect.bisect_right(starts, rec.start_ns)
    return roots[started - 1] if started else None


def assemble_runs(records: list[SpanRecord], task_keys: Iterable[str] = DEFAULT_TASK_KEYS) -> list[Trajectory]:
    """One trace's span records as its runs' trajectories (usually one); see `iter_runs`."""
    return list(iter_runs(records, task_keys))


def iter_runs(records: list[SpanRecord], task_keys: Iterable[str] = DEFAULT_TASK_KEYS) -> Iterator[Trajectory]:
    """One trace's span records as its runs' trajectories, one run at a time (see `split_runs`).

    A long-running agent's trace holds thousands of runs: a caller that stores each as it comes
    never holds them all.
    """
    for trajectory_id, group in split_runs(records):
        trajectory = assemble(group, task_keys, trajectory_id)
        if trajectory is not None:
            yield trajectory


def split_runs(records: list[SpanRecord]) -> list[tuple[str | None, list[SpanRecord]]]:
    """One trace's span records by run: (trajectory id, the run's records), in run start order.

    Several runs get the id `<trace id>:<root span id>`; a single run keeps the trace id (None
    here), so stores and exports written before traces could hold several runs keep their ids.
    Spans outside every run (the conversation's own root span) belong to none. The split reads
    only ids, parents, start and end times, step kinds, shapes and hand-offs (and links, for records of several
    traces: `join_linked`): the store splits a long trace on those columns alone and loads the rest of
    its spans run by run.
    """
    records = join_linked(records)
    roots = sorted(_run_roots(records), key=lambda r: (r.start_ns, r.span_id))
    if not roots:
        return [(None, records)]
    by_id = {r.span_id: r for r in records}
    groups: dict[str, list[SpanRecord]] = {r.span_id: [] for r in roots}
    root_ids, starts = set(groups), [r.start_ns for r in roots]
    for rec in records:
        owner = _owner(rec, by_id, roots, root_ids, starts)
        if owner is not None:
            groups[owner.span_id].append(rec)
    return [(f"{by_id[span_id].trace_id}:{span_id}", group) for span_id, group in groups.items()]


def join_linked(records: list[SpanRecord]) -> list[SpanRecord]:
    """Records of several traces as one tree (rule 8): the root of a trace that links, with no attribution, to a
    span of another of these traces becomes that span's child. Records of one trace are returned as they are."""
    if not records or all(r.trace_id == records[0].trace_id for r in records):
        return records
    by_id = {r.span_id: r for r in records}
    out = []
    for r in records:
        if r.links and r.parent_span_id not in by_id:
            target = next((link.span_id for link in r.links if link.link_type is None and link.span_id in by_id
                           and link.trace_id != r.trace_id), None)
            if target is not None:
                r = replace(r, parent_span_id=target)
        out.append(r)
    return out
