"""The shard pipeline: worker processes store exactly what one process stores, whatever the order.

Every test here compares against a reference that does not go through the shards: each trace's
spans normalised and assembled whole, in one call (`_reference`).
"""

from __future__ import annotations

import gc
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pytest
from corpus import build_requests, odd_type_requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp import to_otlp_json
from waits import EVENT_DEADLINE_S

from plumbline_otel import ingest as ingest_mod
from plumbline_otel.assemble import assemble, assemble_runs
from plumbline_otel.decode import Unit, iter_units
from plumbline_otel.ingest import _UNITS_AHEAD, IngestSummary, _fed, ingest_files, transaction_spans
from plumbline_otel.model import SpanRecord
from plumbline_otel.normalise import Limits, normalise_request
from plumbline_otel.pipeline import PartWriter, Shard, ShardPool, ShardSettings, SpanPart, TrajectoryPart, _pool, shard_of, spooled_bytes, spools
from plumbline_otel.pipeline._spool import Spool
from plumbline_otel.store import ROW_GROUP_SIZE, SCHEMA_VERSION, Store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "producers"


def _exports(store: Store) -> list[str]:
    return sorted(json.dumps(t.export(), sort_keys=True) for t in store.trajectories())


def _reference(requests: list[ExportTraceServiceRequest]) -> list[str]:
    """Each trace assembled from all of its spans at once, with no store and no shards."""
    by_trace: dict[str, dict[str, SpanRecord]] = {}
    for request in requests:
        for rec in normalise_request(request)[0]:
            by_trace.setdefault(rec.trace_id, {}).setdefault(rec.span_id, rec)
    runs = [assemble(list(spans.values())) for spans in by_trace.values()]
    return sorted(json.dumps(t.export(), sort_keys=True) for t in runs if t is not None)


def _shuffled_requests(seed: int, spans: int = 3000) -> list[ExportTraceServiceRequest]:
    """The corpus re-cut into small requests in random order, each trace's spans scattered, with retries."""
    rng = random.Random(seed)
    all_spans = []
    resource = None
    for request in build_requests(spans, 500):
        resource = request.resource_spans[0]
        all_spans.extend(resource.scope_spans[0].spans)
    rng.shuffle(all_spans)
    requests = []
    for start in range(0, len(all_spans), 97):
        piece = ExportTraceServiceRequest()
        rs = piece.resource_spans.add()
        assert resource is not None
        rs.resource.CopyFrom(resource.resource)
        rs.scope_spans.add().spans.extend(all_spans[start:start + 97])
        requests.append(piece)
    requests.extend(rng.sample(requests, 5))  # exporter retries, arriving late
    return requests


def _write_jsonl(path: Path, requests: list[ExportTraceServiceRequest]) -> Path:
    path.write_text("".join(json.dumps(to_otlp_json(r)) + "\n" for r in requests))
    return path


def _write_pb(path: Path, requests: list[ExportTraceServiceRequest]) -> Path:
    with open(path, "wb") as out:
        for r in requests:
            body = r.SerializeToString()
            out.write(len(body).to_bytes(4, "big") + body)
    return path


@pytest.mark.slow
def test_two_workers_store_what_each_trace_assembled_whole_gives(tmp_path: Path) -> None:
    requests = _shuffled_requests(seed=1)
    half = len(requests) // 2
    files = [str(_write_jsonl(tmp_path / "a.otlp.jsonl", requests[:half])), str(_write_pb(tmp_path / "b.otlp.pb", requests[half:]))]
    expected = _reference(requests)
    for workers in (0, 2):
        with Store(tmp_path / f"w{workers}.duckdb") as store:
            summary = ingest_files(store, files, workers=workers)
            assert _exports(store) == expected and summary.workers == workers
            spans = store.connection.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone()
            assert spans is not None and spans[0] == spans[1] == summary.stored
            assert summary.duplicate == sum(len(r.resource_spans[0].scope_spans[0].spans) for r in requests) - summary.stored
            assert not store.connection.execute("SELECT * FROM dirty_traces").fetchall()


@pytest.mark.slow
def test_workers_give_the_producer_fixtures_the_same_trajectories_and_problems(tmp_path: Path) -> None:
    bad_span = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "ab" * 8, "name": "bad"}]}]}]}
    damaged = tmp_path / "damaged.otlp.jsonl"
    damaged.write_text(json.dumps(bad_span) + "\n{not json\n")
    files = [str(p) for p in sorted(FIXTURES.glob("*.otlp.*"))] + [str(damaged)]
    results = []
    for workers in (0, 2):
        with Store(tmp_path / f"w{workers}.duckdb") as store:
            summary = ingest_files(store, files, workers=workers)
            results.append((_exports(store), summary.stored, summary.duplicate, sorted(map(str, summary.problems))))
    assert results[0] == results[1]
    assert results[0][0] and len(results[0][3]) == 2  # each problem reported once, not once per shard


def _through_shards(store: Store, settings: ShardSettings, requests: list[ExportTraceServiceRequest]) -> IngestSummary:
    """The requests through an in-process shard pool into `store`, without the store's own assembly after."""
    summary = IngestSummary()
    writer = PartWriter(store, batch_spans=100, whole_groups=True, on_spans=summary.written)
    with ShardPool(settings) as pool:
        for request in requests:
            pool.submit(Unit("protobuf", request.SerializeToString(), "test"))
            for part in pool.parts():
                summary.count(part)
                writer.take(part)
        for part in pool.flush():
            summary.count(part)
            writer.take(part)
    writer.commit()
    return summary


