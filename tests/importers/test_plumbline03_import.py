"""`plumbline import plumbline03`: the seed's runs stored as runs, its published outcome table reproduced."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from seed_runs import SEED_RUNS, Imported

from plumbline_otel.cli.main import cli
from plumbline_otel.errors import InputError
from plumbline_otel.importers import import_run_dir, outcome_cells, read_run_dir
from plumbline_otel.importers.plumbline03 import TrialId, fault_of
from plumbline_otel.report.certificate import evidence_digest
from plumbline_otel.store import Store


def test_outcome_correctness_per_cell_reproduces_the_published_parity_table(parity: Imported) -> None:
    cells = outcome_cells(parity.runs)
    assert cells[("plan_execute", "tool_fault")] == (52, 64)
    assert cells[("react", "tool_fault")] == (55, 56)
    assert cells[("react", "distractor")] == (57, 58)
    assert cells[("react", "sampling")] == (56, 56)
    # and the per-arm totals the study published in its summary.json
    for arm, figure in parity.published("parity-study")["outcome_correctness"].items():
        ok = sum(c[0] for (a, _), c in cells.items() if a == arm)
        n = sum(c[1] for (a, _), c in cells.items() if a == arm)
        assert (ok, n) == (figure["successes"], figure["total"]), arm


def test_retry_study_without_trajectories_keeps_outcomes_and_marks_the_errored_replays(retry: Imported) -> None:
    assert retry.result.files == ("ledger_states.json", "variants.json", "errors.json", "summary.json")
    errored = [t for t in retry.runs if t.context.get("plumbline.trial.status") == "errored"]
    assert len(errored) == len(json.loads((SEED_RUNS / "retry-study" / "errors.json").read_text())) == 52
    assert all(t.service == "react" and "no recorded response" in t.context["plumbline.trial.reason"] for t in errored)
    assert outcome_cells(retry.runs)[("plan_execute", "tool_fault")] == (64, 64)  # the retry executor, as published
    stepless = [t for t in retry.runs if t.context.get("plumbline.import.steps_recorded") is False]
    assert len(stepless) == 768 - 52 and all(not t.steps for t in stepless)
    variants = json.loads((SEED_RUNS / "retry-study" / "variants.json").read_text())
    paraphrased = retry.by_trial["react/INV-7003/paraphrase/2/1"]
    assert paraphrased.input == next(v["prompt"] for v in variants["INV-7003"] if v["variant_id"] == "paraphrase/2")


def test_a_trial_becomes_a_genai_run_with_its_steps_arguments_results_and_errors(parity: Imported) -> None:
    t = parity.by_trial["plan_execute/INV-7002/tool_fault/0/0"]
    assert (t.service, t.task_key, t.conventions) == ("plan_execute", "INV-7002", ("genai",))
    assert t.input == "Invoice INV-7002 just came in from Ashfield Logistics. Please process it and let me know what you did."
    ctx = t.context
    assert (ctx["plumbline.study"], ctx["plumbline.perturbation"], ctx["plumbline.variant"], ctx["plumbline.trial.repeat"]) == (
        "parity-study", "tool_fault", "tool_fault/0", 0)
    assert (ctx["plumbline.fault.tool"], ctx["plumbline.fault.error"]) == ("match_purchase_order", "503 upstream temporarily unavailable")
    assert "plumbline.fault.fired" not in ctx  # the seed never recorded it: no evidence, no claim
    assert ctx["plumbline.outcome"] == "incorrect"  # held a clean invoice: the fault hit the executor without retry
    assert json.loads(ctx["plumbline.ledger"])["paid"] is False
    record = next(json.loads(line) for line in (SEED_RUNS / "parity-study" / "trajectories.jsonl").open()
                  if '"plan_execute/INV-7002/tool_fault/0/0"' in line)
    interpret = t.steps[0]  # the executor's one model call, with the run's token counts
    assert (interpret.kind, interpret.input_tokens, interpret.output_tokens) == ("llm_call", record["tokens_in"], record["tokens_out"])
    tools = [(s.name, s.error) for s in t.steps if s.kind == "tool_call"]
    assert tools[:2] == [("fetch_invoice", None), ("match_purchase_order", "503 upstream temporarily unavailable")]
    fetch = next(s for s in t.steps if s.name == "fetch_invoice")
    assert fetch.args == {"invoice_id": "INV-7002"} and fetch.result["invoice"]["total"] == 4500.0
    paid = parity.by_trial["plan_execute/INV-7002/tool_fault/0/1"]
    assert paid.context["plumbline.outcome"] == "correct"
    assert ("schedule_payment", {"invoice_id": "INV-7002", "amount": 4500.0, "vendor_id": "V-101"}) in [
        (s.name, s.args) for s in paid.steps]
    assert not any(s.error for s in paid.steps)  # its fault never fired


def test_trials_missing_from_the_grid_are_recorded_missing_not_as_runs(parity: Imported) -> None:
    missing = [t for t in parity.runs if t.context.get("plumbline.trial.status") == "missing"]
    assert parity.result.missing == len(missing) == 30 == 2 * 384 - 738
    assert all(t.service == "react" and not t.steps and "plumbline.outcome" not in t.context for t in missing)
    assert {t.context["plumbline.perturbation"] for t in missing} == {"distractor", "tool_fault", "decoy_tools", "sampling"}


def test_reimporting_changes_nothing(parity: Imported) -> None:
    with Store(parity.db) as store:
        again = import_run_dir(store, SEED_RUNS / "parity-study")
        runs = list(store.trajectories())
    assert (again.spans_stored, again.spans_duplicate) == (0, parity.result.spans_stored)
    assert sorted((t.trajectory_id, evidence_digest(t)) for t in runs) == sorted(
        (t.trajectory_id, evidence_digest(t)) for t in parity.runs)


def test_the_seed_fault_cycle_used_without_variants_json_is_the_one_the_retry_study_recorded() -> None:
    run = read_run_dir(SEED_RUNS / "retry-study")
    for trial in run.trials.values():
        if trial.id.perturbation == "tool_fault":
            assert fault_of(trial.id, {}) == fault_of(trial.id, run.variants)
    assert fault_of(TrialId("react", "INV-7002", "baseline", 0, 0), run.variants) is None


def test_the_two_studies_share_trial_ids_but_not_traces(parity: Imported, tmp_path: Path) -> None:
    with Store(tmp_path / "both.duckdb") as store:
        import_run_dir(store, SEED_RUNS / "retry-study")
        import_run_dir(store, SEED_RUNS / "parity-study")
        studies = [t.context["plumbline.study"] for t in store.trajectories()]
    assert studies.count("parity-study") == len(parity.runs) and studies.count("retry-study") == 768


@pytest.mark.parametrize(("name", "content", "where"), [
    ("trajectories.jsonl", '{"trial_id": "react/INV-7002/baseline/0/0", "steps": []}\n{"trial_id": "react/INV-7002"}\n',
     "trajectories.jsonl:2: trial id 'react/INV-7002'"),
    ("trajectories.jsonl", '{"trial_id": "react/INV-7002/baseline/0/0", "steps": []}\n{not json\n', "trajectories.jsonl:2: invalid JSON"),
    ("ledger_states.json", '{"react/INV-7002/baseline/0/0": 3}', "field 'react/INV-7002/baseline/0/0' is not a ledger state"),
])
def test_bad_input_is_refused_naming_file_line_and_field(tmp_path: Path, name: str, content: str, where: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(InputError, match=where.replace("(", r"\(")):
        read_run_dir(tmp_path)


def test_cli_imports_a_directory_and_prints_the_outcome_table(tmp_path: Path) -> None:
    study = tmp_path / "parity-copy"
    shutil.copytree(SEED_RUNS / "parity-study", study)
    db = str(tmp_path / "cli.duckdb")
    result = CliRunner().invoke(cli, ["import", "plumbline03", str(study), "--db", db, "--study", "parity"])
    assert result.exit_code == 0, result.output
    assert "trials 738 (with steps 738, errored 0, outcome only 0) + missing 30" in result.output
    assert re.search(r"plan_execute\s+tool_fault\s+52/64\s+20/32\n", result.output)  # every run; exposed runs only
    assert re.search(r"react\s+tool_fault\s+55/56\s+0/0\n", result.output)
    assert "published overall plan_execute: 372/384" in result.output
    empty = CliRunner().invoke(cli, ["import", "plumbline03", str(tmp_path / "nothing"), "--db", db])
    assert empty.exit_code == 2 and "does not exist" in empty.output
    (tmp_path / "nothing").mkdir()
    none = CliRunner().invoke(cli, ["import", "plumbline03", str(tmp_path / "nothing"), "--db", db])
    assert isinstance(none.exception, InputError) and "not a plumbline 0.3.0 run directory" in str(none.exception)
