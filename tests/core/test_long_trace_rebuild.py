"""Issue 43: a long trace is split by the store on a skeleton of its spans, read in batches, that shares what it can."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from corpus import build_requests

from plumbline_otel.assemble import assemble_runs, split_runs
from plumbline_otel.model import SpanRecord
from plumbline_otel.normalise import normalise_request
from plumbline_otel.store import Store

TRACE = (7).to_bytes(16, "big")


def _long_trace_records(spans: int) -> list[SpanRecord]:
    records: list[SpanRecord] = []
    for request in build_requests(spans, 50):
        for span in request.resource_spans[0].scope_spans[0].spans:
            span.trace_id = TRACE
        records.extend(normalise_request(request)[0])
    return records


def test_a_long_traces_skeleton_is_split_as_its_full_records_are_and_shares_its_empty_fields(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import plumbline_otel.store._store as store_module

    monkeypatch.setattr(store_module, "LONG_TRACE_SPANS", 60)  # the skeleton is read 60 rows at a time
    records = _long_trace_records(700)
    with Store(tmp_path / "s.duckdb") as store:
        store.write_spans(records)
        skeleton = store._skeleton(TRACE.hex())
    assert sorted(r.span_id for r in skeleton) == sorted(r.span_id for r in records)  # every span, across the batches
    by_id = {r.span_id: r for r in records}
    for rec in skeleton:  # what the split reads, as stored
        full = by_id[rec.span_id]
        assert (rec.parent_span_id, rec.start_ns, rec.end_ns, rec.step_kind, rec.shapes, rec.handoff_to) == (
            full.parent_span_id, full.start_ns, full.end_ns, full.step_kind, full.shapes, full.handoff_to)
    whole = [(trajectory_id, sorted(r.span_id for r in group)) for trajectory_id, group in split_runs(records)]
    split = [(trajectory_id, sorted(r.span_id for r in group)) for trajectory_id, group in split_runs(skeleton)]
    assert split == whole and len(whole) > 1
    # one object per empty field and per distinct shapes list, not one per span
    assert len({id(r.links) for r in skeleton}) == len({id(r.attributes) for r in skeleton}) == 1
    assert len({id(r.shapes) for r in skeleton}) == len({tuple(r.shapes) for r in skeleton}) < len(skeleton)


@pytest.mark.parametrize("cache_mib", [96, 1], ids=["rebuild cache", "too small: rebuilt again at the writer's limit"])
def test_a_long_trace_is_rebuilt_under_a_smaller_cache_and_the_writers_limit_comes_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_mib: int) -> None:
    import plumbline_otel.store._store as store_module

    monkeypatch.setattr(store_module, "LONG_TRACE_SPANS", 60)
    monkeypatch.setattr(store_module, "LONG_REBUILD_MEMORY_MIB", cache_mib)
    records = _long_trace_records(700)
    limits: list[str] = []
    long_trace_runs = Store._long_trace_runs

    def spy(self: Store, trace_id: str):
        limits.append(self.connection.execute("SELECT current_setting('memory_limit')").fetchone()[0])
        return long_trace_runs(self, trace_id)

    monkeypatch.setattr(Store, "_long_trace_runs", spy)
    with Store(tmp_path / "s.duckdb") as store:
        store.write_spans(records)
        assert store.assemble() == len(split_runs(records))
        built = sorted(json.dumps(t.export(), sort_keys=True) for t in store.trajectories())
        assert store.connection.execute("SELECT current_setting('memory_limit')").fetchone() == ("256.0 MiB",)
    assert built == sorted(json.dumps(t.export(), sort_keys=True) for t in assemble_runs(records))
    assert limits[0] == f"{cache_mib}.0 MiB"
    assert limits[1:] == ([] if cache_mib == 96 else ["256.0 MiB"])  # out of memory: once more, at the writer's limit
