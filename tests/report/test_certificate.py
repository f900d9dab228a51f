"""Certificates: the headline is exactly the minimum of the cells' gate bounds; missing trials are not
passes; errored trials are failing runs; tool_fault runs count only with evidence the fault hit them."""

import json
import random
from typing import Any

from plumbline_otel.analyse.stats import tasks_needed, wilson_interval
from plumbline_otel.report import build_certificate, fault_unexposed, render_text, validate
from plumbline_otel.report.model import PassK, RunReason
from plumbline_otel.spec import MustCall, MustNotCall, Spec, invariant
from plumbline_otel.spec.testing import call, run

SPEC = Spec.of(
    "cert",
    [
        invariant("AUDIT", MustCall("post_audit_log")),
        invariant("NO-DELETE", MustNotCall("delete_ledger")),
        invariant("STYLE", MustCall("say_thanks"), severity="minor"),
    ],
)


def runs(perturbation, conforming, n, task_count=None, service="ap-agent", version="1.0", **ctx):
    """n runs, the first `conforming` clean; each on its own task unless `task_count` groups them."""
    out = []
    for i in range(n):
        steps = [call("post_audit_log")] if i < conforming else [call("post_audit_log", error="503")]
        out.append(run(*steps, task=f"T{i % task_count if task_count else i}", service=service, version=version,
                       plumbline__perturbation=perturbation, start_ns=1_700_000_000_000_000_000 + i, **ctx))
    return out


def cell(cert, perturbation):
    (agent,) = cert.agents
    return next(c for c in agent.perturbations if c.perturbation == perturbation)


def test_headline_is_the_minimum_lower_bound_not_the_point_worst_cell():
    # 60/64 has the worse rate (0.9375 < 1.0) but the better lower bound (0.85 > 0.72).
    cert = build_certificate(SPEC, runs("baseline", 60, 64) + runs("paraphrase", 10, 10))
    lower_60_64 = wilson_interval(60, 64).lower
    lower_10_10 = wilson_interval(10, 10).lower
    assert lower_10_10 < lower_60_64
    head = cert.headline
    assert head.lower_bound == min(lower_60_64, lower_10_10) == lower_10_10
    assert [(c.perturbation, c.n) for c in head.cells] == [("paraphrase", 10)]
    assert head.meets_target is False


def test_unequal_n_9_of_10_against_60_of_64():
    cert = build_certificate(SPEC, runs("baseline", 9, 10) + runs("paraphrase", 60, 64))
    assert cert.headline.lower_bound == wilson_interval(9, 10).lower
    assert cell(cert, "paraphrase").lower == wilson_interval(60, 64).lower
    assert cert.headline.lower_bound == min(c.lower for c in cert.agents[0].perturbations)


def test_ties_report_every_tied_cell_whatever_the_input_order():
    data = runs("baseline", 64, 64) + runs("decoy_tools", 34, 34) + runs("sampling", 34, 34)
    first = build_certificate(SPEC, data)
    random.Random(3).shuffle(data)
    second = build_certificate(SPEC, data)
    for cert in (first, second):
        head = cert.headline
        assert head.lower_bound == wilson_interval(34, 34).lower
        assert sorted(c.perturbation for c in head.cells) == ["decoy_tools", "sampling"]
    assert first.headline == second.headline
    assert first.provenance.evidence_sha256 == second.provenance.evidence_sha256


def test_short_n_is_stated_with_the_distinct_tasks_needed():
    cert = build_certificate(SPEC, runs("baseline", 34, 34))
    c = cell(cert, "baseline")
    assert (c.verdict, c.tasks_needed, c.tasks) == ("INCONCLUSIVE", 39, 34)
    assert "39 more distinct clean task(s) would settle it as a sequential study" in cert.headline.note
    assert cert.headline.verdict == "INCONCLUSIVE" and cert.headline.tasks_needed == 39
    enough = build_certificate(SPEC, runs("baseline", 73, 73))
    assert cell(enough, "baseline").tasks_needed == 0 and enough.headline.meets_target
    assert enough.headline.verdict == "PASS"
    # Clean repeats of the same 34 tasks never stand in for tasks: still 39 more tasks.
    repeated = build_certificate(SPEC, runs("baseline", 340, 340, task_count=34))
    assert cell(repeated, "baseline").tasks_needed == 39
    assert cell(repeated, "baseline").gate_lower == c.gate_lower


