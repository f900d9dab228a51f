"""Hand-built runs for testing a spec without a store: `call(...)` steps into `run(...)`.

    t = run(call("check_vendor_status"), call("schedule_payment", {"amount": 4820}), task="INV-1")
    spec.evaluate(t, {"payable_amount": 4820})
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from plumbline_otel.model import Step, Trajectory
from plumbline_otel.runs import RECORD_MAC, TASK_KEY
from plumbline_otel.trials import KeyRing, record_mac

# The key of a simulated replay driver's study state (instance ""), for hand-built records: `signed`.
TEST_KEY = "5e" * 32
TEST_KEYS = KeyRing.of("", TEST_KEY)

_ids = itertools.count(1)


def call(name: str, args: Any = None, result: Any = None, error: str | None = None, **fields: Any) -> Step:
    """A tool-call step; pass `error` for a failed call."""
    return Step(kind="tool_call", name=name, args={} if args is None else args, result=result, error=error, **fields)


def llm(model: str = "model", **fields: Any) -> Step:
    """A model-call step (invariants look only at tool calls)."""
    return Step(kind="llm_call", name=model, model=model, **fields)


def run(
    *steps: Step,
    task: str | None = "task-1",
    id: str | None = None,
    service: str | None = "agent",
    version: str | None = None,
    start_ns: int = 0,
    input: str | None = None,
    **context: Any,
) -> Trajectory:
    """A trajectory of `steps` (ids run-000001, … unless given); dotted context keys use "__".

    ``run(..., plumbline__perturbation="paraphrase")`` sets ``plumbline.perturbation``.
    """
    ctx = {k.replace("__", "."): v for k, v in context.items()}
    if id is None:
        id = f"run-{next(_ids):06d}"
    timed = tuple(
        s if s.start_ns else replace(s, start_ns=start_ns + i + 1) for i, s in enumerate(steps)
    )
    return Trajectory(
        trajectory_id=id,
        trace_id=id.rjust(32, "0")[:32],
        task_key=task,
        task_key_source="attribute:test",
        service=service,
        service_version=version,
        agent_name=None,
        input=input,
        final_output=None,
        conventions=("genai",),
        steps=timed,
        start_ns=start_ns,
        end_ns=start_ns + len(steps) + 1,
        context=ctx,
    )


def signed(record: Trajectory, key: str = TEST_KEY) -> Trajectory:
    """`record` (a hand-built driver's record) with the MAC the driver would have written under `key` (`TEST_KEYS` verifies it)."""
    record.context[RECORD_MAC] = record_mac(key, record.context, record.service, record.service_version)
    return record


def span_records(trajectory: Trajectory) -> list[Any]:
    """The span records a traced run like `trajectory` would have sent (an agent root, one child per step).

    For tests and benches that go through the real store: ``store.write_spans(span_records(t))``
    then ``store.assemble()``. The stored run's id is its trace id, derived from the trajectory id.
    """
    import hashlib

    from plumbline_otel.model import SpanRecord

    trace_id = trajectory.trace_id if len(trajectory.trace_id) == 32 and trajectory.trace_id.isalnum() else ""
    trace_id = trace_id or hashlib.sha256(trajectory.trajectory_id.encode()).hexdigest()[:32]
    attrs = dict(trajectory.context)
    if trajectory.task_key is not None:
        attrs[TASK_KEY] = trajectory.task_key
    base = trajectory.start_ns or 1_700_000_000_000_000_000
    root = SpanRecord(
        trace_id=trace_id, span_id=f"{1:016x}", parent_span_id=None, name="invoke_agent",
        start_ns=base, end_ns=base + len(trajectory.steps) + 2, service_name=trajectory.service,
        service_version=trajectory.service_version, step_kind="agent", agent_name=trajectory.agent_name,
        convention="genai", attributes=attrs, input_text=trajectory.input,
    )
    records = [root]
    for i, step in enumerate(trajectory.steps):
        records.append(SpanRecord(
            trace_id=trace_id, span_id=f"{i + 2:016x}", parent_span_id=root.span_id, name=step.name,
            start_ns=base + i + 1, end_ns=base + i + 1, status_code=2 if step.error else 0,
            service_name=trajectory.service, service_version=trajectory.service_version, convention="genai",
            step_kind=step.kind, tool_name=step.name if step.kind == "tool_call" else None,
            model=step.model if step.kind == "llm_call" else None, call_id=step.call_id, args=step.args,
            args_state="structured" if step.args is not None else "absent", result=step.result, error=step.error,
        ))
    return records
