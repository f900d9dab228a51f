"""Where runs come from: a store file, several files, running servers, or a mix, read as one store.

Past one core, several `plumbline serve` instances sit behind the Collector's `loadbalancing`
exporter, which routes by trace id: each trace, so each run, is whole in exactly one store. Every
reader therefore gives the one-store answer by reading each store and combining what it read:
trajectories are merged in the store's own order (start time, then trajectory id), and coverage
counts are summed before the report is derived from them (`coverage.report_from_counts`). The
certificate, the comparison and the consistency figures are built from the merged runs, so they
pair and group runs by task across stores exactly as one store would.

A trace found in more than one store broke that routing (a misrouted span, a retry sent to another
backend after the ring changed). Its pieces are not runs: the trajectories and the coverage counts
leave them out, and `misrouted` names each such trace and the stores that hold it, so the reader
can say so.

Files are opened one at a time per reader call and closed after; a served file cannot be opened
(DuckDB allows one writing process), so a running instance is read through its gRPC API.

Past a few instances, fanning out is the bottleneck: each instance commits to one lake instead
(`plumbline_otel.lake`, Apache Iceberg tables), and `lake` reads that as one more store: its runs
merged with the rest, its coverage counts summed, each instance in it a store of its own for the
misrouting rule (named `<lake>#<instance>`).
"""

from __future__ import annotations

import glob
import heapq
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plumbline_otel.coverage import report_from_counts
from plumbline_otel.errors import ConfigError
from plumbline_otel.model import Trajectory
from plumbline_otel.rows import trajectory_from_doc
from plumbline_otel.store import RunFilter, Store, open_assembled

if TYPE_CHECKING:
    from plumbline_otel.api.client import PlumblineClient
    from plumbline_otel.lake import LakeReader

_GLOB = set("*?[")
_SAME = frozenset({"version", "form"})  # keys of a counts document that name its shape: equal, never added


@dataclass(frozen=True)
class Misrouted:
    """A trace whose spans are stored in more than one store."""

    trace_id: str
    stores: tuple[str, ...]


def _wait_for_writer(path: str) -> Store:
    """The store open for writing, waiting while another process that is not a server holds it.

    Runners of studies on one host read one `--db` (their tasks, with pending traces assembled) for a moment each at
    start: one that finds the file held by such a reader waits for it, with back-off (0.05 s doubling to 1 s), for up to
    ``PLUMBLINE_STORE_WAIT_S`` (default 120 s), and says once whom it waits for. A server (`plumbline serve`) holds its
    file for good: refused at once, with the holder named (`StoreLocked`)."""
    import os
    import sys
    import time

    from plumbline_otel.store import StoreLocked

    try:
        limit = float(os.environ.get("PLUMBLINE_STORE_WAIT_S", "120"))
    except ValueError:
        limit = 120.0
    deadline = time.monotonic() + limit
    delay, said = 0.05, False
    while True:
        try:
            return Store(path)
        except StoreLocked as exc:
            if exc.is_server or time.monotonic() + delay > deadline:
                raise
            if not said:
                who = f"process {exc.pid}" + (f" (`{exc.command}`)" if exc.command else "") if exc.pid else "another process"
                print(f"plumbline: {path} is held by {who}; waiting for it to let go (up to {limit:g}s)", file=sys.stderr, flush=True)
                said = True
            time.sleep(delay)
            delay = min(1.0, delay * 2)


def expand_dbs(patterns: Iterable[str]) -> tuple[str, ...]:
    """Store files from paths and globs, in the order given (a glob's matches sorted), each once.

    Raises ConfigError for a glob matching nothing: reading several stores as one must not quietly
    read fewer.
    """
    found: dict[str, str] = {}
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if _GLOB & set(pattern) else [pattern]
        if not matches:
            raise ConfigError(f"--db {pattern}: no file matches")
        for path in matches:
            found.setdefault(str(Path(path).resolve()), path)
    return tuple(found.values())


def find_misrouted(ids_by_store: dict[str, Iterable[str]]) -> list[Misrouted]:
    """Traces present in more than one store, sorted by trace id."""
    holders: dict[str, list[str]] = {}
    for store, ids in ids_by_store.items():
        for trace_id in ids:
            holders.setdefault(trace_id, []).append(store)
    return [Misrouted(t, tuple(s)) for t, s in sorted(holders.items()) if len(s) > 1]