def test_attribute_values_of_any_type_on_the_keys_plumbline_reads_cost_no_span(tmp_path: Path) -> None:
    # Numbers for names, text for counts, lists, maps, bytes and NaN on every key normalisation and
    # assembly read: each span is stored, typed (an unexpected type used to fail the whole unit's
    # spans of its shard, in Arrow or in the compiled model), and assembled as in one process.
    requests = list(odd_type_requests(400))
    sent = sum(len(ss.spans) for r in requests for rs in r.resource_spans for ss in rs.scope_spans)
    with Store(tmp_path / "s.duckdb") as store:
        summary = _through_shards(store, ShardSettings(), requests)
        assert (summary.stored, summary.rejected_spans, summary.problems) == (sent, 0, [])
        # the reference through JSON as the store keeps it: JSON has no NaN, so a NaN context value is null
        assert _exports(store) == sorted(json.dumps(orjson.loads(orjson.dumps(json.loads(e))), sort_keys=True) for e in _reference(requests))
        names = store.connection.execute("SELECT count(*) FROM spans WHERE tool_name LIKE '[%' OR model LIKE '{%'").fetchone()
        assert names is not None and names[0] > 0  # lists and maps kept as JSON text in text fields


def test_a_shard_makes_no_reference_cycles_so_its_worker_can_leave_the_collector_off() -> None:
    # Shard workers run the collector only every `_COLLECT_SECONDS` seconds (pipeline/_pool.py): garbage
    # that only the collector frees would pile up between passes. Every fixture, odd-type values,
    # values over the limits, and long traces let go, through one shard: nothing unreachable is left.
    units = [unit for path in sorted(FIXTURES.parent.rglob("*.jsonl")) for unit in iter_units(path)]
    units += [Unit("protobuf", r.SerializeToString(), "odd") for r in odd_type_requests(200)]
    units += [Unit("protobuf", r.SerializeToString(), "corpus") for r in build_requests(3000, 500)]
    assert len(units) > 300
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for settings in (ShardSettings(), ShardSettings(limits=Limits(max_value_bytes=64), long_trace_spans=5, hold_spans=50)):
            shard = Shard(0, settings)
            for seq, unit in enumerate(units):
                shard.prepare(seq, unit)
            shard.assemble_quiet(None)
        assert gc.collect() == 0, sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_a_trace_its_shard_let_go_of_is_rebuilt_from_the_store(tmp_path: Path) -> None:
    requests = _shuffled_requests(seed=2, spans=700)
    with Store(tmp_path / "s.duckdb") as store:
        _through_shards(store, ShardSettings(hold_spans=40), requests)
        rebuilt = store.assemble()
        assert rebuilt > 0  # traces assembled early from some of their spans were left dirty, then rebuilt whole
        assert _exports(store) == _reference(requests)


def _long_trace(spans: int, one_run: bool = False) -> list[ExportTraceServiceRequest]:
    """The corpus's traces as one long trace (a long-running agent: one run per corpus trace), in
    requests of 50 spans; with `one_run`, every run sits under one agent span (its sub-agents), so it is one run.
    (Under a plain session span they would be the session's runs, issue 29 item 4.)"""
    requests = list(build_requests(spans, 50))
    session = b"\xff" * 8
    for request in requests:
        for span in request.resource_spans[0].scope_spans[0].spans:
            span.trace_id = (7).to_bytes(16, "big")
            if one_run and not span.parent_span_id:
                span.parent_span_id = session
    if one_run:
        first = requests[0].resource_spans[0].scope_spans[0].spans[0]
        requests[0].resource_spans[0].scope_spans[0].spans.add(
            trace_id=first.trace_id, span_id=session, name="invoke_agent session",
            start_time_unix_nano=first.start_time_unix_nano - 1, end_time_unix_nano=first.start_time_unix_nano)
        agent = requests[0].resource_spans[0].scope_spans[0].spans[-1].attributes.add(key="gen_ai.operation.name")
        agent.value.string_value = "invoke_agent"
    return requests


def _runs_reference(requests: list[ExportTraceServiceRequest]) -> list[str]:
    """Each trace's runs assembled from all of its spans at once, with no store and no shards."""
    by_trace: dict[str, dict[str, SpanRecord]] = {}
    for request in requests:
        for rec in normalise_request(request)[0]:
            by_trace.setdefault(rec.trace_id, {}).setdefault(rec.span_id, rec)
    return sorted(json.dumps(t.export(), sort_keys=True) for spans in by_trace.values() for t in assemble_runs(list(spans.values())))


def test_a_shard_lets_a_long_trace_go_instead_of_holding_it_whole() -> None:
    long_id = (7).to_bytes(16, "big").hex()
    shard = Shard(0, ShardSettings(long_trace_spans=60))
    for seq, request in enumerate([*_long_trace(400), *build_requests(70, 70, first_trace=1000)]):
        shard.prepare(seq, Unit("protobuf", request.SerializeToString(), "test"))
        assert len(shard.held.get(long_id, [])) < 60
    parts = shard.assemble_quiet(None)
    trajectories = [p for p in parts if isinstance(p, TrajectoryPart)]
    assert [p.let_go for p in trajectories] == [[long_id]]
    assert long_id not in trajectories[0].counts and len(trajectories[0].counts) == 10  # the short traces, assembled
    assert not shard.held and not shard.let_go and not shard.last_seen


