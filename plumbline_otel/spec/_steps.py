"""Step look-ups the invariant kinds share: calls by tool, argument and result fields.

A failed call did not happen: `calls()` returns successful tool calls unless asked for failed
ones too. A hand-off is a call too: the model calls `transfer_to_refunds` as it calls a tool, and
"never hand off to refunds before checking eligibility" is an ordering of two calls, so every kind
that names a tool names a hand-off by the name its agent step shows (`transfer_to_refunds`, or
`handoff to refunds` where the trace has no call of the model's for it). The per-trajectory index is memoised for the trajectory last seen, because a spec's
invariants are evaluated one trajectory at a time and each asks for the same index.
"""

from __future__ import annotations

import json
from typing import Any

from plumbline_otel.model import REDACTED, Step, Trajectory

UNAVAILABLE = object()  # the value was not captured (args absent, unparsed or redacted)
MISSING = object()  # the value was captured and the field is not there


class _Index:
    __slots__ = ("ok", "all")

    def __init__(self, trajectory: Trajectory) -> None:
        self.ok: dict[str, list[int]] = {}
        self.all: dict[str, list[int]] = {}
        for i, step in enumerate(trajectory.steps):
            if step.kind != "tool_call" and not is_handoff(step):
                continue
            self.all.setdefault(step.name, []).append(i)
            if step.error is None:
                self.ok.setdefault(step.name, []).append(i)


_HANDOFF_NAMES = ("handoff to ", "transfer_to_", "handoff_to_")


def is_handoff(step: Step) -> bool:
    """An agent step that hands the run to another agent: the model's own call of the framework's hand-off function
    (assembly names it so and gives it the call's id and arguments), or `handoff to X` where no call was seen."""
    return step.kind == "agent" and (step.source == "tool_span+llm_output" or step.name.startswith(_HANDOFF_NAMES))


_memo: tuple[Trajectory, _Index] | None = None


def _index(trajectory: Trajectory) -> _Index:
    global _memo
    memo = _memo
    if memo is not None and memo[0] is trajectory:
        return memo[1]
    index = _Index(trajectory)
    _memo = (trajectory, index)
    return index


def calls(trajectory: Trajectory, tool: str, include_failed: bool = False) -> list[int]:
    """Indices (into ``trajectory.steps``) of the calls of `tool`, in order."""
    index = _index(trajectory)
    return (index.all if include_failed else index.ok).get(tool, [])


def _structured(payload: Any) -> Any:
    if payload is None or payload == REDACTED:
        return UNAVAILABLE
    if isinstance(payload, str):
        text = payload.strip()
        if text[:1] in "{[":
            try:
                return json.loads(text)
            except ValueError:
                return UNAVAILABLE
        return UNAVAILABLE
    return payload


def field_of(payload: Any, name: str) -> Any:
    """`name` in a captured payload (a dotted path reaches into nested objects).

    Returns UNAVAILABLE when the payload was not captured (or is not an object), MISSING when it
    was captured without that field.
    """
    data = _structured(payload)
    if data is UNAVAILABLE or not isinstance(data, dict):
        return UNAVAILABLE
    if name in data:
        return UNAVAILABLE if data[name] == REDACTED else data[name]
    node: Any = data
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return UNAVAILABLE if node == REDACTED else node


def arg(step: Step, name: str) -> Any:
    """The argument `name` of a step; UNAVAILABLE or MISSING as in `field_of`."""
    return field_of(step.args, name)