def test_a_cell_shown_below_the_target_fails():
    cert = build_certificate(SPEC, runs("baseline", 20, 40, task_count=40))  # half the tasks break a critical invariant
    c = cell(cert, "baseline")
    assert c.verdict == "FAIL" and c.gate_upper < 0.95 and cert.headline.verdict == "FAIL"
    assert "its upper bound" in cert.headline.note


def test_missing_trials_are_counted_apart_never_as_passes():
    missing = [
        run(task="T0", version="1.0", service="ap-agent", plumbline__perturbation="baseline", plumbline__trial__status="missing")
        for _ in range(5)
    ]
    cert = build_certificate(SPEC, runs("baseline", 10, 10) + missing)
    c = cell(cert, "baseline")
    assert (c.n, c.conforming, c.missing) == (10, 10, 5)
    assert c.lower_if_missing_failed == wilson_interval(10, 15).lower
    assert cert.headline.missing == 5


def test_only_critical_violations_break_conformance_and_violations_carry_their_n():
    cert = build_certificate(SPEC, runs("baseline", 7, 10))
    c = cell(cert, "baseline")
    assert c.conforming == 7
    assert c.violations == {"AUDIT": 3, "STYLE": 10}
    assert c.applicable["AUDIT"] == 10 and c.applicable["NO-DELETE"] == 10


def test_cells_are_per_agent_version_and_default_to_baseline():
    data = runs("baseline", 5, 5, version="1.0") + runs("baseline", 5, 5, version="2.0")
    data.append(run(call("post_audit_log"), service="ap-agent", version="2.0"))  # no perturbation attribute
    cert = build_certificate(SPEC, data)
    assert [a.agent for a in cert.agents] == ["ap-agent@1.0", "ap-agent@2.0"]
    assert cert.agents[1].perturbations[0].n == 6


def test_agent_and_study_filters():
    data = runs("baseline", 5, 5, plumbline__study="s1") + runs("baseline", 5, 5, service="other", plumbline__study="s2")
    assert build_certificate(SPEC, data, agent="other").provenance.runs == 5
    assert build_certificate(SPEC, data, study="s1").agents[0].agent == "ap-agent@1.0"


def test_the_task_level_bound_and_its_counts_are_reported_per_cell():
    c = cell(build_certificate(SPEC, runs("baseline", 30, 40, task_count=4)), "baseline")
    assert c.tasks == 4 and c.gate_method == "wilson_tasks"
    assert c.gate_lower <= c.lower + 1e-12
    assert sum(k for _, k, _ in c.per_task) == 30 and sum(n for _, _, n in c.per_task) == 40
    assert [p.k for p in c.pass_k_curve] == list(range(1, 11))  # 10 runs per task: pass^1 … pass^10
    estimates = [p.estimate for p in c.pass_k_curve]
    assert estimates == sorted(estimates, reverse=True)  # all k runs conforming only gets harder


def test_evidence_hash_pins_arguments_results_and_errors():
    base = [run(call("post_audit_log", {"amount": 10}, result={"ok": True}), id="r1"), run(call("post_audit_log"), id="r2")]
    digest = build_certificate(SPEC, base).provenance.evidence_sha256
    for changed in (
        run(call("post_audit_log", {"amount": 11}, result={"ok": True}), id="r1"),
        run(call("post_audit_log", {"amount": 10}, result={"ok": False}), id="r1"),
        run(call("post_audit_log", {"amount": 10}, result={"ok": True}, error="x"), id="r1"),
    ):
        assert build_certificate(SPEC, [changed, base[1]]).provenance.evidence_sha256 != digest
    assert build_certificate(SPEC, base[::-1]).provenance.evidence_sha256 == digest


