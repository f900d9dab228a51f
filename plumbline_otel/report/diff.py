"""Two runs side by side: their tool steps aligned, the first divergence and the argument differences.

The alignment is the project's one Needleman–Wunsch (`analyse.align`), over tool calls only: LLM
turns differ in number between architectures and would push every tool step out of line. Paired
steps with the same tool have their arguments compared by the typed rules every analysis uses
(`analyse.compare_values`), so "amount 285000.00 vs 28500.00" says "10× too large" here as it does
in a violation. Plain data out; the HTML and terminal renderers only lay it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plumbline_otel.analyse.align import Column, align
from plumbline_otel.compare_values import Rule, compare, to_number
from plumbline_otel.model import Step, Trajectory


@dataclass(frozen=True)
class DiffRow:
    """One aligned column: the step of each run (None on the gap side) and what differs."""

    column: Column
    a: Step | None
    b: Step | None
    a_index: int | None  # index into the run's full step list, for links and violation markers
    b_index: int | None
    arg_differences: tuple[str, ...] = ()
    first_divergence: bool = False

    @property
    def label(self) -> str:
        """How the column reads: same, skipped (only in A), extra (only in B), substituted, or args differ."""
        if self.column == "same" and self.arg_differences:
            return "arguments differ"
        return {"same": "same", "skipped": "only in A", "extra": "only in B", "substituted": "substituted"}[self.column]


@dataclass(frozen=True)
class RunDiff:
    """The aligned tool steps of runs A and B; `first` is the first row that is not identical."""

    a: Trajectory
    b: Trajectory
    rows: tuple[DiffRow, ...]
    first: int | None

    @property
    def identical(self) -> bool:
        """Same tools in the same order with the same arguments and outcomes."""
        return self.first is None


def _arg_differences(a: Step, b: Step) -> tuple[str, ...]:
    """Typed differences of two calls of the same tool (B read against A), each naming its argument."""
    if a.args == b.args:
        return ()
    return tuple(d.detail for d in compare(a.args, b.args, _numbers_as_numbers(a.args, b.args)).differences)


def _numbers_as_numbers(a: Any, b: Any) -> Rule | None:
    """Compare an argument as a number when both sides read as one ("28500.00" and 285000): traces
    often carry amounts as strings, and "10× too large" is the difference a reader needs."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    numeric = {k: Rule(type="number") for k in a.keys() & b.keys()
               if not isinstance(a[k], bool) and not isinstance(b[k], bool) and to_number(a[k]) is not None and to_number(b[k]) is not None}
    return Rule(type="dict", fields=numeric) if numeric else None


def _outcome_differs(a: Step, b: Step) -> bool:
    return (a.error is None) != (b.error is None)


def diff_runs(a: Trajectory, b: Trajectory) -> RunDiff:
    """Align A's and B's tool calls and mark where they part ways."""
    index_a = [i for i, s in enumerate(a.steps) if s.kind == "tool_call"]
    index_b = [i for i, s in enumerate(b.steps) if s.kind == "tool_call"]
    alignment = align([a.steps[i] for i in index_a], [b.steps[i] for i in index_b])
    rows: list[DiffRow] = []
    first: int | None = None
    for (ia, ib), column in zip(alignment.pairs, alignment.columns):
        sa = a.steps[index_a[ia]] if ia is not None else None
        sb = b.steps[index_b[ib]] if ib is not None else None
        args = _arg_differences(sa, sb) if sa is not None and sb is not None and column == "same" else ()
        differs = column != "same" or bool(args) or (sa is not None and sb is not None and _outcome_differs(sa, sb))
        if differs and first is None:
            first = len(rows)
        rows.append(DiffRow(column, sa, sb, index_a[ia] if ia is not None else None,
                            index_b[ib] if ib is not None else None, args, differs and first == len(rows)))
    return RunDiff(a, b, tuple(rows), first)


def show_value(value: Any, limit: int = 160) -> str:
    """A step's arguments or result as one line of text (JSON where it is structured), cut at `limit`."""
    import orjson

    if value is None:
        return ""
    text = value if isinstance(value, str) else orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = ["DiffRow", "RunDiff", "diff_runs", "show_value"]
