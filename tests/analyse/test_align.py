"""Needleman–Wunsch divergence localisation: one omission is one gap, ties are deterministic."""

from __future__ import annotations

import itertools
import random

import pytest

from plumbline_otel.analyse.align import GAP, MATCH, MISMATCH, Alignment, align
from plumbline_otel.model import Step


def steps(*names: str) -> list[Step]:
    return [Step(kind="tool_call", name=name) for name in names]


def by_itself(x: str) -> str:
    return x


def test_identical_sequences_align_diagonally() -> None:
    a = steps("search", "lookup", "approve", "pay")
    result = align(a, steps("search", "lookup", "approve", "pay"))
    assert result.pairs == ((0, 0), (1, 1), (2, 2), (3, 3))
    assert result.columns == ("same",) * 4
    assert result.first_divergence is None
    assert result.score == 4 * MATCH


def test_default_key_is_the_step_name_not_its_arguments() -> None:
    a = [Step(kind="tool_call", name="pay", args={"amount": 4820.00})]
    b = [Step(kind="tool_call", name="pay", args={"amount": 48200.00})]
    assert align(a, b).columns == ("same",)


def test_an_omitted_step_is_exactly_one_gap() -> None:
    result = align(steps("search", "lookup", "approve", "pay"), steps("search", "lookup", "pay"))
    assert result.pairs == ((0, 0), (1, 1), (2, None), (3, 2))
    assert result.columns == ("same", "same", "skipped", "same")
    assert result.first_divergence == 2
    assert result.score == 3 * MATCH + GAP


def test_an_added_step_is_exactly_one_extra() -> None:
    result = align(steps("search", "pay"), steps("search", "lookup", "pay"))
    assert result.pairs == ((0, 0), (None, 1), (1, 2))
    assert result.columns == ("same", "extra", "same")
    assert result.first_divergence == 1


def test_an_early_omission_in_a_long_run_does_not_cascade() -> None:
    a = [f"t{i}" for i in range(30)]
    b = a[:3] + a[4:]
    result = align(a, b, key=by_itself)
    assert [c for c in result.columns if c != "same"] == ["skipped"]
    assert result.pairs[3] == (3, None)
    assert result.first_divergence == 3


def test_a_substitution_is_one_substituted_column() -> None:
    result = align(steps("search", "approve", "pay"), steps("search", "escalate", "pay"))
    assert result.pairs == ((0, 0), (1, 1), (2, 2))
    assert result.columns == ("same", "substituted", "same")
    assert result.first_divergence == 1
    assert result.score == 2 * MATCH + MISMATCH


def test_empty_sides() -> None:
    assert align([], []) == Alignment((), (), 0, None)
    only_b = align([], steps("search", "pay"))
    assert only_b.pairs == ((None, 0), (None, 1))
    assert only_b.columns == ("extra", "extra")
    assert only_b.first_divergence == 0
    assert only_b.score == 2 * GAP
    only_a = align(steps("search"), [])
    assert only_a.pairs == ((0, None),)
    assert only_a.columns == ("skipped",)


def test_ties_keep_the_agreeing_prefix_as_long_as_possible() -> None:
    # Either copy of the repeated step could pair with B's one; the first one does.
    assert align(["s", "s"], ["s"], key=by_itself).pairs == ((0, 0), (1, None))
    assert align(["s"], ["s", "s"], key=by_itself).pairs == ((0, 0), (None, 1))
    repeated = align(["a", "s", "s", "p"], ["a", "s", "p"], key=by_itself)
    assert repeated.columns == ("same", "same", "skipped", "same")
    assert repeated.first_divergence == 2


def test_ties_prefer_pairing_then_skipped_then_extra() -> None:
    # A swap: two substitutions and "skip, same, extra" score the same; pairing wins.
    swap = align(["a", "b"], ["b", "a"], key=by_itself)
    assert swap.columns == ("substituted", "substituted")
    assert swap.score == 2 * MISMATCH


def test_a_custom_key_defines_sameness() -> None:
    a = [("pay", 1), ("notify", 2)]
    b = [("PAY", 9), ("notify", 3)]
    result = align(a, b, key=lambda s: s[0].lower())
    assert result.columns == ("same", "same")


def _all_alignments(m: int, n: int) -> list[tuple[str, ...]]:
    """Every alignment of lengths m and n as moves: d(iagonal), s(kipped), e(xtra)."""
    if m == 0 and n == 0:
        return [()]
    found = []
    if m and n:
        found += [("d",) + rest for rest in _all_alignments(m - 1, n - 1)]
    if m:
        found += [("s",) + rest for rest in _all_alignments(m - 1, n)]
    if n:
        found += [("e",) + rest for rest in _all_alignments(m, n - 1)]
    return found


def _score(moves: tuple[str, ...], a: list[str], b: list[str]) -> int:
    i = j = total = 0
    for move in moves:
        if move == "d":
            total += MATCH if a[i] == b[j] else MISMATCH
            i, j = i + 1, j + 1
        elif move == "s":
            total, i = total + GAP, i + 1
        else:
            total, j = total + GAP, j + 1
    return total


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force_optimum_and_documented_tie_break(seed: int) -> None:
    rng = random.Random(seed)
    a = [rng.choice("xyz") for _ in range(rng.randint(0, 4))]
    b = [rng.choice("xyz") for _ in range(rng.randint(0, 4))]
    candidates = _all_alignments(len(a), len(b))
    top = max(_score(moves, a, b) for moves in candidates)
    # Documented preference per column, walking from the start: d < s < e.
    rank = {"d": 0, "s": 1, "e": 2}
    chosen = min(
        (moves for moves in candidates if _score(moves, a, b) == top),
        key=lambda moves: [rank[x] for x in moves],
    )
    result = align(a, b, key=by_itself)
    assert result.score == top
    moves = tuple(
        "d" if i is not None and j is not None else "s" if i is not None else "e"
        for i, j in result.pairs
    )
    assert moves == chosen


def test_every_index_appears_once_in_order() -> None:
    for a, b in itertools.product(["", "xy", "xyzx"], ["", "yx", "zzxy"]):
        result = align(list(a), list(b), key=by_itself)
        assert [i for i, _ in result.pairs if i is not None] == list(range(len(a)))
        assert [j for _, j in result.pairs if j is not None] == list(range(len(b)))
