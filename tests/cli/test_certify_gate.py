"""certify, gate and plan through click's CliRunner: exit codes and messages."""

import json
from typing import Any

import pytest
from click.testing import CliRunner

from plumbline_otel.cli.certify import certify
from plumbline_otel.cli.gate import gate
from plumbline_otel.cli.plan import plan
from plumbline_otel.report import Certificate, build_certificate, load_certificate
from plumbline_otel.spec import MustCall, Spec, invariant
from plumbline_otel.spec.testing import call, run, span_records
from plumbline_otel.store import Store

SPEC = Spec.of("g", [invariant("AUDIT", MustCall("post_audit_log"))])


def runs(perturbation, conforming, n, tasks=None, **ctx):
    """n runs, the first `conforming` clean; each on its own task unless `tasks` groups them."""
    return [
        run(*([call("post_audit_log")] if i < conforming else []), task=f"{perturbation}-T{i % tasks if tasks else i}",
            plumbline__perturbation=perturbation, **ctx)
        for i in range(n)
    ]


def write_cert(tmp_path, data, name="cert.json"):
    """A certificate file: the model as `certify` writes it, or a JSON document as someone edited it."""
    path = tmp_path / name
    path.write_text(data.to_json() if isinstance(data, Certificate) else json.dumps(data))
    return str(path)


@pytest.fixture
def runner():
    return CliRunner()


def test_gate_passes_when_the_headline_meets_the_bound(tmp_path, runner):
    path = write_cert(tmp_path, build_certificate(SPEC, runs("baseline", 80, 80) + runs("paraphrase", 75, 75)))
    result = runner.invoke(gate, [path, "--min-bound", "0.95"])
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output and "paraphrase" in result.output
    # A PASS names what it left out, and each cell's pass^k and flip rate.
    assert "errored runs 0 (in n, failures), missing trials 0 and unexposed runs 0 (not in n)" in result.output
    assert "agent / paraphrase: 75/75 conforming, bounds [0.9513, 1.0000] (Wilson 0.9513); n=75 (75 exposed + 0 errored) from 75 task(s)" in result.output
    assert "pass^1 1.000, flip rate n/a" in result.output


def test_gate_names_errored_and_missing_trials_when_it_passes_and_when_it_fails(tmp_path, runner):
    crashed = [run(task=f"C{i}", plumbline__perturbation="paraphrase", plumbline__trial__status="errored",
                   plumbline__trial__reason="timed out") for i in range(2)]
    never = [run(task=f"M{i}", plumbline__perturbation="paraphrase", plumbline__trial__status="missing") for i in range(3)]
    path = write_cert(tmp_path, build_certificate(SPEC, runs("baseline", 80, 80) + runs("paraphrase", 150, 150) + crashed + never))
    passed = runner.invoke(gate, [path, "--min-bound", "0.9"])
    assert passed.exit_code == 0, passed.output
    assert "errored runs 2 (in n, failures), missing trials 3 and unexposed runs 0 (not in n)" in passed.output
    assert "n=152 (150 exposed + 2 errored) from 152 task(s), 3 missing" in passed.output
    unsure = runner.invoke(gate, [path, "--min-bound", "0.99"])
    assert unsure.exit_code == 3
    assert "INCONCLUSIVE" in unsure.output and "errored runs 2 (in n, failures), missing trials 3" in unsure.output
    assert "if the 3 missing trial(s) had failed the bound would be" in unsure.output


def test_gate_never_passes_one_task_run_80_times(tmp_path, runner):
    # Issue 8, case 5: Wilson gives 0.954 for 80 clean runs, but they are all one task.
    path = write_cert(tmp_path, build_certificate(SPEC, runs("baseline", 80, 80, tasks=1)))
    result = runner.invoke(gate, [path, "--min-bound", "0.95"])
    assert result.exit_code == 3
    assert "bounds [0.0000, 1.0000] (Wilson 0.9542)" in result.output
    assert "72 more distinct clean task(s) would settle it as a sequential study" in result.output
    assert "(repeats of the same tasks do not count)" in result.output


def test_gate_prints_pass_k_and_flip_rate_over_repeats(tmp_path, runner):
    # 40 tasks x 2 repeats; 4 tasks flip.
    data = runs("sampling", 80, 80, tasks=40)
    data = [run(*([] if i in (0, 1, 2, 3) else t.steps), task=t.task_key, plumbline__perturbation="sampling") for i, t in enumerate(data)]
    result = runner.invoke(gate, [write_cert(tmp_path, build_certificate(SPEC, data)), "--min-bound", "0.5"])
    assert result.exit_code == 0, result.output
    assert "from 40 task(s)" in result.output and "pass^2 0.900, flip rate 0.100" in result.output


