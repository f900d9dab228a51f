"""A branch-point study's cells (`replay --branch-at`: ``tool_fault@k``) read as a profile over steps in the text certificate."""

from __future__ import annotations

from typing import Any

from plumbline_otel.report import build_certificate, render_text
from plumbline_otel.spec import MustCall, Spec, invariant
from plumbline_otel.spec.testing import TEST_KEYS, call, run, signed

SPEC = Spec.of("profile", [invariant("PAY", MustCall("pay"))])


def trial(step: int, task: str, pays: bool) -> list[Any]:
    """A planned trial at branch point `step`, its attempt record (the fault seen to fire) and its run (simulated driver)."""
    trial_id = f"s/{task}/tool_fault@{step}/0/k0"
    ctx: dict[str, Any] = dict(plumbline__study="s", plumbline__trial__id=trial_id, plumbline__task__key=task,
               plumbline__perturbation=f"tool_fault@{step}", plumbline__fault__planned="lookup:503:1:1")
    agent_run = run(call("lookup"), *([call("pay")] if pays else []), id=f"run-{task}-{step}", task=task, service="ap")
    plan = signed(run(id=f"plan-{task}-{step}", task=None, service="ap", plumbline__record__kind="plan", **ctx))
    attempt = signed(run(id=f"att-{task}-{step}", task=None, service="ap", plumbline__record__kind="attempt",
                         plumbline__trial__attempt=1, plumbline__trial__status="ok", plumbline__trial__trace_id=agent_run.trace_id,
                         plumbline__fault__fired=True, plumbline__fault__source="mcp_proxy", **ctx))
    return [plan, attempt, agent_run]


def test_branch_point_cells_read_as_a_profile_over_steps() -> None:
    runs = [t for task in ("T1", "T2", "T3") for step, pays in ((2, True), (4, task == "T1")) for t in trial(step, task, pays)]
    text = render_text(build_certificate(SPEC, runs, keys=TEST_KEYS))
    profile = next(line for line in text.splitlines() if "profile over steps" in line)
    assert "tool_fault" in profile and profile.index("@2 3/3") < profile.index("@4 1/3")  # in step order, where it falls
