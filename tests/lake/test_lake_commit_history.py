"""A table's history between maintenances (issue 41 item 1): commits expire old snapshots themselves, so the metadata
file every commit reads and rewrites stays bounded (snapshots and metadata log), never a snapshot a reader needs (each
instance's watermark and its commits after it); and a table an older plumbline made (pyiceberg's manifest merge on,
manifests mixing instances) is brought up to date once. Asserted on snapshot counts and manifests, not on time."""

from __future__ import annotations

import time
from pathlib import Path

from lake.lake_support import add_runs
from plumbline_otel import lake as lake_mod
from plumbline_otel.lake import SYNCS, TABLES, TRIM_SLACK, Lake, LakeReader, LakeSink, watermarks
from plumbline_otel.store import Store

ROUNDS = 14
KEPT = 4


def test_commits_keep_history_bounded_and_never_expire_a_readers_snapshot(tmp_path: Path, stores: dict[str, Store]) -> None:
    lake = Lake(str(tmp_path / "lake"))
    lake.snapshots_kept, lake.snapshot_age_s = KEPT, 0.0
    now = time.time_ns()
    sinks = {name: LakeSink(lake, name) for name in stores}
    expired = 0
    for round_ in range(ROUNDS):
        for name, store in stores.items():
            add_runs(store, name, 3 * round_, 3, now)
            result = sinks[name].sync(store.connection)
            expired += result.expired
            for t in (*TABLES, SYNCS):
                table = lake.table(t)
                table.refresh()
                # bounded: the newest KEPT, what readers need, and at most TRIM_SLACK waiting for the next trim
                assert len(table.metadata.snapshots) <= KEPT + TRIM_SLACK + 2, (t, len(table.metadata.snapshots))
                assert len(table.metadata.metadata_log) <= 8, (t, len(table.metadata.metadata_log))
            # every instance's watermark snapshot is still in its table: readers read each instance as of it
            for instance, mine in (watermarks(lake) or {}).items():
                for t, snap in mine.items():
                    if snap is not None:
                        assert lake.table(t).metadata.snapshot_by_id(snap) is not None, (instance, t, snap)
    assert expired > 0
    for t in ("runs", "spans", "steps", SYNCS):
        assert len(lake.table(t).metadata.snapshot_log) <= KEPT + TRIM_SLACK + 2
    # and the lake reads as the stores
    expected = sorted(t.trajectory_id for s in stores.values() for t in s.trajectories())
    found = sorted(t.trajectory_id for t in LakeReader(Lake(str(tmp_path / "lake"))).trajectories())
    assert found == expected


def test_a_table_made_with_manifest_merge_is_upgraded_once(tmp_path: Path, stores: dict[str, Store]) -> None:
    """An older lake: merge on, so pyiceberg packs every instance's manifests into one; a sync's first commit turns it off
    and regroups the manifests one instance each, keeping every row."""
    uri = str(tmp_path / "lake")
    lake = Lake(uri)
    now = time.time_ns()
    for name, store in stores.items():
        add_runs(store, name, 0, 4, now)
    # as an older plumbline left it: pyiceberg's merge on, after a few commits of both instances
    for t in TABLES:
        with lake.table(t).transaction() as tx:
            tx.set_properties({"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "2"})
            tx.remove_properties("write.metadata.previous-versions-max")
    old = lake_mod._PRODUCERS.copy()
    import pyiceberg.table.update.snapshot as snap

    lake_mod._PRODUCERS["append"] = snap._MergeAppendFiles
    lake_mod._PRODUCERS["overwrite"] = snap._OverwriteFiles
    try:
        for round_ in range(3):
            for name, store in stores.items():
                add_runs(store, name, 4 + 2 * round_, 2, now)
                sink = LakeSink(lake, name)
                lake._upgraded = set(TABLES) | {SYNCS}  # not yet: the older plumbline never upgraded
                sink.sync(store.connection)
    finally:
        lake_mod._PRODUCERS.clear()
        lake_mod._PRODUCERS.update(old)
    runs = lake.table("runs")
    runs.refresh()
    assert lake_mod._mixed_manifests(runs) > 0  # the older lake's state
    # a sync of the new plumbline, on a fresh process's Lake
    fresh = Lake(uri)
    for name, store in stores.items():
        add_runs(store, name, 20, 1, now)
        LakeSink(fresh, name).sync(store.connection)
    for t in TABLES:
        table = fresh.table(t)
        table.refresh()
        assert table.properties["commit.manifest-merge.enabled"] == "false", t
        assert table.properties["write.metadata.previous-versions-max"] == "8", t
        assert table.properties["commit.manifest.min-count-to-merge"] == "2", t  # an operator's setting is left
        assert lake_mod._mixed_manifests(table) == 0, t
    regrouped = [s for s in fresh.table("runs").snapshots()
                 if (s.summary.additional_properties if s.summary else {}).get("plumbline.maintenance") == "regroup-manifests"]
    assert len(regrouped) == 1
    expected = sorted(t.trajectory_id for s in stores.values() for t in s.trajectories())
    assert sorted(t.trajectory_id for t in LakeReader(Lake(uri)).trajectories()) == expected
