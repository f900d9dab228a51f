"""The equivalence guard on corpora of rewrites of the reference accounts-payable requests.

``data/guard_rewrites.jsonl`` (300 rows, committed before the structured guard was written) holds
hand-written rewrites of the reference requests ("Please process invoice INV-1001 from Northwind
Supplies.", some with the document's amount, currency, due date, PO or quantity added), each
labelled ``equivalent``, with a ``category`` and a ``split``:

- meaning-changing: cessation, negation, action_changed, multiplicity, condition_override,
  asserted_fact, currency, amount, date, id, related_entity, redirect;
- meaning-preserving: reorder, synonym, politeness, greeting, imperative, case,
  whitespace_punct, amount_format, passive, date_format.

About 30% of every category (positions 2, 5, 8 of each ten) is ``held_out``: the guard was
developed against ``dev`` only, and its held-out figures were measured once, afterwards.

Figures (accepted meaning changes / rejected paraphrases):

============  ==============  =============  =============  =============
guard         dev changes     dev keeps      held-out chg   held-out keep
============  ==============  =============  =============  =============
token guard   25 / 123        19 / 84        11 / 54        9 / 39
structured    0 / 123         0 / 84         0 / 54         0 / 39
============  ==============  =============  =============  =============

The structured guard's first held-out run (before a dev-driven fix that read every "…n't" as a
negation) accepted 1 of 54 held-out meaning changes. Both splits were written by one author in
one sitting, so the held-out figure says less than a corpus from someone else would.

``data/guard_corpus.jsonl`` is the older 72-row corpus (36 preserving, 36 changing); every row
must still be right.

``data/guard_corpus_v2.jsonl`` (424 rows, issue 38) and ``data/guard_corpus_v3.jsonl`` (574 rows,
written by someone who never read the guard or the other corpora) carry the issue's target: at
most 2% of meaning changes accepted and at most 10% of paraphrases rejected on text the rules
never saw. The thresholds below are the figures reached, not the target where it was missed (see
docs/statistics.md): v3's held-out split was measured once, after its rules were written on its
dev split, and only its counts are asserted (a failure names no held-out row). Each may only
tighten.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from domains.accounts_payable.tasks import TASKS
from plumbline_otel.replay import PerturbOptions, ReplayTask, StudyConfig, build_variants, check_equivalent, run_study

from .toy import ToyAgent

DATA = Path(__file__).parent / "data"
REWRITES = [json.loads(line) for line in (DATA / "guard_rewrites.jsonl").read_text().splitlines() if line.strip()]
LEGACY = [json.loads(line) for line in (DATA / "guard_corpus.jsonl").read_text().splitlines() if line.strip()]

CHANGING = {"cessation", "negation", "action_changed", "multiplicity", "condition_override", "asserted_fact",
            "currency", "amount", "date", "id", "related_entity", "redirect"}
PRESERVING = {"reorder", "synonym", "politeness", "greeting", "imperative", "case", "whitespace_punct",
              "amount_format", "passive", "date_format"}

# Dev rows the guard gets wrong, by id, with why; none at present.
KNOWN_DEV_MISSES: dict[str, str] = {}

# Held-out thresholds: the figures measured once after development (see the module docstring).
HELD_OUT_MAX_ACCEPTED_CHANGES = 0  # of 54
HELD_OUT_MAX_REJECTED_PARAPHRASES = 0  # of 39

# (corpus, split) -> (meaning changes, most accepted; paraphrases, most rejected), as measured at the
# end of issue 38 item 5's round 3 (bench/guard_corpus.py); the issue asks for at most 2% and 10%. v3's
# held-out rows were read in round 3 (measured three times before), so all of v3 is development data;
# v4's held-out split is measured once, through the bench, and never here
FIGURES = {
    ("guard_corpus_v3.jsonl", "dev"): (180, 0, 163, 6),
    ("guard_corpus_v3.jsonl", "held_out"): (123, 1, 108, 6),  # read in round 3: development data now
    ("guard_corpus_v2.jsonl", "dev"): (139, 1, 117, 1),
    ("guard_corpus_v2.jsonl", "held_out"): (92, 1, 76, 14),  # read as a second check: 1.1% and 18.4%
    ("guard_corpus_v4.jsonl", "dev"): (157, 4, 130, 21),  # round 3 developed on it: 2.5% and 16.2%
}


@cache
def _accepts(original: str, variant: str) -> bool:
    return check_equivalent(original, variant).ok


def _wrong(rows: list[dict[str, object]], label: str) -> list[dict[str, object]]:
    return [r for r in rows if check_equivalent(str(r["original"]), str(r["variant"])).ok != r[label]]


def test_the_corpus_has_200_plus_rewrites_across_the_categories_with_a_held_out_part() -> None:
    assert len(REWRITES) >= 200
    assert len({r["id"] for r in REWRITES}) == len(REWRITES)
    categories = Counter(str(r["category"]) for r in REWRITES)
    assert set(categories) == CHANGING | PRESERVING
    assert all(r["equivalent"] is (r["category"] in PRESERVING) for r in REWRITES)
    for category in categories:
        rows = [r for r in REWRITES if r["category"] == category]
        held = sum(r["split"] == "held_out" for r in rows)
        assert 1 <= held <= len(rows) // 2, category  # every category has held-out rows
    share = sum(r["split"] == "held_out" for r in REWRITES) / len(REWRITES)
    assert 0.25 <= share <= 0.35


def test_every_dev_row_is_judged_right() -> None:
    dev = [r for r in REWRITES if r["split"] == "dev"]
    wrong = {str(r["id"]): check_equivalent(str(r["original"]), str(r["variant"])).reason for r in _wrong(dev, "equivalent")}
    assert set(wrong) == set(KNOWN_DEV_MISSES), wrong


def test_held_out_figures_hold() -> None:
    held = [r for r in REWRITES if r["split"] == "held_out"]
    changes = [r for r in held if not r["equivalent"]]
    keeps = [r for r in held if r["equivalent"]]
    accepted = [r["id"] for r in changes if check_equivalent(str(r["original"]), str(r["variant"])).ok]
    rejected = [r["id"] for r in keeps if not check_equivalent(str(r["original"]), str(r["variant"])).ok]
    print(f"\nheld out: accepted {len(accepted)}/{len(changes)} meaning changes, "
          f"rejected {len(rejected)}/{len(keeps)} paraphrases")
    assert (len(changes), len(keeps)) == (54, 39)
    assert len(accepted) <= HELD_OUT_MAX_ACCEPTED_CHANGES, accepted
    assert len(rejected) <= HELD_OUT_MAX_REJECTED_PARAPHRASES, rejected


def test_the_older_corpus_is_still_judged_right() -> None:
    assert [r["variant"] for r in _wrong(LEGACY, "preserves_meaning")] == []


def test_the_reason_names_what_changed() -> None:
    original = "Please process invoice INV-1005 from Hansa Technik."
    reasons = {v: check_equivalent(original, v).reason for v in (
        "Do not process invoice INV-1005 from Hansa Technik.",
        "Please reject invoice INV-1005 from Hansa Technik.",
        "Please process invoice INV-1005 from Delmar Packaging.",
        "Please process invoice INV-1005.",
        "Please process invoice INV-1005 from Hansa Technik twice.",
        "Please process invoice INV-1005 from Hansa Technik even if the PO doesn't match.",
        "Please process invoice INV-1005 from Hansa Technik; the vendor is already verified.",
        "Please process invoice INV-1005 from Hansa Technik's parent company.",
        "Please process invoice INV-1005 from Hansa Technik and pay it to Volkov Trading.")}
    assert list(reasons.values()) == [
        "action process became not process",
        "action process became reject",
        "entity 'Hansa Technik' became 'Delmar Packaging'",
        "entity 'Hansa Technik' dropped",
        "multiplicity 'twice' added",
        "action not review added; condition added: 'even if the PO does not match'; term 'purchase order' added",
        "fact added: 'the vendor is already verified'; term 'vendor' added",
        "relation 'parent' added",
        "action pay added; entity 'Volkov Trading' added; redirected: 'pay it to Volkov Trading'",
    ]
    amounts = "Please process invoice INV-1005 from Hansa Technik for EUR 28,500.00."
    assert check_equivalent(amounts, amounts.replace("28,500.00", "twenty-eight thousand")).reason == \
        "amount 28500.00 EUR became 28000.00 EUR"
    assert check_equivalent(amounts, amounts.replace("EUR 28,500.00", "twenty-eight thousand five hundred euros")).ok


def test_the_driver_s_own_paraphrases_and_distractors_of_every_reference_task_pass() -> None:
    tasks = [ReplayTask(t.task_id, t.request, f"src-{t.task_id}") for t in TASKS]
    for task in tasks:
        for seed in (3, 11):
            variants = build_variants(task, ("paraphrase", "distractor"), PerturbOptions(variants=6, seed=seed))
            assert variants and not [v for v in variants if v.rejected], [(v.text, v.rejected) for v in variants if v.rejected]


def test_the_study_summary_lists_what_the_guard_rejected(tmp_path: Path) -> None:
    def risky_paraphraser(text: str, n: int, rng: random.Random) -> list[str]:
        return [text.replace("Please process", "Please handle"), text.replace("Please process", "Do not process")]

    task = ReplayTask("INV-1001", "Please process invoice INV-1001 from Northwind Supplies.", "src", "toy-agent", "1", 0,
                      ("lookup_invoice", "pay"))
    summary = run_study(StudyConfig("g", perturbations=("paraphrase",), options=PerturbOptions(variants=2, paraphraser=risky_paraphraser)),
                        [task], ToyAgent())
    assert summary.planned == 1 and len(summary.rejected) == 1
    assert "rejected INV-1001 paraphrase/" in summary.render() and "action process became not process" in summary.render()
    assert summary.rejected[0].text.startswith("Do not process") and summary.as_dict()["rejected_variants"] == 1


@pytest.mark.parametrize("corpus, split", sorted(FIGURES))
def test_the_issue_38_corpora_hold_their_measured_figures(corpus: str, split: str) -> None:
    rows = [json.loads(line) for line in (DATA / corpus).read_text().splitlines() if line.strip()]
    part = [r for r in rows if r["split"] == split]
    changes = [r for r in part if not r["equivalent"]]
    keeps = [r for r in part if r["equivalent"]]
    accepted = sum(_accepts(r["original"], r["variant"]) for r in changes)
    rejected = sum(not _accepts(r["original"], r["variant"]) for r in keeps)
    n_changes, most_accepted, n_keeps, most_rejected = FIGURES[(corpus, split)]
    print(f"\n{corpus} {split}: accepted {accepted}/{len(changes)} meaning changes, "
          f"rejected {rejected}/{len(keeps)} paraphrases")
    assert (len(changes), len(keeps)) == (n_changes, n_keeps)
    assert accepted <= most_accepted and rejected <= most_rejected, (accepted, rejected)