@pytest.mark.parametrize("one_run", [False, True], ids=["many runs", "one run"])
def test_a_long_trace_is_rebuilt_run_by_run_as_if_assembled_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_run: bool) -> None:
    import plumbline_otel.store._store as store_module

    monkeypatch.setattr(store_module, "LONG_TRACE_SPANS", 60)
    requests = [*_long_trace(700, one_run), *build_requests(300, 100, first_trace=1000)]
    read: list[int] = []
    records_for = Store._records_for

    def spy(self: Store, trace_ids: list[str], span_ids: list[str] | None = None) -> dict[str, list[SpanRecord]]:
        found = records_for(self, trace_ids, span_ids)
        read.append(sum(map(len, found.values())))
        return found

    monkeypatch.setattr(Store, "_records_for", spy)
    with Store(tmp_path / "s.duckdb") as store:
        _through_shards(store, ShardSettings(long_trace_spans=60), requests)
        assert store.pending_traces() == 1  # the long trace, let go by its shard
        rebuilt = store.assemble()
        assert _exports(store) == _runs_reference(requests)
        runs = store.connection.execute("SELECT count(*) FROM trajectories WHERE trace_id = ?", [(7).to_bytes(16, "big").hex()]).fetchone()
        assert runs is not None and rebuilt == runs[0] == (1 if one_run else 100)
    # each read of the long trace stayed within the bound, unless one run is longer than it
    assert read and (max(read) == 701 if one_run else max(read) <= 60)


@pytest.mark.slow
def test_a_long_trace_through_worker_processes_stores_what_the_trace_assembled_whole_gives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from plumbline_otel.assemble import LONG_TRACE_SPANS

    requests = _long_trace(LONG_TRACE_SPANS + 500)  # past the default bound, so its shard lets it go
    path = str(_write_pb(tmp_path / "long.otlp.pb", requests))
    rebuilt_long: list[str] = []
    long_trace_runs = Store._long_trace_runs

    def spy(self: Store, trace_id: str) -> Iterator[pa.Table]:
        rebuilt_long.append(trace_id)
        return long_trace_runs(self, trace_id)

    monkeypatch.setattr(Store, "_long_trace_runs", spy)
    expected = _runs_reference(requests)
    with Store(tmp_path / "s.duckdb") as store:
        summary = ingest_files(store, [path], workers=2)
        assert _exports(store) == expected
        assert summary.trajectories == len(expected)  # each run counted once
        assert store.pending_traces() == 0
    assert rebuilt_long == [(7).to_bytes(16, "big").hex()]  # by the store, run by run, once


def test_the_ingest_summary_counts_each_stored_run_once_though_some_were_built_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import functools

    import plumbline_otel.ingest as ingest_module

    # a small hold: the shard assembles traces early from some of their spans; the store rebuilds them later
    monkeypatch.setattr(ingest_module, "ShardSettings", functools.partial(ShardSettings, hold_spans=40))
    requests = _shuffled_requests(seed=4, spans=700)
    path = str(_write_pb(tmp_path / "a.otlp.pb", requests))
    with Store(tmp_path / "s.duckdb") as store:
        summary = ingest_files(store, [path], workers=0)
        stored = store.connection.execute("SELECT count(*) FROM trajectories").fetchone()
        assert stored is not None and summary.trajectories == stored[0] == len(_reference(requests))


def test_a_shards_trajectories_are_stored_after_a_caller_read_one_row_and_left_the_result(tmp_path: Path) -> None:
    """`plumbline serve` runs readers' calls on the writer's connection between writes; one that reads
    a single row (`fetchone`) leaves DuckDB's result unfinished, and the next write must still work."""
    request = next(build_requests(14, 14))
    shard = Shard(0, ShardSettings())
    spans = shard.prepare(1, Unit("protobuf", request.SerializeToString(), "test"))[0]
    part = shard.assemble_quiet(None)[0]
    assert isinstance(part, TrajectoryPart)
    with Store(tmp_path / "s.duckdb") as store:
        writer = PartWriter(store)
        writer.take(spans)
        writer.commit()
        left = store.connection.execute("SELECT count(*) FROM dirty_traces").fetchone()  # a single-row read, its result left as it was
        assert left == (2,)
        assert store.write_assembled(part.table, part.counts) == 2
        assert store.pending_traces() == 0


def test_a_retry_after_the_store_was_reopened_changes_nothing(tmp_path: Path) -> None:
    path = str(_write_jsonl(tmp_path / "a.otlp.jsonl", list(build_requests(300, 100))))
    with Store(tmp_path / "s.duckdb") as store:
        first = ingest_files(store, [path], workers=0)
        before = _exports(store)
    with Store(tmp_path / "s.duckdb") as store:  # the span keys come back from the table
        again = ingest_files(store, [path], workers=0)
        assert (again.stored, again.duplicate) == (0, first.stored)
        assert _exports(store) == before
        count = store.connection.execute("SELECT count(*) FROM spans").fetchone()
        assert count is not None and count[0] == first.stored


def test_spans_stored_before_a_reopen_keep_a_shards_partial_assembly_out(tmp_path: Path) -> None:
    """A trace whose spans arrive across two runs of the writer is stored whole, never as its second half."""
    requests = _shuffled_requests(seed=3, spans=900)
    half = len(requests) // 2
    first = _write_pb(tmp_path / "first.otlp.pb", requests[:half])
    with Store(tmp_path / "s.duckdb") as store:
        ingest_files(store, [str(first)], workers=0)
    with Store(tmp_path / "s.duckdb") as store:  # the span counts of the first run's traces come back from the table
        _through_shards(store, ShardSettings(task_keys=store.task_keys), requests[half:])
        assert store.pending_traces() > 0  # the shard saw only the second half of the split traces
        store.assemble()
        assert _exports(store) == _reference(requests)