def sum_counts(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts of several stores as one: numbers add, mappings merge key by key; the shape's
    `version` and `form`, and anything not a number, must agree."""
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            merged[key] = value if key not in merged else _add(merged[key], value, key)
    return merged


def _add(a: Any, b: Any, key: str) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return sum_counts([a, b])
    if key not in _SAME and isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return a + b
    if a != b:
        raise ConfigError(f"the stores disagree on {key!r} ({a!r} and {b!r}): are they the same plumbline version?")
    return a


def _order(t: Trajectory) -> tuple[int, str]:
    return t.start_ns, t.trajectory_id


class Sources:
    """Store files (`dbs`, paths or globs) and running servers (`servers`, HOST:PORT), read as one.

    Args:
        dbs: store files no server holds.
        servers: running `plumbline serve` instances, read through the gRPC API.
        assemble: rebuild the trajectories of spans received since the last assembly first, and
            fail on a file that cannot be written (as `check` and `certify` do on one file);
            otherwise a file is read as `open_assembled` reads one, its pending traces counted.
        lake: a lake's catalog URI (`plumbline_otel.lake`): every instance's committed runs, read as one store.
    """

    def __init__(self, dbs: Iterable[str] = (), servers: Iterable[str] = (), assemble: bool = False, lake: str | None = None) -> None:
        self.dbs = expand_dbs(dbs)
        self.servers = tuple(dict.fromkeys(servers))
        self.assemble = assemble
        self._pending: dict[str, int] = {}
        self.lake: LakeReader | None = None
        if lake:
            from plumbline_otel.lake import Lake, LakeReader  # pyiceberg, only when a lake is read

            self.lake = LakeReader(Lake(lake))
        if not self.dbs and not self.servers and self.lake is None:
            raise ConfigError("no store given: --db FILE (repeatable, or a glob), --server HOST:PORT (repeatable) or --lake CATALOG_URI")
        absent = [path for path in self.dbs if not Path(path).is_file()]
        if absent and len(self.names) > 1:  # one file keeps the one-store rules (check may create it)
            raise ConfigError(f"--db {absent[0]}: no such store file")

    @property
    def names(self) -> tuple[str, ...]:
        """How each store is named in messages: its file path, its server address, the lake's URI."""
        return (*self.dbs, *self.servers, *((self.lake.lake.label,) if self.lake else ()))

    @property
    def single_db(self) -> str | None:
        """The file, when the sources are exactly one file: the reader's ordinary one-store path."""
        return self.dbs[0] if len(self.dbs) == 1 and not self.servers else None

    def _store(self, path: str) -> Store:
        if not self.assemble:  # a reader's rule: assemble what is pending if it can, else count it
            store, self._pending[path] = open_assembled(path)
            return store
        store = _wait_for_writer(path)
        store.assemble()
        return store

    @property
    def pending_traces(self) -> int:
        """Traces files opened read-only hold unassembled (left out of what was read; 0 for servers)."""
        return sum(self._pending.values())

    def _client(self, address: str) -> PlumblineClient:
        from plumbline_otel.api.client import PlumblineClient  # grpc, only when a server is read

        return PlumblineClient(address)

    @cached_property
    def misrouted(self) -> list[Misrouted]:
        """Traces stored in more than one of the stores (none when there is one store)."""
        if len(self.names) < 2 and self.lake is None:
            return []
        ids: dict[str, Iterable[str]] = {}
        for path in self.dbs:
            with self._store(path) as store:
                ids[path] = store.trace_ids()
        for address in self.servers:
            with self._client(address) as client:
                ids[address] = list(client.trace_ids())
        if self.lake is not None:  # each instance that committed to the lake is a store of its own
            ids.update(self.lake.trace_ids_by_instance())
        return find_misrouted(ids)

    def trajectories(self, service: str | None = None, task: str | None = None, since_ns: int | None = None,
                     where: str | None = None, runs: RunFilter | None = None) -> Iterator[Trajectory]:
        """Every store's trajectories merged in start order, of `runs` when given, misrouted traces left out.

        `where` is the user's SQL over a file's trajectories table (`--where`); a server cannot take it
        (ConfigError). `runs` is bound by each store and the lake, and tested on a server's runs as they come.
        """
        if where and self.servers:
            raise ConfigError("--where is SQL over a store file; it cannot be used with --server")
        left_out = {m.trace_id for m in self.misrouted}
        with ExitStack() as stack:
            streams: list[Iterator[Trajectory]] = []
            for path in self.dbs:
                store = stack.enter_context(self._store(path))
                streams.append(store.trajectories(service=service, task=task, since_ns=since_ns, where=where, runs=runs))
            for address in self.servers:
                served = self._served(stack.enter_context(self._client(address)), service, task, since_ns)
                streams.append(served if runs is None else filter(runs.matches, served))
            if self.lake is not None:
                streams.append(self.lake.trajectories(service=service, task=task, since_ns=since_ns, where=where, runs=runs))
            for t in heapq.merge(*streams, key=_order):
                if t.trace_id not in left_out:
                    yield t

    def _served(self, client: PlumblineClient, service: str | None, task: str | None, since_ns: int | None) -> Iterator[Trajectory]:
        for doc in client.trajectories(service=service, task=task, since_ns=since_ns):
            yield trajectory_from_doc(doc)

    def coverage(self, since_ns: int | None = None) -> dict[str, Any]:
        """The coverage report of all the stores: their counts summed, then the report derived once.

        Read from several stores it also names them (`stores`) and the traces more than one of
        them holds (`misrouted_traces`, left out of the counts); read from one it is exactly that
        store's report.
        """
        left_out = [m.trace_id for m in self.misrouted]
        parts = []
        for path in self.dbs:
            with self._store(path) as store:
                parts.append(store.coverage_counts(since_ns=since_ns, exclude_traces=left_out))
        for address in self.servers:
            with self._client(address) as client:
                parts.append(client.coverage(since_ns=since_ns, counts=True, exclude_trace_ids=left_out))
        if self.lake is not None:
            with self.lake.memory_store() as store:
                parts.append(store.coverage_counts(since_ns=since_ns, exclude_traces=left_out))
        report = report_from_counts(sum_counts(parts))
        if len(self.names) > 1 or self.misrouted:  # (a lake's instances are stores of their own)
            report["stores"] = list(self.names)
            report["misrouted_traces"] = [{"trace_id": m.trace_id, "stores": list(m.stores)} for m in self.misrouted]
        return report

    def notice(self) -> str | None:
        """One paragraph naming the misrouted traces and where they are, or None when there are none."""
        if not self.misrouted:
            return None
        lines = [f"{len(self.misrouted)} trace(s) reached more than one store (misrouted: the collector must route by "
                 "traceID); their pieces are left out of the runs:"]
        lines += [f"  {m.trace_id} in {', '.join(m.stores)}" for m in self.misrouted[:20]]
        if len(self.misrouted) > 20:
            lines.append(f"  … and {len(self.misrouted) - 20} more")
        return "\n".join(lines)


__all__ = ["Misrouted", "Sources", "expand_dbs", "find_misrouted", "sum_counts"]
