"""Pages: the self-contained report file, and the pieces the console serves, from one reader of the store.

`report_html` gathers everything a report shows (headline, chart, cells, violations, coverage,
consistency and equivalence, a few diffs and the runs they link to) and renders it once; the
report links to runs by in-page anchors, so the file stands alone. `write_report` is the one call
`plumbline report` and `plumbline demo` make.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import plumbline_otel.report.data as data
from plumbline_otel.analyse.consistency import consistency, summarise
from plumbline_otel.analyse.equivalence import equivalence
from plumbline_otel.coverage import coverage_report
from plumbline_otel.model import Trajectory
from plumbline_otel.report.diff import RunDiff, diff_runs
from plumbline_otel.report.html import anchor, chart_rows, render
from plumbline_otel.report.model import Certificate
from plumbline_otel.store import Reader, RunFilters, ViolationSummary

WINDOW_RUNS = 2000  # consistency and equivalence look at this many most recent runs, whatever the store's size
_DIFFS = 3
_RUNS_SHOWN = 40


def advice(store: Reader, source: str, api: str | None = None, served: bool = False, token: bool = False,
           check_spec: str | None = None) -> dict[str, Any]:
    """What has been checked, and the exact commands that fill an empty page from where the reader is.

    A served console names its own gRPC address (`--server`, which keeps the results in the served
    store); a report file names its store file (`--db`) and says to write the report again. A server
    with no gRPC port cannot be reached by a command: the advice says so (no circular advice).
    """
    checks = store.checks_done()
    spec = checks[0]["spec_path"] if checks and checks[0]["spec_path"] else (check_spec or "SPEC.yaml")
    note = None
    if served and api:
        host, _, port = api.rpartition(":")
        where = f"--server {'127.0.0.1' if host in ('', '0.0.0.0', '[::]', '::') else host}:{port}"
        if token:
            note = "with PLUMBLINE_AUTH_TOKEN set to this server's bearer token"
        then = None
    elif served:
        where, then = None, None
        note = ("this server has no gRPC port, so no command can reach its store: restart it with "
                "receivers.otlp.protocols.grpc.endpoint set (default 127.0.0.1:4317), or with --check-spec SPEC.yaml")
    else:
        where, then = f"--db {source}", f"plumbline report --db {source} --cert cert.json --out report.html"
    return {
        "checks": checks, "note": note, "then": then, "standing": check_spec if served else None,
        "check": f"plumbline check --spec {spec} {where}" if where else None,
        "certify": f"plumbline certify --spec {spec} {where} --out cert.json" if where else None,
    }


def timeline_view(store: Reader, run: Trajectory) -> dict[str, Any]:
    """The run page's extras: the span waterfall with messages, tokens and cost, and another run of its task to diff against."""
    return {"timeline": data.run_timeline(store, run), "other": data.other_run(store, run)}


def file_href(embedded: dict[str, str]) -> Callable[..., str]:
    """Links inside a report file: to the embedded run (`embedded` maps any id used for it to its
    trajectory id), to the list of runs for one that is not embedded, to the diffs otherwise."""
    def href(kind: str, **params: Any) -> str:
        if kind == "run":
            target = embedded.get(str(params["id"]))
            return "#" + anchor(target, "run") if target else "#runs"
        return "#diffs"

    return href