def test_trace_counts_add_up_across_folds() -> None:
    from collections import Counter

    import numpy as np

    from plumbline_otel.store._keys import TraceCounts

    rng = np.random.default_rng(7)
    stored = rng.integers(0, 2**63, 1000, dtype=np.uint64)
    counts = TraceCounts(stored, rng.integers(1, 9, 1000))
    expected = Counter(dict(zip(stored.tolist(), counts.get(stored))))
    for size in (50, 70_000, 3):  # the middle batch folds the recent counts into the arrays
        batch = np.concatenate([rng.choice(stored, size), rng.integers(0, 2**63, size, dtype=np.uint64)])
        counts.add(batch)
        expected.update(batch.tolist())
    keys = np.fromiter(expected, np.uint64, len(expected))
    assert counts.get(keys) == [expected[k] for k in keys.tolist()]
    assert counts.get(np.array([12345], dtype=np.uint64)) == [0]


def test_json_spans_are_decoded_only_by_the_shard_that_owns_them() -> None:
    requests = list(build_requests(200, 200))
    trace_ids = {s.trace_id for s in requests[0].resource_spans[0].scope_spans[0].spans}
    owners = {shard_of(t, 2) for t in trace_ids}
    assert owners == {0, 1}  # the corpus spreads over both shards
    line = json.dumps(to_otlp_json(requests[0])).encode()
    seen = []
    for index in (0, 1):
        part = Shard(index, ShardSettings(shards=2)).prepare(1, Unit("json", line, "x"))[0]
        assert isinstance(part, SpanPart)
        seen.append(part.spans)
    assert sum(seen) == sum(len(r.resource_spans[0].scope_spans[0].spans) for r in requests)
    assert all(seen)


def test_a_version_1_store_migrates_without_its_primary_key_and_keeps_its_spans(tmp_path: Path) -> None:
    from plumbline_otel.store._schema import MIGRATIONS

    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    for statement in MIGRATIONS[1]:
        con.execute(statement)
    con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    con.close()
    path = str(_write_jsonl(tmp_path / "a.otlp.jsonl", list(build_requests(120, 60))))
    with Store(db) as store:
        stored = ingest_files(store, [path], workers=0).stored
    with Store(db) as store:
        version = store.connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert version is not None and int(version[0]) == SCHEMA_VERSION
        again = ingest_files(store, [path], workers=0)
        assert (again.stored, again.duplicate) == (0, stored)


def test_a_version_5_store_keeps_its_rows_and_stores_long_text_with_zstd(tmp_path: Path) -> None:
    from plumbline_otel.rows import SPAN_COLUMNS, SPAN_COLUMNS_V8, SPAN_COLUMNS_V9, span_table
    from plumbline_otel.store._schema import MIGRATIONS

    requests = list(build_requests(120, 60))
    v5_columns = ", ".join(c for c in SPAN_COLUMNS if c not in SPAN_COLUMNS_V8 and c not in SPAN_COLUMNS_V9)
    db = tmp_path / "v5.duckdb"
    con = duckdb.connect(str(db))
    for version in range(1, 6):
        for statement in MIGRATIONS[version]:
            con.execute(statement)
    con.execute("INSERT INTO meta VALUES ('schema_version', '5')")
    rows = span_table([rec for r in requests for rec in normalise_request(r)[0]], 1)  # noqa: F841 - read by the SQL
    con.execute(f"INSERT INTO spans SELECT {v5_columns} FROM rows")
    con.execute("INSERT INTO dirty_traces SELECT DISTINCT trace_id FROM spans")
    con.close()
    with Store(db) as store:
        expected = _reference(requests)
        assert store.assemble() == len(expected)
        assert _exports(store) == expected
        store.connection.execute("CHECKPOINT")
        compression = dict(store.connection.execute(
            "SELECT column_name, compression FROM pragma_storage_info('spans') WHERE segment_type = 'JSON'").fetchall())
        assert compression["attributes"] == "ZSTD"
        assert dict(store.connection.execute(
            "SELECT column_name, compression FROM pragma_storage_info('trajectories') WHERE segment_type = 'JSON'").fetchall())["doc"] == "ZSTD"


