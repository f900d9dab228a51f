"""The one HTML renderer: Jinja2 templates (autoescaped) over what `data` gathered.

Every value that came from a trace (tool names, arguments, results, errors, task keys) is
untrusted text: templates never mark anything safe, autoescaping is on for every template, and
the only markup built in Python is the chart's geometry (numbers). Pages carry their CSS inline
and make no network request, so a written report opens offline and the console needs no assets.

Certificates reach a page as the typed model (`report.model.Certificate`), read and validated once
by whoever loaded or built it; templates read its attributes, never a certificate's JSON keys.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import jinja2

from plumbline_otel import __version__
from plumbline_otel.report.diff import show_value
from plumbline_otel.report.model import Cell, CellRef, Certificate, PassKPoint
from plumbline_otel.report.render import headline_sentence, unattributed_lines

CHART_WIDTH = 420  # px of the [0, 1] axis

# One line per term a page shows: on hover (title) where the term appears, and in the glossary section.
GLOSSARY: dict[str, str] = {
    "verdict": "PASS: every cell's lower bound reaches the target; FAIL: some cell's upper bound is below it; "
               "INCONCLUSIVE: the evidence does neither yet. A wrong PASS and a wrong FAIL are each at most 5% likely.",
    "bound": "The gate's 95% lower bound: with 95% confidence, at least this share of runs of tasks like these break no "
             "critical invariant, in the worst agent x perturbation cell.",
    "wilson_tasks": "The gate's method: a Wilson score bound on the mean of per-task conformance rates, counting tasks (not runs) as n.",
    "betting_cs": "The gate's method for a study that stopped when its answer was known: an anytime-valid betting confidence "
                  "sequence on the mean of per-task rates.",
    "wilson": "Wilson 95% interval over runs, as if every run were independent (repeats of one task are not): shown for comparison.",
    "cell": "One agent under one perturbation: the unit the bound is computed for.",
    "n": "Runs scored: exposed runs judged against the spec plus errored trials (which count as failures).",
    "exposed": "Runs that met their perturbation (a faulted trial only when the fault was seen to reach the agent).",
    "unexposed": "Faulted trials whose fault never reached the agent: listed, never scored.",
    "errored": "Trials where the agent crashed, hung, exited non-zero or left no trace: in n, scored as failures.",
    "missing": "Trials that never reached the agent (spend cap, interrupted, refused): beside n, never in it.",
    "tasks": "Distinct tasks in the cell: the bound counts tasks, so more repeats of the same task add little.",
    "tasks_needed": "How many more distinct clean tasks would settle the target if the study continues as a sequential "
                    "study (replay --resume --target), whose bound stays valid at every look; adding tasks to a fixed-n "
                    "study and gating it again does not keep its stated 5%.",
    "pass_k": "pass^k: the chance that all k repeats of a task conform (k = the fewest repeats of any task), averaged over tasks.",
    "pass_k_curve": "pass^k for every k from 1 to the most repeats: how fast reliability falls when a task must succeed every time.",
    "flip_rate": "Flip rate: the share of repeated tasks whose repeats disagree (some conform, some do not).",
    "conforming": "Judged against the spec and broke no invariant.",
    "violating": "Judged against the spec and broke the invariants named.",
    "not_checked": "Not judged against any spec yet.",
    "unwitnessed": "Claims a trial of a recorded study that no driver record stands for: never scored.",
}


@dataclass(frozen=True)
class ChartRow:
    """One cell of the interval chart, as pixel positions on the [0, 1] axis."""

    agent: str
    perturbation: str
    point: float | None  # x of the observed rate
    wilson: tuple[float, float]
    gate: tuple[float, float]
    gate_method: str
    sets_headline: bool
    tip: str  # the hover text: rate, both intervals, every count
    label: str = ""  # shown beside the row: verdict, conforming/n, tasks


def _x(value: float | None) -> float:
    return round(CHART_WIDTH * min(1.0, max(0.0, value or 0.0)), 1)


def counts_text(cell: Cell | CellRef) -> str:
    """n and the exposed / unexposed / errored / missing counts and the tasks of a cell."""
    return (f"n={cell.n}, exposed {cell.exposed}, unexposed {cell.unexposed}, errored {cell.errored}, missing {cell.missing}, "
            f"tasks {cell.tasks}")


def chart_rows(cert: Certificate) -> list[ChartRow]:
    """The chart's rows, lowest gate bound first (the cells that drag the headline down on top)."""
    setters = {(c.agent, c.perturbation) for c in cert.headline.cells}
    rows = []
    for cell in cert.cells:
        lo, hi, method, rate = cell.gate_lower, cell.gate_upper, cell.gate_method, cell.rate
        tip = (f"{cell.agent} / {cell.perturbation}: rate {_pct(rate)}; Wilson [{_pct(cell.lower)}, {_pct(cell.upper)}]; "
               f"{method} [{_pct(lo)}, {_pct(hi)}]; {counts_text(cell)}")
        rows.append(ChartRow(cell.agent, cell.perturbation, None if rate is None else _x(rate),
                             (_x(cell.lower), _x(cell.upper)), (_x(lo), _x(hi)), method,
                             (cell.agent, cell.perturbation) in setters, tip,
                             f"{cell.verdict} {cell.conforming}/{cell.n}, {cell.tasks} tasks"))
    return sorted(rows, key=lambda r: (r.gate[0], r.agent, r.perturbation))


