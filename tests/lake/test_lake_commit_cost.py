"""What a lake commit costs (issue 41 item 1): a sync after many earlier ones rewrites only the files of its own
partitions that held a changed row, leaves every other instance's files and manifests alone, commits one snapshot
per table it changed, and keeps each instance's manifests and its partitions' files few between maintenances.
Asserted on the snapshots' files and manifests, not on time; bench/lake_commit.py measures the time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lake.lake_support import add_runs
from plumbline_otel.lake import MANIFESTS_PER_INSTANCE, SMALL_FILES_PER_PARTITION, SYNCS, TABLES, Lake, LakeSink, SyncResult
from plumbline_otel.spec.testing import span_records
from plumbline_otel.store import Store

ROUNDS = 12


def _late_span(store: Store, count: int) -> None:
    """A late tool span for the `count` most recent runs: each is rebuilt, so the lake must replace it."""
    for t in sorted(store.trajectories(), key=lambda t: t.start_ns)[-count:]:
        late = span_records(t)[-1]
        late.span_id = f"{abs(hash((t.trajectory_id, time.time_ns()))):016x}"[:16]
        late.start_ns += 1
        store.write_spans([late])
    store.assemble()


def _files(table: Any) -> dict[str, str]:
    """The table's live data files: path -> the instance of its partition."""
    table.refresh()
    if table.current_snapshot() is None:
        return {}
    found = table.inspect.files().select(["file_path", "partition"]).to_pylist()
    return {f["file_path"]: f["partition"]["instance"] for f in found}


def _manifest_owners(table: Any) -> list[str | None]:
    """The instance each data manifest of the current snapshot holds files of (None: files of several)."""
    table.refresh()
    owners: list[str | None] = []
    if table.current_snapshot() is None:
        return owners
    for manifest in table.current_snapshot().manifests(table.io):
        bound = manifest.partitions[0]
        owners.append(bytes(bound.lower_bound).decode() if bound.lower_bound == bound.upper_bound else None)
    return owners


def test_a_sync_after_many_commits_touches_only_its_own_partitions_and_manifests(tmp_path: Path, stores: dict[str, Store]) -> None:
    lake = Lake(str(tmp_path / "lake"))
    now = time.time_ns()
    sinks = {name: LakeSink(lake, name) for name in stores}
    for name, store in stores.items():
        add_runs(store, name, 0, 20, now)
        sinks[name].sync(store.connection)
    last: SyncResult | None = None
    for round_ in range(1, ROUNDS + 1):
        for name, store in stores.items():
            _late_span(store, 2)  # two runs rebuilt, two new
            add_runs(store, name, 20 + 2 * round_, 2, now)
            others = {t: {p: i for p, i in _files(lake.table(t)).items() if i != name} for t in TABLES}
            snapshots = {t: len(lake.table(t).snapshots()) for t in (*TABLES, SYNCS)}
            result = sinks[name].sync(store.connection)
            changed = [t for t in TABLES if result.groups.get(t)]
            assert {"runs", "spans", "steps"} <= set(changed), result.as_dict()
            # one snapshot per table it changed, and one for the watermark (not a delete, an overwrite and an append)
            assert result.commits == len(changed) + 1, result.as_dict()
            assert sum(len(lake.table(t).snapshots()) - snapshots[t] for t in (*TABLES, SYNCS)) == result.commits
            for t in TABLES:
                after = _files(lake.table(t))
                # every other instance's files are still there, unread and unrewritten
                assert {p: i for p, i in after.items() if i != name} == others[t], t
            last = result
        assert last is not None
        # what a sync removes is what it changed (the two rebuilt runs' files, per table), and at times the small files of
        # the partition it appends to, merged as one: bounded, whatever the lake holds and however many commits came before
        assert last.files_removed <= 3 * (2 + SMALL_FILES_PER_PARTITION), last.as_dict()
    for t in TABLES:  # an hour still receiving commits keeps a few small files, not one per commit
        partitions: dict[tuple[str, int], int] = {}
        for f in lake.table(t).inspect.files().select(["partition"]).to_pylist():
            key = (f["partition"]["instance"], f["partition"]["hour"])
            partitions[key] = partitions.get(key, 0) + 1
        assert all(n <= SMALL_FILES_PER_PARTITION for n in partitions.values()), (t, partitions)
    for t in (*TABLES, SYNCS):
        owners = _manifest_owners(lake.table(t))
        assert None not in owners, (t, owners)  # no manifest mixes instances: a commit reads and rewrites its own only
        for name in sinks:
            assert owners.count(name) <= MANIFESTS_PER_INSTANCE, (t, owners)
    # and the lake holds exactly each store's runs
    from pyiceberg.expressions import EqualTo

    for name, store in stores.items():
        expected = sorted(t.trajectory_id for t in store.trajectories())
        found = lake.scan("runs", EqualTo("instance", name), ("trajectory_id",))["trajectory_id"].to_pylist()
        assert sorted(found) == expected
