"""Reading a certificate back (validated) and rendering it as text.

`load_certificate` is what a gate trusts: it reads the file into the typed model
(`report.model.read_certificate`) and rejects a file that is missing, is not JSON, has another
kind or version, lacks or mistypes any field, names a gate method this version does not compute,
whose counts do not add up (n = exposed + errored; one listed run per errored, unexposed or
unwitnessed count; ``per_task`` sums to conforming, n and tasks), or whose headline is not the
minimum of its own cells' gate bounds (a hand-edited headline). It raises `CertificateError`.

Older certificates are rejected with a message saying to re-run ``plumbline certify``: version 1
had no exposure evidence and a plain Wilson headline; version 2 took a replayed trial's status,
exposure and cost from the agent's own spans (a crash after export certified as a pass), so a
gate cannot trust either.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plumbline_otel.analyse.stats import FAIL, INCONCLUSIVE, PASS
from plumbline_otel.errors import InputError
from plumbline_otel.report.model import Cell, CellRef, Certificate, CertificateFormatError, read_certificate


class CertificateError(InputError):
    """A certificate file that cannot be used: names the file and what is wrong."""


def load_certificate(path: str | Path) -> Certificate:
    """Read a certificate file into the typed model, validated once; raises CertificateError naming the file and the first
    thing wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CertificateError(f"{path}: cannot read certificate ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CertificateError(f"{path}: not JSON ({exc})") from None
    try:
        return read_certificate(data)
    except CertificateFormatError as exc:
        raise CertificateError(f"{path}: {exc}") from None


def validate(data: Any) -> str | None:
    """The first reason `data` (parsed JSON from outside: a file, the API) is not a usable certificate, or None."""
    try:
        read_certificate(data)
    except CertificateFormatError as exc:
        return str(exc)
    return None


def _pct(x: float | None) -> str:
    return "  n/a" if x is None else f"{100 * x:5.1f}%"


def _never_fired(count: int, perturbation: str) -> str:
    if count == 1:
        return f"1 {perturbation} run never met its fault and is not scored"
    return f"{count} {perturbation} runs never met their fault and are not scored"


N_COUNTS = ("n counts each planned trial once, as the replay driver recorded it: exposed runs judged against the "
            "spec plus errored trials (crashed, hung, exited non-zero or no trace: scored as failures); faulted trials "
            "the driver never saw the fault reach (unexposed) and trials no attempt reached the agent (missing) are "
            "listed beside n, never scored")


def _bound(c: Cell) -> str:
    return "no evidence" if c.n == 0 else f"{c.gate_lower:.4f}"


def _pass_k(c: Cell) -> str:
    value = c.pass_k.value
    return "  n/a" if value is None else f"^{c.pass_k.k} {value:.2f}"


def headline_sentence(cert: Certificate) -> str:
    """The certificate in one sentence a reader cannot misread: the verdict, what the bound is a bound on, and where."""
    head = cert.headline
    target = cert.target_bound
    verdict = head.verdict
    if not head.cells:
        return f"{verdict}: nothing is certified (no scored runs)."
    worst = head.cells[0]
    where = f"{worst.agent} under {worst.perturbation}" + (f" (and {len(head.cells) - 1} more tied)" if len(head.cells) > 1 else "")
    claim = (f"with 95% confidence, at least {head.lower_bound:.1%} of runs of tasks like these conform to every "
             f"critical invariant in the worst cell, {where}")
    if verdict == PASS:
        return f"PASS: {claim}; every cell's lower bound reaches the target {target:.0%}."
    if verdict == FAIL:
        return f"FAIL: at least one cell's upper bound is below the target {target:.0%}; {claim}."
    from plumbline_otel.report.gate import advice

    more = advice(head.method, head.tasks_needed, target)
    return f"INCONCLUSIVE: the evidence neither reaches nor rules out the target {target:.0%}; {claim}; {more}."


def _why_not(c: CellRef, target: float, method: str) -> str:
    """Why one cell is not PASS, in words: what its tasks cannot show, and about how many more would."""
    where = f"{c.agent} / {c.perturbation}: {c.verdict}, {c.conforming}/{c.n} conforming over {c.tasks} task(s)"
    if c.n == 0:
        return f"{where}: no scored runs, it certifies nothing"
    if c.verdict == FAIL:
        return f"{where}: even its upper bound {c.gate_upper:.4f} is below {target:.0%}"
    if c.tasks_needed is None:
        return f"{where}, bound {c.gate_lower:.4f}: no number of clean tasks would reach {target:.0%}"
    from plumbline_otel.report.gate import advice

    return (f"{where}, bound {c.gate_lower:.4f}: {c.tasks} task(s) cannot show {target:.0%}; "
            f"{advice(method, c.tasks_needed, target)}")


def _headline_lines(cert: Certificate) -> list[str]:
    head = cert.headline
    lines = [
        f"plumbline certificate  (spec {cert.spec.name}, {cert.spec.hash[:12]})",
        headline_sentence(cert),
        f"  bound: {head.method}, {head.method_description}",
    ]
    if head.wilson_lower_bound is not None:
        lines.append(f"  (Wilson over runs, as if they were independent: {head.wilson_lower_bound:.4f})")
    for c in head.cells:
        lines.append(
            f"  set by {c.agent} / {c.perturbation}: {c.conforming}/{c.n} conforming, n={c.n} "
            f"({c.exposed} exposed + {c.errored} errored) from {c.tasks} task(s); "
            f"unexposed {c.unexposed}, missing {c.missing}" + ("  -- no evidence: certifies nothing" if c.n == 0 else "")
        )
    lines.append(f"  {N_COUNTS}")
    methods = {(c.agent, c.perturbation): c.gate_method for c in cert.cells}
    for ref in head.short_cells:
        lines.append(f"  not PASS: {_why_not(ref, cert.target_bound, methods.get((ref.agent, ref.perturbation), ''))}")
    if head.note and not head.short_cells:
        lines.append(f"  not PASS: {head.note}")
    for count, words in ((head.errored, "errored runs (in n, scored as failures)"),
                         (head.unexposed, "runs whose fault never fired (not counted in n, not scored)"),
                         (head.missing, "missing trials (never started; not counted in n, never as passes)")):
        if count:
            lines.append(f"  {words}: {count}")
    return lines


def _cell_notes(c: Cell) -> list[str]:
    lines = []
    if c.unexposed:
        lines.append(f"  {_never_fired(c.unexposed, c.perturbation)} (n={c.n} is the exposed and errored runs only)")
    if c.errored:
        shown = "; ".join(f"{r.run}: {r.reason}" for r in c.errored_runs[:5])
        more = f"; and {c.errored - 5} more" if c.errored > 5 else ""
        lines.append(f"  {c.perturbation}: {c.errored} errored run(s), scored as failures: {shown}{more}")
    if c.missing:
        lines.append(f"  {c.perturbation}: {c.missing} missing trial(s); if they had all failed the bound would be "
                     f"{c.gate_lower_if_missing_failed:.4f} (Wilson {c.lower_if_missing_failed:.4f})")
        reasons = sorted({r.reason for r in c.missing_runs})
        if reasons:
            lines.append(f"    why: {'; '.join(reasons[:3])}" + (f"; and {len(reasons) - 3} other reason(s)" if len(reasons) > 3 else ""))
    if c.evidence_from:
        seen = ", ".join(f"{who} {n}" for who, n in c.evidence_from.items())
        lines.append(f"  {c.perturbation}: seen to reach the agent by {seen}")
    if c.unwitnessed:
        lines.append(f"  {c.perturbation}: {c.unwitnessed} run(s) claim a trial no driver record stands for: not scored")
    late = sum(n.note.startswith("late:") for n in c.notes)
    if late:
        lines.append(f"  {c.perturbation}: {late} run(s) received spans after their evidence window: those steps are stored, "
                     "and left out of the verdict")
    for note in c.notes[:3]:
        lines.append(f"  {c.perturbation}: {note.run}: {note.note}")
    if len(c.notes) > 3:
        lines.append(f"  {c.perturbation}: … and {len(c.notes) - 3} more note(s) (the certificate's JSON)")
    if c.unmetered:
        lines.append(f"  {c.perturbation}: {c.unmetered} trial(s) spent money no plumbline meter fully saw (charged the "
                     "reservation, an estimate, or the adapter's higher report)")
    return lines


def _profile_lines(cells: Sequence[Cell]) -> list[str]:
    """Branch-point cells (``tool_fault@3``: the perturbation applied at step 3, `replay --branch-at`) as a profile over
    steps: where along a run the agent's conformance falls, each point with its n, rate and gate interval."""
    by_base: dict[str, list[tuple[int, Cell]]] = {}
    for c in cells:
        base, _, step = c.perturbation.rpartition("@")
        if base and step.isdigit():
            by_base.setdefault(base, []).append((int(step), c))
    lines = []
    for base, points in sorted(by_base.items()):
        shown = "  ".join(f"@{k} {c.conforming}/{c.n} [{c.gate_lower:.2f}, {c.gate_upper:.2f}]"
                          for k, c in sorted(points, key=lambda p: p[0]))
        lines.append(f"  profile over steps, {base} (conforming/n [gate bounds]): {shown}")
    return lines


def _violation_lines(cells: Sequence[Cell]) -> list[str]:
    totals: dict[str, list[int]] = {}
    for c in cells:
        for inv, count in c.violations.items():
            totals.setdefault(inv, [0, 0])[0] += count
        for inv, count in c.applicable.items():
            totals.setdefault(inv, [0, 0])[1] += count
    worst = sorted(((v[0], inv, v[1]) for inv, v in totals.items() if v[0]), reverse=True)[:8]
    if not worst:
        return []
    return ["  violations (runs violating / runs it applied to):", *(f"    {inv:<28} {k}/{n}" for k, inv, n in worst)]


def unattributed_lines(cert: Certificate, shown: int = 5) -> list[str]:
    """The runs whose spans claim a recorded trial in a trace of their own, said once for the whole certificate."""
    runs = cert.unattributed_runs or ()
    if not runs:
        return []
    lines = [f"NOT JOINED TO THEIR TRIALS (never scored): {len(runs)} run(s) claim a recorded trial in a trace of their own, not "
             "the one the driver minted: the agent's tracing did not continue the trial's TRACEPARENT (give its SDK the "
             "trial's context, or trace through the plumbline proxies)"]
    lines += [f"  {u.run}: claims {u.trial}" for u in runs[:shown]]
    if len(runs) > shown:
        lines.append(f"  … and {len(runs) - shown} more (the certificate's unattributed_runs)")
    return lines


TEXT_WIDTH = 160  # no line of the text certificate is longer: it fits a terminal


def wrap_lines(lines: list[str], width: int = TEXT_WIDTH) -> list[str]:
    """Each line wrapped to `width`, continuation lines indented two more than the line's own indent; a line
    with no space to break at (a long id) is cut into pieces of `width`."""
    import textwrap

    out: list[str] = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")))
        out += textwrap.wrap(line, width=width, subsequent_indent=indent + "  ", break_long_words=True, break_on_hyphens=False)
    return out


def _curve_line(c: Cell) -> str | None:
    """The cell's pass^k curve in words: each k's estimate and 95% interval."""
    curve = c.pass_k_curve
    if len(curve) < 2:
        return None
    points = "  ".join(f"k={p.k} {p.estimate:.2f} [{p.lower:.2f}, {p.upper:.2f}]" for p in curve[:8] if p.estimate is not None)
    more = f"  … k up to {curve[-1].k}" if len(curve) > 8 else ""
    return f"  {c.perturbation}: pass^k curve {points}{more}"


def render_text(cert: Certificate) -> str:
    """A fixed-width text certificate: headline, one table per agent, notes per cell, violations, provenance.

    No line is longer than `TEXT_WIDTH`: long sentences wrap, indented under their first line."""
    lines = _headline_lines(cert)
    for agent in cert.agents:
        lines += ["", f"agent {agent.agent}",
                  "  perturbation        n  conf.   rate   Wilson 95%        gate bound  tasks  pass^k    flip  errored  unexposed  missing  verdict       more tasks"]
        cells = agent.perturbations
        for c in sorted(cells, key=lambda c: (c.gate_lower, c.perturbation)):
            flip = "  n/a" if c.flip_rate is None else f"{c.flip_rate:.2f}"
            lines.append(
                f"  {c.perturbation:<16}{c.n:>5}  {c.conforming:>5}  {_pct(c.rate)}  "
                f"[{c.lower:.3f}, {c.upper:.3f}]  {_bound(c):>11}  {c.tasks:>5}  {_pass_k(c):>8}  {flip:>5}"
                f"  {c.errored:>7}  {c.unexposed:>9}  {c.missing:>7}  {c.verdict:<12}  "
                f"{'-' if c.verdict != INCONCLUSIVE else ('none do' if c.tasks_needed is None else c.tasks_needed)}"
            )
        for c in sorted(cells, key=lambda c: c.perturbation):
            lines += _cell_notes(c)
            if (curve := _curve_line(c)) is not None:
                lines.append(curve)
        lines += _profile_lines(cells)
        lines += _violation_lines(cells)
    prov = cert.provenance
    untrusted = prov.untrusted_records or ()
    if untrusted:
        kinds = Counter(r.reason.split(":", 1)[0] for r in untrusted)
        lines += ["", "NOT BELIEVED (counted nowhere): " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))]
        lines += [f"  {r.run}: {r.reason}" for r in untrusted[:5]]
        if len(untrusted) > 5:
            lines.append(f"  … and {len(untrusted) - 5} more (the certificate's provenance.untrusted_records)")
    if (unjoined := unattributed_lines(cert)):
        lines += ["", *unjoined]
    win = prov.data_window
    scored = f" ({prov.scored_runs} scored)" if prov.scored_runs != prov.runs else ""
    lines += [
        "",
        "gate bound: on the mean conformance over tasks (a task drawn like these, run once); tasks count, repeats "
        "sharpen each task's rate.",
        "pass^k: the chance all k repeats of a task conform (k = fewest repeats of any task), averaged over tasks "
        "(the pass^k curve lines give every k with its bounds).",
        "flip: share of repeated tasks whose repeats disagree.",
        f"runs: {prov.runs}{scored}   window: {win.start} .. {win.end}",
        f"evidence sha256: {prov.evidence_sha256}",
        f"spec sha256: {cert.spec.hash}   plumbline {prov.plumbline_version}",
    ]
    return "\n".join(wrap_lines(lines))