def test_provenance_and_rendering():
    cert = build_certificate(SPEC, runs("baseline", 34, 34) + runs("tool_fault", 30, 34))
    prov = cert.provenance
    assert prov.data_window.start_ns == 1_700_000_000_000_000_000 and prov.runs == 68
    assert cert.spec.hash == SPEC.hash and cert.version == 3
    assert validate(cert.to_dict()) is None
    text = render_text(cert)
    assert "tool_fault" in text and "set by ap-agent@1.0 / tool_fault" in text and "evidence sha256" in text


def test_no_runs_certifies_nothing():
    cert = build_certificate(SPEC, [])
    assert cert.headline.lower_bound == 0.0 and not cert.headline.meets_target
    assert validate(cert.to_dict()) is None


def test_agent_filter_accepts_service_at_version():
    data = runs("baseline", 5, 5, version="1.0") + runs("baseline", 3, 3, version="2.0")
    cert = build_certificate(SPEC, data, agent="ap-agent@2.0")
    assert [a.agent for a in cert.agents] == ["ap-agent@2.0"] and cert.provenance.runs == 3


# Fault exposure: the seed system's parity study scored plan_execute 52/64 (81.2%) under tool_fault,
# but its fault fired once per variant, so 32 of the 64 runs never met it. The 32 exposed runs were
# 20/32 (62.5%). A run whose plumbline.fault.fired is false is counted apart and never scored.


def faulted(conforming, n, fired, **kw):
    return runs("tool_fault", conforming, n, plumbline__fault__fired=fired, **kw)


def without(c, *names):
    return {k: v for k, v in c.to_dict().items() if k not in names}


def test_unexposed_runs_are_not_in_n_and_the_interval_is_the_exposed_halfs():
    exposed = faulted(20, 32, True)
    unexposed = faulted(32, 32, False, task_count=3)
    cert = build_certificate(SPEC, exposed + unexposed)
    c = cell(cert, "tool_fault")
    assert (c.n, c.conforming, c.unexposed, c.missing) == (32, 20, 32, 0)
    assert (c.lower, c.upper) == (wilson_interval(20, 32).lower, wilson_interval(20, 32).upper)
    assert c.lower < wilson_interval(52, 64).lower  # the mixed figure would have flattered the agent
    # The advice is the sequential continuation's: the only one that keeps its error as tasks are added.
    assert c.tasks_needed == tasks_needed(0.95, [(k, n) for _, k, n in c.per_task], method="betting_cs")
    assert c.violations["AUDIT"] == 12 and c.applicable["AUDIT"] == 32
    assert len(c.unexposed_runs) == 32 and list(c.unexposed_runs) == sorted(c.unexposed_runs)
    # Everything scored is exactly what the exposed runs alone give (clustered interval included).
    alone = cell(build_certificate(SPEC, exposed), "tool_fault")
    ignore = ("unexposed", "unexposed_runs", "trace_judged")
    assert without(c, *ignore) == without(alone, *ignore) and alone.unexposed == 0
    head = cert.headline
    assert head.lower_bound == c.lower and head.unexposed == 32
    assert head.cells[0].unexposed == 32 and head.cells[0].n == 32
    assert cert.provenance.runs == 64 and cert.provenance.scored_runs == 32
    assert validate(cert.to_dict()) is None


def _trial_id(i: int) -> dict[str, Any]:
    return {"plumbline__trial__id": f"react/INV-1/tool_fault/0/{i}"} if i else {}


def test_unexposed_runs_are_listed_by_trial_id():
    data = [
        run(call("post_audit_log"), id=f"r{i}", plumbline__perturbation="tool_fault", plumbline__fault__fired=False,
            **_trial_id(i))
        for i in range(2)
    ]
    c = cell(build_certificate(SPEC, data), "tool_fault")
    assert c.unexposed_runs == ("r0", "react/INV-1/tool_fault/0/1")