def test_ingest_takes_a_workers_flag(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from plumbline_otel.cli.main import cli

    requests = list(build_requests(200, 100))
    spans = sum(len(r.resource_spans[0].scope_spans[0].spans) for r in requests)
    path = str(_write_jsonl(tmp_path / "a.otlp.jsonl", requests))
    result = CliRunner().invoke(cli, ["ingest", path, "--db", str(tmp_path / "s.duckdb"), "--workers", "2", "--quiet"])
    assert result.exit_code == 0, result.output
    assert f"stored {spans}," in result.output
    with Store(tmp_path / "s.duckdb") as store:
        assert _exports(store) == _reference(requests)


def test_a_worker_that_cannot_be_started_is_reported_as_it_failed_and_the_started_one_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pool, "_FORK_SHARED", False)  # a process launched per worker, as where there is no fork
    started: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def launch_one(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        if started:
            raise OSError("no more processes")
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", launch_one)  # the module _pool launches with
    with pytest.raises(OSError, match="no more processes"):
        ShardPool(ShardSettings(), workers=2)
    assert len(started) == 1 and started[0].returncode is not None


@pytest.mark.skipif(not _pool._FORK_SHARED, reason="workers fork from the first only on Linux")
def test_workers_fork_from_the_first_import_no_numpy_and_a_dead_one_is_reported() -> None:
    """The first worker forks the others once it has imported (they share its pages), none maps numpy (a shard never
    uses it: ~16 MiB a worker), and a forked worker that dies is reported by the end of its pipe (it is not the writer's
    child, so nothing else would tell)."""
    import signal

    with ShardPool(ShardSettings(), workers=2) as pool:
        first, forked = pool.pids
        with open(f"/proc/{forked}/stat") as stat:
            assert int(stat.read().rsplit(")", 1)[1].split()[1]) == first
        for pid in pool.pids:
            with open(f"/proc/{pid}/maps") as maps:
                assert "numpy" not in maps.read(), f"worker {pid} loaded numpy"
        os.kill(forked, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="plumbline-shard-1 exited"):
            pool.next_part(timeout=EVENT_DEADLINE_S)


@pytest.mark.slow
def test_duckdb_leaves_the_shard_workers_their_cores_while_they_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    path = str(_write_pb(tmp_path / "a.otlp.pb", list(build_requests(200, 100))))
    seen: list[str] = []

    def threads(store: Store) -> str:
        row = store.connection.execute("SELECT current_setting('threads')").fetchone()
        assert row is not None
        return str(row[0])

    with Store(tmp_path / "s.duckdb") as store:
        default = threads(store)
        ingest_files(store, [path], workers=3, on_file=lambda _: seen.append(threads(store)))
        assert seen == ["1"]
        ingest_files(store, [path], workers=2, on_file=lambda _: seen.append(threads(store)))
        assert seen == ["1", "2"]
        assert threads(store) == default  # the rebuild after the workers stop, and everything after, on every core
        ingest_files(store, [path], workers=0, on_file=lambda _: seen.append(threads(store)))
        assert seen[-1] == default


@pytest.mark.parametrize("workers, threads", [(2, "62"), (3, "61"), (64, "1"), (0, None)])
def test_a_served_store_leaves_the_shard_workers_their_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, threads: str | None) -> None:
    """`plumbline serve` keeps one DuckDB setting for its life: the cores its workers leave (its console shares them)."""
    from plumbline_otel.config import ServeConfig
    from plumbline_otel.service import Server

    def setting(connection: duckdb.DuckDBPyConnection) -> str:
        row = connection.execute("SELECT current_setting('threads')").fetchone()
        assert row is not None
        return str(row[0])

    with duckdb.connect() as fresh:
        default = setting(fresh)  # DuckDB's own: a thread per core of this machine
    monkeypatch.setattr("os.cpu_count", lambda: 64)  # more than this machine: each count differs from DuckDB's default
    store = Server(ServeConfig(db_path=str(tmp_path / "s.duckdb"), workers=workers))._open_store()
    try:
        assert setting(store.connection) == (threads or default)
    finally:
        store.close()


@pytest.mark.slow
def test_shard_workers_leave_when_their_writer_is_killed(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "writer.py"
    script.write_text(
        "import sys, time\n"
        "from plumbline_otel.pipeline import ShardPool, ShardSettings\n"
        "if __name__ == '__main__':\n"
        "    pool = ShardPool(ShardSettings(), workers=2)\n"
        "    print(' '.join(str(pid) for pid in pool.pids), flush=True)\n"
        "    time.sleep(600)\n")
    writer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    workers = [int(pid) for pid in writer.stdout.readline().split()]
    assert len(workers) == 2
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    deadline = time.monotonic() + EVENT_DEADLINE_S  # the wait ends when they exit: this only bounds a hang
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in workers if _running(pid)]
    assert not alive, f"shard workers {alive} outlived their killed writer"
    assert not spools(writer.pid), "the killed writer's spool was left in memory"


