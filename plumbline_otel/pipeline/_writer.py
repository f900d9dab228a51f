"""The one writer of shard parts into the store: file ingest (`ingest.py`) and `serve` (the write queue's commit thread) both commit through it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import pyarrow as pa

from plumbline_otel.errors import Problem
from plumbline_otel.pipeline._parts import LogPart, Part, SpanPart, TrajectoryPart, concat_parts

if TYPE_CHECKING:  # a shard worker imports this package and no database (docs/performance.md): the store is the writer's
    from plumbline_otel.store import Store, WriteResult

# Span rows (Arrow bytes) a writer gathers at most before it commits: a row group of the bench corpus's
# spans is ~27 MB, but one of spans of several KB each (the demo's replayed runs) held ~150 MB more.
_PENDING_BYTES = 48 << 20


class PartWriter:
    """Commits the parts shards send, in the order they come.

    Span parts are gathered into one transaction until `batch_spans` rows (or `_PENDING_BYTES` of
    them) are gathered, or the caller commits. With `whole_groups` (file ingest) only whole row
    groups of `batch_spans` are committed and the rows past the last are carried to the next
    transaction: DuckDB writes those into the file directly, while a transaction that leaves a group
    part-filled is rewritten at the next checkpoint (100,000 spans in commits of 16,600: a 0.36 s
    checkpoint and a 20 MB file; in commits of 16,384: 0.006 s and 11 MB). `serve` commits whatever
    it gathered, since it answers a request only once its spans are committed.

    A trajectory part waits until the spans gathered before it are committed (its trajectories were
    built from them), then is stored for the traces whose stored spans match
    (`Store.write_assembled`); committing early for it would cut a transaction short. Log parts are
    stored at once. `on_spans` hears each span transaction's result, `on_trajectories` each
    trajectory part with how many of its traces were stored. A failed commit raises; `drop` then
    forgets what was gathered (its traces stay dirty in the store and are rebuilt from their rows).
    """

    def __init__(self, store: Store, batch_spans: int | None = None, source: str = "file", *, whole_groups: bool = False,
                 on_spans: Callable[[WriteResult], None] | None = None,
                 on_trajectories: Callable[[TrajectoryPart, int], None] | None = None) -> None:
        """`batch_spans`: spans a transaction takes at most (None: a row group of the store's, `store.ROW_GROUP_SIZE`)."""
        from plumbline_otel.store import ROW_GROUP_SIZE  # here, not at import: see the imports

        self.store, self.source, self.whole_groups = store, source, whole_groups
        self.batch_spans = ROW_GROUP_SIZE if batch_spans is None else batch_spans
        self.on_spans, self.on_trajectories = on_spans, on_trajectories
        self.drop()

    def drop(self) -> None:
        """Forget everything gathered and not committed."""
        self.pending: list[SpanPart] = []
        self.problems: list[Problem] = []  # met before the shards (a request's decoding), stored with the spans
        self.carried: pa.Table | None = None  # rows past the last whole group of the previous transaction
        self.pending_spans = 0  # rows gathered: carried and pending
        self.pending_bytes = 0  # their Arrow bytes
        self.assembled: list[tuple[int, TrajectoryPart]] = []  # each with the rows gathered before it

    def take(self, part: Part, problems: Iterable[Problem] = ()) -> None:
        """Gather one part (committing when a transaction is full), or store it; `problems` go with its spans' transaction."""
        if isinstance(part, SpanPart):
            self.pending.append(part)
            self.problems.extend(problems)
            self.pending_spans += part.spans
            self.pending_bytes += part.table.nbytes if part.table is not None else 0
            if self.pending_spans >= self.batch_spans:
                self.commit(whole_groups=self.whole_groups)
            elif self.pending_bytes >= _PENDING_BYTES:
                self.commit()
        elif isinstance(part, TrajectoryPart):
            self.assembled.append((self.pending_spans, part))
            if not self.pending_spans:
                self.commit()
        elif isinstance(part, LogPart):
            self.store.write_logs(part.rows)  # a retried record is stored once

    def commit(self, whole_groups: bool = False) -> None:
        """Commit the gathered spans in one transaction (only whole row groups with `whole_groups`), then the
        trajectory parts whose spans are all committed."""
        table, problems = concat_parts(self.pending)
        problems = problems + self.problems  # the shards', then those met before them
        if self.carried is not None:
            table = self.carried if table is None else pa.concat_tables([self.carried, table])
        rows = table.num_rows if table is not None else 0
        cut = rows - rows % self.batch_spans if whole_groups else rows
        carried = None
        if table is not None and cut < rows:
            carried, table = table.slice(cut), table.slice(0, cut)
        if cut or problems:
            result = self.store.write_span_table(table, problems, self.source)
            if self.on_spans is not None:
                self.on_spans(result)
        self.pending, self.problems, self.carried, self.pending_spans = [], [], carried, rows - cut
        self.pending_bytes = carried.nbytes if carried is not None else 0
        ready = [part for before, part in self.assembled if before <= cut]
        self.assembled = [(before - cut, part) for before, part in self.assembled if before > cut]
        for part in ready:
            stored = self.store.write_assembled(part.table, part.counts)
            if self.on_trajectories is not None:
                self.on_trajectories(part, stored)
