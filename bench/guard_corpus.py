"""The equivalence guard's errors on corpora of rewrites, per split and per kind of rewrite.

    python bench/guard_corpus.py [--corpus PATH ...] [--dev-corpus PATH ...] [--split dev|held_out|all] [--wrong]

Each corpus is JSON lines with ``original``, ``variant``, ``equivalent``, ``category`` and
``split``. By default: ``tests/replay/data/guard_corpus_v3.jsonl`` (574 rows written for issue
38 by someone who never read the guard or the other corpora), ``guard_corpus_v2.jsonl`` (424
rows, written before that round's rules changed) and ``guard_rewrites.jsonl`` (the older 300
rows). Two error rates are printed for each corpus and split:

* false accepts: meaning changes the guard let through (a variant that would be run as if it
  were the task, though it asks for something else);
* false rejects: paraphrases the guard refused (a perturbation lost, never a wrong verdict).

then the same per category. ``--wrong`` lists the rows judged wrong, with the guard's reason,
for the ``dev`` split only: the held-out split is there to be measured, not read, so its rows
are never printed. ``--split dev`` keeps held-out figures off the screen while rules change.

A corpus whose held-out rows have been measured often enough to be tuned to is development data
all through: name it with ``--dev-corpus`` instead of ``--corpus`` and ``--wrong`` lists its rows
of every split (its figures are still printed per split, so rounds stay comparable).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plumbline_otel.replay.guard import check_equivalent  # noqa: E402

DATA = ROOT / "tests" / "replay" / "data"
DEFAULT_CORPORA = (DATA / "guard_corpus_v3.jsonl", DATA / "guard_corpus_v2.jsonl", DATA / "guard_rewrites.jsonl")


def load(path: Path) -> list[dict[str, object]]:
    """The corpus's rows; every row must carry the fields the bench reads."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for row in rows:
        missing = {"original", "variant", "equivalent", "category", "split"} - set(row)
        if missing:
            raise SystemExit(f"{path.name}: row {row.get('id')} lacks {sorted(missing)}")
    return rows


def rate(wrong: int, total: int) -> str:
    """'3/92 (3.3%)', or '0/0' when there is nothing to count."""
    return f"{wrong}/{total} ({100 * wrong / total:.1f}%)" if total else "0/0"


def judge(rows: list[dict[str, object]]) -> list[tuple[dict[str, object], bool, str | None]]:
    """Each row with whether the guard accepted its variant and the guard's reason."""
    out = []
    for row in rows:
        verdict = check_equivalent(str(row["original"]), str(row["variant"]))
        out.append((row, verdict.ok, verdict.reason))
    return out


def report(path: Path, split: str, show_wrong: bool, fully_dev: bool = False) -> None:
    """Print one corpus's figures: per split, then per category within each split. Wrong rows are
    listed (``show_wrong``) for the dev split, or for every split of a corpus that is ``fully_dev``."""
    rows = load(path)
    splits = sorted({str(r["split"]) for r in rows}) if split == "all" else [split]
    started = time.perf_counter()
    judged = judge([r for r in rows if str(r["split"]) in splits])
    seconds = time.perf_counter() - started
    per_pair = f" ({1000 * seconds / len(judged):.1f} ms a pair)" if judged else ""
    print(f"\n{path.name}: {len(rows)} rows; {len(judged)} judged in {seconds:.2f}s{per_pair}")
    for name in splits:
        part = [j for j in judged if j[0]["split"] == name]
        changes = [j for j in part if not j[0]["equivalent"]]
        keeps = [j for j in part if j[0]["equivalent"]]
        accepted = sum(ok for _, ok, _ in changes)
        rejected = sum(not ok for _, ok, _ in keeps)
        print(f"  {name:9s} false accepts {rate(accepted, len(changes)):18s} "
              f"false rejects {rate(rejected, len(keeps))}")
        by_kind: dict[str, list[tuple[dict[str, object], bool, str | None]]] = defaultdict(list)
        for j in part:
            by_kind[str(j[0]["category"])].append(j)
        for kind in sorted(by_kind, key=lambda k: (bool(by_kind[k][0][0]["equivalent"]), k)):
            items = by_kind[kind]
            label = "paraphrase" if items[0][0]["equivalent"] else "change"
            wrong = sum(ok != bool(r["equivalent"]) for r, ok, _ in items)
            what = "rejected" if label == "paraphrase" else "accepted"
            print(f"    {kind:20s} {label:10s} {what} {rate(wrong, len(items))}")
        if show_wrong and (name == "dev" or fully_dev):
            for r, ok, reason in part:
                if ok != bool(r["equivalent"]):
                    print(f"    WRONG {r.get('id')} [{r['category']}] {'accepted' if ok else 'rejected'}:"
                          f" {r['variant']!r}" + ("" if ok else f"\n          reason: {reason}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, action="append", help="a JSON-lines corpus (repeatable)")
    parser.add_argument("--split", default="all", choices=("all", "dev", "held_out"))
    parser.add_argument("--dev-corpus", type=Path, action="append", default=[],
                        help="a corpus that is development data in every split: --wrong lists all its rows (repeatable)")
    parser.add_argument("--wrong", action="store_true", help="list the dev rows judged wrong")
    args = parser.parse_args()
    for path in args.corpus or ([] if args.dev_corpus else DEFAULT_CORPORA):
        report(path, args.split, args.wrong)
    for path in args.dev_corpus:
        report(path, args.split, args.wrong, fully_dev=True)


if __name__ == "__main__":
    main()