def test_the_text_says_which_runs_were_not_scored():
    cert = build_certificate(SPEC, runs("baseline", 34, 34) + faulted(20, 32, True) + faulted(32, 32, False))
    text = render_text(cert)
    assert "32 tool_fault runs never met their fault and are not scored" in text
    assert "(n=32 is the exposed and errored runs only)" in text
    assert "set by ap-agent@1.0 / tool_fault: 20/32 conforming, n=32 (32 exposed + 0 errored) from 32 task(s); unexposed 32" in text
    assert "runs whose fault never fired (not counted in n, not scored): 32" in text
    assert "runs: 98 (66 scored)" in text
    one = render_text(build_certificate(SPEC, faulted(5, 5, True) + faulted(1, 1, False)))
    assert "1 tool_fault run never met its fault and is not scored" in one
    plain = render_text(build_certificate(SPEC, runs("baseline", 34, 34)))
    assert "never met" not in plain and "never fired" not in plain


def test_tool_fault_runs_without_evidence_are_unexposed_other_perturbations_need_none():
    # Before issue 8 a tool_fault run with no fault attribute at all was scored as exposed.
    plain = runs("tool_fault", 7, 10)
    c = cell(build_certificate(SPEC, plain), "tool_fault")
    assert (c.n, c.exposed, c.unexposed) == (0, 0, 10) and c.gate_lower == 0.0
    fired = faulted(7, 10, True)
    c = cell(build_certificate(SPEC, fired), "tool_fault")
    assert (c.n, c.conforming, c.unexposed, c.unexposed_runs) == (10, 7, 0, ())
    assert c.lower == c.gate_lower == wilson_interval(7, 10).lower  # one run per task: the gate bound is Wilson
    # A baseline run is exposed whatever a stray fault attribute says.
    c = cell(build_certificate(SPEC, runs("baseline", 5, 5, plumbline__fault__fired=False) + runs("baseline", 3, 3)), "baseline")
    assert (c.n, c.unexposed) == (8, 0)


def test_fault_fired_is_read_strictly():
    for value, unexposed in ((False, True), ("false", True), (0, True), ("0", True), ("no", True), ("yes", True),
                             (None, True), ("", True), (True, False), ("true", False), (" True ", False), (1, False), ("1", False)):
        t = run(call("post_audit_log"), plumbline__perturbation="tool_fault", plumbline__fault__fired=value)
        assert fault_unexposed(t) is unexposed, value


FAULT_MSG = "503 Service Unavailable: the check_duplicate backend is temporarily unavailable"


def agent_ignoring_its_fault(i, hit, **ctx):
    """A tool_fault trial as the replay driver records it: the fault's tool and text on the trial, and
    (when `hit`) the failed step the injected fault left in the trace."""
    steps = [call("check_duplicate", error=f"ToolError: {FAULT_MSG}")] if hit else []
    return run(*steps, call("check_duplicate"), call("post_audit_log"), task=f"INV-{i % 4}", id=f"tf-{i}",
               service="ap-agent", version="1.0", plumbline__perturbation="tool_fault",
               plumbline__fault__tool="check_duplicate", plumbline__fault__error=FAULT_MSG,
               plumbline__trial__id=f"s/INV-{i % 4}/tool_fault/v/k{i}", **ctx)


def test_an_agent_the_fault_never_hit_certifies_nothing():
    # Issue 8, case 1: the driver said "fired in 0/12" and the certificate scored 12/12 (0.758).
    for fired in ({}, {"plumbline__fault__fired": "0"}, {"plumbline__fault__fired": "no"}):
        cert = build_certificate(SPEC, [agent_ignoring_its_fault(i, False, **fired) for i in range(12)] + runs("baseline", 80, 80))
        c = cell(cert, "tool_fault")
        assert (c.n, c.exposed, c.unexposed, c.gate_lower) == (0, 0, 12, 0.0)
        assert c.unexposed_runs[0] == "s/INV-0/tool_fault/v/k0"
        head = cert.headline
        assert head.lower_bound == 0.0 and head.cells[0].perturbation == "tool_fault"
        assert "ap-agent@1.0 tool_fault: no evidence (0 scored runs; 12 unexposed, 0 missing)" in head.note
        assert "no evidence: certifies nothing" in render_text(cert)
    # The same runs with the injected failure in their trace are exposed by the store's match.
    c = cell(build_certificate(SPEC, [agent_ignoring_its_fault(i, True) for i in range(12)]), "tool_fault")
    assert (c.n, c.exposed, c.unexposed) == (12, 12, 0)