_MID_MESSAGE_WRITER = """
import os, struct, sys, threading, time
from plumbline_otel.pipeline import ShardPool, ShardSettings
if __name__ == '__main__':
    pools = []
    make = lambda: pools.append(ShardPool(ShardSettings(), workers=2))
    if sys.argv[1] == 'thread':  # made off the main thread: the kernel's parent-death signal is not armed
        maker = threading.Thread(target=make)
        maker.start()
        maker.join()
    else:
        make()
    pool = pools[0]
    for inbox in pool._inboxes:  # each worker now reads a unit whose rest never comes (the writer dies mid-write)
        os.write(inbox.connection.fileno(), struct.pack("!i", 1 << 20) + b"partial")
    print(' '.join(str(pid) for pid in pool.pids), flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.parametrize("made_on", ["main", "thread"])
def test_shard_workers_blocked_mid_message_leave_when_their_writer_is_killed(tmp_path: Path, made_on: str) -> None:
    """Issue 30 item 6: a worker reading a unit its killed writer never finished was blocked for good.

    Only the writer holds the other end of a worker's pipes, so its death ends the read, whichever thread made the
    pool (one that has ended by then, here).
    """
    import signal
    import subprocess
    import sys

    script = tmp_path / "writer.py"
    script.write_text(_MID_MESSAGE_WRITER)
    writer = subprocess.Popen([sys.executable, str(script), made_on], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    workers = [int(pid) for pid in writer.stdout.readline().split()]
    assert len(workers) == 2
    time.sleep(0.5)  # the workers are inside the read now
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    deadline = time.monotonic() + EVENT_DEADLINE_S  # the wait ends when they exit: this only bounds a hang
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in workers if _running(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"shard workers {alive} outlived their killed writer"
    assert not spools(writer.pid), "the killed writer's spool was left in memory"


@pytest.mark.slow
def test_no_shard_worker_outlives_a_serve_killed_under_load(tmp_path: Path) -> None:
    """Issue 30 item 6: `plumbline serve` killed with SIGKILL while its workers are busy leaves no worker behind (twice)."""
    import http.client
    import signal

    from receive_support import ServeProcess

    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for _ in range(2000):
        scope.spans.add(trace_id=os.urandom(16), span_id=os.urandom(8), name="s" * 200, start_time_unix_nano=1,
                        end_time_unix_nano=2).attributes.add(key="gen_ai.input.messages").value.string_value = "y" * 2000
    body = request.SerializeToString()
    for round_ in range(2):
        server = ServeProcess(tmp_path / f"r{round_}", "--workers", "2")
        server.tmp_path.mkdir()
        server.db = server.tmp_path / "plumbline.duckdb"
        server.log_path = server.tmp_path / "serve.log"
        server.start()
        assert server.proc is not None
        workers = _descendants(server.proc.pid)  # the first worker, and those it forked
        stop = threading.Event()

        def pump(port: int, stop: threading.Event) -> None:
            while not stop.is_set():
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                try:
                    connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
                    connection.getresponse().read()
                except (OSError, http.client.HTTPException):
                    pass
                finally:
                    connection.close()

        pumps = [threading.Thread(target=pump, args=(server.http_port, stop), daemon=True) for _ in range(4)]
        for thread in pumps:
            thread.start()
        time.sleep(2.5)
        server.kill()
        stop.set()
        deadline = time.monotonic() + EVENT_DEADLINE_S  # the wait ends when they exit: this only bounds a hang
        alive = workers
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in workers if _running(pid)]
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
        for thread in pumps:
            thread.join(10)
        assert not alive, f"round {round_}: processes {alive} outlived the killed server"
        assert not spools(server.proc.pid)


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").iterdir():
            children = [int(child) for child in (task / "children").read_text().split()]
            found.extend(children)
            todo.extend(children)
    return found


def _running(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for init to reap it is gone for our purpose
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_worker_tables_reach_the_writer_through_a_spool_in_memory_that_is_gone_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    requests = _shuffled_requests(seed=3)
    path = str(_write_pb(tmp_path / "a.otlp.pb", requests))
    landed: list[str] = []
    land = Spool.land

    def counted(message: tuple[object, str | None]) -> object:
        if message[1] is not None:
            landed.append(message[1])
        return land(message)

    monkeypatch.setattr(Spool, "land", staticmethod(counted))
    during: list[list[str]] = []
    with Store(tmp_path / "s.duckdb") as store:
        ingest_files(store, [path], workers=2, on_file=lambda _: during.append(spools(os.getpid())))
        assert _exports(store) == _reference(requests)
    assert len(during) == 1 and len(during[0]) == 1 and during[0][0].startswith(Spool.base())
    assert len(landed) >= 2 * len(requests)  # every span table (and trajectory table) came as a file
    assert not any(os.path.exists(p) for p in landed)  # unlinked as mapped
    assert not spools(os.getpid()) and spooled_bytes(os.getpid()) == 0


def test_a_spooled_table_comes_back_whole_and_one_with_no_room_goes_as_it_is(tmp_path: Path) -> None:
    from plumbline_otel.rows import span_table

    records = [rec for r in build_requests(40, 40) for rec in normalise_request(r)[0]]
    table = span_table(records, 7)
    part = SpanPart(1, 0, table, [], len(records), 0)
    spool = Spool(str(tmp_path))
    shipped, file = spool.ship(part, 0)
    assert file is not None and isinstance(shipped, SpanPart) and shipped.table is None
    back = Spool.land((shipped, file))
    assert isinstance(back, SpanPart) and back.table is not None
    assert back.table.schema == table.schema and back.table.equals(table)  # JSON columns keep their type
    assert not (tmp_path / file).exists()
    gone = Spool(str(tmp_path / "removed"))  # a spool that cannot be written: the part keeps its table
    assert gone.ship(part, 0) == (part, None) and Spool.land((part, None)) is part


def test_a_new_spool_removes_those_of_writers_that_died() -> None:
    import os
    import subprocess
    import sys
    import tempfile

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead = tempfile.mkdtemp(prefix=f"plumbline-parts-{int(done.stdout)}-", dir=Spool.base())
    live = tempfile.mkdtemp(prefix=f"plumbline-parts-{os.getppid()}-", dir=Spool.base())
    try:
        spool = Spool.create()
        assert spool.path in spools(os.getpid())
        assert not os.path.exists(dead) and os.path.exists(live)
        spool.remove()
        assert spool.path not in spools(os.getpid())
    finally:
        for path in (dead, live):
            if os.path.exists(path):
                os.rmdir(path)


def test_by_default_workers_start_only_for_an_input_of_many_traces_large_enough_to_repay_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from plumbline_otel.pipeline import default_workers

    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert default_workers(64 << 20, traces=30) == 4
    assert default_workers(64 << 20, traces=1) == 0  # a long trace exported alone: one shard would own it all
    assert default_workers(1 << 20, traces=30) == 0  # too small to repay starting processes
    assert default_workers(64 << 20) == 4 and default_workers() == 4  # nothing read yet (serve)


def _one_trace_units(trace: int, spans_per_unit: int, units: int) -> list[Unit]:
    """Requests that each hold `spans_per_unit` spans, all of trace `trace` (a long trace, cut as an exporter cuts it)."""
    spans = [s for r in build_requests(spans_per_unit * units, 10_000, first_trace=trace) for s in r.resource_spans[0].scope_spans[0].spans]
    for span in spans:
        span.trace_id = trace.to_bytes(16, "big")
    out = []
    for start in range(0, spans_per_unit * units, spans_per_unit):
        request = ExportTraceServiceRequest()
        request.resource_spans.add().scope_spans.add().spans.extend(spans[start:start + spans_per_unit])
        out.append(Unit("protobuf", request.SerializeToString(), f"unit {start}"))
    return out


def test_the_first_spans_of_an_input_say_whether_it_is_one_trace() -> None:
    from plumbline_otel.pipeline import first_traces

    long = _one_trace_units(7, 300, 10)  # one trace, as requests of 300 spans
    head, traces = first_traces(iter(long))
    assert traces == 1 and head == long[:4]  # read up to 1,000 spans, then stopped
    # a trace a request (an exporter that sends a span or a trace at a time, a directory of a trace a file): many
    single = [u for trace in range(1, 101) for u in _one_trace_units(trace, 1, 1)]
    rest = iter(single)
    head, traces = first_traces(rest)
    assert traces == 64 and head == single[:64] and next(rest) == single[64]
    assert first_traces(iter([])) == ([], 0)


def test_ingest_chooses_its_workers_from_its_first_spans_and_still_stores_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    requests = list(build_requests(300, 100))
    path = str(_write_pb(tmp_path / "a.otlp.pb", requests))
    seen: list[tuple[int, int | None]] = []

    def chosen(size: int, traces: int | None = None) -> int:
        seen.append((size, traces))
        return 1 if traces is None else 0  # large enough, then: in this process

    monkeypatch.setattr("plumbline_otel.ingest.default_workers", chosen)
    with Store(tmp_path / "s.duckdb") as store:
        summary = ingest_files(store, [path])
        assert _exports(store) == _reference(requests)
    assert seen[0] == (Path(path).stat().st_size, None) and seen[1][1] is not None and seen[1][1] > 1
    assert summary.workers == 0  # what it chose, as the summary reports it
    assert summary.requests == len(requests) and summary.spans_read == sum(len(r.resource_spans[0].scope_spans[0].spans) for r in requests)


def _units(requests: list[ExportTraceServiceRequest], pulled: list[int], fail_after: int | None = None) -> Iterator[Unit]:
    for i, request in enumerate(requests):
        if i == fail_after:
            raise OSError("the input went away")
        pulled.append(i)
        yield Unit("protobuf", request.SerializeToString(), f"request {i}")


@pytest.mark.slow
def test_the_feeder_keeps_the_workers_a_bounded_number_of_units_ahead_of_the_writer() -> None:
    """Workers are fed by a thread, so they never wait for a commit; a writer that falls behind stops it."""
    requests = list(build_requests(600, 10))
    pulled: list[int] = []
    summary = IngestSummary()
    with ShardPool(ShardSettings(), workers=1, collector=True) as pool:
        parts = _fed(pool, _units(requests, pulled), summary)
        first = next(parts)  # the writer takes one part, then stalls (a long commit)
        time.sleep(1.0)
        assert isinstance(first, SpanPart) and len(pulled) <= _UNITS_AHEAD + 2  # the one taken, and one waiting for room
        rest = list(parts)
    span_parts = [first, *(p for p in rest if isinstance(p, SpanPart))]
    assert [p.seq for p in span_parts] == list(range(1, len(requests) + 1))
    assert sum(p.spans for p in span_parts) == sum(len(r.resource_spans[0].scope_spans[0].spans) for r in requests)
    assert summary.requests == len(requests)
    assert any(isinstance(p, TrajectoryPart) for p in rest)
    assert not [t for t in threading.enumerate() if t.name == "plumbline-feed"]


@pytest.mark.slow
def test_an_input_that_fails_midway_or_a_failed_write_stops_the_feeder_and_the_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    requests = list(build_requests(300, 10))
    with ShardPool(ShardSettings(), workers=1, collector=True) as pool, pytest.raises(OSError, match="the input went away"):
        for _part in _fed(pool, _units(requests, [], fail_after=5), IngestSummary()):
            pass
    assert not [t for t in threading.enumerate() if t.name == "plumbline-feed"]

    def full(*_: object, **__: object) -> None:
        raise OSError("disk full")

    path = str(_write_pb(tmp_path / "a.otlp.pb", requests))
    monkeypatch.setattr(Store, "write_span_table", full)
    with Store(tmp_path / "s.duckdb") as store, pytest.raises(OSError, match="disk full"):
        ingest_files(store, [path], workers=2, batch_spans=50)
    assert not [t for t in threading.enumerate() if t.name == "plumbline-feed"]
    assert not [pid for pid in _descendants(os.getpid()) if _running(pid) and b"_first_worker" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def test_in_one_process_a_failed_write_or_a_failed_input_stops_the_writer_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One process writes on a thread of its own (`ingest._written_beside`): either side failing ends both, and commits nothing more."""
    requests = list(build_requests(300, 10))
    path = str(_write_pb(tmp_path / "a.otlp.pb", requests))
    with Store(tmp_path / "s.duckdb") as store:
        summary = ingest_files(store, [path], workers=0, batch_spans=50)
        assert summary.stored == summary.spans_read == sum(len(r.resource_spans[0].scope_spans[0].spans) for r in requests)
        assert _exports(store) == _reference(requests)
    assert not [t for t in threading.enumerate() if t.name == "plumbline-write"]

    with Store(tmp_path / "u.duckdb") as store, pytest.raises(OSError, match="the input went away"):
        ingest_mod._ingest_units(store, _units(requests, [], fail_after=5), IngestSummary(), "file", None, 10, 0)
    assert not [t for t in threading.enumerate() if t.name == "plumbline-write"]

    def full(*_: object, **__: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(Store, "write_span_table", full)
    with Store(tmp_path / "t.duckdb") as store, pytest.raises(OSError, match="disk full"):
        ingest_files(store, [path], workers=0, batch_spans=50)
    assert not [t for t in threading.enumerate() if t.name == "plumbline-write"]


def _two_requests_through_a_shard() -> tuple[Shard, list[ExportTraceServiceRequest], SpanPart, TrajectoryPart, SpanPart]:
    """A shard's parts for two requests of 14 spans: the first's spans, its trajectories, then the second's spans."""
    first, second = build_requests(28, 14)
    shard = Shard(0, ShardSettings())
    spans = shard.prepare(1, Unit("protobuf", first.SerializeToString(), "test"))[0]
    assembled = shard.assemble_quiet(None)[0]
    later = shard.prepare(2, Unit("protobuf", second.SerializeToString(), "test"))[0]
    assert isinstance(spans, SpanPart) and isinstance(assembled, TrajectoryPart) and isinstance(later, SpanPart)
    return shard, [first, second], spans, assembled, later


def test_a_trajectory_part_waits_for_the_next_commit_instead_of_cutting_the_transaction_short(tmp_path: Path) -> None:
    shard, (first, second), spans, assembled, later = _two_requests_through_a_shard()
    with Store(tmp_path / "s.duckdb") as store:
        writer = PartWriter(store, batch_spans=1000)
        for part in (spans, assembled, later):
            writer.take(part)
        assert store.connection.execute("SELECT count(*) FROM spans").fetchone() == (0,)  # nothing committed early
        writer.commit()  # one transaction for both units' spans, then the trajectories that came after the first's
        assert store.connection.execute("SELECT count(*) FROM spans").fetchone() == (28,)
        assert _exports(store) == _reference([first])
        writer.take(shard.assemble_quiet(None)[0])  # no spans gathered: stored at once
        assert _exports(store) == _reference([first, second])


@pytest.mark.slow
def test_file_ingest_commits_whole_row_groups_which_duckdb_writes_past_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction of whole row groups goes into the file compressed, once; a smaller one is logged, then checkpointed."""
    requests = list(build_requests(ROW_GROUP_SIZE + 3000, 500))  # requests of 500 spans: no whole group falls on a request's end
    sent = sum(len(r.resource_spans[0].scope_spans[0].spans) for r in requests)
    path = str(_write_pb(tmp_path / "a.otlp.pb", requests))
    db = tmp_path / "s.duckdb"
    commits: list[tuple[int, int]] = []
    write = Store.write_span_table

    def logged(store: Store, batch: pa.Table | None, *args: Any) -> Any:
        result = write(store, batch, *args)
        commits.append((batch.num_rows if batch is not None else 0, Path(f"{db}.wal").stat().st_size))
        return result

    monkeypatch.setattr(Store, "write_span_table", logged)
    with Store(db) as store:
        summary = ingest_files(store, [path], workers=0, batch_spans=transaction_spans(workers=2))
        assert _exports(store) == _reference(requests)
        store.connection.execute("CHECKPOINT")
        groups = store.connection.execute("SELECT row_group_id, sum(count) FROM pragma_storage_info('spans') "
                                          "WHERE column_name = 'start_ns' AND segment_type <> 'VALIDITY' GROUP BY 1").fetchall()
    (rows, log), (rest, later), *_ = commits
    assert transaction_spans(workers=0) < ROW_GROUP_SIZE  # one process commits less at a time (its memory)
    assert rows == ROW_GROUP_SIZE and log < 1 << 20  # ~26 MB of rows, under 1 MB of log
    assert rest == sent - ROW_GROUP_SIZE and later - log > 1 << 20  # the rows past it, carried to the last commit: logged
    assert summary.stored == sent and sorted(n for _, n in groups) == [sent - ROW_GROUP_SIZE, ROW_GROUP_SIZE]


def test_rows_past_a_whole_row_group_are_carried_and_trajectories_wait_for_them(tmp_path: Path) -> None:
    shard, (first, second), spans, assembled, later = _two_requests_through_a_shard()
    with Store(tmp_path / "s.duckdb") as store:
        writer = PartWriter(store, batch_spans=10, whole_groups=True)
        writer.take(spans)  # 14 spans: one group of 10 committed, 4 carried
        assert store.connection.execute("SELECT count(*) FROM spans").fetchone() == (10,)
        writer.take(assembled)  # built from all 14: waits for the 4
        assert _exports(store) == []
        writer.take(later)  # 18 gathered: 10 committed, and with them the first request's last 4
        assert store.connection.execute("SELECT count(*) FROM spans").fetchone() == (20,)
        assert _exports(store) == _reference([first])
        writer.commit()
        assert store.connection.execute("SELECT count(*) FROM spans").fetchone() == (28,)


def test_large_spans_commit_at_a_bound_on_bytes_before_a_row_group_fills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row group of spans of several KB each would hold ~150 MB in the writer: bytes bound the gathered rows too."""
    shard, (first, second), spans, assembled, later = _two_requests_through_a_shard()
    monkeypatch.setattr("plumbline_otel.pipeline._writer._PENDING_BYTES", spans.table.nbytes if spans.table is not None else 0)
    with Store(tmp_path / "s.duckdb") as store:
        writer = PartWriter(store, batch_spans=1000)
        writer.take(spans)  # 14 spans, far from 1,000, but at the byte bound: committed
        assert store.connection.execute("SELECT count(*) FROM spans").fetchone() == (14,)
        assert writer.pending_bytes == 0


def test_a_shard_worker_imports_no_database() -> None:
    """What a spawned worker imports (its target's module, `pipeline._pool`, and so the package) loads no DuckDB:
    the writer is in the same package, and a database in every worker cost ~20 MB and 10% of their CPU in the bench."""
    code = "import sys, plumbline_otel.pipeline._pool; print(' '.join(m for m in ('duckdb', 'scipy', 'grpc') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=EVENT_DEADLINE_S, check=True)
    assert done.stdout.split() == []
