"""What a shard sends the writer: its share of a unit's spans, the trajectories it assembled, log records, and "flushed"."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from plumbline_otel.errors import Problem
from plumbline_otel.normalise import LogRows


@dataclass
class SpanPart:
    """One shard's share of one unit: its spans as an Arrow table, and what was rejected."""

    seq: int
    shard: int
    table: pa.Table | None
    problems: list[Problem]
    spans: int
    rejected: int
    error: str | None = None  # an internal failure: the unit's spans of this shard were not prepared


@dataclass
class TrajectoryPart:
    """Trajectories a shard assembled, with the number of spans each was built from.

    `let_go` names the quiet traces the shard stopped holding because they grew long: the store
    rebuilds them from their rows, run by run.
    """

    shard: int
    table: pa.Table
    counts: dict[str, int]
    let_go: list[str] = field(default_factory=list)


@dataclass
class LogPart:
    """GenAI log records met in a file (one shard, the first, reads them): the writer stores them."""

    seq: int
    rows: LogRows


@dataclass
class Flushed:
    """A shard has assembled everything it held (the answer to `flush`)."""

    shard: int


Part = SpanPart | TrajectoryPart | LogPart | Flushed


def concat_parts(parts: Iterable[SpanPart]) -> tuple[pa.Table | None, list[Problem]]:
    """The span tables of several parts as one table (for one transaction), with their problems."""
    tables, problems = [], []
    for part in parts:
        if part.table is not None:
            tables.append(part.table)
        problems.extend(part.problems)
    return (pa.concat_tables(tables) if tables else None), problems
