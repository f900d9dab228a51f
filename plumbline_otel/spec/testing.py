"""Hand-built runs for testing a spec without a store: `call(...)` steps into `run(...)`.

    t = run(call("check_vendor_status"), call("schedule_payment", {"amount": 4820}), task="INV-1")
    spec.evaluate(t, {"payable_amount": 4820})
"""

from __future__ import annotations

import itertools
from typing import Any

from plumbline_otel.model import Step, Trajectory


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
    **context: Any,
) -> Trajectory:
    """A trajectory of `steps` (ids run-000001, … unless given); dotted context keys use "__".

    ``run(..., plumbline__perturbation="paraphrase")`` sets ``plumbline.perturbation``.
    """
    ctx = {k.replace("__", "."): v for k, v in context.items()}
    if id is None:
        id = f"run-{next(_ids):06d}"
    timed = tuple(
        s if s.start_ns else Step(**{**s.__dict__, "start_ns": start_ns + i + 1}) for i, s in enumerate(steps)
    )
    return Trajectory(
        trajectory_id=id,
        trace_id=id.rjust(32, "0")[:32],
        task_key=task,
        task_key_source="attribute:test",
        service=service,
        service_version=version,
        agent_name=None,
        input=None,
        final_output=None,
        conventions=("genai",),
        steps=timed,
        start_ns=start_ns,
        end_ns=start_ns + len(steps) + 1,
        context=ctx,
    )
