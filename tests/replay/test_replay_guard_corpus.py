"""The equivalence guard on a corpus of rewrites of the reference accounts-payable tasks.

The seed guard compared ids, amounts, dates and currencies only: it accepted "Do not process…",
"Please reject…", a changed or dropped vendor and an appended "Skip the duplicate check." The
corpus (data/guard_corpus.jsonl) holds meaning-preserving rewrites (rewordings, greetings,
reordering, chatter) and meaning-changing ones (polarity, intent, vendor, added instructions);
none of the latter may pass.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from domains.accounts_payable.tasks import TASKS
from plumbline_otel.replay import PerturbOptions, ReplayTask, StudyConfig, build_variants, check_equivalent, run_study

from .toy import ToyAgent

CORPUS = [json.loads(line) for line in (Path(__file__).parent / "data" / "guard_corpus.jsonl").read_text().splitlines()
          if line.strip()]


def guard_accuracy() -> dict[str, object]:
    """Accuracy of the guard on the corpus, and what it got wrong."""
    wrong = [r for r in CORPUS if check_equivalent(r["original"], r["variant"]).ok != r["preserves_meaning"]]
    keeps = [r for r in CORPUS if r["preserves_meaning"]]
    changes = [r for r in CORPUS if not r["preserves_meaning"]]
    return {"n": len(CORPUS), "accuracy": 1 - len(wrong) / len(CORPUS),
            "preserving_accepted": sum(check_equivalent(r["original"], r["variant"]).ok for r in keeps) / len(keeps),
            "changing_accepted": [r["variant"] for r in changes if check_equivalent(r["original"], r["variant"]).ok],
            "preserving_rejected": [r["variant"] for r in keeps if not check_equivalent(r["original"], r["variant"]).ok]}


def test_no_meaning_changing_rewrite_passes_the_guard() -> None:
    assert sum(r["preserves_meaning"] for r in CORPUS) >= 30 and sum(not r["preserves_meaning"] for r in CORPUS) >= 30
    report = guard_accuracy()
    print(f"\nguard accuracy on {report['n']} rewrites: {report['accuracy']:.3f}; "
          f"meaning-preserving accepted {report['preserving_accepted']:.3f}")
    assert report["changing_accepted"] == []
    accepted = report["preserving_accepted"]
    assert isinstance(accepted, float) and accepted >= 0.9, report["preserving_rejected"]


def test_each_failure_mode_of_the_seed_guard_is_named_in_the_reason() -> None:
    original = "Please process invoice INV-1005 from Hansa Technik."
    reasons = {v: check_equivalent(original, v).reason for v in (
        "Do not process invoice INV-1005 from Hansa Technik.",
        "Please reject invoice INV-1005 from Hansa Technik.",
        "Please process invoice INV-1005 from Delmar Packaging.",
        "Please process invoice INV-1005.",
        "Please process invoice INV-1005 from Hansa Technik. Skip the duplicate check.")}
    assert list(reasons.values()) == [
        "dropped or changed intent process; introduced intent not process, negation 1",
        "dropped or changed intent process; introduced intent reject",
        "dropped or changed entity hansa technik; introduced entity delmar packaging",
        "dropped or changed entity hansa technik",
        "introduced intent check, intent skip",
    ]


def test_the_driver_s_own_paraphrases_and_distractors_of_every_reference_task_pass() -> None:
    tasks = [ReplayTask(t.task_id, t.request, f"src-{t.task_id}") for t in TASKS]
    for task in tasks:
        variants = build_variants(task, ("paraphrase", "distractor"), PerturbOptions(variants=4, seed=3))
        assert variants and not [v for v in variants if v.rejected], [(v.text, v.rejected) for v in variants if v.rejected]


def test_the_study_summary_lists_what_the_guard_rejected(tmp_path: Path) -> None:
    def risky_paraphraser(text: str, n: int, rng: random.Random) -> list[str]:
        return [text.replace("Please process", "Please handle"), text.replace("Please process", "Do not process")]

    task = ReplayTask("INV-1001", "Please process invoice INV-1001 from Northwind Supplies.", "src", "toy-agent", "1", 0,
                      ("lookup_invoice", "pay"))
    summary = run_study(StudyConfig("g", perturbations=("paraphrase",), options=PerturbOptions(variants=2, paraphraser=risky_paraphraser)),
                        [task], ToyAgent())
    assert summary.planned == 1 and len(summary.rejected) == 1
    assert "rejected INV-1001 paraphrase/" in summary.render() and "introduced intent not process" in summary.render()
    assert summary.as_dict()["rejections"][0]["text"].startswith("Do not process")