def test_errored_trials_are_failing_runs_listed_with_their_reason():
    # Issue 8, case 2: crashing on 4 of 16 fault trials gave 12/12 (0.758) instead of 12/16 (0.505).
    ok = faulted(12, 12, True)
    crashed = [run(task=f"C{i}", id=f"c{i}", service="ap-agent", version="1.0", plumbline__perturbation="tool_fault",
                   plumbline__trial__status="errored" if i else "error", plumbline__trial__reason=f"adapter raised: boom {i}")
               for i in range(4)]
    cert = build_certificate(SPEC, ok + crashed)
    c = cell(cert, "tool_fault")
    assert (c.n, c.conforming, c.exposed, c.errored, c.missing) == (16, 12, 12, 4, 0)
    assert round(c.lower, 3) == 0.505 and c.lower == wilson_interval(12, 16).lower
    assert c.errored_runs[0] == RunReason("c0", "adapter raised: boom 0")
    assert cert.headline.errored == 4
    text = render_text(cert)
    assert "4 errored run(s), scored as failures: c0: adapter raised: boom 0" in text
    assert validate(cert.to_dict()) is None


def test_missing_trials_show_the_bound_if_they_had_all_failed():
    missing = [run(task=f"M{i}", service="ap-agent", version="1.0", plumbline__perturbation="baseline",
                   plumbline__trial__status="missing") for i in range(5)]
    c = cell(build_certificate(SPEC, runs("baseline", 10, 10) + missing), "baseline")
    assert (c.n, c.missing, c.tasks) == (10, 5, 10)
    assert c.gate_lower_if_missing_failed == wilson_interval(10, 15).lower  # every task once: Wilson


def test_one_task_run_80_times_certifies_nothing():
    # Issue 8, case 5: 80 clean runs of a single task certified 0.954 and passed a 0.95 gate.
    cert = build_certificate(SPEC, runs("baseline", 80, 80, task_count=1))
    c = cell(cert, "baseline")
    assert c.lower > 0.95 and (c.gate_lower, c.tasks) == (0.0, 1)
    assert cert.headline.lower_bound == 0.0 and cert.headline.wilson_lower_bound == c.lower
    assert "INCONCLUSIVE at 1 task(s), bound 0.0000 for 0.95; 72 more distinct clean task(s) would settle it" in cert.headline.note
    assert cert.headline.method == c.gate_method == "wilson_tasks"


def test_pass_k_and_flip_rate_per_cell():
    # 4 tasks x 3 repeats: T0 and T1 always conform, T2 conforms once, T3 never.
    data = [run(*([call("post_audit_log")] if ok else []), task=t, service="ap-agent", version="1.0",
                plumbline__perturbation="sampling")
            for t, oks in (("T0", (1, 1, 1)), ("T1", (1, 1, 1)), ("T2", (1, 0, 0)), ("T3", (0, 0, 0))) for ok in oks]
    cert = build_certificate(SPEC, data)
    c = cell(cert, "sampling")
    assert c.pass_k == PassK(k=3, value=0.5) and c.flip_rate == 0.25 and c.tasks == 4
    assert c.gate_lower < c.lower
    text = render_text(cert)
    assert "^3 0.50   0.25" in text and "pass^k: the chance all k repeats of a task conform" in text


def test_a_missing_trial_is_missing_even_if_its_fault_never_fired():
    data = faulted(4, 4, True) + [run(task="T0", service="ap-agent", version="1.0", plumbline__perturbation="tool_fault",
                                      plumbline__trial__status="missing", plumbline__fault__fired=False)]
    c = cell(build_certificate(SPEC, data), "tool_fault")
    assert (c.n, c.missing, c.unexposed) == (4, 1, 0)


