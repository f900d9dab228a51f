"""Variants and the semantic-equivalence guard: ids, amounts and dates survive, or the variant is not run."""

from __future__ import annotations

import random

import pytest

from plumbline_otel.replay import (
    PERTURBATIONS,
    FaultPlan,
    PerturbOptions,
    StudyConfig,
    build_variants,
    check_equivalent,
    plan_study,
    protected_tokens,
)
from plumbline_otel.replay.perturb import Variant, reorder_clauses, template_paraphrases

from .toy import REQUEST, one_task


def _decoy_names(variant: Variant) -> list[str]:
    """The names of the decoy tools a variant offers (its metadata's ``decoy_tools``, JSON objects)."""
    decoys = variant.metadata["decoy_tools"]
    assert isinstance(decoys, list)
    return [str(d["name"]) for d in decoys if isinstance(d, dict)]

ORIGINAL = "Please pay invoice INV-1029 for 4,820.00 GBP by 2026-03-01."


def test_guard_accepts_a_rewording_that_keeps_the_id_the_amount_and_the_date() -> None:
    reworded = "Could you settle inv-1029 (GBP 4820.00) by 1 March 2026, please?"
    verdict = check_equivalent(ORIGINAL, reworded)
    assert verdict.ok and verdict.reason is None


@pytest.mark.parametrize("variant, reason", [
    ("Please pay invoice INV-1029 for 4,280.00 GBP by 2026-03-01.", "amount 4820.00 GBP became 4280.00 GBP"),
    ("Please pay invoice INV-1029 for 48,200.00 GBP by 2026-03-01.", "amount 4820.00 GBP became 48200.00 GBP"),
    ("Please pay the invoice for 4,820.00 GBP by 2026-03-01.", "identifier INV-1029 dropped"),
    ("Please pay invoice INV-1092 for 4,820.00 GBP by 2026-03-01.", "identifier INV-1029 became INV-1092"),
    ("Please pay invoice INV-1029 for 4,820.00 GBP by 2026-03-10.", "date 'by 2026-03-01' became 'by 2026-03-10'"),
    ("Please pay invoice INV-1029 for 4,820.00 EUR by 2026-03-01.", "amount 4820.00 GBP became 4820.00 EUR"),
    ("Please pay invoice INV-1029 and PO-77 for 4,820.00 GBP by 2026-03-01.", "identifier PO-77 added"),
])
def test_guard_rejects_a_variant_that_changed_what_the_task_means(variant: str, reason: str) -> None:
    verdict = check_equivalent(ORIGINAL, variant)
    assert not verdict.ok
    assert verdict.reason == reason


def test_protected_tokens_normalise_formats() -> None:
    tokens = protected_tokens("Invoice nw-40112 dated 20 February 2026, £1,234.50 and 2.5% off; also Feb 3rd.")
    assert tokens["identifier"] == {"NW-40112"}
    assert tokens["amount"] == {"1234.5", "2.5%"}
    assert tokens["currency"] == {"GBP"}
    assert tokens["date"] == {"2026-02-20", "????-02-03"}


def test_every_registered_perturbation_builds_stable_guarded_variants() -> None:
    task = one_task()
    options = PerturbOptions(variants=3)
    first = build_variants(task, list(PERTURBATIONS), options)
    again = build_variants(task, list(PERTURBATIONS), options)
    assert [v.as_dict() for v in first] == [v.as_dict() for v in again]  # same in every process (sha256 seeds)
    by = {name: [v for v in first if v.perturbation == name] for name in PERTURBATIONS}
    assert set(by) == {"baseline", "paraphrase", "distractor", "decoy_tools", "sampling", "tool_fault", "model_fault", "tool_result_fault"}
    assert [v.text for v in by["baseline"]] == [REQUEST]
    assert all(v.rejected is None for v in first), [v.rejected for v in first if v.rejected]
    for v in by["paraphrase"] + by["distractor"]:
        assert v.text != REQUEST and check_equivalent(REQUEST, v.text).ok
    assert len({v.variant_id for v in first}) == len(first)
    assert all(v.variant_id.split("-")[0].isdigit() for v in first)
    # Each sampling variant moves one parameter off the APIs' default (temperature 1.0, top_p 1.0).
    assert [(v.metadata.get("temperature"), v.metadata.get("top_p")) for v in by["sampling"]] == [(0.7, None), (0.3, None), (None, 0.5)]
    assert [v.fault for v in by["tool_fault"]] == [FaultPlan("lookup_invoice", "503"), FaultPlan("pay", "429"),
                                                   FaultPlan("lookup_invoice", "timeout")]
    for v in by["decoy_tools"]:
        names = _decoy_names(v)
        assert names == sorted(names) and names  # canonical order: a stable cache key


