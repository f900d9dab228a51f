"""The one HTML renderer: Jinja2 templates (autoescaped) over what `data` gathered.

Every value that came from a trace (tool names, arguments, results, errors, task keys) is
untrusted text: templates never mark anything safe, autoescaping is on for every template, and
the only markup built in Python is the chart's geometry (numbers). Pages carry their CSS inline
and make no network request, so a written report opens offline and the console needs no assets.

Certificates are read defensively: a cell field newer than the reader (``gate_lower``,
``exposed``, ``pass_k``, ...) is shown when present and left out when not.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import jinja2

from plumbline_otel import __version__
from plumbline_otel.report.diff import show_value
from plumbline_otel.report.render import headline_sentence

CHART_WIDTH = 420  # px of the [0, 1] axis


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


def _x(value: float | None) -> float:
    return round(CHART_WIDTH * min(1.0, max(0.0, value or 0.0)), 1)


def _gate(cell: dict[str, Any]) -> tuple[float, float, str]:
    """The interval the gate uses (a certificate `load_certificate` accepted always has it)."""
    return cell["gate_lower"], cell["gate_upper"], str(cell["gate_method"])


def counts_text(cell: dict[str, Any]) -> str:
    """n and the exposed / unexposed / errored / missing counts a cell has (only those it reports)."""
    parts = [f"n={cell['n']}"]
    for name in ("exposed", "unexposed", "errored", "missing", "tasks"):
        if isinstance(cell.get(name), int):
            parts.append(f"{name} {cell[name]}")
    return ", ".join(parts)


def chart_rows(cert: dict[str, Any]) -> list[ChartRow]:
    """The chart's rows, lowest gate bound first (the cells that drag the headline down on top)."""
    setters = {(c["agent"], c["perturbation"]) for c in cert["headline"].get("cells", [])}
    rows = []
    for agent in cert["agents"]:
        for cell in agent["perturbations"]:
            lo, hi, method = _gate(cell)
            rate = cell.get("rate")
            tip = (f"{cell['agent']} / {cell['perturbation']}: rate {_pct(rate)}; Wilson [{_pct(cell['lower'])}, {_pct(cell['upper'])}]; "
                   f"{method} [{_pct(lo)}, {_pct(hi)}]; {counts_text(cell)}")
            rows.append(ChartRow(cell["agent"], cell["perturbation"], None if rate is None else _x(rate),
                                 (_x(cell["lower"]), _x(cell["upper"])), (_x(lo), _x(hi)), method,
                                 (cell["agent"], cell["perturbation"]) in setters, tip))
    return sorted(rows, key=lambda r: (r.gate[0], r.agent, r.perturbation))


def _pct(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}%"


def _when(ns: int | None) -> str:
    if not ns:
        return ""
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def anchor(text: str, prefix: str) -> str:
    """An element id for a run or a diff: trace ids are untrusted text, so ids are a hash of them."""
    return f"{prefix}-{hashlib.sha256(str(text).encode()).hexdigest()[:16]}"


def by_step(violations: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Violations keyed by the index of the step that broke them (those without a step are left out)."""
    out: dict[int, list[dict[str, Any]]] = {}
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
    env.filters.update(pct=_pct, when=_when, value=show_value, counts=counts_text, anchor=anchor, by_step=by_step)
    env.globals.update(version=__version__, chart_width=CHART_WIDTH, headline_sentence=headline_sentence)
    return env


_ENV = _environment()


def render(template: str, href: Callable[..., str], **context: Any) -> str:
    """Render one page. `href(kind, **params)` makes links: anchors in a report file, URLs in the console."""
    return _ENV.get_template(template).render(href=href, **context)


__all__ = ["CHART_WIDTH", "ChartRow", "anchor", "by_step", "chart_rows", "counts_text", "render"]