def test_a_cell_with_no_exposed_run_certifies_nothing():
    cert = build_certificate(SPEC, runs("baseline", 80, 80) + faulted(10, 10, False))
    c = cell(cert, "tool_fault")
    assert (c.n, c.conforming, c.rate, c.lower, c.unexposed) == (0, 0, None, 0.0, 10)
    assert cert.headline.lower_bound == 0.0 and [x.perturbation for x in cert.headline.cells] == ["tool_fault"]
    assert c.tasks_needed == 73 and c.verdict == "INCONCLUSIVE"
    assert validate(cert.to_dict()) is None


def test_the_evidence_hash_covers_unexposed_runs():
    exposed = faulted(5, 5, True)
    hidden = [run(call("post_audit_log", {"amount": 10}), id="u1", service="ap-agent", version="1.0",
                  plumbline__perturbation="tool_fault", plumbline__fault__fired=False)]
    digest = build_certificate(SPEC, exposed + hidden).provenance.evidence_sha256
    assert digest != build_certificate(SPEC, exposed).provenance.evidence_sha256
    changed = [run(call("post_audit_log", {"amount": 11}), id="u1", service="ap-agent", version="1.0",
                   plumbline__perturbation="tool_fault", plumbline__fault__fired=False)]
    assert build_certificate(SPEC, exposed + changed).provenance.evidence_sha256 != digest
    # Flipping fired to true changes the evidence too (the attribute is in the run's context).
    flipped = [run(call("post_audit_log", {"amount": 10}), id="u1", service="ap-agent", version="1.0",
                   plumbline__perturbation="tool_fault", plumbline__fault__fired=True)]
    assert build_certificate(SPEC, exposed + flipped).provenance.evidence_sha256 != digest


def test_validate_rejects_version_1_and_any_field_it_cannot_fully_read():
    cert = build_certificate(SPEC, faulted(20, 32, True) + faulted(32, 32, False))
    assert validate(cert.to_dict()) is None
    old = json.loads(cert.to_json())
    old["version"] = 1
    assert "older plumbline" in (validate(old) or "") and "re-run plumbline certify" in (validate(old) or "")
    old["version"] = 2
    assert "from the agent's own spans" in (validate(old) or "") and "re-run plumbline certify" in (validate(old) or "")
    cases = [
        (("unexposed",), -1, "agents[0].perturbations[0].unexposed missing or not a non-negative int"),
        (("errored",), None, "agents[0].perturbations[0].errored missing or not a non-negative int"),
        (("gate_lower",), 1.5, "agents[0].perturbations[0].gate_lower missing or not a number in [0, 1]"),
        (("gate_method",), "wilson", "agents[0].perturbations[0].gate_method 'wilson' is not a bound this plumbline gates on (wilson_tasks, betting_cs)"),
        (("verdict",), "MAYBE", "agents[0].perturbations[0].verdict 'MAYBE' is not one of PASS, FAIL, INCONCLUSIVE"),
        (("per_task",), [["T0", 3, 2]], "agents[0].perturbations[0].per_task missing or not a list of [task, conforming, runs]"),
        (("tasks",), 99, "agents[0].perturbations[0]: per_task does not add up to conforming, n and tasks"),
        (("errored_runs",), [{"run": "x"}], "agents[0].perturbations[0].errored_runs missing or not a list of {run, reason}"),
        (("unexposed_runs",), [], "agents[0].perturbations[0]: errored/unexposed counts do not match the runs listed"),
        (("pass_k",), {"k": 1}, "agents[0].perturbations[0].pass_k missing or not {k: int, value: number or null}"),
        (("flip_rate",), "0.1", "agents[0].perturbations[0].flip_rate not a number or null"),
        (("exposed",), 31, "agents[0].perturbations[0]: n must be exposed + errored and conforming at most exposed"),
    ]
    for (name,), value, reason in cases:
        bad = json.loads(cert.to_json())
        bad["agents"][0]["perturbations"][0][name] = value
        if value is None:
            del bad["agents"][0]["perturbations"][0][name]
        assert validate(bad) == reason, name
    raised = json.loads(cert.to_json())
    raised["headline"]["lower_bound"] = raised["headline"]["wilson_lower_bound"] = 0.99
    assert "not the minimum of its cells' gate bounds" in (validate(raised) or "")
