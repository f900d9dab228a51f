"""The prepare stage on every core: decode, normalise, columnar span batches and assembly, sharded by trace id.

    reader / receiver ──unit (raw request bytes)──► every shard
        a shard keeps only the spans whose trace id falls in it (the way the Collector's
        loadbalancing exporter routes), applies the content rules, normalises them into an Arrow
        span table, holds its traces' records and assembles each trace once, when it goes quiet
        (or on flush), into trajectory rows
    ◄──parts── the writer (`PartWriter`, the same for file ingest and `serve`), the one owner of the
        DuckDB file, commits span tables, then the trajectories whose span count equals the store's
        (`Store.write_assembled`)

A worker's part crosses to the writer as a small message; its Arrow table goes as a file in a
spool directory in memory (`/dev/shm`), which the writer maps without copying (`Spool`).

A shard runs in a worker process (`workers` > 0) or in the caller's process (`workers` = 0, for
small inputs where starting processes costs more than it saves); both run the same `Shard` code,
so they store the same rows. Nothing here needs the spans of a trace to arrive together: a trace
whose stored spans differ from the ones its shard held (spans from before a restart, a trace the
shard let go of to bound memory, a retry of an assembled trace) stays dirty and the store rebuilds
it from its rows. Sharding only decides where work is done, never what is stored.

    _shard.py   a shard's work: routing by trace id, decode, content rules, normalise, hold, assemble
    _parts.py   what shards send the writer
    _spool.py   the in-memory files that carry parts' tables from workers to the writer
    _pool.py    the worker processes (or one in-process shard) behind one interface, `ShardPool`
    _writer.py  `PartWriter`, the one writer of parts into the store (file ingest's and `serve`'s)

A unit that is a logs request (a logs file) is read by shard 0 alone, which sends its GenAI records
to the writer (`LogPart`). Shards never fold log records: the store refuses a shard's trajectory for
a trace that has log records and rebuilds it with them, so the order logs and spans arrive in does
not matter.
"""

from __future__ import annotations

from plumbline_otel.pipeline._parts import Flushed, LogPart, Part, SpanPart, TrajectoryPart, concat_parts
from plumbline_otel.pipeline._pool import ShardPool, collect_less_often
from plumbline_otel.pipeline._shard import Shard, ShardSettings, default_workers, first_traces, json_shard_of, shard_of
from plumbline_otel.pipeline._spool import spooled_bytes, spools
from plumbline_otel.pipeline._writer import PartWriter

__all__ = [
    "Flushed",
    "LogPart",
    "Part",
    "PartWriter",
    "Shard",
    "ShardPool",
    "ShardSettings",
    "SpanPart",
    "TrajectoryPart",
    "collect_less_often",
    "concat_parts",
    "default_workers",
    "first_traces",
    "json_shard_of",
    "shard_of",
    "spooled_bytes",
    "spools",
]