def test_gate_names_the_perturbation_and_the_distinct_tasks_it_needs(tmp_path, runner):
    path = write_cert(tmp_path, build_certificate(SPEC, runs("baseline", 80, 80) + runs("decoy_tools", 34, 34)))
    result = runner.invoke(gate, [path, "--min-bound", "0.95"])
    assert result.exit_code == 3
    assert "INCONCLUSIVE agent / decoy_tools: 34/34 conforming" in result.output
    assert "39 more distinct clean task(s) would settle it as a sequential study" in result.output


def test_gate_fails_a_cell_shown_below_the_bound_and_compares_with_a_baseline(tmp_path, runner):
    good = build_certificate(SPEC, runs("baseline", 60, 60, tasks=30) + runs("paraphrase", 60, 60, tasks=30))
    bad = build_certificate(SPEC, runs("baseline", 60, 60, tasks=30) + runs("paraphrase", 20, 60, tasks=30))
    bad_path, good_path = write_cert(tmp_path, bad), str(tmp_path / "good.json")
    (tmp_path / "good.json").write_text(good.to_json())
    failed = runner.invoke(gate, [bad_path, "--min-bound", "0.9"])
    assert failed.exit_code == 1 and "FAIL         agent / paraphrase" in failed.output
    worse = runner.invoke(gate, [bad_path, "--baseline", good_path])
    assert worse.exit_code == 1 and "worse        paraphrase: 30 shared task(s)" in worse.output
    same = runner.invoke(gate, [good_path, "--baseline", good_path, "--margin", "0.2"])
    assert same.exit_code == 0 and "not worse    baseline" in same.output


@pytest.mark.parametrize(
    "content, reason",
    [
        (None, "cannot read"),
        ("{not json", "not JSON"),
        (json.dumps({"kind": "plumbline.certificate", "version": 99}), "newer plumbline"),
        (json.dumps({"kind": "something.else", "version": 1}), "not a certificate"),
        (json.dumps([1, 2]), "not a certificate"),
        (json.dumps({"kind": "plumbline.certificate", "version": 3, "headline": {"lower_bound": "high"}}), "lower_bound"),
        (json.dumps({"kind": "plumbline.certificate", "version": 1, "headline": {"lower_bound": 0.99}}), "re-run plumbline certify"),
    ],
)
def test_gate_exits_2_on_an_unusable_certificate(tmp_path, runner, content, reason):
    path = tmp_path / "cert.json"
    if content is not None:
        path.write_text(content)
    result = runner.invoke(gate, [str(path)])
    assert result.exit_code == 2
    assert reason in result.output


def test_gate_rejects_a_hand_raised_headline(tmp_path, runner):
    cert = build_certificate(SPEC, runs("baseline", 34, 34)).to_dict()
    cert["headline"]["lower_bound"] = 0.99
    result = runner.invoke(gate, [write_cert(tmp_path, cert)])
    assert result.exit_code == 2 and "not the minimum" in result.output


def test_plan_prints_73_tasks_for_095_and_more_with_failing_tasks(runner):
    result = runner.invoke(plan, ["--target", "0.95"])
    assert result.exit_code == 0 and result.output.startswith("73 distinct tasks per perturbation")
    with_failures = runner.invoke(plan, ["--target", "0.95", "--failing-tasks", "1", "--cells", "6", "--repeats", "2"])
    n = int(with_failures.output.split()[0])
    assert n == 110 and f"{6 * 2 * n} over 6 perturbations" in with_failures.output
    assert runner.invoke(plan, ["--target", "0.95", "--sequential"]).output.startswith("73 distinct tasks")


SPEC_YAML = "version: 1\nname: g\ninvariants:\n  - {id: AUDIT, severity: critical, must_call: post_audit_log}\n"