def agreement(runs: list[Trajectory]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Consistency over `runs`, and equivalence of every pair of agents that ran a shared task."""
    summary = summarise(consistency(runs))
    agents = sorted({t.service for t in runs if t.service})
    reports = [equivalence(runs, a, b).as_dict() for a, b in itertools.combinations(agents, 2)]
    return summary, [r for r in reports if r["runs"]]


def example_diffs(store: Reader, limit: int = _DIFFS, study: str | None = None) -> list[RunDiff]:
    """Up to `limit` diffs of two agents on one task and variant (of one study's runs when given): divergent ones
    first, and among those the ones that part ways right after a failed call (a retry against no retry)."""
    found: list[RunDiff] = []
    for c in store.diff_candidates(limit=4 * limit, study=study):
        services = [s for s in c["services"] if s]
        if len(services) < 2:
            continue
        pair = data.pair_on_task(store, c["task_key"], services[1], services[0], c["perturbation"], study=study)
        if pair is not None:
            found.append(diff_runs(*pair))
    found.sort(key=lambda d: (d.identical, not _after_a_failure(d)))  # stable: candidate order kept within
    return found[:limit]


def _after_a_failure(d: RunDiff) -> bool:
    """True when the runs part ways right after a failed call: how each handled the error is the story."""
    if d.first is None or d.first == 0:
        return False
    before = d.rows[d.first - 1]
    return any(s is not None and s.error is not None for s in (before.a, before.b))


def spec_violations(store: Reader, cert: Certificate | None, study: str | None = None) -> list[ViolationSummary]:
    """Violations stored under the certificate's spec; all stored ones when none match (or no certificate); of one
    study's runs when `study` is given."""
    if cert is not None:
        mine = store.violations_summary(cert.spec.hash, study=study)
        if mine:
            return mine
    return store.violations_summary(study=study)


def report_study(cert: Certificate | None, study: str | None) -> str | None:
    """The study a report is of: the one asked for, else the certificate's (a certificate of one study's runs makes
    a report of those runs, so no section counts runs the headline did not). Two different ones are an InputError."""
    from plumbline_otel.errors import InputError

    certified = cert.provenance.filters.study if cert is not None else None
    if study is not None and certified is not None and certified != study:
        raise InputError(f"the certificate is of study {certified!r}, not {study!r}: certify study {study!r} or leave --study out")
    return study if study is not None else certified


def study_coverage(store: Reader, study: str) -> dict[str, Any]:
    """Coverage over one study's runs and records and their spans: copied into a store in memory (through the store's
    own writes) so the coverage report reads exactly them."""
    from plumbline_otel.store import Store

    spans, runs = store.study(study)
    with Store(":memory:") as scoped:
        scoped.write_span_table(spans)
        scoped.add_trajectories(runs)
        return coverage_report(scoped)

def report_html(store: Reader, cert: Certificate | None, source: str, coverage: dict[str, Any] | None = None,
                study: str | None = None) -> str:
    """The whole report as one HTML document; `coverage` replaces the store's own (a served store's, read over the API,
    or one study's). With `study` (or a certificate of one study), every section holds that study's runs only."""
    study = report_study(cert, study)
    violations = spec_violations(store, cert, study)
    diffs = example_diffs(store, study=study)
    shown: dict[str, None] = {}
    for d in diffs:
        shown.update({d.a.trajectory_id: None, d.b.trajectory_id: None})
    for v in violations:
        shown.update({e["trajectory_id"]: None for e in v["examples"]})
    if cert is not None:
        for cell in cert.cells:
            shown.update({e.run: None for e in cell.errored_runs})
    loaded = {i: store.load_run(i) for i in itertools.islice(shown, _RUNS_SHOWN)}
    runs = [(r, store.run_violations(r.trajectory_id)) for r in loaded.values() if r is not None]
    embedded = {i: r.trajectory_id for i, r in loaded.items() if r is not None}
    recent = store.recent_runs(WINDOW_RUNS, study=study)
    summary, equivalences = agreement(recent)
    totals: dict[str, Any] = dict(store.totals(study))
    coverage_note = None
    if coverage is not None:  # runs read from servers (copied into memory without their spans): the servers' figures
        coverage_note = "every server's traffic, not only this study's" if study else None
        totals["spans"] = None if study else coverage.get("overall", {}).get("spans", {}).get("spans", totals["spans"])
    else:
        coverage = study_coverage(store, study) if study else coverage_report(store)
    return render(
        "report.html", file_href(embedded),
        cert=cert, chart=chart_rows(cert) if cert else [], source=source, totals=totals,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), violations=violations,
        coverage=coverage, coverage_note=coverage_note, study=study, consistency=summary, equivalences=equivalences,
        window=f"the {len(recent)} most recent runs with a task" + (f" of study {study}" if study else ""), diffs=diffs,
        runs=runs, how=advice(store, source),
    )


def run_page(store: Reader, run: Trajectory, href: Callable[..., str], how: dict[str, Any] | None = None,
             branch: dict[str, Any] | None = None) -> str:
    """One run: its status, the span waterfall (durations, messages, tokens, cost), the steps with the
    violations at the step that broke them, a link to the aligned diff against another run of its task, and,
    given `branch` (`replay.tape.replay_from_here`, which `serve` wires in), "replay from here": the command that
    re-runs the agent from each step it can be branched at."""
    marks = store.run_violations(run.trajectory_id)
    status = data.runs_page(store, filters=RunFilters(), size=1, only=run.trajectory_id).rows
    return render("run.html", href, run=run, marks=marks, extra=timeline_view(store, run), how=how,
                  status=status[0] if status else None, branch=branch)


def diff_page(store: Reader, a: Trajectory, b: Trajectory, href: Callable[..., str]) -> str:
    """Two runs side by side, then each in full."""
    return render("diff.html", href, diff=diff_runs(a, b), marks_a=store.run_violations(a.trajectory_id),
                  marks_b=store.run_violations(b.trajectory_id))


def write_report(db_path: str | Path, cert_path: str | Path | None, out_path: str | Path) -> Path:
    """Write the self-contained report of store `db_path` (and certificate `cert_path`) to `out_path`."""
    from plumbline_otel.report.render import load_certificate
    from plumbline_otel.store import Store

    cert = load_certificate(cert_path) if cert_path else None
    with Store(db_path) as store:
        store.assemble()
        html = report_html(store, cert, str(db_path))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


__all__ = ["WINDOW_RUNS", "advice", "agreement", "timeline_view", "diff_page", "example_diffs", "file_href", "report_html", "report_study", "run_page", "study_coverage", "spec_violations",
           "write_report"]