def _pct(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}%"


def _duration(ns: int | None) -> str:
    if ns is None or ns < 0:
        return ""
    if ns < 1_000_000:
        return f"{ns / 1000:.0f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.1f} ms"
    return f"{ns / 1e9:.2f} s"


def _money(value: float | None) -> str:
    return "" if value is None else (f"${value:.4f}" if value < 1 else f"${value:.2f}")


@dataclass(frozen=True)
class CurvePoint:
    """One k of a pass^k curve, as pixel positions."""

    k: int
    x: float
    y: float
    lower_y: float
    upper_y: float
    tip: str


def pass_k_points(curve: Sequence[PassKPoint], width: int = 220, height: int = 90) -> list[CurvePoint]:
    """A cell's `pass_k_curve` as points of a small chart: k across, pass^k up (0 at the bottom, 1 at the top)."""
    points = [p for p in curve if p.estimate is not None]
    if not points:
        return []
    most = max(p.k for p in points)

    def y(v: float | None) -> float:
        return round(height * (1 - min(1.0, max(0.0, v or 0.0))), 1)

    out = []
    for p in points:
        x = round(width * ((p.k - 1) / (most - 1) if most > 1 else 0.5), 1)
        tip = f"pass^{p.k} {_pct(p.estimate)}, 95% [{_pct(p.lower)}, {_pct(p.upper)}] over {p.tasks} task(s)"
        out.append(CurvePoint(p.k, x, y(p.estimate), y(p.lower), y(p.upper), tip))
    return out


HASHED_TASK = "input:"  # a task key made from the request (no task key was set): a hash a reader cannot read


def task_is_hashed(key: str | None, source: str | None = None) -> bool:
    """True when the task key is only a hash of the request (`input:…`), so the request is the task's name."""
    return source == "input_hash" or (source is None and bool(key) and str(key).startswith(HASHED_TASK))


def task_label(key: str | None, source: str | None, request: str | None, limit: int = 80) -> str:
    """A task as a reader knows it: its request text (cut at `limit`), with its key when one was set; the hash of the
    request only when there is no request text to show."""
    text = " ".join(str(request).split()) if request else ""
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    if not key:
        return f"“{text}”" if text else "(no task)"
    if task_is_hashed(key, source):
        return f"“{text}”" if text else str(key)
    return f"“{text}” ({key})" if text else str(key)


def _when(ns: int | None) -> str:
    if not ns:
        return ""
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def anchor(text: str, prefix: str) -> str:
    """An element id for a run or a diff: trace ids are untrusted text, so ids are a hash of them."""
    return f"{prefix}-{hashlib.sha256(str(text).encode()).hexdigest()[:16]}"


def by_step(violations: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    """Violations keyed by the index of the step that broke them (those without a step are left out)."""
    out: dict[int, list[Mapping[str, Any]]] = {}
    for v in violations:
        if v.get("step_index") is not None:
            out.setdefault(v["step_index"], []).append(v)
    return out


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("plumbline_otel.report", "templates"),
        autoescape=True,  # every template, whatever its name: trace values are untrusted
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(pct=_pct, when=_when, value=show_value, counts=counts_text, anchor=anchor, by_step=by_step, duration=_duration,
                       money=_money, curve=pass_k_points, hashed_task=task_is_hashed)
    env.globals.update(task_label=task_label, version=__version__, chart_width=CHART_WIDTH, headline_sentence=headline_sentence, gloss=GLOSSARY,
                       unattributed_lines=unattributed_lines)
    return env


_ENV = _environment()


def render(template: str, href: Callable[..., str], **context: Any) -> str:
    """Render one page. `href(kind, **params)` makes links: anchors in a report file, URLs in the console."""
    return _ENV.get_template(template).render(href=href, **context)


__all__ = ["CHART_WIDTH", "GLOSSARY", "ChartRow", "CurvePoint", "pass_k_points", "anchor", "by_step", "chart_rows", "counts_text", "render", "task_is_hashed",
           "task_label"]
