"""The same step list and diff as the pages, as terminal text (`plumbline show`).

Styling goes through `click.style`; `click.echo` drops it when the output is not a terminal, so
piped output is plain text. Trace values are printed with control characters replaced, so a
hostile value cannot move the cursor or recolour the terminal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

from plumbline_otel.model import Step, Trajectory
from plumbline_otel.report.diff import RunDiff, show_value
from plumbline_otel.report.html import by_step, task_label
from plumbline_otel.report.render import TEXT_WIDTH, wrap_lines

_CONTROL = {c: "?" for c in range(32)} | {9: " ", 10: " ", 13: " ", 127: "?"}  # ESC and friends cannot reach the terminal


def _clean(text: str) -> str:
    return text.translate(_CONTROL)


def _value(value: Any, limit: int = 100) -> str:
    return _clean(show_value(value, limit))


def _step(s: Step | None, width: int) -> str:
    """One side of a diff row, padded to `width` before styling (colour codes take no columns)."""
    if s is None:
        return click.style("—".ljust(width), dim=True)
    outcome = f"✗ {_value(s.error, 30)}" if s.error is not None else "✓"
    text = f"{_clean(s.name)} {outcome} {_value(s.args, width)}"
    text = text[: width - 1] + "…" if len(text) > width else text.ljust(width)
    return click.style(text, fg="red") if s.error is not None else text


def _styled(lines: list[tuple[str, dict[str, Any]]], width: int = TEXT_WIDTH) -> str:
    """Plain lines wrapped to `width` (continuations indented), then each piece styled: colour codes take no columns,
    so the wrapping counts only what the terminal shows."""
    return "\n".join(click.style(piece, **style) if style else piece
                     for text, style in lines for piece in wrap_lines([text], width) or [""])


def task_text(run: Trajectory) -> str:
    """The run's task as a reader knows it: its request text, and its key when it has one (not a hash of the request)."""
    return task_label(run.task_key, run.task_key_source, run.input, 80)


def run_text(run: Trajectory, violations: Sequence[Mapping[str, Any]], width: int = TEXT_WIDTH) -> str:
    """A run as numbered steps, each failed step in red and each violation under the step it broke; no line is longer
    than `width` (long values wrap, indented under their line)."""
    red: dict[str, Any] = {"fg": "red"}
    lines: list[tuple[str, dict[str, Any]]] = [
        (f"run {_clean(run.trajectory_id)}", {"bold": True}),
        (f"  agent {_clean(run.service or '?')}{'@' + _clean(run.service_version) if run.service_version else ''}"
         f"  perturbation {_clean(str(run.context.get('plumbline.perturbation', 'baseline')))}", {}),
        (f"  task {_clean(task_text(run))}", {})]
    if run.input:
        lines.append((f"input: {_value(run.input, 400)}", {}))
    marks = by_step(violations)
    for v in violations:
        if v.get("step_index") is None:
            lines.append((f"✗ {v['severity']} {_clean(v['invariant_id'])}: {_clean(str(v['detail']))}", red))
    for i, s in enumerate(run.steps):
        lines.append((f"{i:>3} {s.kind:<9} {_clean(s.name)}", red if s.error is not None else {}))
        if s.args is not None:
            lines.append((f"      args   {_value(s.args, 400)}", {}))
        if s.result is not None:
            lines.append((f"      result {_value(s.result, 400)}", {"dim": True}))
        if s.error is not None:
            lines.append((f"      error  {_value(s.error, 400)}", red))
        for v in marks.get(i, []):
            lines.append((f"      ✗ {v['severity']} {_clean(v['invariant_id'])} broke here: {_clean(str(v['detail']))}",
                          {"fg": "red", "bold": True}))
    if run.final_output:
        lines.append((f"output: {_value(run.final_output, 400)}", {}))
    return _styled(lines, width)


def diff_text(d: RunDiff, width: int = 56) -> str:
    """Two runs' tool calls side by side; the first divergence flagged, skipped/extra/substituted marked. Rows are
    two `width` columns wide (fitting `TEXT_WIDTH` at the default); the other lines wrap to `TEXT_WIDTH`."""
    head = _styled([(f"A {_clean(d.a.trajectory_id[:16])} {_clean(d.a.service or '?')}   vs   "
                     f"B {_clean(d.b.trajectory_id[:16])} {_clean(d.b.service or '?')}", {"bold": True}),
                    (f"task {_clean(task_text(d.a))}", {}),
                    ("same tool calls, same arguments" if d.identical else f"first divergence at row {d.first}", {})])
    lines = [head]
    for r in d.rows:
        flag = click.style(">>", fg="red", bold=True) if r.first_divergence else "  "
        label = r.label if r.column == "same" and not r.arg_differences else click.style(r.label, fg="yellow")
        lines.append(f"{flag} {_step(r.a, width)} | {_step(r.b, width)} [{label}]")
        if r.arg_differences:
            lines.append(_styled([(f"     {_clean(diff)}", {"fg": "yellow"}) for diff in r.arg_differences]))
    return "\n".join(lines)


__all__ = ["diff_text", "run_text", "task_text"]