def test_certify_reads_the_store_and_writes_a_certificate_the_gate_reads(tmp_path, runner):
    db = str(tmp_path / "p.duckdb")
    with Store(db) as store:
        for t in runs("baseline", 9, 10) + runs("paraphrase", 10, 10) + [run(task="T0", plumbline__trial__status="missing")]:
            store.write_spans(span_records(t))
        store.assemble()
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC_YAML)
    out = tmp_path / "cert.json"
    result = runner.invoke(certify, ["--spec", str(spec_path), "--db", db, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "INCONCLUSIVE: the evidence neither reaches nor rules out the target 95%" in result.output
    cert = load_certificate(out)
    cells = {c.perturbation: c for c in cert.agents[0].perturbations}
    assert (cells["baseline"].n, cells["baseline"].conforming, cells["baseline"].missing) == (10, 9, 1)
    assert len(cert.provenance.evidence_sha256) == 64
    gated = runner.invoke(gate, [str(out), "--min-bound", "0.5"])
    assert gated.exit_code == 0, gated.output
    assert runner.invoke(gate, [str(out), "--min-bound", "0.95"]).exit_code == 3


def test_48_of_50_single_run_tasks_is_inconclusive_at_099_not_fail(tmp_path, runner):
    # Issue 38: the Wilson upper end (0.9890) said FAIL here, and an agent exactly at a target of
    # 0.99 got FAIL 8.9% of the time. The upper end now holds its 5% for any task rates.
    path = write_cert(tmp_path, build_certificate(SPEC, runs("baseline", 48, 50)))
    result = runner.invoke(gate, [path, "--min-bound", "0.99"])
    assert result.exit_code == 3, result.output
    assert "INCONCLUSIVE agent / baseline: 48/50 conforming, bounds [0.8654, 0.9939]" in result.output
    assert "FAIL when its upper bound is below it, each wrong at most 5%" in result.output
    # One more failing task is shown below 0.99: FAIL still comes when the evidence is there.
    worse = runner.invoke(gate, [write_cert(tmp_path, build_certificate(SPEC, runs("baseline", 47, 50)), "worse.json"),
                                 "--min-bound", "0.99"])
    assert worse.exit_code == 1 and "is below 0.99: it is shown not to meet the target" in worse.output


def test_gate_recomputes_a_stored_upper_end_from_the_per_task_counts(tmp_path, runner):
    # A certificate written before issue 38 stored Wilson's upper end (0.9890 for 48 of 50), which
    # FAILs at 0.99; the gate recomputes each cell's bounds from its per_task counts.
    cert = build_certificate(SPEC, runs("baseline", 48, 50)).to_dict()
    cell = cert["agents"][0]["perturbations"][0]
    cell["gate_upper"], cell["verdict"] = 0.9890, "FAIL"
    result = runner.invoke(gate, [write_cert(tmp_path, cert), "--min-bound", "0.99"])
    assert result.exit_code == 3 and "bounds [0.8654, 0.9939]" in result.output


def test_gate_baseline_catches_a_02_drop_the_betting_test_missed_and_prints_what_it_could_detect(tmp_path, runner):
    # Issue 38: 22 tasks x 2 repeats in each of 3 perturbations; the candidate fails both runs of 5
    # more tasks in each (a drop of 0.23), the same tasks throughout: a change that broke them. The betting test alone (per perturbation, Holm)
    # says not worse-shown; the paired sign-flip test over all perturbations jointly says worse.
    from plumbline_otel.analyse.stats import paired_task_regression, regression_verdicts

    perts = ("baseline", "paraphrase", "distractor")

    def study(broken):
        return [run(*([] if (i < 2 and r == 1) or (i, p) in broken else [call("post_audit_log")]), task=f"T{i}",
                    plumbline__perturbation=p) for p in perts for i in range(22) for r in range(2)]

    good = study(set())
    bad = study({(i, p) for p in perts for i in range(2, 7)})  # the same 5 tasks broken in every perturbation
    good_cert, bad_cert = build_certificate(SPEC, good), build_certificate(SPEC, bad)
    good_path, bad_path = write_cert(tmp_path, good_cert, "good.json"), write_cert(tmp_path, bad_cert, "bad.json")
    per: dict[Any, Any] = {}
    for cert, side in ((bad_cert, "cand"), (good_cert, "base")):
        for c in cert.agents[0].perturbations:
            per.setdefault(c.perturbation, {})[side] = {t: (k, n) for t, k, n in c.per_task}
    old = regression_verdicts({p: paired_task_regression(v["cand"], v["base"], margin=0.05) for p, v in per.items()})
    assert "worse" not in old.values()
    result = runner.invoke(gate, [bad_path, "--baseline", good_path])
    assert result.exit_code == 1, result.output
    assert "paired sign-flip test with tasks as units, all 3 perturbation(s) jointly and each alone" in result.output
    assert "jointly: 22 shared task(s), mean difference" in result.output
    assert "with 80% power" in result.output and "would catch a drop of 0." in result.output
    same = runner.invoke(gate, [good_path, "--baseline", good_path, "--margin", "0"])
    assert same.exit_code != 1, same.output  # the same agent is never worse, even with no margin
