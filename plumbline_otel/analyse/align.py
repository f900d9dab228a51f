"""Divergence localisation: where do two step sequences part ways (docs/statistics.md).

Comparing two runs position by position turns one omitted step into a mismatch at every later
position. A global (Needleman–Wunsch) alignment with match +2, mismatch −1, gap −2 makes an
omission one gap: a gap costs less than the run of mismatches it replaces, and a mismatch costs
less than the two gaps it would otherwise take, so a replaced step reads as one substitution.

Steps are compared by a key (the step name by default); arguments are the caller's business,
compared on the "same" columns once the alignment has paired the steps up.

Ties between optimal alignments are broken deterministically: walking the columns from the
start, prefer pairing the two current steps (same or substituted), then a step in A only
(skipped), then a step in B only (extra). So the agreeing prefix is as long as any optimal
alignment allows, and the first divergence is as late as it can honestly be put: A=[s, s] against
B=[s] pairs the first s and marks the second one skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from plumbline_otel.model import Step

Column = Literal["same", "skipped", "extra", "substituted"]

MATCH = 2
MISMATCH = -1
GAP = -2


@dataclass(frozen=True)
class Alignment:
    """A global alignment of sequences A and B.

    `pairs[c]` holds the indices into A and B aligned at column c (None for the gap side) and
    `columns[c]` what that column means. `first_divergence` is the first column that is not
    "same", None when the sequences agree throughout.
    """

    pairs: tuple[tuple[int | None, int | None], ...]
    columns: tuple[Column, ...]
    score: int
    first_divergence: int | None


def step_name(step: Step) -> str:
    """The default alignment key: steps are the same action when their names (tools) match."""
    return step.name


def align(
    a: Sequence[Any],
    b: Sequence[Any],
    key: Callable[[Any], Hashable] = step_name,
) -> Alignment:
    """Needleman–Wunsch alignment of A against B, tie-broken as the module docstring says.

    The table is filled over suffixes (best[i][j] scores a[i:] against b[j:]) so the traceback
    walks forwards from the start, which is what lets the tie-break favour a long agreeing
    prefix. Time and memory are O(len(a) * len(b)); trajectories are tens of steps.
    """
    ka = [key(x) for x in a]
    kb = [key(y) for y in b]
    m, n = len(ka), len(kb)

    def pair_score(i: int, j: int) -> int:
        return MATCH if ka[i] == kb[j] else MISMATCH

    best = [[0] * (n + 1) for _ in range(m + 1)]
    for i in range(m - 1, -1, -1):
        best[i][n] = best[i + 1][n] + GAP
    for j in range(n - 1, -1, -1):
        best[m][j] = best[m][j + 1] + GAP
    for i in range(m - 1, -1, -1):
        row, below = best[i], best[i + 1]
        for j in range(n - 1, -1, -1):
            row[j] = max(below[j + 1] + pair_score(i, j), below[j] + GAP, row[j + 1] + GAP)

    pairs: list[tuple[int | None, int | None]] = []
    columns: list[Column] = []
    i = j = 0
    while i < m or j < n:
        here = best[i][j]
        if i < m and j < n and here == best[i + 1][j + 1] + pair_score(i, j):
            pairs.append((i, j))
            columns.append("same" if ka[i] == kb[j] else "substituted")
            i, j = i + 1, j + 1
        elif i < m and here == best[i + 1][j] + GAP:
            pairs.append((i, None))
            columns.append("skipped")
            i += 1
        else:
            pairs.append((None, j))
            columns.append("extra")
            j += 1

    first = next((c for c, kind in enumerate(columns) if kind != "same"), None)
    return Alignment(tuple(pairs), tuple(columns), best[0][0], first)