def test_variant_ids_change_with_the_input_so_old_trial_ids_are_never_reused() -> None:
    task = one_task()
    changed = type(task)(**{**task.__dict__, "input": task.input.replace("Acme Ltd", "Acme Limited")})
    assert build_variants(task, ["baseline"])[0].variant_id != build_variants(changed, ["baseline"])[0].variant_id


def test_rejected_variants_are_recorded_with_their_reason_and_not_planned() -> None:
    def careless(text: str, n: int, rng: random.Random) -> list[str]:
        return [text.replace("4,820.00", "4,280.00"), text.replace("INV-1029", "the invoice"), "Kindly " + text[0].lower() + text[1:]]

    config = StudyConfig("s", perturbations=("paraphrase",), repeats=2, options=PerturbOptions(variants=3, paraphraser=careless))
    plan = plan_study(config, [one_task()])
    assert [v.rejected is None for v in plan.variants] == [False, False, True]
    assert "amount 4820" in (plan.rejected[0].rejected or "") and "identifier INV-1029" in (plan.rejected[1].rejected or "")
    assert len(plan.trials) == 2 and {t.text for t in plan.trials} == {plan.variants[2].text}


def test_templates_reword_without_touching_protected_tokens() -> None:
    rng = random.Random(3)
    text = "Please process invoice INV-1001 from Northwind Supplies."
    rewordings = template_paraphrases(text, 5, rng)
    assert len(rewordings) == len(set(rewordings)) >= 3
    assert all(check_equivalent(text, r).ok for r in rewordings)
    assert reorder_clauses(text) == "From Northwind Supplies: please process invoice INV-1001."
    assert reorder_clauses("Check the PO. Then pay it.") == "Check the PO. Then pay it."  # sequence words: kept


def test_tool_fault_without_tools_is_a_recorded_rejection() -> None:
    task = one_task()
    bare = type(task)(**{**task.__dict__, "tools": ()})
    [variant] = build_variants(bare, ["tool_fault"])
    assert variant.rejected and "set fault tools" in variant.rejected
    [targeted] = build_variants(bare, ["tool_fault"], PerturbOptions(fault_tools=("pay",)))
    assert targeted.fault == FaultPlan("pay", "503") and targeted.rejected is None


def test_trials_carry_identity_and_one_plan_per_variant_repeat() -> None:
    config = StudyConfig("nightly", perturbations=("baseline", "tool_fault"), repeats=2)
    plan = plan_study(config, [one_task()])
    ids = [t.trial_id for t in plan.trials]
    assert len(ids) == len(set(ids)) == 4
    assert ids[0].startswith("nightly/INV-1029/baseline/0-") and ids[0].endswith("/k0")
    t = plan.trials[-1]
    assert t.identity.attributes()["plumbline.perturbation"] == "tool_fault" and t.identity.repeat == 1
    assert t.fault == FaultPlan("lookup_invoice", "503")
    assert len({x.identity.trace_id for x in plan.trials}) == 4  # one trace per trial


def test_a_domain_adapter_names_its_decoys_and_preferred_fault_targets() -> None:
    class Domain:
        decoy_tools = ({"name": "estimate_freight", "description": "d", "input_schema": {"type": "object"}},)
        fault_tools = ("check_duplicate", "pay", "lookup_invoice")

    plan = plan_study(StudyConfig("s", perturbations=("decoy_tools", "tool_fault"), options=PerturbOptions(variants=2)),
                      [one_task()], Domain())
    decoys = [v for v in plan.variants if v.perturbation == "decoy_tools"]
    assert all(_decoy_names(v) == ["estimate_freight"] for v in decoys)
    faults = [v.fault for v in plan.variants if v.perturbation == "tool_fault"]
    assert [f.tool for f in faults if f] == ["pay", "lookup_invoice"]  # preferred, among what the source run called
